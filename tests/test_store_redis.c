/*
 * test_store_redis.c: the Redis store against a real redis-server this
 * binary starts on a free loopback port in a temporary directory (no
 * persistence) and stops at the end. Each test uses its own key prefix.
 *
 * What it proves: the URL parser refuses hostile input; the storage
 * contract's cases (tests/support/om_store_contract.c, shared with the
 * memory store); two stores on one Redis see each
 * other's changes as full snapshots at the same revision, with identical
 * page tokens; a lease expiry is performed once for two sweeping stores;
 * documents; an unreachable Redis (stale, writes OM_EIO, reads from the
 * replica); a Redis restart that lost its data (watchers get the empty
 * truth at a revision above anything delivered); allocation failures at
 * every step of new and of each write (OM_ENOMEM, nothing leaks);
 * close with commands in flight (no callback after close).
 */
#include "om_test.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <uv.h>

#include "om_errno.h"
#include "om_snapshot.h"
#include "om_snapshot_json.h"
#include "om_store_contract.h"
#include "om_store_redis.h"

/* ---- the redis-server ---- */

static pid_t g_redis = -1;
static int g_port;
static char g_dir[64];
static int g_prefix_seq;

static int free_port(void) {
  struct sockaddr_in a;
  socklen_t l = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &l) != 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static int can_connect(int port) {
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  if (fd >= 0)
    close(fd);
  return ok;
}

static int redis_start(void) {
  char port[16];
  char *argv[] = {"redis-server", "--port", port,  "--bind",
                  "127.0.0.1",    "--save", "",    "--appendonly",
                  "no",           "--dir",  g_dir, "--loglevel",
                  "warning",      NULL};
  pid_t parent = getpid();
  snprintf(port, sizeof port, "%d", g_port);
  g_redis = fork();
  if (g_redis < 0)
    return -1;
  if (g_redis == 0) {
    /* it dies with this process, however this one ends (an assertion that
     * aborts, a crash): a redis-server left behind would hold ctest's
     * output pipe open until the test's timeout */
    int null = open("/dev/null", O_WRONLY);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
      _exit(127);
    /* its start-up banner ignores --loglevel: keep our output clean */
    if (null >= 0)
      dup2(null, 1);
    execvp("redis-server", argv);
    _exit(127);
  }
  for (int i = 0; i < 200; i++) {
    if (can_connect(g_port))
      return 0;
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  return -1;
}

static void redis_stop(void) {
  if (g_redis > 0) {
    kill(g_redis, SIGKILL);
    waitpid(g_redis, NULL, 0);
    g_redis = -1;
  }
}

static int group_setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/om_redis_test_XXXXXX");
  if (mkdtemp(g_dir) == NULL)
    return -1;
  g_port = free_port();
  return g_port > 0 ? redis_start() : -1;
}

