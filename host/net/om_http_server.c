/*
 * om_http_server.c: HTTP/1.1 server on libuv (see om_http_server.h).
 *
 * Reading a request, per connection:
 *   raw bytes -> scan_head (om_http1_head_parse, core/om_http1.c: the
 *   strict RFC 9112 head parser finds the end of the header section,
 *   enforces the limits, records every field) -> check_semantics
 *   (version, method, target, Host, Content-Length / Transfer-Encoding
 *   through om_http1_framing_*, Expect) -> body: decode (a length count,
 *   or om_http1_chunked_decode handing back spans) -> a complete request
 *   is queued; the queue is dispatched one at a time. Every message is
 *   parsed once; http-parser is a differential oracle in the tests
 *   (tests/test_http1_fuzz.c), not a second runtime parse.
 * After any rejection the connection is ERRORING: nothing more is parsed,
 * bytes are read and dropped (so the peer sees our answer, not a reset),
 * the error answer is sent once the responses before it have ended, and
 * the connection is half-closed, then closed.
 *
 * Closing: conn_close runs on_close callbacks, so it is called only from
 * loop callbacks; inside an API call a broken connection is marked
 * FAILED and closed from its timer on the next loop turn.
 *
 * Files: this one accepts connections and holds the server and the
 * request / response API; om_http_server_read.c the read side (parsing,
 * dispatch, timers), om_http_server_write.c the write side (corked
 * output, response heads, teardown), om_http_server_body.c streamed
 * request bodies (stream_bodies); om_http_server_internal.h what they
 * share.
 */
#define _GNU_SOURCE /* accept4: non-blocking, close-on-exec in one call */
#include "om_http_server.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "om_errno.h"
#include "om_http1.h"
#include "om_http_chars.h"
#include "om_http_server_internal.h"
#include "om_log.h"

/* ------------------------------------------------------------------ */
/* rejection names */

const char *om_http_reject_name(om_http_reject_t reason) {
  switch (reason) {
#define OM__HTTP_REJECT_NAME(name, status, str)                                \
  case OM_HTTP_REJECT_##name:                                                  \
    return str;
    OM_HTTP_REJECT_MAP(OM__HTTP_REJECT_NAME)
#undef OM__HTTP_REJECT_NAME
  default:
    return "unknown";
  }
}

int om_http_reject_status(om_http_reject_t reason) {
  switch (reason) {
#define OM__HTTP_REJECT_STATUS(name, status, str)                              \
  case OM_HTTP_REJECT_##name:                                                  \
    return status;
    OM_HTTP_REJECT_MAP(OM__HTTP_REJECT_STATUS)
#undef OM__HTTP_REJECT_STATUS
  default:
    return 0;
  }
}

/* ------------------------------------------------------------------ */
/* small helpers */

uint64_t om__http_now_ms(const conn_t *c) {
  return uv_now(c->srv->loop);
}

void om__http_req_free(req_t *r) {
  if (r == NULL)
    return;
  if (r->conn != NULL && r->conn->sbody == r)
    r->conn->sbody = NULL; /* its body is no longer anyone's */
  free(r->body);
  free(r);
}

void om__http_conn_drop_requests(conn_t *c) {
  while (c->q_head != NULL) {
    req_t *r = c->q_head;
    c->q_head = r->next;
    om__http_req_free(r);
  }
  c->q_tail = NULL;
  c->q_len = 0;
  om__http_req_free(c->cur);
  c->cur = NULL;
}

/* Close from the timer on the next loop turn: safe inside API calls. */
void om__http_conn_fail(conn_t *c) {
  if (c->phase >= PH_FAILED)
    return;
  c->phase = PH_FAILED;
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
  uv_timer_start(&c->timer, om__http_on_timer, 0, 0);
}

/* IMF-fixdate (RFC 9110 5.6.7), cached per second; no locale. */
const char *om__http_date(om_http_server_t *s) {
  static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed",
                                  "Thu", "Fri", "Sat"};
  static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  time_t now = time(NULL);
  if (now != s->date_sec || s->date[0] == 0) {
    struct tm tm;
    gmtime_r(&now, &tm);
    snprintf(s->date, sizeof s->date, "%s, %02d %s %04d %02d:%02d:%02d GMT",
             days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12],
             tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    s->date_sec = now;
  }
  return s->date;
}

/* ------------------------------------------------------------------ */
/* accepting */

/*
 * The server accepts itself (accept4 on the listening socket, watched by a
 * uv_poll) rather than through uv_listen, for descriptor exhaustion.
 * libuv 1.44 (Debian 12) handles EMFILE in uv__server_io with its "emfile
 * trick": it closes a spare descriptor, accepts every pending connection
 * and closes it without a word, so a client sees an empty reply, not a
 * status; and when its spare is gone it calls back with UV_EMFILE and
 * loops on accept at once, which spins while the process stays out of
 * descriptors. Here: one reserve descriptor (/dev/null) per server; on
 * EMFILE or ENFILE it is closed, one connection is accepted on the freed
 * slot, answered 503 and closed, and the reserve reopened. When even that
 * cannot be done (the reserve was lost, or accept fails otherwise) the
 * server stops watching the socket for ACCEPT_PAUSE_MS: the kernel keeps
 * queueing connections, nothing spins.
 */
#define ACCEPT_BATCH 64     /* connections per readiness event, by default */
#define ACCEPT_PAUSE_MS 100 /* when accept cannot make progress */
#define ACCEPT_LOG_MS 1000  /* at most one pressure log line a second */

