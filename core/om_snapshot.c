/*
 * om_snapshot.c: instance validation and immutable, shared snapshots
 * (om_snapshot.h).
 *
 * Each instance in a snapshot lives in one allocation (a node: refcount,
 * the om_instance_t, its metadata array and every string), so sharing an
 * instance between two revisions is one increment, and freeing it one
 * free(). The sorted nodes are held in chunks of at most CHUNK_MAX node
 * pointers, reference-counted too, and a snapshot is one allocation of
 * header, chunk pointers, the index of each chunk's first instance, and
 * the service name. An edit shares every chunk it does not touch and
 * rebuilds only those its ids fall in, so registering one instance into a
 * service of n costs O(n / CHUNK_MAX + CHUNK_MAX) rather than O(n) (a
 * copy of every pointer and an atomic increment per shared instance,
 * which at 100,000 instances held registrations to a few hundred per
 * second). Lookups pay a binary search over the chunks first.
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

/* A chunk is never empty; an edit that would empty one drops it. */
#define CHUNK_MAX 256

typedef struct chunk_s {
  atomic_size_t refs;
  size_t n;                 /* 1..CHUNK_MAX */
  cache_slot_t cache;       /* an encoding of these instances, shared by every
                               snapshot holding the chunk */
  node_t *nodes[CHUNK_MAX]; /* sorted by id, unique */
} chunk_t;

