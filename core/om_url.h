/*
 * om_url.h: the one rule for an instance URL, and for a control-plane
 * base URL. The control plane (om_snapshot's instance check, so every
 * registration, the watch client's snapshots and --static too), the proxy
 * and `openmesh register --control` all call om_url_parse, so a URL that
 * one part accepts is a URL every part can use: a registration can never
 * carry a URL that makes a proxy refuse the service's snapshots.
 *
 * Accepted: `http://` or `https://` (scheme case-insensitive, RFC 3986
 * 3.1), then a host, an optional `:PORT` and an optional path prefix:
 *
 * - host: an IPv4 literal (four dotted decimal octets 0..255, no leading
 *   zeros: "010.0.0.1" is refused, since other parsers read it as octal),
 *   a bracketed IPv6 literal (RFC 4291 2.2 text forms, an embedded IPv4
 *   tail included; no zone id, no IPvFuture), or a DNS name: LDH labels
 *   (RFC 1123 2.1: letters, digits and '-', not first or last in a
 *   label) of 1..63 bytes, 253 bytes in all. A name's last label must
 *   not be numeric (all digits, or 0x and hex digits): "999.1.1.1" and
 *   "1.2.3" are neither valid IPv4 literals nor names (RFC 3696 2, WHATWG
 *   URL "ends in a number"). A trailing dot ("example.com.") is refused:
 *   it names the same host as without it, but would make two spellings
 *   of one peer, and neither SNI (RFC 6066 3) nor a Host field carries
 *   it.
 * - port: 1..5 digits, 1..65535 (leading zeros allowed: the number is what
 *   counts). Default 80 for http, 443 for https. An empty port ("h:") is
 *   refused.
 * - path prefix: "/" then RFC 3986 pchar and "/" with valid %-escapes.
 *
 * Refused, each with its own reason: other schemes, userinfo, a query, a
 * fragment, whitespace, controls and non-ASCII bytes, an empty host,
 * percent-escapes or other characters in a host, out-of-range octets and
 * ports, zone ids, and URLs longer than OM_URL_MAX_LEN bytes.
 *
 * Pure: no I/O, no allocation; nothing is resolved.
 */
#ifndef OM_URL_H
#define OM_URL_H

#include <stddef.h>

/* The longest URL accepted, in bytes (without the NUL). */
#define OM_URL_MAX_LEN 2048
/* The longest host text: a DNS name of 253 bytes (an IPv6 literal is at
 * most 45). */
#define OM_URL_HOST_MAX 253

typedef enum om_url_host_kind_e {
  OM_URL_HOST_IPV4 = 1,
  OM_URL_HOST_IPV6 = 2,
  OM_URL_HOST_NAME = 3
} om_url_host_kind_t;

typedef struct om_url_s {
  int tls; /* 1 for https:// */
  om_url_host_kind_t host_kind;
  /* the host as written, without brackets, NUL-terminated */
  char host[OM_URL_HOST_MAX + 1];
  /* a literal's address in network order: 4 bytes (IPv4) or 16 (IPv6);
   * zero for a name */
  unsigned char addr[16];
  int port;       /* 1..65535; the scheme's default when not given */
  int port_given; /* the URL spelled a port */
  /* the path prefix, pointing into the URL ("" when the URL has none);
   * never holds a query or fragment */
  const char *path;
  size_t path_len;
} om_url_t;

/*
 * om_url_parse: check url against the rule above and split it.
 * Returns 0 and fills *out (its path points into url, which must outlive
 * that use). OM_EINVAL for a NULL url or out (*why untouched). OM_EPARSE
 * for a refused URL, with *why (when why is not NULL) a static reason
 * that completes "url ..." ("must not carry a query", "has an IPv4
 * literal out of range (octets are 0..255)"); *out is then unspecified.
 */
int om_url_parse(const char *url, om_url_t *out, const char **why);

/*
 * om_url_parse_ipv4 / om_url_parse_ipv6: whether s[0, n) is an IPv4
 * literal (strict dotted decimal, as above) or an IPv6 literal (without
 * brackets and without a zone id); on success the address in network
 * order goes to out (4 or 16 bytes) and 1 is returned, else 0 (out is
 * then unspecified). Exported for the places that meet bare literals
 * (the upstream client's targets) so they apply the same rule.
 */
int om_url_parse_ipv4(const char *s, size_t n, unsigned char out[4]);
int om_url_parse_ipv6(const char *s, size_t n, unsigned char out[16]);

#endif /* OM_URL_H */
