/*
 * c1_client: a closed-loop client on one keep-alive connection, for the
 * latency pass of bench/proxy_bench.sh when OM_BENCH_CLIENT=c1 (wrk stays
 * the default and the instrument).
 *
 *   c1_client PORT SECONDS QFILE
 *
 * Sends `GET / HTTP/1.1` with `Host: bench` to 127.0.0.1:PORT, waits for
 * the whole response (a head, then a Content-Length body), and sends the
 * next: blocking read and write, no event loop, so the client makes two
 * syscalls per call where wrk makes six (a write, a read, and epoll_wait
 * and epoll_ctl twice each: `strace -c`). Each call's latency is taken with
 * CLOCK_MONOTONIC from before the write to after the read that completes
 * the response.
 *
 * Writes QFILE in the format of proxy_bench.sh's wrk done() script ("n N",
 * then the latency in whole microseconds at percentile 0.01, 0.02 ... 100,
 * nearest rank), and prints the lines of wrk's report that the bench reads
 * ("N requests in", "Requests/sec:", the 50% and 99% latency). Exits 1 on
 * a connection failure or a response that is not 2xx, 2 on bad arguments.
 */
#define _GNU_SOURCE /* memmem */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "om_bench.h"

#define HEAD_MAX 8192
#define CALLS_MAX (64u * 1024 * 1024) /* 512 MiB of samples at most */

static const char request[] = "GET / HTTP/1.1\r\nHost: bench\r\n\r\n";

static int die(const char *what) {
  fprintf(stderr, "c1_client: %s: %s\n", what, strerror(errno));
  return 1;
}

/* Content-Length of a head (case-insensitive name, RFC 9110 5.1), or -1. */
static long content_length(const char *head, size_t len) {
  static const char name[] = "\r\ncontent-length:";
  const size_t n = sizeof name - 1;
  for (size_t i = 0; i + n <= len; i++) {
    size_t k = 0;
    while (k < n && (head[i + k] | (name[k] >= 'a' ? 0x20 : 0)) == name[k])
      k++;
    if (k == n) {
      const char *p = head + i + n;
      char *end;
      long v;
      while (*p == ' ' || *p == '\t')
        p++;
      v = strtol(p, &end, 10);
      return end == p || v < 0 ? -1 : v;
    }
  }
  return -1;
}

/* One call: 0 and the response read whole, or -1 (errno, or EPROTO). */
static int call(int fd, char *buf, int *status) {
  size_t got = 0, want = 0;
  const char *eoh = NULL;
  if (write(fd, request, sizeof request - 1) != (ssize_t)(sizeof request - 1))
    return -1;
  for (;;) {
    ssize_t r = read(fd, buf + got, HEAD_MAX - got);
    if (r <= 0) {
      if (r == 0)
        errno = ECONNRESET;
      return -1;
    }
    got += (size_t)r;
    if (eoh == NULL && (eoh = memmem(buf, got, "\r\n\r\n", 4)) != NULL) {
      long cl = content_length(buf, (size_t)(eoh + 2 - buf));
      if (cl < 0 || (size_t)cl > HEAD_MAX - (size_t)(eoh + 4 - buf) ||
          sscanf(buf, "HTTP/1.%*d %d", status) != 1) {
        errno = EPROTO;
        return -1;
      }
      want = (size_t)(eoh + 4 - buf) + (size_t)cl;
    }
    if (eoh != NULL && got >= want)
      return got == want ? 0 : (errno = EPROTO, -1);
    if (got == HEAD_MAX) {
      errno = EPROTO;
      return -1;
    }
  }
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  char buf[HEAD_MAX], *end;
  uint32_t *lat;
  size_t n = 0, cap = 1u << 20;
  uint64_t t0, stop, now;
  long port;
  double secs;
  int fd, one = 1, status = 0;
  FILE *q;
  if (argc == 2 && strcmp(argv[1], "--help") == 0) {
    printf("usage: c1_client PORT SECONDS QFILE\n"
           "One keep-alive connection to 127.0.0.1:PORT, GET / with Host: "
           "bench in a closed loop\nfor SECONDS; the latency quantiles go "
           "to QFILE (bench/proxy_bench.sh, OM_BENCH_CLIENT=c1).\n");
    return 0;
  }
  if (argc != 4 || (port = strtol(argv[1], &end, 10)) <= 0 || port > 65535 ||
      *end != '\0' || (secs = strtod(argv[2], &end)) <= 0 || *end != '\0') {
    fprintf(stderr, "usage: c1_client PORT SECONDS QFILE\n");
    return 2;
  }
  if ((lat = malloc(cap * sizeof *lat)) == NULL)
    return die("malloc");
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
    return die("socket");
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    return die("connect");
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  t0 = om_bench_now_ns();
  stop = t0 + (uint64_t)(secs * 1e9);
  for (now = t0; now < stop && n < CALLS_MAX;) {
    uint64_t start = now;
    if (call(fd, buf, &status) != 0)
      return die("call");
    if (status < 200 || status > 299) {
      fprintf(stderr, "c1_client: status %d\n", status);
      return 1;
    }
    now = om_bench_now_ns();
    if (n == cap) {
      uint32_t *more = realloc(lat, 2 * cap * sizeof *lat);
      if (more == NULL)
        return die("realloc");
      lat = more;
      cap *= 2;
    }
    lat[n++] = (uint32_t)((now - start) / 1000); /* whole us, as wrk */
  }
  close(fd);
  if (n == 0) {
    fprintf(stderr, "c1_client: no call completed\n");
    return 1;
  }
  qsort(lat, n, sizeof *lat, cmp_u32);
  if ((q = fopen(argv[3], "w")) == NULL)
    return die(argv[3]);
  fprintf(q, "n %zu\n", n);
  for (unsigned k = 1; k <= 10000; k++) {
    size_t rank = (size_t)(((unsigned long long)n * k + 9999) / 10000);
    fprintf(q, "%u\n", lat[rank - 1]);
  }
  if (fclose(q) != 0)
    return die(argv[3]);
  printf("  %zu requests in %.2fs\n", n, (double)(now - t0) / 1e9);
  printf("Requests/sec: %.2f\n", (double)n * 1e9 / (double)(now - t0));
  printf("     50%% %8.2fus\n", (double)lat[(n + 1) / 2 - 1]);
  printf("     99%% %8.2fus\n", (double)lat[(n * 99 + 99) / 100 - 1]);
  free(lat);
  return 0;
}
