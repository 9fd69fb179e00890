/*
 * om_http_chars.h: the character classes of HTTP/1.1 message syntax, shared
 * by the server (om_http_server.c) and the upstream client (om_upstream.c),
 * which must agree byte for byte on what a valid message is.
 */
#ifndef OM_HTTP_CHARS_H
#define OM_HTTP_CHARS_H

#include <stddef.h>
#include <string.h>

/* ALPHA and DIGIT (RFC 5234 B.1) */
static inline int om__http_is_alpha(unsigned c) {
  return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}

static inline int om__http_is_digit(unsigned c) {
  return c >= '0' && c <= '9';
}

/* HEXDIG's value, -1 when c is not one (either case). */
static inline int om__http_hex_val(unsigned c) {
  if (om__http_is_digit(c))
    return (int)(c - '0');
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
    return (int)((c | 0x20) - 'a' + 10);
  return -1;
}

/*
 * The classes of a byte, one load per byte in the scanners' inner loops:
 * OM__HTTP_TCHAR  tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" /
 *                 "-" / "." / "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA
 *                 (RFC 9110 5.6.2)
 * OM__HTTP_VCHAR  field-vchar = VCHAR / obs-text (RFC 9110 5.5)
 * OM__HTTP_OWS    SP / HTAB (RFC 9110 5.6.3)
 * tests/test_http_server.c checks every entry against the grammar.
 */
enum { OM__HTTP_TCHAR = 1, OM__HTTP_VCHAR = 2, OM__HTTP_OWS = 4 };

static const unsigned char om__http_class[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, /* 0x00 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x10 */
    4, 3, 2, 3, 3, 3, 3, 3, 2, 2, 3, 3, 2, 3, 3, 2, /* 0x20 */
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, /* 0x30 */
    2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, /* 0x40 */
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 3, 3, /* 0x50 */
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, /* 0x60 */
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 3, 2, 3, 0, /* 0x70 */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, /* 0x80 */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, /* 0x90 */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, /* 0xa0 */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, /* 0xb0 */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, /* 0xc0 */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, /* 0xd0 */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, /* 0xe0 */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, /* 0xf0 */
};

static inline int om__http_is_tchar(unsigned c) {
  return c < 256 && (om__http_class[c] & OM__HTTP_TCHAR);
}

static inline int om__http_is_fvchar(unsigned c) {
  return c < 256 && (om__http_class[c] & OM__HTTP_VCHAR);
}

static inline int om__http_is_ows(unsigned c) {
  return c < 256 && (om__http_class[c] & OM__HTTP_OWS);
}

/* unreserved (RFC 3986 2.3) */
static inline int om__http_is_unreserved(unsigned c) {
  return om__http_is_alpha(c) || om__http_is_digit(c) || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

/* sub-delims (RFC 3986 2.2) */
static inline int om__http_is_subdelim(unsigned c) {
  switch (c) {
  case '!':
  case '$':
  case '&':
  case '\'':
  case '(':
  case ')':
  case '*':
  case '+':
  case ',':
  case ';':
  case '=':
    return 1;
  default:
    return 0;
  }
}

/* ASCII case-insensitive equality of a counted string and a literal. The
 * lengths first: inlined with a literal, strlen is a constant, and a field
 * name of another length costs one comparison. */
static inline int om__http_ci_eq(const char *a, size_t n, const char *lit) {
  if (strlen(lit) != n)
    return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned x = (unsigned char)a[i], y = (unsigned char)lit[i];
    if (x - 'A' < 26u)
      x |= 0x20;
    if (y - 'A' < 26u)
      y |= 0x20;
    if (x != y)
      return 0;
  }
  return 1;
}

/*
 * v in decimal (1*DIGIT: a status code, a Content-Length, a field value
 * such as an attempt count) into buf, which holds at least 21 bytes;
 * NUL-terminated; returns the length. The hot paths format a few numbers
 * per request, where snprintf costs more than the rest of the head.
 */
static inline size_t om__http_u64_dec(char *buf, unsigned long long v) {
  char tmp[20];
  size_t n = 0, i;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  for (i = 0; i < n; i++)
    buf[i] = tmp[n - 1 - i];
  buf[n] = '\0';
  return n;
}

/*
 * v in lower-case hex (a chunk-size, RFC 9112 7.1) into buf, which holds
 * at least 17 bytes; NUL-terminated; returns the length. A streamed
 * response writes one per chunk.
 */
static inline size_t om__http_u64_hex(char *buf, unsigned long long v) {
  static const char hex[] = "0123456789abcdef";
  char tmp[16];
  size_t n = 0, i;
  do {
    tmp[n++] = hex[v & 15];
    v >>= 4;
  } while (v != 0);
  for (i = 0; i < n; i++)
    buf[i] = tmp[n - 1 - i];
  buf[n] = '\0';
  return n;
}

#endif /* OM_HTTP_CHARS_H */
