/*
 * bench_upstream.c: the upstream client's cost per request, against a
 * minimal upstream on loopback that runs its own loop in another thread,
 * so the client thread's CPU time (getrusage RUSAGE_THREAD) is the
 * client's alone: our code, libuv, the syscalls of one exchange.
 *
 * Sequential keep-alive GETs on one connection: each request is sent
 * from the previous one's on_done (the proxy's pattern: the pooled
 * connection is taken again at once). The baseline, in the same run and
 * against the same server, is a libcurl easy handle doing the same
 * (keep-alive reused, CURLOPT_NOSIGNAL), rounds interleaved A B A B.
 *
 * Figures (median of ROUNDS after a warm-up):
 *   upstream_req_per_s          requests/s, one in flight
 *   upstream_cpu_per_request_us client-thread CPU per request
 *   libcurl_req_per_s           the same with libcurl easy
 *   libcurl_cpu_per_request_us  its CPU per request
 *   upstream_cpu_vs_libcurl     ratio of the two CPU figures
 *   *_user_cpu_per_request_us   the user-space part of those (the rest is
 *                               the kernel: loopback TCP, epoll, wakeups)
 *   upstream_c16_req_per_s      16 requests in flight on 16 connections
 *   upstream_c16_cpu_per_request_us  (closer to a loaded proxy: one
 *                               epoll_wait serves several responses)
 *
 * On a small VM the sequential figures are bimodal: when the two threads
 * sit on different cores, every exchange pays a cross-core wakeup in the
 * kernel (15-25 us of system time, libcurl's too); on one core
 * (`taskset -c 0`) or a quiet machine, about 3 us. Read them with the
 * ratio taken in the same run, and the user-space figures.
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <arpa/inet.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>

#include <curl/curl.h>
#include <uv.h>

#include "om_bench.h"
#include "om_upstream.h"

#define ROUNDS 5
#define PER_ROUND 10000
#define WARMUP 2000
#define WIDTH 16 /* in flight for the c16 figures */

/* ------------------------------------------------------------------ */
/* the upstream: a minimal HTTP/1.1 responder on its own loop/thread */

static const char RESP[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                           "Content-Length: 2\r\n\r\nok";

typedef struct {
  uv_tcp_t tcp;
  int state; /* how much of "\r\n\r\n" was matched */
} sconn_t;

typedef struct {
  uv_loop_t loop;
  uv_tcp_t lis;
  uv_async_t stop;
  int port;
} upstream_t;

static char sbuf[65536]; /* server thread only */

static void s_alloc(uv_handle_t *h, size_t sug, uv_buf_t *b) {
  (void)h;
  (void)sug;
  b->base = sbuf;
  b->len = sizeof sbuf;
}

static void s_closed(uv_handle_t *h) {
  free(h->data);
}

static void s_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  sconn_t *c = st->data;
  ssize_t i;
  if (n < 0) {
    uv_close((uv_handle_t *)st, s_closed);
    return;
  }
  /* requests are GETs without a body: one response per empty line */
  for (i = 0; i < n; i++) {
    char ch = b->base[i];
    if ((c->state % 2 == 0 && ch == '\r') || (c->state % 2 == 1 && ch == '\n'))
      c->state++;
    else
      c->state = ch == '\r' ? 1 : 0;
    if (c->state == 4) {
      uv_buf_t r = uv_buf_init((char *)RESP, sizeof RESP - 1);
      c->state = 0;
      if (uv_try_write(st, &r, 1) != (int)(sizeof RESP - 1)) {
        fprintf(stderr, "bench_upstream: short server write\n");
        exit(1);
      }
    }
  }
}

static void s_conn(uv_stream_t *l, int status) {
  sconn_t *c;
  if (status < 0)
    return;
  c = calloc(1, sizeof *c);
  if (c == NULL)
    exit(1);
  uv_tcp_init(l->loop, &c->tcp);
  c->tcp.data = c;
  if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0)
    exit(1);
  uv_tcp_nodelay(&c->tcp, 1);
  uv_read_start((uv_stream_t *)&c->tcp, s_alloc, s_read);
}

static void s_walk_close(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, h->type == UV_TCP && h->data != NULL ? s_closed : NULL);
}