const char om__http_busy_503[] =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    "Content-Length: 32\r\nConnection: close\r\n\r\n"
    "{\"error\":\"too_many_connections\"}";
const size_t om__http_busy_503_len = sizeof om__http_busy_503 - 1;
#define busy_503 om__http_busy_503
static const char fd_503[] =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    "Content-Length: 30\r\nConnection: close\r\n\r\n"
    "{\"error\":\"local_resources\"}\n";

/*
 * Answer on a raw accepted descriptor if the socket takes it at once,
 * then close: half-close first and read what the client already sent, so
 * the close sends a FIN after our answer rather than a reset (RFC 9112
 * 9.6), within one read of what is there.
 */
static void answer_and_close(int fd, const char *msg, size_t len) {
  char sink[4096];
  (void)send(fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)shutdown(fd, SHUT_WR);
  (void)recv(fd, sink, sizeof sink, MSG_DONTWAIT);
  close(fd);
}

static int reserve_open(void) {
  return open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void accept_log(om_http_server_t *s, const char *event,
                       const char *error) {
  uint64_t now = uv_now(s->loop);
  char sup[24];
  if (s->accept_log_ms != 0 && now - s->accept_log_ms < ACCEPT_LOG_MS) {
    s->accept_suppressed++;
    return;
  }
  snprintf(sup, sizeof sup, "%" PRIu64, s->accept_suppressed);
  om_log(OM_LOG_ERROR, event, "error", error, "suppressed", sup, NULL);
  s->accept_log_ms = now;
  s->accept_suppressed = 0;
}

/*
 * Out of descriptors: give up the reserve, accept one connection on the
 * freed slot, answer 503, close it and take the reserve back. 1: one was
 * answered; 0: nothing was pending; -1: no reserve to give up.
 */
static int shed_on_reserve(om_http_server_t *s, int lfd) {
  int fd, err;
  if (s->reserve_fd < 0 && (s->reserve_fd = reserve_open()) < 0)
    return -1;
  close(s->reserve_fd);
  do
    fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  err = errno;
  if (fd >= 0) {
    answer_and_close(fd, fd_503, sizeof fd_503 - 1);
    s->m.connections_shed++;
  }
  s->reserve_fd = reserve_open();
  if (fd < 0)
    return err == EAGAIN || err == EWOULDBLOCK ? 0 : -1;
  accept_log(s, "http_accept_shed", "out of file descriptors: 503");
  return 1;
}

static void on_acceptable(uv_poll_t *h, int status, int events);

static void on_accept_resume(uv_timer_t *t) {
  om_http_server_t *s = t->data;
  if (!s->closing && !s->polling &&
      uv_poll_start(&s->accept_poll, UV_READABLE, on_acceptable) == 0)
    s->polling = 1;
}

/* Accept cannot make progress now: stop watching for a while. */
static void accept_pause(om_http_server_t *s) {
  if (s->polling) {
    uv_poll_stop(&s->accept_poll);
    s->polling = 0;
  }
  uv_timer_start(&s->accept_timer, on_accept_resume, ACCEPT_PAUSE_MS, 0);
}

/* ------------------------------------------------------------------ */
/* the reserve: health probes past max_connections */

void om__http_unreserve(conn_t *c) {
  if (!c->reserved)
    return;
  c->reserved = 0;
  om_list_remove(&c->rlink);
  c->srv->n_reserved--;
}

int om__http_reserve_admits(const om_http_server_t *s, const req_t *r) {
  const om_http_request_t *q = &r->pub;
  if (s->o.reserve_paths == NULL ||
      !((q->method_len == 3 && memcmp(q->method, "GET", 3) == 0) ||
        (q->method_len == 4 && memcmp(q->method, "HEAD", 4) == 0)))
    return 0;
  for (const char *const *p = s->o.reserve_paths; *p != NULL; p++)
    if (strlen(*p) == q->path_len && memcmp(*p, q->path, q->path_len) == 0)
      return 1;
  return 0;
}

/*
 * A slot in the reserve for a connection over max_connections: 1 when
 * there is one (a full reserve gives up its oldest connection that has
 * not brought a request head yet), 0 when there is none. Which path a
 * connection wants is only known once its head is read, so every
 * connection over the limit may try, briefly (reserve_timeout_ms); a
 * flood of idle ones keeps pushing each other out, while a probe, which
 * sends its request with the connect, is read and answered first.
 */
static int reserve_slot(om_http_server_t *s) {
  if (s->o.reserve_connections == 0)
    return 0;
  if (s->n_reserved < s->o.reserve_connections)
    return 1;
  OM_LIST_FOREACH(it, &s->reserved) {
    conn_t *c = OM_LIST_ENTRY(it, conn_t, rlink);
    if (c->phase == PH_READING && c->fresh && c->active == NULL &&
        c->q_len == 0 && c->cur == NULL && c->in_len == c->in_off) {
      om__http_unreserve(c);
      s->m.reserve_evicted++;
      om__http_conn_close(c, 0);
      return 1;
    }
  }
  return 0;
}

/* A new connection on fd (non-blocking, close-on-exec), now ours. */
static void take_connection(om_http_server_t *s, int fd) {
  conn_t *c;
  int namelen = (int)sizeof(struct sockaddr_storage);
  int reserved = 0;
  if (!s->closing &&
      s->m.connections_active - s->n_reserved >= s->o.max_connections) {
    if (!reserve_slot(s)) {
      s->m.connections_rejected++;
      answer_and_close(fd, busy_503, sizeof busy_503 - 1);
      return;
    }
    reserved = 1;
  }
  if (s->closing) {
    s->m.connections_rejected++;
    answer_and_close(fd, busy_503, sizeof busy_503 - 1);
    return;
  }
  c = calloc(1, sizeof *c);
  if (c == NULL) {
    s->m.connections_rejected++;
    answer_and_close(fd, busy_503, sizeof busy_503 - 1);
    accept_log(s, "http_accept_failed", "out of memory");
    return;
  }
  om_list_init(&c->dlink);
  om_list_init(&c->rlink);
  c->srv = s;
  if (reserved) {
    c->reserved = 1;
    om_list_push_back(&s->reserved, &c->rlink);
    s->n_reserved++;
    s->m.connections_reserved++;
  }
  om__http_scan_reset(c);
  uv_tcp_init(s->loop, &c->tcp);
  uv_timer_init(s->loop, &c->timer);
  c->tcp.data = c;
  c->timer.data = c;
  c->handles = 2;
  om_list_push_front(&s->conns, &c->link);
  s->m.connections_active++;
  om__http_publish_open(s);
  if (uv_tcp_open(&c->tcp, fd) != 0) {
    close(fd);
    om__http_conn_close(c, 0);
    return;
  }
  s->m.connections_accepted++;
  uv_tcp_nodelay(&c->tcp, 1);
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->remote, &namelen) ==
      0) {
    if (c->remote.ss_family == AF_INET6) {
      const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&c->remote;
      uv_ip6_name(a, c->remote_ip, sizeof c->remote_ip);
      c->remote_port = ntohs(a->sin6_port);
    } else {
      const struct sockaddr_in *a = (const struct sockaddr_in *)&c->remote;
      uv_ip4_name(a, c->remote_ip, sizeof c->remote_ip);
      c->remote_port = ntohs(a->sin_port);
    }
  }
  c->fresh = 1;
  c->hstart_set = 1;
  c->t_header = c->t_read = c->t_idle = c->t_write = om__http_now_ms(c);
  if (s->o.tls != NULL && om__http_tls_accept(c) != 0) {
    om__http_conn_close(c, 1);
    return;
  }
  om__http_conn_update(c);
}

