/*
 * om_admission.h: admission control for one service pool: at most
 * `limit` requests in flight, then a bounded FIFO queue of waiters, then
 * rejection (OM_EOVERLOAD).
 *
 * Why this shape: a proxy must shed load it cannot serve (reject early and
 * cheaply) while smoothing short bursts (queue briefly, in arrival order),
 * and a queued request whose deadline passes must fail without ever
 * reaching the network (docs/ARCHITECTURE.md, "A proxied request").
 *
 * Ownership and allocation. The admission never allocates after
 * om_admission_new. A request that may wait brings its own queue node, an
 * om_admission_waiter_t, typically embedded in the caller's request struct
 * (libuv-style: the caller owns the memory, the admission links it). The
 * node must stay valid, and must not be reused, while it is queued: until
 * the admission hands it back through a callback (admitted or expired) or
 * om_admission_cancel removes it.
 *
 * Queue structure. Waiters sit on an intrusive doubly-linked list (FIFO
 * order, O(1) unlink) and, when they have a deadline, also in an intrusive
 * binary min-heap keyed by (deadline, insertion order), so the earliest
 * deadline is O(1) to read and any entry is O(log n) to remove. The heap
 * follows libuv's src/heap-inl.h (pointer-linked complete binary tree,
 * path to the last slot from the element count); the insertion-order
 * tie-break follows libuv's src/timer.c timer_less_than.
 *
 * Cost: acquire/release are O(1) when nothing waits; queueing a waiter with
 * a deadline is O(log n); admitting, expiring or cancelling one is
 * O(log n) (O(1) for waiters without a deadline).
 *
 * Time is the caller's unsigned 64-bit monotonic clock in nanoseconds;
 * deadlines are absolute, OM_DEADLINE_NEVER (om_deadline.h) for none.
 *
 * The adaptive limiter (om_limiter.h) is a separate object: the caller feeds
 * its output into om_admission_set_limit. Keeping them apart keeps the
 * admission O(1) and free of floating point, lets a pool run with a fixed
 * limit, and lets the caller decide when a new limit takes effect.
 *
 * Callbacks. release, set_limit and expire hand waiters back through one
 * callback type, one call per waiter, in order. When the callback runs, the
 * waiter is already unlinked and every count already updated, so the
 * callback may call acquire, release, cancel, set_limit or expire on the same
 * admission (and may reuse or free the waiter). It must not call
 * om_admission_free.
 *
 * Not thread-safe: one admission belongs to one event loop.
 */
#ifndef OM_ADMISSION_H
#define OM_ADMISSION_H

#include <stddef.h>
#include <stdint.h>

#include "om_heap.h"
#include "om_list.h"

#include "om_deadline.h"

typedef struct om_admission_s om_admission_t;
typedef struct om_admission_waiter_s om_admission_waiter_t;

/*
 * The queue node. Public only so the caller can embed it; every field but
 * `data` is private to the admission. A zeroed waiter (or one set up by
 * om_admission_waiter_init) is ready to use.
 */
struct om_admission_waiter_s {
  void *data;         /* the caller's; the admission never reads or writes it */
  om_list_t om__link; /* private: the FIFO (while queued) */
  om_heap_node_t om__heap; /* private: the deadline heap (queued, deadline) */
  uint64_t om__deadline_ns;
  uint64_t om__seq;                /* insertion order, the heap tie-break */
  const om_admission_t *om__owner; /* non-NULL exactly while queued */
};

/* om_admission_acquire results besides errors. */
enum {
  OM_ADMISSION_ADMITTED = 0, /* go: a slot is yours, release it later */
  OM_ADMISSION_QUEUED = 1    /* wait for the callback */
};

/*
 * The callback that hands a waiter back. status is 0 (admitted: the waiter
 * now holds a slot and must release it) or OM_EDEADLINE (its deadline passed
 * while queued: it holds no slot and was not admitted). ud is the pointer
 * the caller passed with the call that triggered the callback.
 */
typedef void (*om_admission_cb)(om_admission_waiter_t *w, int status, void *ud);

typedef struct om_admission_opts_s {
  uint32_t max_inflight; /* initial limit, >= 1 */
  uint32_t max_queue;    /* 0: no queue, reject once the limit is reached */
} om_admission_opts_t;

typedef struct om_admission_stats_s {
  uint32_t inflight;  /* slots held now (may exceed limit after lowering it) */
  uint32_t queued;    /* waiters queued now */
  uint32_t limit;     /* current max in flight */
  uint32_t max_queue; /* queue bound */
  uint64_t admitted;  /* total admissions, immediate or from the queue */
  uint64_t rejected;  /* total OM_EOVERLOAD */
  uint64_t expired;   /* total OM_EDEADLINE, at acquire or while queued */
  uint64_t cancelled; /* total waiters removed by om_admission_cancel */
} om_admission_stats_t;

