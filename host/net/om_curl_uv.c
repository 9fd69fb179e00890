/* om_curl_uv.c: libcurl multi on a libuv loop (see om_curl_uv.h). */
#include "om_curl_uv.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "om_errno.h"
#include "om_list.h"

#define NO_SLOT UINT32_MAX

/*
 * One added transfer. Slots live in one array indexed by the number kept in
 * the easy handle's CURLOPT_PRIVATE (index + 1), so finding a transfer is
 * O(1) and a foreign easy is recognised safely: its private value is either
 * out of range or names a slot that holds another easy.
 */
typedef struct slot_s {
  CURL *easy; /* NULL: free */
  om_curl_done_cb cb;
  void *ud;
  char *saved_private;    /* the caller's CURLOPT_PRIVATE */
  void (*drop)(void *ud); /* frees glue-owned requests on close */
  CURLcode failed;        /* set when we could not watch its socket */
  uint32_t next_free;
} slot_t;

/* One socket libcurl asked us to watch. */
typedef struct sock_s {
  uv_poll_t poll;
  om_curl_uv_t *cu;
  curl_socket_t fd;
  int events; /* what libcurl asked us to watch */
  int closing;
  om_list_t link; /* on cu->socks */
} sock_t;

struct om_curl_uv_s {
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  slot_t *slots;
  uint32_t n_slots, cap_slots, free_head;
  size_t active;
  size_t n_failed;  /* slots with failed set */
  om_list_t socks;  /* every sock_t not yet freed, closing ones included */
  size_t n_handles; /* libuv handles not yet closed (timer + socks) */
  int busy;         /* > 0 while we dispatch (drive) */
  int in_curl;      /* > 0 while libcurl runs (its callbacks may call us) */
  int closing;
  int cleaned; /* curl_multi_cleanup done */
  om_curl_closed_cb closed_cb;
  void *closed_ud;
};

/* ---- slots ---- */

static int slot_of(const om_curl_uv_t *cu, CURL *easy) {
  char *p = NULL;
  uintptr_t i;
  if (curl_easy_getinfo(easy, CURLINFO_PRIVATE, &p) != CURLE_OK)
    return -1;
  i = (uintptr_t)p;
  if (i == 0 || i > cu->n_slots || cu->slots[i - 1].easy != easy)
    return -1;
  return (int)(i - 1);
}

static int slot_take(om_curl_uv_t *cu, uint32_t *idx) {
  if (cu->free_head != NO_SLOT) {
    *idx = cu->free_head;
    cu->free_head = cu->slots[*idx].next_free;
    return 0;
  }
  if (cu->n_slots == cu->cap_slots) {
    uint32_t ncap = cu->cap_slots ? cu->cap_slots * 2 : 16;
    slot_t *ns;
    if (cu->cap_slots >= UINT32_MAX / 4)
      return OM_ENOMEM;
    ns = realloc(cu->slots, (size_t)ncap * sizeof *ns);
    if (ns == NULL)
      return OM_ENOMEM;
    cu->slots = ns;
    cu->cap_slots = ncap;
  }
  *idx = cu->n_slots++;
  return 0;
}

/* Forget the transfer in slot i and hand the easy back to its owner's
 * CURLOPT_PRIVATE; the slot returns to the free list. */
static void slot_release(om_curl_uv_t *cu, uint32_t i) {
  slot_t *s = &cu->slots[i];
  curl_easy_setopt(s->easy, CURLOPT_PRIVATE, s->saved_private);
  if (s->failed != CURLE_OK)
    cu->n_failed--;
  memset(s, 0, sizeof *s);
  s->next_free = cu->free_head;
  cu->free_head = i;
  cu->active--;
}

/* ---- closing ---- */

static void maybe_free(om_curl_uv_t *cu) {
  if (!cu->closing || !cu->cleaned || cu->n_handles > 0)
    return;
  if (cu->closed_cb != NULL)
    cu->closed_cb(cu->closed_ud);
  free(cu->slots);
  free(cu);
  curl_global_cleanup();
}

static void sock_closed(uv_handle_t *h) {
  sock_t *sk = h->data;
  om_curl_uv_t *cu = sk->cu;
  om_list_remove(&sk->link);
  free(sk);
  cu->n_handles--;
  maybe_free(cu);
}