static void on_acceptable(uv_poll_t *h, int status, int events) {
  om_http_server_t *s = h->data;
  uv_os_fd_t lfd;
  (void)events;
  if (s->closing || uv_fileno((uv_handle_t *)&s->listener, &lfd) != 0)
    return;
  if (status < 0) {
    accept_log(s, "http_accept_failed", uv_strerror(status));
    accept_pause(s);
    return;
  }
  for (size_t i = 0; i < s->o.accept_batch && !s->closing; i++) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), rc;
    if (fd >= 0) {
      if (s->o.on_accept == NULL || !s->o.on_accept(s, fd, s->o.on_accept_ud))
        take_connection(s, fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return;
    if (errno == EMFILE || errno == ENFILE) {
      rc = shed_on_reserve(s, lfd);
      if (rc > 0)
        continue;
      if (rc == 0)
        return;
      accept_log(s, "http_accept_failed",
                 "out of file descriptors and no reserve");
    } else {
      accept_log(s, "http_accept_failed",
                 uv_strerror(uv_translate_sys_error(errno)));
    }
    accept_pause(s); /* never spin on a socket we cannot drain */
    return;
  }
}

void om_http_server_adopt(om_http_server_t *s, int fd) {
  if (s == NULL) {
    close(fd);
    return;
  }
  take_connection(s, fd);
}

/* ------------------------------------------------------------------ */
/* the server */

