/*
 * om_store_contract.c: the storage contract's cases (om_store_contract.h).
 *
 * Every outcome is waited for on the loop until its callback has run (or
 * 3 s pass, which fails the case); an assertion that something did NOT
 * happen is made after a later change has been seen, since every store
 * delivers in order.
 */
#include "om_store_contract.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "om_errno.h"
#include "om_snapshot.h"

#define WAIT_MS 3000

/* ---- the loop ---- */

static void on_deadline(uv_timer_t *t) {
  *(int *)t->data = 1;
}

/* Run loop until *counter >= want or WAIT_MS pass; fail on the latter. */
static void wait_for(uv_loop_t *loop, const int *counter, int want,
                     const char *what) {
  uv_timer_t t;
  int expired = 0;
  if (*counter >= want)
    return;
  uv_timer_init(loop, &t);
  t.data = &expired;
  uv_timer_start(&t, on_deadline, WAIT_MS, 0);
  while (*counter < want && !expired)
    uv_run(loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  if (*counter < want)
    fail_msg("%s: %d, want %d", what, *counter, want);
}

typedef struct {
  const om_store_backend_t *b;
  uv_loop_t loop;
  om_store_t *st;
  int closed;
} fx_t;

static void fx_open(fx_t *f, void **state) {
  memset(f, 0, sizeof *f);
  f->b = *state;
  assert_int_equal(uv_loop_init(&f->loop), 0);
  f->st = f->b->open(&f->loop);
  assert_non_null(f->st);
  assert_string_equal(om_store_name(f->st), f->b->name);
}

static void on_closed(void *ud) {
  (*(int *)ud)++;
}

/* Close (unless a case did) and wait for done; the loop must end empty. */
static void fx_close(fx_t *f) {
  if (f->st != NULL) {
    om_store_close(f->st, on_closed, &f->closed);
    OM_ASSERT_CMP(f->closed, ==, 0); /* never before close returns */
  }
  wait_for(&f->loop, &f->closed, 1, "close done");
  uv_run(&f->loop, UV_RUN_NOWAIT);
  assert_int_equal(uv_loop_close(&f->loop), 0);
}

/* ---- operations, waited for ---- */

void om_store_test_on_write(void *ud, int status, om_store_change_t change,
                            uint64_t revision) {
  om_store_wres_t *w = ud;
  w->calls++;
  w->status = status;
  w->change = change;
  w->revision = revision;
}

void om_store_test_on_gone(void *ud, const char *service) {
  om_store_gone_t *g = ud;
  if (g->n > 0 && strcmp(g->last, service) >= 0)
    g->ordered = 0;
  snprintf(g->last, sizeof g->last, "%s", service);
  g->n++;
}

int om_store_test_keep_seven(void *ud, const char *service) {
  (void)ud;
  return strcmp(service, "s00007") == 0;
}

om_instance_t om_store_test_inst(const char *id, const char *url,
                                 uint64_t ttl) {
  om_instance_t in;
  memset(&in, 0, sizeof in);
  in.id = (char *)id;
  in.url = (char *)url;
  in.weight = 1.0;
  in.ttl_ms = ttl;
  return in;
}

static om_store_wres_t put(fx_t *f, const char *svc, const om_instance_t *in) {
  om_store_wres_t w = {0};
  assert_int_equal(
      om_store_put_instance(f->st, svc, in, om_store_test_on_write, &w), 0);
  wait_for(&f->loop, &w.calls, 1, "put callback");
  assert_int_equal(w.status, 0);
  return w;
}

static om_store_wres_t put_simple(fx_t *f, const char *svc, const char *id,
                                  uint64_t ttl) {
  om_instance_t in = om_store_test_inst(id, "http://h:80", ttl);
  return put(f, svc, &in);
}

static om_store_wres_t renew(fx_t *f, const char *svc, const char *id) {
  om_store_wres_t w = {0};
  assert_int_equal(om_store_renew(f->st, svc, id, om_store_test_on_write, &w),
                   0);
  wait_for(&f->loop, &w.calls, 1, "renew callback");
  return w;
}

static om_store_wres_t del(fx_t *f, const char *svc, const char *id) {
  om_store_wres_t w = {0};
  assert_int_equal(
      om_store_delete_instance(f->st, svc, id, om_store_test_on_write, &w), 0);
  wait_for(&f->loop, &w.calls, 1, "delete callback");
  return w;
}

typedef struct {
  int calls, status;
  om_snapshot_t *snap; /* a reference, or NULL */
} sres_t;

static void on_snap(void *ud, int status, om_snapshot_t *snap) {
  sres_t *r = ud;
  r->calls++;
  r->status = status;
  r->snap = om_snapshot_ref(snap);
}

static sres_t get(fx_t *f, const char *svc) {
  sres_t r = {0};
  assert_int_equal(om_store_snapshot(f->st, svc, on_snap, &r), 0);
  wait_for(&f->loop, &r.calls, 1, "snapshot callback");
  return r;
}

static size_t count_of(fx_t *f, const char *svc) {
  sres_t r = get(f, svc);
  size_t n = r.snap != NULL ? om_snapshot_count(r.snap) : 0;
  om_snapshot_unref(r.snap);
  return n;
}

static uint64_t rev_of(fx_t *f, const char *svc) {
  sres_t r = get(f, svc);
  uint64_t v = r.snap != NULL ? om_snapshot_revision(r.snap) : 0;
  om_snapshot_unref(r.snap);
  return v;
}

/* A subscriber's transcript, with what it does from inside a callback. */
#define LOG_MAX 64
typedef struct watch_s {
  int n;
  char service[LOG_MAX][32];
  uint64_t rev[LOG_MAX];
  size_t count[LOG_MAX];
  om_store_t *st;
  om_store_sub_t *sub;
  int unsubscribe_self_after;        /* >0: after that many events */
  struct watch_s *unsubscribe_other; /* on the first event */
  struct watch_s *subscribe_other;   /* on the first event, to "every" */
  const char *put_service;           /* on the first event: a nested put */
  om_store_wres_t nested;            /* that put's outcome */
  int *close_store;                  /* on the first event, done counts */
  struct watch_s *refused;           /* then: try every call on the closed
                                        store (it still exists here) */
  int refused_checked;
} watch_t;

static void refused_after_close(watch_t *w);

static void on_watch(void *ud, om_snapshot_t *snap) {
  watch_t *w = ud;
  OM_ASSERT_CMP(w->n, <, LOG_MAX);
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
    om_instance_t in = om_store_test_inst("nested", "http://h:80", 5000);
    assert_int_equal(om_store_put_instance(w->st, w->put_service, &in,
                                           om_store_test_on_write, &w->nested),
                     0);
  }
  if (w->n == 1 && w->close_store != NULL) {
    om_store_close(w->st, on_closed, w->close_store);
    if (w->refused != NULL)
      refused_after_close(w);
  }
}

