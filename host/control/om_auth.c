/* om_auth.c: see om_auth.h. */
#include "om_auth.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include <xxhash.h>

#include "om_errno.h"

#define MAX_TOKEN 4096

typedef struct {
  XXH128_hash_t digest;
  int roles;
} entry_t;

/* A `san:` line: a certificate name, not a secret. */
typedef struct {
  char *name;
  int roles;
} san_t;

struct om_auth_s {
  entry_t *entries;
  size_t n;
  san_t *sans;
  size_t n_sans;
  uint64_t key; /* per-process: digests are useless elsewhere */
};

static XXH128_hash_t digest(const om_auth_t *a, const char *tok, size_t len) {
  return XXH3_128bits_withSeed(tok, len, a->key);
}

static int parse_roles(char *s, int *roles) {
  *roles = 0;
  for (char *save = NULL, *r = strtok_r(s, ",", &save); r != NULL;
       r = strtok_r(NULL, ",", &save)) {
    if (strcmp(r, "read") == 0)
      *roles |= OM_ROLE_READ;
    else if (strcmp(r, "register") == 0)
      *roles |= OM_ROLE_REGISTER;
    else if (strcmp(r, "admin") == 0)
      *roles |= OM_ROLE_ADMIN | OM_ROLE_REGISTER | OM_ROLE_READ;
    else
      return -1;
  }
  return *roles != 0 ? 0 : -1;
}

int om_auth_load(const char *path, om_auth_t **out, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  char line[MAX_TOKEN + 256];
  om_auth_t *a;
  int lineno = 0;
  if (f == NULL) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return OM_ENOTFOUND;
  }
  a = calloc(1, sizeof *a);
  if (a == NULL || getrandom(&a->key, sizeof a->key, 0) != sizeof a->key) {
    free(a);
    fclose(f);
    snprintf(err, errlen, "%s: out of memory or entropy", path);
    return OM_ENOMEM;
  }
  while (fgets(line, sizeof line, f) != NULL) {
    char *tok, *roles, *save = NULL;
    int r;
    lineno++;
    if (strchr(line, '\n') == NULL && !feof(f)) {
      snprintf(err, errlen, "%s:%d: line too long", path, lineno);
      goto fail;
    }
    tok = strtok_r(line, " \t\r\n", &save);
    if (tok == NULL || tok[0] == '#')
      continue;
    roles = strtok_r(NULL, " \t\r\n", &save);
    if (roles == NULL || strtok_r(NULL, " \t\r\n", &save) != NULL ||
        parse_roles(roles, &r) != 0) {
      snprintf(err, errlen,
               "%s:%d: expected 'TOKEN ROLE[,ROLE]' with roles read, "
               "register, admin",
               path, lineno);
      goto fail;
    }
    if (strncmp(tok, "san:", 4) == 0) {
      san_t *sv;
      if (tok[4] == '\0') {
        snprintf(err, errlen, "%s:%d: 'san:' needs a name (san:NAME ROLES)",
                 path, lineno);
        goto fail;
      }
      sv = realloc(a->sans, (a->n_sans + 1) * sizeof *sv);
      if (sv == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto fail;
      }
      a->sans = sv;
      size_t nl = strlen(tok + 4) + 1;
      if ((sv[a->n_sans].name = malloc(nl)) == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto fail;
      }
      memcpy(sv[a->n_sans].name, tok + 4, nl);
      sv[a->n_sans++].roles = r;
      continue;
    }
    entry_t *e = realloc(a->entries, (a->n + 1) * sizeof *e);
    if (e == NULL) {
      snprintf(err, errlen, "%s: out of memory", path);
      goto fail;
    }
    a->entries = e;
    e[a->n].digest = digest(a, tok, strlen(tok));
    e[a->n].roles = r;
    a->n++;
    memset(line, 0, sizeof line); /* no plaintext token left behind */
  }
  fclose(f);
  if (a->n == 0 && a->n_sans == 0) {
    snprintf(err, errlen, "%s: no tokens", path);
    om_auth_free(a);
    return OM_EPARSE;
  }
  *out = a;
  return 0;
fail:
  fclose(f);
  om_auth_free(a);
  return OM_EPARSE;
}

void om_auth_free(om_auth_t *a) {
  if (a == NULL)
    return;
  for (size_t i = 0; i < a->n_sans; i++)
    free(a->sans[i].name);
  free(a->sans);
  free(a->entries);
  free(a);
}

size_t om_auth_count(const om_auth_t *a) {
  return a->n + a->n_sans;
}

size_t om_auth_san_count(const om_auth_t *a) {
  return a->n_sans;
}

om_auth_result_t om_auth_check_sans(const om_auth_t *a, const char *const *sans,
                                    size_t n, int role) {
  int roles = 0, matched = 0;
  if (a == NULL || sans == NULL)
    return OM_AUTH_MISSING;
  for (size_t i = 0; i < a->n_sans; i++)
    for (size_t k = 0; k < n; k++)
      if (sans[k] != NULL && strcmp(sans[k], a->sans[i].name) == 0) {
        roles |= a->sans[i].roles;
        matched = 1;
      }
  if (!matched)
    return OM_AUTH_MISSING;
  return (roles & role) == role ? OM_AUTH_OK : OM_AUTH_FORBIDDEN;
}

/* Equal digests, in time independent of where they differ. */
static int digest_equal(XXH128_hash_t x, XXH128_hash_t y) {
  volatile uint64_t diff = (x.low64 ^ y.low64) | (x.high64 ^ y.high64);
  return diff == 0;
}

om_auth_result_t om_auth_check(const om_auth_t *a, const char *header,
                               size_t len, int role) {
  XXH128_hash_t d;
  int roles = 0;
  if (header == NULL)
    return OM_AUTH_MISSING;
  if (len < 7 || strncasecmp(header, "Bearer ", 7) != 0)
    return OM_AUTH_INVALID;
  header += 7;
  len -= 7;
  while (len > 0 && (*header == ' ' || *header == '\t')) {
    header++;
    len--;
  }
  while (len > 0 && (header[len - 1] == ' ' || header[len - 1] == '\t'))
    len--;
  if (len == 0 || len > MAX_TOKEN)
    return OM_AUTH_INVALID;
  d = digest(a, header, len);
  for (size_t i = 0; i < a->n; i++) /* every entry, no early exit */
    roles |= digest_equal(d, a->entries[i].digest) ? a->entries[i].roles : 0;
  if (roles == 0)
    return OM_AUTH_INVALID;
  return (roles & role) == role ? OM_AUTH_OK : OM_AUTH_FORBIDDEN;
}
