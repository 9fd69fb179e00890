/* om_rendezvous.c: weighted rendezvous hashing (om_rendezvous.h). */
#include "om_rendezvous.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_hash.h"
#include "om_heap.h"

/*
 * Peer ids are hashed with the object's seed xor this constant, keys with
 * the seed itself, so a key equal to a peer id does not get
 * key_hash ^ peer_hash == 0 (the same score of mix64(0) for that pair).
 */
#define PEER_DOMAIN UINT64_C(0x9e3779b97f4a7c15)

/*
 * Average class size below which pick compares peer by peer (measured on
 * 64 peers: 16 classes of 4 are faster by class, 32 of 2 peer by peer).
 */
#define FLAT_CLASS_SIZE 3

/* Scratch for rank without an allocation, up to this many peers. */
#define RANK_STACK 64

/*
 * Flat struct of arrays in class-major order (all peers of class 0 by
 * ascending index, then class 1, ...): the pick loop streams phash, plus
 * one cls_iw per class (or pos_iw per peer when classes are tiny).
 */
struct om_rendezvous_s {
  size_t n;
  size_t nclass; /* distinct weights */
  uint64_t seed;
  uint64_t *phash;   /* [n] peer hashes, class-major */
  uint32_t *order;   /* [n] class-major position -> peer index */
  uint32_t *cls_end; /* [nclass] end position of each class */
  double *cls_iw;    /* [nclass] 1 / weight */
  double *pos_iw;    /* [n] 1 / weight by position, when classes are small */
  double *weight;    /* [n] by peer index, as given */
  uint64_t *ihash;   /* [n] peer hashes by peer index (best_hash) */
  uint32_t *icls;    /* [n] class by peer index; NULL with one class */
  size_t *id_off;    /* [n + 1] offsets of the ids in ids, by peer index */
  char *ids;         /* the id copies, each NUL-terminated */
};

typedef struct {
  uint64_t key; /* smaller ranks first */
  uint32_t idx;
} slot_t;

void om_rendezvous_free(om_rendezvous_t *r) {
  if (r == NULL)
    return;
  free(r->phash);
  free(r->order);
  free(r->cls_end);
  free(r->cls_iw);
  free(r->pos_iw);
  free(r->weight);
  free(r->ihash);
  free(r->icls);
  free(r->id_off);
  free(r->ids);
  free(r);
}

static int cmp_slot(const void *pa, const void *pb) {
  const slot_t *a = pa, *b = pb;
  if (a->key != b->key)
    return a->key < b->key ? -1 : 1;
  return (a->idx > b->idx) - (a->idx < b->idx);
}

static const char *id_at(const om_rendezvous_t *r, size_t i, size_t *len) {
  *len = r->id_off[i + 1] - r->id_off[i] - 1;
  return r->ids + r->id_off[i];
}

static uint64_t peer_hash(const om_rendezvous_t *r, size_t i) {
  size_t len;
  const char *id = id_at(r, i, &len);
  return om_hash(id, len, r->seed ^ PEER_DOMAIN);
}

/*
 * Duplicate ids have equal hashes: sort by hash, compare the bytes of
 * equal-hash neighbours only. s is scratch for n slots.
 */
static int check_duplicates(const om_rendezvous_t *r, slot_t *s) {
  size_t i, j;
  for (i = 0; i < r->n; i++) {
    s[i].key = peer_hash(r, i);
    s[i].idx = (uint32_t)i;
  }
  qsort(s, r->n, sizeof *s, cmp_slot);
  for (i = 0; i < r->n; i++) {
    for (j = i + 1; j < r->n && s[j].key == s[i].key; j++) {
      size_t la, lb;
      const char *a = id_at(r, s[i].idx, &la);
      const char *b = id_at(r, s[j].idx, &lb);
      if (la == lb && memcmp(a, b, la) == 0)
        return OM_EDUPLICATE;
    }
  }
  return 0;
}

static uint64_t double_bits(double d) {
  uint64_t b;
  memcpy(&b, &d, sizeof b);
  return b;
}

/*
 * Group peers by weight: sort by (weight, index); positive doubles order
 * like their bit patterns. Fills order, phash, cls_end, cls_iw.
 */
