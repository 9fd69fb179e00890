/*
 * bench_control.c: the real control plane (om_control over the memory
 * store) under load on loopback. The server runs as `openmesh control`
 * does, on one libuv loop in one thread (one core); the load generator is
 * the main thread: raw non-blocking sockets on epoll, keep-alive, one
 * request in flight per connection (no pipelining). A bare om_http_server
 * on the same server loop is the baseline: it answers the same requests
 * with the same bytes and does no work, so the ratio of the two rates is
 * the control plane's own cost (routing, JSON, the lease, the answer).
 *
 * Figures:
 *   control_registrations_per_s        10,000 PUTs that each create an
 *                                      instance (each a new revision and
 *                                      snapshot), 64 connections
 *   control_bytes_per_instance         heap grown by those 10,000 / 10,000
 *   registrations_per_s_100k_one_service  100,000 registrations into one
 *                                      service (its own server): the rate
 *                                      over the last 10,000
 *   control_heartbeats_per_s_100k      renewals over those 100,000, median
 *                                      of 3 rounds of 1 s
 *   control_bytes_per_instance_100k    heap grown by them / 100,000
 *   control_heartbeats_per_s           PUT renewals (identical body, answer
 *                                      "renewed") spread over the 10,000
 *                                      instances, 64 connections; median of
 *                                      3 rounds of 1 s after a warm-up
 *   control_heartbeats_baseline_per_s  the same requests, same client, same
 *                                      rounds, against the bare server
 *   control_heartbeats_vs_baseline     the ratio of the two
 *   control_heartbeat_server_cpu_us    CPU time of the server thread per
 *                                      renewal (user + system): what one
 *                                      core can sustain is 1e6 / this, also
 *                                      when the closed loop leaves it idle
 *   control_heartbeat_baseline_server_cpu_us  the same, bare server
 *   control_bytes_per_idle_watcher     heap grown by 1,000 SSE watchers of
 *                                      one service that hold their first
 *                                      snapshot, / 1,000
 *   control_bytes_per_idle_connection_baseline
 *                                      the same, for 1,000 keep-alive
 *                                      connections to the bare server that
 *                                      answered the same request and idle
 *   control_fanout_p50_ms, _p99_ms     1,000 watchers of one service: from
 *                                      sending a registration PUT to the
 *                                      LAST watcher holding the complete new
 *                                      snapshot event; 50 registrations
 *                                      after 5 warm-up ones (p99 of 50 is
 *                                      the nearest rank, i.e. the maximum)
 *
 * With the Redis store (a redis-server this bench starts on a free loopback
 * port, no persistence; skipped with a note when redis-server is missing):
 *   control_redis_heartbeats_per_s    the same heartbeat load through one
 *                                     control plane on the Redis store
 *                                     (10,000 instances registered first)
 *   control_redis_heartbeats_vs_memory  that rate / the memory store's
 *                                     (bar: >= 0.25)
 *   control_redis_propagation_p50_ms, _p99_ms
 *                                     a registration PUT on control plane A
 *                                     to the watcher on control plane B
 *                                     (same Redis) holding the new snapshot
 *                                     event; 100 rounds after 5 warm-up
 *                                     (bar: p99 <= 50 ms)
 *
 * Heap is glibc's mallinfo2 (bytes in use in every arena plus mmapped
 * chunks), read while the server is idle; the client allocates nothing
 * between the two readings, so the delta is the server's (sanitized
 * builds replace malloc: the heap figures read 0 there).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "om_bench.h"
#include "om_control.h"
#include "om_http_server.h"
#include "om_log.h"
#include "om_store_memory.h"
#include "om_store_redis.h"

#include <spawn.h>
#include <sys/wait.h>

#define N_INSTANCES 10000
#define N_CONNS 64
#define HB_ROUNDS 3
#define HB_ROUND_NS 1000000000ull
#define HB_WARMUP_NS 300000000ull
#define N_WATCHERS 1000
#define FAN_WARMUP 5
#define FAN_ROUNDS 50
#define STALL_MS 10000       /* no progress this long: the bench fails */
#define BIG_INSTANCES 100000 /* the one-big-service figures */
#define BIG_TAIL 10000       /* registrations_per_s over the last of them */

/* Instance ids drive() cycles through (mod). */
static unsigned id_space = N_INSTANCES;

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "bench_control: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static double heap_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return (double)m.uordblks + (double)m.hblkhd;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* ------------------------------------------------------------------ */
/* the server side: its own loop, its own thread */