static void watch(om_store_t *st, const char *svc, watch_t *w) {
  w->st = st;
  assert_int_equal(om_store_subscribe(st, svc, on_watch, w, &w->sub), 0);
}

static void assert_increasing(const watch_t *w) {
  for (int i = 1; i < w->n && i < LOG_MAX; i++)
    if (strcmp(w->service[i], w->service[i - 1]) == 0 &&
        w->rev[i] <= w->rev[i - 1])
      fail_msg("%s: revision %llu after %llu", w->service[i],
               (unsigned long long)w->rev[i],
               (unsigned long long)w->rev[i - 1]);
}

/* ---- instances ---- */

void om_store_contract_lifecycle(void **state) {
  fx_t f;
  om_instance_t in = om_store_test_inst("i1", "http://10.0.0.1:80", 5000);
  om_kv_t kv[1] = {{"k", "v"}};
  om_store_wres_t w, w0;
  sres_t r;
  om_store_status_t ss;
  fx_open(&f, state);
  r = get(&f, "api");
  assert_int_equal(r.status, OM_ENOTFOUND);
  assert_null(r.snap);

  w0 = put(&f, "api", &in);
  assert_int_equal(w0.change, OM_STORE_CREATED);
  r = get(&f, "api");
  assert_int_equal(r.status, 0);
  assert_int_equal(om_snapshot_revision(r.snap), w0.revision);
  assert_string_equal(om_snapshot_find(r.snap, "i1")->url,
                      "http://10.0.0.1:80");

  /* a renewal with identical fields does not bump the revision */
  w = put(&f, "api", &in);
  assert_int_equal(w.change, OM_STORE_NOCHANGE);
  assert_int_equal(w.revision, w0.revision);

  /* every field is part of the identity of a registration */
  in.weight = 2;
  w = put(&f, "api", &in);
  assert_int_equal(w.change, OM_STORE_UPDATED);
  OM_ASSERT_CMP(w.revision, >, w0.revision);
  w0 = w;
  in.ttl_ms = 6000;
  w = put(&f, "api", &in);
  assert_int_equal(w.change, OM_STORE_UPDATED);
  OM_ASSERT_CMP(w.revision, >, w0.revision);
  in.metadata = kv;
  in.n_metadata = 1;
  w0 = w;
  w = put(&f, "api", &in);
  assert_int_equal(w.change, OM_STORE_UPDATED);
  OM_ASSERT_CMP(w.revision, >, w0.revision);
  in.zone = "z1";
  w0 = w;
  w = put(&f, "api", &in);
  assert_int_equal(w.change, OM_STORE_UPDATED);
  OM_ASSERT_CMP(w.revision, >, w0.revision);
  w = put(&f, "api", &in);
  assert_int_equal(w.change, OM_STORE_NOCHANGE);
  /* the old snapshot we hold is untouched */
  OM_ASSERT_CMP(om_snapshot_find(r.snap, "i1")->weight, ==, 1.0);
  om_snapshot_unref(r.snap);

  /* renew(): existing leases only */
  w = renew(&f, "api", "i1");
  assert_int_equal(w.status, 0);
  assert_int_equal(w.change, OM_STORE_NOCHANGE);
  assert_int_equal(w.revision, rev_of(&f, "api"));
  w = renew(&f, "api", "nope");
  assert_int_equal(w.status, OM_ENOTFOUND);
  w = renew(&f, "other", "i1");
  assert_int_equal(w.status, OM_ENOTFOUND);
  assert_int_equal(w.revision, 0);

  /* delete; the service stays, with an empty snapshot at that revision */
  w0.revision = rev_of(&f, "api");
  w = del(&f, "api", "i1");
  assert_int_equal(w.status, 0);
  assert_int_equal(w.change, OM_STORE_DELETED);
  OM_ASSERT_CMP(w.revision, >, w0.revision);
  assert_int_equal(count_of(&f, "api"), 0);
  assert_int_equal(rev_of(&f, "api"), w.revision);
  w = del(&f, "api", "i1");
  assert_int_equal(w.status, OM_ENOTFOUND);

  /* argument errors: returned, no callback, nothing changes */
  w = (om_store_wres_t){0};
  in.url = "ftp://x";
  assert_int_equal(
      om_store_put_instance(f.st, "api", &in, om_store_test_on_write, &w),
      OM_EINVAL);
  in.url = "http://x";
  assert_int_equal(
      om_store_put_instance(f.st, "a/b", &in, om_store_test_on_write, &w),
      OM_EINVAL);
  assert_int_equal(
      om_store_put_instance(f.st, "bad name", &in, om_store_test_on_write, &w),
      OM_EINVAL);
  assert_int_equal(
      om_store_put_instance(f.st, "api", NULL, om_store_test_on_write, &w),
      OM_EINVAL);
  assert_int_equal(
      om_store_put_instance(NULL, "api", &in, om_store_test_on_write, &w),
      OM_EINVAL);
  assert_int_equal(
      om_store_delete_instance(f.st, "api", "..", om_store_test_on_write, &w),
      OM_EINVAL);
  assert_int_equal(
      om_store_renew(f.st, "api", "..", om_store_test_on_write, &w), OM_EINVAL);
  assert_int_equal(om_store_renew(f.st, NULL, "i1", om_store_test_on_write, &w),
                   OM_EINVAL);
  assert_int_equal(om_store_snapshot(f.st, "api", NULL, NULL), OM_EINVAL);
  assert_int_equal(om_store_snapshot(f.st, "a b", on_snap, &r), OM_EINVAL);
  /* a NULL callback is fine: the renewal after it finds the instance */
  assert_int_equal(om_store_put_instance(f.st, "api", &in, NULL, NULL), 0);
  w = renew(&f, "api", "i1");
  assert_int_equal(w.status, 0);
  assert_int_equal(count_of(&f, "api"), 1); /* a read is in step */

  om_store_status(f.st, &ss);
  om_store_status(f.st, NULL);           /* ignored */
  assert_int_equal(ss.registrations, 6); /* 2 creates + 4 updates */
  assert_int_equal(ss.renewals, 4);      /* 2 identical puts + 2 renews */
  assert_int_equal(ss.deletions, 1);
  assert_int_equal(ss.expiries, 0);
  assert_int_equal(ss.services, 1);
  assert_int_equal(ss.instances, 1);
  assert_int_equal(ss.stale, 0);
  fx_close(&f);
}