struct om_snapshot_s {
  atomic_size_t refs;
  uint64_t revision;
  const char *service; /* inside this allocation, after starts[] */
  size_t n;            /* instances */
  size_t n_chunks;
  size_t *starts; /* inside: starts[c] is chunk c's first instance index */
  cache_slot_t cache[OM_SNAPSHOT_CACHE_SLOTS];
  chunk_t *chunks[]; /* in id order; every id of chunk c < every of c + 1 */
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

static void chunk_unref(chunk_t *ch) {
  if (ch == NULL ||
      atomic_fetch_sub_explicit(&ch->refs, 1, memory_order_acq_rel) != 1)
    return;
  for (size_t i = 0; i < ch->n; i++)
    node_unref(ch->nodes[i]);
  if (ch->cache.free_fn != NULL)
    ch->cache.free_fn(ch->cache.data);
  free(ch);
}

/* The chunks a snapshot is being built from, and the nodes waiting to go
 * into new chunks: every pointer held here is an owned reference. */
typedef struct build_s {
  chunk_t **chunks;
  size_t n_chunks, cap, n;
} build_t;

static void build_free(build_t *b) {
  for (size_t c = 0; c < b->n_chunks; c++)
    chunk_unref(b->chunks[c]);
  free(b->chunks);
}

static int build_push(build_t *b, chunk_t *ch) {
  if (b->n_chunks == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 16;
    chunk_t **nc = realloc(b->chunks, cap * sizeof *nc);
    if (nc == NULL)
      return OM_ENOMEM;
    b->chunks = nc;
    b->cap = cap;
  }
  b->chunks[b->n_chunks++] = ch;
  b->n += ch->n;
  return 0;
}

/*
 * Move nodes[0..m) (owned references) into new chunks of near-equal size,
 * at most CHUNK_MAX each. On OM_ENOMEM the nodes not moved yet are still
 * nodes[]'s: *moved says how many were.
 */
static int build_emit(build_t *b, node_t **nodes, size_t m, size_t *moved) {
  size_t pieces = (m + CHUNK_MAX - 1) / CHUNK_MAX, off = 0;
  *moved = 0;
  for (size_t p = 0; p < pieces; p++) {
    size_t len = m / pieces + (p < m % pieces);
    chunk_t *ch = malloc(sizeof *ch);
    if (ch == NULL || build_push(b, ch) != 0) {
      free(ch);
      return OM_ENOMEM;
    }
    atomic_init(&ch->refs, 1);
    ch->n = len;
    ch->cache.data = NULL;
    ch->cache.free_fn = NULL;
    memcpy(ch->nodes, nodes + off, len * sizeof *nodes);
    off += len;
    *moved = off;
  }
  return 0;
}

/* The snapshot of b's chunks (taken: b is left empty), or NULL (b is
 * untouched). */
static om_snapshot_t *snap_from(build_t *b, const char *service,
                                uint64_t revision) {
  size_t sl = strlen(service) + 1, nc = b->n_chunks, head, idx;
  om_snapshot_t *s;
  if (nc > (SIZE_MAX - sizeof *s - sl) / (sizeof(chunk_t *) + sizeof(size_t)))
    return NULL;
  head = sizeof *s + nc * sizeof(chunk_t *);
  s = malloc(head + nc * sizeof(size_t) + sl);
  if (s == NULL)
    return NULL;
  memset(s, 0, sizeof *s);
  atomic_init(&s->refs, 1);
  s->revision = revision;
  s->starts = (size_t *)(void *)((char *)s + head);
  s->service = memcpy((char *)s + head + nc * sizeof(size_t), service, sl);
  s->n_chunks = nc;
  idx = 0;
  for (size_t c = 0; c < nc; c++) {
    s->chunks[c] = b->chunks[c];
    s->starts[c] = idx;
    idx += b->chunks[c]->n;
  }
  s->n = idx;
  free(b->chunks);
  memset(b, 0, sizeof *b);
  return s;
}

int om_snapshot_new(const char *service, uint64_t revision,
                    const om_instance_t *instances, size_t n,
                    om_snapshot_t **out, size_t *index, const char **field,
                    const char **why) {
  ent_t *e;
  node_t **nodes;
  build_t b = {0};
  om_snapshot_t *s = NULL;
  size_t moved = 0;
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
  /* full chunks: a snapshot made whole is as dense as it gets */
  while (rc == 0 && moved < n) {
    size_t len = n - moved < CHUNK_MAX ? n - moved : CHUNK_MAX, got;
    rc = build_emit(&b, nodes + moved, len, &got);
    moved += got;
  }
  if (rc == 0)
    s = snap_from(&b, service, revision);
  if (s == NULL) {
    for (size_t i = moved; i < n; i++)
      node_unref(nodes[i]);
    build_free(&b);
    free(nodes);
    return OM_ENOMEM;
  }
  free(nodes);
  *out = s;
  return 0;
}

/* The first of chunks[lo..hi) whose last id is >= id, else hi. */
static size_t chunk_ending_from(chunk_t *const *chunks, size_t lo, size_t hi,
                                const char *id) {
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const chunk_t *x = chunks[mid];
    if (strcmp(x->nodes[x->n - 1]->inst.id, id) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Whether id is in the sorted rm[k..kend); advances *k past ids below. */
static int removed(const char **rm, size_t *k, size_t kend, const char *id) {
  int c = 1;
  while (*k < kend && (c = strcmp(rm[*k], id)) < 0)
    (*k)++;
  return *k < kend && c == 0;
}

int om_snapshot_edit(const om_snapshot_t *base, uint64_t revision,
                     const om_instance_t *put, size_t n_put,
                     const char *const *remove, size_t n_remove,
                     om_snapshot_t **out, size_t *index, const char **field,
                     const char **why) {
  ent_t *e = NULL;
  node_t **pn = NULL, **tmp = NULL;
  const char **rm = NULL;
  build_t b = {0};
  om_snapshot_t *s = NULL;
  size_t j = 0, k = 0, m = 0;
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
  if (n_put > SIZE_MAX / sizeof *tmp - CHUNK_MAX ||
      n_remove > SIZE_MAX / sizeof *rm) {
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
  /* one chunk's nodes and every put, at most */
  if (rc == 0 && (tmp = malloc((CHUNK_MAX + n_put) * sizeof *tmp)) == NULL)
    rc = OM_ENOMEM;
  /*
   * Walk base's chunks. The edits of chunk c are the puts and removals
   * with ids up to its last (all that are left, for the last chunk): a
   * chunk without any is shared, one with some is merged (base nodes in
   * order, minus removals, puts inserted or replacing) into new chunks.
   * An empty base takes every put as new chunks.
   */
  for (size_t c = 0; rc == 0 && c <= base->n_chunks; c++) {
    const chunk_t *ch;
    size_t jend = n_put, kend = n_remove, bi = 0, moved;
    /* the chunks before the next edit's are shared as they are: found by
     * a binary search, so one edit costs O(log chunks) comparisons */
    if (c < base->n_chunks && (j < n_put || k < n_remove)) {
      const char *id = j >= n_put                           ? rm[k]
                       : k >= n_remove                      ? pn[j]->inst.id
                       : strcmp(pn[j]->inst.id, rm[k]) <= 0 ? pn[j]->inst.id
                                                            : rm[k];
      size_t lo = chunk_ending_from(base->chunks, c, base->n_chunks - 1, id);
      for (; rc == 0 && c < lo; c++)
        if ((rc = build_push(&b, base->chunks[c])) == 0)
          atomic_fetch_add_explicit(&base->chunks[c]->refs, 1,
                                    memory_order_relaxed);
      if (rc != 0)
        break;
    }
    ch = c < base->n_chunks ? base->chunks[c] : NULL;
    if (ch == NULL && (c > 0 || j == n_put))
      break;
    if (ch != NULL && c + 1 < base->n_chunks) {
      const char *last = ch->nodes[ch->n - 1]->inst.id;
      for (jend = j; jend < n_put && strcmp(pn[jend]->inst.id, last) <= 0;)
        jend++;
      for (kend = k; kend < n_remove && strcmp(rm[kend], last) <= 0;)
        kend++;
    }
    if (ch != NULL && j == jend && k == kend) {
      rc = build_push(&b, (chunk_t *)ch);
      if (rc == 0)
        atomic_fetch_add_explicit(&((chunk_t *)ch)->refs, 1,
                                  memory_order_relaxed);
      continue;
    }
    m = 0;
    while ((ch != NULL && bi < ch->n) || j < jend) {
      int cmp = ch == NULL || bi >= ch->n ? 1
                : j >= jend               ? -1
                            : strcmp(ch->nodes[bi]->inst.id, pn[j]->inst.id);
      if (cmp < 0) {
        node_t *nd = ch->nodes[bi++];
        if (!removed(rm, &k, kend, nd->inst.id)) {
          atomic_fetch_add_explicit(&nd->refs, 1, memory_order_relaxed);
          tmp[m++] = nd;
        }
      } else {
        if (cmp == 0)
          bi++; /* replaced */
        tmp[m++] = pn[j];
        pn[j++] = NULL;
      }
    }
    k = kend;
    rc = build_emit(&b, tmp, m, &moved);
    if (rc != 0) {
      for (size_t i = moved; i < m; i++)
        node_unref(tmp[i]);
    }
    m = 0;
  }
  if (rc == 0)
    s = snap_from(&b, base->service, revision);
  for (size_t p = 0; p < n_put && pn != NULL; p++)
    node_unref(pn[p]); /* the puts not placed: none unless failing */
  free(pn);
  free(rm);
  free(tmp);
  if (s == NULL) {
    build_free(&b);
    return rc != 0 ? rc : OM_ENOMEM;
  }
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
  for (size_t c = 0; c < s->n_chunks; c++)
    chunk_unref(s->chunks[c]);
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

/* The chunk holding instance i < s->n: the last whose start is <= i. */
static size_t chunk_of(const om_snapshot_t *s, size_t i) {
  size_t lo = 0, hi = s->n_chunks;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->starts[mid] <= i)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

const om_instance_t *om_snapshot_instance(const om_snapshot_t *s, size_t i) {
  size_t c;
  if (i >= s->n)
    return NULL;
  c = chunk_of(s, i);
  return &s->chunks[c]->nodes[i - s->starts[c]]->inst;
}

const om_instance_t *om_snapshot_find(const om_snapshot_t *s, const char *id) {
  size_t lo, hi;
  const chunk_t *ch;
  if (s == NULL || id == NULL || s->n_chunks == 0)
    return NULL;
  lo = chunk_ending_from(s->chunks, 0, s->n_chunks, id);
  if (lo == s->n_chunks)
    return NULL;
  ch = s->chunks[lo];
  lo = 0;
  hi = ch->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(ch->nodes[mid]->inst.id, id);
    if (c == 0)
      return &ch->nodes[mid]->inst;
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

size_t om_snapshot_chunk_count(const om_snapshot_t *s) {
  return s != NULL ? s->n_chunks : 0;
}

int om_snapshot_chunk_range(const om_snapshot_t *s, size_t k, size_t *from,
                            size_t *to) {
  if (s == NULL || k >= s->n_chunks || from == NULL || to == NULL)
    return OM_EINVAL;
  *from = s->starts[k];
  *to = s->starts[k] + s->chunks[k]->n;
  return 0;
}

void *om_snapshot_chunk_cache(const om_snapshot_t *s, size_t k) {
  if (s == NULL || k >= s->n_chunks)
    return NULL;
  return s->chunks[k]->cache.data;
}

int om_snapshot_set_chunk_cache(om_snapshot_t *s, size_t k, void *data,
                                void (*free_fn)(void *)) {
  chunk_t *ch;
  if (s == NULL || data == NULL || k >= s->n_chunks)
    return OM_EINVAL;
  ch = s->chunks[k];
  if (ch->cache.data != NULL)
    return OM_ESTATE;
  ch->cache.data = data;
  ch->cache.free_fn = free_fn;
  return 0;
}
