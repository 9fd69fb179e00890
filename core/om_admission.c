/*
 * om_admission.c: in-flight limit, bounded FIFO queue, deadline heap.
 *
 * Invariant: while the queue is non-empty, inflight >= limit. Every path
 * that frees a slot or raises the limit drains the queue (drain()), and
 * acquire never admits past a waiter, so FIFO order holds and a free slot
 * never sits idle next to a waiting request.
 */
#include "om_admission.h"

#include <limits.h>
#include <stdlib.h>

#include "om_errno.h"

typedef om_admission_waiter_t waiter_t;

struct om_admission_s {
  uint32_t limit;
  uint32_t max_queue;
  uint32_t inflight;
  uint32_t queued;
  om_list_t fifo; /* the queued waiters, oldest first */
  om_heap_t heap; /* those of them with a deadline, earliest first */
  uint64_t seq;
  uint64_t admitted;
  uint64_t rejected;
  uint64_t expired;
  uint64_t cancelled;
};

/* ---- deadline heap (core/om_heap.h, see om_admission.h) ---- */

#define WAITER_OF_HEAP(n) OM_HEAP_ENTRY(n, waiter_t, om__heap)

/* Earlier deadline first; equal deadlines in arrival order, so expiry is
 * deterministic and FIFO among equals (libuv src/timer.c timer_less_than). */
static int heap_less(const om_heap_node_t *hx, const om_heap_node_t *hy) {
  const waiter_t *x = WAITER_OF_HEAP(hx), *y = WAITER_OF_HEAP(hy);
  if (x->om__deadline_ns != y->om__deadline_ns)
    return x->om__deadline_ns < y->om__deadline_ns;
  return x->om__seq < y->om__seq;
}

/* The waiter with the earliest deadline, or NULL. */
static waiter_t *heap_first(const om_admission_t *a) {
  om_heap_node_t *n = om_heap_min(&a->heap);
  return n != NULL ? WAITER_OF_HEAP(n) : NULL;
}

/* ---- the FIFO queue ---- */

static void enqueue(om_admission_t *a, waiter_t *w, uint64_t deadline_ns) {
  w->om__deadline_ns = deadline_ns;
  w->om__seq = a->seq++;
  w->om__owner = a;
  om_list_push_back(&a->fifo, &w->om__link);
  a->queued++;
  if (deadline_ns != OM_DEADLINE_NEVER)
    om_heap_insert(&a->heap, &w->om__heap);
}

static void unlink_waiter(om_admission_t *a, waiter_t *w) {
  om_list_remove(&w->om__link);
  if (w->om__deadline_ns != OM_DEADLINE_NEVER)
    om_heap_remove(&a->heap, &w->om__heap);
  w->om__owner = NULL;
  a->queued--;
}

/* The oldest queued waiter, or NULL. */
static waiter_t *fifo_first(const om_admission_t *a) {
  om_list_t *n = om_list_first(&a->fifo);
  return n != NULL ? OM_LIST_ENTRY(n, waiter_t, om__link) : NULL;
}

static int is_due(uint64_t deadline_ns, uint64_t now_ns) {
  return deadline_ns != OM_DEADLINE_NEVER && deadline_ns <= now_ns;
}

/*
 * Hand out free slots to the head of the queue. State is complete before
 * each callback and re-read after it, so a callback may re-enter.
 */
static void drain(om_admission_t *a, uint64_t now_ns, om_admission_cb cb,
                  void *ud) {
  waiter_t *w;
  while (a->inflight < a->limit && (w = fifo_first(a)) != NULL) {
    unlink_waiter(a, w);
    if (is_due(w->om__deadline_ns, now_ns)) {
      a->expired++;
      cb(w, OM_EDEADLINE, ud);
    } else {
      a->inflight++;
      a->admitted++;
      cb(w, 0, ud);
    }
  }
}

/* ---- public API ---- */