/* ---- subscribers ---- */

void om_store_contract_subscribers(void **state) {
  fx_t f;
  watch_t wa = {0}, wb = {0}, all = {0}, early = {0};
  om_store_wres_t w[7];
  om_store_status_t ss;
  om_store_sub_t *sub;
  fx_open(&f, state);
  /* subscribed before "a" exists: invisible to reads */
  watch(f.st, "a", &early);
  om_store_status(f.st, &ss);
  assert_int_equal(ss.services, 0);
  assert_int_equal(get(&f, "a").status, OM_ENOTFOUND);
  w[0] = put_simple(&f, "a", "1", 5000);
  wait_for(&f.loop, &early.n, 1, "early subscriber");
  watch(f.st, "a", &wa);
  watch(f.st, "b", &wb);
  watch(f.st, NULL, &all);
  w[1] = put_simple(&f, "b", "1", 5000);
  wait_for(&f.loop, &all.n, 1, "every-service subscriber");
  w[2] = put_simple(&f, "a", "2", 5000);
  wait_for(&f.loop, &all.n, 2, "every-service subscriber");
  w[3] = put_simple(&f, "a", "2", 5000); /* no change: no event */
  assert_int_equal(w[3].change, OM_STORE_NOCHANGE);
  w[4] = put_simple(&f, "a", "1", 7000);
  wait_for(&f.loop, &all.n, 3, "every-service subscriber");
  w[5] = del(&f, "b", "1");
  wait_for(&f.loop, &all.n, 4, "every-service subscriber");
  assert_int_equal(early.n, 3);
  assert_int_equal(early.rev[0], w[0].revision);
  assert_int_equal(wa.n, 2); /* the first callback is not immediate */
  assert_int_equal(wa.rev[0], w[2].revision);
  assert_int_equal(wa.count[0], 2);
  assert_int_equal(wa.rev[1], w[4].revision);
  assert_int_equal(wb.n, 2);
  assert_int_equal(wb.rev[0], w[1].revision);
  assert_int_equal(wb.count[1], 0);
  assert_int_equal(all.n, 4);
  assert_string_equal(all.service[0], "b");
  assert_string_equal(all.service[1], "a");
  assert_string_equal(all.service[2], "a");
  assert_string_equal(all.service[3], "b");
  assert_int_equal(all.rev[3], w[5].revision);
  for (int i = 1; i < all.n; i++)
    OM_ASSERT_CMP(all.rev[i], >, all.rev[i - 1]);
  om_store_unsubscribe(f.st, wa.sub);
  om_store_unsubscribe(f.st, NULL);
  om_store_unsubscribe(NULL, wb.sub);
  w[6] = put_simple(&f, "a", "3", 5000);
  wait_for(&f.loop, &all.n, 5, "every-service subscriber");
  assert_int_equal(all.rev[4], w[6].revision);
  assert_int_equal(wa.n, 2);
  assert_int_equal(early.n, 4);
  /* argument errors */
  assert_int_equal(om_store_subscribe(f.st, "a/b", on_watch, &wa, &sub),
                   OM_EINVAL);
  assert_int_equal(om_store_subscribe(f.st, "a", NULL, &wa, &sub), OM_EINVAL);
  assert_int_equal(om_store_subscribe(f.st, "a", on_watch, &wa, NULL),
                   OM_EINVAL);
  assert_int_equal(om_store_subscribe(NULL, "a", on_watch, &wa, &sub),
                   OM_EINVAL);
  assert_int_equal(om_store_subscribe_config(f.st, "a", NULL, &wa, &sub),
                   OM_EINVAL);
  fx_close(&f); /* frees the remaining subscriptions */
}