int om_http_server_new(uv_loop_t *loop, const om_http_server_opts_t *opts,
                       om_http_handler_fn on_request, void *ud,
                       om_http_server_t **out) {
  om_http_server_opts_t o;
  om_http_server_t *s;
  if (loop == NULL || on_request == NULL || out == NULL)
    return OM_EINVAL;
  memset(&o, 0, sizeof o);
  if (opts != NULL)
    o = *opts;
  if (o.max_header_bytes == 0)
    o.max_header_bytes = DEF_MAX_HEADER_BYTES;
  if (o.max_header_bytes > CAP_MAX_HEADER_BYTES ||
      o.max_header_bytes < MIN_MAX_HEADER_BYTES)
    return OM_EINVAL;
  if (o.max_headers == 0)
    o.max_headers = DEF_MAX_HEADERS;
  if (o.max_headers > o.max_header_bytes)
    return OM_EINVAL;
  if (o.max_body_bytes == 0) /* streamed: the holder counts */
    o.max_body_bytes = o.stream_bodies ? SIZE_MAX / 4 : DEF_MAX_BODY_BYTES;
  if (o.max_body_bytes > SIZE_MAX / 4)
    return OM_EINVAL;
  if (o.header_timeout_ms == 0)
    o.header_timeout_ms = DEF_HEADER_TIMEOUT_MS;
  if (o.idle_timeout_ms == 0)
    o.idle_timeout_ms = DEF_IDLE_TIMEOUT_MS;
  if (o.drain_timeout_ms == 0)
    o.drain_timeout_ms = DEF_DRAIN_TIMEOUT_MS;
  if (o.header_timeout_ms > UINT32_MAX || o.idle_timeout_ms > UINT32_MAX ||
      o.drain_timeout_ms > UINT32_MAX)
    return OM_EINVAL;
  if (o.max_connections == 0)
    o.max_connections = DEF_MAX_CONNECTIONS;
  if (o.reserve_timeout_ms == 0)
    o.reserve_timeout_ms = DEF_RESERVE_TIMEOUT_MS;
  if (o.reserve_timeout_ms > UINT32_MAX)
    return OM_EINVAL;
  if (o.max_pipelined == 0)
    o.max_pipelined = DEF_MAX_PIPELINED;
  if (o.accept_batch == 0)
    o.accept_batch = ACCEPT_BATCH;
  if (o.accept_batch > ACCEPT_BATCH)
    return OM_EINVAL;
  if (o.http2 && !o.stream_bodies)
    return OM_EINVAL;
  s = calloc(1, sizeof *s);
  if (s == NULL)
    return OM_ENOMEM;
  om_list_init(&s->conns);
  om_list_init(&s->reserved);
  om_list_init(&s->dirty);
  s->loop = loop;
  s->o = o;
  s->on_request = on_request;
  s->ud = ud;
  /* none can fail: AF_UNSPEC creates no socket yet */
  uv_tcp_init(loop, &s->listener);
  uv_timer_init(loop, &s->drain_timer);
  uv_timer_init(loop, &s->accept_timer);
  uv_check_init(loop, &s->flush_check);
  uv_idle_init(loop, &s->flush_idle);
  s->listener.data = s;
  s->drain_timer.data = s;
  s->accept_timer.data = s;
  s->flush_check.data = s;
  s->flush_idle.data = s;
  s->reserve_fd = -1;
  s->handles = 5;
  *out = s;
  return 0;
}

/* A host:port literal as a socket address; 0 or UV_EINVAL. */
static int listen_addr(const char *host, int port,
                       struct sockaddr_storage *ss) {
  memset(ss, 0, sizeof *ss);
  if (host == NULL || port < 0 || port > 65535)
    return UV_EINVAL;
  if (strchr(host, ':') != NULL)
    return uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss);
  return uv_ip4_addr(host, port, (struct sockaddr_in *)ss);
}

/* A bound, listening, non-blocking socket; 0 and *fd or a libuv error. */
static int open_listener(const struct sockaddr_storage *ss, int *fd) {
  socklen_t len = ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                            : sizeof(struct sockaddr_in);
  int one = 1, rc = 0;
  int s = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0)
    return uv_translate_sys_error(errno);
  /* as libuv's bind: a restarted process may take the port back at once
   * (TIME_WAIT); a port another socket is listening on stays refused */
  if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(s, (const struct sockaddr *)ss, len) != 0 || listen(s, 511) != 0)
    rc = uv_translate_sys_error(errno);
  if (rc != 0) {
    close(s);
    return rc;
  }
  *fd = s;
  return 0;
}

static void listen_failed(om_http_server_t *s, const char *host, int port,
                          int rc) {
  char p[8];
  snprintf(p, sizeof p, "%d", port);
  om_log(OM_LOG_ERROR, "http_listen_failed", "host", host, "port", p, "error",
         uv_strerror(rc), NULL);
  s->listen_error = rc;
}

/* Take fd (listening) as the listener and watch it; 0 or a libuv error
 * (fd is then not ours). */
static int start_accepting(om_http_server_t *s, int fd) {
  int rc = uv_tcp_open(&s->listener, fd);
  if (rc != 0)
    return rc;
  s->listen_spent = 1; /* from here the handle owns fd */
  /* the listener stays the socket's owner (getsockname, close); the poll
   * only watches it, and is closed first */
  rc = uv_poll_init_socket(s->loop, &s->accept_poll, fd);
  if (rc != 0)
    return rc;
  s->accept_poll.data = s;
  s->handles++;
  s->poll_open = 1;
  s->polling = 1;
  rc = uv_poll_start(&s->accept_poll, UV_READABLE, on_acceptable);
  if (rc != 0)
    return rc;
  s->reserve_fd = reserve_open(); /* without it, EMFILE pauses accepting */
  s->listening = 1;
  return 0;
}

int om_http_listen_socket(const char *host, int port, int *fd, char *err,
                          size_t errlen) {
  struct sockaddr_storage ss;
  int rc;
  if (fd == NULL || listen_addr(host, port, &ss) != 0) {
    om_errbuf(err, errlen, "'%s' port %d is not an IP literal and a port",
              host != NULL ? host : "(null)", port);
    return OM_EINVAL;
  }
  if ((rc = open_listener(&ss, fd)) != 0) {
    om_errbuf(err, errlen, "%s", uv_strerror(rc));
    return OM_EIO;
  }
  return 0;
}

int om_http_server_listen_fd(om_http_server_t *s, int fd) {
  int rc;
  if (s == NULL || fd < 0) {
    if (fd >= 0)
      close(fd);
    return OM_EINVAL;
  }
  if (s->listening || s->listen_spent || s->closing) {
    close(fd);
    return OM_ESTATE;
  }
  if ((rc = start_accepting(s, fd)) != 0) {
    if (!s->listen_spent)
      close(fd);
    om_log(OM_LOG_ERROR, "http_listen_failed", "error", uv_strerror(rc), NULL);
    s->listen_error = rc;
    s->listen_spent = 1;
    return OM_EIO;
  }
  return 0;
}