static void sock_close(sock_t *sk) {
  if (sk->closing)
    return;
  sk->closing = 1;
  /* libcurl announces CURL_POLL_REMOVE before it closes the descriptor, so
   * uv_close (which stops the poll: epoll_ctl DEL) still sees a valid fd,
   * and a new socket that reuses the number can be polled at once. */
  uv_close((uv_handle_t *)&sk->poll, sock_closed);
}

static void timer_closed(uv_handle_t *h) {
  om_curl_uv_t *cu = h->data;
  cu->n_handles--;
  maybe_free(cu);
}

static void finish_close(om_curl_uv_t *cu) {
  cu->in_curl++;
  curl_multi_cleanup(cu->multi); /* may report CURL_POLL_REMOVE */
  cu->in_curl--;
  cu->multi = NULL;
  cu->cleaned = 1;
  OM_LIST_FOREACH(it, &cu->socks) { /* unlinked later, in sock_closed */
    sock_close(OM_LIST_ENTRY(it, sock_t, link));
  }
  uv_close((uv_handle_t *)&cu->timer, timer_closed);
}

/* ---- completions ---- */

/* Report the end of slot i's transfer: release it first, so the callback
 * can re-add the handle, cancel others or close the glue. */
static void complete(om_curl_uv_t *cu, uint32_t i, CURLcode result) {
  slot_t s = cu->slots[i];
  slot_release(cu, i);
  cu->in_curl++;
  curl_multi_remove_handle(cu->multi, s.easy);
  cu->in_curl--;
  s.cb(s.ud, s.easy, result);
}

/* Transfers whose socket we could not watch (out of memory): libcurl
 * thinks we watch it, so they would hang until their timeout. Fail them. */
static void sweep_failed(om_curl_uv_t *cu) {
  for (uint32_t i = 0; i < cu->n_slots && cu->n_failed > 0 && !cu->closing; i++)
    if (cu->slots[i].easy != NULL && cu->slots[i].failed != CURLE_OK)
      complete(cu, i, cu->slots[i].failed);
}

static void read_info(om_curl_uv_t *cu) {
  CURLMsg *msg;
  int left;
  while (!cu->closing && (msg = curl_multi_info_read(cu->multi, &left))) {
    CURL *easy = msg->easy_handle;
    CURLcode result = msg->data.result; /* msg dies with the removal */
    int i;
    if (msg->msg != CURLMSG_DONE)
      continue;
    i = slot_of(cu, easy);
    if (i >= 0)
      complete(cu, (uint32_t)i, result);
  }
}

/* One event from the loop: let libcurl act on it, then report what ended.
 * A close requested meanwhile completes once the outermost drive ends. */
static void drive(om_curl_uv_t *cu, curl_socket_t fd, int flags) {
  int running;
  cu->busy++;
  cu->in_curl++;
  curl_multi_socket_action(cu->multi, fd, flags, &running);
  cu->in_curl--;
  sweep_failed(cu);
  read_info(cu);
  cu->busy--;
  if (cu->closing && cu->busy == 0 && !cu->cleaned)
    finish_close(cu);
}

static void on_poll(uv_poll_t *h, int status, int events) {
  sock_t *sk = h->data;
  int flags = 0;
  if (status < 0)
    flags = CURL_CSELECT_ERR;
  else {
    if (events & UV_READABLE)
      flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE)
      flags |= CURL_CSELECT_OUT;
  }
  drive(sk->cu, sk->fd, flags);
  /* On POLLERR libuv stops the handle before it calls us (UV_EBADF). If
   * libcurl kept the socket (no CURL_POLL_REMOVE), watch it again: a
   * socket libcurl believes watched but nobody watches hangs its transfer
   * until the timeout. sk is still allocated here: it is freed only by
   * its close callback, which runs after this one returns. */
  if (status < 0 && !sk->closing)
    uv_poll_start(&sk->poll, sk->events, on_poll);
}

static void on_timer(uv_timer_t *t) {
  drive(t->data, CURL_SOCKET_TIMEOUT, 0);
}

/* ---- what libcurl asks of us ---- */

