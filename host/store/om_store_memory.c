/*
 * om_store_memory.c: the in-memory store (om_store_memory.h).
 *
 * Layout: services and configuration documents in arrays sorted by name
 * (binary search; there are few of them and they are rarely created).
 * A service holds its current snapshot and its leases sorted by instance
 * id, so a renewal is a binary search, a comparison and a heap move: no
 * allocation, no snapshot.
 *
 * Every write reserves everything it may need (array room, the lease, the
 * delivery event, the next snapshot) before it changes anything, so a
 * failure at any allocation leaves the store exactly as it was.
 *
 * Subscriptions live in the store layer's registry (om_store_subs.h), so
 * a service or document exists here from its first write on only.
 */
#include "om_store_memory.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "om_errno.h"
#include "om_store_subs.h"

#define RETRY_MS 100
#define DEFAULT_MAX_CONFIG ((size_t)1 << 20)
#define NOT_IN_HEAP SIZE_MAX

/* The common head of services and documents, listed sorted by name. */
typedef struct entry_s {
  char *name;
} entry_t;

typedef struct service_s service_t;
typedef struct cfg_s cfg_t;

typedef struct lease_s {
  size_t heap_idx;
  uint64_t expires_at;
  uint64_t seq; /* heap tie-break: armed earlier, expires first */
  service_t *svc;
  const om_instance_t *inst; /* in the current snapshot (stable address) */
  struct lease_s *next_expired;
} lease_t;

struct service_s {
  entry_t e;
  uint64_t revision;
  om_snapshot_t *snap; /* NULL only while the first write commits */
  lease_t **leases;    /* sorted by instance id */
  size_t n, cap;
  lease_t *expired; /* collected by a sweep */
  size_t n_expired;
  service_t *next_dirty;
  uint64_t empty_since; /* now_ms when n last became 0; 0 while n > 0 */
};

struct cfg_s {
  entry_t e;
  om_config_doc_t *doc; /* NULL only while the first put commits */
};

typedef struct event_s {
  struct event_s *next;
  uint64_t seq; /* om__store_stamp */
  service_t *svc;
  om_snapshot_t *snap;
  cfg_t *cfg;
  om_config_doc_t *doc;
} event_t;

typedef struct mstore_s {
  om_store_t base;
  uv_loop_t *loop;
  uv_timer_t timer;
  om_store_memory_opts_t opts;
  entry_t **svcs; /* service_t */
  size_t n_svcs, cap_svcs;
  entry_t **cfgs; /* cfg_t */
  size_t n_cfgs, cap_cfgs;
  lease_t **heap;
  size_t heap_n, heap_cap;
  uint64_t last_rev, lease_seq;
  event_t *q_head, *q_tail;
  int draining;
  int armed;
  uint64_t armed_at;
  om_store_status_t st;
  void (*done)(void *);
  void *done_ud;
} mstore_t;

static const om_store_ops_t memory_ops;

/* ---- clocks and revisions ---- */

static uint64_t now_ms(mstore_t *m) {
  if (m->opts.now_ms != NULL)
    return m->opts.now_ms(m->opts.clock_ud);
  return uv_now(m->loop);
}

static uint64_t realtime_us(mstore_t *m) {
  struct timespec ts;
  if (m->opts.realtime_us != NULL)
    return m->opts.realtime_us(m->opts.clock_ud);
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0 || ts.tv_sec < 0)
    return 0; /* the counter alone still never goes backwards */
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The revision the next change gets; the caller commits it to last_rev. */
static uint64_t next_rev(mstore_t *m) {
  uint64_t r = m->last_rev + 1, wall = realtime_us(m);
  return wall > r ? wall : r;
}

static uint64_t deadline(uint64_t now, uint64_t ttl) {
  return now > UINT64_MAX - ttl ? UINT64_MAX : now + ttl;
}

/* ---- growable arrays: reserve before any change ---- */

static int grow_svcs(mstore_t *m) {
  entry_t **p = om__store_grow(m->svcs, &m->cap_svcs, m->n_svcs + 1, sizeof *p);
  if (p == NULL)
    return OM_ENOMEM;
  m->svcs = p;
  return 0;
}

