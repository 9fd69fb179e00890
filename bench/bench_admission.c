/*
 * bench_admission.c: the cost of admission on the call path.
 *
 *   admission_acquire_release ns   uncontended acquire + release pair
 *                                  (target <= 50 ns, no allocation)
 *   admission_queue_cycle ns       pool full: queue a waiter with a
 *                                  deadline (heap insert), release admits it
 *                                  (heap remove, callback)
 *   deadline_attempt_timeout ns    one attempt_timeout on a live deadline
 *   baseline_call_pair ns          two empty out-of-line calls through
 *                                  function pointers: the floor under the
 *                                  first figure, measured in the same run
 *
 * Each figure is the median of ROUNDS rounds after a warm-up round.
 */
#include "om_bench.h"

#include "om_admission.h"
#include "om_deadline.h"

#define ROUNDS 9
#define ITERS 2000000
#define QUEUE_DEPTH 64

static void count_cb(om_admission_waiter_t *w, int status, void *ud) {
  (void)w;
  *(uint64_t *)ud += (uint64_t)(status == 0);
}

static int noop_a(void *p, uint64_t x) {
  OM_BENCH_SINK(p);
  OM_BENCH_SINK(x);
  return 0;
}

static int noop_b(void *p, uint64_t x) {
  OM_BENCH_SINK(p);
  OM_BENCH_SINK(x);
  return 0;
}

/* volatile: the compiler may not inline the calls through these. */
static int (*volatile call_a)(void *, uint64_t) = noop_a;
static int (*volatile call_b)(void *, uint64_t) = noop_b;

static double round_baseline(void) {
  int x = 0;
  uint64_t t0 = om_bench_now_ns();
  for (uint64_t i = 0; i < ITERS; i++) {
    x += call_a(&x, i);
    x += call_b(&x, i);
  }
  OM_BENCH_SINK(x);
  return (double)(om_bench_now_ns() - t0) / ITERS;
}

static double round_acquire_release(om_admission_t *a) {
  uint64_t admitted = 0;
  int rc = 0;
  uint64_t t0 = om_bench_now_ns();
  for (uint64_t i = 0; i < ITERS; i++) {
    rc |= om_admission_acquire(a, NULL, OM_DEADLINE_NEVER, i);
    rc |= om_admission_release(a, i, count_cb, &admitted);
  }
  OM_BENCH_SINK(rc);
  if (rc != 0 || admitted != 0) {
    fprintf(stderr, "bench_admission: unexpected result %d\n", rc);
    exit(1);
  }
  return (double)(om_bench_now_ns() - t0) / ITERS;
}

/* The pool is full (1 in flight) and QUEUE_DEPTH-1 waiters wait with
 * staggered deadlines; each cycle queues one more and releases one, which
 * admits the head: a heap of realistic size on both sides. */
static double round_queue_cycle(om_admission_t *a, om_admission_waiter_t *w) {
  uint64_t admitted = 0;
  uint64_t t0;
  const uint64_t base = 1000000000000ull;
  for (int k = 0; k < QUEUE_DEPTH - 1; k++)
    if (om_admission_acquire(a, &w[k], base + (uint64_t)k * 7919, 0) !=
        OM_ADMISSION_QUEUED)
      exit(1);
  t0 = om_bench_now_ns();
  for (uint64_t i = 0; i < ITERS; i++) {
    uint64_t k = (i + QUEUE_DEPTH - 1) % QUEUE_DEPTH;
    /* The slot k is free again: it was admitted QUEUE_DEPTH cycles ago. */
    om_admission_acquire(a, &w[k], base + ((i * 7919) % 1000000), 0);
    om_admission_release(a, 0, count_cb, &admitted);
  }
  OM_BENCH_SINK(admitted);
  if (admitted != ITERS || om_admission_inflight(a) != 1)
    exit(1);
  /* Drain so the next round starts the same way. */
  {
    double ns = (double)(om_bench_now_ns() - t0) / ITERS;
    while (om_admission_queued(a) > 0)
      om_admission_release(a, 0, count_cb, &admitted);
    return ns;
  }
}

static double round_attempt_timeout(void) {
  om_deadline_t d = om_deadline_after(1000, 5000000000ull);
  uint64_t acc = 0;
  uint64_t t0 = om_bench_now_ns();
  for (uint64_t i = 0; i < ITERS; i++) {
    uint64_t now = 1000 + i * 1000;
    OM_BENCH_SINK(d.at_ns);
    acc += om_deadline_attempt_timeout(d, now, 250000000ull);
    OM_BENCH_SINK(acc);
  }
  return (double)(om_bench_now_ns() - t0) / ITERS;
}

static void report(const char *name, double (*fn)(void *), void *arg) {
  double v[ROUNDS];
  fn(arg); /* warm-up */
  for (int r = 0; r < ROUNDS; r++)
    v[r] = fn(arg);
  om_bench_report(name, om_bench_median(v, ROUNDS), "ns");
}

typedef struct {
  om_admission_t *a;
  om_admission_waiter_t *w;
} ctx_t;

static double run_baseline(void *p) {
  (void)p;
  return round_baseline();
}
static double run_acquire_release(void *p) {
  return round_acquire_release(((ctx_t *)p)->a);
}
static double run_queue_cycle(void *p) {
  return round_queue_cycle(((ctx_t *)p)->a, ((ctx_t *)p)->w);
}
static double run_attempt_timeout(void *p) {
  (void)p;
  return round_attempt_timeout();
}

int main(void) {
  static om_admission_waiter_t w[QUEUE_DEPTH];
  om_admission_opts_t o = {64, 0};
  ctx_t c = {NULL, w};

  if (om_admission_new(&o, &c.a) != 0)
    return 1;
  report("admission_acquire_release", run_acquire_release, &c);
  om_admission_free(c.a);

  o.max_inflight = 1;
  o.max_queue = QUEUE_DEPTH;
  if (om_admission_new(&o, &c.a) != 0 ||
      om_admission_acquire(c.a, NULL, OM_DEADLINE_NEVER, 0) != 0)
    return 1;
  report("admission_queue_cycle", run_queue_cycle, &c);
  om_admission_free(c.a);

  report("deadline_attempt_timeout", run_attempt_timeout, NULL);
  report("baseline_call_pair", run_baseline, NULL);
  return 0;
}
