/*
 * om_snapshot.c: instance validation and immutable, shared snapshots
 * (om_snapshot.h).
 *
 * Each instance in a snapshot lives in one allocation (a node: refcount,
 * the om_instance_t, its metadata array and every string), so sharing an
 * instance between two revisions is one increment, and freeing it one
 * free(). A snapshot is one allocation too: header, the sorted array of
 * node pointers, the service name.
 */
#include "om_snapshot.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_url.h"

typedef unsigned char uchar;

typedef struct node_s {
  atomic_size_t refs;
  om_instance_t inst;
  om_kv_t kv[]; /* inst.metadata points here; strings follow */
} node_t;

typedef struct cache_slot_s {
  void *data;
  void (*free_fn)(void *);
} cache_slot_t;

struct om_snapshot_s {
  atomic_size_t refs;
  uint64_t revision;
  const char *service; /* inside this allocation, after nodes[] */
  size_t n;
  cache_slot_t cache[OM_SNAPSHOT_CACHE_SLOTS];
  node_t *nodes[]; /* sorted by id, unique */
};

/* ---- validation ---- */

/* strlen that stops looking after max + 1 bytes (hostile input). */
static size_t bounded_len(const char *s, size_t max) {
  size_t n = 0;
  while (n <= max && s[n] != '\0')
    n++;
  return n;
}

int om_valid_name(const char *s, size_t len) {
  if (s == NULL || len == 0 || len > OM_NAME_MAX)
    return 0;
  if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
    return 0;
  for (size_t i = 0; i < len; i++) {
    uchar c = (uchar)s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return 0;
  }
  return 1;
}

/* Well-formed UTF-8 per RFC 3629 section 4 (the UTF8-octets grammar). */
static int utf8_valid(const uchar *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uchar c = s[i];
    uchar lo = 0x80, hi = 0xbf;
    size_t need;
    if (c < 0x80) {
      i++;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf)
      need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
      need = 2;
      if (c == 0xe0)
        lo = 0xa0; /* overlong */
      else if (c == 0xed)
        hi = 0x9f; /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3;
      if (c == 0xf0)
        lo = 0x90; /* overlong */
      else if (c == 0xf4)
        hi = 0x8f; /* above U+10FFFF */
    } else
      return 0;
    if (n - i - 1 < need)
      return 0;
    if (s[i + 1] < lo || s[i + 1] > hi)
      return 0;
    for (size_t k = 2; k <= need; k++)
      if (s[i + k] < 0x80 || s[i + k] > 0xbf)
        return 0;
    i += need + 1;
  }
  return 1;
}

/* NULL when u is an acceptable instance URL (om_url.h: the one rule the
 * proxy applies too), else why not. */
static const char *url_problem(const char *u) {
  om_url_t parsed;
  const char *why = "is invalid";
  if (u == NULL)
    return "is required";
  if (om_url_parse(u, &parsed, &why) != 0)
    return why;
  return NULL;
}

static int kv_cmp(const void *a, const void *b) {
  return strcmp(((const om_kv_t *)a)->key, ((const om_kv_t *)b)->key);
}

static int kv_sorted(const om_kv_t *kv, size_t n) {
  for (size_t i = 1; i < n; i++)
    if (strcmp(kv[i - 1].key, kv[i].key) >= 0)
      return 0;
  return 1;
}

static const char *metadata_problem(const om_kv_t *kv, size_t n) {
  if (n == 0)
    return NULL;
  if (kv == NULL)
    return "is NULL with entries";
  if (n > OM_META_MAX_ENTRIES)
    return "has more than 64 entries";
  for (size_t i = 0; i < n; i++) {
    size_t kl, vl;
    if (kv[i].key == NULL || kv[i].value == NULL)
      return "has a NULL key or value";
    kl = bounded_len(kv[i].key, OM_META_KEY_MAX);
    vl = bounded_len(kv[i].value, OM_META_VALUE_MAX);
    if (kl == 0)
      return "has an empty key";
    if (kl > OM_META_KEY_MAX)
      return "has a key longer than 128 bytes";
    if (vl > OM_META_VALUE_MAX)
      return "has a value longer than 1024 bytes";
    if (!utf8_valid((const uchar *)kv[i].key, kl))
      return "has a key that is not valid UTF-8";
    if (!utf8_valid((const uchar *)kv[i].value, vl))
      return "has a value that is not valid UTF-8";
  }
  /* Sorted input (the common case) proves uniqueness in one pass; the
   * quadratic fallback is bounded by the 64-entry cap. */
  if (!kv_sorted(kv, n))
    for (size_t i = 0; i < n; i++)
      for (size_t j = i + 1; j < n; j++)
        if (strcmp(kv[i].key, kv[j].key) == 0)
          return "has a duplicate key";
  return NULL;
}

