/*
 * http_test_client.h: raw-socket HTTP/1.1 clients for C tests that run a
 * libuv loop in the same thread. Each step runs the loop once without
 * blocking (uv_run UV_RUN_NOWAIT), then polls the client sockets briefly, so
 * the server and the clients make progress in turn, in one thread, on real
 * loopback sockets.
 *
 * Responses are parsed by a small strict parser of its own (not
 * http-parser), so the tests check the server's output independently.
 * Header-only (static inline) because tests/support builds only om_test.c.
 * Nothing here allocates after htc_new, so it is safe inside allocation
 * fault-injection windows.
 */
#ifndef HTTP_TEST_CLIENT_H
#define HTTP_TEST_CLIENT_H

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#define HTC_BUF (256u * 1024u)

typedef struct htc_s {
  int fd;
  size_t len;   /* bytes kept in buf (up to HTC_BUF) */
  size_t total; /* bytes received */
  int eof;      /* the server closed (FIN or reset) */
  int reset;
  char tail[8]; /* the last bytes received, for discard-mode checks */
  char buf[HTC_BUF];
} htc_t;

static inline uint64_t htc_now_ms(void) {
  return uv_hrtime() / 1000000u;
}

/* A client connected to ip:port (IPv4 or IPv6 literal), non-blocking.
 * NULL on failure. Free with htc_free. */
static inline htc_t *htc_new(const char *ip, int port) {
  htc_t *c = calloc(1, sizeof *c);
  struct sockaddr_storage ss;
  socklen_t sl;
  if (c == NULL)
    return NULL;
  memset(&ss, 0, sizeof ss);
  if (strchr(ip, ':') != NULL) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((uint16_t)port);
    inet_pton(AF_INET6, ip, &a->sin6_addr);
    sl = sizeof *a;
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, ip, &a->sin_addr);
    sl = sizeof *a;
  }
  c->fd = socket(ss.ss_family, SOCK_STREAM, 0);
  /* loopback: the kernel completes the handshake without accept() */
  if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&ss, sl) != 0) {
    if (c->fd >= 0)
      close(c->fd);
    free(c);
    return NULL;
  }
  fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
  return c;
}

static inline void htc_free(htc_t *c) {
  if (c == NULL)
    return;
  if (c->fd >= 0)
    close(c->fd);
  free(c);
}

/* Read what is there. */
static inline void htc_read(htc_t *c) {
  char tmp[16384];
  while (!c->eof) {
    ssize_t n = recv(c->fd, tmp, sizeof tmp, 0);
    if (n > 0) {
      size_t k = (size_t)n, keep = HTC_BUF - c->len;
      if (keep > k)
        keep = k;
      memcpy(c->buf + c->len, tmp, keep);
      c->len += keep;
      c->total += k;
      if (k >= sizeof c->tail) {
        memcpy(c->tail, tmp + k - sizeof c->tail, sizeof c->tail);
      } else {
        memmove(c->tail, c->tail + k, sizeof c->tail - k);
        memcpy(c->tail + sizeof c->tail - k, tmp, k);
      }
      continue;
    }
    if (n == 0) {
      c->eof = 1;
    } else if (errno == ECONNRESET) {
      c->eof = 1;
      c->reset = 1;
    }
    break;
  }
}

/* One turn: the loop once, then up to ms waiting for client bytes. */
static inline void htc_step(uv_loop_t *loop, htc_t *c, int ms) {
  uv_run(loop, UV_RUN_NOWAIT);
  if (c != NULL && !c->eof) {
    struct pollfd p = {c->fd, POLLIN, 0};
    if (poll(&p, 1, ms) > 0)
      htc_read(c);
  } else if (ms > 0) {
    poll(NULL, 0, ms);
  }
  uv_run(loop, UV_RUN_NOWAIT);
}

/* Send everything, turning the loop while the socket is full. 0, or -1
 * when the server is gone. */
