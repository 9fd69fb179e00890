/*
 * bench_isolation.c: does a slow policy on one service stall another?
 *
 * One in-process proxy on a loop thread, in front of one in-process
 * upstream (om_http_server answering "ok" at once) on the same loop, with
 * two services: "calm" (a policy that returns every peer) and "hostile"
 * (tests/fixtures/hostile_policy.lua, quadratic in x-tags). Clients are
 * blocking keep-alive sockets on threads of their own, closed loop.
 *
 * Rounds of 2,000 calm calls, alternating: alone, then while 4 other
 * clients send hostile calls with an 8 KiB x-tags header, each up to 500
 * a second (each one, until the service is shed, costs the loop its 1 ms
 * budget; the policy is shed after five overruns and probed again after
 * 10 s). Four, so that without shedding a policy call is nearly always
 * running: with one hostile client the calm calls would slip into the
 * gaps between its calls and only the tail would show it.
 * isolation_calm_p50_us: calm's p50 round trip alone, median of the rounds.
 * isolation_calm_p50_hostile_us: the same with the hostile load.
 * isolation_calm_p50_ratio: the median of the rounds' ratios (the bar:
 * <= 2). isolation_hostile_calls: hostile calls answered (all of them
 * policy_error: overruns, then refusals while shed).
 */
#define _GNU_SOURCE /* strcasestr */
#include "om_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "om_http_server.h"
#include "om_proxy.h"

#define CALLS 2000
#define ROUNDS 5
#define HOSTILE_EVERY_NS 2000000 /* 500 a second per client */
#define HOSTILE_CLIENTS 4

static uv_loop_t loop;
static uv_async_t stop_async;
static om_proxy_t *proxy;
static om_http_server_t *upstream;
static int proxy_port;
static volatile int hostile_run;
static uint64_t hostile_calls[HOSTILE_CLIENTS];

static void on_upstream(om_http_request_t *req, void *ud) {
  static const om_http_header_t h[] = {{"content-type", "text/plain", 12, 10}};
  (void)ud;
  om_http_respond(req, 200, h, 1, "ok", 2);
}

static void on_stop(uv_async_t *a) {
  om_proxy_close(proxy, NULL, NULL);
  om_http_server_close(upstream, NULL);
  uv_close((uv_handle_t *)a, NULL);
}

static void *loop_main(void *arg) {
  (void)arg;
  uv_run(&loop, UV_RUN_DEFAULT);
  return NULL;
}

static int client_connect(void) {
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)proxy_port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    perror("bench_isolation: connect");
    exit(1);
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* One request on fd, the whole response read; its status. */
static int roundtrip(int fd, const char *req, size_t len) {
  static __thread char buf[65536];
  size_t have = 0, need = 0;
  char *end = NULL, *cl;
  if (write(fd, req, len) != (ssize_t)len)
    exit(1);
  for (;;) {
    ssize_t n = read(fd, buf + have, sizeof buf - 1 - have);
    if (n <= 0) {
      fprintf(stderr, "bench_isolation: the proxy closed the connection\n");
      exit(1);
    }
    have += (size_t)n;
    buf[have] = '\0';
    if (end == NULL && (end = strstr(buf, "\r\n\r\n")) != NULL) {
      cl = strcasestr(buf, "content-length:");
      need = (size_t)(end + 4 - buf) + (cl ? strtoul(cl + 15, NULL, 10) : 0);
    }
    if (end != NULL && have >= need)
      return atoi(buf + 9);
  }
}

static double calm_p50_us(void) {
  static const char req[] = "GET / HTTP/1.1\r\nHost: calm\r\n\r\n";
  static double t[CALLS];
  int fd = client_connect();
  for (int i = 0; i < 200; i++) /* warm-up */
    roundtrip(fd, req, sizeof req - 1);
  for (int i = 0; i < CALLS; i++) {
    uint64_t t0 = om_bench_now_ns();
    if (roundtrip(fd, req, sizeof req - 1) != 200) {
      fprintf(stderr, "bench_isolation: calm answered non-200\n");
      exit(1);
    }
    t[i] = (double)(om_bench_now_ns() - t0) / 1e3;
  }
  close(fd);
  return om_bench_median(t, CALLS);
}