static int fail(const char **field, const char **why, const char *f,
                const char *w) {
  if (field != NULL)
    *field = f;
  if (why != NULL)
    *why = w;
  return OM_EINVAL;
}

int om_instance_validate(const om_instance_t *in, const char **field,
                         const char **why) {
  const char *p;
  if (in == NULL)
    return fail(field, why, "id", "instance is NULL");
  if (in->id == NULL ||
      !om_valid_name(in->id, bounded_len(in->id, OM_NAME_MAX)))
    return fail(field, why, "id",
                "must be 1 to 128 characters of [A-Za-z0-9._-], "
                "not \".\" or \"..\"");
  if ((p = url_problem(in->url)) != NULL)
    return fail(field, why, "url", p);
  if (!isfinite(in->weight) || !(in->weight > 0.0) ||
      in->weight > OM_WEIGHT_MAX)
    return fail(field, why, "weight", "must be a finite number in (0, 10000]");
  if (in->ttl_ms < OM_TTL_MIN_MS || in->ttl_ms > OM_TTL_MAX_MS)
    return fail(field, why, "ttl_ms",
                "must be an integer from 1000 to 3600000 (1 s to 1 h)");
  if (in->zone != NULL) {
    size_t zl = bounded_len(in->zone, OM_ZONE_MAX);
    int ok = zl >= 1 && zl <= OM_ZONE_MAX;
    for (size_t i = 0; ok && i < zl; i++)
      ok = (uchar)in->zone[i] >= 0x20 && (uchar)in->zone[i] <= 0x7e;
    if (!ok)
      return fail(field, why, "zone",
                  "must be 1 to 128 printable ASCII characters");
  }
  if ((p = metadata_problem(in->metadata, in->n_metadata)) != NULL)
    return fail(field, why, "metadata", p);
  return 0;
}

/* ---- instances as separate allocations (the caller's kind) ---- */

static char *dup_or_null(const char *s, int *oom) {
  char *d;
  size_t n;
  if (s == NULL)
    return NULL;
  n = strlen(s) + 1;
  d = malloc(n);
  if (d == NULL) {
    *oom = 1;
    return NULL;
  }
  memcpy(d, s, n);
  return d;
}

void om_instance_clear(om_instance_t *in) {
  if (in == NULL)
    return;
  free(in->id);
  free(in->url);
  free(in->zone);
  for (size_t i = 0; in->metadata != NULL && i < in->n_metadata; i++) {
    free(in->metadata[i].key);
    free(in->metadata[i].value);
  }
  free(in->metadata);
  memset(in, 0, sizeof *in);
}

int om_instance_copy(om_instance_t *out, const om_instance_t *in) {
  om_instance_t t;
  int oom = 0;
  if (out == NULL || in == NULL || (in->metadata == NULL && in->n_metadata))
    return OM_EINVAL;
  memset(&t, 0, sizeof t);
  t.weight = in->weight;
  t.ttl_ms = in->ttl_ms;
  t.id = dup_or_null(in->id, &oom);
  t.url = dup_or_null(in->url, &oom);
  t.zone = dup_or_null(in->zone, &oom);
  if (!oom && in->n_metadata > 0) {
    t.metadata = calloc(in->n_metadata, sizeof *t.metadata);
    if (t.metadata == NULL)
      oom = 1;
    else
      t.n_metadata = in->n_metadata;
    for (size_t i = 0; !oom && i < in->n_metadata; i++) {
      t.metadata[i].key = dup_or_null(in->metadata[i].key, &oom);
      t.metadata[i].value = dup_or_null(in->metadata[i].value, &oom);
    }
  }
  if (oom) {
    om_instance_clear(&t);
    return OM_ENOMEM;
  }
  if (t.n_metadata > 1 && !kv_sorted(t.metadata, t.n_metadata)) {
    /* Only a NULL key could not be compared; leave such input unsorted. */
    int nullkey = 0;
    for (size_t i = 0; i < t.n_metadata; i++)
      nullkey |= t.metadata[i].key == NULL;
    if (!nullkey)
      qsort(t.metadata, t.n_metadata, sizeof *t.metadata, kv_cmp);
  }
  *out = t;
  return 0;
}

static int str_eq(const char *a, const char *b) {
  if (a == NULL || b == NULL)
    return a == b;
  return strcmp(a, b) == 0;
}