static int build_classes(om_rendezvous_t *r, slot_t *s) {
  size_t i, c;
  for (i = 0; i < r->n; i++) {
    s[i].key = double_bits(r->weight[i]);
    s[i].idx = (uint32_t)i;
  }
  qsort(s, r->n, sizeof *s, cmp_slot);
  r->nclass = 1;
  for (i = 1; i < r->n; i++)
    r->nclass += s[i].key != s[i - 1].key;
  r->cls_end = malloc(r->nclass * sizeof *r->cls_end);
  r->cls_iw = malloc(r->nclass * sizeof *r->cls_iw);
  if (r->cls_end == NULL || r->cls_iw == NULL)
    return OM_ENOMEM;
  /*
   * Per class, a pick pays a loop setup and a compare of bounds; below
   * about FLAT_CLASS_SIZE peers per class, comparing bounds peer by peer
   * is cheaper.
   */
  if (r->nclass > 1 && r->nclass * FLAT_CLASS_SIZE > r->n) {
    r->pos_iw = malloc(r->n * sizeof *r->pos_iw);
    if (r->pos_iw == NULL)
      return OM_ENOMEM;
  }
  r->ihash = malloc(r->n * sizeof *r->ihash);
  if (r->ihash == NULL)
    return OM_ENOMEM;
  if (r->nclass > 1) {
    r->icls = malloc(r->n * sizeof *r->icls);
    if (r->icls == NULL)
      return OM_ENOMEM;
  }
  for (i = 0, c = 0; i < r->n; i++) {
    r->order[i] = s[i].idx;
    r->phash[i] = peer_hash(r, s[i].idx);
    r->ihash[s[i].idx] = r->phash[i];
    if (r->icls != NULL)
      r->icls[s[i].idx] = (uint32_t)c;
    if (r->pos_iw != NULL)
      r->pos_iw[i] = 1.0 / r->weight[s[i].idx];
    if (i + 1 == r->n || s[i + 1].key != s[i].key) {
      r->cls_end[c] = (uint32_t)(i + 1);
      r->cls_iw[c] = 1.0 / r->weight[s[i].idx];
      c++;
    }
  }
  return 0;
}

static size_t peer_len(const om_rendezvous_peer_t *p) {
  return p->id_len != 0 ? p->id_len : strlen(p->id);
}

int om_rendezvous_new(const om_rendezvous_opts_t *opts, om_rendezvous_t **out) {
  om_rendezvous_t *r;
  slot_t *scratch;
  size_t i, n, total = 0;
  int rc;

  if (opts == NULL || out == NULL)
    return OM_EINVAL;
  n = opts->npeers;
  if (n == 0)
    return OM_ENOPEERS;
  if (n > INT32_MAX) /* indices are uint32_t, rank counts an int */
    return OM_ERANGE;
  if (opts->peers == NULL)
    return OM_EINVAL;
  for (i = 0; i < n; i++) {
    const om_rendezvous_peer_t *p = &opts->peers[i];
    size_t len;
    /* !(w > 0) also rejects NaN. */
    if (p->id == NULL || !(p->weight > 0) || isinf(p->weight))
      return OM_EINVAL;
    len = peer_len(p);
    if (len == 0)
      return OM_EINVAL;
    if (total + len + 1 < total)
      return OM_ERANGE;
    total += len + 1;
  }

  r = calloc(1, sizeof *r);
  if (r == NULL)
    return OM_ENOMEM;
  r->n = n;
  r->seed = opts->seed;
  r->phash = malloc(n * sizeof *r->phash);
  r->order = malloc(n * sizeof *r->order);
  r->weight = malloc(n * sizeof *r->weight);
  r->id_off = malloc((n + 1) * sizeof *r->id_off);
  r->ids = malloc(total);
  scratch = malloc(n * sizeof *scratch);
  if (r->phash == NULL || r->order == NULL || r->weight == NULL ||
      r->id_off == NULL || r->ids == NULL || scratch == NULL) {
    free(scratch);
    om_rendezvous_free(r);
    return OM_ENOMEM;
  }
  total = 0;
  for (i = 0; i < n; i++) {
    const om_rendezvous_peer_t *p = &opts->peers[i];
    size_t len = peer_len(p);
    r->id_off[i] = total;
    memcpy(r->ids + total, p->id, len);
    r->ids[total + len] = '\0';
    total += len + 1;
    r->weight[i] = p->weight;
  }
  r->id_off[n] = total;
  rc = check_duplicates(r, scratch);
  if (rc == 0)
    rc = build_classes(r, scratch);
  free(scratch);
  if (rc != 0) {
    om_rendezvous_free(r);
    return rc;
  }
  *out = r;
  return 0;
}