/* What the control plane answers a renewal, byte for byte in length. */
static const char BARE_BODY[] = "{\"service\":\"hb\",\"id\":\"i00000\","
                                "\"revision\":1795972261801387,"
                                "\"change\":\"renewed\"}";

typedef struct server_s {
  uv_loop_t loop;
  uv_async_t stop;
  uv_thread_t thread;
  om_store_t *store;
  om_control_t *ctl;
  om_http_server_t *bare;
  int ctl_port, bare_port;
} server_t;

static void bare_handler(om_http_request_t *req, void *ud) {
  static const om_http_header_t h[] = {
      {"Content-Type", "application/json", 0, 0},
      {"Cache-Control", "no-cache", 0, 0}};
  (void)ud;
  om_http_respond(req, 200, h, 2, BARE_BODY, sizeof BARE_BODY - 1);
}

static void on_ctl_closed(void *ud) {
  server_t *s = ud;
  om_store_close(s->store, NULL, NULL);
}

static void on_stop(uv_async_t *a) {
  server_t *s = a->data;
  om_control_close(s->ctl, on_ctl_closed, s);
  om_http_server_close(s->bare, NULL);
  uv_close((uv_handle_t *)a, NULL);
}

static void server_run(void *arg) {
  server_t *s = arg;
  uv_run(&s->loop, UV_RUN_DEFAULT);
}

static void on_store_state(void *ud, int status) {
  if (status == 0)
    *(int *)ud = 1;
}

/* redis_url NULL: the memory store; else the Redis store, waited for. */
static void server_start(server_t *s, const char *redis_url) {
  om_control_opts_t co;
  memset(s, 0, sizeof *s);
  memset(&co, 0, sizeof co);
  if (uv_loop_init(&s->loop) != 0)
    die("cannot create the loop");
  if (redis_url != NULL) {
    om_store_redis_opts_t ro;
    int ready = 0;
    uint64_t t0 = om_bench_now_ns();
    memset(&ro, 0, sizeof ro);
    ro.url = redis_url;
    ro.on_state = on_store_state;
    ro.state_ud = &ready;
    if (om_store_redis_new(&s->loop, &ro, &s->store) != 0)
      die("cannot create the redis store");
    while (!ready && om_bench_now_ns() - t0 < 5000000000ull)
      uv_run(&s->loop, UV_RUN_ONCE);
    if (!ready)
      die("redis at %s not ready", redis_url);
  } else if (om_store_memory_new(&s->loop, NULL, &s->store) != 0) {
    die("cannot create the store");
  }
  co.store = s->store;
  /* No `: ping` while measuring: idle means idle. */
  co.ping_interval_ms = 3600000;
  if (om_control_new(&s->loop, &co, &s->ctl) != 0 ||
      om_control_listen(s->ctl, "127.0.0.1", 0) != 0)
    die("cannot start the control plane");
  if (om_http_server_new(&s->loop, NULL, bare_handler, NULL, &s->bare) != 0 ||
      om_http_server_listen(s->bare, "127.0.0.1", 0) != 0)
    die("cannot start the baseline server");
  s->ctl_port = om_control_port(s->ctl);
  s->bare_port = om_http_server_port(s->bare);
  uv_async_init(&s->loop, &s->stop, on_stop);
  s->stop.data = s;
  /* From here on only the server thread touches the loop. */
  if (uv_thread_create(&s->thread, server_run, s) != 0)
    die("cannot start the server thread");
}

/* CPU time the server thread has used (user and system). */
static uint64_t server_cpu_ns(const server_t *s) {
  clockid_t id;
  struct timespec ts;
  if (pthread_getcpuclockid(s->thread, &id) != 0 || clock_gettime(id, &ts) != 0)
    die("cannot read the server thread's CPU clock");
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Close everything on the server loop, wait for it, free the loop. */
static void server_stop(server_t *s) {
  uv_async_send(&s->stop);
  uv_thread_join(&s->thread);
  if (uv_loop_close(&s->loop) != 0)
    die("handles left on the server loop");
}

/* ------------------------------------------------------------------ */
/* the client side: keep-alive request/response connections */

typedef struct conn_s {
  int fd;
  int busy; /* a request in flight */
  size_t have;
  char buf[4096];
} conn_t;

static int dial(int port) {
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
    die("connect to port %d: %s", port, strerror(errno));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

static void send_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
    } else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 100);
    } else {
      die("send: %s", strerror(errno));
    }
  }
}

/* Instance i of a service, always with the same body, so that a second
 * PUT is a renewal that changes nothing. */
