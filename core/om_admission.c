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
  waiter_t *head; /* FIFO: oldest */
  waiter_t *tail; /* FIFO: newest */
  waiter_t *heap_root;
  uint32_t heap_n; /* waiters in the heap (those with a deadline) */
  uint64_t seq;
  uint64_t admitted;
  uint64_t rejected;
  uint64_t expired;
  uint64_t cancelled;
};

/* ---- deadline heap (after libuv src/heap-inl.h, see om_admission.h) ---- */

/* Earlier deadline first; equal deadlines in arrival order, so expiry is
 * deterministic and FIFO among equals (libuv src/timer.c timer_less_than). */
static int heap_less(const waiter_t *x, const waiter_t *y) {
  if (x->om__deadline_ns != y->om__deadline_ns)
    return x->om__deadline_ns < y->om__deadline_ns;
  return x->om__seq < y->om__seq;
}

/*
 * The node at 1-based position pos (1 <= pos <= heap_n) of the complete
 * tree: the bits of pos below its leading 1, read from the top, are the
 * path from the root (0 left, 1 right).
 */
static waiter_t *heap_at(const om_admission_t *a, uint64_t pos) {
  waiter_t *x = a->heap_root;
  int shift = 0;
  while ((pos >> shift) > 1)
    shift++;
  while (shift-- > 0)
    x = ((pos >> shift) & 1) ? x->om__right : x->om__left;
  return x;
}

/* Exchange parent p with its child c: c moves up one level, p down. */
static void heap_swap(om_admission_t *a, waiter_t *p, waiter_t *c) {
  waiter_t *pp = p->om__parent;
  waiter_t *cl = c->om__left, *cr = c->om__right;
  waiter_t *sib;

  if (p->om__left == c) {
    sib = p->om__right;
    c->om__left = p;
    c->om__right = sib;
  } else {
    sib = p->om__left;
    c->om__left = sib;
    c->om__right = p;
  }
  if (sib != NULL)
    sib->om__parent = c;

  c->om__parent = pp;
  if (pp == NULL)
    a->heap_root = c;
  else if (pp->om__left == p)
    pp->om__left = c;
  else
    pp->om__right = c;

  p->om__parent = c;
  p->om__left = cl;
  p->om__right = cr;
  if (cl != NULL)
    cl->om__parent = p;
  if (cr != NULL)
    cr->om__parent = p;
}

static void heap_sift_up(om_admission_t *a, waiter_t *x) {
  while (x->om__parent != NULL && heap_less(x, x->om__parent))
    heap_swap(a, x->om__parent, x);
}

static void heap_sift_down(om_admission_t *a, waiter_t *x) {
  for (;;) {
    waiter_t *m = x;
    if (x->om__left != NULL && heap_less(x->om__left, m))
      m = x->om__left;
    if (x->om__right != NULL && heap_less(x->om__right, m))
      m = x->om__right;
    if (m == x)
      return;
    heap_swap(a, x, m);
  }
}

static void heap_insert(om_admission_t *a, waiter_t *w) {
  uint64_t pos = (uint64_t)a->heap_n + 1;
  w->om__left = w->om__right = NULL;
  if (pos == 1) {
    w->om__parent = NULL;
    a->heap_root = w;
  } else {
    waiter_t *p = heap_at(a, pos / 2);
    if (pos & 1)
      p->om__right = w;
    else
      p->om__left = w;
    w->om__parent = p;
  }
  a->heap_n++;
  heap_sift_up(a, w);
}

static void heap_remove(om_admission_t *a, waiter_t *w) {
  /* Move the last node of the bottom row into w's place, then restore the
   * heap order around it (down, and up: the last node is not necessarily
   * the largest). */
  waiter_t *last = heap_at(a, a->heap_n);
  waiter_t *lp = last->om__parent;

  if (lp == NULL)
    a->heap_root = NULL;
  else if (lp->om__left == last)
    lp->om__left = NULL;
  else
    lp->om__right = NULL;
  a->heap_n--;

  if (last != w) {
    last->om__left = w->om__left;
    last->om__right = w->om__right;
    last->om__parent = w->om__parent;
    if (last->om__left != NULL)
      last->om__left->om__parent = last;
    if (last->om__right != NULL)
      last->om__right->om__parent = last;
    if (w->om__parent == NULL)
      a->heap_root = last;
    else if (w->om__parent->om__left == w)
      w->om__parent->om__left = last;
    else
      w->om__parent->om__right = last;
    heap_sift_down(a, last);
    heap_sift_up(a, last);
  }
  w->om__left = w->om__right = w->om__parent = NULL;
}

/* ---- the FIFO queue ---- */

static void enqueue(om_admission_t *a, waiter_t *w, uint64_t deadline_ns) {
  w->om__deadline_ns = deadline_ns;
  w->om__seq = a->seq++;
  w->om__owner = a;
  w->om__next = NULL;
  w->om__prev = a->tail;
  if (a->tail != NULL)
    a->tail->om__next = w;
  else
    a->head = w;
  a->tail = w;
  a->queued++;
  if (deadline_ns != OM_DEADLINE_NEVER)
    heap_insert(a, w);
}

static void unlink_waiter(om_admission_t *a, waiter_t *w) {
  if (w->om__prev != NULL)
    w->om__prev->om__next = w->om__next;
  else
    a->head = w->om__next;
  if (w->om__next != NULL)
    w->om__next->om__prev = w->om__prev;
  else
    a->tail = w->om__prev;
  w->om__prev = w->om__next = NULL;
  if (w->om__deadline_ns != OM_DEADLINE_NEVER)
    heap_remove(a, w);
  w->om__owner = NULL;
  a->queued--;
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
  while (a->head != NULL && a->inflight < a->limit) {
    waiter_t *w = a->head;
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
  *out = a;
  return 0;
}

void om_admission_free(om_admission_t *a) {
  if (a == NULL)
    return;
  /* The nodes are the caller's: leave them unqueued so they can be reused,
   * rather than pointing into freed memory. */
  while (a->head != NULL)
    unlink_waiter(a, a->head);
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
  if (a->inflight < a->limit && a->head == NULL) {
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
  if (a->head != NULL)
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
  while (a->heap_root != NULL && a->heap_root->om__deadline_ns <= now_ns) {
    waiter_t *w = a->heap_root;
    unlink_waiter(a, w);
    a->expired++;
    if (n < INT_MAX)
      n++;
    cb(w, OM_EDEADLINE, ud);
  }
  return n;
}

uint64_t om_admission_next_deadline(const om_admission_t *a) {
  return a->heap_root != NULL ? a->heap_root->om__deadline_ns
                              : OM_DEADLINE_NEVER;
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
