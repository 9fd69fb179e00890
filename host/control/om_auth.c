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
  int line; /* in the file: a second line with the same token names it */
} entry_t;

/* A `san:` line: a certificate name, not a secret. */
typedef struct {
  char *name;
  int roles;
  int line;
} san_t;

struct om_auth_s {
  entry_t *entries;
  size_t n;
  san_t *sans;
  size_t n_sans;
};

/*
 * The digest key: one per process, so digests are useless elsewhere, and
 * the same across reloads, so an open watch's credential (kept as a
 * digest, om_auth_digest_t) can be checked against the new file. Drawn on
 * the first load; the control plane loads its tokens on its loop thread.
 */
static uint64_t process_key;
static int process_key_set;

static int key_init(void) {
  if (process_key_set)
    return 0;
  if (getrandom(&process_key, sizeof process_key, 0) != sizeof process_key)
    return -1;
  process_key_set = 1;
  return 0;
}

static XXH128_hash_t digest(const char *tok, size_t len) {
  return XXH3_128bits_withSeed(tok, len, process_key);
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
  if (a == NULL || key_init() != 0) {
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
      for (size_t i = 0; i < a->n_sans; i++)
        if (strcmp(a->sans[i].name, tok + 4) == 0) {
          /* roles would silently add up: say which line to merge */
          snprintf(err, errlen, "%s:%d: 'san:%s' is already on line %d", path,
                   lineno, tok + 4, a->sans[i].line);
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
      sv[a->n_sans].line = lineno;
      sv[a->n_sans++].roles = r;
      continue;
    }
    XXH128_hash_t d = digest(tok, strlen(tok));
    for (size_t i = 0; i < a->n; i++)
      if (XXH128_isEqual(a->entries[i].digest, d)) {
        memset(line, 0, sizeof line);
        snprintf(err, errlen,
                 "%s:%d: the same token as line %d (one line per token: "
                 "list its roles there)",
                 path, lineno, a->entries[i].line);
        goto fail;
      }
    entry_t *e = realloc(a->entries, (a->n + 1) * sizeof *e);
    if (e == NULL) {
      snprintf(err, errlen, "%s: out of memory", path);
      goto fail;
    }
    a->entries = e;
    e[a->n].digest = d;
    e[a->n].roles = r;
    e[a->n].line = lineno;
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

om_auth_result_t om_auth_digest(const char *header, size_t len,
                                om_auth_digest_t *out) {
  XXH128_hash_t d;
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
  if (len == 0 || len > MAX_TOKEN || key_init() != 0)
    return OM_AUTH_INVALID;
  d = digest(header, len);
  out->lo = d.low64;
  out->hi = d.high64;
  return OM_AUTH_OK;
}

om_auth_result_t om_auth_check_digest(const om_auth_t *a,
                                      const om_auth_digest_t *d, int role) {
  XXH128_hash_t x;
  int roles = 0;
  x.low64 = d->lo;
  x.high64 = d->hi;
  for (size_t i = 0; i < a->n; i++) /* every entry, no early exit */
    roles |= digest_equal(x, a->entries[i].digest) ? a->entries[i].roles : 0;
  if (roles == 0)
    return OM_AUTH_INVALID;
  return (roles & role) == role ? OM_AUTH_OK : OM_AUTH_FORBIDDEN;
}

om_auth_result_t om_auth_check(const om_auth_t *a, const char *header,
                               size_t len, int role) {
  om_auth_digest_t d;
  om_auth_result_t r = om_auth_digest(header, len, &d);
  return r != OM_AUTH_OK ? r : om_auth_check_digest(a, &d, role);
}
