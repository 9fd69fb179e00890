/* test_admission.c: in-flight limit, FIFO queue, deadlines, cancel. */
#include "om_test.h"

#include <string.h>

#include "om_admission.h"
#include "om_errno.h"
#include "om_rng.h"

#define MS 1000000ull
#define NEVER OM_DEADLINE_NEVER

/* What the callbacks saw, in order. */
typedef struct {
  om_admission_waiter_t *w[4096];
  int status[4096];
  int n;
} log_t;

static void log_cb(om_admission_waiter_t *w, int status, void *ud) {
  log_t *lg = ud;
  OM_ASSERT_CMP(lg->n, <, 4096);
  /* Handed back unlinked: the waiter is free for reuse right away. */
  assert_false(om_admission_waiter_queued(w));
  lg->w[lg->n] = w;
  lg->status[lg->n] = status;
  lg->n++;
}

static om_admission_t *make(uint32_t max_inflight, uint32_t max_queue) {
  om_admission_opts_t o = {max_inflight, max_queue};
  om_admission_t *a = NULL;
  assert_int_equal(om_admission_new(&o, &a), 0);
  assert_non_null(a);
  return a;
}

static void new_rejects_bad_options(void **state) {
  om_admission_opts_t o = {0, 4};
  om_admission_t *a = (om_admission_t *)0x1;
  (void)state;
  assert_int_equal(om_admission_new(&o, &a), OM_EINVAL);
  assert_ptr_equal(a, (om_admission_t *)0x1); /* untouched */
  assert_int_equal(om_admission_new(NULL, &a), OM_EINVAL);
  o.max_inflight = 1;
  assert_int_equal(om_admission_new(&o, NULL), OM_EINVAL);
  om_admission_free(NULL); /* no-op */
}

static void new_fault_injection(void **state) {
  om_admission_opts_t o = {4, 8};
  (void)state;
  for (long n = 0;; n++) {
    om_admission_t *a = NULL;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_admission_new(&o, &a);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_non_null(a);
      assert_int_equal(om_admission_limit(a), 4);
      om_admission_free(a);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(a);
  }
}

static void admits_up_to_limit_queues_then_rejects(void **state) {
  om_admission_t *a = make(2, 2);
  om_admission_waiter_t w[3] = {{0}};
  om_admission_stats_t st;
  (void)state;
  assert_int_equal(om_admission_acquire(a, &w[0], NEVER, 0),
                   OM_ADMISSION_ADMITTED);
  assert_false(om_admission_waiter_queued(&w[0])); /* not touched */
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0),
                   OM_ADMISSION_ADMITTED);
  /* Full: a caller that will not wait is rejected at once. */
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), OM_EOVERLOAD);
  assert_int_equal(om_admission_acquire(a, &w[0], NEVER, 0),
                   OM_ADMISSION_QUEUED);
  assert_true(om_admission_waiter_queued(&w[0]));
  assert_int_equal(om_admission_acquire(a, &w[1], NEVER, 0),
                   OM_ADMISSION_QUEUED);
  assert_int_equal(om_admission_acquire(a, &w[2], NEVER, 0), OM_EOVERLOAD);
  assert_false(om_admission_waiter_queued(&w[2]));
  om_admission_stats(a, &st);
  assert_int_equal(st.inflight, 2);
  assert_int_equal(st.queued, 2);
  assert_int_equal(st.limit, 2);
  assert_int_equal(st.max_queue, 2);
  assert_int_equal(st.admitted, 2);
  assert_int_equal(st.rejected, 2);
  assert_int_equal(st.expired, 0);
  assert_int_equal(om_admission_inflight(a), 2);
  assert_int_equal(om_admission_queued(a), 2);
  om_admission_free(a);
  /* Freed with waiters queued: they are detached, reusable. */
  assert_false(om_admission_waiter_queued(&w[0]));
  assert_false(om_admission_waiter_queued(&w[1]));
}

static void no_queue_rejects_when_full(void **state) {
  om_admission_t *a = make(1, 0);
  om_admission_waiter_t w = {0};
  (void)state;
  assert_int_equal(om_admission_acquire(a, &w, NEVER, 0), 0);
  assert_int_equal(om_admission_acquire(a, &w, NEVER, 0), OM_EOVERLOAD);
  assert_false(om_admission_waiter_queued(&w));
  om_admission_free(a);
}