/* The value of key in sorted kv, or NULL. */
static const char *kv_lookup(const om_kv_t *kv, size_t n, const char *key) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(kv[mid].key, key);
    if (c == 0)
      return kv[mid].value;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

static int kv_valid_keys(const om_kv_t *kv, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (kv[i].key == NULL || kv[i].value == NULL)
      return 0;
  return 1;
}

int om_instance_equal(const om_instance_t *a, const om_instance_t *b) {
  const om_kv_t *x, *y;
  size_t n;
  if (a == NULL || b == NULL)
    return a == b;
  if (!str_eq(a->id, b->id) || !str_eq(a->url, b->url) ||
      !str_eq(a->zone, b->zone) || a->weight != b->weight ||
      a->ttl_ms != b->ttl_ms || a->n_metadata != b->n_metadata)
    return 0;
  n = a->n_metadata;
  if (n == 0)
    return 1;
  if (a->metadata == NULL || b->metadata == NULL ||
      !kv_valid_keys(a->metadata, n) || !kv_valid_keys(b->metadata, n))
    return 0;
  x = a->metadata;
  y = b->metadata;
  if (kv_sorted(x, n) && kv_sorted(y, n)) {
    for (size_t i = 0; i < n; i++)
      if (strcmp(x[i].key, y[i].key) != 0 ||
          strcmp(x[i].value, y[i].value) != 0)
        return 0;
    return 1;
  }
  if (!kv_sorted(y, n)) {
    const om_kv_t *t = x;
    x = y;
    y = t;
  }
  for (size_t i = 0; i < n; i++) {
    const char *v = NULL;
    if (kv_sorted(y, n))
      v = kv_lookup(y, n, x[i].key);
    else
      for (size_t j = 0; j < n && v == NULL; j++)
        if (strcmp(y[j].key, x[i].key) == 0)
          v = y[j].value;
    if (v == NULL || strcmp(v, x[i].value) != 0)
      return 0;
  }
  return 1;
}

/* ---- nodes: one allocation per instance, shared between snapshots ---- */

/* A node holding a copy of in (valid), metadata sorted by key. */
static node_t *node_new(const om_instance_t *in) {
  size_t id_n = strlen(in->id) + 1, url_n = strlen(in->url) + 1;
  size_t zone_n = in->zone != NULL ? strlen(in->zone) + 1 : 0;
  size_t strs = id_n + url_n + zone_n, size;
  node_t *nd;
  char *p;
  /* Validated lengths keep every sum far below SIZE_MAX. */
  for (size_t i = 0; i < in->n_metadata; i++)
    strs += strlen(in->metadata[i].key) + strlen(in->metadata[i].value) + 2;
  size = sizeof(node_t) + in->n_metadata * sizeof(om_kv_t) + strs;
  nd = malloc(size);
  if (nd == NULL)
    return NULL;
  atomic_init(&nd->refs, 1);
  p = (char *)(nd->kv + in->n_metadata);
  nd->inst.id = memcpy(p, in->id, id_n);
  p += id_n;
  nd->inst.url = memcpy(p, in->url, url_n);
  p += url_n;
  nd->inst.zone = NULL;
  if (zone_n != 0) {
    nd->inst.zone = memcpy(p, in->zone, zone_n);
    p += zone_n;
  }
  nd->inst.weight = in->weight;
  nd->inst.ttl_ms = in->ttl_ms;
  nd->inst.metadata = in->n_metadata != 0 ? nd->kv : NULL;
  nd->inst.n_metadata = in->n_metadata;
  for (size_t i = 0; i < in->n_metadata; i++) {
    size_t kn = strlen(in->metadata[i].key) + 1;
    size_t vn = strlen(in->metadata[i].value) + 1;
    nd->kv[i].key = memcpy(p, in->metadata[i].key, kn);
    p += kn;
    nd->kv[i].value = memcpy(p, in->metadata[i].value, vn);
    p += vn;
  }
  if (in->n_metadata > 1 && !kv_sorted(nd->kv, in->n_metadata))
    qsort(nd->kv, in->n_metadata, sizeof *nd->kv, kv_cmp);
  return nd;
}

static void node_unref(node_t *nd) {
  /* release: this thread's reads of the node happen before the free; the
   * last owner's acquire sees every other thread's */
  if (nd != NULL &&
      atomic_fetch_sub_explicit(&nd->refs, 1, memory_order_acq_rel) == 1)
    free(nd);
}

/* ---- snapshots ---- */

/* An input instance's id and position, for sorting and duplicate reports. */
typedef struct ent_s {
  const char *id;
  size_t idx;
} ent_t;

