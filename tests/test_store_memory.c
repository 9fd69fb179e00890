/*
 * test_store_memory.c: the memory store on a real libuv loop. Leases are
 * driven by a fake monotonic clock (om_store_memory_expire after moving
 * it), plus one real-time test on the default clocks. The storage
 * contract's cases (tests/support/om_store_contract.c) run here as on the
 * Redis store; this file adds what only the memory store does: revisions
 * across store re-creation, 10,000 leases expiring in heap order (with the
 * memory each one costs), fault injection on every write, and close
 * freeing everything (ASan).
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
/* From <sanitizer/allocator_interface.h>, which Debian's gcc does not ship. */
size_t __sanitizer_get_current_allocated_bytes(void);
#else
#include <malloc.h>
#endif

#include <uv.h>

#include "om_errno.h"
#include "om_rng.h"
#include "om_snapshot.h"
#include "om_store_contract.h"
#include "om_store_memory.h"

/* ---- fixtures ---- */

typedef struct {
  uint64_t now_ms;
  uint64_t wall_us;
  uint64_t wall_step; /* added after each read */
} fake_clock_t;

static uint64_t fake_now(void *ud) {
  return ((fake_clock_t *)ud)->now_ms;
}

static uint64_t fake_wall(void *ud) {
  fake_clock_t *c = ud;
  uint64_t w = c->wall_us;
  c->wall_us += c->wall_step;
  return w;
}

typedef struct {
  uv_loop_t loop;
  fake_clock_t clk;
  om_store_t *st;
  int closed;
} fx_t;

static void fx_open(fx_t *f, uint64_t min_revision) {
  om_store_memory_opts_t o;
  memset(f, 0, sizeof *f);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  f->clk.now_ms = 1000000;
  f->clk.wall_us = 1700000000000000ull;
  f->clk.wall_step = 1;
  memset(&o, 0, sizeof o);
  o.now_ms = fake_now;
  o.realtime_us = fake_wall;
  o.clock_ud = &f->clk;
  o.min_revision = min_revision;
  assert_int_equal(om_store_memory_new(&f->loop, &o, &f->st), 0);
  assert_string_equal(om_store_name(f->st), "memory");
}

static void on_closed(void *ud) {
  (*(int *)ud)++;
}

