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
 * OM_ENOTFOUND (unreadable), OM_EPARSE (bad line, unknown role, no tokens).
 */
int om_auth_load(const char *path, om_auth_t **out, char *err, size_t errlen);

void om_auth_free(om_auth_t *a);

/* The number of tokens loaded. */
size_t om_auth_count(const om_auth_t *a);

/*
 * om_auth_check: the Authorization header's value (NULL when absent)
 * against a role. Accepts "Bearer <token>" (scheme case-insensitive,
 * RFC 9110 11.1).
 */
om_auth_result_t om_auth_check(const om_auth_t *a, const char *header,
                               size_t len, int role);

#endif /* OM_AUTH_H */