static int ent_cmp(const void *a, const void *b) {
  const ent_t *x = a, *y = b;
  int c = strcmp(x->id, y->id);
  if (c != 0)
    return c;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int str_ptr_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void set_err(size_t *index, const char **field, const char **why,
                    size_t i, const char *f, const char *w) {
  if (index != NULL)
    *index = i;
  if (field != NULL)
    *field = f;
  if (why != NULL)
    *why = w;
}

/*
 * Validate n instances and sort their ids into *out_ents (malloc'd, NULL
 * when n is 0). On failure nothing stays allocated.
 */
static int sort_inputs(const om_instance_t *in, size_t n, ent_t **out_ents,
                       size_t *index, const char **field, const char **why) {
  ent_t *e;
  *out_ents = NULL;
  if (n == 0)
    return 0;
  if (in == NULL) {
    set_err(index, field, why, 0, "id", "instances is NULL");
    return OM_EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    const char *f = NULL, *w = NULL;
    if (om_instance_validate(&in[i], &f, &w) != 0) {
      set_err(index, field, why, i, f, w);
      return OM_EINVAL;
    }
  }
  if (n > SIZE_MAX / sizeof *e)
    return OM_ENOMEM;
  e = malloc(n * sizeof *e);
  if (e == NULL)
    return OM_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    e[i].id = in[i].id;
    e[i].idx = i;
  }
  qsort(e, n, sizeof *e, ent_cmp);
  for (size_t i = 1; i < n; i++)
    if (strcmp(e[i - 1].id, e[i].id) == 0) {
      set_err(index, field, why, e[i].idx, "id", "duplicate id");
      free(e);
      return OM_EDUPLICATE;
    }
  *out_ents = e;
  return 0;
}

/* Nodes for the sorted inputs; all or nothing. */
static int make_nodes(const om_instance_t *in, const ent_t *e, size_t n,
                      node_t ***out) {
  node_t **nodes;
  *out = NULL;
  if (n == 0)
    return 0;
  nodes = malloc(n * sizeof *nodes);
  if (nodes == NULL)
    return OM_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    nodes[i] = node_new(&in[e[i].idx]);
    if (nodes[i] == NULL) {
      while (i-- > 0)
        node_unref(nodes[i]);
      free(nodes);
      return OM_ENOMEM;
    }
  }
  *out = nodes;
  return 0;
}

/* An empty snapshot block with room for cap node pointers. */
static om_snapshot_t *snap_alloc(const char *service, uint64_t revision,
                                 size_t cap) {
  size_t sl = strlen(service) + 1, head;
  om_snapshot_t *s;
  if (cap > (SIZE_MAX - sizeof *s - sl) / sizeof(node_t *))
    return NULL;
  head = sizeof *s + cap * sizeof(node_t *);
  s = malloc(head + sl);
  if (s == NULL)
    return NULL;
  memset(s, 0, sizeof *s);
  atomic_init(&s->refs, 1);
  s->revision = revision;
  s->service = memcpy((char *)s + head, service, sl);
  return s;
}

int om_snapshot_new(const char *service, uint64_t revision,
                    const om_instance_t *instances, size_t n,
                    om_snapshot_t **out, size_t *index, const char **field,
                    const char **why) {
  ent_t *e;
  node_t **nodes;
  om_snapshot_t *s;
  int rc;
  if (out == NULL) {
    set_err(index, field, why, SIZE_MAX, "service", "out is NULL");
    return OM_EINVAL;
  }
  if (service == NULL ||
      !om_valid_name(service, bounded_len(service, OM_NAME_MAX))) {
    set_err(index, field, why, SIZE_MAX, "service",
            "must be 1 to 128 characters of [A-Za-z0-9._-], "
            "not \".\" or \"..\"");
    return OM_EINVAL;
  }
  rc = sort_inputs(instances, n, &e, index, field, why);
  if (rc != 0)
    return rc;
  rc = make_nodes(instances, e, n, &nodes);
  free(e);
  if (rc != 0)
    return rc;
  s = snap_alloc(service, revision, n);
  if (s == NULL) {
    for (size_t i = 0; i < n; i++)
      node_unref(nodes[i]);
    free(nodes);
    return OM_ENOMEM;
  }
  if (n != 0)
    memcpy(s->nodes, nodes, n * sizeof *nodes);
  s->n = n;
  free(nodes);
  *out = s;
  return 0;
}