void om_store_contract_reentrant_callbacks(void **state) {
  fx_t f;
  watch_t self = {0}, killer = {0}, victim = {0}, spawner = {0}, spawned = {0},
          nester = {0}, tail = {0};
  fx_open(&f, state);
  self.unsubscribe_self_after = 1;
  watch(f.st, "s", &self);
  killer.unsubscribe_other = &victim;
  watch(f.st, "s", &killer);
  watch(f.st, "s", &victim); /* after killer in the list: never called */
  spawner.subscribe_other = &spawned;
  watch(f.st, "s", &spawner);
  nester.put_service = "s"; /* a nested change during delivery */
  watch(f.st, "s", &nester);
  watch(f.st, NULL, &tail);
  put_simple(&f, "s", "first", 5000);
  wait_for(&f.loop, &tail.n, 2, "the nested change");
  wait_for(&f.loop, &nester.nested.calls, 1, "the nested put");
  assert_int_equal(nester.nested.status, 0);
  assert_int_equal(nester.nested.change, OM_STORE_CREATED);
  /* everyone saw "first" before anyone saw "nested" */
  assert_int_equal(self.n, 1);
  assert_int_equal(victim.n, 0);
  assert_int_equal(killer.n, 2);
  assert_int_equal(spawner.n, 2);
  assert_int_equal(nester.n, 2);
  assert_int_equal(tail.count[0], 1);
  assert_int_equal(tail.count[1], 2);
  OM_ASSERT_CMP(tail.rev[1], >, tail.rev[0]);
  /* subscribed during the first event: sees the nested one only */
  assert_int_equal(spawned.n, 1);
  assert_int_equal(spawned.rev[0], tail.rev[1]);
  assert_increasing(&killer);
  put_simple(&f, "s", "again", 5000);
  wait_for(&f.loop, &tail.n, 3, "every-service subscriber");
  wait_for(&f.loop, &spawned.n, 2, "the subscription made in a callback");
  assert_int_equal(self.n, 1);
  assert_int_equal(victim.n, 0);
  om_store_unsubscribe(f.st, spawned.sub);
  om_store_unsubscribe(f.st, killer.sub);
  fx_close(&f);
}