static size_t put_request(char *out, size_t cap, const char *svc, unsigned i) {
  char body[256];
  int bl = snprintf(body, sizeof body,
                    "{\"url\":\"http://10.%u.%u.%u:8080\",\"ttl_ms\":600000,"
                    "\"weight\":1,\"zone\":\"z%u\","
                    "\"metadata\":{\"version\":\"v1\"}}",
                    i >> 16 & 255, i >> 8 & 255, i & 255, i % 3);
  int n = snprintf(out, cap,
                   "PUT /v1/services/%s/instances/i%05u HTTP/1.1\r\n"
                   "Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   "Content-Length: %d\r\n\r\n%s",
                   svc, i, bl, body);
  if (bl <= 0 || n <= 0 || (size_t)n >= cap)
    die("request too long");
  return (size_t)n;
}

static const char *find(const char *h, size_t n, const char *needle) {
  size_t k = strlen(needle);
  for (size_t i = 0; i + k <= n; i++)
    if (memcmp(h + i, needle, k) == 0)
      return h + i;
  return NULL;
}

/* Content-Length of a header block (no other framing is expected). */
static size_t content_length(const char *h, size_t n) {
  for (size_t i = 0; i + 16 <= n; i++)
    if ((i == 0 || h[i - 1] == '\n') &&
        strncasecmp(h + i, "content-length:", 15) == 0)
      return strtoul(h + i + 15, NULL, 10);
  return 0;
}

/*
 * Take one complete response off c->buf, if there is one: returns 1 and
 * checks its status and that the body contains expect (when not NULL);
 * the revision it names goes to *rev (when not NULL). 0: incomplete.
 */
static int take_response(conn_t *c, const char *expect, uint64_t *rev) {
  const char *he = find(c->buf, c->have, "\r\n\r\n");
  size_t hl, bl;
  if (he == NULL)
    return 0;
  hl = (size_t)(he + 4 - c->buf);
  bl = content_length(c->buf, hl);
  if (c->have < hl + bl)
    return 0;
  if (c->have < 12 || memcmp(c->buf, "HTTP/1.1 200", 12) != 0)
    die("unexpected answer: %.*s", (int)(hl + bl), c->buf);
  if (expect != NULL && find(c->buf + hl, bl, expect) == NULL)
    die("answer without %s: %.*s", expect, (int)bl, c->buf + hl);
  if (rev != NULL) {
    const char *r = find(c->buf + hl, bl, "\"revision\":");
    *rev = r != NULL ? strtoull(r + 11, NULL, 10) : 0;
  }
  memmove(c->buf, c->buf + hl + bl, c->have - hl - bl);
  c->have -= hl + bl;
  return 1;
}

/* Read what is there; 0 when the socket would block. */
static int fill(conn_t *c) {
  ssize_t k;
  if (c->have == sizeof c->buf)
    die("response too large");
  k = recv(c->fd, c->buf + c->have, sizeof c->buf - c->have, 0);
  if (k > 0) {
    c->have += (size_t)k;
    return 1;
  }
  if (k < 0 && (errno == EAGAIN || errno == EINTR))
    return 0;
  die("connection lost: %s", k == 0 ? "EOF" : strerror(errno));
  return 0;
}

/* One request, waited for (setup steps, not measured). */
static void request(conn_t *c, const char *req, size_t n, const char *expect,
                    uint64_t *rev) {
  send_all(c->fd, req, n);
  while (!take_response(c, expect, rev)) {
    struct pollfd pf = {c->fd, POLLIN, 0};
    if (poll(&pf, 1, STALL_MS) <= 0)
      die("no answer within %d ms", STALL_MS);
    fill(c);
  }
}

/*
 * A closed-loop load: every connection keeps one PUT of `svc` in flight,
 * instances in round-robin order from *next (mod id_space), until
 * `count` requests were sent or `until_ns` passed; then the last answers
 * are waited for. Every answer must contain expect. Returns the requests
 * answered per second, from the first send to the last answer; their
 * number goes to *n_done when not NULL.
 */