static inline int htc_send(uv_loop_t *loop, htc_t *c, const char *d, size_t n) {
  uint64_t t0 = htc_now_ms();
  while (n > 0) {
    ssize_t k = send(c->fd, d, n, MSG_NOSIGNAL);
    if (k > 0) {
      d += k;
      n -= (size_t)k;
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return -1;
    if (htc_now_ms() - t0 > 5000)
      return -1;
    htc_step(loop, c, 1);
  }
  uv_run(loop, UV_RUN_NOWAIT);
  return 0;
}

static inline int htc_sends(uv_loop_t *loop, htc_t *c, const char *s) {
  return htc_send(loop, c, s, strlen(s));
}

/* ------------------------------------------------------------------ */
/* responses */

typedef struct {
  int status;
  int minor;
  const char *head; /* status line + fields, in the client buffer */
  size_t head_len;
  int has_cl, chunked, close;
  uint64_t cl;
  size_t body_len;  /* decoded */
  char body[16384]; /* the first 16 KiB of the decoded body, NUL-ended */
  size_t wire_len;  /* bytes of the whole response */
} htc_resp_t;

static inline int htc_ci_prefix(const char *a, const char *lit) {
  for (; *lit; a++, lit++) {
    char x = *a, y = *lit;
    if (x >= 'A' && x <= 'Z')
      x = (char)(x | 0x20);
    if (x != y)
      return 0;
  }
  return 1;
}

/*
 * The value of field `name` (lower-case) in r's header section, copied to
 * out (NUL-ended); 0 if found, -1 if not.
 */
static inline int htc_header(const htc_resp_t *r, const char *name, char *out,
                             size_t cap) {
  const char *p = r->head, *end = r->head + r->head_len;
  size_t nl = strlen(name);
  p = memchr(p, '\n', (size_t)(end - p));
  while (p != NULL && ++p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (eol == NULL)
      break;
    if ((size_t)(eol - p) > nl && p[nl] == ':' && htc_ci_prefix(p, name)) {
      const char *v = p + nl + 1, *ve = eol;
      size_t k;
      while (v < ve && (*v == ' ' || *v == '\t'))
        v++;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
      k = (size_t)(ve - v);
      if (k >= cap)
        k = cap - 1;
      memcpy(out, v, k);
      out[k] = 0;
      return 0;
    }
    p = eol;
  }
  return -1;
}

static inline void htc_body_put(htc_resp_t *r, const char *p, size_t n) {
  size_t cap = sizeof r->body - 1;
  if (r->body_len < cap) {
    size_t k = n < cap - r->body_len ? n : cap - r->body_len;
    memcpy(r->body + r->body_len, p, k);
    r->body[r->body_len + k] = 0;
  }
  r->body_len += n;
}

/*
 * Parse one response at b[0..n). is_head: it answers a HEAD (no body).
 * eof: the connection is closed (ends a close-delimited body).
 * Returns the bytes it takes (> 0), 0 if incomplete, -1 if malformed.
 */
static inline long htc_parse(const char *b, size_t n, int is_head, int eof,
                             htc_resp_t *r) {
  const char *he = NULL;
  size_t i, pos;
  char v[64];
  memset(r, 0, offsetof(htc_resp_t, body));
  r->body[0] = 0;
  for (i = 0; i + 3 < n; i++)
    if (b[i] == '\r' && b[i + 1] == '\n' && b[i + 2] == '\r' &&
        b[i + 3] == '\n') {
      he = b + i + 4;
      break;
    }
  if (he == NULL)
    return 0;
  if (n < 12 || memcmp(b, "HTTP/1.", 7) != 0 || b[8] != ' ')
    return -1;
  r->minor = b[7] - '0';
  r->status = atoi(b + 9);
  r->head = b;
  r->head_len = (size_t)(he - b);
  pos = r->head_len;
  if (htc_header(r, "connection", v, sizeof v) == 0)
    r->close = htc_ci_prefix(v, "close");
  if (htc_header(r, "content-length", v, sizeof v) == 0) {
    r->has_cl = 1;
    r->cl = strtoull(v, NULL, 10);
  }
  if (htc_header(r, "transfer-encoding", v, sizeof v) == 0)
    r->chunked = strcmp(v, "chunked") == 0;
  if (is_head || r->status / 100 == 1 || r->status == 204 || r->status == 304) {
    r->wire_len = pos;
    return (long)pos;
  }
  if (r->chunked) {
    for (;;) {
      uint64_t sz = 0;
      size_t k = pos;
      while (k < n && isxdigit((unsigned char)b[k])) {
        char ch = b[k];
        sz =
            sz * 16 + (uint64_t)(ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
        k++;
      }
      if (k + 2 > n)
        return 0;
      if (k == pos || b[k] != '\r' || b[k + 1] != '\n')
        return -1;
      k += 2;
      if (sz == 0) {
        /* the trailer section: field lines up to an empty line */
        for (;;) {
          const char *eol;
          if (k + 2 > n)
            return 0;
          if (b[k] == '\r' && b[k + 1] == '\n')
            break;
          eol = memchr(b + k, '\n', n - k);
          if (eol == NULL)
            return 0;
          if (eol == b + k || eol[-1] != '\r')
            return -1;
          k = (size_t)(eol - b) + 1;
        }
        r->wire_len = k + 2;
        return (long)r->wire_len;
      }
      if (k + sz + 2 > n)
        return 0;
      if (b[k + sz] != '\r' || b[k + sz + 1] != '\n')
        return -1;
      htc_body_put(r, b + k, (size_t)sz);
      pos = k + (size_t)sz + 2;
    }
  }
  if (r->has_cl) {
    if (pos + r->cl > n)
      return 0;
    htc_body_put(r, b + pos, (size_t)r->cl);
    r->wire_len = pos + (size_t)r->cl;
    return (long)r->wire_len;
  }
  if (!eof) /* close-delimited */
    return 0;
  htc_body_put(r, b + pos, n - pos);
  r->wire_len = n;
  return (long)n;
}

/*
 * Parse the responses in c's buffer; heads[i] says whether response i
 * answers a HEAD (NULL: none does). Fills out[0..max) and returns how many
 * are complete, or -1 if one is malformed.
 */
static inline int htc_responses(const htc_t *c, const int *heads,
                                htc_resp_t *out, int max) {
  size_t off = 0;
  int k = 0;
  static htc_resp_t scratch; /* test-only: single thread */
  while (off < c->len) {
    htc_resp_t *r = k < max ? &out[k] : &scratch;
    long used =
        htc_parse(c->buf + off, c->len - off, heads ? heads[k] : 0, c->eof, r);
    if (used < 0)
      return -1;
    if (used == 0)
      break;
    off += (size_t)used;
    k++;
  }
  return k;
}

#endif /* HTTP_TEST_CLIENT_H */