/* Closed: every call is refused until the store is gone. Run from the
 * callback that closed it, since a store that closes asynchronously (Redis)
 * may be freed by the next loop callback. */
static void refused_after_close(watch_t *w) {
  om_instance_t in = om_store_test_inst("i", "http://h", 5000);
  sres_t r = {0};
  watch_t *after = w->refused;
  assert_int_equal(om_store_put_instance(w->st, "s", &in, NULL, NULL),
                   OM_ESTATE);
  assert_int_equal(om_store_snapshot(w->st, "s", on_snap, &r), OM_ESTATE);
  assert_int_equal(om_store_config_get(w->st, "s", NULL, NULL), OM_ESTATE);
  assert_int_equal(om_store_subscribe(w->st, "s", on_watch, after, &after->sub),
                   OM_ESTATE);
  om_store_unsubscribe(w->st, after->sub); /* ignored */
  om_store_close(w->st, NULL, NULL);       /* a second close is ignored */
  assert_int_equal(r.calls, 0);
  w->refused_checked = 1;
}

void om_store_contract_close_inside_a_callback(void **state) {
  fx_t f;
  watch_t closer = {0}, after = {0};
  om_store_wres_t w = {0};
  om_instance_t in = om_store_test_inst("i", "http://h", 5000);
  fx_open(&f, state);
  closer.close_store = &f.closed;
  closer.refused = &after;
  watch(f.st, "s", &closer);
  watch(f.st, "s", &after);
  assert_int_equal(
      om_store_put_instance(f.st, "s", &in, om_store_test_on_write, &w), 0);
  wait_for(&f.loop, &closer.n, 1, "the closing subscriber");
  if (f.b->sync)
    assert_int_equal(w.calls, 1); /* the write itself still completes */
  assert_int_equal(closer.refused_checked, 1);
  f.st = NULL; /* closed in the callback; it may be gone by now */
  fx_close(&f);
  assert_int_equal(f.closed, 1);
  assert_int_equal(closer.n, 1);
  assert_int_equal(after.n, 0); /* nothing runs after close */
}

/* ---- configuration documents ---- */

typedef struct {
  int calls, status;
  om_config_doc_t *doc;
} cres_t;

static void on_cfg(void *ud, int status, om_config_doc_t *doc) {
  cres_t *r = ud;
  r->calls++;
  r->status = status;
  r->doc = om_config_doc_ref(doc);
}