int om_admission_new(const om_admission_opts_t *opts, om_admission_t **out) {
  om_admission_t *a;
  if (opts == NULL || out == NULL || opts->max_inflight == 0)
    return OM_EINVAL;
  a = calloc(1, sizeof *a);
  if (a == NULL)
    return OM_ENOMEM;
  a->limit = opts->max_inflight;
  a->max_queue = opts->max_queue;
  om_list_init(&a->fifo);
  om_heap_init(&a->heap, heap_less);
  *out = a;
  return 0;
}

void om_admission_free(om_admission_t *a) {
  /* The nodes are the caller's: leave them unqueued so they can be reused,
   * rather than pointing into freed memory. */
  waiter_t *w;
  if (a == NULL)
    return;
  while ((w = fifo_first(a)) != NULL)
    unlink_waiter(a, w);
  free(a);
}

void om_admission_waiter_init(om_admission_waiter_t *w) {
  void *data = w->data;
  *w = (om_admission_waiter_t){0};
  w->data = data;
}

int om_admission_acquire(om_admission_t *a, om_admission_waiter_t *w,
                         uint64_t deadline_ns, uint64_t now_ns) {
  if (w != NULL && w->om__owner != NULL)
    return OM_ESTATE;
  if (is_due(deadline_ns, now_ns)) {
    a->expired++;
    return OM_EDEADLINE;
  }
  if (a->inflight < a->limit && om_list_empty(&a->fifo)) {
    a->inflight++;
    a->admitted++;
    return OM_ADMISSION_ADMITTED;
  }
  if (w == NULL || a->queued >= a->max_queue) {
    a->rejected++;
    return OM_EOVERLOAD;
  }
  enqueue(a, w, deadline_ns);
  return OM_ADMISSION_QUEUED;
}

int om_admission_release(om_admission_t *a, uint64_t now_ns, om_admission_cb cb,
                         void *ud) {
  if (cb == NULL)
    return OM_EINVAL;
  if (a->inflight == 0)
    return OM_ESTATE;
  a->inflight--;
  drain(a, now_ns, cb, ud);
  return 0;
}

int om_admission_set_limit(om_admission_t *a, uint32_t limit, uint64_t now_ns,
                           om_admission_cb cb, void *ud) {
  if (limit == 0 || cb == NULL)
    return OM_EINVAL;
  a->limit = limit;
  drain(a, now_ns, cb, ud);
  return 0;
}

int om_admission_expire(om_admission_t *a, uint64_t now_ns, om_admission_cb cb,
                        void *ud) {
  int n = 0;
  if (cb == NULL)
    return OM_EINVAL;
  waiter_t *w;
  while ((w = heap_first(a)) != NULL && w->om__deadline_ns <= now_ns) {
    unlink_waiter(a, w);
    a->expired++;
    if (n < INT_MAX)
      n++;
    cb(w, OM_EDEADLINE, ud);
  }
  return n;
}

uint64_t om_admission_next_deadline(const om_admission_t *a) {
  const waiter_t *w = heap_first(a);
  return w != NULL ? w->om__deadline_ns : OM_DEADLINE_NEVER;
}

int om_admission_cancel(om_admission_t *a, om_admission_waiter_t *w) {
  if (w == NULL || w->om__owner != a)
    return OM_ENOTFOUND;
  unlink_waiter(a, w);
  a->cancelled++;
  return 0;
}

void om_admission_stats(const om_admission_t *a, om_admission_stats_t *out) {
  out->inflight = a->inflight;
  out->queued = a->queued;
  out->limit = a->limit;
  out->max_queue = a->max_queue;
  out->admitted = a->admitted;
  out->rejected = a->rejected;
  out->expired = a->expired;
  out->cancelled = a->cancelled;
}

uint32_t om_admission_inflight(const om_admission_t *a) {
  return a->inflight;
}

uint32_t om_admission_queued(const om_admission_t *a) {
  return a->queued;
}

uint32_t om_admission_limit(const om_admission_t *a) {
  return a->limit;
}