static int grow_cfgs(mstore_t *m) {
  entry_t **p = om__store_grow(m->cfgs, &m->cap_cfgs, m->n_cfgs + 1, sizeof *p);
  if (p == NULL)
    return OM_ENOMEM;
  m->cfgs = p;
  return 0;
}

/* ---- the lease heap: binary min-heap on (expires_at, seq) ---- */

static int lease_before(const lease_t *a, const lease_t *b) {
  if (a->expires_at != b->expires_at)
    return a->expires_at < b->expires_at;
  return a->seq < b->seq;
}

static void heap_set(mstore_t *m, size_t i, lease_t *l) {
  m->heap[i] = l;
  l->heap_idx = i;
}

static void sift_up(mstore_t *m, size_t i) {
  lease_t *l = m->heap[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!lease_before(l, m->heap[parent]))
      break;
    heap_set(m, i, m->heap[parent]);
    i = parent;
  }
  heap_set(m, i, l);
}

static void sift_down(mstore_t *m, size_t i) {
  lease_t *l = m->heap[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= m->heap_n)
      break;
    if (c + 1 < m->heap_n && lease_before(m->heap[c + 1], m->heap[c]))
      c++;
    if (!lease_before(m->heap[c], l))
      break;
    heap_set(m, i, m->heap[c]);
    i = c;
  }
  heap_set(m, i, l);
}

/* Room was reserved by the caller. */
static void heap_push(mstore_t *m, lease_t *l) {
  heap_set(m, m->heap_n++, l);
  sift_up(m, l->heap_idx);
}

static void heap_remove(mstore_t *m, lease_t *l) {
  size_t i = l->heap_idx;
  lease_t *last = m->heap[--m->heap_n];
  l->heap_idx = NOT_IN_HEAP;
  if (last == l)
    return;
  heap_set(m, i, last);
  sift_up(m, i);
  sift_down(m, last->heap_idx);
}

static void on_timer(uv_timer_t *t);

/*
 * Arm the timer at the earliest deadline (not before floor). A timer that
 * already fires no later is left alone: renewals usually push the earliest
 * deadline back, and one early wake-up that finds nothing and re-arms is
 * cheaper than restarting the timer on every heartbeat.
 */
static void arm(mstore_t *m, uint64_t floor) {
  uint64_t due, now;
  if (m->base.closing)
    return;
  if (m->heap_n == 0) {
    uv_timer_stop(&m->timer);
    m->armed = 0;
    return;
  }
  due = m->heap[0]->expires_at;
  if (due < floor)
    due = floor;
  if (m->armed && m->armed_at <= due)
    return;
  now = now_ms(m);
  uv_timer_start(&m->timer, on_timer, due > now ? due - now : 0, 0);
  m->armed = 1;
  m->armed_at = due;
}

static void lease_extend(mstore_t *m, lease_t *l, uint64_t expires_at) {
  l->expires_at = expires_at;
  l->seq = ++m->lease_seq;
  sift_up(m, l->heap_idx);
  sift_down(m, l->heap_idx);
  arm(m, 0);
}

/* ---- services, documents, leases by name ---- */

/* Position of name in a sorted entry array; *found: whether it is there. */
static size_t name_pos(entry_t *const *arr, size_t n, const char *name,
                       int *found) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(arr[mid]->name, name);
    if (c == 0) {
      *found = 1;
      return mid;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = 0;
  return lo;
}

static service_t *svc_find(mstore_t *m, const char *name) {
  int found;
  size_t i = name_pos(m->svcs, m->n_svcs, name, &found);
  return found ? (service_t *)m->svcs[i] : NULL;
}

static cfg_t *cfg_find(mstore_t *m, const char *name) {
  int found;
  size_t i = name_pos(m->cfgs, m->n_cfgs, name, &found);
  return found ? (cfg_t *)m->cfgs[i] : NULL;
}

/* Room was reserved by the caller. */
static void arr_insert(entry_t **arr, size_t *n, entry_t *item) {
  int found;
  size_t i = name_pos(arr, *n, item->name, &found);
  memmove(arr + i + 1, arr + i, (*n - i) * sizeof *arr);
  arr[i] = item;
  (*n)++;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  return d != NULL ? memcpy(d, s, n) : NULL;
}

