/*
 * om_url.c: the one URL rule (om_url.h). A single left-to-right pass:
 * scheme, authority (userinfo refused, host, port), path; every refusal
 * names what it refused.
 */
#include "om_url.h"

#include <stdint.h>
#include <string.h>

#include "om_errno.h"
#include "om_http_chars.h"

typedef unsigned char uchar;

static int is_alpha(uchar c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int is_digit(uchar c) {
  return c >= '0' && c <= '9';
}

static int prefix_nocase(const char *s, size_t n, const char *p) {
  size_t k = strlen(p);
  if (n < k)
    return 0;
  for (size_t i = 0; i < k; i++) {
    uchar c = (uchar)s[i];
    if (c >= 'A' && c <= 'Z')
      c = (uchar)(c - 'A' + 'a');
    if (c != (uchar)p[i])
      return 0;
  }
  return 1;
}

/* RFC 3986 pchar without pct-encoded: unreserved, sub-delims, ':', '@' */
static int is_pchar(uchar c) {
  return is_alpha(c) || is_digit(c) || strchr("-._~!$&'()*+,;=:@", c) != NULL;
}

static int refuse(const char **why, const char *msg) {
  if (why != NULL)
    *why = msg;
  return OM_EPARSE;
}

/* ------------------------------------------------------------------ */
/* literals */

int om_url_parse_ipv4(const char *s, size_t n, unsigned char out[4]) {
  size_t i = 0;
  if (s == NULL || out == NULL)
    return 0;
  for (int part = 0; part < 4; part++) {
    unsigned v = 0;
    size_t d = 0;
    if (part > 0) {
      if (i >= n || s[i] != '.')
        return 0;
      i++;
    }
    while (i < n && is_digit((uchar)s[i]) && d < 4) {
      v = v * 10 + (unsigned)(s[i] - '0');
      i++;
      d++;
    }
    if (d == 0 || d > 3 || v > 255 || (d > 1 && s[i - d] == '0'))
      return 0;
    out[part] = (unsigned char)v;
  }
  return i == n;
}

int om_url_parse_ipv6(const char *s, size_t n, unsigned char out[16]) {
  uint16_t g[8];
  int ng = 0, dc = -1;
  size_t i = 0;
  if (s == NULL || out == NULL || n < 2)
    return 0;
  if (s[0] == ':') {
    if (s[1] != ':')
      return 0;
    dc = 0;
    i = 2;
  }
  while (i < n) {
    size_t st = i, d = 0;
    unsigned v = 0;
    while (i < n && om__http_hex_val((uchar)s[i]) >= 0 && d < 5) {
      v = v * 16 + (unsigned)om__http_hex_val((uchar)s[i]);
      i++;
      d++;
    }
    if (i < n && s[i] == '.') { /* an embedded IPv4 tail: two groups */
      unsigned char b[4];
      if (ng > 6 || !om_url_parse_ipv4(s + st, n - st, b))
        return 0;
      g[ng++] = (uint16_t)(b[0] << 8 | b[1]);
      g[ng++] = (uint16_t)(b[2] << 8 | b[3]);
      i = n;
      break;
    }
    if (d == 0 || d > 4 || ng == 8)
      return 0;
    g[ng++] = (uint16_t)v;
    if (i == n)
      break;
    if (s[i] != ':')
      return 0;
    i++;
    if (i < n && s[i] == ':') {
      if (dc >= 0)
        return 0;
      dc = ng;
      i++;
    } else if (i == n) {
      return 0; /* a lone trailing ':' */
    }
  }
  if (dc < 0 ? ng != 8 : ng > 7)
    return 0;
  memset(out, 0, 16);
  {
    int tail = dc < 0 ? 0 : ng - dc, head = ng - tail;
    for (int k = 0; k < head; k++) {
      out[2 * k] = (unsigned char)(g[k] >> 8);
      out[2 * k + 1] = (unsigned char)g[k];
    }
    for (int k = 0; k < tail; k++) {
      int at = 8 - tail + k;
      out[2 * at] = (unsigned char)(g[head + k] >> 8);
      out[2 * at + 1] = (unsigned char)g[head + k];
    }
  }
  return 1;
}

/* ------------------------------------------------------------------ */
/* names */

/* Why h[0, n) (no brackets, not an IPv4 literal) is not a host, or NULL. */
static const char *name_problem(const char *h, size_t n) {
  size_t i, label = 0, last = 0;
  int only_digits_dots = 1;
  for (i = 0; i < n; i++) {
    uchar c = (uchar)h[i];
    if (c == '%')
      return "must not percent-encode the host";
    if (c == '_')
      return "has a host name with '_' (names are letters, digits and "
             "'-', RFC 1123)";
    if (!is_alpha(c) && !is_digit(c) && c != '-' && c != '.')
      return "has an invalid character in the host";
    if (!is_digit(c) && c != '.')
      only_digits_dots = 0;
  }
  if (only_digits_dots) {
    /* looks like dotted decimal: say which part of the IPv4 rule fails */
    size_t part = 0, d = 0;
    unsigned v = 0;
    for (i = 0; i <= n; i++) {
      if (i == n || h[i] == '.') {
        if (v > 255)
          return "has an IPv4 literal out of range (octets are 0..255)";
        if (d > 1 && h[part] == '0')
          return "has an IPv4 literal with a leading zero (read as octal "
                 "by some parsers)";
        part = i + 1;
        d = 0;
        v = 0;
      } else if (d < 4) {
        v = v * 10 + (unsigned)(h[i] - '0');
        d++;
      } else {
        v = 256; /* too many digits: out of range whatever they are */
      }
    }
    return "has a malformed IPv4 literal (four dotted decimal octets)";
  }
  if (n > OM_URL_HOST_MAX)
    return "has a host name longer than 253 bytes";
  if (h[n - 1] == '.')
    return "has a host name ending in '.' (write it without the dot)";
  for (i = 0; i <= n; i++) {
    if (i < n && h[i] != '.')
      continue;
    if (i == label)
      return "has an empty label in the host name";
    if (i - label > 63)
      return "has a host name label longer than 63 bytes";
    if (h[label] == '-' || h[i - 1] == '-')
      return "has a host name label that starts or ends with '-'";
    last = label;
    label = i + 1;
  }
  {
    /* WHATWG's "ends in a number": all digits, or 0x and hex digits */
    size_t k = last, all = 1;
    if (n - k >= 2 && h[k] == '0' && (h[k + 1] == 'x' || h[k + 1] == 'X'))
      k += 2;
    for (size_t j = k; j < n; j++)
      if (k == last ? !is_digit((uchar)h[j])
                    : om__http_hex_val((uchar)h[j]) < 0)
        all = 0;
    if (all)
      return "has a host name whose last label is a number (neither a "
             "name nor an IPv4 literal)";
  }
  return NULL;
}

/* ------------------------------------------------------------------ */
/* the rule */

int om_url_parse(const char *url, om_url_t *out, const char **why) {
  size_t n = 0, a, end, host_end, i;
  if (url == NULL || out == NULL)
    return OM_EINVAL;
  memset(out, 0, sizeof *out);
  while (n <= OM_URL_MAX_LEN && url[n] != '\0')
    n++;
  if (n == 0)
    return refuse(why, "is empty");
  if (n > OM_URL_MAX_LEN)
    return refuse(why, "is longer than 2048 bytes");
  for (i = 0; i < n; i++) {
    uchar c = (uchar)url[i];
    if (c <= 0x20 || c >= 0x7f)
      return refuse(why, "contains whitespace, a control or a non-ASCII "
                         "byte (percent-encode it, RFC 3986 section 2.1)");
  }
  if (prefix_nocase(url, n, "http://")) {
    a = 7;
  } else if (prefix_nocase(url, n, "https://")) {
    a = 8;
    out->tls = 1;
  } else {
    return refuse(why, "must be an absolute http:// or https:// URL");
  }
  /* RFC 3986 section 3.2: the authority ends at the first / ? or # */
  for (end = a; end < n; end++)
    if (url[end] == '/' || url[end] == '?' || url[end] == '#')
      break;
  if (memchr(url + a, '@', end - a) != NULL)
    return refuse(why, "must not carry userinfo (RFC 9110 section 4.2.4)");
  if (a == end)
    return refuse(why, "has no host");
  if (url[a] == '[') {
    const char *h = url + a + 1;
    const char *close = memchr(h, ']', end - a - 1);
    size_t hl;
    if (close == NULL)
      return refuse(why, "has an IPv6 literal without its closing ']'");
    hl = (size_t)(close - h);
    if (memchr(h, '%', hl) != NULL)
      return refuse(why, "has an IPv6 zone id (not supported)");
    if (hl > 0 && (h[0] == 'v' || h[0] == 'V'))
      return refuse(why, "has an IPvFuture literal (not supported)");
    if (hl > 45 || !om_url_parse_ipv6(h, hl, out->addr))
      return refuse(why, "has an invalid IPv6 literal");
    memcpy(out->host, h, hl);
    out->host[hl] = '\0';
    out->host_kind = OM_URL_HOST_IPV6;
    host_end = (size_t)(close - url) + 1;
  } else {
    const char *p;
    size_t hl;
    for (host_end = a; host_end < end && url[host_end] != ':'; host_end++)
      ;
    hl = host_end - a;
    if (hl == 0)
      return refuse(why, "has no host");
    if (om_url_parse_ipv4(url + a, hl, out->addr)) {
      out->host_kind = OM_URL_HOST_IPV4;
    } else if ((p = name_problem(url + a, hl)) != NULL) {
      return refuse(why, p);
    } else {
      out->host_kind = OM_URL_HOST_NAME;
    }
    memcpy(out->host, url + a, hl); /* hl <= 253: checked above */
    out->host[hl] = '\0';
  }
  out->port = out->tls ? 443 : 80;
  if (host_end < end) {
    uint32_t port = 0;
    size_t digits = end - host_end - 1;
    if (url[host_end] != ':')
      return refuse(why, "has an unexpected character after the host");
    if (digits == 0)
      return refuse(why, "has an empty port");
    for (i = host_end + 1; i < end; i++) {
      if (!is_digit((uchar)url[i]))
        return refuse(why, "has an invalid port (1..65535)");
      if (digits <= 5)
        port = port * 10 + (uint32_t)(url[i] - '0');
    }
    if (digits > 5 || port < 1 || port > 65535)
      return refuse(why, "has a port out of range (1..65535)");
    out->port = (int)port;
    out->port_given = 1;
  }
  if (end < n && url[end] == '?')
    return refuse(why, "must not carry a query");
  if (end < n && url[end] == '#')
    return refuse(why, "must not carry a fragment");
  out->path = url + end;
  out->path_len = n - end;
  for (i = end; i < n; i++) {
    uchar c = (uchar)url[i];
    if (c == '?')
      return refuse(why, "must not carry a query");
    if (c == '#')
      return refuse(why, "must not carry a fragment");
    if (c == '%') {
      if (i + 2 >= n || om__http_hex_val((uchar)url[i + 1]) < 0 ||
          om__http_hex_val((uchar)url[i + 2]) < 0)
        return refuse(why, "has an invalid percent-escape in the path");
      i += 2;
    } else if (c != '/' && !is_pchar(c)) {
      return refuse(why, "has a character not allowed in a path (RFC 3986 "
                         "section 3.3)");
    }
  }
  return 0;
}