static void fx_close(fx_t *f) {
  om_store_close(f->st, on_closed, &f->closed);
  assert_int_equal(f->closed, 0); /* never before close returns */
  assert_int_equal(uv_run(&f->loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(f->closed, 1);
  assert_int_equal(uv_loop_close(&f->loop), 0);
}

static om_store_wres_t put(om_store_t *st, const char *svc,
                           const om_instance_t *in) {
  om_store_wres_t w = {0};
  assert_int_equal(
      om_store_put_instance(st, svc, in, om_store_test_on_write, &w), 0);
  assert_int_equal(w.calls, 1);
  return w;
}

static om_store_wres_t put_simple(om_store_t *st, const char *svc,
                                  const char *id, uint64_t ttl) {
  om_instance_t in = om_store_test_inst(id, "http://h:80", ttl);
  return put(st, svc, &in);
}

typedef struct {
  int status;
  om_snapshot_t *snap; /* a reference, or NULL */
} sres_t;

static void on_snap(void *ud, int status, om_snapshot_t *snap) {
  sres_t *r = ud;
  r->status = status;
  r->snap = om_snapshot_ref(snap);
}

static sres_t get(om_store_t *st, const char *svc) {
  sres_t r = {99, NULL};
  assert_int_equal(om_store_snapshot(st, svc, on_snap, &r), 0);
  assert_int_not_equal(r.status, 99);
  return r;
}

static size_t count_of(om_store_t *st, const char *svc) {
  sres_t r = get(st, svc);
  size_t n = r.snap != NULL ? om_snapshot_count(r.snap) : 0;
  om_snapshot_unref(r.snap);
  return n;
}

static uint64_t rev_of(om_store_t *st, const char *svc) {
  sres_t r = get(st, svc);
  uint64_t v = r.snap != NULL ? om_snapshot_revision(r.snap) : 0;
  om_snapshot_unref(r.snap);
  return v;
}

/* A subscriber's transcript. */
#define LOG_MAX 256
typedef struct watch_s {
  int n;
  char service[LOG_MAX][32];
  uint64_t rev[LOG_MAX];
  size_t count[LOG_MAX];
  om_store_t *st;
  om_store_sub_t *sub;
  /* re-entrant behaviour, for the tests that want it */
  int unsubscribe_self_after;        /* >0: after that many events */
  struct watch_s *unsubscribe_other; /* on the first event */
  struct watch_s *subscribe_other;   /* on the first event, to "every" */
  const char *put_service;           /* on the first event: a nested put */
  int close_store;
} watch_t;

static void on_watch(void *ud, om_snapshot_t *snap) {
  watch_t *w = ud;
  assert_true(w->n < LOG_MAX);
  snprintf(w->service[w->n], sizeof w->service[w->n], "%s",
           om_snapshot_service(snap));
  w->rev[w->n] = om_snapshot_revision(snap);
  w->count[w->n] = om_snapshot_count(snap);
  w->n++;
  if (w->unsubscribe_self_after > 0 && w->n == w->unsubscribe_self_after)
    om_store_unsubscribe(w->st, w->sub);
  if (w->n == 1 && w->unsubscribe_other != NULL) {
    om_store_unsubscribe(w->st, w->unsubscribe_other->sub);
    w->unsubscribe_other->sub = NULL;
  }
  if (w->n == 1 && w->subscribe_other != NULL)
    assert_int_equal(om_store_subscribe(w->st, NULL, on_watch,
                                        w->subscribe_other,
                                        &w->subscribe_other->sub),
                     0);
  if (w->n == 1 && w->put_service != NULL) {
    om_store_wres_t r = put_simple(w->st, w->put_service, "nested", 5000);
    assert_int_equal(r.change, OM_STORE_CREATED);
  }
  if (w->n == 1 && w->close_store)
    om_store_close(w->st, NULL, NULL);
}

static void watch(om_store_t *st, const char *svc, watch_t *w) {
  w->st = st;
  assert_int_equal(om_store_subscribe(st, svc, on_watch, w, &w->sub), 0);
}

static void assert_increasing(const watch_t *w) {
  for (int i = 1; i < w->n; i++)
    if (strcmp(w->service[i], w->service[i - 1]) == 0 &&
        w->rev[i] <= w->rev[i - 1])
      fail_msg("%s: revision %llu after %llu", w->service[i],
               (unsigned long long)w->rev[i],
               (unsigned long long)w->rev[i - 1]);
}

/* ---- lifecycle ---- */

/*
 * What only the memory store promises beside the contract
 * (om_store_contract.c): the first revision is the wall clock, and a
 * renewal hands back the very snapshot object it had.
 */
static void renewal_keeps_the_snapshot(void **state) {
  fx_t f;
  om_instance_t in = om_store_test_inst("i1", "http://10.0.0.1:80", 5000);
  om_store_wres_t w;
  sres_t r, r2;
  (void)state;
  fx_open(&f, 0);
  w = put(f.st, "api", &in);
  assert_int_equal(w.change, OM_STORE_CREATED);
  assert_int_equal(w.revision, 1700000000000000ull);
  r = get(f.st, "api");
  w = put(f.st, "api", &in);
  assert_int_equal(w.change, OM_STORE_NOCHANGE);
  r2 = get(f.st, "api");
  assert_ptr_equal(r2.snap, r.snap);
  om_snapshot_unref(r2.snap);
  om_snapshot_unref(r.snap);
  fx_close(&f);
}

static void leases_expire_and_renew(void **state) {
  fx_t f;
  om_store_t *st;
  watch_t wa = {0};
  om_store_status_t ss;
  uint64_t r0;
  (void)state;
  fx_open(&f, 0);
  st = f.st;
  watch(st, "api", &wa);
  put_simple(st, "api", "a", 1000);
  put_simple(st, "api", "b", 2000);
  r0 = rev_of(st, "api");
  f.clk.now_ms += 900;
  assert_int_equal(om_store_memory_expire(st), 0);
  put_simple(st, "api", "a", 1000); /* renew at +900: now due at +1900 */
  f.clk.now_ms += 99;               /* +999 */
  assert_int_equal(om_store_memory_expire(st), 0);
  f.clk.now_ms += 1; /* +1000: the original deadline of a, renewed */
  assert_int_equal(om_store_memory_expire(st), 0);
  assert_int_equal(count_of(st, "api"), 2);
  assert_int_equal(rev_of(st, "api"), r0);
  f.clk.now_ms += 900; /* +1900 */
  assert_int_equal(om_store_memory_expire(st), 1);
  assert_int_equal(count_of(st, "api"), 1);
  assert_int_equal(wa.n, 3); /* create a, create b, expire a */
  assert_int_equal(wa.count[2], 1);
  assert_true(wa.rev[2] > r0);
  /* renew() uses the registered ttl */
  assert_int_equal(om_store_renew(st, "api", "b", NULL, NULL), 0);
  f.clk.now_ms += 1999; /* +3899 < +1900 + 2000 */
  assert_int_equal(om_store_memory_expire(st), 0);
  f.clk.now_ms += 1;
  assert_int_equal(om_store_memory_expire(st), 1);
  assert_int_equal(count_of(st, "api"), 0);
  assert_int_equal(wa.n, 4);
  assert_int_equal(wa.count[3], 0);
  assert_increasing(&wa);
  om_store_status(st, &ss);
  assert_int_equal(ss.expiries, 2);
  assert_int_equal(ss.instances, 0);
  assert_int_equal(ss.services, 1);
  assert_int_equal(om_store_memory_expire(NULL), 0);
  fx_close(&f);
}

/* One sweep: each service that lost instances gets exactly one revision. */
static void one_revision_per_sweep(void **state) {
  fx_t f;
  om_store_t *st;
  watch_t all = {0};
  char id[16];
  uint64_t ra, rb;
  (void)state;
  fx_open(&f, 0);
  st = f.st;
  for (int i = 0; i < 5; i++) {
    snprintf(id, sizeof id, "a%d", i);
    put_simple(st, "a", id, 1000 + (uint64_t)i * 10);
  }
  for (int i = 0; i < 3; i++) {
    snprintf(id, sizeof id, "b%d", i);
    put_simple(st, "b", id, 1000);
  }
  put_simple(st, "b", "stays", 60000);
  ra = rev_of(st, "a");
  rb = rev_of(st, "b");
  watch(st, NULL, &all);
  f.clk.now_ms += 5000;
  assert_int_equal(om_store_memory_expire(st), 8);
  assert_int_equal(all.n, 2);
  assert_string_equal(all.service[0], "a"); /* a0 was first to expire */
  assert_string_equal(all.service[1], "b");
  assert_int_equal(all.count[0], 0);
  assert_int_equal(all.count[1], 1);
  assert_true(all.rev[0] > ra);
  assert_true(all.rev[1] > rb);
  assert_true(all.rev[1] > all.rev[0]);
  assert_int_equal(rev_of(st, "a"), all.rev[0]);
  fx_close(&f);
}

/* ---- revisions ---- */

static void revisions_never_go_backwards(void **state) {
  fx_t f;
  uint64_t last = 0, first_b;
  watch_t all = {0};
  (void)state;
  /* frozen wall clock: revisions still strictly increase (last + 1) */
  fx_open(&f, 0);
  f.clk.wall_step = 0;
  watch(f.st, NULL, &all);
  for (int i = 0; i < 20; i++) {
    char id[8];
    om_store_wres_t w;
    snprintf(id, sizeof id, "i%d", i);
    w = put_simple(f.st, i % 2 ? "odd" : "even", id, 5000);
    assert_true(w.revision > last);
    last = w.revision;
  }
  {
    om_store_wres_t w = {0};
    assert_int_equal(om_store_config_put(f.st, "cfg", "application/json", "{}",
                                         2, om_store_test_on_write, &w),
                     0);
    assert_true(w.revision > last); /* one counter for everything */
    last = w.revision;
  }
  assert_int_equal(all.n, 20);
  assert_increasing(&all);
  fx_close(&f);

  /* a restarted store on a clock that moved on issues higher revisions,
   * even though the old one ran ahead of the clock (frozen above) */
  fx_open(&f, 0);
  f.clk.wall_us = 1700000000000000ull;
  f.clk.wall_step = 1;
  for (int i = 0; i < 50; i++) {
    char id[8];
    snprintf(id, sizeof id, "i%d", i);
    last = put_simple(f.st, "api", id, 5000).revision;
  }
  {
    uint64_t wall = f.clk.wall_us;
    fx_close(&f);
    fx_open(&f, 0);
    f.clk.wall_us = wall + 1000; /* the restart took a millisecond */
  }
  first_b = put_simple(f.st, "api", "x", 5000).revision;
  assert_true(first_b > last);
  fx_close(&f);

  /* with the clock stepped back, min_revision still holds the line */
  fx_open(&f, last);
  f.clk.wall_us = 1;
  first_b = put_simple(f.st, "api", "x", 5000).revision;
  assert_int_equal(first_b, last + 1);
  fx_close(&f);
}

static void revisions_on_the_real_clock(void **state) {
  uv_loop_t loop;
  om_store_t *st;
  uint64_t last = 0, first;
  struct timespec ts, pause = {0, 2000000};
  int closed = 0;
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(om_store_memory_new(&loop, NULL, &st), 0);
  for (int i = 0; i < 10; i++) {
    char id[8];
    snprintf(id, sizeof id, "i%d", i);
    last = put_simple(st, "api", id, 5000).revision;
  }
  om_store_close(st, on_closed, &closed);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(closed, 1);
  nanosleep(&pause, NULL);
  assert_int_equal(om_store_memory_new(&loop, NULL, &st), 0);
  first = put_simple(st, "api", "x", 5000).revision;
  assert_true(first > last);
  clock_gettime(CLOCK_REALTIME, &ts);
  /* revisions are wall-clock microseconds */
  OM_ASSERT_NEAR((double)first,
                 (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3, 1e7);
  om_store_close(st, on_closed, &closed);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(closed, 2);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* ---- subscribers ---- */

/* ---- scale: 10,000 leases ---- */

static size_t heap_bytes(void) {
#if defined(__SANITIZE_ADDRESS__)
  return __sanitizer_get_current_allocated_bytes();
#else
  return mallinfo2().uordblks;
#endif
}

#define N_BIG 10000

typedef struct {
  char id[16];
  char svc[8];
  uint64_t due;
  int alive;
} big_t;

static void ten_thousand_leases_expire_in_order(void **state) {
  static big_t b[N_BIG];
  static const char *svcs[4] = {"alpha", "beta", "gamma", "delta"};
  fx_t f;
  om_store_t *st;
  om_rng_t rng;
  om_kv_t kv[2] = {{"version", "1.2.3"}, {"track", "stable"}};
  size_t before, after, alive = N_BIG, sweeps = 0;
  uint64_t t0, last_due = 0;
  om_store_status_t ss;
  (void)state;
  fx_open(&f, 0);
  st = f.st;
  om_rng_seed(&rng, 10000);
  t0 = f.clk.now_ms;
  before = heap_bytes();
  for (int i = 0; i < N_BIG; i++) {
    om_instance_t in;
    char url[48];
    snprintf(b[i].id, sizeof b[i].id, "inst-%05d", i);
    snprintf(b[i].svc, sizeof b[i].svc, "%s", svcs[i % 4]);
    snprintf(url, sizeof url, "http://10.%d.%d.%d:8080", (i >> 16) & 255,
             (i >> 8) & 255, i & 255);
    in = om_store_test_inst(b[i].id, url, 1000 + om_rng_below(&rng, 100000));
    in.zone = "eu-west-1a";
    in.metadata = kv;
    in.n_metadata = 2;
    b[i].due = t0 + in.ttl_ms;
    b[i].alive = 1;
    assert_int_equal(put(st, b[i].svc, &in).change, OM_STORE_CREATED);
  }
  after = heap_bytes();
  OM_TEST_NOTE("memory per registered instance: %.0f bytes (%d instances, "
               "4 services, zone + 2 metadata entries)",
               (double)(after - before) / N_BIG, N_BIG);
  assert_true(after > before);
  assert_true((after - before) / N_BIG < 1024);
  om_store_status(st, &ss);
  assert_int_equal(ss.instances, N_BIG);
  assert_int_equal(ss.services, 4);

  /* walk the clock forward in uneven steps; half-way, renew 1,000 leases */
  while (alive > 0) {
    size_t due_now = 0, removed;
    f.clk.now_ms += 1 + om_rng_below(&rng, 3000);
    if (sweeps == 15)
      for (int k = 0; k < 1000; k++) {
        int i = (int)om_rng_below(&rng, N_BIG);
        const om_instance_t *cur;
        sres_t r;
        if (!b[i].alive || b[i].due <= f.clk.now_ms)
          continue;
        r = get(st, b[i].svc);
        cur = om_snapshot_find(r.snap, b[i].id);
        assert_non_null(cur);
        assert_int_equal(om_store_renew(st, b[i].svc, b[i].id, NULL, NULL), 0);
        b[i].due = f.clk.now_ms + cur->ttl_ms;
        om_snapshot_unref(r.snap);
      }
    for (int i = 0; i < N_BIG; i++)
      if (b[i].alive && b[i].due <= f.clk.now_ms) {
        b[i].alive = 0;
        due_now++;
        if (b[i].due > last_due)
          last_due = b[i].due;
      }
    removed = om_store_memory_expire(st);
    assert_int_equal(removed, due_now);
    alive -= removed;
    sweeps++;
    if (sweeps % 8 == 0 || alive == 0) /* nothing early, nothing late */
      for (int s = 0; s < 4; s++) {
        sres_t r = get(st, svcs[s]);
        size_t want = 0;
        for (int i = s; i < N_BIG; i += 4) {
          const om_instance_t *x = om_snapshot_find(r.snap, b[i].id);
          assert_int_equal(x != NULL, b[i].alive);
          want += (size_t)b[i].alive;
        }
        assert_int_equal(om_snapshot_count(r.snap), want);
        om_snapshot_unref(r.snap);
      }
  }
  om_store_status(st, &ss);
  assert_int_equal(ss.expiries, N_BIG);
  assert_int_equal(ss.instances, 0);
  assert_true(last_due > t0 + 100000); /* the renewed ones ran longer */
  fx_close(&f);
}

/* ---- configuration documents ---- */

typedef struct {
  int status;
  om_config_doc_t *doc;
} cres_t;

static void on_cfg(void *ud, int status, om_config_doc_t *doc) {
  cres_t *r = ud;
  r->status = status;
  r->doc = om_config_doc_ref(doc);
}

typedef struct {
  int n;
  char name[16][32];
  uint64_t rev[16];
  om_store_t *st;
  om_store_sub_t *sub;
  int unsubscribe_self;
} cwatch_t;

static void on_cfg_watch(void *ud, om_config_doc_t *doc) {
  cwatch_t *w = ud;
  assert_true(w->n < 16);
  snprintf(w->name[w->n], sizeof w->name[w->n], "%s", doc->name);
  w->rev[w->n] = doc->revision;
  w->n++;
  if (w->unsubscribe_self)
    om_store_unsubscribe(w->st, w->sub);
}

/* The documents and change names every store shares (om_store.c). */
static void shared_helpers(void **state) {
  om_config_doc_t *d = om_config_doc_new("n", "t", NULL, 0, 5);
  (void)state;
  assert_non_null(d);
  assert_int_equal(d->len, 0);
  assert_string_equal(d->body, "");
  assert_ptr_equal(om_config_doc_ref(d), d);
  om_config_doc_unref(d);
  om_config_doc_unref(d);
  om_config_doc_unref(NULL);
  assert_null(om_config_doc_new(NULL, "t", "", 0, 1));
  assert_null(om_config_doc_new("n", "t", NULL, 1, 1));
  om_test_fail_alloc_after(0);
  assert_null(om_config_doc_new("n", "t", "x", 1, 1));
  om_test_alloc_reset();
  assert_string_equal(om_store_change_name(OM_STORE_EXPIRED), "expired");
  assert_string_equal(om_store_change_name(OM_STORE_NOCHANGE), "nochange");
  assert_string_equal(om_store_change_name((om_store_change_t)99), "?");
}

typedef struct {
  int calls;
  size_t n;
  char names[4][16];
  size_t counts[4];
  uint64_t revs[4];
} list_t;

static void on_list(void *ud, int status, const om_service_rev_t *sv,
                    size_t n) {
  list_t *l = ud;
  l->calls++;
  assert_int_equal(status, 0);
  assert_true(n <= 4);
  l->n = n;
  for (size_t i = 0; i < n; i++) {
    snprintf(l->names[i], sizeof l->names[i], "%s", sv[i].service);
    l->counts[i] = sv[i].instances;
    l->revs[i] = sv[i].revision;
  }
}

/* ---- fault injection: a failed write changes nothing ---- */

enum {
  OP_CREATE_SERVICE,
  OP_CREATE_INSTANCE,
  OP_UPDATE,
  OP_DELETE,
  OP_CONFIG_NEW,
  OP_CONFIG_UPDATE,
  OP_SUBSCRIBE,
  OP_SUBSCRIBE_CONFIG,
  OP_COUNT
};

static int do_op(om_store_t *st, int op, om_store_wres_t *w, watch_t *subw) {
  om_instance_t in = om_store_test_inst("1", "http://h:80", 5000);
  om_kv_t kv[2] = {{"b", "2"}, {"a", "1"}};
  in.metadata = kv;
  in.n_metadata = 2;
  in.zone = "z";
  switch (op) {
  case OP_CREATE_SERVICE:
    return om_store_put_instance(st, "b", &in, om_store_test_on_write, w);
  case OP_CREATE_INSTANCE:
    in.id = "2";
    return om_store_put_instance(st, "a", &in, om_store_test_on_write, w);
  case OP_UPDATE:
    in.weight = 3;
    return om_store_put_instance(st, "a", &in, om_store_test_on_write, w);
  case OP_DELETE:
    return om_store_delete_instance(st, "a", "1", om_store_test_on_write, w);
  case OP_CONFIG_NEW:
    return om_store_config_put(st, "new", "a/b", "{}", 2,
                               om_store_test_on_write, w);
  case OP_CONFIG_UPDATE:
    return om_store_config_put(st, "cfg", "a/b", "{\"x\":1}", 7,
                               om_store_test_on_write, w);
  case OP_SUBSCRIBE:
    subw->st = st;
    return om_store_subscribe(st, "later", on_watch, subw, &subw->sub);
  case OP_SUBSCRIBE_CONFIG:
    return om_store_subscribe_config(st, "later", on_cfg_watch, subw,
                                     &subw->sub);
  }
  return OM_EINVAL;
}

static void fault_injection_on_writes(void **state) {
  (void)state;
  for (int op = 0; op < OP_COUNT; op++) {
    for (long n = 0;; n++) {
      fx_t f;
      watch_t all = {0}, subw = {0};
      om_store_wres_t w = {0};
      sres_t a0, a1, b1;
      cres_t c0 = {0}, c1 = {0};
      om_store_status_t s0, s1;
      list_t l = {0};
      int rc;
      fx_open(&f, 0);
      put_simple(f.st, "a", "1", 5000);
      assert_int_equal(
          om_store_config_put(f.st, "cfg", "a/b", "{}", 2, NULL, NULL), 0);
      watch(f.st, NULL, &all);
      a0 = get(f.st, "a");
      om_store_config_get(f.st, "cfg", on_cfg, &c0);
      om_store_status(f.st, &s0);

      om_test_fail_alloc_after(n);
      rc = do_op(f.st, op, &w, &subw);
      om_test_alloc_reset();
      if (rc == 0) {
        assert_true(op >= OP_SUBSCRIBE || w.calls == 1);
        om_snapshot_unref(a0.snap);
        om_config_doc_unref(c0.doc);
        fx_close(&f);
        break;
      }
      assert_int_equal(rc, OM_ENOMEM);
      assert_int_equal(w.calls, 0);
      assert_int_equal(all.n, 0);
      a1 = get(f.st, "a");
      b1 = get(f.st, "b");
      assert_ptr_equal(a1.snap, a0.snap); /* the previous snapshot stays */
      assert_int_equal(b1.status, OM_ENOTFOUND);
      om_store_config_get(f.st, "cfg", on_cfg, &c1);
      assert_ptr_equal(c1.doc, c0.doc);
      om_store_status(f.st, &s1);
      assert_memory_equal(&s0, &s1, sizeof s0);
      assert_int_equal(om_store_list_services(f.st, on_list, &l), 0);
      assert_int_equal(l.n, 1);
      om_snapshot_unref(a0.snap);
      om_snapshot_unref(a1.snap);
      om_config_doc_unref(c0.doc);
      om_config_doc_unref(c1.doc);
      /* and the store still works */
      assert_int_equal(do_op(f.st, op, &w, &subw), 0);
      fx_close(&f);
    }
  }
}

static void fault_injection_in_the_sweep(void **state) {
  fx_t f;
  watch_t wa = {0};
  (void)state;
  fx_open(&f, 0);
  put_simple(f.st, "a", "x", 1000);
  put_simple(f.st, "a", "y", 1000);
  watch(f.st, "a", &wa);
  f.clk.now_ms += 1000;
  for (long n = 0;; n++) {
    size_t removed;
    om_test_fail_alloc_after(n);
    removed = om_store_memory_expire(f.st);
    om_test_alloc_reset();
    if (removed != 0) {
      assert_int_equal(removed, 2);
      break;
    }
    /* the leases stayed, nothing was delivered */
    assert_int_equal(count_of(f.st, "a"), 2);
    assert_int_equal(wa.n, 0);
  }
  assert_int_equal(wa.n, 1);
  assert_int_equal(count_of(f.st, "a"), 0);
  fx_close(&f);
}

/* ---- real time: a 1 s lease on the default clocks ---- */

typedef struct {
  uint64_t removed_ns;
  int events;
} rt_t;

static void rt_watch(void *ud, om_snapshot_t *snap) {
  rt_t *r = ud;
  r->events++;
  if (om_snapshot_count(snap) == 0)
    r->removed_ns = uv_hrtime();
}

static void real_time_expiry(void **state) {
  uv_loop_t loop;
  om_store_t *st;
  om_store_sub_t *sub;
  rt_t r = {0};
  uint64_t t0;
  double ms;
  int closed = 0;
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(om_store_memory_new(&loop, NULL, &st), 0);
  assert_int_equal(om_store_subscribe(st, "rt", rt_watch, &r, &sub), 0);
  uv_update_time(&loop);
  t0 = uv_hrtime();
  put_simple(st, "rt", "one", OM_TTL_MIN_MS);
  /* the lease timer is the only thing keeping the loop alive */
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(r.events, 2);
  ms = (double)(r.removed_ns - t0) / 1e6;
  OM_TEST_NOTE("a 1000 ms lease was removed after %.1f ms", ms);
  assert_true(ms >= 998.0); /* not before it expired (ms clock) */
  assert_true(ms < 2000.0); /* within 1 s after it expired */
  om_store_unsubscribe(st, sub);
  om_store_close(st, on_closed, &closed);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(closed, 1);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* The contract suite's memory store: real clocks, default limits. */
static om_store_t *open_memory(uv_loop_t *loop) {
  om_store_t *st = NULL;
  assert_int_equal(om_store_memory_new(loop, NULL, &st), 0);
  return st;
}

static om_store_backend_t memory_backend = {"memory", open_memory, 1};

static void on_list_count(void *ud, int status, const om_service_rev_t *svcs,
                          size_t n) {
  (void)svcs;
  *(size_t *)ud = status == 0 ? n : SIZE_MAX;
}

/* 50,000 services that each had an instance: none is collected before
 * idle_ms has passed since it became empty, nor one keep claims, nor one
 * with an instance; then the rest are, in name order, and a service that
 * comes back gets a revision above the one it had. */
static void empty_services_are_collected(void **state) {
  enum { N = 50000 };
  fx_t f;
  char name[16];
  om_store_wres_t w;
  uint64_t rev_before = 0;
  size_t n = 0, listed = 0;
  om_store_gone_t g = {0, "", 1};
  (void)state;
  fx_open(&f, 0);
  for (unsigned i = 0; i < N; i++) {
    snprintf(name, sizeof name, "s%05u", i);
    put_simple(f.st, name, "i1", 600000);
    if (i == 1 || i == 2)
      continue; /* s00002 keeps its instance; s00001 is deleted below */
    w = (om_store_wres_t){0};
    assert_int_equal(
        om_store_delete_instance(f.st, name, "i1", om_store_test_on_write, &w),
        0);
    OM_ASSERT_CMP(w.status, ==, 0);
  }
  w = (om_store_wres_t){0};
  assert_int_equal(om_store_delete_instance(f.st, "s00001", "i1",
                                            om_store_test_on_write, &w),
                   0);
  rev_before = w.revision;
  f.clk.now_ms += 59999;
  assert_int_equal(om_store_collect_empty(f.st, 60000, om_store_test_keep_seven,
                                          om_store_test_on_gone, &g, &n),
                   0);
  OM_ASSERT_CMP(n, ==, 0);
  f.clk.now_ms += 1;
  assert_int_equal(om_store_collect_empty(f.st, 60000, om_store_test_keep_seven,
                                          om_store_test_on_gone, &g, &n),
                   0);
  OM_ASSERT_CMP(n, ==, N - 2); /* not s00002 (an instance), not s00007 */
  OM_ASSERT_CMP(g.n, ==, N - 2);
  OM_ASSERT_CMP(g.ordered, ==, 1);
  assert_int_equal(om_store_list_services(f.st, on_list_count, &listed), 0);
  OM_ASSERT_CMP(listed, ==, 2);
  {
    om_store_status_t st;
    om_store_status(f.st, &st);
    OM_ASSERT_CMP(st.services, ==, 2);
    OM_ASSERT_CMP(st.collected, ==, N - 2);
  }
  w = put_simple(f.st, "s00001", "i1", 600000);
  assert_int_equal(w.change, OM_STORE_CREATED);
  OM_ASSERT_CMP(w.revision, >, rev_before);
  /* without the claim, s00007 goes too; s00001 and s00002 have instances */
  assert_int_equal(om_store_collect_empty(f.st, 60000, NULL, NULL, NULL, &n),
                   0);
  OM_ASSERT_CMP(n, ==, 1); /* s00007, no longer claimed */
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      OM_STORE_CONTRACT_TESTS(&memory_backend),
      cmocka_unit_test(renewal_keeps_the_snapshot),
      cmocka_unit_test(leases_expire_and_renew),
      cmocka_unit_test(one_revision_per_sweep),
      cmocka_unit_test(revisions_never_go_backwards),
      cmocka_unit_test(revisions_on_the_real_clock),
      cmocka_unit_test(ten_thousand_leases_expire_in_order),
      cmocka_unit_test(shared_helpers),
      cmocka_unit_test(fault_injection_on_writes),
      cmocka_unit_test(fault_injection_in_the_sweep),
      cmocka_unit_test(real_time_expiry),
      cmocka_unit_test(empty_services_are_collected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
