/*
 * chat_client: a closed-loop chat-completion client on one keep-alive
 * connection, for bench/egress_gateway_bench.sh: the same client, the same
 * payload and the same clock for the provider direct and for each gateway.
 *
 *   chat_client --port P [--mode json|stream] [--seconds S | --count N]
 *               [--warmup N] [--rate R] [--path PATH] [--header 'K: V']...
 *
 * POSTs a chat completion (a system and a user message; "stream": true in
 * stream mode) to 127.0.0.1:P, reads the whole response (Content-Length or
 * chunked), then sends the next. Blocking read and write, no event loop:
 * the client's own cost per call is two syscalls. Each call's latency is
 * taken with CLOCK_MONOTONIC from before the write to the read that
 * completes the response; in stream mode also to the read that brings the
 * first non-empty content delta ("content":"X..., the time to first token).
 * --rate R paces the calls at R per second (one connection, so a call
 * still waits for the previous one) and measures each from its scheduled
 * start, so that falling behind shows as latency, not as fewer calls.
 * --warmup N calls go first and are not measured.
 *
 * Prints `n N`, `mean_us`, `p50_us`, `p99_us` (and `ttft_mean_us`,
 * `ttft_p50_us`, `ttft_p99_us` in stream mode), one `name value` a line.
 * Exits 1 on a connection failure, a response that is not 200 or a stream
 * without a content delta, 2 on bad arguments (the message names the flag).
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
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "om_bench.h"

#define RESP_MAX (256 * 1024)
#define HEADERS_MAX 16
#define HEADER_LEN_MAX 4096
#define COUNT_MAX 10000000L

static const char body_json[] =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"You are "
    "a helpful support agent.\"},{\"role\":\"user\",\"content\":\"Where is my "
    "order 12?\"}]}";
static const char body_stream[] =
    "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"system\","
    "\"content\":\"You are a helpful support agent.\"},{\"role\":\"user\","
    "\"content\":\"Where is my order 12?\"}]}";

static int usage(const char *flag, const char *why) {
  fprintf(stderr,
          "chat_client: %s: %s\n"
          "usage: chat_client --port P [--mode json|stream] [--seconds S | "
          "--count N] [--warmup N] [--rate R] [--path PATH] "
          "[--header 'K: V']...\n",
          flag, why);
  return 2;
}

/* A whole number in [lo, hi], or -1. */
static long number(const char *s, long lo, long hi) {
  char *end;
  long v;
  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    return -1;
  return v;
}

/* Whether buf holds a non-empty content delta: "content" : "X (X not "). */
static int has_token(const char *buf, size_t len) {
  const char *p = buf, *end = buf + len;
  while ((p = memmem(p, (size_t)(end - p), "\"content\"", 9)) != NULL) {
    p += 9;
    while (p < end && *p == ' ')
      p++;
    if (p >= end || *p != ':')
      continue;
    p++;
    while (p < end && *p == ' ')
      p++;
    if (end - p >= 2 && p[0] == '"' && p[1] != '"')
      return 1;
  }
  return 0;
}

/* The length of the whole response at the start of buf, 0 when more bytes
 * are needed, -1 when it cannot be framed (no length on a kept-alive
 * connection, a bad chunk size). *status gets the status code. */