static void s_stop(uv_async_t *a) {
  uv_walk(a->loop, s_walk_close, NULL);
}

static void s_thread(void *arg) {
  upstream_t *u = arg;
  uv_run(&u->loop, UV_RUN_DEFAULT);
}

static void upstream_start(upstream_t *u, uv_thread_t *th) {
  struct sockaddr_in a;
  int len = sizeof a;
  uv_loop_init(&u->loop);
  uv_tcp_init(&u->loop, &u->lis);
  u->lis.data = NULL;
  uv_ip4_addr("127.0.0.1", 0, &a);
  if (uv_tcp_bind(&u->lis, (struct sockaddr *)&a, 0) != 0 ||
      uv_listen((uv_stream_t *)&u->lis, 128, s_conn) != 0) {
    fprintf(stderr, "bench_upstream: cannot listen\n");
    exit(1);
  }
  uv_tcp_getsockname(&u->lis, (struct sockaddr *)&a, &len);
  u->port = ntohs(a.sin_port);
  uv_async_init(&u->loop, &u->stop, s_stop);
  uv_thread_create(th, s_thread, u);
}

/* ------------------------------------------------------------------ */
/* measuring */

static double thread_user_us(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return (double)ru.ru_utime.tv_sec * 1e6 + (double)ru.ru_utime.tv_usec;
}

static double thread_cpu_us(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return (double)ru.ru_utime.tv_sec * 1e6 + (double)ru.ru_utime.tv_usec +
         (double)ru.ru_stime.tv_sec * 1e6 + (double)ru.ru_stime.tv_usec;
}

/* ------------------------------------------------------------------ */
/* the client under test */

typedef struct {
  uv_loop_t *loop;
  om_upstream_pool_t *pool;
  om_upstream_target_t tgt;
  om_upstream_request_t q;
  int left, inflight, failed;
  size_t body;
} run_t;

typedef struct {
  double rps, cpu_us, user_us;
} fig_t;

static const om_upstream_callbacks_t CB;

static void next(run_t *r) {
  om_upstream_req_t *req;
  if (r->left == 0) {
    if (r->inflight == 0)
      uv_stop(r->loop); /* pooled connections keep the loop alive */
    return;
  }
  r->left--;
  r->inflight++;
  if (om_upstream_send(r->pool, &r->tgt, &r->q, &CB, r, &req) != 0) {
    r->failed++;
    r->inflight--;
  }
}

static void on_body(void *ud, const char *d, size_t n) {
  run_t *r = ud;
  (void)d;
  r->body += n;
}

static void on_done(void *ud, const om_upstream_result_t *res) {
  run_t *r = ud;
  r->inflight--;
  if (res->err != 0) {
    r->failed++;
    uv_stop(r->loop);
    return;
  }
  next(r);
}

static const om_upstream_callbacks_t CB = {NULL, on_body, on_done, NULL};

/* n requests, `width` in flight (each on its own pooled connection) */
static void ours(run_t *r, int n, int width, fig_t *f) {
  uint64_t t0;
  double c0, u0;
  int i;
  r->left = n;
  t0 = om_bench_now_ns();
  c0 = thread_cpu_us();
  u0 = thread_user_us();
  for (i = 0; i < width; i++)
    next(r);
  uv_run(r->loop, UV_RUN_DEFAULT);
  f->cpu_us = (thread_cpu_us() - c0) / n;
  f->user_us = (thread_user_us() - u0) / n;
  f->rps = n / ((double)(om_bench_now_ns() - t0) / 1e9);
  if (r->failed != 0 || r->left != 0 || r->inflight != 0) {
    fprintf(stderr, "bench_upstream: %d requests failed\n", r->failed);
    exit(1);
  }
}

/* ------------------------------------------------------------------ */
/* the baseline */

static size_t curl_sink(char *p, size_t sz, size_t n, void *ud) {
  (void)p;
  *(size_t *)ud += sz * n;
  return sz * n;
}