static double drive(conn_t *cs, int n, const char *svc, unsigned *next,
                    uint64_t count, uint64_t until_ns, const char *expect,
                    uint64_t *n_done) {
  struct epoll_event evs[N_CONNS];
  char req[512];
  uint64_t sent = 0, done = 0, t0 = om_bench_now_ns(), t1;
  int ep = epoll_create1(0), busy = 0;
  if (ep < 0)
    die("epoll_create1: %s", strerror(errno));
  for (int i = 0; i < n; i++) {
    struct epoll_event ev;
    ev.events = EPOLLIN;
    ev.data.u32 = (uint32_t)i;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev) != 0)
      die("epoll_ctl: %s", strerror(errno));
    if (sent < count) {
      size_t k = put_request(req, sizeof req, svc, *next);
      *next = (*next + 1) % id_space;
      send_all(cs[i].fd, req, k);
      cs[i].busy = 1;
      sent++;
      busy++;
    }
  }
  while (busy > 0) {
    int k = epoll_wait(ep, evs, N_CONNS, STALL_MS);
    if (k == 0)
      die("load stalled: %d requests unanswered", busy);
    if (k < 0 && errno != EINTR)
      die("epoll_wait: %s", strerror(errno));
    for (int e = 0; e < k; e++) {
      conn_t *c = &cs[evs[e].data.u32];
      while (fill(c))
        ;
      while (c->busy && take_response(c, expect, NULL)) {
        done++;
        if (sent < count && om_bench_now_ns() < until_ns) {
          size_t l = put_request(req, sizeof req, svc, *next);
          *next = (*next + 1) % id_space;
          send_all(c->fd, req, l);
          sent++;
        } else {
          c->busy = 0;
          busy--;
        }
      }
    }
  }
  t1 = om_bench_now_ns();
  close(ep);
  if (n_done != NULL)
    *n_done = done;
  return (double)done / ((double)(t1 - t0) / 1e9);
}

static void conns_open(conn_t *cs, int n, int port) {
  for (int i = 0; i < n; i++) {
    memset(&cs[i], 0, sizeof cs[i]);
    cs[i].fd = dial(port);
  }
}

static void conns_close(conn_t *cs, int n) {
  for (int i = 0; i < n; i++)
    close(cs[i].fd);
}

/* ------------------------------------------------------------------ */
/* heartbeats and memory per instance */

static double bench_heartbeats(const server_t *s) {
  static conn_t ctl[N_CONNS], bare[N_CONNS];
  double hb[HB_ROUNDS], base[HB_ROUNDS], reg, m0, m1;
  double hb_cpu[HB_ROUNDS], base_cpu[HB_ROUNDS];
  unsigned next = 0, bnext = 0;
  char req[512];
  conns_open(ctl, N_CONNS, s->ctl_port);
  conns_open(bare, N_CONNS, s->bare_port);
  /* Every connection has served a PUT before the first reading, so what
   * the server keeps per connection is not counted per instance. */
  for (int i = 0; i < N_CONNS; i++) {
    size_t k = put_request(req, sizeof req, "warm", (unsigned)i);
    request(&ctl[i], req, k, "\"created\"", NULL);
    k = put_request(req, sizeof req, "warm", (unsigned)i);
    request(&bare[i], req, k, NULL, NULL);
  }
  sleep_ms(50);
  m0 = heap_bytes();
  reg = drive(ctl, N_CONNS, "hb", &next, N_INSTANCES, UINT64_MAX, "\"created\"",
              NULL);
  sleep_ms(100);
  m1 = heap_bytes();

  drive(ctl, N_CONNS, "hb", &next, UINT64_MAX, om_bench_now_ns() + HB_WARMUP_NS,
        "\"renewed\"", NULL);
  drive(bare, N_CONNS, "hb", &bnext, UINT64_MAX,
        om_bench_now_ns() + HB_WARMUP_NS, NULL, NULL);
  for (int r = 0; r < HB_ROUNDS; r++) {
    uint64_t c0 = server_cpu_ns(s), c1, c2, n1, n2;
    hb[r] = drive(ctl, N_CONNS, "hb", &next, UINT64_MAX,
                  om_bench_now_ns() + HB_ROUND_NS, "\"renewed\"", &n1);
    c1 = server_cpu_ns(s);
    base[r] = drive(bare, N_CONNS, "hb", &bnext, UINT64_MAX,
                    om_bench_now_ns() + HB_ROUND_NS, NULL, &n2);
    c2 = server_cpu_ns(s);
    hb_cpu[r] = (double)(c1 - c0) / 1e3 / (double)n1;
    base_cpu[r] = (double)(c2 - c1) / 1e3 / (double)n2;
  }
  conns_close(ctl, N_CONNS);
  conns_close(bare, N_CONNS);
  {
    double h = om_bench_median(hb, HB_ROUNDS);
    double b = om_bench_median(base, HB_ROUNDS);
    om_bench_report("control_registrations_per_s", reg, "req/s");
    om_bench_report("control_bytes_per_instance", (m1 - m0) / N_INSTANCES, "B");
    om_bench_report("control_heartbeats_per_s", h, "req/s");
    om_bench_report("control_heartbeats_baseline_per_s", b, "req/s");
    om_bench_report("control_heartbeats_vs_baseline", h / b, "x");
    om_bench_report("control_heartbeat_server_cpu_us",
                    om_bench_median(hb_cpu, HB_ROUNDS), "us");
    om_bench_report("control_heartbeat_baseline_server_cpu_us",
                    om_bench_median(base_cpu, HB_ROUNDS), "us");
    return h;
  }
}

