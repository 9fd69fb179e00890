/*
 * om_auth.h: bearer tokens with roles, for the control plane.
 *
 * The token file holds one token per line: `TOKEN ROLE[,ROLE...]`, with
 * roles `read` (discovery, watches), `register` (instances) and `admin`
 * (config; admin also grants read and register). Blank lines and lines
 * starting with '#' are ignored. Tokens are kept only as keyed digests
 * (XXH3-128 with a per-process random key) and a presented token is
 * compared with every entry in constant time, so neither a token's content
 * nor its length leaks through timing.
 *
 * A line `san:NAME ROLE[,ROLE...]` grants the roles to a caller whose
 * client certificate the listener verified (--tls-client-ca) and that
 * carries NAME as a URI or DNS subject alternative name, e.g.
 * `san:spiffe://mesh/ns/ops/sa/deployer admin`: an alternative to a
 * bearer token. A name is not a secret: it is kept and compared as text.
 */
#ifndef OM_AUTH_H
#define OM_AUTH_H

#include <stddef.h>

typedef struct om_auth_s om_auth_t;

enum {
  OM_ROLE_READ = 1,
  OM_ROLE_REGISTER = 2,
  OM_ROLE_ADMIN = 4,
};

typedef enum {
  OM_AUTH_OK = 0,
  OM_AUTH_MISSING,   /* no Authorization header: 401 */
  OM_AUTH_INVALID,   /* malformed or unknown token: 401 */
  OM_AUTH_FORBIDDEN, /* known token without the role: 403 */
} om_auth_result_t;

/*
 * om_auth_load: read a token file. Returns 0 with *out set, or a negative
 * code with a message naming the file and line in err (nothing allocated):
 * OM_ENOTFOUND (unreadable), OM_EPARSE (bad line, unknown role, no tokens,
 * a token or a `san:` name on two lines: their roles would silently add
 * up, so the error names both lines).
 */
int om_auth_load(const char *path, om_auth_t **out, char *err, size_t errlen);

void om_auth_free(om_auth_t *a);

/* The number of entries loaded (tokens and SAN lines). */
size_t om_auth_count(const om_auth_t *a);

/* The number of SAN lines among them. */
size_t om_auth_san_count(const om_auth_t *a);

/*
 * A presented bearer token as the keyed digest the file's tokens are kept
 * as: what an open stream keeps of its credential, so a reloaded file can
 * end it (the key is per process and survives reloads).
 */
typedef struct {
  unsigned long long lo, hi;
} om_auth_digest_t;

/*
 * om_auth_digest: the digest of the Authorization header's value
 * ("Bearer <token>", scheme case-insensitive, RFC 9110 11.1) into *out.
 * OM_AUTH_OK; OM_AUTH_MISSING for NULL; OM_AUTH_INVALID when malformed.
 */
om_auth_result_t om_auth_digest(const char *header, size_t len,
                                om_auth_digest_t *out);

/* om_auth_check for a digest made by om_auth_digest (constant time over
 * every entry, as om_auth_check). */
om_auth_result_t om_auth_check_digest(const om_auth_t *a,
                                      const om_auth_digest_t *d, int role);

/*
 * om_auth_check: the Authorization header's value (NULL when absent)
 * against a role. Accepts "Bearer <token>" (scheme case-insensitive,
 * RFC 9110 11.1).
 */
om_auth_result_t om_auth_check(const om_auth_t *a, const char *header,
                               size_t len, int role);

/*
 * om_auth_check_sans: the subject alternative names (URI and DNS) of a
 * verified client certificate against a role: the roles of every `san:`
 * line naming one of them are granted together. OM_AUTH_OK; OM_AUTH_
 * FORBIDDEN when a line matched without the role; OM_AUTH_MISSING when
 * none matched (the caller may then look at a bearer token). a or sans
 * NULL (n 0) is OM_AUTH_MISSING.
 */
om_auth_result_t om_auth_check_sans(const om_auth_t *a, const char *const *sans,
                                    size_t n, int role);

#endif /* OM_AUTH_H */