static void baseline(CURL *e, int n, fig_t *f) {
  uint64_t t0 = om_bench_now_ns();
  double c0 = thread_cpu_us(), u0 = thread_user_us();
  int i;
  for (i = 0; i < n; i++) {
    long code = 0;
    if (curl_easy_perform(e) != CURLE_OK ||
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK ||
        code != 200) {
      fprintf(stderr, "bench_upstream: curl request failed\n");
      exit(1);
    }
  }
  f->cpu_us = (thread_cpu_us() - c0) / n;
  f->user_us = (thread_user_us() - u0) / n;
  f->rps = n / ((double)(om_bench_now_ns() - t0) / 1e9);
}

static double med(const fig_t *f, size_t off) {
  double v[ROUNDS];
  int i;
  for (i = 0; i < ROUNDS; i++)
    v[i] = *(const double *)((const char *)&f[i] + off);
  return om_bench_median(v, ROUNDS);
}

int main(void) {
  upstream_t u;
  uv_thread_t th;
  uv_loop_t loop;
  run_t r;
  CURL *e;
  char url[64];
  size_t sink = 0;
  fig_t o[ROUNDS], w[ROUNDS], c[ROUNDS], x;
  om_upstream_stats_t st;
  int i;
  signal(SIGPIPE, SIG_IGN);
  upstream_start(&u, &th);

  uv_loop_init(&loop);
  memset(&r, 0, sizeof r);
  r.loop = &loop;
  if (om_upstream_pool_new(&loop, NULL, &r.pool) != 0 ||
      om_upstream_target_init(&r.tgt, "127.0.0.1", u.port) != 0)
    return 1;
  r.q.method = "GET";
  r.q.target = "/bench";
  r.q.connect_timeout_ms = 1000;
  r.q.first_byte_timeout_ms = 5000;
  r.q.timeout_ms = 10000;
  r.q.retry_stale = 1; /* a GET: safe to re-send after a stale reuse */

  curl_global_init(CURL_GLOBAL_DEFAULT);
  e = curl_easy_init();
  snprintf(url, sizeof url, "http://127.0.0.1:%d/bench", u.port);
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, curl_sink);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &sink);

  /* warm-up: connections open, caches and free lists full */
  ours(&r, WARMUP, WIDTH, &x);
  baseline(e, WARMUP, &x);
  for (i = 0; i < ROUNDS; i++) {
    ours(&r, PER_ROUND, 1, &o[i]);
    baseline(e, PER_ROUND, &c[i]);
    ours(&r, PER_ROUND, WIDTH, &w[i]);
  }
  om_upstream_pool_stats(r.pool, &st);
  if (st.connects != WIDTH ||
      r.body != 2u * (WARMUP + 2 * ROUNDS * PER_ROUND)) {
    fprintf(stderr, "bench_upstream: %llu connections, %zu body bytes\n",
            (unsigned long long)st.connects, r.body);
    return 1;
  }

  om_bench_report("upstream_req_per_s", med(o, offsetof(fig_t, rps)), "req/s");
  om_bench_report("upstream_cpu_per_request_us",
                  med(o, offsetof(fig_t, cpu_us)), "us");
  om_bench_report("upstream_user_cpu_per_request_us",
                  med(o, offsetof(fig_t, user_us)), "us");
  om_bench_report("libcurl_req_per_s", med(c, offsetof(fig_t, rps)), "req/s");
  om_bench_report("libcurl_cpu_per_request_us", med(c, offsetof(fig_t, cpu_us)),
                  "us");
  om_bench_report("libcurl_user_cpu_per_request_us",
                  med(c, offsetof(fig_t, user_us)), "us");
  om_bench_report("upstream_cpu_vs_libcurl",
                  med(o, offsetof(fig_t, cpu_us)) /
                      med(c, offsetof(fig_t, cpu_us)),
                  "ratio");
  om_bench_report("upstream_c16_req_per_s", med(w, offsetof(fig_t, rps)),
                  "req/s");
  om_bench_report("upstream_c16_cpu_per_request_us",
                  med(w, offsetof(fig_t, cpu_us)), "us");

  curl_easy_cleanup(e);
  curl_global_cleanup();
  om_upstream_pool_close(r.pool, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  uv_async_send(&u.stop);
  uv_thread_join(&th);
  uv_loop_close(&u.loop);
  return 0;
}