/* ------------------------------------------------------------------ */
/* SSE watchers: fan-out and memory per idle watcher */

enum { W_HEAD, W_SIZE, W_DATA, W_CRLF };

/*
 * One watch stream, read incrementally: the response head, the chunked
 * framing (RFC 9112 7.1), then SSE lines inside the chunk data (an event
 * ends at an empty line, WHATWG HTML 9.2.6). Counts complete `snapshot`
 * events and keeps the id of the last one.
 */
typedef struct watcher_s {
  int fd;
  int phase;
  int first_line; /* still in the status line */
  uint64_t chunk_left;
  char hline[64]; /* framing line (status, header, chunk size) */
  size_t hlen;
  char sline[64]; /* SSE line, truncated: only prefixes matter */
  size_t slen;
  int in_snapshot;
  uint64_t block_id;
  uint64_t events, last_id;
} watcher_t;

static void sse_line(watcher_t *w) {
  size_t n = w->slen < sizeof w->sline ? w->slen : sizeof w->sline - 1;
  w->sline[n] = '\0';
  if (w->slen == 0) {
    if (w->in_snapshot) {
      w->events++;
      w->last_id = w->block_id;
    }
    w->in_snapshot = 0;
    w->block_id = 0;
  } else if (strcmp(w->sline, "event: snapshot") == 0) {
    w->in_snapshot = 1;
  } else if (strncmp(w->sline, "id: ", 4) == 0) {
    w->block_id = strtoull(w->sline + 4, NULL, 10);
  }
  w->slen = 0;
}

static void sse_bytes(watcher_t *w, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '\n')
      sse_line(w);
    else if (w->slen++ < sizeof w->sline - 1)
      w->sline[w->slen - 1] = p[i];
  }
}

/* A complete framing line in hline (CR stripped). */
static void frame_line(watcher_t *w) {
  size_t n = w->hlen < sizeof w->hline ? w->hlen : sizeof w->hline - 1;
  if (n > 0 && w->hline[n - 1] == '\r')
    n--;
  w->hline[n] = '\0';
  w->hlen = 0;
  if (w->phase == W_HEAD) {
    if (w->first_line) {
      if (strncmp(w->hline, "HTTP/1.1 200 ", 13) != 0)
        die("watch answered: %s", w->hline);
      w->first_line = 0;
    } else if (n == 0) {
      w->phase = W_SIZE;
    }
  } else if (w->phase == W_SIZE) {
    w->chunk_left = strtoull(w->hline, NULL, 16);
    if (w->chunk_left == 0)
      die("a watch stream ended");
    w->phase = W_DATA;
  } else { /* W_CRLF */
    if (n != 0)
      die("bad chunk framing");
    w->phase = W_SIZE;
  }
}

static void watcher_feed(watcher_t *w, const char *p, size_t n) {
  while (n > 0) {
    if (w->phase == W_DATA) {
      size_t k = n < w->chunk_left ? n : (size_t)w->chunk_left;
      sse_bytes(w, p, k);
      p += k;
      n -= k;
      if ((w->chunk_left -= k) == 0)
        w->phase = W_CRLF;
      continue;
    }
    if (*p == '\n')
      frame_line(w);
    else if (w->hlen++ < sizeof w->hline - 1)
      w->hline[w->hlen - 1] = *p;
    p++;
    n--;
  }
}

/* Read every watcher that has bytes; returns how many reached `target`
 * events during this call. */
static int watchers_poll(int ep, watcher_t *ws, uint64_t target, int ms,
                         conn_t *reg, int *reg_ready) {
  struct epoll_event evs[256];
  static char buf[65536];
  int reached = 0, k = epoll_wait(ep, evs, 256, ms);
  if (k == 0)
    die("watchers stalled for %d ms", ms);
  for (int e = 0; e < k; e++) {
    uint32_t i = evs[e].data.u32;
    watcher_t *w;
    if (i == N_WATCHERS) { /* the registering connection */
      while (fill(reg))
        ;
      *reg_ready = 1;
      continue;
    }
    w = &ws[i];
    for (;;) {
      ssize_t r = recv(w->fd, buf, sizeof buf, 0);
      if (r > 0) {
        uint64_t before = w->events;
        watcher_feed(w, buf, (size_t)r);
        if (before < target && w->events >= target)
          reached++;
      } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
        break;
      } else {
        die("a watcher lost its stream: %s", r == 0 ? "EOF" : strerror(errno));
      }
    }
  }
  return reached;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v. */