static void release_admits_head_in_fifo_order(void **state) {
  om_admission_t *a = make(1, 8);
  om_admission_waiter_t w[5] = {{0}};
  log_t lg = {.n = 0};
  (void)state;
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  /* Mixed deadlines: FIFO order is arrival order, not deadline order. */
  for (int i = 0; i < 5; i++)
    assert_int_equal(om_admission_acquire(
                         a, &w[i], i % 2 ? NEVER : (uint64_t)(90 - i) * MS, 0),
                     OM_ADMISSION_QUEUED);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(om_admission_release(a, 1 * MS, log_cb, &lg), 0);
    assert_int_equal(lg.n, i + 1);
    assert_ptr_equal(lg.w[i], &w[i]);
    assert_int_equal(lg.status[i], 0);
    assert_int_equal(om_admission_inflight(a), 1); /* slot passed along */
    assert_int_equal(om_admission_queued(a), 4 - i);
  }
  assert_int_equal(om_admission_release(a, 1 * MS, log_cb, &lg), 0);
  assert_int_equal(om_admission_inflight(a), 0);
  assert_int_equal(lg.n, 5);
  /* A release with nothing in flight is a bug in the caller. */
  assert_int_equal(om_admission_release(a, 1 * MS, log_cb, &lg), OM_ESTATE);
  assert_int_equal(om_admission_inflight(a), 0);
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  assert_int_equal(om_admission_release(a, 1 * MS, NULL, NULL), OM_EINVAL);
  assert_int_equal(om_admission_inflight(a), 1); /* nothing changed */
  om_admission_free(a);
}

/* A request that arrives while waiters are being handed slots (from
 * inside the callback, when the loop accepts a new connection) must queue
 * behind them even though a slot is momentarily free. */
typedef struct {
  om_admission_t *a;
  om_admission_waiter_t *late;
  int rc;
  log_t lg;
} arrive_t;

static void arrive_cb(om_admission_waiter_t *w, int status, void *ud) {
  arrive_t *r = ud;
  log_cb(w, status, &r->lg);
  if (r->lg.n == 1) {
    /* One slot is still free here, and w[1] and w[2] are still waiting. */
    assert_int_equal(om_admission_acquire(r->a, NULL, NEVER, 0), OM_EOVERLOAD);
    r->rc = om_admission_acquire(r->a, r->late, NEVER, 0);
  }
}