size_t om_rendezvous_size(const om_rendezvous_t *r) {
  return r->n;
}

const char *om_rendezvous_id(const om_rendezvous_t *r, size_t i, size_t *len) {
  size_t l;
  const char *id;
  if (i >= r->n)
    return NULL;
  id = id_at(r, i, &l);
  if (len != NULL)
    *len = l;
  return id;
}

double om_rendezvous_weight(const om_rendezvous_t *r, size_t i) {
  return i < r->n ? r->weight[i] : 0;
}

uint64_t om_rendezvous_key_hash(const om_rendezvous_t *r, const void *key,
                                size_t len) {
  return om_hash(key, len, r->seed);
}

/*
 * The position of the highest h in [from, to) (from < to). Strict ">" keeps
 * the first of equal hashes, the lower index (positions in a class ascend
 * with the index). Written as selects so the compiler emits cmov: the
 * running maximum changes about ln(n) times, at unpredictable places.
 */
static size_t class_best(const uint64_t *ph, uint64_t kh, size_t from,
                         size_t to, uint64_t *best_h) {
  uint64_t best = om_hash_mix64(kh ^ ph[from]);
  size_t bp = from;
  for (size_t j = from + 1; j < to; j++) {
    uint64_t h = om_hash_mix64(kh ^ ph[j]);
    int better = h > best;
    best = better ? h : best;
    bp = better ? j : bp;
  }
  *best_h = best;
  return bp;
}

/*
 * An upper bound of om_hash_exp_variate(h) / w (given iw = 1 / w) that is
 * safe after rounding: -ln(u) <= (1 - u) / u, widened by 2^-30, far more than
 * the rounding error of the variate (below 2^-50 relative) and of these few
 * operations.
 */
static double variate_upper(uint64_t h, double iw) {
  double v = om_hash_unit_complement(h), u = om_hash_unit(h);
  return v / u * (1.0 + 0x1p-30) * iw;
}

/*
 * The exact merge step: the class best with the smallest (E, index). bound
 * is an upper bound of that smallest E (+inf if unknown): a class best whose
 * lower bound exceeds it cannot win, so its logarithm is skipped.
 */
static uint32_t pick_classes_exact(const om_rendezvous_t *r, uint64_t kh,
                                   double bound) {
  double best = 0;
  uint32_t bi = UINT32_MAX;
  size_t from = 0;
  for (size_t c = 0; c < r->nclass; c++) {
    uint64_t h;
    size_t p = class_best(r->phash, kh, from, r->cls_end[c], &h);
    double e;
    uint32_t idx = r->order[p];
    from = r->cls_end[c];
    if (om_hash_unit_complement(h) * r->cls_iw[c] > bound)
      continue;
    e = om_hash_exp_variate(h) * r->cls_iw[c];
    if (bi == UINT32_MAX || e < best || (e == best && idx < bi)) {
      best = e;
      bi = idx;
    }
  }
  return bi;
}

/*
 * Several classes: each class's best by h, then the smallest E among them.
 * E is bracketed by L = (1 - u) / w and U = (1 - u) / (u w); when the
 * smallest L's U is below every other L, that class best wins with no
 * logarithm (nearly always: the winner's u is close to 1, where the bracket
 * is tight). Otherwise the exact step decides.
 */
static uint32_t pick_classes(const om_rendezvous_t *r, uint64_t kh) {
  uint64_t h1, h;
  size_t p1 = class_best(r->phash, kh, 0, r->cls_end[0], &h1), c1 = 0;
  double m1 = om_hash_unit_complement(h1) * r->cls_iw[0], m2 = INFINITY, upper;
  for (size_t c = 1; c < r->nclass; c++) {
    size_t p = class_best(r->phash, kh, r->cls_end[c - 1], r->cls_end[c], &h);
    double lower = om_hash_unit_complement(h) * r->cls_iw[c];
    /* Smallest and second smallest; the second as a plain min (minsd). */
    double displaced = lower < m1 ? m1 : lower;
    if (lower < m1) {
      m1 = lower;
      h1 = h;
      p1 = p;
      c1 = c;
    }
    m2 = displaced < m2 ? displaced : m2;
  }
  upper = variate_upper(h1, r->cls_iw[c1]);
  if (upper < m2)
    return r->order[p1];
  return pick_classes_exact(r, kh, upper);
}