static double percentile(const double *v, size_t n, double p) {
  size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
  return v[rank == 0 ? 0 : rank - 1];
}

static void bench_fanout(const server_t *s) {
  static const char watch[] = "GET /v1/watch/services/fan HTTP/1.1\r\n"
                              "Host: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                              "\r\n";
  watcher_t *ws = calloc(N_WATCHERS, sizeof *ws);
  double lat[FAN_ROUNDS], m0, m1, base;
  conn_t *reg = calloc(1, sizeof *reg);
  char req[512];
  int ep = epoll_create1(0), got;
  struct epoll_event ev;
  if (ws == NULL || reg == NULL || ep < 0)
    die("out of memory");
  reg->fd = dial(s->ctl_port);
  {
    size_t k = put_request(req, sizeof req, "fan", 99999);
    request(reg, req, k, "\"created\"", NULL);
  }
  ev.events = EPOLLIN;
  ev.data.u32 = N_WATCHERS;
  epoll_ctl(ep, EPOLL_CTL_ADD, reg->fd, &ev);
  /* Baseline: the same request on as many connections to the bare server,
   * answered, the connections left open and idle. */
  sleep_ms(50);
  m0 = heap_bytes();
  for (int i = 0; i < N_WATCHERS; i++) {
    conn_t c;
    c.fd = ws[i].fd = dial(s->bare_port);
    c.have = 0;
    request(&c, watch, sizeof watch - 1, NULL, NULL);
  }
  sleep_ms(100);
  base = (heap_bytes() - m0) / N_WATCHERS;
  for (int i = 0; i < N_WATCHERS; i++)
    close(ws[i].fd);
  sleep_ms(100); /* the server frees them */

  m0 = heap_bytes();
  for (int i = 0; i < N_WATCHERS; i++) {
    ws[i].fd = dial(s->ctl_port);
    ws[i].first_line = 1;
    ev.data.u32 = (uint32_t)i;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ws[i].fd, &ev) != 0)
      die("epoll_ctl: %s", strerror(errno));
    send_all(ws[i].fd, watch, sizeof watch - 1);
  }
  for (got = 0; got < N_WATCHERS;) {
    int dummy = 0;
    got += watchers_poll(ep, ws, 1, STALL_MS, reg, &dummy);
  }
  sleep_ms(100);
  m1 = heap_bytes();

  for (int r = 0; r < FAN_WARMUP + FAN_ROUNDS; r++) {
    uint64_t t0, t_last = 0, rev = 0;
    int reg_done = 0;
    size_t k = put_request(req, sizeof req, "fan", (unsigned)r);
    t0 = om_bench_now_ns();
    send_all(reg->fd, req, k);
    for (got = 0; got < N_WATCHERS || !reg_done;) {
      int ready = 0;
      got += watchers_poll(ep, ws, (uint64_t)r + 2, STALL_MS, reg, &ready);
      if (got == N_WATCHERS && t_last == 0)
        t_last = om_bench_now_ns();
      if (ready && !reg_done)
        reg_done = take_response(reg, "\"created\"", &rev);
    }
    for (int i = 0; i < N_WATCHERS; i++)
      if (ws[i].events != (uint64_t)r + 2 || ws[i].last_id != rev)
        die("watcher %d: %llu events, last id %llu, expected revision %llu", i,
            (unsigned long long)ws[i].events, (unsigned long long)ws[i].last_id,
            (unsigned long long)rev);
    if (r >= FAN_WARMUP)
      lat[r - FAN_WARMUP] = (double)(t_last - t0) / 1e6;
  }
  qsort(lat, FAN_ROUNDS, sizeof lat[0], cmp_double);
  om_bench_report("control_bytes_per_idle_watcher", (m1 - m0) / N_WATCHERS,
                  "B");
  om_bench_report("control_bytes_per_idle_connection_baseline", base, "B");
  om_bench_report("control_fanout_p50_ms", percentile(lat, FAN_ROUNDS, 50),
                  "ms");
  om_bench_report("control_fanout_p99_ms", percentile(lat, FAN_ROUNDS, 99),
                  "ms");
  for (int i = 0; i < N_WATCHERS; i++)
    close(ws[i].fd);
  close(reg->fd);
  close(ep);
  free(ws);
  free(reg);
}