/* A new service or document (size bytes, entry_t first), not yet listed. */
static entry_t *entry_new(size_t size, const char *name) {
  entry_t *e = calloc(1, size);
  if (e == NULL)
    return NULL;
  e->name = dup_str(name);
  if (e->name == NULL) {
    free(e);
    return NULL;
  }
  return e;
}

static lease_t *lease_find(const service_t *svc, const char *id, size_t *pos) {
  size_t lo = 0, hi = svc->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(svc->leases[mid]->inst->id, id);
    if (c == 0) {
      *pos = mid;
      return svc->leases[mid];
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *pos = lo;
  return NULL;
}

/* ---- subscriptions and delivery ---- */

static void service_free(service_t *svc) {
  for (size_t i = 0; i < svc->n; i++)
    free(svc->leases[i]);
  free(svc->leases);
  om_snapshot_unref(svc->snap);
  free(svc->e.name);
  free(svc);
}

static void cfg_free(cfg_t *c) {
  om_config_doc_unref(c->doc);
  free(c->e.name);
  free(c);
}

static void event_free(event_t *ev) {
  om_snapshot_unref(ev->snap);
  om_config_doc_unref(ev->doc);
  free(ev);
}

static void enqueue(mstore_t *m, event_t *ev) {
  ev->seq = om__store_stamp(&m->base);
  ev->next = NULL;
  if (m->q_tail != NULL)
    m->q_tail->next = ev;
  else
    m->q_head = ev;
  m->q_tail = ev;
}

/*
 * Deliver queued events in order, unless a delivery is already running
 * further up the stack: that one will reach what we queued once the
 * current event has been seen by everyone.
 */
static void drain(mstore_t *m) {
  if (m->draining)
    return;
  m->draining = 1;
  while (m->q_head != NULL && !m->base.closing) {
    event_t *ev = m->q_head;
    m->q_head = ev->next;
    if (m->q_head == NULL)
      m->q_tail = NULL;
    if (ev->svc != NULL)
      om__store_deliver(&m->base, ev->seq, ev->snap);
    else
      om__store_deliver_config(&m->base, ev->seq, ev->doc);
    event_free(ev);
  }
  m->draining = 0;
}

/* Make snap the service's current state at rev and queue its delivery. */
static void commit(mstore_t *m, service_t *svc, om_snapshot_t *snap,
                   uint64_t rev, event_t *ev) {
  if (svc->snap == NULL)
    m->st.services++;
  om_snapshot_unref(svc->snap);
  svc->snap = snap;
  svc->revision = rev;
  m->last_rev = rev;
  ev->svc = svc;
  ev->snap = om_snapshot_ref(snap);
  enqueue(m, ev);
}

/* ---- instance operations ---- */

static int put_update(mstore_t *m, service_t *svc, lease_t *l,
                      const om_instance_t *in, uint64_t now,
                      om_store_write_cb cb, void *ud) {
  om_snapshot_t *snap;
  uint64_t rev = next_rev(m);
  event_t *ev = calloc(1, sizeof *ev);
  int rc;
  if (ev == NULL)
    return OM_ENOMEM;
  rc =
      om_snapshot_edit(svc->snap, rev, in, 1, NULL, 0, &snap, NULL, NULL, NULL);
  if (rc != 0) {
    free(ev);
    return rc;
  }
  l->inst = om_snapshot_find(snap, in->id);
  lease_extend(m, l, deadline(now, in->ttl_ms));
  m->st.registrations++;
  commit(m, svc, snap, rev, ev);
  drain(m);
  if (cb != NULL)
    cb(ud, 0, OM_STORE_UPDATED, rev);
  return 0;
}

static int put_create(mstore_t *m, const char *service, service_t *svc,
                      size_t pos, const om_instance_t *in, uint64_t now,
                      om_store_write_cb cb, void *ud) {
  service_t *fresh = NULL;
  lease_t *l = NULL;
  event_t *ev = NULL;
  om_snapshot_t *snap = NULL;
  uint64_t rev;
  int rc = OM_ENOMEM;
  lease_t **leases, **heap;
  if (svc == NULL) {
    if (grow_svcs(m) != 0 ||
        (fresh = (service_t *)entry_new(sizeof *fresh, service)) == NULL)
      return OM_ENOMEM;
    svc = fresh;
    pos = 0;
  }
  leases = om__store_grow(svc->leases, &svc->cap, svc->n + 1, sizeof *leases);
  if (leases == NULL)
    goto fail;
  svc->leases = leases;
  heap = om__store_grow(m->heap, &m->heap_cap, m->heap_n + 1, sizeof *heap);
  if (heap == NULL)
    goto fail;
  m->heap = heap;
  if ((l = calloc(1, sizeof *l)) == NULL ||
      (ev = calloc(1, sizeof *ev)) == NULL)
    goto fail;
  rev = next_rev(m);
  if (svc->snap != NULL)
    rc = om_snapshot_edit(svc->snap, rev, in, 1, NULL, 0, &snap, NULL, NULL,
                          NULL);
  else
    rc = om_snapshot_new(service, rev, in, 1, &snap, NULL, NULL, NULL);
  if (rc != 0)
    goto fail;
  /* Everything is in hand: from here on nothing can fail. */
  if (fresh != NULL)
    arr_insert(m->svcs, &m->n_svcs, &fresh->e);
  l->svc = svc;
  l->inst = om_snapshot_find(snap, in->id);
  l->expires_at = deadline(now, in->ttl_ms);
  l->seq = ++m->lease_seq;
  memmove(svc->leases + pos + 1, svc->leases + pos,
          (svc->n - pos) * sizeof *svc->leases);
  svc->leases[pos] = l;
  svc->n++;
  svc->empty_since = 0;
  heap_push(m, l);
  arm(m, 0);
  m->st.registrations++;
  m->st.instances++;
  commit(m, svc, snap, rev, ev);
  drain(m);
  if (cb != NULL)
    cb(ud, 0, OM_STORE_CREATED, rev);
  return 0;
fail:
  free(ev);
  free(l);
  if (fresh != NULL)
    service_free(fresh);
  return rc;
}

static int m_put_instance(om_store_t *s, const char *service,
                          const om_instance_t *in, om_store_write_cb cb,
                          void *ud) {
  mstore_t *m = (mstore_t *)s;
  service_t *svc;
  lease_t *l = NULL;
  size_t pos = 0;
  uint64_t now;
  now = now_ms(m);
  svc = svc_find(m, service);
  if (svc != NULL)
    l = lease_find(svc, in->id, &pos);
  if (l == NULL)
    return put_create(m, service, svc, pos, in, now, cb, ud);
  if (!om_instance_equal(in, l->inst))
    return put_update(m, svc, l, in, now, cb, ud);
  lease_extend(m, l, deadline(now, in->ttl_ms));
  m->st.renewals++;
  if (cb != NULL)
    cb(ud, 0, OM_STORE_NOCHANGE, svc->revision);
  return 0;
}

/*
 * The lease of service/id for renew and delete. Returns 1 with *svc, *l
 * and *pos set; otherwise 0 after answering cb with OM_ENOTFOUND.
 */
static int find_lease(mstore_t *m, const char *service, const char *id,
                      om_store_write_cb cb, void *ud, service_t **svc,
                      lease_t **l, size_t *pos) {
  *svc = svc_find(m, service);
  *l = *svc != NULL ? lease_find(*svc, id, pos) : NULL;
  if (*l == NULL) {
    if (cb != NULL)
      cb(ud, OM_ENOTFOUND, OM_STORE_NOCHANGE,
         *svc != NULL ? (*svc)->revision : 0);
    return 0;
  }
  return 1;
}

static int m_renew(om_store_t *s, const char *service, const char *id,
                   om_store_write_cb cb, void *ud) {
  mstore_t *m = (mstore_t *)s;
  service_t *svc;
  lease_t *l = NULL;
  size_t pos;
  int rc = find_lease(m, service, id, cb, ud, &svc, &l, &pos);
  if (rc != 1)
    return rc;
  lease_extend(m, l, deadline(now_ms(m), l->inst->ttl_ms));
  m->st.renewals++;
  if (cb != NULL)
    cb(ud, 0, OM_STORE_NOCHANGE, svc->revision);
  return 0;
}

static int m_delete_instance(om_store_t *s, const char *service, const char *id,
                             om_store_write_cb cb, void *ud) {
  mstore_t *m = (mstore_t *)s;
  service_t *svc;
  lease_t *l = NULL;
  size_t pos = 0;
  event_t *ev;
  om_snapshot_t *snap;
  uint64_t rev;
  int rc;
  rc = find_lease(m, service, id, cb, ud, &svc, &l, &pos);
  if (rc != 1)
    return rc;
  ev = calloc(1, sizeof *ev);
  if (ev == NULL)
    return OM_ENOMEM;
  rev = next_rev(m);
  rc = om_snapshot_edit(svc->snap, rev, NULL, 0, &id, 1, &snap, NULL, NULL,
                        NULL);
  if (rc != 0) {
    free(ev);
    return rc;
  }
  heap_remove(m, l);
  memmove(svc->leases + pos, svc->leases + pos + 1,
          (svc->n - pos - 1) * sizeof *svc->leases);
  svc->n--;
  if (svc->n == 0)
    svc->empty_since = now_ms(m) + 1; /* 0 means not empty */
  free(l);
  arm(m, 0);
  m->st.deletions++;
  m->st.instances--;
  commit(m, svc, snap, rev, ev);
  drain(m);
  if (cb != NULL)
    cb(ud, 0, OM_STORE_DELETED, rev);
  return 0;
}

/* ---- expiry ---- */

/* Remove a service's collected leases in one new revision. */
static int expire_service(mstore_t *m, service_t *svc) {
  const char **ids = malloc(svc->n_expired * sizeof *ids);
  event_t *ev = calloc(1, sizeof *ev);
  om_snapshot_t *snap = NULL;
  lease_t *l, *next;
  uint64_t rev;
  size_t k = 0, j = 0;
  int rc = OM_ENOMEM;
  if (ids != NULL && ev != NULL) {
    for (l = svc->expired; l != NULL; l = l->next_expired)
      ids[k++] = l->inst->id;
    rev = next_rev(m);
    rc = om_snapshot_edit(svc->snap, rev, NULL, 0, ids, k, &snap, NULL, NULL,
                          NULL);
  }
  free(ids);
  if (rc != 0) {
    free(ev);
    return rc;
  }
  for (l = svc->expired; l != NULL; l = l->next_expired)
    l->inst = NULL; /* mark for the compaction below */
  for (size_t i = 0; i < svc->n; i++)
    if (svc->leases[i]->inst != NULL)
      svc->leases[j++] = svc->leases[i];
  svc->n = j;
  if (svc->n == 0)
    svc->empty_since = now_ms(m) + 1; /* 0 means not empty */
  for (l = svc->expired; l != NULL; l = next) {
    next = l->next_expired;
    free(l);
  }
  m->st.expiries += k;
  m->st.instances -= k;
  commit(m, svc, snap, rev, ev);
  return 0;
}

size_t om_store_memory_expire(om_store_t *s) {
  mstore_t *m = (mstore_t *)s;
  service_t *dirty = NULL, *svc, *next, *rev_list = NULL;
  size_t removed = 0;
  uint64_t now;
  int retry = 0;
  if (s == NULL || s->ops != &memory_ops || m->base.closing)
    return 0;
  now = now_ms(m);
  while (m->heap_n != 0 && m->heap[0]->expires_at <= now) {
    lease_t *l = m->heap[0];
    heap_remove(m, l);
    svc = l->svc;
    if (svc->n_expired == 0) {
      svc->next_dirty = dirty;
      dirty = svc;
    }
    l->next_expired = svc->expired;
    svc->expired = l;
    svc->n_expired++;
  }
  for (svc = dirty; svc != NULL; svc = next) { /* first to expire first */
    next = svc->next_dirty;
    svc->next_dirty = rev_list;
    rev_list = svc;
  }
  for (svc = rev_list; svc != NULL; svc = next) {
    next = svc->next_dirty;
    if (expire_service(m, svc) == 0)
      removed += svc->n_expired;
    else {
      /* Put them back (the heap has room: they just left it), try later. */
      for (lease_t *l = svc->expired; l != NULL; l = l->next_expired)
        heap_push(m, l);
      retry = 1;
    }
    svc->expired = NULL;
    svc->n_expired = 0;
    svc->next_dirty = NULL;
  }
  if (retry)
    m->armed = 0;
  arm(m, retry ? deadline(now, RETRY_MS) : 0);
  drain(m);
  return removed;
}

static void on_timer(uv_timer_t *t) {
  mstore_t *m = t->data;
  m->armed = 0;
  om_store_memory_expire(&m->base);
}

/* ---- reads ---- */

static int m_snapshot(om_store_t *s, const char *service,
                      om_store_snapshot_cb cb, void *ud) {
  mstore_t *m = (mstore_t *)s;
  service_t *svc = svc_find(m, service);
  if (svc == NULL)
    cb(ud, OM_ENOTFOUND, NULL);
  else
    cb(ud, 0, svc->snap);
  return 0;
}

static int m_list_services(om_store_t *s, om_store_list_cb cb, void *ud) {
  mstore_t *m = (mstore_t *)s;
  om_service_rev_t *list;
  size_t n = 0;
  list = malloc((m->n_svcs != 0 ? m->n_svcs : 1) * sizeof *list);
  if (list == NULL)
    return OM_ENOMEM;
  for (size_t i = 0; i < m->n_svcs; i++) {
    service_t *svc = (service_t *)m->svcs[i];
    list[n].service = svc->e.name;
    list[n].revision = svc->revision;
    list[n].instances = svc->n;
    n++;
  }
  cb(ud, 0, list, n);
  free(list);
  return 0;
}

static int m_leases(om_store_t *s, om_store_leases_cb cb, void *ud) {
  mstore_t *m = (mstore_t *)s;
  uint64_t now = now_ms(m);
  size_t total = 0, n = 0;
  om_lease_left_t *list;
  for (size_t i = 0; i < m->n_svcs; i++)
    total += ((service_t *)m->svcs[i])->n;
  list = malloc((total != 0 ? total : 1) * sizeof *list);
  if (list == NULL)
    return OM_ENOMEM;
  for (size_t i = 0; i < m->n_svcs; i++) {
    service_t *svc = (service_t *)m->svcs[i];
    for (size_t j = 0; j < svc->n; j++) {
      const lease_t *l = svc->leases[j];
      list[n].service = svc->e.name;
      list[n].id = l->inst->id;
      list[n].expires_in_ms = l->expires_at > now ? l->expires_at - now : 0;
      n++;
    }
  }
  cb(ud, 0, list, n);
  free(list);
  return 0;
}

/* ---- configuration documents ---- */

static int m_config_put(om_store_t *s, const char *name,
                        const char *content_type, const char *body, size_t len,
                        om_store_write_cb cb, void *ud) {
  mstore_t *m = (mstore_t *)s;
  cfg_t *c, *fresh = NULL;
  om_config_doc_t *doc;
  event_t *ev;
  uint64_t rev;
  int created;
  if (len > m->opts.max_config_bytes)
    return OM_ETOOBIG;
  c = cfg_find(m, name);
  if (c != NULL && c->doc->len == len &&
      strcmp(c->doc->content_type, content_type) == 0 &&
      (len == 0 || memcmp(c->doc->body, body, len) == 0)) {
    if (cb != NULL)
      cb(ud, 0, OM_STORE_NOCHANGE, c->doc->revision);
    return 0;
  }
  if (c == NULL && (grow_cfgs(m) != 0 ||
                    (c = fresh = (cfg_t *)entry_new(sizeof *c, name)) == NULL))
    return OM_ENOMEM;
  rev = next_rev(m);
  ev = calloc(1, sizeof *ev);
  doc =
      ev != NULL ? om_config_doc_new(name, content_type, body, len, rev) : NULL;
  if (doc == NULL) {
    free(ev);
    if (fresh != NULL)
      cfg_free(fresh);
    return OM_ENOMEM;
  }
  if (fresh != NULL)
    arr_insert(m->cfgs, &m->n_cfgs, &fresh->e);
  created = c->doc == NULL;
  om_config_doc_unref(c->doc);
  c->doc = doc;
  m->last_rev = rev;
  ev->cfg = c;
  ev->doc = om_config_doc_ref(doc);
  enqueue(m, ev);
  drain(m);
  if (cb != NULL)
    cb(ud, 0, created ? OM_STORE_CREATED : OM_STORE_UPDATED, rev);
  return 0;
}

static int m_config_get(om_store_t *s, const char *name, om_store_config_cb cb,
                        void *ud) {
  mstore_t *m = (mstore_t *)s;
  cfg_t *c = cfg_find(m, name);
  if (c == NULL)
    cb(ud, OM_ENOTFOUND, NULL);
  else
    cb(ud, 0, c->doc);
  return 0;
}

/* ---- status and lifetime ---- */

static void m_status(om_store_t *s, om_store_status_t *out) {
  *out = ((mstore_t *)s)->st;
}

static void free_all(mstore_t *m) {
  while (m->q_head != NULL) {
    event_t *ev = m->q_head;
    m->q_head = ev->next;
    event_free(ev);
  }
  for (size_t i = 0; i < m->n_svcs; i++) {
    service_free((service_t *)m->svcs[i]);
  }
  for (size_t i = 0; i < m->n_cfgs; i++) {
    cfg_free((cfg_t *)m->cfgs[i]);
  }
  om__subs_free(&m->base.subs);
  free(m->svcs);
  free(m->cfgs);
  free(m->heap);
  free(m);
}

static void on_closed(uv_handle_t *h) {
  mstore_t *m = h->data;
  void (*done)(void *) = m->done;
  void *ud = m->done_ud;
  free_all(m);
  if (done != NULL)
    done(ud);
}

static void m_close(om_store_t *s, void (*done)(void *ud), void *ud) {
  mstore_t *m = (mstore_t *)s;
  m->done = done;
  m->done_ud = ud;
  uv_timer_stop(&m->timer);
  uv_close((uv_handle_t *)&m->timer, on_closed);
}

/* Compact the service list in one pass, dropping the services empty for
 * idle_ms that keep does not claim. Not while a delivery is queued: an
 * event may still name a service. */
static int m_collect_empty(om_store_t *s, uint64_t idle_ms,
                           int (*keep)(void *ud, const char *service),
                           void (*gone)(void *ud, const char *service),
                           void *ud, size_t *n) {
  mstore_t *m = (mstore_t *)s;
  uint64_t now = now_ms(m);
  size_t j = 0, removed = 0;
  if (m->draining || m->q_head != NULL)
    return 0;
  for (size_t i = 0; i < m->n_svcs; i++) {
    service_t *svc = (service_t *)m->svcs[i];
    if (svc->n == 0 && svc->snap != NULL && svc->empty_since != 0 &&
        now + 1 - svc->empty_since >= idle_ms &&
        (keep == NULL || !keep(ud, svc->e.name))) {
      if (gone != NULL)
        gone(ud, svc->e.name);
      service_free(svc);
      removed++;
      continue;
    }
    m->svcs[j++] = m->svcs[i];
  }
  m->n_svcs = j;
  m->st.services -= removed;
  m->st.collected += removed;
  if (n != NULL)
    *n = removed;
  return 0;
}

static const om_store_ops_t memory_ops = {
    .name = "memory",
    .put_instance = m_put_instance,
    .renew = m_renew,
    .delete_instance = m_delete_instance,
    .snapshot = m_snapshot,
    .list_services = m_list_services,
    .config_put = m_config_put,
    .config_get = m_config_get,
    .status = m_status,
    .close = m_close,
    .leases = m_leases,
    .collect_empty = m_collect_empty,
};

int om_store_memory_new(uv_loop_t *loop, const om_store_memory_opts_t *opts,
                        om_store_t **out) {
  mstore_t *m;
  if (loop == NULL || out == NULL)
    return OM_EINVAL;
  m = calloc(1, sizeof *m);
  if (m == NULL)
    return OM_ENOMEM;
  if (opts != NULL)
    m->opts = *opts;
  if (m->opts.max_config_bytes == 0)
    m->opts.max_config_bytes = DEFAULT_MAX_CONFIG;
  m->last_rev = m->opts.min_revision;
  m->st.state_lost = 1; /* a memory store always starts empty */
  m->loop = loop;
  m->base.ops = &memory_ops;
  om__subs_init(&m->base.subs);
  if (uv_timer_init(loop, &m->timer) != 0) {
    free(m);
    return OM_ENOMEM;
  }
  m->timer.data = m;
  *out = &m->base;
  return 0;
}
