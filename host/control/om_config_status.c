/* om_config_status.c: see om_config_status.h. */
#include "om_config_status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_snapshot.h"

typedef struct entry_s {
  char id[OM_CFG_ID_MAX + 1];
  char address[OM_CFG_ADDRESS_MAX + 1];
  uint64_t applied, refused;
  char *reason;                                 /* with refused, else NULL */
  uint64_t applied_at, refused_at, last_report; /* monotonic ns */
} entry_t;

typedef struct doc_s {
  char name[OM_NAME_MAX + 1];
  entry_t **e; /* sorted by id */
  size_t n, cap;
} doc_t;

struct om_cfg_status_s {
  size_t max_proxies;
  uint64_t ttl_ns;
  doc_t **docs; /* sorted by name */
  size_t n_docs, cap_docs;
  om_cfg_status_stats_t st;
};

int om_cfg_status_new(size_t max_proxies, uint64_t ttl_ns,
                      om_cfg_status_t **out) {
  om_cfg_status_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return OM_ENOMEM;
  t->max_proxies = max_proxies ? max_proxies : OM_CFG_DEFAULT_MAX_PROXIES;
  t->ttl_ns = ttl_ns ? ttl_ns : OM_CFG_DEFAULT_TTL_NS;
  *out = t;
  return 0;
}

static void entry_free(entry_t *e) {
  if (e != NULL)
    free(e->reason);
  free(e);
}

void om_cfg_status_free(om_cfg_status_t *t) {
  if (t == NULL)
    return;
  for (size_t i = 0; i < t->n_docs; i++) {
    for (size_t k = 0; k < t->docs[i]->n; k++)
      entry_free(t->docs[i]->e[k]);
    free(t->docs[i]->e);
    free(t->docs[i]);
  }
  free(t->docs);
  free(t);
}

static int visible(const char *s, size_t max, int empty_ok) {
  size_t n = 0;
  for (; s[n] != '\0'; n++)
    if ((unsigned char)s[n] <= 0x20 || (unsigned char)s[n] >= 0x7f || n >= max)
      return 0;
  return n > 0 || empty_ok;
}

int om_cfg_report_valid(const om_cfg_report_t *r, const char **field) {
  if (r->id == NULL || !visible(r->id, OM_CFG_ID_MAX, 0)) {
    *field = "id";
    return 0;
  }
  if (r->address != NULL && !visible(r->address, OM_CFG_ADDRESS_MAX, 1)) {
    *field = "address";
    return 0;
  }
  return 1;
}

