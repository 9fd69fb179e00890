/*
 * bench_http.c: the HTTP/1.1 server over loopback, server and client in one
 * thread (the client turns the loop), so a figure is the whole per-request
 * cost: syscalls, the strict HTTP/1.1 framing module (core/om_http1.c, the
 * one parse of each request), the response write.
 *
 * Figures (median of 5 rounds after a warm-up):
 *   http_keepalive_rps        one request in flight on one connection
 *   http_pipelined16_rps      16 requests per write on one connection
 *   http_server_ns_per_req    1e9 / pipelined rps
 *   http_parser_only_ns_per_req  baseline: http_parser_execute alone over
 *                                the same request bytes
 *   http_server_over_parser   the ratio of the two
 *   http_chunked_upload_mb_s  a 1 MiB body in 16 KiB chunks
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <http_parser.h>

#include "om_bench.h"
#include "om_http_server.h"

#define ROUNDS 5

static const char REQ[] = "GET /v1/services/api HTTP/1.1\r\nHost: bench\r\n"
                          "User-Agent: bench/1\r\nAccept: */*\r\n\r\n";

static void handler(om_http_request_t *req, void *ud) {
  static const om_http_header_t h[] = {{"Content-Type", "text/plain", 0, 0}};
  (void)ud;
  om_http_respond(req, 200, h, 1, "ok", 2);
}

static int client(int port) {
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    fprintf(stderr, "bench_http: connect failed\n");
    exit(1);
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

static void send_all(uv_loop_t *loop, int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
    } else if (k < 0 && errno != EAGAIN) {
      fprintf(stderr, "bench_http: send failed\n");
      exit(1);
    } else {
      uv_run(loop, UV_RUN_NOWAIT);
    }
  }
}

/* Turn the loop and read until `want` bytes came back. */
static void recv_bytes(uv_loop_t *loop, int fd, size_t want) {
  char buf[65536];
  while (want > 0) {
    ssize_t k;
    uv_run(loop, UV_RUN_NOWAIT);
    k = recv(fd, buf, sizeof buf, 0);
    if (k > 0)
      want -= (size_t)k < want ? (size_t)k : want;
    else if (k == 0 || (k < 0 && errno != EAGAIN)) {
      fprintf(stderr, "bench_http: connection lost\n");
      exit(1);
    }
  }
}

/* The size of one response (its Date has a fixed width). */
static size_t response_size(uv_loop_t *loop, int fd) {
  char buf[4096];
  size_t n = 0;
  send_all(loop, fd, REQ, sizeof REQ - 1);
  while (n < 4 || memcmp(buf + n - 2, "ok", 2) != 0) {
    ssize_t k;
    uv_run(loop, UV_RUN_NOWAIT);
    k = recv(fd, buf + n, sizeof buf - n, 0);
    if (k > 0)
      n += (size_t)k;
  }
  return n;
}

static double keepalive_rps(uv_loop_t *loop, int fd, size_t rsz, int n) {
  uint64_t t0 = om_bench_now_ns();
  int i;
  for (i = 0; i < n; i++) {
    send_all(loop, fd, REQ, sizeof REQ - 1);
    recv_bytes(loop, fd, rsz);
  }
  return n / ((double)(om_bench_now_ns() - t0) / 1e9);
}

static double pipelined_rps(uv_loop_t *loop, int fd, size_t rsz, int batches) {
  static char batch[16 * sizeof REQ];
  uint64_t t0;
  int i;
  for (i = 0; i < 16; i++)
    memcpy(batch + i * (sizeof REQ - 1), REQ, sizeof REQ - 1);
  t0 = om_bench_now_ns();
  for (i = 0; i < batches; i++) {
    send_all(loop, fd, batch, 16 * (sizeof REQ - 1));
    recv_bytes(loop, fd, 16 * rsz);
  }
  return 16.0 * batches / ((double)(om_bench_now_ns() - t0) / 1e9);
}

static double upload_mb_s(uv_loop_t *loop, int fd, size_t rsz, int n) {
  static char chunk[16384 + 16];
  const char *head =
      "POST /up HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n";
  size_t cl;
  uint64_t t0;
  int i, j;
  cl = (size_t)snprintf(chunk, sizeof chunk, "4000\r\n");
  memset(chunk + cl, 'u', 16384);
  memcpy(chunk + cl + 16384, "\r\n", 2);
  cl += 16384 + 2;
  t0 = om_bench_now_ns();
  for (i = 0; i < n; i++) {
    send_all(loop, fd, head, strlen(head));
    for (j = 0; j < 64; j++)
      send_all(loop, fd, chunk, cl);
    send_all(loop, fd, "0\r\n\r\n", 5);
    recv_bytes(loop, fd, rsz);
  }
  return n * 1.0 / ((double)(om_bench_now_ns() - t0) / 1e9);
}

static int hp_done(http_parser *p) {
  (void)p;
  return 0;
}

static double parser_only_ns(int n) {
  http_parser p;
  http_parser_settings st;
  uint64_t t0;
  int i;
  memset(&st, 0, sizeof st);
  st.on_message_complete = hp_done;
  t0 = om_bench_now_ns();
  for (i = 0; i < n; i++) {
    size_t k;
    http_parser_init(&p, HTTP_REQUEST);
    k = http_parser_execute(&p, &st, REQ, sizeof REQ - 1);
    OM_BENCH_SINK(k);
  }
  return (double)(om_bench_now_ns() - t0) / n;
}

int main(void) {
  uv_loop_t loop;
  om_http_server_t *srv;
  om_http_server_opts_t o;
  double ka[ROUNDS], pl[ROUNDS], hp[ROUNDS], up[ROUNDS];
  size_t rsz, usz;
  int fd, r;
  signal(SIGPIPE, SIG_IGN);
  memset(&o, 0, sizeof o);
  o.max_body_bytes = 2u << 20;
  uv_loop_init(&loop);
  if (om_http_server_new(&loop, &o, handler, NULL, &srv) != 0 ||
      om_http_server_listen(srv, "127.0.0.1", 0) != 0) {
    fprintf(stderr, "bench_http: cannot start the server\n");
    return 1;
  }
  fd = client(om_http_server_port(srv));
  rsz = response_size(&loop, fd);
  usz = rsz; /* same handler, same answer */
  /* warm-up */
  keepalive_rps(&loop, fd, rsz, 2000);
  pipelined_rps(&loop, fd, rsz, 200);
  parser_only_ns(100000);
  for (r = 0; r < ROUNDS; r++) {
    ka[r] = keepalive_rps(&loop, fd, rsz, 20000);
    pl[r] = pipelined_rps(&loop, fd, rsz, 4000);
    hp[r] = parser_only_ns(200000);
    up[r] = upload_mb_s(&loop, fd, usz, 100);
  }
  {
    double k = om_bench_median(ka, ROUNDS), p = om_bench_median(pl, ROUNDS);
    double h = om_bench_median(hp, ROUNDS);
    om_bench_report("http_keepalive_rps", k, "req/s");
    om_bench_report("http_pipelined16_rps", p, "req/s");
    om_bench_report("http_server_ns_per_req", 1e9 / p, "ns");
    om_bench_report("http_parser_only_ns_per_req", h, "ns");
    om_bench_report("http_server_over_parser", (1e9 / p) / h, "x");
    om_bench_report("http_chunked_upload_mb_s", om_bench_median(up, ROUNDS),
                    "MiB/s");
  }
  close(fd);
  om_http_server_close(srv, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  return 0;
}