static void newcomer_never_overtakes_queue(void **state) {
  om_admission_waiter_t w[3] = {{0}}, late = {0};
  arrive_t r = {.a = make(1, 8), .late = &late, .rc = 99, .lg = {.n = 0}};
  (void)state;
  assert_int_equal(om_admission_acquire(r.a, NULL, NEVER, 0), 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(om_admission_acquire(r.a, &w[i], NEVER, 0), 1);
  assert_int_equal(om_admission_set_limit(r.a, 3, 0, arrive_cb, &r), 0);
  assert_int_equal(r.rc, OM_ADMISSION_QUEUED);
  assert_int_equal(r.lg.n, 2);
  assert_ptr_equal(r.lg.w[0], &w[0]);
  assert_ptr_equal(r.lg.w[1], &w[1]);
  assert_int_equal(om_admission_inflight(r.a), 3);
  assert_int_equal(om_admission_queued(r.a), 2);
  /* Next slot: w[2] first, then the late one. */
  assert_int_equal(om_admission_release(r.a, 0, log_cb, &r.lg), 0);
  assert_ptr_equal(r.lg.w[2], &w[2]);
  assert_int_equal(om_admission_release(r.a, 0, log_cb, &r.lg), 0);
  assert_ptr_equal(r.lg.w[3], &late);
  om_admission_free(r.a);
}

/* Lowering the limit then releasing: inflight falls below the old limit
 * but not the new one, so the waiter keeps waiting. */
static void lowered_limit_holds_the_queue(void **state) {
  om_admission_t *a = make(2, 4);
  om_admission_waiter_t w = {0};
  log_t lg = {.n = 0};
  (void)state;
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  assert_int_equal(om_admission_acquire(a, &w, NEVER, 0), 1);
  assert_int_equal(om_admission_set_limit(a, 1, 0, log_cb, &lg), 0);
  assert_int_equal(om_admission_release(a, 0, log_cb, &lg), 0);
  assert_int_equal(lg.n, 0);
  assert_int_equal(om_admission_inflight(a), 1);
  assert_true(om_admission_waiter_queued(&w));
  assert_int_equal(om_admission_release(a, 0, log_cb, &lg), 0);
  assert_int_equal(lg.n, 1);
  assert_ptr_equal(lg.w[0], &w);
  om_admission_free(a);
}

static void expire_removes_and_never_admits(void **state) {
  om_admission_t *a = make(1, 8);
  om_admission_waiter_t w[4] = {{0}};
  log_t lg = {.n = 0};
  (void)state;
  assert_int_equal(om_admission_next_deadline(a), NEVER);
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  assert_int_equal(om_admission_acquire(a, &w[0], 300 * MS, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[1], 100 * MS, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[2], NEVER, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[3], 100 * MS, 0), 1);
  assert_int_equal(om_admission_next_deadline(a), 100 * MS);

  /* Nothing due yet. */
  assert_int_equal(om_admission_expire(a, 99 * MS, log_cb, &lg), 0);
  assert_int_equal(lg.n, 0);
  /* deadline <= now is due; equal deadlines in arrival order. */
  assert_int_equal(om_admission_expire(a, 100 * MS, log_cb, &lg), 2);
  assert_int_equal(lg.n, 2);
  assert_ptr_equal(lg.w[0], &w[1]);
  assert_ptr_equal(lg.w[1], &w[3]);
  assert_int_equal(lg.status[0], OM_EDEADLINE);
  assert_int_equal(lg.status[1], OM_EDEADLINE);
  assert_int_equal(om_admission_next_deadline(a), 300 * MS);
  assert_int_equal(om_admission_queued(a), 2);

  /* The expired ones are never admitted later. */
  assert_int_equal(om_admission_release(a, 150 * MS, log_cb, &lg), 0);
  assert_int_equal(lg.n, 3);
  assert_ptr_equal(lg.w[2], &w[0]);
  assert_int_equal(lg.status[2], 0);
  assert_int_equal(om_admission_release(a, 150 * MS, log_cb, &lg), 0);
  assert_ptr_equal(lg.w[3], &w[2]);
  assert_int_equal(lg.status[3], 0);
  assert_int_equal(om_admission_release(a, 150 * MS, log_cb, &lg), 0);
  assert_int_equal(lg.n, 4);
  assert_int_equal(om_admission_queued(a), 0);
  assert_int_equal(om_admission_next_deadline(a), NEVER);
  assert_int_equal(om_admission_expire(a, NEVER - 1, log_cb, &lg), 0);
  assert_int_equal(om_admission_expire(a, 0, NULL, NULL), OM_EINVAL);
  {
    om_admission_stats_t st;
    om_admission_stats(a, &st);
    assert_int_equal(st.expired, 2);
    assert_int_equal(st.admitted, 3);
  }
  om_admission_free(a);
}

static void release_fails_an_overdue_head(void **state) {
  /* The loop's timer has not fired yet, but the head's deadline passed:
   * release must not admit it. */
  om_admission_t *a = make(1, 8);
  om_admission_waiter_t w[3] = {{0}};
  log_t lg = {.n = 0};
  (void)state;
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  assert_int_equal(om_admission_acquire(a, &w[0], 10 * MS, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[1], 20 * MS, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[2], 50 * MS, 0), 1);
  assert_int_equal(om_admission_release(a, 20 * MS, log_cb, &lg), 0);
  assert_int_equal(lg.n, 3);
  assert_ptr_equal(lg.w[0], &w[0]);
  assert_int_equal(lg.status[0], OM_EDEADLINE);
  assert_ptr_equal(lg.w[1], &w[1]);
  assert_int_equal(lg.status[1], OM_EDEADLINE);
  assert_ptr_equal(lg.w[2], &w[2]);
  assert_int_equal(lg.status[2], 0);
  assert_int_equal(om_admission_inflight(a), 1);
  assert_int_equal(om_admission_next_deadline(a), NEVER);
  om_admission_free(a);
}

static void acquire_past_deadline_fails_fast(void **state) {
  om_admission_t *a = make(4, 4);
  om_admission_waiter_t w = {0};
  om_admission_stats_t st;
  (void)state;
  /* A slot is free, but the budget is gone: no request may start. */
  assert_int_equal(om_admission_acquire(a, &w, 5 * MS, 5 * MS), OM_EDEADLINE);
  assert_int_equal(om_admission_acquire(a, &w, 5 * MS, 6 * MS), OM_EDEADLINE);
  assert_false(om_admission_waiter_queued(&w));
  /* "Never" never expires, even at the end of the clock. */
  assert_int_equal(om_admission_acquire(a, &w, NEVER, NEVER), 0);
  om_admission_stats(a, &st);
  assert_int_equal(st.inflight, 1);
  assert_int_equal(st.expired, 2);
  assert_int_equal(st.admitted, 1);
  om_admission_free(a);
}

static void cancel_removes_in_place(void **state) {
  om_admission_t *a = make(1, 8);
  om_admission_t *b = make(1, 8);
  om_admission_waiter_t w[4] = {{0}}, lone = {0};
  log_t lg = {.n = 0};
  om_admission_stats_t st;
  (void)state;
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  assert_int_equal(om_admission_acquire(a, &w[0], 10 * MS, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[1], 5 * MS, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[2], NEVER, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[3], 20 * MS, 0), 1);
  assert_int_equal(om_admission_next_deadline(a), 5 * MS);

  assert_int_equal(om_admission_cancel(a, &w[1]), 0); /* the heap's root */
  assert_false(om_admission_waiter_queued(&w[1]));
  assert_int_equal(om_admission_next_deadline(a), 10 * MS);
  assert_int_equal(om_admission_cancel(a, &w[1]), OM_ENOTFOUND); /* twice */
  assert_int_equal(om_admission_cancel(a, &w[2]), 0); /* no deadline */
  assert_int_equal(om_admission_cancel(a, &lone), OM_ENOTFOUND);
  assert_int_equal(om_admission_cancel(b, &w[0]), OM_ENOTFOUND); /* not b's */
  assert_int_equal(om_admission_cancel(a, NULL), OM_ENOTFOUND);
  assert_int_equal(om_admission_queued(a), 2);

  /* A cancelled waiter may queue again, at the back. */
  assert_int_equal(om_admission_acquire(a, &w[1], NEVER, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[0], NEVER, 0), OM_ESTATE);
  for (int i = 0; i < 3; i++)
    assert_int_equal(om_admission_release(a, 0, log_cb, &lg), 0);
  assert_int_equal(lg.n, 3);
  assert_ptr_equal(lg.w[0], &w[0]);
  assert_ptr_equal(lg.w[1], &w[3]);
  assert_ptr_equal(lg.w[2], &w[1]);
  om_admission_stats(a, &st);
  assert_int_equal(st.cancelled, 2);
  assert_int_equal(st.queued, 0);
  om_admission_free(a);
  om_admission_free(b);
}

static void raising_limit_admits_queued(void **state) {
  om_admission_t *a = make(1, 8);
  om_admission_waiter_t w[5] = {{0}};
  log_t lg = {.n = 0};
  (void)state;
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  assert_int_equal(om_admission_acquire(a, &w[0], NEVER, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[1], 1 * MS, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[2], NEVER, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[3], NEVER, 0), 1);
  assert_int_equal(om_admission_acquire(a, &w[4], NEVER, 0), 1);

  assert_int_equal(om_admission_set_limit(a, 0, 0, log_cb, &lg), OM_EINVAL);
  assert_int_equal(om_admission_set_limit(a, 9, 0, NULL, NULL), OM_EINVAL);
  assert_int_equal(om_admission_limit(a), 1);

  /* 1 -> 4: three slots free; w[1] is overdue and fails instead. */
  assert_int_equal(om_admission_set_limit(a, 4, 2 * MS, log_cb, &lg), 0);
  assert_int_equal(lg.n, 4);
  assert_ptr_equal(lg.w[0], &w[0]);
  assert_int_equal(lg.status[0], 0);
  assert_ptr_equal(lg.w[1], &w[1]);
  assert_int_equal(lg.status[1], OM_EDEADLINE);
  assert_ptr_equal(lg.w[2], &w[2]);
  assert_ptr_equal(lg.w[3], &w[3]);
  assert_int_equal(om_admission_inflight(a), 4);
  assert_int_equal(om_admission_queued(a), 1);

  /* Lowering revokes nothing, admits nobody. */
  assert_int_equal(om_admission_set_limit(a, 2, 2 * MS, log_cb, &lg), 0);
  assert_int_equal(lg.n, 4);
  assert_int_equal(om_admission_inflight(a), 4);
  assert_int_equal(om_admission_release(a, 2 * MS, log_cb, &lg), 0);
  assert_int_equal(om_admission_release(a, 2 * MS, log_cb, &lg), 0);
  assert_int_equal(lg.n, 4); /* inflight 2 == limit 2 */
  assert_int_equal(om_admission_release(a, 2 * MS, log_cb, &lg), 0);
  assert_int_equal(lg.n, 5);
  assert_ptr_equal(lg.w[4], &w[4]);
  assert_int_equal(om_admission_inflight(a), 2);
  om_admission_free(a);
}

/* A request admitted from the queue that fails at once releases its slot
 * from inside the callback: the admission must stay consistent. */
typedef struct {
  om_admission_t *a;
  log_t lg;
} reent_t;

static void reent_cb(om_admission_waiter_t *w, int status, void *ud) {
  reent_t *r = ud;
  log_cb(w, status, &r->lg);
  if (status == 0 && w->data != NULL)
    assert_int_equal(om_admission_release(r->a, 0, reent_cb, r), 0);
}

static void callback_may_reenter(void **state) {
  reent_t r = {.a = make(1, 8), .lg = {.n = 0}};
  om_admission_waiter_t w[3] = {{0}};
  int fails = 1;
  (void)state;
  w[0].data = &fails; /* releases immediately */
  w[1].data = &fails; /* releases immediately */
  assert_int_equal(om_admission_acquire(r.a, NULL, NEVER, 0), 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(om_admission_acquire(r.a, &w[i], NEVER, 0), 1);
  assert_int_equal(om_admission_release(r.a, 0, reent_cb, &r), 0);
  assert_int_equal(r.lg.n, 3);
  for (int i = 0; i < 3; i++) {
    assert_ptr_equal(r.lg.w[i], &w[i]);
    assert_int_equal(r.lg.status[i], 0);
  }
  assert_int_equal(om_admission_inflight(r.a), 1); /* only w[2] holds one */
  assert_int_equal(om_admission_queued(r.a), 0);
  om_admission_free(r.a);
}

static void waiter_init_keeps_data(void **state) {
  om_admission_waiter_t w;
  int x;
  (void)state;
  memset(&w, 0xab, sizeof w);
  w.data = &x;
  om_admission_waiter_init(&w);
  assert_ptr_equal(w.data, &x);
  assert_false(om_admission_waiter_queued(&w));
}

/* Steady state allocates nothing: arm the allocator to fail every
 * allocation, then run the fast path and the queued path. */
static void no_allocation_per_request(void **state) {
  om_admission_t *a = make(2, 64);
  om_admission_waiter_t w[64] = {{0}};
  log_t lg = {.n = 0};
  (void)state;
  om_test_fail_alloc_after(0);
  for (int round = 0; round < 1000; round++) {
    assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
    assert_int_equal(om_admission_release(a, 0, log_cb, &lg), 0);
  }
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  for (int round = 0; round < 50; round++) {
    lg.n = 0;
    for (int i = 0; i < 64; i++)
      assert_int_equal(
          om_admission_acquire(a, &w[i], (uint64_t)(1000 + i % 7) * MS, 0), 1);
    assert_int_equal(om_admission_cancel(a, &w[10]), 0);
    for (int i = 0; i < 63; i++)
      assert_int_equal(om_admission_release(a, 1 * MS, log_cb, &lg), 0);
    assert_int_equal(lg.n, 63);
    assert_int_equal(om_admission_inflight(a), 2);
  }
  assert_int_equal(om_test_alloc_failures(), 0);
  om_test_alloc_reset();
  om_admission_free(a);
}

/* Property: under random queueing, cancelling and expiring, expiry order is
 * (deadline, arrival) order, next_deadline is the minimum, and no waiter is
 * both expired and admitted. A model tracks what must be queued. */
#define NW 512
static void heap_matches_model(void **state) {
  om_admission_t *a = make(1, NW);
  static om_admission_waiter_t w[NW];
  static uint64_t dl[NW], seq[NW];
  static int in_q[NW], outcome[NW];
  log_t lg;
  om_rng_t rng;
  uint64_t now = 0, next_seq = 0;
  (void)state;
  om_rng_seed(&rng, 42);
  memset(w, 0, sizeof w);
  memset(in_q, 0, sizeof in_q);
  assert_int_equal(om_admission_acquire(a, NULL, NEVER, 0), 0);
  for (int step = 0; step < 20000; step++) {
    uint32_t op = om_rng_below(&rng, 10);
    int i = (int)om_rng_below(&rng, NW);
    if (op < 5 && !in_q[i]) {
      /* Few distinct deadlines, to exercise the tie-break. */
      dl[i] = om_rng_below(&rng, 8) == 0
                  ? NEVER
                  : now + (uint64_t)(1 + om_rng_below(&rng, 20)) * MS;
      assert_int_equal(om_admission_acquire(a, &w[i], dl[i], now), 1);
      in_q[i] = 1;
      seq[i] = next_seq++;
    } else if (op < 7) {
      assert_int_equal(om_admission_cancel(a, &w[i]),
                       in_q[i] ? 0 : OM_ENOTFOUND);
      in_q[i] = 0;
    } else {
      uint64_t want_min = NEVER;
      int prev = -1;
      now += (uint64_t)om_rng_below(&rng, 3) * MS;
      for (int k = 0; k < NW; k++)
        if (in_q[k] && dl[k] < want_min)
          want_min = dl[k];
      assert_int_equal(om_admission_next_deadline(a), want_min);
      lg.n = 0;
      OM_ASSERT_CMP(om_admission_expire(a, now, log_cb, &lg), >=, 0);
      for (int k = 0; k < lg.n; k++) {
        int j = (int)(lg.w[k] - w);
        assert_true(in_q[j]);
        OM_ASSERT_CMP(dl[j], <=, now);
        assert_int_equal(lg.status[k], OM_EDEADLINE);
        if (prev >= 0) {
          OM_ASSERT_CMP(dl[prev], <=, dl[j]);
          if (dl[prev] == dl[j])
            OM_ASSERT_CMP(seq[prev], <, seq[j]);
        }
        prev = j;
        in_q[j] = 0;
      }
      for (int k = 0; k < NW; k++)
        if (in_q[k])
          OM_ASSERT_CMP(dl[k], >, now);
    }
    {
      uint32_t count = 0;
      for (int k = 0; k < NW; k++)
        count += (uint32_t)in_q[k];
      assert_int_equal(om_admission_queued(a), count);
    }
  }
  /* Drain by releases: FIFO by arrival, overdue ones fail, each once. */
  memset(outcome, 0, sizeof outcome);
  lg.n = 0;
  assert_int_equal(om_admission_set_limit(a, NW + 1, now, log_cb, &lg), 0);
  {
    int prev = -1;
    for (int k = 0; k < lg.n; k++) {
      int j = (int)(lg.w[k] - w);
      assert_true(in_q[j]);
      assert_int_equal(outcome[j], 0);
      outcome[j] = 1;
      if (prev >= 0)
        OM_ASSERT_CMP(seq[prev], <, seq[j]);
      prev = j;
    }
  }
  assert_int_equal(om_admission_queued(a), 0);
  om_admission_free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_rejects_bad_options),
      cmocka_unit_test(new_fault_injection),
      cmocka_unit_test(admits_up_to_limit_queues_then_rejects),
      cmocka_unit_test(no_queue_rejects_when_full),
      cmocka_unit_test(release_admits_head_in_fifo_order),
      cmocka_unit_test(newcomer_never_overtakes_queue),
      cmocka_unit_test(lowered_limit_holds_the_queue),
      cmocka_unit_test(expire_removes_and_never_admits),
      cmocka_unit_test(release_fails_an_overdue_head),
      cmocka_unit_test(acquire_past_deadline_fails_fast),
      cmocka_unit_test(cancel_removes_in_place),
      cmocka_unit_test(raising_limit_admits_queued),
      cmocka_unit_test(callback_may_reenter),
      cmocka_unit_test(waiter_init_keeps_data),
      cmocka_unit_test(no_allocation_per_request),
      cmocka_unit_test(heap_matches_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