static int group_teardown(void **state) {
  char cmd[128];
  (void)state;
  redis_stop();
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* ---- the loop ---- */

static void on_deadline(uv_timer_t *t) {
  *(int *)t->data = 1;
}

/* Run the loop until *flag becomes nonzero or ms pass; returns *flag. */
static int run_until(uv_loop_t *loop, const int *flag, uint64_t ms) {
  uv_timer_t t;
  int expired = 0;
  uv_timer_init(loop, &t);
  t.data = &expired;
  uv_timer_start(&t, on_deadline, ms, 0);
  while (!*flag && !expired)
    uv_run(loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  return *flag;
}

static void sleep_loop(uv_loop_t *loop, uint64_t ms) {
  int never = 0;
  run_until(loop, &never, ms);
}

typedef struct {
  int ready, lost;
} state_t;

static void on_state(void *ud, int status) {
  state_t *s = ud;
  if (status == 0)
    s->ready++;
  else
    s->lost++;
}

static om_store_t *open_store_url(uv_loop_t *loop, const char *prefix,
                                  const char *url, state_t *st, int wait) {
  om_store_redis_opts_t o;
  om_store_t *s = NULL;
  memset(&o, 0, sizeof o);
  o.url = url;
  o.prefix = prefix;
  o.sweep_ms = 50;
  o.backoff_min_ms = 20;
  o.backoff_max_ms = 100;
  o.on_state = on_state;
  o.state_ud = st;
  assert_int_equal(om_store_redis_new(loop, &o, &s), 0);
  assert_string_equal(om_store_name(s), "redis");
  if (wait)
    assert_true(run_until(loop, &st->ready, 3000));
  return s;
}

static om_store_t *open_store(uv_loop_t *loop, const char *prefix, int port,
                              state_t *st, int wait) {
  char url[64];
  snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", port);
  return open_store_url(loop, prefix, url, st, wait);
}

static void on_closed(void *ud) {
  (*(int *)ud)++;
}

static void close_store(uv_loop_t *loop, om_store_t *s) {
  int closed = 0;
  om_store_close(s, on_closed, &closed);
  assert_int_equal(closed, 0);
  assert_true(run_until(loop, &closed, 3000));
}

static void new_prefix(char *out, size_t cap) {
  snprintf(out, cap, "t%d_%d:", (int)getpid(), ++g_prefix_seq);
}

/* ---- operations, waited for ---- */

static om_store_wres_t put(uv_loop_t *loop, om_store_t *s, const char *svc,
                           const char *id, const char *url, uint64_t ttl) {
  om_store_wres_t w = {0};
  om_instance_t in = om_store_test_inst(id, url, ttl);
  assert_int_equal(
      om_store_put_instance(s, svc, &in, om_store_test_on_write, &w), 0);
  assert_true(run_until(loop, &w.calls, 3000));
  return w;
}

static om_store_wres_t del(uv_loop_t *loop, om_store_t *s, const char *svc,
                           const char *id) {
  om_store_wres_t w = {0};
  assert_int_equal(
      om_store_delete_instance(s, svc, id, om_store_test_on_write, &w), 0);
  assert_true(run_until(loop, &w.calls, 3000));
  return w;
}

typedef struct {
  int calls, status;
  om_snapshot_t *snap;
} sres_t;

static void on_snap(void *ud, int status, om_snapshot_t *snap) {
  sres_t *r = ud;
  r->calls++;
  r->status = status;
  r->snap = om_snapshot_ref(snap);
}

static sres_t get(uv_loop_t *loop, om_store_t *s, const char *svc) {
  sres_t r = {0};
  assert_int_equal(om_store_snapshot(s, svc, on_snap, &r), 0);
  assert_true(run_until(loop, &r.calls, 3000));
  return r;
}

/* A subscriber recording every snapshot it is given. */
typedef struct {
  int n;
  uint64_t revs[64];
  size_t counts[64];
  om_snapshot_t *last;
  uint64_t target;
  int reached, min_n;
} watch_t;

static void on_watch(void *ud, om_snapshot_t *snap) {
  watch_t *w = ud;
  if (w->n < 64) {
    w->revs[w->n] = om_snapshot_revision(snap);
    w->counts[w->n] = om_snapshot_count(snap);
  }
  w->n++;
  om_snapshot_unref(w->last);
  w->last = om_snapshot_ref(snap);
}

static void on_tick(uv_timer_t *t) {
  watch_t *w = t->data;
  if (w->last != NULL && om_snapshot_revision(w->last) >= w->target &&
      w->n >= w->min_n)
    w->reached = 1;
}

/* Run until the watcher has had n events (or 3 s pass). */
static void wait_count(uv_loop_t *loop, watch_t *w, int n) {
  uv_timer_t t;
  w->target = 0;
  w->min_n = n;
  w->reached = 0;
  uv_timer_init(loop, &t);
  t.data = w;
  uv_timer_start(&t, on_tick, 5, 5);
  run_until(loop, &w->reached, 3000);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  w->min_n = 0;
  if (w->n < n)
    fail_msg("watcher had %d events, want %d", w->n, n);
}

/* Run until the watcher has been given revision rev (or 3 s pass). */
static void wait_rev(uv_loop_t *loop, watch_t *w, uint64_t rev) {
  uv_timer_t t;
  w->target = rev;
  w->reached = 0;
  uv_timer_init(loop, &t);
  t.data = w;
  uv_timer_start(&t, on_tick, 5, 5);
  run_until(loop, &w->reached, 3000);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  if (w->last == NULL || om_snapshot_revision(w->last) != rev)
    fail_msg("watcher at revision %llu, want %llu",
             w->last != NULL ? (unsigned long long)om_snapshot_revision(w->last)
                             : 0ull,
             (unsigned long long)rev);
}

static void assert_increasing(const watch_t *w) {
  for (int i = 1; i < w->n && i < 64; i++)
    if (w->revs[i] <= w->revs[i - 1])
      fail_msg("watch event %d: revision %llu after %llu", i,
               (unsigned long long)w->revs[i],
               (unsigned long long)w->revs[i - 1]);
}

/* ---- tests ---- */

static void url_parsing(void **state) {
  char host[64];
  int port, db;
  const char *why = NULL;
  static const char *const bad[] = {"",
                                    "redis:/",
                                    "redis://",
                                    "http://h:1/0",
                                    "rediss://h:6379/0",
                                    "redis://h:0/0",
                                    "redis://h:65536/0",
                                    "redis://h:-1/0",
                                    "redis://h:x/0",
                                    "redis://u:p@h:1/0",
                                    "redis://h:1/0?x=1",
                                    "redis://h:1/0#f",
                                    "redis://h:1/a",
                                    "redis://h:1/99999",
                                    "redis://[::1/0",
                                    "redis://[]:1",
                                    "redis://h h:1",
                                    "redis://h:1/0/extra",
                                    "redis://h\r\n:1",
                                    "redis://%68:1"};
  (void)state;
  assert_int_equal(om_store_redis_parse_url("redis://127.0.0.1:6380/3", host,
                                            sizeof host, &port, &db, &why),
                   0);
  assert_string_equal(host, "127.0.0.1");
  assert_int_equal(port, 6380);
  assert_int_equal(db, 3);
  assert_int_equal(om_store_redis_parse_url("redis://cache.internal", host,
                                            sizeof host, &port, &db, &why),
                   0);
  assert_string_equal(host, "cache.internal");
  assert_int_equal(port, 6379);
  assert_int_equal(db, 0);
  assert_int_equal(om_store_redis_parse_url("redis://[::1]:7000/", host,
                                            sizeof host, &port, &db, &why),
                   0);
  assert_string_equal(host, "::1");
  assert_int_equal(port, 7000);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why = NULL;
    if (om_store_redis_parse_url(bad[i], host, sizeof host, &port, &db, &why) !=
        OM_EINVAL)
      fail_msg("accepted '%s'", bad[i]);
    assert_non_null(why);
  }
  {
    /* an oversized host */
    char big[600] = "redis://";
    memset(big + 8, 'a', 400);
    big[408] = '\0';
    assert_int_equal(
        om_store_redis_parse_url(big, host, sizeof host, &port, &db, &why),
        OM_EINVAL);
  }
  {
    uv_loop_t loop;
    om_store_t *s = NULL;
    om_store_redis_opts_t o;
    uv_loop_init(&loop);
    memset(&o, 0, sizeof o);
    o.url = "redis://h:1/0";
    o.prefix = "bad prefix";
    assert_int_equal(om_store_redis_new(&loop, &o, &s), OM_EINVAL);
    o.prefix = NULL;
    o.url = "redis://h:1/0?q";
    assert_int_equal(om_store_redis_new(&loop, &o, &s), OM_EINVAL);
    assert_null(s);
    assert_int_equal(om_store_redis_new(NULL, &o, &s), OM_EINVAL);
    assert_int_equal(uv_loop_close(&loop), 0);
  }
}

typedef struct {
  int calls, status;
  size_t n;
  char first[64];
  uint64_t rev;
} lres_t;

static void on_list(void *ud, int status, const om_service_rev_t *l, size_t n) {
  lres_t *r = ud;
  r->calls++;
  r->status = status;
  r->n = n;
  if (n > 0) {
    snprintf(r->first, sizeof r->first, "%s", l[0].service);
    r->rev = l[0].revision;
  }
}

static void two_stores_one_redis(void **state) {
  uv_loop_t loop;
  state_t sa = {0}, sb = {0};
  char prefix[32], ids[8];
  om_store_t *a, *b;
  om_store_sub_t *sub;
  watch_t w = {0};
  om_store_wres_t wr;
  sres_t ra, rb;
  lres_t l = {0};
  char *pa = NULL, *pb = NULL;
  size_t la = 0, lb = 0;
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  a = open_store(&loop, prefix, g_port, &sa, 1);
  b = open_store(&loop, prefix, g_port, &sb, 1);
  assert_int_equal(om_store_subscribe(b, "pay", on_watch, &w, &sub), 0);
  for (int i = 0; i < 5; i++) {
    snprintf(ids, sizeof ids, "i%d", i);
    wr = put(&loop, a, "pay", ids, "http://h:1", 5000);
    assert_int_equal(wr.change, OM_STORE_CREATED);
  }
  /* the last write's revision reaches B's subscriber */
  wait_rev(&loop, &w, wr.revision);
  assert_int_equal(om_snapshot_revision(w.last), wr.revision);
  assert_int_equal(om_snapshot_count(w.last), 5);
  assert_increasing(&w);
  /* page tokens minted on A are valid on B at the same revision */
  ra = get(&loop, a, "pay");
  rb = get(&loop, b, "pay");
  assert_int_equal(om_snapshot_revision(ra.snap),
                   om_snapshot_revision(rb.snap));
  assert_int_equal(om_snapshot_page_json(ra.snap, NULL, 0, 2, &pa, &la, NULL),
                   0);
  {
    const char *t = strstr(pa, "\"next_page_token\":\"");
    char tok[OM_PAGE_TOKEN_LEN + 1];
    assert_non_null(t);
    memcpy(tok, t + 19, OM_PAGE_TOKEN_LEN);
    tok[OM_PAGE_TOKEN_LEN] = '\0';
    assert_int_equal(om_snapshot_page_json(rb.snap, tok, OM_PAGE_TOKEN_LEN, 2,
                                           &pb, &lb, NULL),
                     0);
    assert_non_null(strstr(pb, "\"id\":\"i2\""));
  }
  free(pa);
  free(pb);
  om_snapshot_unref(ra.snap);
  om_snapshot_unref(rb.snap);
  /* delete on B, seen by a read on A */
  wr = del(&loop, b, "pay", "i0");
  assert_int_equal(wr.change, OM_STORE_DELETED);
  ra = get(&loop, a, "pay");
  assert_int_equal(om_snapshot_revision(ra.snap), wr.revision);
  assert_int_equal(om_snapshot_count(ra.snap), 4);
  om_snapshot_unref(ra.snap);
  assert_int_equal(om_store_list_services(a, on_list, &l), 0);
  assert_true(run_until(&loop, &l.calls, 2000));
  assert_int_equal(l.status, 0);
  assert_int_equal(l.n, 1);
  assert_string_equal(l.first, "pay");
  assert_int_equal(l.rev, wr.revision);
  om_store_unsubscribe(b, sub);
  om_snapshot_unref(w.last);
  close_store(&loop, a);
  close_store(&loop, b);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* One om_store_collect_empty call on s, then the loop for 100 ms (the
 * script, and the channel's g messages to every plane). */
static size_t collect_round(uv_loop_t *loop, om_store_t *s,
                            int (*keep)(void *, const char *),
                            om_store_gone_t *g) {
  size_t n = SIZE_MAX;
  assert_int_equal(
      om_store_collect_empty(s, 1, keep, om_store_test_on_gone, g, &n), 0);
  sleep_loop(loop, 100);
  return n;
}

/*
 * 2,500 services that each had an instance, emptied through A: collected
 * in Redis once for both planes, in batches, each plane naming every one
 * to its caller in name order; the one B's watcher holds (keep) is not
 * collected by A either; one with an instance stays; a comeback gets a
 * revision above any issued before.
 */
static void empty_services_collected_for_every_plane(void **state) {
  enum { N = 2500 };
  uv_loop_t loop;
  state_t sa = {0}, sb = {0};
  char prefix[32], name[16];
  om_store_t *a, *b;
  om_store_gone_t ga = {0, "", 1}, gb = {0, "", 1};
  om_store_wres_t wr;
  lres_t l = {0};
  uint64_t last = 0;
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  a = open_store(&loop, prefix, g_port, &sa, 1);
  b = open_store(&loop, prefix, g_port, &sb, 1);
  for (unsigned i = 0; i < N; i++) {
    snprintf(name, sizeof name, "s%05u", i);
    put(&loop, a, name, "i1", "http://h:1", 600000);
    if (i != 2) /* s00002 keeps its instance */
      last = del(&loop, a, name, "i1").revision;
  }
  sleep_loop(&loop, 200); /* both replicas hold every empty snapshot */
  /* B first: its mark on s00007 is in Redis before A proposes it */
  for (int round = 0; round < 10 && (ga.n < N - 2 || gb.n < N - 2); round++) {
    collect_round(&loop, b, om_store_test_keep_seven, &gb);
    collect_round(&loop, a, NULL, &ga);
  }
  if (ga.n != N - 2 || gb.n != N - 2)
    fail_msg("collected: A named %zu, B named %zu, want %d each", ga.n, gb.n,
             N - 2);
  assert_int_equal(ga.ordered, 1);
  assert_int_equal(gb.ordered, 1);
  /* more rounds change nothing: s00007 is held, s00002 has an instance */
  assert_int_equal(collect_round(&loop, b, om_store_test_keep_seven, &gb), 0);
  assert_int_equal(collect_round(&loop, a, NULL, &ga), 0);
  assert_int_equal(om_store_list_services(a, on_list, &l), 0);
  assert_true(run_until(&loop, &l.calls, 2000));
  assert_int_equal(l.status, 0);
  assert_int_equal(l.n, 2); /* s00002 and s00007, in Redis's hash order */
  if (strcmp(l.first, "s00002") != 0 && strcmp(l.first, "s00007") != 0)
    fail_msg("listed %s, want s00002 or s00007", l.first);
  {
    sres_t r = get(&loop, b, "s00001");
    assert_int_equal(r.status, OM_ENOTFOUND);
    om_snapshot_unref(r.snap);
  }
  /* the comeback moves forward, and is not named as gone later */
  wr = put(&loop, b, "s00001", "i2", "http://h:2", 600000);
  assert_int_equal(wr.change, OM_STORE_CREATED);
  if (wr.revision <= last)
    fail_msg("comeback at revision %llu, last before %llu",
             (unsigned long long)wr.revision, (unsigned long long)last);
  assert_int_equal(collect_round(&loop, a, NULL, &ga), 0);
  {
    sres_t r = get(&loop, a, "s00001");
    assert_int_equal(r.status, 0);
    assert_int_equal(om_snapshot_count(r.snap), 1);
    om_snapshot_unref(r.snap);
  }
  close_store(&loop, a);
  close_store(&loop, b);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/*
 * A collection this plane never heard of (its g message lost while it
 * was away): the resync after its reconnect finds the service gone from
 * P services and names it at the next call; a listed service stays.
 */
static void a_missed_collection_is_found_on_resync(void **state) {
  uv_loop_t loop;
  state_t st = {0};
  char prefix[32], key[96];
  om_store_t *s;
  om_store_gone_t g = {0, "", 1};
  redisContext *rc;
  size_t n = SIZE_MAX;
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  s = open_store(&loop, prefix, g_port, &st, 1);
  put(&loop, s, "lost", "i1", "http://h:1", 600000);
  del(&loop, s, "lost", "i1");
  put(&loop, s, "kept", "i1", "http://h:1", 600000);
  del(&loop, s, "kept", "i1");
  /* another plane collected "lost" and nobody heard: the hash entry goes
   * without a message; then this plane's connections are cut */
  rc = redisConnect("127.0.0.1", g_port);
  assert_non_null(rc);
  assert_int_equal(rc->err, 0);
  snprintf(key, sizeof key, "%sservices", prefix);
  freeReplyObject(redisCommand(rc, "HDEL %s lost", key));
  freeReplyObject(redisCommand(rc, "CLIENT KILL TYPE pubsub"));
  redisFree(rc);
  assert_true(run_until(&loop, &st.lost, 3000));
  assert_true(run_until(&loop, &st.ready, 3000) >= 1);
  sleep_loop(&loop, 100); /* the resync's list answered */
  /* idle far away: nothing is proposed, only what Redis already lost */
  assert_int_equal(
      om_store_collect_empty(s, 3600000, NULL, om_store_test_on_gone, &g, &n),
      0);
  assert_int_equal(n, 1);
  assert_string_equal(g.last, "lost");
  {
    sres_t r = get(&loop, s, "kept");
    assert_int_equal(r.status, 0);
    om_snapshot_unref(r.snap);
  }
  close_store(&loop, s);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void expiry_once_for_two_planes(void **state) {
  uv_loop_t loop;
  state_t sa = {0}, sb = {0};
  char prefix[32];
  om_store_t *a, *b;
  om_store_sub_t *suba, *subb;
  watch_t wa = {0}, wb = {0};
  om_store_wres_t wr;
  om_store_status_t xa, xb;
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  a = open_store(&loop, prefix, g_port, &sa, 1);
  b = open_store(&loop, prefix, g_port, &sb, 1);
  assert_int_equal(om_store_subscribe(a, NULL, on_watch, &wa, &suba), 0);
  assert_int_equal(om_store_subscribe(b, NULL, on_watch, &wb, &subb), 0);
  put(&loop, a, "cart", "x", "http://h:1", 1000);
  wr = put(&loop, b, "cart", "y", "http://h:1", 1000);
  put(&loop, b, "cart", "keep", "http://h:1", 3600000);
  /* both leases pass their ttl; both stores sweep every 50 ms */
  sleep_loop(&loop, 1600);
  om_store_status(a, &xa);
  om_store_status(b, &xb);
  assert_int_equal(xa.expiries + xb.expiries, 2); /* once, not per plane */
  assert_int_equal(xa.instances, 1);
  assert_int_equal(xb.instances, 1);
  assert_int_equal(om_snapshot_count(wa.last), 1);
  assert_int_equal(om_snapshot_count(wb.last), 1);
  assert_true(om_snapshot_revision(wb.last) > wr.revision);
  assert_int_equal(om_snapshot_revision(wa.last),
                   om_snapshot_revision(wb.last));
  /* three puts, then one revision per sweep that removed something (one
   * or two sweeps): the same events on both planes */
  assert_int_equal(wa.n, wb.n);
  assert_true(wa.n == 4 || wa.n == 5);
  assert_increasing(&wa);
  assert_increasing(&wb);
  om_snapshot_unref(wa.last);
  om_snapshot_unref(wb.last);
  close_store(&loop, a); /* close frees the subscriptions */
  close_store(&loop, b);
  (void)suba;
  (void)subb;
  assert_int_equal(uv_loop_close(&loop), 0);
}

typedef struct {
  int calls, status;
  om_config_doc_t *doc;
} cres_t;

static void on_cfg(void *ud, int status, om_config_doc_t *doc) {
  cres_t *r = ud;
  r->calls++;
  r->status = status;
  om_config_doc_unref(r->doc);
  r->doc = om_config_doc_ref(doc);
}

static void on_cfg_watch(void *ud, om_config_doc_t *doc) {
  cres_t *r = ud;
  r->calls++;
  om_config_doc_unref(r->doc);
  r->doc = om_config_doc_ref(doc);
}

static void config_documents_across_planes(void **state) {
  uv_loop_t loop;
  state_t sa = {0}, sb = {0};
  char prefix[32];
  om_store_t *a, *b;
  om_store_sub_t *sub;
  om_store_wres_t w1 = {0}, w2 = {0};
  cres_t got = {0}, watched = {0};
  static const char body[] = "return {kind = 'traffic'}\0tail";
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  a = open_store(&loop, prefix, g_port, &sa, 1);
  b = open_store(&loop, prefix, g_port, &sb, 1);
  assert_int_equal(
      om_store_subscribe_config(b, "traffic", on_cfg_watch, &watched, &sub), 0);
  assert_int_equal(om_store_config_put(a, "traffic", "text/x-lua", body,
                                       sizeof body - 1, om_store_test_on_write,
                                       &w1),
                   0);
  assert_true(run_until(&loop, &w1.calls, 2000));
  assert_int_equal(w1.change, OM_STORE_CREATED);
  assert_int_equal(om_store_config_put(a, "traffic", "text/x-lua", body,
                                       sizeof body - 1, om_store_test_on_write,
                                       &w2),
                   0);
  assert_true(run_until(&loop, &w2.calls, 2000));
  assert_int_equal(w2.change, OM_STORE_NOCHANGE);
  assert_int_equal(w2.revision, w1.revision);
  assert_true(run_until(&loop, &watched.calls, 2000));
  assert_int_equal(watched.doc->revision, w1.revision);
  assert_int_equal(watched.doc->len, sizeof body - 1); /* binary-safe */
  assert_memory_equal(watched.doc->body, body, sizeof body - 1);
  assert_int_equal(om_store_config_get(b, "traffic", on_cfg, &got), 0);
  assert_true(run_until(&loop, &got.calls, 2000));
  assert_int_equal(got.status, 0);
  assert_string_equal(got.doc->content_type, "text/x-lua");
  got.calls = 0;
  assert_int_equal(om_store_config_get(b, "nope", on_cfg, &got), 0);
  assert_true(run_until(&loop, &got.calls, 2000));
  assert_int_equal(got.status, OM_ENOTFOUND);
  {
    size_t big = ((size_t)1 << 20) + 1;
    char *huge = calloc(1, big);
    assert_non_null(huge);
    assert_int_equal(
        om_store_config_put(a, "traffic", "text/x-lua", huge, big, NULL, NULL),
        OM_ETOOBIG);
    free(huge);
  }
  assert_int_equal(
      om_store_config_put(a, "traffic", "bad\nct", "x", 1, NULL, NULL),
      OM_EINVAL);
  om_config_doc_unref(got.doc);
  om_config_doc_unref(watched.doc);
  om_store_unsubscribe(b, sub);
  close_store(&loop, a);
  close_store(&loop, b);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void unreachable_redis(void **state) {
  uv_loop_t loop;
  state_t st = {0};
  om_store_t *s;
  om_store_status_t ss;
  om_store_wres_t w = {0};
  sres_t r = {0};
  om_instance_t in = om_store_test_inst("a", "http://h:1", 5000);
  int port = free_port();
  (void)state;
  uv_loop_init(&loop);
  s = open_store(&loop, "x:", port, &st, 0);
  sleep_loop(&loop, 150); /* a few refused attempts */
  om_store_status(s, &ss);
  assert_int_equal(ss.stale, 1);
  assert_int_equal(om_store_redis_ready(s), 0);
  assert_int_equal(
      om_store_put_instance(s, "orders", &in, om_store_test_on_write, &w), 0);
  assert_int_equal(w.calls, 1);
  assert_int_equal(w.status, OM_EIO);
  assert_int_equal(om_store_snapshot(s, "orders", on_snap, &r), 0);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, OM_EIO); /* never synced: no last good state */
  assert_int_equal(st.ready, 0);
  close_store(&loop, s);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* A host name is looked up off the loop (libuv's thread pool), then
 * connected by address; a name that does not resolve is an unavailable
 * store that keeps retrying; closing while a lookup is pending waits for
 * it (ASan would see the store freed under the callback). */
static void host_names_resolve_off_the_loop(void **state) {
  uv_loop_t loop;
  state_t st = {0}, sx = {0}, sc = {0};
  char prefix[32], url[64];
  om_store_t *s, *x, *c;
  om_store_status_t ss;
  om_store_wres_t w;
  om_store_wres_t wx = {0};
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  snprintf(url, sizeof url, "redis://localhost:%d/0", g_port);
  s = open_store_url(&loop, prefix, url, &st, 1);
  w = put(&loop, s, "orders", "a", "http://h:1", 5000);
  assert_int_equal(w.status, 0);
  /* RFC 6761 6.4: .invalid never resolves */
  x = open_store_url(&loop, prefix, "redis://no-such-host.invalid:6379/0", &sx,
                     0);
  sleep_loop(&loop, 300);
  om_store_status(x, &ss);
  assert_int_equal(ss.stale, 1);
  assert_int_equal(om_store_redis_ready(x), 0);
  assert_int_equal(sx.ready, 0);
  {
    om_instance_t in = om_store_test_inst("b", "http://h:1", 5000);
    assert_int_equal(
        om_store_put_instance(x, "orders", &in, om_store_test_on_write, &wx),
        0);
    assert_int_equal(wx.status, OM_EIO);
  }
  /* the store that resolved is untouched by the one that did not */
  assert_int_equal(om_store_redis_ready(s), 1);
  c = open_store_url(&loop, prefix, url, &sc, 0);
  close_store(&loop, c); /* its lookup is still pending */
  close_store(&loop, x);
  close_store(&loop, s);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* What someone else with access to Redis could write: garbage on the
 * channel, entries that are not registrations. Nothing crashes, bad
 * entries are skipped (and logged), good ones still served. */
static void hostile_redis_content(void **state) {
  uv_loop_t loop;
  state_t st = {0};
  char prefix[32], key[96], chan[96];
  om_store_t *s;
  om_store_sub_t *sub;
  watch_t w = {0};
  om_store_wres_t wr;
  sres_t r;
  redisContext *rc;
  static const char *const junk[] = {
      "",
      " ",
      "1",
      "1 0",
      "1 0 p",
      "x 0 p svc id 1 {}",
      "1 x p svc",
      "9 0 p bad/name id 1 {}",
      "9 0 q svc",
      "9 0 p svc id",
      "9 0 p svc id 5000 {not json",
      "9 0 r ../.. a b",
      "99999999999999999999999 0 r svc",
      "9 0 c ..",
      "9 0 p svc id 5000 {\"url\":\"javascript:alert(1)\",\"ttl_ms\":5000}"};
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  s = open_store(&loop, prefix, g_port, &st, 1);
  assert_int_equal(om_store_subscribe(s, NULL, on_watch, &w, &sub), 0);
  wr = put(&loop, s, "svc", "good", "http://h:1", 60000);
  wait_rev(&loop, &w, wr.revision);
  rc = redisConnect("127.0.0.1", g_port);
  assert_non_null(rc);
  assert_int_equal(rc->err, 0);
  snprintf(chan, sizeof chan, "%sevents@0", prefix);
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++)
    freeReplyObject(redisCommand(rc, "PUBLISH %s %s", chan, junk[i]));
  snprintf(key, sizeof key, "%si:svc", prefix);
  freeReplyObject(redisCommand(rc, "HSET %s evil %s", key, "no-space-here"));
  freeReplyObject(redisCommand(rc, "HSET %s evil2 %s", key,
                               "5000 {\"url\":\"ftp://x\",\"ttl_ms\":5000}"));
  freeReplyObject(redisCommand(rc, "HSET %s ../x %s", key, "5000 {}"));
  redisFree(rc);
  sleep_loop(&loop, 200);
  /* a new revision makes readers fetch the tampered hash */
  wr = put(&loop, s, "svc", "good2", "http://h:2", 60000);
  r = get(&loop, s, "svc");
  assert_int_equal(r.status, 0);
  assert_int_equal(om_snapshot_count(r.snap), 2);
  assert_string_equal(om_snapshot_instance(r.snap, 0)->id, "good");
  assert_string_equal(om_snapshot_instance(r.snap, 1)->id, "good2");
  om_snapshot_unref(r.snap);
  wait_rev(&loop, &w, wr.revision);
  assert_increasing(&w);
  om_store_unsubscribe(s, sub);
  om_snapshot_unref(w.last);
  close_store(&loop, s);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Last: restarts the server. */
static void redis_restart_loses_data(void **state) {
  uv_loop_t loop;
  state_t st = {0};
  char prefix[32];
  om_store_t *s;
  om_store_sub_t *sub;
  watch_t w = {0};
  om_store_wres_t wr, w2 = {0};
  sres_t r;
  om_store_status_t ss;
  om_instance_t in = om_store_test_inst("b", "http://h:1", 5000);
  uint64_t before;
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  s = open_store(&loop, prefix, g_port, &st, 1);
  assert_int_equal(om_store_subscribe(s, "svc", on_watch, &w, &sub), 0);
  wr = put(&loop, s, "svc", "a", "http://h:1", 60000);
  assert_true(run_until(&loop, &w.n, 2000));
  before = om_snapshot_revision(w.last);
  assert_int_equal(before, wr.revision);
  redis_stop();
  sleep_loop(&loop, 200);
  om_store_status(s, &ss);
  assert_int_equal(ss.stale, 1);
  assert_int_equal(st.lost, 1);
  /* reads keep the last good state; writes fail */
  r = get(&loop, s, "svc");
  assert_int_equal(r.status, 0);
  assert_int_equal(om_snapshot_revision(r.snap), before);
  om_snapshot_unref(r.snap);
  assert_int_equal(
      om_store_put_instance(s, "svc", &in, om_store_test_on_write, &w2), 0);
  assert_int_equal(w2.status, OM_EIO);
  /* Redis comes back empty (no persistence) */
  assert_int_equal(redis_start(), 0);
  assert_true(run_until(&loop, &st.ready, 3000) >= 1);
  wait_count(&loop, &w, 2);
  assert_true(om_snapshot_revision(w.last) > before);
  assert_int_equal(om_snapshot_count(w.last), 0); /* the truth: empty */
  assert_increasing(&w);
  before = om_snapshot_revision(w.last);
  r = get(&loop, s, "svc");
  assert_int_equal(r.status, 0);
  assert_int_equal(om_snapshot_revision(r.snap), before);
  om_snapshot_unref(r.snap);
  wr = put(&loop, s, "svc", "a", "http://h:1", 60000);
  assert_int_equal(wr.change, OM_STORE_CREATED);
  assert_true(wr.revision > before);
  om_store_unsubscribe(s, sub);
  om_snapshot_unref(w.last);
  close_store(&loop, s);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void fault_injection(void **state) {
  uv_loop_t loop;
  char prefix[32];
  om_store_t *s = NULL;
  state_t st = {0};
  int n;
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  for (n = 0;; n++) {
    om_store_redis_opts_t o;
    char url[64];
    int rc;
    memset(&o, 0, sizeof o);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", g_port);
    o.url = url;
    o.prefix = prefix;
    om_test_fail_alloc_after(n);
    rc = om_store_redis_new(&loop, &o, &s);
    om_test_alloc_reset();
    if (rc == 0)
      break;
    assert_int_equal(rc, OM_ENOMEM);
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  close_store(&loop, s);
  s = open_store(&loop, prefix, g_port, &st, 1);
  for (n = 0;; n++) {
    om_store_wres_t w = {0};
    om_instance_t in = om_store_test_inst("a", "http://h:1", 5000);
    om_kv_t md[2] = {{"zone", "z1"}, {"app", "x"}};
    int rc;
    in.metadata = md;
    in.n_metadata = 2;
    om_test_fail_alloc_after(n);
    rc = om_store_put_instance(s, "faults", &in, om_store_test_on_write, &w);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_true(run_until(&loop, &w.calls, 2000));
      assert_int_equal(w.status, 0);
      assert_int_equal(w.change, OM_STORE_CREATED); /* nothing half-applied */
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_int_equal(w.calls, 0);
  }
  for (n = 0;; n++) {
    om_store_wres_t w = {0};
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_store_delete_instance(s, "faults", "a", om_store_test_on_write, &w);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_true(run_until(&loop, &w.calls, 2000));
      assert_int_equal(w.change, OM_STORE_DELETED);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
  }
  for (n = 0;; n++) {
    om_store_sub_t *sub = NULL;
    watch_t w = {0};
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_store_subscribe(s, "faults", on_watch, &w, &sub);
    om_test_alloc_reset();
    if (rc == 0) {
      om_store_unsubscribe(s, sub);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
  }
  close_store(&loop, s);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void close_with_commands_in_flight(void **state) {
  uv_loop_t loop;
  state_t st = {0};
  char prefix[32], id[16];
  om_store_t *s;
  om_store_wres_t w = {0};
  (void)state;
  new_prefix(prefix, sizeof prefix);
  uv_loop_init(&loop);
  s = open_store(&loop, prefix, g_port, &st, 1);
  for (int i = 0; i < 100; i++) {
    om_instance_t in;
    snprintf(id, sizeof id, "i%d", i);
    in = om_store_test_inst(id, "http://h:1", 5000);
    assert_int_equal(
        om_store_put_instance(s, "busy", &in, om_store_test_on_write, &w), 0);
  }
  close_store(&loop, s);
  assert_int_equal(w.calls, 0); /* after close, no callback */
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* The contract suite's Redis store: its own prefix, ready for writes. */
static om_store_t *open_redis(uv_loop_t *loop) {
  static state_t st; /* on_state counts; one store at a time */
  char prefix[32];
  memset(&st, 0, sizeof st);
  new_prefix(prefix, sizeof prefix);
  return open_store(loop, prefix, g_port, &st, 1);
}

static om_store_backend_t redis_backend = {"redis", open_redis, 0};

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(url_parsing),
      OM_STORE_CONTRACT_TESTS(&redis_backend),
      cmocka_unit_test(two_stores_one_redis),
      cmocka_unit_test(expiry_once_for_two_planes),
      cmocka_unit_test(empty_services_collected_for_every_plane),
      cmocka_unit_test(a_missed_collection_is_found_on_resync),
      cmocka_unit_test(config_documents_across_planes),
      cmocka_unit_test(unreachable_redis),
      cmocka_unit_test(host_names_resolve_off_the_loop),
      cmocka_unit_test(fault_injection),
      cmocka_unit_test(close_with_commands_in_flight),
      cmocka_unit_test(hostile_redis_content),
      cmocka_unit_test(redis_restart_loses_data),
  };
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