int om_http_server_listen(om_http_server_t *s, const char *host, int port) {
  struct sockaddr_storage ss;
  int rc, fd = -1;
  if (s == NULL || host == NULL || listen_addr(host, port, &ss) != 0)
    return OM_EINVAL;
  if (s->listening || s->listen_spent || s->closing)
    return OM_ESTATE;
  rc = open_listener(&ss, &fd);
  if (rc == 0 && (rc = start_accepting(s, fd)) != 0 && !s->listen_spent)
    close(fd);
  if (rc != 0) {
    listen_failed(s, host, port, rc);
    s->listen_spent = 1; /* the handle may hold a socket now */
    return OM_EIO;
  }
  return 0;
}

const char *om_http_server_listen_error(const om_http_server_t *s) {
  return s != NULL && s->listen_error != 0 ? uv_strerror(s->listen_error)
                                           : NULL;
}

int om_http_server_port(const om_http_server_t *s) {
  struct sockaddr_storage ss;
  int len = (int)sizeof ss;
  if (s == NULL || !s->listening || s->closing)
    return OM_ESTATE;
  if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len) != 0)
    return OM_ESTATE;
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void on_srv_handle_closed(uv_handle_t *h) {
  om_http_server_t *s = h->data;
  s->handles--;
  om__http_srv_maybe_finish(s);
}

void om__http_srv_maybe_finish(om_http_server_t *s) {
  if (!s->closing || s->finished || !om_list_empty(&s->conns))
    return;
  if (!s->timer_closing) {
    s->timer_closing = 1;
    uv_close((uv_handle_t *)&s->drain_timer, on_srv_handle_closed);
    uv_close((uv_handle_t *)&s->accept_timer, on_srv_handle_closed);
    uv_close((uv_handle_t *)&s->flush_check, on_srv_handle_closed);
    uv_close((uv_handle_t *)&s->flush_idle, on_srv_handle_closed);
    return;
  }
  if (s->handles > 0)
    return;
  s->finished = 1;
  while (s->n_ob_spare > 0)
    free(s->ob_spare[--s->n_ob_spare]);
  if (s->on_closed != NULL)
    s->on_closed(s, s->ud);
  free(s);
}

static void on_drain(uv_timer_t *t) {
  om_http_server_t *s = t->data;
  OM_LIST_FOREACH_SAFE(it, &s->conns) {
    om__http_conn_close(OM_LIST_ENTRY(it, conn_t, link), 0);
  }
}

int om_http_server_close(om_http_server_t *s, om_http_closed_fn on_closed) {
  if (s == NULL)
    return OM_EINVAL;
  if (s->closing)
    return OM_ESTATE;
  s->closing = 1;
  s->on_closed = on_closed;
  /* the poll first: it watches the listener's descriptor */
  if (s->poll_open)
    uv_close((uv_handle_t *)&s->accept_poll, on_srv_handle_closed);
  uv_close((uv_handle_t *)&s->listener, on_srv_handle_closed);
  if (s->reserve_fd >= 0) {
    close(s->reserve_fd);
    s->reserve_fd = -1;
  }
  OM_LIST_FOREACH_SAFE(it, &s->conns) {
    conn_t *c = OM_LIST_ENTRY(it, conn_t, link);
    if (c->phase == PH_H2) { /* its streams may finish */
      om__http2_drain(c);
      continue;
    }
    /* a response in flight, or being flushed, may finish */
    if (c->phase >= PH_FAILED || c->active != NULL)
      continue;
    if (c->phase == PH_LINGERING)
      om__http_conn_close(c, 0);
    else
      om__http_conn_finish(c, 1);
  }
  if (!om_list_empty(&s->conns))
    uv_timer_start(&s->drain_timer, on_drain, s->o.drain_timeout_ms, 0);
  om__http_srv_maybe_finish(s);
  return 0;
}

const om_http_server_metrics_t *
om_http_server_metrics(const om_http_server_t *s) {
  return s != NULL ? &s->m : NULL;
}

/* ------------------------------------------------------------------ */
/* requests and responses */

const char *om_http_request_header(const om_http_request_t *req,
                                   const char *name, size_t *len) {
  size_t i, nl;
  if (req == NULL || name == NULL)
    return NULL;
  nl = strlen(name);
  for (i = 0; i < req->n_headers; i++) {
    const om_http_header_t *h = &req->headers[i];
    if (h->name_len == nl && om__http_ci_eq(name, nl, h->name)) {
      if (len != NULL)
        *len = h->value_len;
      return h->value;
    }
  }
  return NULL;
}

int om_http_request_on_close(om_http_request_t *req, om_http_close_fn cb) {
  req_t *r = (req_t *)req;
  if (OM__HTTP_IS_H2(req))
    return om__http2_on_close(req, cb);
  if (r == NULL)
    return OM_EINVAL;
  if (r->conn == NULL)
    return OM_ESTATE;
  r->on_close = cb;
  return 0;
}

/* The response ended: release req and move on (or close). */
static void req_finish(req_t *r, int close) {
  conn_t *c = r->conn;
  if (r->upgrade)
    c->held = 0; /* not switched: what follows is HTTP */
  om__http_req_free(r);
  c->active = NULL;
  c->t_idle = om__http_now_ms(c);
  if (c->phase >= PH_FAILED)
    return;
  if (close)
    om__http_conn_finish(c, 0);
  else
    om__http_conn_pump(c);
}