static void mark_failed(om_curl_uv_t *cu, CURL *easy) {
  int i = slot_of(cu, easy);
  if (i >= 0 && cu->slots[i].failed == CURLE_OK) {
    cu->slots[i].failed = CURLE_OUT_OF_MEMORY;
    cu->n_failed++;
  }
}

/* CURLMOPT_SOCKETFUNCTION. Returning -1 would make libcurl (7.88) abort
 * every transfer of the multi, so a socket we cannot watch fails only the
 * transfer that asked (see sweep_failed). */
static int on_socket(CURL *easy, curl_socket_t s, int what, void *userp,
                     void *socketp) {
  om_curl_uv_t *cu = userp;
  sock_t *sk = socketp;
  int events = 0;
  if (what == CURL_POLL_REMOVE) {
    if (sk != NULL) {
      curl_multi_assign(cu->multi, s, NULL);
      sock_close(sk);
    }
    return 0;
  }
  if (sk == NULL) {
    sk = calloc(1, sizeof *sk);
    if (sk == NULL) {
      mark_failed(cu, easy);
      return 0;
    }
    if (uv_poll_init_socket(cu->loop, &sk->poll, s) != 0) {
      free(sk);
      mark_failed(cu, easy);
      return 0;
    }
    sk->poll.data = sk;
    sk->cu = cu;
    sk->fd = s;
    om_list_push_front(&cu->socks, &sk->link);
    cu->n_handles++;
    curl_multi_assign(cu->multi, s, sk);
  }
  if (what & CURL_POLL_IN)
    events |= UV_READABLE;
  if (what & CURL_POLL_OUT)
    events |= UV_WRITABLE;
  sk->events = events;
  if (uv_poll_start(&sk->poll, events, on_poll) != 0)
    mark_failed(cu, easy);
  return 0;
}

/* CURLMOPT_TIMERFUNCTION. libcurl must not be re-entered from here, so
 * even "now" (0) goes through the timer: it fires on the next loop
 * iteration. */
static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp) {
  om_curl_uv_t *cu = userp;
  (void)multi;
  if (timeout_ms < 0)
    uv_timer_stop(&cu->timer);
  else
    uv_timer_start(&cu->timer, on_timer, (uint64_t)timeout_ms, 0);
  return 0;
}

/* ---- public ---- */