static cres_t cfg_get(fx_t *f, const char *name) {
  cres_t r = {0};
  assert_int_equal(om_store_config_get(f->st, name, on_cfg, &r), 0);
  wait_for(&f->loop, &r.calls, 1, "config_get callback");
  return r;
}

static om_store_wres_t cfg_put(fx_t *f, const char *name, const char *ct,
                               const char *body, size_t len) {
  om_store_wres_t w = {0};
  assert_int_equal(om_store_config_put(f->st, name, ct, body, len,
                                       om_store_test_on_write, &w),
                   0);
  wait_for(&f->loop, &w.calls, 1, "config_put callback");
  assert_int_equal(w.status, 0);
  return w;
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
  OM_ASSERT_CMP(w->n, <, 16);
  snprintf(w->name[w->n], sizeof w->name[w->n], "%s", doc->name);
  w->rev[w->n] = doc->revision;
  w->n++;
  if (w->unsubscribe_self)
    om_store_unsubscribe(w->st, w->sub);
}

void om_store_contract_config_documents(void **state) {
  fx_t f;
  cwatch_t named = {0}, all = {0}, once = {0};
  cres_t r;
  om_store_wres_t w1, w2, w3, w = {0};
  const char bin[] = "a\0b";
  fx_open(&f, state);
  r = cfg_get(&f, "traffic");
  assert_int_equal(r.status, OM_ENOTFOUND);
  assert_null(r.doc);
  named.st = all.st = once.st = f.st;
  assert_int_equal(om_store_subscribe_config(f.st, "traffic", on_cfg_watch,
                                             &named, &named.sub),
                   0);
  assert_int_equal(
      om_store_subscribe_config(f.st, NULL, on_cfg_watch, &all, &all.sub), 0);
  once.unsubscribe_self = 1;
  assert_int_equal(om_store_subscribe_config(f.st, "traffic", on_cfg_watch,
                                             &once, &once.sub),
                   0);

  w1 = cfg_put(&f, "traffic", "text/x-lua", "return {}", 9);
  assert_int_equal(w1.change, OM_STORE_CREATED);
  wait_for(&f.loop, &all.n, 1, "every-document subscriber");
  r = cfg_get(&f, "traffic");
  assert_int_equal(r.status, 0);
  assert_string_equal(r.doc->name, "traffic");
  assert_string_equal(r.doc->content_type, "text/x-lua");
  assert_int_equal(r.doc->len, 9);
  assert_string_equal(r.doc->body, "return {}");
  assert_int_equal(r.doc->revision, w1.revision);

  /* identical: no change, no event */
  w2 = cfg_put(&f, "traffic", "text/x-lua", "return {}", 9);
  assert_int_equal(w2.change, OM_STORE_NOCHANGE);
  assert_int_equal(w2.revision, w1.revision);
  /* another content type is a change */
  w2 = cfg_put(&f, "traffic", "application/json", "return {}", 9);
  assert_int_equal(w2.change, OM_STORE_UPDATED);
  OM_ASSERT_CMP(w2.revision, >, w1.revision);
  wait_for(&f.loop, &all.n, 2, "every-document subscriber");
  w3 = cfg_put(&f, "other", "application/octet-stream", bin, 3);
  assert_int_equal(w3.change, OM_STORE_CREATED);
  wait_for(&f.loop, &all.n, 3, "every-document subscriber");
  /* the document we held is still the old one */
  assert_string_equal(r.doc->content_type, "text/x-lua");
  om_config_doc_unref(r.doc);
  r = cfg_get(&f, "other");
  assert_int_equal(r.doc->len, 3); /* binary-safe */
  assert_memory_equal(r.doc->body, bin, 4);
  om_config_doc_unref(r.doc);

  assert_int_equal(named.n, 2);
  assert_int_equal(named.rev[0], w1.revision);
  assert_int_equal(named.rev[1], w2.revision);
  assert_int_equal(once.n, 1);
  assert_int_equal(all.n, 3);
  assert_string_equal(all.name[2], "other");
  assert_int_equal(all.rev[2], w3.revision);

  /* argument errors */
  assert_int_equal(om_store_config_put(f.st, "../x", "a/b", "", 0,
                                       om_store_test_on_write, &w),
                   OM_EINVAL);
  assert_int_equal(
      om_store_config_put(f.st, "x", "", "", 0, om_store_test_on_write, &w),
      OM_EINVAL);
  assert_int_equal(om_store_config_put(f.st, "x", "a\r\nb", "", 0,
                                       om_store_test_on_write, &w),
                   OM_EINVAL);
  assert_int_equal(
      om_store_config_put(f.st, "x", NULL, "", 0, om_store_test_on_write, &w),
      OM_EINVAL);
  assert_int_equal(om_store_config_put(f.st, "x", "a/b", NULL, 1,
                                       om_store_test_on_write, &w),
                   OM_EINVAL);
  assert_int_equal(om_store_config_get(f.st, "x", NULL, NULL), OM_EINVAL);
  assert_int_equal(om_store_config_get(f.st, "a b", on_cfg, &r), OM_EINVAL);
  {
    size_t big = ((size_t)1 << 20) + 1;
    char *b = calloc(1, big);
    assert_non_null(b);
    assert_int_equal(om_store_config_put(f.st, "x", "a/b", b, big,
                                         om_store_test_on_write, &w),
                     OM_ETOOBIG);
    free(b);
  }
  assert_int_equal(w.calls, 0);
  /* an empty body, and a NULL callback: the get after it finds it */
  assert_int_equal(
      om_store_config_put(f.st, "empty", "a/b", NULL, 0, NULL, NULL), 0);
  wait_for(&f.loop, &all.n, 4, "every-document subscriber");
  r = cfg_get(&f, "empty");
  assert_int_equal(r.status, 0);
  assert_int_equal(r.doc->len, 0);
  assert_string_equal(r.doc->body, "");
  om_config_doc_unref(r.doc);
  fx_close(&f);
}

