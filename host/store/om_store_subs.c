/*
 * om_store_subs.c: the subscriber registry (om_store_subs.h).
 *
 * A named subscription sits in its name's bucket (one sorted array of
 * bucket pointers per kind, binary search), a subscription to everything
 * in the kind's "every" list; both lists are doubly linked in
 * subscription order. A delivery only marks what is unsubscribed during
 * it and new subscriptions are appended with a later stamp, so a walk
 * stays valid whatever the callbacks do; the marked ones (and buckets
 * they leave empty) are freed when the outermost delivery returns.
 */
#include "om_store_subs.h"

#include <stdlib.h>
#include <string.h>

#include "om_errno.h"

struct om__subs_bucket_s {
  char *name;
  om__subs_list_t list;
};

struct om_store_sub_s {
  om_list_t link;            /* on list_of(its registry, itself) */
  om__subs_bucket_t *bucket; /* NULL: in the every list of its kind */
  int kind;
  om_store_watch_cb cb;
  om_store_config_watch_cb ccb;
  void *ud;
  uint64_t since; /* sees changes stamped after this only */
  int dead;
  om_store_sub_t *next_dead;
};

/* Position of name in kind's bucket array; *found: whether it is there. */
static size_t bucket_pos(const om__subs_t *r, int kind, const char *name,
                         int *found) {
  size_t lo = 0, hi = r->n_named[kind];
  *found = 0;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(r->named[kind][mid]->name, name);
    if (c == 0) {
      *found = 1;
      return mid;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static om__subs_bucket_t *bucket_get(om__subs_t *r, int kind,
                                     const char *name) {
  int found;
  size_t i = bucket_pos(r, kind, name, &found), n = strlen(name) + 1;
  om__subs_bucket_t *b, **a = r->named[kind];
  if (found)
    return a[i];
  if (r->n_named[kind] == r->cap_named[kind]) {
    size_t cap = r->cap_named[kind] != 0 ? 2 * r->cap_named[kind] : 8;
    if (cap > SIZE_MAX / sizeof *a)
      return NULL;
    a = realloc(a, cap * sizeof *a);
    if (a == NULL)
      return NULL;
    r->named[kind] = a;
    r->cap_named[kind] = cap;
  }
  b = calloc(1, sizeof *b);
  if (b == NULL || (b->name = malloc(n)) == NULL) {
    free(b);
    return NULL;
  }
  memcpy(b->name, name, n);
  om_list_init(&b->list);
  memmove(a + i + 1, a + i, (r->n_named[kind] - i) * sizeof *a);
  a[i] = b;
  r->n_named[kind]++;
  return b;
}

static void bucket_drop(om__subs_t *r, int kind, om__subs_bucket_t *b) {
  int found;
  size_t i = bucket_pos(r, kind, b->name, &found);
  om__subs_bucket_t **a = r->named[kind];
  if (found)
    memmove(a + i, a + i + 1, (r->n_named[kind] - i - 1) * sizeof *a);
  r->n_named[kind] -= found;
  free(b->name);
  free(b);
}

static om__subs_list_t *list_of(om__subs_t *r, const om_store_sub_t *s) {
  return s->bucket != NULL ? &s->bucket->list : &r->every[s->kind];
}

static void destroy(om__subs_t *r, om_store_sub_t *s) {
  om__subs_list_t *l = list_of(r, s);
  om_list_remove(&s->link);
  if (s->bucket != NULL && om_list_empty(l))
    bucket_drop(r, s->kind, s->bucket);
  free(s);
}

int om__subs_add(om__subs_t *r, int kind, const char *name,
                 om_store_watch_cb cb, om_store_config_watch_cb ccb, void *ud,
                 om_store_sub_t **out) {
  om_store_sub_t *s = calloc(1, sizeof *s);
  om__subs_list_t *l;
  if (s == NULL)
    return OM_ENOMEM;
  if (name != NULL && (s->bucket = bucket_get(r, kind, name)) == NULL) {
    free(s);
    return OM_ENOMEM;
  }
  s->kind = kind;
  s->cb = cb;
  s->ccb = ccb;
  s->ud = ud;
  s->since = r->seq;
  l = list_of(r, s);
  om_list_push_back(l, &s->link);
  *out = s;
  return 0;
}

void om__subs_remove(om__subs_t *r, om_store_sub_t *s) {
  if (s->dead)
    return;
  if (r->delivering > 0) {
    s->dead = 1;
    s->next_dead = r->dead;
    r->dead = s;
    return;
  }
  destroy(r, s);
}

uint64_t om__store_stamp(om_store_t *s) {
  return ++s->subs.seq;
}

static void walk(om_store_t *st, const om__subs_list_t *l, uint64_t seq,
                 om_snapshot_t *snap, om_config_doc_t *doc) {
  /* nothing is unlinked while a delivery runs (om__subs_remove defers it),
   * and a subscription added by a callback is newer than seq */
  OM_LIST_FOREACH(it, l) {
    om_store_sub_t *s = OM_LIST_ENTRY(it, om_store_sub_t, link);
    if (st->closing)
      return;
    if (s->dead || s->since >= seq)
      continue;
    if (s->kind == OM__SUB_SERVICE)
      s->cb(s->ud, snap);
    else
      s->ccb(s->ud, doc);
  }
}

static void deliver(om_store_t *st, int kind, const char *name, uint64_t seq,
                    om_snapshot_t *snap, om_config_doc_t *doc) {
  om__subs_t *r = &st->subs;
  int found;
  size_t i = bucket_pos(r, kind, name, &found);
  r->delivering++;
  if (found)
    walk(st, &r->named[kind][i]->list, seq, snap, doc);
  walk(st, &r->every[kind], seq, snap, doc);
  if (--r->delivering > 0 || st->closing)
    return; /* after a close the store frees everything */
  while (r->dead != NULL) {
    om_store_sub_t *s = r->dead;
    r->dead = s->next_dead;
    destroy(r, s);
  }
}

void om__store_deliver(om_store_t *s, uint64_t seq, om_snapshot_t *snap) {
  deliver(s, OM__SUB_SERVICE, om_snapshot_service(snap), seq, snap, NULL);
}

void om__store_deliver_config(om_store_t *s, uint64_t seq,
                              om_config_doc_t *doc) {
  deliver(s, OM__SUB_CONFIG, doc->name, seq, NULL, doc);
}

static void free_list(om__subs_list_t *l) {
  OM_LIST_FOREACH_SAFE(it, l) {
    free(OM_LIST_ENTRY(it, om_store_sub_t, link));
  }
  om_list_init(l);
}

void om__subs_init(om__subs_t *r) {
  memset(r, 0, sizeof *r);
  om_list_init(&r->every[0]);
  om_list_init(&r->every[1]);
}

void om__subs_free(om__subs_t *r) {
  for (int k = 0; k < 2; k++) {
    for (size_t i = 0; i < r->n_named[k]; i++) {
      free_list(&r->named[k][i]->list);
      free(r->named[k][i]->name);
      free(r->named[k][i]);
    }
    free(r->named[k]);
    r->named[k] = NULL;
    r->n_named[k] = r->cap_named[k] = 0;
    free_list(&r->every[k]);
  }
  r->dead = NULL;
}