/*
 * Many small classes: the same bracket test, over every peer instead of
 * class bests (pos_iw has each position's 1 / w). If the smallest lower
 * bound's upper bound is below every other peer's lower bound, that peer is
 * the best of its class and of all classes; otherwise the exact step
 * decides, as above.
 */
static uint32_t pick_flat(const om_rendezvous_t *r, uint64_t kh) {
  const uint64_t *ph = r->phash;
  const double *iw = r->pos_iw;
  double m1 = INFINITY, m2 = INFINITY, upper;
  uint64_t h1 = 0;
  size_t p1 = 0;
  for (size_t i = 0; i < r->n; i++) {
    uint64_t h = om_hash_mix64(kh ^ ph[i]);
    double lower = om_hash_unit_complement(h) * iw[i];
    double displaced = lower < m1 ? m1 : lower;
    if (lower < m1) {
      m1 = lower;
      h1 = h;
      p1 = i;
    }
    m2 = displaced < m2 ? displaced : m2;
  }
  upper = m1 < INFINITY ? variate_upper(h1, iw[p1]) : INFINITY;
  if (upper < m2)
    return r->order[p1];
  return pick_classes_exact(r, kh, upper);
}

uint32_t om_rendezvous_pick_hash(const om_rendezvous_t *r, uint64_t key_hash) {
  uint64_t h;
  if (r->nclass == 1) /* equal weights: order[] is the identity */
    return (uint32_t)class_best(r->phash, key_hash, 0, r->n, &h);
  if (r->pos_iw != NULL)
    return pick_flat(r, key_hash);
  return pick_classes(r, key_hash);
}

uint32_t om_rendezvous_pick(const om_rendezvous_t *r, const void *key,
                            size_t len) {
  return om_rendezvous_pick_hash(r, om_hash(key, len, r->seed));
}

/* Min-heaps: one per class over its peers, one over the class heads. */
typedef struct {
  double e;     /* E of the class head */
  uint32_t idx; /* its peer index */
  uint32_t cls;
} head_t;

static int slot_less(const slot_t *a, const slot_t *b) {
  return a->key < b->key || (a->key == b->key && a->idx < b->idx);
}

OM_HEAP_ARRAY_SIFT_DOWN(slot_sift, slot_t, slot_less)

static int head_less(const head_t *a, const head_t *b) {
  return a->e < b->e || (a->e == b->e && a->idx < b->idx);
}

OM_HEAP_ARRAY_SIFT_DOWN(head_sift, head_t, head_less)

/* E of the head of class c (its heap at s + start, nonempty). */
static head_t class_head(const om_rendezvous_t *r, const slot_t *heap,
                         size_t c) {
  head_t hd;
  hd.e = r->nclass == 1 ? 0 : om_hash_exp_variate(~heap[0].key) * r->cls_iw[c];
  hd.idx = heap[0].idx;
  hd.cls = (uint32_t)c;
  return hd;
}

