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

/* tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." /
 *         "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA (RFC 9110 5.6.2) */
static inline int om__http_is_tchar(unsigned c) {
  if (om__http_is_alpha(c) || om__http_is_digit(c))
    return 1;
  switch (c) {
  case '!':
  case '#':
  case '$':
  case '%':
  case '&':
  case '\'':
  case '*':
  case '+':
  case '-':
  case '.':
  case '^':
  case '_':
  case '`':
  case '|':
  case '~':
    return 1;
  default:
    return 0;
  }
}

/* field-vchar = VCHAR / obs-text (RFC 9110 5.5) */
static inline int om__http_is_fvchar(unsigned c) {
  return (c >= 0x21 && c <= 0x7e) || c >= 0x80;
}

/* OWS = *( SP / HTAB ) (RFC 9110 5.6.3) */
static inline int om__http_is_ows(unsigned c) {
  return c == ' ' || c == '\t';
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

#endif /* OM_HTTP_CHARS_H */