int om_snapshot_edit(const om_snapshot_t *base, uint64_t revision,
                     const om_instance_t *put, size_t n_put,
                     const char *const *remove, size_t n_remove,
                     om_snapshot_t **out, size_t *index, const char **field,
                     const char **why) {
  ent_t *e = NULL;
  node_t **pn = NULL;
  const char **rm = NULL;
  om_snapshot_t *s;
  size_t i = 0, j = 0, k = 0, nb;
  int rc;
  if (base == NULL || out == NULL || (remove == NULL && n_remove != 0)) {
    set_err(index, field, why, SIZE_MAX, "service", "NULL argument");
    return OM_EINVAL;
  }
  for (size_t r = 0; r < n_remove; r++)
    if (remove[r] == NULL) {
      set_err(index, field, why, SIZE_MAX, "id", "NULL id to remove");
      return OM_EINVAL;
    }
  rc = sort_inputs(put, n_put, &e, index, field, why);
  if (rc != 0)
    return rc;
  nb = base->n;
  if (n_put > SIZE_MAX - nb || n_remove > SIZE_MAX / sizeof *rm) {
    free(e);
    return OM_ENOMEM;
  }
  if (n_remove != 0) {
    rm = malloc(n_remove * sizeof *rm);
    if (rm == NULL) {
      free(e);
      return OM_ENOMEM;
    }
    memcpy(rm, remove, n_remove * sizeof *rm);
    qsort(rm, n_remove, sizeof *rm, str_ptr_cmp);
  }
  rc = make_nodes(put, e, n_put, &pn);
  free(e);
  s = rc == 0 ? snap_alloc(base->service, revision, nb + n_put) : NULL;
  if (s == NULL) {
    for (size_t p = 0; p < n_put && pn != NULL; p++)
      node_unref(pn[p]);
    free(pn);
    free(rm);
    return OM_ENOMEM;
  }
  /* Merge three sorted sequences: base (i), puts (j), removals (k). */
  while (i < nb || j < n_put) {
    int c = i >= nb      ? 1
            : j >= n_put ? -1
                         : strcmp(base->nodes[i]->inst.id, pn[j]->inst.id);
    if (c < 0) {
      const char *id = base->nodes[i]->inst.id;
      int cr = 1;
      while (k < n_remove && (cr = strcmp(rm[k], id)) < 0)
        k++;
      if (k >= n_remove || cr != 0) {
        atomic_fetch_add_explicit(&base->nodes[i]->refs, 1,
                                  memory_order_relaxed);
        s->nodes[s->n++] = base->nodes[i];
      }
      i++;
    } else {
      if (c == 0)
        i++; /* replaced */
      s->nodes[s->n++] = pn[j++];
    }
  }
  free(pn);
  free(rm);
  *out = s;
  return 0;
}

om_snapshot_t *om_snapshot_ref(om_snapshot_t *s) {
  /* relaxed: a new reference is made from one already held */
  if (s != NULL)
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
  return s;
}

void om_snapshot_unref(om_snapshot_t *s) {
  if (s == NULL ||
      atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
    return;
  for (int i = 0; i < OM_SNAPSHOT_CACHE_SLOTS; i++)
    if (s->cache[i].data != NULL && s->cache[i].free_fn != NULL)
      s->cache[i].free_fn(s->cache[i].data);
  for (size_t i = 0; i < s->n; i++)
    node_unref(s->nodes[i]);
  free(s);
}

const char *om_snapshot_service(const om_snapshot_t *s) {
  return s->service;
}

uint64_t om_snapshot_revision(const om_snapshot_t *s) {
  return s->revision;
}

size_t om_snapshot_count(const om_snapshot_t *s) {
  return s->n;
}

const om_instance_t *om_snapshot_instance(const om_snapshot_t *s, size_t i) {
  return i < s->n ? &s->nodes[i]->inst : NULL;
}

const om_instance_t *om_snapshot_find(const om_snapshot_t *s, const char *id) {
  size_t lo = 0, hi;
  if (s == NULL || id == NULL)
    return NULL;
  hi = s->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(s->nodes[mid]->inst.id, id);
    if (c == 0)
      return &s->nodes[mid]->inst;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

void *om_snapshot_cache(const om_snapshot_t *s, int slot) {
  if (s == NULL || slot < 0 || slot >= OM_SNAPSHOT_CACHE_SLOTS)
    return NULL;
  return s->cache[slot].data;
}

int om_snapshot_set_cache(om_snapshot_t *s, int slot, void *data,
                          void (*free_fn)(void *)) {
  if (s == NULL || data == NULL || slot < 0 || slot >= OM_SNAPSHOT_CACHE_SLOTS)
    return OM_EINVAL;
  if (s->cache[slot].data != NULL)
    return OM_ESTATE;
  s->cache[slot].data = data;
  s->cache[slot].free_fn = free_fn;
  return 0;
}