/*
 * om_admission_new: create an admission with the given limit and queue
 * bound. Returns 0 and sets *out (owned by the caller, free with
 * om_admission_free); OM_EINVAL when opts or out is NULL or max_inflight is
 * 0; OM_ENOMEM when out of memory. On error *out is untouched and nothing is
 * allocated.
 */
int om_admission_new(const om_admission_opts_t *opts, om_admission_t **out);

/*
 * om_admission_free: free the admission. Waiters still queued are detached
 * (their nodes become unqueued and reusable) without any callback: the
 * caller, who owns them, fails them its own way. NULL is a no-op.
 */
void om_admission_free(om_admission_t *a);

/* Make w an unqueued waiter (equivalent to zeroing it); keeps w->data. */
void om_admission_waiter_init(om_admission_waiter_t *w);

/* Whether w is queued in some admission right now. */
static inline int om_admission_waiter_queued(const om_admission_waiter_t *w) {
  return w->om__owner != NULL;
}

/*
 * om_admission_acquire: ask for a slot for a request whose call deadline is
 * deadline_ns (absolute, OM_DEADLINE_NEVER for none), at now_ns. Returns:
 * - OM_ADMISSION_ADMITTED: a slot is held; release it with
 *   om_admission_release when the request is done. w is not touched.
 * - OM_ADMISSION_QUEUED: w is queued; the admission will hand it back
 *   through a callback (admitted or OM_EDEADLINE), or the caller removes it
 *   with om_admission_cancel.
 * - OM_EDEADLINE: the deadline has already passed; nothing is held or
 *   queued (counted as expired).
 * - OM_EOVERLOAD: the limit is reached and the queue is full, or w is NULL
 *   (a caller that will not wait passes NULL); nothing is held or queued
 *   (counted as rejected).
 * - OM_ESTATE: w is already queued (misuse); nothing changed.
 * A newcomer never overtakes a queued waiter: while anyone waits, a new
 * request queues even if a slot looks free.
 */
int om_admission_acquire(om_admission_t *a, om_admission_waiter_t *w,
                         uint64_t deadline_ns, uint64_t now_ns);

/*
 * om_admission_release: give back one slot at now_ns, then admit waiters
 * from the head of the queue while slots are free. A head whose deadline
 * has passed (deadline <= now_ns) is failed with OM_EDEADLINE instead of
 * being admitted, and the next one is tried. Each waiter handed back goes
 * to cb(w, status, ud). Returns 0; OM_EINVAL when cb is NULL, OM_ESTATE
 * when nothing is in flight (a double release); on error nothing changed.
 */
int om_admission_release(om_admission_t *a, uint64_t now_ns, om_admission_cb cb,
                         void *ud);

/*
 * om_admission_set_limit: change the in-flight limit (the adaptive
 * limiter's output, or a reloaded policy). Raising it admits queued
 * waiters up to the new limit, exactly like releases would (expired heads
 * fail with OM_EDEADLINE), through cb. Lowering it admits nobody and
 * revokes nothing: in-flight requests finish, and new ones wait until
 * inflight drops below the new limit. Returns 0; OM_EINVAL when limit is 0
 * or cb is NULL, and then nothing changed.
 */
int om_admission_set_limit(om_admission_t *a, uint32_t limit, uint64_t now_ns,
                           om_admission_cb cb, void *ud);

/*
 * om_admission_expire: fail every queued waiter whose deadline <= now_ns
 * with OM_EDEADLINE through cb, earliest deadline first (ties in arrival
 * order). Such a waiter is never admitted afterwards. Meant for the event
 * loop's timer, armed at om_admission_next_deadline. O(log n) per expired
 * waiter, O(1) when none is due. Returns the number expired (>= 0,
 * saturating at INT_MAX), or OM_EINVAL when cb is NULL (nothing changed).
 */
int om_admission_expire(om_admission_t *a, uint64_t now_ns, om_admission_cb cb,
                        void *ud);

/*
 * om_admission_next_deadline: the earliest deadline among queued waiters,
 * OM_DEADLINE_NEVER when none has one. O(1). The event loop arms its timer
 * here and calls om_admission_expire when it fires.
 */
uint64_t om_admission_next_deadline(const om_admission_t *a);

/*
 * om_admission_cancel: remove a queued waiter that gave up (the client
 * disconnected). No callback is called. Returns 0; OM_ENOTFOUND when w is
 * not queued in this admission (already admitted, expired, cancelled, or
 * never queued here), and then nothing changed. O(log n).
 */
int om_admission_cancel(om_admission_t *a, om_admission_waiter_t *w);

/* Current counts and totals, for metrics. */
void om_admission_stats(const om_admission_t *a, om_admission_stats_t *out);

/* Slots held now (what the limiter's app-limited check wants). */
uint32_t om_admission_inflight(const om_admission_t *a);

/* Waiters queued now. */
uint32_t om_admission_queued(const om_admission_t *a);

/* The current in-flight limit. */
uint32_t om_admission_limit(const om_admission_t *a);

#endif /* OM_ADMISSION_H */