/* ---- listing ---- */

typedef struct {
  int calls, status;
  size_t n;
  char names[4][16];
  size_t counts[4];
  uint64_t revs[4];
} list_t;

static void on_list(void *ud, int status, const om_service_rev_t *sv,
                    size_t n) {
  list_t *l = ud;
  l->calls++;
  l->status = status;
  OM_ASSERT_CMP(n, <=, 4);
  l->n = n;
  for (size_t i = 0; i < n; i++) {
    snprintf(l->names[i], sizeof l->names[i], "%s", sv[i].service);
    l->counts[i] = sv[i].instances;
    l->revs[i] = sv[i].revision;
  }
}

static list_t list(fx_t *f) {
  list_t l = {0};
  assert_int_equal(om_store_list_services(f->st, on_list, &l), 0);
  wait_for(&f->loop, &l.calls, 1, "list callback");
  assert_int_equal(l.status, 0);
  return l;
}

void om_store_contract_list_services(void **state) {
  fx_t f;
  watch_t sub = {0};
  list_t l;
  int a;
  fx_open(&f, state);
  l = list(&f);
  assert_int_equal(l.n, 0);
  watch(f.st, "zz-subscribed", &sub); /* not a service yet */
  put_simple(&f, "b", "1", 5000);
  put_simple(&f, "a", "1", 5000);
  put_simple(&f, "a", "2", 5000);
  l = list(&f);
  assert_int_equal(l.n, 2);
  a = strcmp(l.names[0], "a") == 0 ? 0 : 1; /* in no promised order */
  assert_string_equal(l.names[a], "a");
  assert_string_equal(l.names[1 - a], "b");
  assert_int_equal(l.counts[a], 2);
  assert_int_equal(l.counts[1 - a], 1);
  assert_int_equal(l.revs[a], rev_of(&f, "a"));
  OM_ASSERT_CMP(l.revs[a], >, l.revs[1 - a]);
  om_store_unsubscribe(f.st, sub.sub);
  put_simple(&f, "zz-subscribed", "1", 5000);
  l = list(&f);
  assert_int_equal(l.n, 3);
  assert_int_equal(sub.n, 0);
  assert_int_equal(om_store_list_services(f.st, NULL, NULL), OM_EINVAL);
  assert_int_equal(om_store_list_services(NULL, on_list, &l), OM_EINVAL);
  om_test_fail_alloc_after(0);
  assert_int_equal(om_store_list_services(f.st, on_list, &l), OM_ENOMEM);
  om_test_alloc_reset();
  fx_close(&f);
}