static int resp_close(const req_t *r, const rh_t *rh) {
  const conn_t *c = r->conn;
  /* a streamed body not read whole: what follows it cannot be parsed */
  return !r->keep_alive || rh->close || c->srv->closing || c->eof ||
         c->sbody == r;
}

static int conn_header(const req_t *r, int close) {
  if (close)
    return CH_CLOSE;
  return r->pub.version_minor == 0 ? CH_KEEP_ALIVE : CH_NONE;
}

int om_http_respond(om_http_request_t *req, int status,
                    const om_http_header_t *headers, size_t n, const char *body,
                    size_t len) {
  req_t *r = (req_t *)req;
  conn_t *c;
  char stackbuf[1024], *head;
  size_t hl;
  uv_buf_t bufs[2];
  rh_t rh;
  int rc, no_content, close, send_body;
  if (OM__HTTP_IS_H2(req))
    return om__http2_respond(req, status, headers, n, body, len);
  if (r == NULL || status < 200 || status > 599 || (len > 0 && body == NULL))
    return OM_EINVAL;
  if (r->rstate != RS_NONE || r->in_close_cb)
    return OM_ESTATE;
  no_content = status == 204 || status == 304;
  if (no_content && len > 0)
    return OM_EINVAL;
  rc = om__http_check_resp_headers(headers, n, 0, 0, &rh);
  if (rc != 0)
    return rc;
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED) {
    if (c != NULL)
      req_finish(r, 1);
    else
      om__http_req_free(r);
    return OM_ESTATE;
  }
  close = resp_close(r, &rh);
  /* RFC 9110 8.6: no Content-Length in 204; none sent with 304 either */
  head =
      om__http_build_head(c->srv, stackbuf, sizeof stackbuf, status, headers, n,
                          &rh, !no_content, len, 0, conn_header(r, close), &hl);
  if (head == NULL) {
    om__http_conn_fail(c);
    req_finish(r, 1);
    return OM_ENOMEM;
  }
  send_body = !r->is_head && !no_content && len > 0;
  bufs[0] = uv_buf_init(head, (unsigned)hl);
  bufs[1] = uv_buf_init(send_body ? (char *)body : NULL,
                        send_body ? (unsigned)len : 0);
  rc = om__http_conn_write(c, bufs, send_body ? 2 : 1);
  if (head != stackbuf)
    free(head);
  req_finish(r, close);
  return rc == 0 ? 0 : OM_ESTATE;
}

static int response_start(om_http_request_t *req, int status,
                          const om_http_header_t *headers, size_t n,
                          int checked) {
  req_t *r = (req_t *)req;
  conn_t *c;
  char stackbuf[1024], *head;
  size_t hl;
  uv_buf_t b;
  rh_t rh;
  int rc, no_body, close;
  if (OM__HTTP_IS_H2(req))
    return om__http2_response_start(req, status, headers, n, checked);
  if (r == NULL || status < 200 || status > 599)
    return OM_EINVAL;
  if (r->rstate != RS_NONE || r->in_close_cb)
    return OM_ESTATE;
  rc = om__http_check_resp_headers(headers, n, 1, checked, &rh);
  if (rc != 0)
    return rc;
  if (status == 204 && rh.has_cl)
    return OM_EINVAL;
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED)
    return OM_ESTATE;
  no_body = r->is_head || status == 204 || status == 304;
  if (no_body)
    r->rframe = RF_NOBODY;
  else if (rh.has_cl)
    r->rframe = RF_FIXED;
  else if (r->pub.version_minor == 1)
    r->rframe = RF_CHUNKED;
  else
    r->rframe = RF_CLOSE; /* HTTP/1.0: the body ends at the close */
  r->resp_left = rh.cl;
  close = resp_close(r, &rh) || r->rframe == RF_CLOSE;
  r->resp_close = close ? 1 : 0;
  head = om__http_build_head(c->srv, stackbuf, sizeof stackbuf, status, headers,
                             n, &rh, 0, 0, r->rframe == RF_CHUNKED,
                             conn_header(r, close), &hl);
  if (head == NULL)
    return OM_ENOMEM;
  r->rstate = RS_STREAMING;
  b = uv_buf_init(head, (unsigned)hl);
  rc = om__http_conn_write(c, &b, 1);
  if (head != stackbuf)
    free(head);
  return rc == 0 ? 0 : OM_ESTATE;
}

int om_http_response_start(om_http_request_t *req, int status,
                           const om_http_header_t *headers, size_t n) {
  return response_start(req, status, headers, n, 0);
}

int om_http_response_start_checked(om_http_request_t *req, int status,
                                   const om_http_header_t *headers, size_t n) {
  return response_start(req, status, headers, n, 1);
}

