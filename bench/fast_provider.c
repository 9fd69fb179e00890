/*
 * fast_provider: an OpenAI-compatible model provider that answers at once,
 * for bench/egress_gateway_bench.sh. tests/fixtures/fake_provider.c is the
 * faithful fake (scripted faults, both wire formats, request checks, a JSON
 * library on every request); this one does the least a provider can do, so
 * that what a gateway adds in front of it is not hidden by the fake's own
 * time: one thread, epoll, keep-alive HTTP/1.1, canned answers written in
 * one write(2).
 *
 *   fast_provider PORT      (127.0.0.1:PORT; 0 picks a free port)
 *
 * POST .../chat/completions: a chat.completion (JSON), or when the body has
 * "stream": true an SSE stream (chunked): a role delta, three content
 * deltas ("Your", " order", " shipped."), a finish_reason chunk, a usage
 * chunk and `data: [DONE]`, all in one write. GET /_count:
 * {"total":N,"json":N,"stream":N,"refused":N} (requests answered as a
 * provider, and requests refused: a chunked request body, a head or body
 * over the limits, another path). Anything else is 404 (counted in
 * refused). Prints "fast_provider listening http://127.0.0.1:PORT" once
 * listening. Exits 2 on bad arguments, 1 when it cannot listen.
 */
#define _GNU_SOURCE /* memmem, accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define HEAD_MAX 16384
#define BODY_MAX (1024 * 1024)
#define CONN_MAX 65536

struct conn {
  char *buf;
  size_t len, cap;
};

static struct conn *conns[CONN_MAX];
static unsigned long n_json, n_stream, n_refused;

static const char json_body[] =
    "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion\",\"created\":1,"
    "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
    "\"assistant\",\"content\":\"Your order shipped yesterday and arrives "
    "Friday.\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":20,"
    "\"completion_tokens\":11,\"total_tokens\":31}}";

#define CHUNK_HEAD                                                             \
  "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\","     \
  "\"created\":1,\"model\":\"m\",\"choices\":"