int om_curl_uv_new(uv_loop_t *loop, om_curl_uv_t **out) {
  om_curl_uv_t *cu;
  if (loop == NULL || out == NULL)
    return OM_EINVAL;
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return OM_ENOMEM;
  cu = calloc(1, sizeof *cu);
  if (cu == NULL) {
    curl_global_cleanup();
    return OM_ENOMEM;
  }
  om_list_init(&cu->socks);
  cu->multi = curl_multi_init();
  if (cu->multi == NULL) {
    free(cu);
    curl_global_cleanup();
    return OM_ENOMEM;
  }
  cu->loop = loop;
  cu->free_head = NO_SLOT;
  curl_multi_setopt(cu->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(cu->multi, CURLMOPT_SOCKETDATA, cu);
  curl_multi_setopt(cu->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
  curl_multi_setopt(cu->multi, CURLMOPT_TIMERDATA, cu);
  uv_timer_init(loop, &cu->timer); /* cannot fail */
  cu->timer.data = cu;
  cu->n_handles = 1;
  *out = cu;
  return 0;
}

static int add_slot(om_curl_uv_t *cu, CURL *easy, om_curl_done_cb cb, void *ud,
                    void (*drop)(void *)) {
  char *saved = NULL;
  uint32_t i;
  CURLMcode mc;
  int rc;
  if (cu->closing || cu->in_curl)
    return OM_ESTATE;
  if (slot_of(cu, easy) >= 0)
    return OM_ESTATE;
  curl_easy_getinfo(easy, CURLINFO_PRIVATE, &saved);
  rc = slot_take(cu, &i);
  if (rc != 0)
    return rc;
  memset(&cu->slots[i], 0, sizeof cu->slots[i]);
  cu->slots[i].easy = easy;
  cu->slots[i].cb = cb;
  cu->slots[i].ud = ud;
  cu->slots[i].drop = drop;
  cu->slots[i].saved_private = saved;
  cu->active++;
  curl_easy_setopt(easy, CURLOPT_PRIVATE, (char *)(uintptr_t)(i + 1));
  mc = curl_multi_add_handle(cu->multi, easy);
  if (mc != CURLM_OK) {
    slot_release(cu, i);
    return mc == CURLM_OUT_OF_MEMORY ? OM_ENOMEM : OM_ESTATE;
  }
  return 0;
}

int om_curl_uv_add(om_curl_uv_t *cu, CURL *easy, om_curl_done_cb cb, void *ud) {
  if (cu == NULL || easy == NULL || cb == NULL)
    return OM_EINVAL;
  return add_slot(cu, easy, cb, ud, NULL);
}

int om_curl_uv_cancel(om_curl_uv_t *cu, CURL *easy) {
  int i;
  if (cu == NULL || easy == NULL)
    return OM_EINVAL;
  if (cu->in_curl)
    return OM_ESTATE;
  if (cu->closing || (i = slot_of(cu, easy)) < 0)
    return OM_ENOTFOUND;
  slot_release(cu, (uint32_t)i);
  cu->in_curl++;
  curl_multi_remove_handle(cu->multi, easy);
  cu->in_curl--;
  return 0;
}

size_t om_curl_uv_active(const om_curl_uv_t *cu) {
  return cu != NULL ? cu->active : 0;
}

int om_curl_uv_close(om_curl_uv_t *cu, om_curl_closed_cb cb, void *ud) {
  if (cu == NULL)
    return OM_EINVAL;
  if (cu->closing || cu->in_curl)
    return OM_ESTATE;
  cu->closing = 1;
  cu->closed_cb = cb;
  cu->closed_ud = ud;
  for (uint32_t i = 0; i < cu->n_slots; i++) {
    slot_t s = cu->slots[i];
    if (s.easy == NULL)
      continue;
    slot_release(cu, i);
    cu->in_curl++;
    curl_multi_remove_handle(cu->multi, s.easy);
    cu->in_curl--;
    if (s.drop != NULL)
      s.drop(s.ud);
  }
  if (cu->busy == 0)
    finish_close(cu);
  return 0;
}

/* ---- simple requests ---- */

struct om_curl_request_s {
  om_curl_uv_t *cu;
  CURL *easy;
  struct curl_slist *headers;
  om_curl_resp_cb cb;
  void *ud;
  char *buf;
  size_t len, cap, max;
  int too_big, oom, in_cb;
  char errbuf[CURL_ERROR_SIZE];
  char errtext[CURL_ERROR_SIZE + 64]; /* om_curl_error_text's */
};

static void request_free(om_curl_request_t *r) {
  if (r->easy != NULL)
    curl_easy_cleanup(r->easy);
  curl_slist_free_all(r->headers);
  free(r->buf);
  free(r);
}

static void request_drop(void *ud) {
  request_free(ud);
}

static size_t request_write(char *data, size_t size, size_t nmemb,
                            void *userp) {
  om_curl_request_t *r = userp;
  size_t n = size * nmemb; /* libcurl guarantees size == 1 */
  if (n > r->max - r->len) {
    r->too_big = 1;
    return 0; /* a short count ends the transfer (CURLE_WRITE_ERROR) */
  }
  if (r->len + n + 1 > r->cap) {
    size_t ncap = r->cap ? r->cap : 1024;
    char *nb;
    while (ncap < r->len + n + 1)
      ncap *= 2;
    if (ncap > r->max + 1)
      ncap = r->max + 1;
    nb = realloc(r->buf, ncap);
    if (nb == NULL) {
      r->oom = 1;
      return 0;
    }
    r->buf = nb;
    r->cap = ncap;
  }
  memcpy(r->buf + r->len, data, n);
  r->len += n;
  r->buf[r->len] = '\0';
  return n;
}

static void request_done(void *ud, CURL *easy, CURLcode result) {
  om_curl_request_t *r = ud;
  om_curl_resp_t resp;
  char msg[96];
  long status = 0;
  memset(&resp, 0, sizeof resp);
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  resp.status = status;
  resp.easy = easy;
  resp.result = result;
  if (r->too_big || result == CURLE_FILESIZE_EXCEEDED) {
    resp.result = CURLE_FILESIZE_EXCEEDED;
    snprintf(msg, sizeof msg, "response body exceeds %zu bytes", r->max);
    resp.error = msg;
  } else if (r->oom) {
    resp.result = CURLE_OUT_OF_MEMORY;
    resp.error = "out of memory";
  } else if (result != CURLE_OK)
    resp.error =
        om_curl_error_text(result, r->errbuf, r->errtext, sizeof r->errtext);
  else
    resp.error = "";
  if (resp.result == CURLE_OK && r->len > 0) {
    resp.body = r->buf;
    resp.body_len = r->len;
    r->buf = NULL;
  }
  r->in_cb = 1;
  r->cb(r->ud, &resp);
  free(resp.body);
  request_free(r);
}

static int is_tchar(unsigned char c) {
  /* RFC 9110 section 5.6.2: tchar */
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z') || (c != '\0' && strchr("!#$%&'*+-.^_`|~", c));
}

static int valid_method(const char *m) {
  if (m[0] == '\0')
    return 0;
  for (; *m != '\0'; m++)
    if (!is_tchar((unsigned char)*m))
      return 0;
  return 1;
}

static int has_header(const om_curl_req_t *req, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < req->n_headers; i++)
    if (strncasecmp(req->headers[i], name, n) == 0 && req->headers[i][n] == ':')
      return 1;
  return 0;
}

static int add_header(struct curl_slist **list, const char *line) {
  struct curl_slist *n = curl_slist_append(*list, line);
  if (n == NULL)
    return OM_ENOMEM;
  *list = n;
  return 0;
}

/* Configure r->easy from req. */
static int request_setup(om_curl_request_t *r, const om_curl_req_t *req) {
  const char *method = req->method != NULL ? req->method : "GET";
  uint64_t timeout =
      req->timeout_ms ? req->timeout_ms : OM_CURL_DEFAULT_TIMEOUT_MS;
  CURL *e = r->easy;
  int is_head = strcmp(method, "HEAD") == 0;
  int with_body =
      !is_head && (req->body_len > 0 || strcmp(method, "POST") == 0 ||
                   strcmp(method, "PUT") == 0 || strcmp(method, "PATCH") == 0);
  int rc;
  for (size_t i = 0; i < req->n_headers; i++) {
    if (req->headers[i] == NULL || strpbrk(req->headers[i], "\r\n") != NULL)
      return OM_EINVAL;
    if (add_header(&r->headers, req->headers[i]) != 0)
      return OM_ENOMEM;
  }
  /* libcurl would label a body application/x-www-form-urlencoded and ask
   * for 100-continue on large ones: neither is what a JSON API wants. */
  if (with_body && !has_header(req, "Content-Type") &&
      add_header(&r->headers, "Content-Type:") != 0)
    return OM_ENOMEM;
  if (with_body && !has_header(req, "Expect") &&
      add_header(&r->headers, "Expect:") != 0)
    return OM_ENOMEM;
  if ((rc = om_curl_easy_base(e, req->url, r->errbuf)) != 0)
    return rc;
  if ((rc = om_curl_easy_tls(e, req->tls)) != 0)
    return rc;
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS,
                   timeout > LONG_MAX ? LONG_MAX : (long)timeout);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->headers);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, request_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)r->max);
  if (is_head)
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  if (with_body) {
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    if (curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS,
                         req->body != NULL ? req->body : "") != CURLE_OK)
      return OM_ENOMEM;
  }
  /* POSTFIELDS implies POST, nothing implies GET; NOBODY made it HEAD */
  if (!is_head && strcmp(method, with_body ? "POST" : "GET") != 0 &&
      curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method) != CURLE_OK)
    return OM_ENOMEM;
  return 0;
}

int om_curl_uv_request(om_curl_uv_t *cu, const om_curl_req_t *req,
                       om_curl_resp_cb cb, void *ud, om_curl_request_t **out) {
  om_curl_request_t *r;
  int rc;
  if (cu == NULL || req == NULL || cb == NULL || req->url == NULL ||
      (req->body == NULL && req->body_len > 0) ||
      (req->headers == NULL && req->n_headers > 0) ||
      (req->method != NULL && !valid_method(req->method)))
    return OM_EINVAL;
  if (cu->closing || cu->in_curl)
    return OM_ESTATE;
  r = calloc(1, sizeof *r);
  if (r == NULL)
    return OM_ENOMEM;
  r->cu = cu;
  r->cb = cb;
  r->ud = ud;
  r->max = req->max_body ? req->max_body : OM_CURL_MAX_BODY;
  if (r->max == SIZE_MAX)
    r->max--; /* room for the NUL */
  r->easy = curl_easy_init();
  if (r->easy == NULL) {
    free(r);
    return OM_ENOMEM;
  }
  rc = request_setup(r, req);
  if (rc == 0)
    rc = add_slot(cu, r->easy, request_done, r, request_drop);
  if (rc != 0) {
    request_free(r);
    return rc;
  }
  if (out != NULL)
    *out = r;
  return 0;
}

int om_curl_request_cancel(om_curl_request_t *r) {
  int rc;
  if (r == NULL || r->in_cb)
    return 0;
  rc = om_curl_uv_cancel(r->cu, r->easy);
  if (rc == OM_ESTATE)
    return rc;
  request_free(r);
  return 0;
}

const char *om_curl_resp_header(const om_curl_resp_t *resp, const char *name) {
  struct curl_header *h = NULL;
  if (resp == NULL || resp->easy == NULL || name == NULL)
    return NULL;
  if (curl_easy_header(resp->easy, name, 0, CURLH_HEADER, -1, &h) !=
          CURLHE_OK ||
      h == NULL)
    return NULL;
  /* the last instance: a repeated field's final value wins */
  if (h->amount > 1 && curl_easy_header(resp->easy, name, h->amount - 1,
                                        CURLH_HEADER, -1, &h) != CURLHE_OK)
    return NULL;
  return h->value;
}

int om_curl_easy_base(CURL *e, const char *url, char *errbuf) {
  CURLcode cc = curl_easy_setopt(e, CURLOPT_URL, url);
  if (cc != CURLE_OK)
    return cc == CURLE_OUT_OF_MEMORY ? OM_ENOMEM : OM_EINVAL;
#if LIBCURL_VERSION_NUM >= 0x075500
  if (curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK)
    return OM_ENOMEM;
  if (curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") !=
      CURLE_OK)
    return OM_ENOMEM;
#else
  curl_easy_setopt(e, CURLOPT_PROTOCOLS, CURLPROTO_HTTP | CURLPROTO_HTTPS);
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS,
                   CURLPROTO_HTTP | CURLPROTO_HTTPS);
#endif
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  if (errbuf != NULL)
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  return 0;
}

/* A libcurl refusal as an OM_E* code. */
static int tls_opt(CURL *e, CURLoption opt, const char *value) {
  CURLcode cc = curl_easy_setopt(e, opt, value);
  if (cc == CURLE_OK)
    return 0;
  return cc == CURLE_OUT_OF_MEMORY ? OM_ENOMEM : OM_EINVAL;
}

int om_curl_easy_tls(CURL *e, const om_curl_tls_t *tls) {
  int rc = 0;
  if (e == NULL)
    return OM_EINVAL;
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
  if (tls == NULL)
    return 0;
  if ((tls->cert_file == NULL) != (tls->key_file == NULL))
    return OM_EINVAL;
  if (tls->ca_file != NULL)
    rc = tls_opt(e, CURLOPT_CAINFO, tls->ca_file);
  if (rc == 0 && tls->cert_file != NULL) {
    rc = tls_opt(e, CURLOPT_SSLCERT, tls->cert_file);
    if (rc == 0)
      rc = tls_opt(e, CURLOPT_SSLCERTTYPE, "PEM");
    if (rc == 0)
      rc = tls_opt(e, CURLOPT_SSLKEY, tls->key_file);
    if (rc == 0)
      rc = tls_opt(e, CURLOPT_SSLKEYTYPE, "PEM");
  }
  return rc;
}

const char *om_curl_error_text(CURLcode result, const char *errbuf, char *out,
                               size_t cap) {
  const char *why =
      errbuf != NULL && errbuf[0] != '\0' ? errbuf : curl_easy_strerror(result);
  if (cap == 0)
    return "";
  if (result == CURLE_PEER_FAILED_VERIFICATION)
    snprintf(out, cap, "TLS verification of the server failed: %s", why);
  else
    snprintf(out, cap, "%s", why);
  return out;
}