int om_http_response_write_lent(om_http_request_t *req, const char *data,
                                size_t len, om_http_release_fn release,
                                void *ud) {
  req_t *r = (req_t *)req;
  conn_t *c;
  int rc = OM_EINVAL;
  if (OM__HTTP_IS_H2(req)) { /* frames copy what they carry */
    rc = om__http2_response_write(req, data, len);
    goto done;
  }
  if (r == NULL || (len > 0 && data == NULL))
    goto done;
  rc = OM_ESTATE;
  if (r->rstate != RS_STREAMING || r->lent)
    goto done;
  rc = 0;
  if (len == 0)
    goto done;
  rc = OM_EINVAL;
  if (r->rframe == RF_FIXED && (uint64_t)len > r->resp_left)
    goto done;
  rc = OM_ESTATE;
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED)
    goto done;
  switch (r->rframe) {
  case RF_NOBODY:
    rc = 0;
    goto done;
  case RF_CHUNKED: { /* chunk = chunk-size CRLF chunk-data CRLF (7.1) */
    char line[24];
    uv_buf_t bufs[3];
    size_t k = om__http_u64_hex(line, len);
    line[k++] = '\r';
    line[k++] = '\n';
    bufs[0] = uv_buf_init(line, (unsigned)k);
    bufs[1] = uv_buf_init((char *)data, (unsigned)len);
    bufs[2] = uv_buf_init((char *)"\r\n", 2);
    return om__http_conn_write_lent(c, bufs, 3, 1, release, ud) == 0
               ? 0
               : OM_ESTATE;
  }
  default: {
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
    if (r->rframe == RF_FIXED)
      r->resp_left -= len;
    return om__http_conn_write_lent(c, &b, 1, 0, release, ud) == 0 ? 0
                                                                   : OM_ESTATE;
  }
  }
done:
  if (release != NULL)
    release(ud);
  return rc;
}

int om_http_response_write(om_http_request_t *req, const char *data,
                           size_t len) {
  return om_http_response_write_lent(req, data, len, NULL, NULL);
}

/* Cut the connection after what is queued, so the message stays
 * incomplete; reset for a close-delimited body, where a FIN would read as
 * a normal end. */
static void cut(req_t *r) {
  conn_t *c = r->conn;
  int reset = r->rstate == RS_STREAMING && r->rframe == RF_CLOSE;
  om__http_req_free(r);
  c->active = NULL;
  c->srv->m.responses_aborted++;
  if (c->phase >= PH_FAILED)
    return;
  if (reset) {
    om__http_conn_drop_requests(c);
    om__http_conn_close(c, 1); /* no request is active: no callbacks run */
  } else {
    om__http_conn_finish(c, 1);
  }
}

int om_http_response_end(om_http_request_t *req) {
  req_t *r = (req_t *)req;
  conn_t *c;
  int rc = 0;
  if (OM__HTTP_IS_H2(req))
    return om__http2_response_end(req);
  if (r == NULL)
    return OM_EINVAL;
  if (r->rstate != RS_STREAMING || r->in_close_cb || r->lent)
    return OM_ESTATE;
  c = r->conn;
  if (c == NULL) {
    om__http_req_free(r);
    return OM_ESTATE;
  }
  if (c->phase >= PH_FAILED) {
    req_finish(r, 1);
    return OM_ESTATE;
  }
  if (r->rframe == RF_FIXED && r->resp_left > 0) {
    cut(r);
    return OM_ESTATE;
  }
  if (r->rframe == RF_CHUNKED) { /* last-chunk, no trailers, CRLF */
    uv_buf_t b = uv_buf_init((char *)"0\r\n\r\n", 5);
    rc = om__http_conn_write(c, &b, 1);
  }
  req_finish(r, r->resp_close);
  return rc == 0 ? 0 : OM_ESTATE;
}

int om__http_trailer_ok(const char *name, size_t nl, const char *value,
                        size_t vl) {
  static const char *const framing[] = {"content-length",
                                        "transfer-encoding",
                                        "host",
                                        "trailer",
                                        "te",
                                        "connection",
                                        "keep-alive",
                                        "proxy-connection",
                                        "upgrade",
                                        "content-encoding",
                                        "content-type"};
  if (nl == 0 || name[0] == ':')
    return 0;
  for (size_t i = 0; i < nl; i++)
    if (!om__http_is_tchar((unsigned char)name[i]))
      return 0;
  for (size_t i = 0; i < vl; i++)
    if (!om__http_is_fvchar((unsigned char)value[i]) &&
        !om__http_is_ows((unsigned char)value[i]))
      return 0;
  for (size_t i = 0; i < sizeof framing / sizeof framing[0]; i++)
    if (om__http_ci_eq(name, nl, framing[i]))
      return 0;
  return 1;
}

/* Whether the request's TE lists "trailers" (RFC 9110 10.1.4). */
static int accepts_trailers(const om_http_request_t *req) {
  size_t n, i;
  const char *v = om_http_request_header(req, "te", &n);
  for (i = 0; v != NULL && i + 8 <= n; i++)
    if (strncasecmp(v + i, "trailers", 8) == 0 &&
        (i == 0 || v[i - 1] == ',' || v[i - 1] == ' ') &&
        (i + 8 == n || v[i + 8] == ',' || v[i + 8] == ' ' || v[i + 8] == ';'))
      return 1;
  return 0;
}