static const char *const sse_events[] = {
    CHUNK_HEAD "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":"
               "\"\"},\"finish_reason\":null}]}\n\n",
    CHUNK_HEAD "[{\"index\":0,\"delta\":{\"content\":\"Your\"},"
               "\"finish_reason\":null}]}\n\n",
    CHUNK_HEAD "[{\"index\":0,\"delta\":{\"content\":\" order\"},"
               "\"finish_reason\":null}]}\n\n",
    CHUNK_HEAD "[{\"index\":0,\"delta\":{\"content\":\" shipped.\"},"
               "\"finish_reason\":null}]}\n\n",
    CHUNK_HEAD "[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    CHUNK_HEAD "[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":3,"
               "\"total_tokens\":23}}\n\n",
    "data: [DONE]\n\n",
};

static char json_resp[1024], stream_resp[4096];
static size_t json_resp_len, stream_resp_len;

static int usage(const char *msg) {
  fprintf(stderr, "fast_provider: %s\nusage: fast_provider PORT (0-65535)\n",
          msg);
  return 2;
}

static void build_answers(void) {
  size_t n = 0;
  json_resp_len =
      (size_t)snprintf(json_resp, sizeof json_resp,
                       "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       "Content-Length: %zu\r\n\r\n%s",
                       sizeof json_body - 1, json_body);
  n = (size_t)snprintf(stream_resp, sizeof stream_resp,
                       "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       "Cache-Control: no-cache\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n");
  for (size_t i = 0; i < sizeof sse_events / sizeof sse_events[0]; i++)
    n +=
        (size_t)snprintf(stream_resp + n, sizeof stream_resp - n,
                         "%zx\r\n%s\r\n", strlen(sse_events[i]), sse_events[i]);
  n += (size_t)snprintf(stream_resp + n, sizeof stream_resp - n, "0\r\n\r\n");
  stream_resp_len = n;
}

/* A header's value in a head (case-insensitive name), or NULL. */
static const char *header(const char *head, size_t len, const char *name,
                          size_t *vlen) {
  size_t n = strlen(name);
  for (const char *p = head; p && p < head + len;) {
    const char *eol = memmem(p, (size_t)(head + len - p), "\r\n", 2);
    if (eol == NULL)
      return NULL;
    p = eol + 2;
    if ((size_t)(head + len - p) > n + 1 && strncasecmp(p, name, n) == 0 &&
        p[n] == ':') {
      const char *v = p + n + 1, *e;
      while (*v == ' ' || *v == '\t')
        v++;
      e = memmem(v, (size_t)(head + len - v), "\r\n", 2);
      *vlen = e ? (size_t)(e - v) : 0;
      return v;
    }
  }
  return NULL;
}

/* Whether a JSON body sets "stream": true (any whitespace around ':'). */
static int wants_stream(const char *b, size_t len) {
  const char *p = b, *end = b + len;
  while ((p = memmem(p, (size_t)(end - p), "\"stream\"", 8)) != NULL) {
    p += 8;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
      p++;
    if (p >= end || *p != ':')
      continue;
    p++;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
      p++;
    return end - p >= 4 && memcmp(p, "true", 4) == 0;
  }
  return 0;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && errno == EAGAIN) {
      /* a full socket buffer: rare for answers this small; wait for it */
      fd_set wf;
      FD_ZERO(&wf);
      FD_SET(fd, &wf);
      if (fd >= FD_SETSIZE || select(fd + 1, NULL, &wf, NULL, NULL) < 0)
        return -1;
      continue;
    }
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int refuse(int fd, int status, const char *reason) {
  char r[256];
  int n = snprintf(r, sizeof r,
                   "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                   status, reason, strlen(reason) + 1, reason);
  n_refused++;
  (void)write_all(fd, r, (size_t)n);
  return -1;
}

/* Answer every whole request buffered on fd; -1 to close it. */
static int serve(int fd, struct conn *c) {
  for (;;) {
    const char *eoh = memmem(c->buf, c->len, "\r\n\r\n", 4), *v;
    size_t head_len, vlen, body_len = 0;
    int close_after = 0;
    if (eoh == NULL)
      return c->len > HEAD_MAX ? refuse(fd, 431, "head too large") : 0;
    head_len = (size_t)(eoh - c->buf) + 4;
    if (header(c->buf, head_len, "transfer-encoding", &vlen) != NULL)
      return refuse(fd, 411, "chunked request bodies are not served");
    v = header(c->buf, head_len, "content-length", &vlen);
    if (v != NULL) {
      char *end;
      unsigned long n = strtoul(v, &end, 10);
      if (end == v || n > BODY_MAX)
        return refuse(fd, 413, "bad or oversized content-length");
      body_len = n;
    }
    if (c->len < head_len + body_len)
      return 0;
    v = header(c->buf, head_len, "connection", &vlen);
    if (v != NULL && vlen == 5 && strncasecmp(v, "close", 5) == 0)
      close_after = 1;
    if (strncmp(c->buf, "POST ", 5) == 0) {
      const char *sp = memchr(c->buf + 5, ' ', head_len - 5);
      static const char tail[] = "/chat/completions";
      size_t plen = sp ? (size_t)(sp - (c->buf + 5)) : 0;
      if (plen < sizeof tail - 1 ||
          memcmp(c->buf + 5 + plen - (sizeof tail - 1), tail,
                 sizeof tail - 1) != 0)
        return refuse(fd, 404, "not found");
      if (wants_stream(c->buf + head_len, body_len)) {
        n_stream++;
        if (write_all(fd, stream_resp, stream_resp_len) != 0)
          return -1;
      } else {
        n_json++;
        if (write_all(fd, json_resp, json_resp_len) != 0)
          return -1;
      }
    } else if (strncmp(c->buf, "GET /_count ", 12) == 0) {
      char b[256], r[512];
      int bn = snprintf(b, sizeof b,
                        "{\"total\":%lu,\"json\":%lu,\"stream\":%lu,"
                        "\"refused\":%lu}\n",
                        n_json + n_stream, n_json, n_stream, n_refused);
      int rn = snprintf(r, sizeof r,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        "Content-Length: %d\r\n\r\n%s",
                        bn, b);
      if (write_all(fd, r, (size_t)rn) != 0)
        return -1;
    } else {
      return refuse(fd, 404, "not found");
    }
    memmove(c->buf, c->buf + head_len + body_len, c->len - head_len - body_len);
    c->len -= head_len + body_len;
    if (close_after)
      return -1;
  }
}

static void drop(int ep, int fd) {
  epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
  close(fd);
  if (fd < CONN_MAX && conns[fd]) {
    free(conns[fd]->buf);
    free(conns[fd]);
    conns[fd] = NULL;
  }
}

int main(int argc, char **argv) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t alen = sizeof a;
  struct epoll_event ev = {.events = EPOLLIN}, evs[256];
  char *end;
  long port;
  int lfd, ep, one = 1;
  if (argc != 2)
    return usage("one argument, the port");
  errno = 0;
  port = strtol(argv[1], &end, 10);
  if (errno || end == argv[1] || *end || port < 0 || port > 65535)
    return usage("PORT: not a port number");
  signal(SIGPIPE, SIG_IGN);
  build_answers();
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (lfd < 0 ||
      setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(lfd, 1024) != 0 ||
      getsockname(lfd, (struct sockaddr *)&a, &alen) != 0) {
    fprintf(stderr, "fast_provider: cannot listen on 127.0.0.1:%ld: %s\n", port,
            strerror(errno));
    return 1;
  }
  ep = epoll_create1(0);
  ev.data.fd = lfd;
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) != 0)
    return 1;
  printf("fast_provider listening http://127.0.0.1:%d\n", ntohs(a.sin_port));
  fflush(stdout);
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return 1;
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      struct conn *c;
      if (fd == lfd) {
        int cfd;
        while ((cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          if (cfd >= CONN_MAX) {
            close(cfd);
            continue;
          }
          setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns[cfd] = calloc(1, sizeof *conns[cfd]);
          ev.data.fd = cfd;
          if (conns[cfd] == NULL || epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &ev) != 0)
            drop(ep, cfd);
        }
        continue;
      }
      c = conns[fd];
      for (;;) {
        ssize_t r;
        if (c->cap - c->len < 4096) {
          size_t cap = c->cap ? c->cap * 2 : 8192;
          char *b;
          if (cap > HEAD_MAX + BODY_MAX + 8192) {
            refuse(fd, 413, "request too large");
            drop(ep, fd);
            break;
          }
          b = realloc(c->buf, cap);
          if (b == NULL) {
            drop(ep, fd);
            break;
          }
          c->buf = b;
          c->cap = cap;
        }
        r = read(fd, c->buf + c->len, c->cap - c->len);
        if (r < 0 && errno == EINTR)
          continue;
        if (r < 0 && errno == EAGAIN) {
          if (serve(fd, c) != 0)
            drop(ep, fd);
          break;
        }
        if (r <= 0) {
          drop(ep, fd);
          break;
        }
        c->len += (size_t)r;
      }
    }
  }
}