/* ------------------------------------------------------------------ */
/* the Redis store: heartbeats, and propagation from one plane to another */

static pid_t redis_pid = -1;
static char redis_dir[64];

static int redis_spawn(char *url, size_t cap) {
  extern char **environ;
  char port[16];
  int p;
  struct sockaddr_in a;
  socklen_t l = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  char *argv[] = {"redis-server", "--port", port,      "--bind",
                  "127.0.0.1",    "--save", "",        "--appendonly",
                  "no",           "--dir",  redis_dir, "--loglevel",
                  "warning",      NULL};
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &l) != 0)
    die("no free port");
  p = ntohs(a.sin_port);
  close(fd);
  snprintf(port, sizeof port, "%d", p);
  snprintf(redis_dir, sizeof redis_dir, "/tmp/om_bench_redis_XXXXXX");
  if (mkdtemp(redis_dir) == NULL)
    return -1;
  {
    /* its start-up banner ignores --loglevel: keep our output clean */
    posix_spawn_file_actions_t fa;
    int rc;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    rc = posix_spawnp(&redis_pid, "redis-server", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
      return -1;
  }
  for (int i = 0; i < 300; i++) {
    int c = socket(AF_INET, SOCK_STREAM, 0), ok;
    a.sin_port = htons((uint16_t)p);
    ok = connect(c, (struct sockaddr *)&a, sizeof a) == 0;
    close(c);
    if (ok) {
      snprintf(url, cap, "redis://127.0.0.1:%d/0", p);
      return 0;
    }
    sleep_ms(10);
  }
  return -1;
}