int om_rendezvous_rank_hash(const om_rendezvous_t *r, uint64_t key_hash,
                            uint32_t *out, size_t k) {
  slot_t s_stack[RANK_STACK], *s = s_stack;
  head_t h_stack[RANK_STACK], *heads = h_stack;
  uint32_t z_stack[RANK_STACK], *size = z_stack;
  void *block = NULL;
  size_t n = r->n, nc = r->nclass, nh = 0, i, c, from;

  if (k > n)
    k = n;
  if (k == 0)
    return 0;
  if (n > RANK_STACK) {
    block = malloc(n * sizeof *s + nc * (sizeof *heads + sizeof *size));
    if (block == NULL)
      return OM_ENOMEM;
    s = block;
    heads = (head_t *)(s + n);
    size = (uint32_t *)(heads + nc);
  }
  /* Each class's peers as a min-heap on (~h, index): highest h on top. */
  for (c = 0, from = 0; c < nc; c++) {
    size_t to = r->cls_end[c];
    for (i = from; i < to; i++) {
      s[i].key = ~om_hash_mix64(key_hash ^ r->phash[i]);
      s[i].idx = r->order[i];
    }
    size[c] = (uint32_t)(to - from);
    for (i = size[c] / 2; i-- > 0;)
      slot_sift(s + from, size[c], i);
    heads[nh++] = class_head(r, s + from, c);
    from = to;
  }
  for (i = nh / 2; i-- > 0;)
    head_sift(heads, nh, i);
  /* Merge: take the best head, advance its class. */
  for (i = 0; i < k; i++) {
    size_t cls = heads[0].cls;
    slot_t *heap = s + (cls == 0 ? 0 : r->cls_end[cls - 1]);
    out[i] = heads[0].idx;
    heap[0] = heap[--size[cls]];
    slot_sift(heap, size[cls], 0);
    if (size[cls] > 0)
      heads[0] = class_head(r, heap, cls);
    else
      heads[0] = heads[--nh];
    head_sift(heads, nh, 0);
  }
  free(block);
  return (int)k;
}

/*
 * The running best of best_hash: its index, h, class, and E with its
 * bounds once a peer of another class needed them (have_e).
 */
typedef struct {
  uint32_t idx, cls;
  uint64_t h;
  int have_e;
  double lower, upper, e;
} best_t;

static void best_bounds(const om_rendezvous_t *r, best_t *b) {
  double iw = r->cls_iw[b->cls];
  b->lower = om_hash_unit_complement(b->h) * iw;
  b->upper = variate_upper(b->h, iw);
  b->e = -1; /* the logarithm only when the bounds cannot decide */
  b->have_e = 1;
}

static double best_e(const om_rendezvous_t *r, best_t *b) {
  if (b->e < 0)
    b->e = om_hash_exp_variate(b->h) * r->cls_iw[b->cls];
  return b->e;
}

/*
 * Does peer i (hash h, class c) come before the best so far in rank order?
 * Same class: the higher h, ties to the lower index (the class order).
 * Other classes: the smaller (E, index) (the merge of the class orders),
 * decided by the bounds of E when they do not overlap.
 */
static int before_best(const om_rendezvous_t *r, best_t *b, uint32_t i,
                       uint64_t h, uint32_t c) {
  double iw, lower, upper, e, be;
  if (c == b->cls)
    return h > b->h || (h == b->h && i < b->idx);
  if (!b->have_e)
    best_bounds(r, b);
  iw = r->cls_iw[c];
  lower = om_hash_unit_complement(h) * iw;
  if (lower > b->upper)
    return 0;
  upper = variate_upper(h, iw);
  if (upper < b->lower)
    return 1;
  e = om_hash_exp_variate(h) * iw;
  be = best_e(r, b);
  return e < be || (e == be && i < b->idx);
}

uint32_t om_rendezvous_best_hash(const om_rendezvous_t *r, uint64_t key_hash,
                                 const uint32_t *cand, size_t n,
                                 om_rendezvous_accept_fn accept, void *ud) {
  best_t b = {UINT32_MAX, 0, 0, 0, 0, 0, 0};
  if (cand == NULL && n > r->n)
    n = r->n;
  for (size_t k = 0; k < n; k++) {
    uint32_t i = cand != NULL ? cand[k] : (uint32_t)k;
    uint64_t h;
    uint32_t c;
    if (i >= r->n || (accept != NULL && !accept(ud, i)))
      continue;
    h = om_hash_mix64(key_hash ^ r->ihash[i]);
    c = r->icls != NULL ? r->icls[i] : 0;
    if (b.idx == UINT32_MAX) {
      b = (best_t){i, c, h, 0, 0, 0, 0};
    } else if (r->icls == NULL) { /* one class: the highest h */
      if (h > b.h || (h == b.h && i < b.idx)) {
        b.idx = i;
        b.h = h;
      }
    } else if (before_best(r, &b, i, h, c)) {
      b = (best_t){i, c, h, 0, 0, 0, 0};
    }
  }
  return b.idx;
}

int om_rendezvous_rank(const om_rendezvous_t *r, const void *key, size_t len,
                       uint32_t *out, size_t k) {
  return om_rendezvous_rank_hash(r, om_hash(key, len, r->seed), out, k);
}