int om_http_response_end_trailers(om_http_request_t *req,
                                  const om_http_header_t *t, size_t n) {
  req_t *r = (req_t *)req;
  conn_t *c;
  uv_buf_t stack[33], *b = stack;
  size_t k = 0, i;
  int rc;
  if (OM__HTTP_IS_H2(req))
    return om__http2_response_end_trailers(req, t, n);
  if (r == NULL || (n > 0 && t == NULL))
    return OM_EINVAL;
  if (n == 0 || r->rstate != RS_STREAMING || r->in_close_cb ||
      r->rframe != RF_CHUNKED || r->conn == NULL ||
      r->conn->phase >= PH_FAILED || !accepts_trailers(req))
    return om_http_response_end(req);
  c = r->conn;
  if (4 * n + 2 > sizeof stack / sizeof stack[0]) {
    b = malloc((4 * n + 2) * sizeof *b);
    if (b == NULL) {
      cut(r);
      return OM_ENOMEM;
    }
  }
  b[k++] = uv_buf_init((char *)"0\r\n", 3);
  for (i = 0; i < n; i++) {
    size_t nl = t[i].name_len ? t[i].name_len : strlen(t[i].name);
    size_t vl = t[i].value_len ? t[i].value_len : strlen(t[i].value);
    if (!om__http_trailer_ok(t[i].name, nl, t[i].value, vl))
      continue;
    b[k++] = uv_buf_init((char *)t[i].name, (unsigned)nl);
    b[k++] = uv_buf_init((char *)": ", 2);
    b[k++] = uv_buf_init((char *)t[i].value, (unsigned)vl);
    b[k++] = uv_buf_init((char *)"\r\n", 2);
  }
  b[k++] = uv_buf_init((char *)"\r\n", 2);
  rc = om__http_conn_write(c, b, (unsigned)k);
  if (b != stack)
    free(b);
  req_finish(r, r->resp_close);
  return rc == 0 ? 0 : OM_ESTATE;
}

void om_http_response_abort(om_http_request_t *req) {
  req_t *r = (req_t *)req;
  if (OM__HTTP_IS_H2(req)) {
    om__http2_response_abort(req);
    return;
  }
  if (r == NULL || r->in_close_cb)
    return;
  if (r->conn == NULL) {
    om__http_req_free(r);
    return;
  }
  cut(r);
}

int om_http_response_on_drain(om_http_request_t *req, size_t low_water,
                              om_http_drain_fn cb) {
  req_t *r = (req_t *)req;
  conn_t *c;
  if (OM__HTTP_IS_H2(req))
    return om__http2_response_on_drain(req, low_water, cb);
  if (r == NULL)
    return OM_EINVAL;
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED || r->rstate != RS_STREAMING ||
      r->in_close_cb)
    return OM_ESTATE;
  r->on_drain = NULL;
  if (cb == NULL)
    return 0;
  if (om_http_response_pending(req) <= low_water)
    return 1;
  r->on_drain = cb;
  r->drain_low = low_water;
  return 0;
}

int om_http_request_set_send_buffer(om_http_request_t *req, int bytes) {
  req_t *r = (req_t *)req;
  int v = bytes;
  if (OM__HTTP_IS_H2(req)) { /* the connection's, shared by its streams */
    conn_t *c = om__http2_conn_of(req);
    if (c == NULL || c->phase == PH_CLOSING || bytes <= 0)
      return OM_ESTATE;
    return uv_send_buffer_size((uv_handle_t *)&c->tcp, &v) == 0 ? 0 : OM_EIO;
  }
  if (r == NULL || r->conn == NULL || r->conn->phase == PH_CLOSING ||
      bytes <= 0)
    return OM_ESTATE;
  return uv_send_buffer_size((uv_handle_t *)&r->conn->tcp, &v) == 0 ? 0
                                                                    : OM_EIO;
}

int om_http_response_lend(om_http_request_t *req, int *fd, uint64_t *left) {
  req_t *r = (req_t *)req;
  conn_t *c;
  uv_os_fd_t s;
  if (r == NULL || fd == NULL || left == NULL)
    return OM_EINVAL;
  if (OM__HTTP_IS_H2(req))
    return OM_ESTATE; /* frames, not bytes of one body */
  c = r->conn;
  if (c == NULL || c->phase >= PH_FAILED || c->tls != NULL || c->active != r ||
      r->rstate != RS_STREAMING || r->in_close_cb || r->lent ||
      r->rframe != RF_FIXED || r->resp_left == 0 ||
      uv_fileno((const uv_handle_t *)&c->tcp, &s) != 0)
    return OM_ESTATE;
  om__http_conn_flush(c); /* the head, corked: in order before the body */
  if (c->phase >= PH_FAILED)
    return OM_ESTATE;
  if (uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > 0)
    return 1;
  r->lent = 1;
  *fd = s;
  *left = r->resp_left;
  c->t_write = om__http_now_ms(c);
  om__http_conn_update(c); /* the write-progress timeout applies */
  return 0;
}

void om_http_response_lent_progress(om_http_request_t *req) {
  req_t *r = (req_t *)req;
  if (r != NULL && !OM__HTTP_IS_H2(req) && r->lent && r->conn != NULL)
    r->conn->t_write = om__http_now_ms(r->conn);
}

int om_http_response_unlend(om_http_request_t *req, uint64_t wrote) {
  req_t *r = (req_t *)req;
  if (r == NULL)
    return OM_EINVAL;
  if (OM__HTTP_IS_H2(req) || !r->lent)
    return OM_ESTATE;
  if (wrote > r->resp_left)
    return OM_EINVAL;
  r->lent = 0;
  r->resp_left -= wrote;
  if (r->conn != NULL)
    r->conn->t_write = om__http_now_ms(r->conn);
  return 0;
}

size_t om_http_response_pending(const om_http_request_t *req) {
  const req_t *r = (const req_t *)req;
  if (OM__HTTP_IS_H2(req))
    return om__http2_response_pending(req);
  if (r == NULL || r->conn == NULL || r->conn->phase == PH_CLOSING)
    return 0;
  return r->conn->ob_len +
         uv_stream_get_write_queue_size((const uv_stream_t *)&r->conn->tcp);
}