static void redis_kill(void) {
  char cmd[128];
  if (redis_pid > 0) {
    kill(redis_pid, SIGKILL);
    waitpid(redis_pid, NULL, 0);
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", redis_dir);
  if (redis_dir[0] != '\0' && system(cmd) != 0)
    fprintf(stderr, "bench: could not remove %s\n", redis_dir);
}

static void bench_redis_heartbeats(const server_t *s, double memory_rate) {
  static conn_t ctl[N_CONNS];
  double hb[HB_ROUNDS];
  unsigned next = 0;
  conns_open(ctl, N_CONNS, s->ctl_port);
  drive(ctl, N_CONNS, "hb", &next, N_INSTANCES, UINT64_MAX, "\"created\"",
        NULL);
  drive(ctl, N_CONNS, "hb", &next, UINT64_MAX, om_bench_now_ns() + HB_WARMUP_NS,
        "\"renewed\"", NULL);
  for (int r = 0; r < HB_ROUNDS; r++)
    hb[r] = drive(ctl, N_CONNS, "hb", &next, UINT64_MAX,
                  om_bench_now_ns() + HB_ROUND_NS, "\"renewed\"", NULL);
  conns_close(ctl, N_CONNS);
  {
    double h = om_bench_median(hb, HB_ROUNDS);
    om_bench_report("control_redis_heartbeats_per_s", h, "req/s");
    om_bench_report("control_redis_heartbeats_vs_memory", h / memory_rate, "x");
  }
}

#define PROP_WARMUP 5
#define PROP_ROUNDS 100

/* A registration on a (port pa) to the watcher on b (port pb). */
static void bench_redis_propagation(int pa, int pb) {
  static const char watch[] = "GET /v1/watch/services/prop HTTP/1.1\r\n"
                              "Host: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                              "\r\n";
  watcher_t *ws = calloc(N_WATCHERS, sizeof *ws);
  conn_t *reg = calloc(1, sizeof *reg);
  double lat[PROP_ROUNDS];
  char req[512];
  int ep = epoll_create1(0), got;
  struct epoll_event ev;
  if (ws == NULL || reg == NULL || ep < 0)
    die("out of memory");
  reg->fd = dial(pa);
  {
    size_t k = put_request(req, sizeof req, "prop", 99999);
    request(reg, req, k, "\"created\"", NULL);
  }
  ev.events = EPOLLIN;
  ev.data.u32 = N_WATCHERS;
  epoll_ctl(ep, EPOLL_CTL_ADD, reg->fd, &ev);
  ws[0].fd = dial(pb);
  ws[0].first_line = 1;
  ev.data.u32 = 0;
  epoll_ctl(ep, EPOLL_CTL_ADD, ws[0].fd, &ev);
  send_all(ws[0].fd, watch, sizeof watch - 1);
  for (got = 0; got < 1;) {
    int dummy = 0;
    got += watchers_poll(ep, ws, 1, STALL_MS, reg, &dummy);
  }
  for (int r = 0; r < PROP_WARMUP + PROP_ROUNDS; r++) {
    uint64_t t0, t_last = 0, rev = 0;
    int reg_done = 0;
    size_t k = put_request(req, sizeof req, "prop", (unsigned)r);
    t0 = om_bench_now_ns();
    send_all(reg->fd, req, k);
    for (got = 0; got < 1 || !reg_done;) {
      int ready = 0;
      got += watchers_poll(ep, ws, (uint64_t)r + 2, STALL_MS, reg, &ready);
      if (got == 1 && t_last == 0)
        t_last = om_bench_now_ns();
      if (ready && !reg_done)
        reg_done = take_response(reg, "\"created\"", &rev);
    }
    if (ws[0].events != (uint64_t)r + 2 || ws[0].last_id != rev)
      die("watcher on B: %llu events, last id %llu, expected revision %llu",
          (unsigned long long)ws[0].events, (unsigned long long)ws[0].last_id,
          (unsigned long long)rev);
    if (r >= PROP_WARMUP)
      lat[r - PROP_WARMUP] = (double)(t_last - t0) / 1e6;
  }
  qsort(lat, PROP_ROUNDS, sizeof lat[0], cmp_double);
  om_bench_report("control_redis_propagation_p50_ms",
                  percentile(lat, PROP_ROUNDS, 50), "ms");
  om_bench_report("control_redis_propagation_p99_ms",
                  percentile(lat, PROP_ROUNDS, 99), "ms");
  close(ws[0].fd);
  close(reg->fd);
  close(ep);
  free(ws);
  free(reg);
}

static void bench_redis(double memory_rate) {
  char url[64];
  server_t a, b;
  if (redis_spawn(url, sizeof url) != 0) {
    fprintf(stderr, "bench_control: redis-server not available: the Redis "
                    "figures are skipped\n");
    redis_kill();
    return;
  }
  server_start(&a, url);
  bench_redis_heartbeats(&a, memory_rate);
  server_start(&b, url);
  bench_redis_propagation(a.ctl_port, b.ctl_port);
  server_stop(&b);
  server_stop(&a);
  redis_kill();
}

/*
 * One big service: BIG_INSTANCES registrations into it (each a new
 * revision), the rate over the last BIG_TAIL (when every change lands in
 * a service that large), then renewals over all of them, and the heap each
 * instance costs. On its own server, so nothing else is in the store.
 */
static void bench_big_service(void) {
  server_t s;
  conn_t ctl[N_CONNS];
  unsigned next = 0;
  double tail, hb[HB_ROUNDS], m0, m1;
  server_start(&s, NULL);
  id_space = BIG_INSTANCES;
  conns_open(ctl, N_CONNS, s.ctl_port);
  sleep_ms(50);
  m0 = heap_bytes();
  drive(ctl, N_CONNS, "big", &next, BIG_INSTANCES - BIG_TAIL, UINT64_MAX,
        "\"created\"", NULL);
  tail = drive(ctl, N_CONNS, "big", &next, BIG_TAIL, UINT64_MAX, "\"created\"",
               NULL);
  sleep_ms(100);
  m1 = heap_bytes();
  for (int r = 0; r < HB_ROUNDS; r++)
    hb[r] = drive(ctl, N_CONNS, "big", &next, UINT64_MAX,
                  om_bench_now_ns() + HB_ROUND_NS, "\"renewed\"", NULL);
  conns_close(ctl, N_CONNS);
  server_stop(&s);
  id_space = N_INSTANCES;
  om_bench_report("registrations_per_s_100k_one_service", tail, "req/s");
  om_bench_report("control_heartbeats_per_s_100k",
                  om_bench_median(hb, HB_ROUNDS), "req/s");
  om_bench_report("control_bytes_per_instance_100k", (m1 - m0) / BIG_INSTANCES,
                  "B");
}

int main(void) {
  server_t s;
  double memory_rate;
  struct rlimit rl;
  signal(SIGPIPE, SIG_IGN);
  /* 1,000 watchers are 2,000 descriptors in this one process. */
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  om_log_set_level(OM_LOG_WARN); /* one line per registration otherwise */
  server_start(&s, NULL);
  memory_rate = bench_heartbeats(&s);
  bench_fanout(&s);
  server_stop(&s);
  bench_big_service();
  bench_redis(memory_rate);
  return 0;
}