static long framed(const char *buf, size_t len, int *status) {
  const char *eoh = memmem(buf, len, "\r\n\r\n", 4), *p;
  size_t head;
  if (eoh == NULL)
    return len > 65536 ? -1 : 0;
  head = (size_t)(eoh - buf) + 4;
  if (len < 12 || memcmp(buf, "HTTP/1.", 7) != 0)
    return -1;
  *status = atoi(buf + 9);
  for (p = buf; p < eoh;) {
    const char *eol = memmem(p, (size_t)(eoh + 2 - p), "\r\n", 2);
    if (eol == NULL)
      break;
    p = eol + 2;
    if (strncasecmp(p, "content-length:", 15) == 0) {
      long n = strtol(p + 15, NULL, 10);
      if (n < 0)
        return -1;
      return len >= head + (size_t)n ? (long)(head + (size_t)n) : 0;
    }
    if (strncasecmp(p, "transfer-encoding:", 18) == 0) {
      size_t at = head;
      for (;;) {
        const char *crlf = memmem(buf + at, len - at, "\r\n", 2);
        char *end;
        unsigned long n;
        if (crlf == NULL)
          return 0;
        n = strtoul(buf + at, &end, 16);
        if (end == buf + at)
          return -1;
        at = (size_t)(crlf - buf) + 2;
        if (n == 0) {
          /* no trailers expected: the last chunk, then CRLF */
          if (len < at + 2)
            return 0;
          return memcmp(buf + at, "\r\n", 2) == 0 ? (long)(at + 2) : -1;
        }
        if (len < at + n + 2)
          return 0;
        at += n + 2;
      }
    }
  }
  return -1;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void report(const char *prefix, uint64_t *v, size_t n) {
  double sum = 0;
  size_t i99;
  for (size_t i = 0; i < n; i++)
    sum += (double)v[i];
  qsort(v, n, sizeof v[0], cmp_u64);
  i99 = (size_t)((double)n * 0.99);
  if (i99 >= n)
    i99 = n - 1;
  printf("%smean_us %.2f\n", prefix, sum / (double)n / 1e3);
  printf("%sp50_us %.2f\n", prefix, (double)v[n / 2] / 1e3);
  printf("%sp99_us %.2f\n", prefix, (double)v[i99] / 1e3);
}

int main(int argc, char **argv) {
  const char *path = "/v1/chat/completions", *mode = "json";
  const char *hdrs[HEADERS_MAX];
  size_t n_hdrs = 0, n = 0, cap = 0;
  long port = -1, seconds = -1, count = -1, warmup = 100, rate = 0;
  char *req, *buf;
  int req_len, fd, one = 1, stream;
  uint64_t *lat = NULL, *ttft = NULL, deadline = 0, start;
  struct sockaddr_in a = {.sin_family = AF_INET};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL)
      return usage(f, "needs a value");
    i++;
    if (strcmp(f, "--port") == 0) {
      if ((port = number(v, 1, 65535)) < 0)
        return usage(f, "not a port (1-65535)");
    } else if (strcmp(f, "--mode") == 0) {
      if (strcmp(v, "json") != 0 && strcmp(v, "stream") != 0)
        return usage(f, "json or stream");
      mode = v;
    } else if (strcmp(f, "--seconds") == 0) {
      if ((seconds = number(v, 1, 3600)) < 0)
        return usage(f, "whole seconds, 1-3600");
    } else if (strcmp(f, "--count") == 0) {
      if ((count = number(v, 1, COUNT_MAX)) < 0)
        return usage(f, "a count, 1-10000000");
    } else if (strcmp(f, "--warmup") == 0) {
      if ((warmup = number(v, 0, 1000000)) < 0)
        return usage(f, "a count, 0-1000000");
    } else if (strcmp(f, "--rate") == 0) {
      if ((rate = number(v, 1, 1000000)) < 0)
        return usage(f, "calls per second, 1-1000000");
    } else if (strcmp(f, "--path") == 0) {
      if (v[0] != '/' || strlen(v) > 1024 || strpbrk(v, " \r\n") != NULL)
        return usage(f, "a path starting with '/', at most 1024 bytes");
      path = v;
    } else if (strcmp(f, "--header") == 0) {
      const char *colon = strchr(v, ':');
      if (n_hdrs == HEADERS_MAX)
        return usage(f, "at most 16");
      if (colon == NULL || colon == v || strlen(v) > HEADER_LEN_MAX ||
          strpbrk(v, "\r\n") != NULL)
        return usage(f, "'Name: value' on one line, at most 4096 bytes");
      hdrs[n_hdrs++] = v;
    } else {
      return usage(f, "unknown flag");
    }
  }
  if (port < 0)
    return usage("--port", "required");
  if ((seconds < 0) == (count < 0))
    return usage("--seconds", "give one of --seconds and --count");
  stream = strcmp(mode, "stream") == 0;

  req = malloc(8192 + HEADERS_MAX * (HEADER_LEN_MAX + 2));
  buf = malloc(RESP_MAX);
  if (req == NULL || buf == NULL)
    return 1;
  req_len = sprintf(req,
                    "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%ld\r\n"
                    "Content-Type: application/json\r\n"
                    "Authorization: Bearer sk-bench\r\n",
                    path, port);
  for (size_t i = 0; i < n_hdrs; i++)
    req_len += sprintf(req + req_len, "%s\r\n", hdrs[i]);
  req_len += sprintf(req + req_len, "Content-Length: %zu\r\n\r\n%s",
                     stream ? sizeof body_stream - 1 : sizeof body_json - 1,
                     stream ? body_stream : body_json);

  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    fprintf(stderr, "chat_client: connect 127.0.0.1:%ld: %s\n", port,
            strerror(errno));
    return 1;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  start = om_bench_now_ns();
  for (long call = 0;; call++) {
    uint64_t t0, t_tok = 0, t_end;
    size_t got = 0;
    long whole = 0;
    int status = 0, measured = call >= warmup;
    if (measured && call == warmup) {
      start = om_bench_now_ns();
      if (seconds > 0)
        deadline = start + (uint64_t)seconds * 1000000000u;
    }
    if (measured && rate > 0) {
      /* the scheduled start of this call */
      uint64_t at =
          start + (uint64_t)(call - warmup) * 1000000000u / (uint64_t)rate;
      struct timespec ts = {(time_t)(at / 1000000000u),
                            (long)(at % 1000000000u)};
      while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
             EINTR)
        ;
      t0 = at;
    } else {
      t0 = om_bench_now_ns();
    }
    if (measured &&
        ((count > 0 && (long)n >= count) || (deadline && t0 >= deadline)))
      break;
    if (write(fd, req, (size_t)req_len) != req_len) {
      fprintf(stderr, "chat_client: write: %s\n", strerror(errno));
      return 1;
    }
    while (whole == 0) {
      ssize_t r = read(fd, buf + got, RESP_MAX - got);
      if (r <= 0) {
        fprintf(stderr, "chat_client: read: %s\n",
                r == 0 ? "connection closed" : strerror(errno));
        return 1;
      }
      got += (size_t)r;
      if (stream && t_tok == 0 && has_token(buf, got))
        t_tok = om_bench_now_ns();
      whole = framed(buf, got, &status);
      if (whole < 0 || (whole > 0 && (size_t)whole != got) ||
          (whole == 0 && got == RESP_MAX)) {
        fprintf(stderr,
                "chat_client: a response that cannot be framed:\n"
                "%.*s\n",
                (int)(got < 2000 ? got : 2000), buf);
        return 1;
      }
    }
    t_end = om_bench_now_ns();
    if (status != 200 || (stream && t_tok == 0)) {
      fprintf(stderr, "chat_client: status %d%s:\n%.*s\n", status,
              status == 200 ? ", no content delta" : "",
              (int)(got < 2000 ? got : 2000), buf);
      return 1;
    }
    if (!measured)
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 65536;
      lat = realloc(lat, cap * sizeof *lat);
      ttft = realloc(ttft, cap * sizeof *ttft);
      if (lat == NULL || ttft == NULL)
        return 1;
    }
    lat[n] = t_end - t0;
    ttft[n] = t_tok - t0;
    n++;
  }
  printf("n %zu\n", n);
  if (n == 0)
    return 1;
  report("", lat, n);
  if (stream)
    report("ttft_", ttft, n);
  return 0;
}