static void *hostile_main(void *arg) {
  char req[9000];
  size_t len;
  int fd = client_connect();
  uint64_t *calls = arg;
  len = (size_t)snprintf(req, sizeof req,
                         "GET / HTTP/1.1\r\nHost: hostile\r\n"
                         "x-tags: ");
  for (int i = 0; i < 8192; i++)
    req[len++] = (char)('a' + i % 26);
  memcpy(req + len, "\r\n\r\n", 4);
  len += 4;
  while (hostile_run) {
    uint64_t t0 = om_bench_now_ns(), dt;
    if (roundtrip(fd, req, len) != 500) {
      fprintf(stderr, "bench_isolation: hostile answered non-500\n");
      exit(1);
    }
    (*calls)++;
    dt = om_bench_now_ns() - t0;
    if (dt < HOSTILE_EVERY_NS)
      usleep((useconds_t)((HOSTILE_EVERY_NS - dt) / 1000));
  }
  close(fd);
  return NULL;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0)
    exit(1);
}

int main(void) {
  char dir[] = "/tmp/om_bench_isolation_XXXXXX", calm[96], doc[512];
  char err[1024];
  om_proxy_service_policy_t sp = {"hostile", OM_SOURCE_DIR
                                  "/tests/fixtures/hostile_policy.lua"};
  om_proxy_opts_t o;
  om_snapshot_t **snaps = NULL;
  size_t n = 0;
  pthread_t lt, ht[HOSTILE_CLIENTS];
  double total = 0;
  double base[ROUNDS], loaded[ROUNDS], ratio[ROUNDS];
  if (mkdtemp(dir) == NULL)
    return 1;
  snprintf(calm, sizeof calm, "%s/calm.lua", dir);
  write_file(calm, "return {kind = 'traffic', subset = function(_, peers) "
                   "return peers end}\n");
  uv_loop_init(&loop);
  if (om_http_server_new(&loop, NULL, on_upstream, NULL, &upstream) != 0 ||
      om_http_server_listen(upstream, "127.0.0.1", 0) != 0)
    return 1;
  memset(&o, 0, sizeof o);
  o.policy_path = calm;
  o.service_policies = &sp;
  o.n_service_policies = 1;
  o.lib_dir = OM_SOURCE_DIR "/lua";
  if (om_proxy_new(&loop, &o, &proxy, err, sizeof err) != 0 ||
      om_proxy_listen(proxy, "127.0.0.1", 0) != 0) {
    fprintf(stderr, "bench_isolation: %s\n", err);
    return 1;
  }
  proxy_port = om_proxy_port(proxy);
  snprintf(doc, sizeof doc,
           "{\"services\": {\"calm\": {\"instances\": [{\"id\": \"u\", "
           "\"url\": \"http://127.0.0.1:%d\"}]}, \"hostile\": {\"instances\": "
           "[{\"id\": \"u\", \"url\": \"http://127.0.0.1:%d\"}]}}}",
           om_http_server_port(upstream), om_http_server_port(upstream));
  if (om_proxy_static_parse(doc, strlen(doc), &snaps, &n, err, sizeof err) != 0)
    return 1;
  for (size_t i = 0; i < n; i++)
    if (om_proxy_set_snapshot(proxy, snaps[i], err, sizeof err) != 0) {
      fprintf(stderr, "bench_isolation: %s\n", err);
      return 1;
    }
  om_proxy_static_free(snaps, n);
  uv_async_init(&loop, &stop_async, on_stop);
  pthread_create(&lt, NULL, loop_main, NULL);

  for (int r = 0; r < ROUNDS; r++) {
    base[r] = calm_p50_us();
    hostile_run = 1;
    for (int k = 0; k < HOSTILE_CLIENTS; k++)
      pthread_create(&ht[k], NULL, hostile_main, &hostile_calls[k]);
    loaded[r] = calm_p50_us();
    hostile_run = 0;
    for (int k = 0; k < HOSTILE_CLIENTS; k++)
      pthread_join(ht[k], NULL);
    ratio[r] = loaded[r] / base[r];
  }
  om_bench_report("isolation_calm_p50_us", om_bench_median(base, ROUNDS), "us");
  om_bench_report("isolation_calm_p50_hostile_us",
                  om_bench_median(loaded, ROUNDS), "us");
  om_bench_report("isolation_calm_p50_ratio", om_bench_median(ratio, ROUNDS),
                  "x");
  for (int k = 0; k < HOSTILE_CLIENTS; k++)
    total += (double)hostile_calls[k];
  om_bench_report("isolation_hostile_calls", total, "calls");
  uv_async_send(&stop_async);
  pthread_join(lt, NULL);
  uv_loop_close(&loop);
  unlink(calm);
  rmdir(dir);
  return 0;
}