/* Binary search; *at is where name is or would go. */
static doc_t *find_doc(const om_cfg_status_t *t, const char *name, size_t *at) {
  size_t lo = 0, hi = t->n_docs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(t->docs[mid]->name, name);
    if (c == 0) {
      *at = mid;
      return t->docs[mid];
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *at = lo;
  return NULL;
}

static entry_t *find_entry(const doc_t *d, const char *id, size_t *at) {
  size_t lo = 0, hi = d->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(d->e[mid]->id, id);
    if (c == 0) {
      *at = mid;
      return d->e[mid];
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *at = lo;
  return NULL;
}

static void remove_at(doc_t *d, size_t i) {
  entry_free(d->e[i]);
  memmove(&d->e[i], &d->e[i + 1], (d->n - i - 1) * sizeof *d->e);
  d->n--;
}

static void expire(om_cfg_status_t *t, doc_t *d, uint64_t now) {
  size_t k = 0;
  for (size_t i = 0; i < d->n; i++) {
    entry_t *e = d->e[i];
    if (now - e->last_report > t->ttl_ns) {
      entry_free(e);
      t->st.expired++;
      t->st.entries--;
    } else {
      d->e[k++] = e;
    }
  }
  d->n = k;
}

/* A copy of s cut to max bytes, never inside a UTF-8 sequence. */
static char *cut_utf8(const char *s, size_t max) {
  size_t n = strlen(s);
  char *d;
  if (n > max) {
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
      n--;
  }
  d = malloc(n + 1);
  if (d != NULL) {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

static doc_t *doc_get(om_cfg_status_t *t, const char *name) {
  size_t at;
  doc_t *d = find_doc(t, name, &at);
  if (d != NULL)
    return d;
  if (strlen(name) > OM_NAME_MAX)
    return NULL;
  if (t->n_docs == t->cap_docs) {
    size_t cap = t->cap_docs ? t->cap_docs * 2 : 8;
    doc_t **x = realloc(t->docs, cap * sizeof *x);
    if (x == NULL)
      return NULL;
    t->docs = x;
    t->cap_docs = cap;
  }
  if ((d = calloc(1, sizeof *d)) == NULL)
    return NULL;
  strcpy(d->name, name);
  memmove(&t->docs[at + 1], &t->docs[at], (t->n_docs - at) * sizeof *t->docs);
  t->docs[at] = d;
  t->n_docs++;
  return d;
}

int om_cfg_status_report(om_cfg_status_t *t, const char *name,
                         const om_cfg_report_t *r, uint64_t now_ns) {
  const char *field;
  char *reason = NULL;
  doc_t *d;
  entry_t *e;
  size_t at;
  if (t == NULL || name == NULL || r == NULL || !om_cfg_report_valid(r, &field))
    return OM_EINVAL;
  if ((d = doc_get(t, name)) == NULL)
    return OM_ENOMEM;
  expire(t, d, now_ns);
  if (r->refused != 0 && (reason = cut_utf8(r->reason != NULL ? r->reason : "",
                                            OM_CFG_REASON_MAX)) == NULL)
    return OM_ENOMEM;
  e = find_entry(d, r->id, &at);
  if (e == NULL) {
    if (d->n >= t->max_proxies) {
      /* full: the entry reported least recently makes room */
      size_t old = 0;
      for (size_t i = 1; i < d->n; i++)
        if (d->e[i]->last_report < d->e[old]->last_report)
          old = i;
      remove_at(d, old);
      t->st.evicted++;
      t->st.entries--;
      find_entry(d, r->id, &at);
    }
    if (d->n == d->cap) {
      size_t cap = d->cap ? d->cap * 2 : 8;
      entry_t **x = realloc(d->e, cap * sizeof *x);
      if (x == NULL) {
        free(reason);
        return OM_ENOMEM;
      }
      d->e = x;
      d->cap = cap;
    }
    if ((e = calloc(1, sizeof *e)) == NULL) {
      free(reason);
      return OM_ENOMEM;
    }
    strcpy(e->id, r->id);
    memmove(&d->e[at + 1], &d->e[at], (d->n - at) * sizeof *d->e);
    d->e[at] = e;
    d->n++;
    t->st.entries++;
  }
  snprintf(e->address, sizeof e->address, "%s",
           r->address != NULL ? r->address : "");
  if (r->applied != e->applied || e->applied_at == 0)
    e->applied_at = now_ns;
  e->applied = r->applied;
  if (r->refused == 0) {
    free(e->reason);
    e->reason = NULL;
    e->refused = 0;
    e->refused_at = 0;
    free(reason);
  } else {
    if (r->refused != e->refused)
      e->refused_at = now_ns;
    e->refused = r->refused;
    free(e->reason);
    e->reason = reason;
  }
  e->last_report = now_ns;
  return 0;
}

static double wall_of(uint64_t t, uint64_t now, double wall_s) {
  return wall_s - (double)(now - t) / 1e9;
}

json_t *om_cfg_status_json(om_cfg_status_t *t, const char *name,
                           uint64_t now_ns, double wall_s) {
  json_t *arr = json_array(), *o;
  size_t at;
  doc_t *d = find_doc(t, name, &at);
  if (arr == NULL)
    return NULL;
  if (d != NULL)
    expire(t, d, now_ns);
  for (size_t i = 0; d != NULL && i < d->n; i++) {
    entry_t *e = d->e[i];
    json_t *p =
        json_pack("{s:s, s:s, s:I, s:f, s:I, s:s?, s:f, s:f, s:f}", "id", e->id,
                  "address", e->address, "applied", (json_int_t)e->applied,
                  "applied_at", wall_of(e->applied_at, now_ns, wall_s),
                  "refused", (json_int_t)e->refused, "reason", e->reason,
                  "refused_at", wall_of(e->refused_at, now_ns, wall_s),
                  "last_report", wall_of(e->last_report, now_ns, wall_s),
                  "age_s", (double)(now_ns - e->last_report) / 1e9);
    if (p == NULL) {
      json_decref(arr);
      return NULL;
    }
    if (e->applied == 0) {
      json_object_set_new(p, "applied", json_null());
      json_object_set_new(p, "applied_at", json_null());
    }
    if (e->refused == 0) {
      json_object_set_new(p, "refused", json_null());
      json_object_set_new(p, "reason", json_null());
      json_object_set_new(p, "refused_at", json_null());
    }
    if (json_array_append_new(arr, p) != 0) {
      json_decref(arr);
      return NULL;
    }
  }
  o = json_pack("{s:s, s:I, s:I, s:f, s:o}", "name", name, "count",
                (json_int_t)(d != NULL ? d->n : 0), "max_proxies",
                (json_int_t)t->max_proxies, "ttl_s", (double)t->ttl_ns / 1e9,
                "proxies", arr);
  return o;
}

size_t om_cfg_status_count(om_cfg_status_t *t, const char *name,
                           uint64_t now_ns) {
  size_t at;
  doc_t *d = find_doc(t, name, &at);
  if (d == NULL)
    return 0;
  expire(t, d, now_ns);
  return d->n;
}

void om_cfg_status_stats(const om_cfg_status_t *t, om_cfg_status_stats_t *out) {
  if (t != NULL && out != NULL)
    *out = t->st;
}
