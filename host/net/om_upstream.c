/*
 * om_upstream.c: the proxy's upstream HTTP/1.1 client (see om_upstream.h).
 *
 * Shape: a pool owns peers (a hash table keyed by socket address), each
 * peer an MRU list of idle connections; a connection carries at most one
 * request at a time (no pipelining: a reused connection must be provably
 * in sync). A request object lives from om_upstream_send to the end of
 * on_done and can move to a fresh connection once (stale keep-alive,
 * when the caller allows it).
 * Request objects are recycled through a free list with their head
 * buffers, and connections keep their read buffers, so a warm pool
 * allocates nothing per request.
 *
 * Callbacks never run from inside an om_upstream_* call: anything that
 * ends a request while such a call is on the stack (pool->api > 0) is
 * queued and finished from an idle handle ("kick"), which also delivers
 * bytes buffered while a request was paused.
 *
 * Files: this one holds URLs, peers, requests, the kick, the pool and
 * sending; om_upstream_conn.c connections and reading responses;
 * om_upstream_internal.h what they share.
 */
#include "om_upstream.h"

#include <arpa/inet.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_url.h"
#include "om_http1.h"
#include "om_http_chars.h"
#include "om_upstream_internal.h"

/* pchar = unreserved / pct-encoded / sub-delims / ":" / "@" (RFC 3986
 * 3.3), plus "/" (and "?" in a query, 3.4). Returns the bytes taken at
 * s[i] (1, or 3 for a %-escape), 0 when the byte is not allowed. */
static size_t uri_char(const char *s, size_t n, size_t i, int query) {
  unsigned c = (unsigned char)s[i];
  if (c == '%')
    return i + 2 < n && om__http_hex_val((unsigned char)s[i + 1]) >= 0 &&
                   om__http_hex_val((unsigned char)s[i + 2]) >= 0
               ? 3
               : 0;
  if (om__http_is_unreserved(c) || om__http_is_subdelim(c) || c == ':' ||
      c == '@' || c == '/')
    return 1;
  return query && c == '?' ? 1 : 0;
}

static size_t hdr_len(const char *s, size_t n) {
  return n != 0 || s == NULL ? n : strlen(s);
}

/*
 * The hop-by-hop fields of RFC 9110 7.6.1 (Connection, Proxy-Connection,
 * Keep-Alive, TE, Transfer-Encoding, Upgrade) and Trailer, which only
 * describes our own chunked framing; plus the framing and Host fields the
 * client treats specially.
 */
int om__up_field_kind(const char *n, size_t len) {
  switch (len) {
  case 2:
    return om__http_ci_eq(n, len, "te") ? F_HOP : F_OTHER;
  case 4:
    return om__http_ci_eq(n, len, "host") ? F_HOST : F_OTHER;
  case 7:
    return om__http_ci_eq(n, len, "trailer") ||
                   om__http_ci_eq(n, len, "upgrade")
               ? F_HOP
               : F_OTHER;
  case 10:
    if (om__http_ci_eq(n, len, "connection"))
      return F_CONNECTION;
    return om__http_ci_eq(n, len, "keep-alive") ? F_HOP : F_OTHER;
  case 14:
    return om__http_ci_eq(n, len, "content-length") ? F_CONTENT_LENGTH
                                                    : F_OTHER;
  case 16:
    return om__http_ci_eq(n, len, "proxy-connection") ? F_HOP : F_OTHER;
  case 17:
    return om__http_ci_eq(n, len, "transfer-encoding") ? F_TE : F_OTHER;
  default:
    return F_OTHER;
  }
}

/*
 * Walk the elements of a Connection value (#token, RFC 9110 7.6.1 and
 * 5.6.1: empty elements allowed). fn(arg, token, len) returns nonzero to
 * stop; walk returns that, or -1 if an element is not a token.
 */
int om__up_conn_walk(const char *v, size_t n,
                     int (*fn)(void *arg, const char *t, size_t len),
                     void *arg) {
  size_t i = 0;
  while (i <= n) {
    size_t s, e;
    while (i < n && om__http_is_ows((unsigned char)v[i]))
      i++;
    s = i;
    while (i < n && om__http_is_tchar((unsigned char)v[i]))
      i++;
    e = i;
    while (i < n && om__http_is_ows((unsigned char)v[i]))
      i++;
    if (i < n && v[i] != ',')
      return -1;
    if (e > s) {
      int rc = fn(arg, v + s, e - s);
      if (rc != 0)
        return rc;
    }
    i++;
  }
  return 0;
}

int om__up_conn_opt(void *arg, const char *t, size_t len) {
  conn_opts_t *o = arg;
  if (om__http_ci_eq(t, len, "close"))
    o->close = 1;
  else if (!om__http_ci_eq(t, len, "keep-alive"))
    o->others = 1;
  return 0;
}

typedef struct {
  const char *name;
  size_t len;
} tok_t;

static int tok_match(void *arg, const char *t, size_t len) {
  const tok_t *k = arg;
  size_t i;
  if (len != k->len)
    return 0;
  for (i = 0; i < len; i++) {
    unsigned x = (unsigned char)t[i], y = (unsigned char)k->name[i];
    if (x >= 'A' && x <= 'Z')
      x |= 0x20;
    if (y >= 'A' && y <= 'Z')
      y |= 0x20;
    if (x != y)
      return 0;
  }
  return 1;
}

/* Is the field name listed in a Connection field of h? */
int om__up_named_in_connection(const om_http_header_t *h, size_t n,
                               const char *name, size_t len) {
  tok_t k = {name, len};
  size_t i;
  for (i = 0; i < n; i++) {
    size_t nl = hdr_len(h[i].name, h[i].name_len);
    if (om__up_field_kind(h[i].name, nl) == F_CONNECTION &&
        om__up_conn_walk(h[i].value, hdr_len(h[i].value, h[i].value_len),
                         tok_match, &k) == 1)
      return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* failure classes */

static const char *const fail_names[] = {
    "ok",
#define OM__UPSTREAM_FAIL_NAME(name, reason, err) reason,
    OM_UPSTREAM_FAIL_MAP(OM__UPSTREAM_FAIL_NAME)
#undef OM__UPSTREAM_FAIL_NAME
};

static const int fail_errs[] = {0,
#define OM__UPSTREAM_FAIL_ERR(name, reason, err) err,
                                OM_UPSTREAM_FAIL_MAP(OM__UPSTREAM_FAIL_ERR)
#undef OM__UPSTREAM_FAIL_ERR
};

const char *om_upstream_fail_name(om_upstream_fail_t fail) {
  if ((int)fail < 0 || fail >= OM_UPSTREAM_FAIL__COUNT)
    return "unknown";
  return fail_names[fail];
}

/* ------------------------------------------------------------------ */
/* URLs and targets */

int om_upstream_parse_url(const char *url, om_upstream_url_t *out,
                          const char **why) {
  om_url_t u;
  int rc;
  if (url == NULL || out == NULL)
    return OM_EINVAL;
  memset(out, 0, sizeof *out);
  rc = om_url_parse(url, &u, why);
  if (rc != 0)
    return rc;
  memcpy(out->host, u.host, sizeof out->host);
  out->tls = u.tls;
  out->port = u.port;
  out->path_prefix = u.path;
  out->path_prefix_len = u.path_len;
  return 0;
}

int om_upstream_target_init(om_upstream_target_t *t, const char *host,
                            int port) {
  if (t == NULL || host == NULL || port < 1 || port > 65535)
    return OM_EINVAL;
  memset(t, 0, sizeof *t);
  if (inet_pton(AF_INET, host, &t->addr.in4.sin_addr) == 1) {
    t->addr.in4.sin_family = AF_INET;
    t->addr.in4.sin_port = htons((uint16_t)port);
    if (port == 80)
      snprintf(t->authority, sizeof t->authority, "%s", host);
    else
      snprintf(t->authority, sizeof t->authority, "%s:%d", host, port);
    return 0;
  }
  if (strchr(host, '%') == NULL &&
      inet_pton(AF_INET6, host, &t->addr.in6.sin6_addr) == 1) {
    t->addr.in6.sin6_family = AF_INET6;
    t->addr.in6.sin6_port = htons((uint16_t)port);
    if (port == 80)
      snprintf(t->authority, sizeof t->authority, "[%s]", host);
    else
      snprintf(t->authority, sizeof t->authority, "[%s]:%d", host, port);
    return 0;
  }
  return OM_EINVAL;
}

int om_upstream_target_from_url(om_upstream_target_t *t, const char *url,
                                const char **why) {
  om_url_t u;
  int rc, dflt;
  if (t == NULL || url == NULL)
    return OM_EINVAL;
  rc = om_url_parse(url, &u, why);
  if (rc != 0)
    return rc;
  dflt = u.port == (u.tls ? 443 : 80);
  if (u.host_kind == OM_URL_HOST_NAME) {
    memset(t, 0, sizeof *t);
    t->addr.sa.sa_family = AF_UNSPEC;
  } else if (om_upstream_target_init(t, u.host, u.port) != 0) {
    if (why != NULL) /* not reached: om_url_parse checked the literal */
      *why = "has an invalid IP literal";
    return OM_EPARSE;
  }
  if (u.host_kind == OM_URL_HOST_IPV6)
    snprintf(t->authority, sizeof t->authority, dflt ? "[%s]" : "[%s]:%d",
             u.host, u.port);
  else
    snprintf(t->authority, sizeof t->authority, dflt ? "%s" : "%s:%d", u.host,
             u.port);
  t->tls = u.tls;
  if (u.tls)
    memcpy(t->host, u.host, sizeof t->host);
  return u.host_kind == OM_URL_HOST_NAME ? OM_ENOTFOUND : 0;
}

/* ------------------------------------------------------------------ */
/* peers */

/* FNV-1a of a host name, never 0 (0 marks a plain peer). */
static uint32_t name_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  return h | 1;
}

/* The key of t; ctx and sn (the name to prove, "" for the host) matter
 * only for a tls target. */
static void key_of(const om_upstream_target_t *t, const om_tls_ctx_t *ctx,
                   const char *sn, int http2, pkey_t *k) {
  memset(k, 0, sizeof *k);
  k->http2 = http2 ? 1 : 0;
  if (t->tls) {
    k->tls_ctx = ctx;
    k->name_hash = name_hash(t->host) ^ (name_hash(sn) << 7);
    if (k->name_hash == 0)
      k->name_hash = 1;
  }
  k->family = t->addr.sa.sa_family;
  if (k->family == AF_INET) {
    k->port = t->addr.in4.sin_port;
    memcpy(k->addr, &t->addr.in4.sin_addr, 4);
  } else {
    k->port = t->addr.in6.sin6_port;
    memcpy(k->addr, &t->addr.in6.sin6_addr, 16);
  }
}

static uint64_t key_hash(const pkey_t *k) {
  uint64_t a, b, h;
  memcpy(&a, k->addr, 8);
  memcpy(&b, k->addr + 8, 8);
  h = a ^ (b * 0x9e3779b97f4a7c15ull) ^
      ((uint64_t)k->port << 16 | k->family) * 0xbf58476d1ce4e5b9ull;
  h ^= ((uint64_t)k->name_hash << 32) ^ (uint64_t)(uintptr_t)k->tls_ctx ^
       k->http2;
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 29);
}

static peer_t *peer_find(const om_upstream_pool_t *p, const pkey_t *k,
                         uint64_t h, const om_upstream_target_t *t,
                         const char *sn) {
  peer_t *e;
  for (e = p->buckets[h & (p->nbuckets - 1)]; e != NULL; e = e->hnext)
    if (e->hash == h && memcmp(&e->key, k, sizeof *k) == 0 &&
        (k->name_hash == 0 || (strcmp(e->target.host, t->host) == 0 &&
                               strcmp(e->server_name, sn) == 0)))
      return e;
  return NULL;
}

static void peer_free(peer_t *e) {
  om_tls_ctx_unref(e->tls_ctx);
  free(e);
}

static void peer_unlink(om_upstream_pool_t *p, peer_t *e) {
  peer_t **pp = &p->buckets[e->hash & (p->nbuckets - 1)];
  while (*pp != e)
    pp = &(*pp)->hnext;
  *pp = e->hnext;
  p->npeers--;
}

/* Forget one peer with nothing pointing at it, to stay within max_peers. */
static void peer_evict_one(om_upstream_pool_t *p) {
  size_t i;
  for (i = 0; i < p->nbuckets; i++) {
    peer_t *e;
    for (e = p->buckets[i]; e != NULL; e = e->hnext)
      if (e->refs == 0) {
        peer_unlink(p, e);
        peer_free(e);
        return;
      }
  }
}

/* Double the table when it is dense; on allocation failure the chains just
 * get longer. */
static void peer_grow(om_upstream_pool_t *p) {
  size_t n = p->nbuckets * 2, i;
  peer_t **nb;
  if (p->npeers < p->nbuckets)
    return;
  nb = calloc(n, sizeof *nb);
  if (nb == NULL)
    return;
  for (i = 0; i < p->nbuckets; i++) {
    peer_t *e = p->buckets[i], *next;
    for (; e != NULL; e = next) {
      next = e->hnext;
      e->hnext = nb[e->hash & (n - 1)];
      nb[e->hash & (n - 1)] = e;
    }
  }
  free(p->buckets);
  p->buckets = nb;
  p->nbuckets = n;
}

static peer_t *peer_get(om_upstream_pool_t *p, const om_upstream_target_t *t,
                        om_tls_ctx_t *ctx, const char *sn, int http2) {
  pkey_t k;
  uint64_t h;
  peer_t *e;
  key_of(t, ctx, sn, http2, &k);
  h = key_hash(&k);
  e = peer_find(p, &k, h, t, sn);
  if (e != NULL)
    return e;
  e = calloc(1, sizeof *e);
  if (e == NULL)
    return NULL;
  om_list_init(&e->idle);
  om_list_init(&e->h2);
  if (p->npeers >= p->o.max_peers)
    peer_evict_one(p);
  e->key = k;
  e->hash = h;
  e->target = *t;
  if (t->tls) {
    e->tls_ctx = om_tls_ctx_ref(ctx);
    memcpy(e->server_name, sn, strlen(sn) + 1);
  }
  peer_grow(p);
  e->hnext = p->buckets[h & (p->nbuckets - 1)];
  p->buckets[h & (p->nbuckets - 1)] = e;
  p->npeers++;
  return e;
}

/* ------------------------------------------------------------------ */
/* pending work (the kick) */

static void pend_unlink(req_t *r) {
  om_list_remove(&r->plink);
  r->pend = PEND_NONE;
}

static void on_kick(uv_idle_t *h);

void om__up_pend_push(req_t *r, int kind) {
  om_upstream_pool_t *p = r->pool;
  if (r->pend != PEND_NONE)
    pend_unlink(r);
  r->pend = kind;
  om_list_push_back(&p->pend, &r->plink);
  if (!p->kick_on) {
    uv_idle_start(&p->kick, on_kick);
    p->kick_on = 1;
  }
}

/* ------------------------------------------------------------------ */
/* requests */

void om__up_req_recycle(req_t *r) {
  om_upstream_pool_t *p = r->pool;
  if (r->pend != PEND_NONE)
    pend_unlink(r);
  om__up_body_free(r);
  r->state = R_FREE;
  if (p->closing || p->nfree >= FREE_REQS_MAX) {
    free(r->head);
    om__up_h2_req_free(r);
    free(r);
    return;
  }
  if (r->head_cap > REQ_HEAD_KEEP) {
    free(r->head);
    r->head = NULL;
    r->head_cap = 0;
  }
  r->next = p->free_reqs;
  p->free_reqs = r;
  p->nfree++;
}

static void req_call_done(req_t *r) {
  r->state = R_DONE;
  r->in_cb = 1;
  r->cb.on_done(r->ud, &r->res);
  r->in_cb = 0;
  om__up_req_recycle(r);
}

void om__up_peer_unref(peer_t *e) {
  e->refs--;
}

/*
 * End r (already detached from any connection) with fail. on_done runs
 * now, from a loop callback, or from the kick when an om_upstream_* call
 * is on the stack.
 */
void om__up_req_end(req_t *r, om_upstream_fail_t fail, int err,
                    const char *detail) {
  om_upstream_pool_t *p = r->pool;
  r->res.fail = fail;
  r->res.err = fail == OM_UPSTREAM_OK ? 0 : err != 0 ? err : fail_errs[fail];
  r->res.reason = fail_names[fail];
  r->res.detail = detail != NULL ? detail : "";
  if (r->peer != NULL) {
    if (fail != OM_UPSTREAM_OK && fail != OM_UPSTREAM_FAIL_ABORTED &&
        fail != OM_UPSTREAM_FAIL_CLOSED && fail != OM_UPSTREAM_FAIL_INTERNAL &&
        fail != OM_UPSTREAM_FAIL_LOCAL) {
      r->peer->st.failures++;
      p->st.failures++;
    }
    om__up_peer_unref(r->peer);
    r->peer = NULL;
  }
  if (p->api > 0 || r->in_cb)
    om__up_pend_push(r, PEND_DONE);
  else
    req_call_done(r);
}

/* Take r off its connection (which the caller then pools or closes). */
void om__up_detach(conn_t *c) {
  req_t *r = c->req;
  if (r == NULL)
    return;
  c->req = NULL;
  r->conn = NULL;
  c->peer->st.active--;
  c->pool->st.active--;
}

/* ------------------------------------------------------------------ */
/* the kick: deferred completions and resumed deliveries */

static void on_kick(uv_idle_t *h) {
  om_upstream_pool_t *p = h->data;
  om_list_t *it;
  while ((it = om_list_first(&p->pend)) != NULL) {
    req_t *r = OM_LIST_ENTRY(it, req_t, plink);
    int kind = r->pend;
    pend_unlink(r);
    if (kind == PEND_DONE) {
      req_call_done(r);
    } else if (r->http2) {
      om__up_h2_process(r);
    } else if (r->conn != NULL && !r->paused) {
      conn_t *c = r->conn;
      if (c->phase != PH_CONNECTING)
        om__up_conn_process(c);
    }
  }
  uv_idle_stop(&p->kick);
  p->kick_on = 0;
  om__up_pool_maybe_finish(p);
}

/* ------------------------------------------------------------------ */
/* the pool */

static void on_kick_closed(uv_handle_t *h) {
  om_upstream_pool_t *p = h->data;
  size_t i;
  req_t *r;
  if (p->on_closed != NULL)
    p->on_closed(p->closed_ud);
  for (i = 0; i < p->nbuckets; i++) {
    peer_t *e = p->buckets[i], *next;
    for (; e != NULL; e = next) {
      next = e->hnext;
      peer_free(e);
    }
  }
  om_tls_ctx_unref(p->tls_ctx);
  om_tls_ctx_unref(p->tls_default);
  while ((r = p->free_reqs) != NULL) {
    p->free_reqs = r->next;
    free(r->head);
    om__up_h2_req_free(r);
    free(r);
  }
  free(p->buckets);
  free(p);
}

void om__up_pool_maybe_finish(om_upstream_pool_t *p) {
  if (!p->closing || p->finishing || p->nconns > 0 ||
      !om_list_empty(&p->pend) || p->api > 0)
    return;
  p->finishing = 1;
  uv_close((uv_handle_t *)&p->kick, on_kick_closed);
}

int om_upstream_pool_new(uv_loop_t *loop, const om_upstream_pool_opts_t *opts,
                         om_upstream_pool_t **out) {
  om_upstream_pool_opts_t o = {0};
  om_upstream_pool_t *p;
  if (loop == NULL || out == NULL)
    return OM_EINVAL;
  if (opts != NULL)
    o = *opts;
  if (o.max_idle_per_peer == 0)
    o.max_idle_per_peer = DEF_MAX_IDLE;
  if (o.idle_timeout_ms == 0)
    o.idle_timeout_ms = DEF_IDLE_TIMEOUT_MS;
  if (o.max_header_bytes == 0)
    o.max_header_bytes = DEF_MAX_HEADER_BYTES;
  if (o.max_headers == 0)
    o.max_headers = DEF_MAX_HEADERS;
  if (o.read_buffer_bytes == 0)
    o.read_buffer_bytes = DEF_READ_BUFFER;
  if (o.max_peers == 0)
    o.max_peers = DEF_MAX_PEERS;
  if (o.max_idle_per_peer > MAX_IDLE_PER_PEER)
    return OM_EINVAL;
  if (o.max_header_bytes < MIN_HEADER_BYTES ||
      o.max_header_bytes > MAX_HEADER_BYTES ||
      o.max_headers > MAX_MAX_HEADERS ||
      o.read_buffer_bytes < MIN_READ_BUFFER ||
      o.read_buffer_bytes > (size_t)UINT32_MAX ||
      o.idle_timeout_ms > UINT64_MAX / 4)
    return OM_EINVAL;
  p = calloc(1, sizeof *p);
  if (p == NULL)
    return OM_ENOMEM;
  om_list_init(&p->conns);
  om_list_init(&p->pend);
  om_list_init(&p->h2conns);
  p->nbuckets = 16;
  p->buckets = calloc(p->nbuckets, sizeof *p->buckets);
  if (p->buckets == NULL) {
    free(p);
    return OM_ENOMEM;
  }
  p->loop = loop;
  p->o = o;
  if (o.tls_ctx != NULL) {
    if (om_tls_ctx_role(o.tls_ctx) != OM_TLS_CLIENT) {
      free(p->buckets);
      free(p);
      return OM_EINVAL;
    }
    p->tls_ctx = om_tls_ctx_ref(o.tls_ctx);
  }
  uv_idle_init(loop, &p->kick);
  p->kick.data = p;
  *out = p;
  return 0;
}

int om_upstream_pool_close(om_upstream_pool_t *p,
                           om_upstream_closed_fn on_closed, void *ud) {
  conn_t *c;
  if (p == NULL)
    return OM_EINVAL;
  if (p->closing)
    return OM_ESTATE;
  p->closing = 1;
  p->on_closed = on_closed;
  p->closed_ud = ud;
  p->api++;
  while (!om_list_empty(&p->conns)) {
    req_t *r;
    c = OM_LIST_ENTRY(om_list_first(&p->conns), conn_t, link);
    r = c->req;
    om__up_detach(c);
    om__up_conn_close(c);
    if (r != NULL)
      om__up_req_end(r, OM_UPSTREAM_FAIL_CLOSED, 0, "the pool was closed");
  }
  om__up_h2_close_all(p);
  p->api--;
  /* finish from the loop, never from here */
  if (!p->kick_on) {
    uv_idle_start(&p->kick, on_kick);
    p->kick_on = 1;
  }
  return 0;
}

int om_upstream_pool_stats(const om_upstream_pool_t *p,
                           om_upstream_stats_t *out) {
  if (p == NULL || out == NULL)
    return OM_EINVAL;
  *out = p->st;
  return 0;
}

int om_upstream_peer_stats(const om_upstream_pool_t *p,
                           const om_upstream_target_t *t,
                           om_upstream_stats_t *out) {
  pkey_t k;
  peer_t *e;
  if (p == NULL || t == NULL || out == NULL)
    return OM_EINVAL;
  key_of(t, p->tls_ctx != NULL ? p->tls_ctx : p->tls_default, "", 0, &k);
  e = peer_find(p, &k, key_hash(&k), t, "");
  if (e == NULL)
    return OM_ENOTFOUND;
  *out = e->st;
  return 0;
}

int om_upstream_peer_stats_for(const om_upstream_pool_t *p,
                               const om_upstream_target_t *t,
                               const om_upstream_request_t *q,
                               om_upstream_stats_t *out) {
  const om_tls_ctx_t *ctx;
  const char *sn = "";
  pkey_t k;
  peer_t *e;
  if (p == NULL || t == NULL || out == NULL)
    return OM_EINVAL;
  /* the context om__up_tls_ctx_for would pick, without making one */
  ctx = q != NULL && q->tls_ctx != NULL ? q->tls_ctx
        : p->tls_ctx != NULL            ? p->tls_ctx
                                        : p->tls_default;
  if (t->tls && q != NULL && q->tls_server_name != NULL)
    sn = q->tls_server_name;
  key_of(t, ctx, sn, q != NULL && q->http2, &k);
  e = peer_find(p, &k, key_hash(&k), t, sn);
  if (e == NULL)
    return OM_ENOTFOUND;
  *out = e->st;
  return 0;
}

/* ------------------------------------------------------------------ */
/* sending */

static int method_is(const char *m, size_t n, const char *lit) {
  return strlen(lit) == n && memcmp(m, lit, n) == 0;
}

static int valid_target(const char *t, size_t n, const char *m, size_t ml) {
  size_t i = 0;
  int query = 0;
  if (n == 1 && t[0] == '*')
    return method_is(m, ml, "OPTIONS");
  if (n == 0 || t[0] != '/')
    return 0;
  while (i < n) {
    size_t k;
    if (t[i] == '?' && !query) {
      query = 1;
      i++;
      continue;
    }
    k = uri_char(t, n, i, query);
    if (k == 0)
      return 0;
    i += k;
  }
  return 1;
}

int om__up_valid_value(const char *v, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    unsigned ch = (unsigned char)v[i];
    if (!om__http_is_fvchar(ch) && !om__http_is_ows(ch))
      return 0;
  }
  return 1;
}

static void put(char **w, const char *s, size_t n) {
  memcpy(*w, s, n);
  *w += n;
}

/*
 * Build the request head into r->head once (a retry re-sends it).
 * Returns 0, OM_EINVAL (nothing sendable), OM_ENOMEM.
 */
static int build_head(req_t *r, const om_upstream_target_t *t,
                      const om_upstream_request_t *q, const char *m, size_t ml,
                      const char *tg, size_t tl) {
  const om_http_header_t *h = q->headers;
  size_t n = q->n_headers, i, need, al = strlen(t->authority);
  int has_host = 0, named = 0, want_cl, chunked = 0;
  uint64_t clv = q->body_len;
  char clbuf[24], *w;
  int cll;
  if (n > 0 && h == NULL)
    return OM_EINVAL;
  need = ml + 1 + tl + 11 + 2;
  for (i = 0; i < n; i++) {
    size_t nl = hdr_len(h[i].name, h[i].name_len);
    size_t vl = hdr_len(h[i].value, h[i].value_len);
    size_t j;
    if (h[i].name == NULL || h[i].value == NULL || nl == 0)
      return OM_EINVAL;
    if (!q->headers_valid) {
      for (j = 0; j < nl; j++)
        if (!om__http_is_tchar((unsigned char)h[i].name[j]))
          return OM_EINVAL;
      if (!om__up_valid_value(h[i].value, vl))
        return OM_EINVAL;
    }
    if (om__up_field_kind(h[i].name, nl) == F_CONNECTION) {
      conn_opts_t co = {0, 0};
      if (om__up_conn_walk(h[i].value, vl, om__up_conn_opt, &co) != 0)
        return OM_EINVAL;
      named |= co.others;
    }
    need += nl + vl + 4;
  }
  if (q->upgrade != NULL && hdr_len(q->upgrade, q->upgrade_len) > 0) {
    size_t ul = hdr_len(q->upgrade, q->upgrade_len);
    if (!om__up_valid_value(q->upgrade, ul))
      return OM_EINVAL;
    need += 9 + ul + 2 + 21;
  }
  want_cl = q->body_len > 0 || method_is(m, ml, "POST") ||
            method_is(m, ml, "PUT") || method_is(m, ml, "PATCH");
  if (q->body_stream) { /* RFC 9112 6.1: chunked when the length is not
                           known up front */
    chunked = q->body_stream_length < 0;
    want_cl = !chunked;
    clv = chunked ? 0 : (uint64_t)q->body_stream_length;
  }
  cll = want_cl ? (int)om__http_u64_dec(clbuf, clv) : 0;
  need += 6 + al + 2 + 16 + (size_t)cll + 2 + 28;
  if (need > r->head_cap) {
    char *nh = realloc(r->head, need);
    if (nh == NULL)
      return OM_ENOMEM;
    r->head = nh;
    r->head_cap = need;
  }
  w = r->head;
  put(&w, m, ml);
  put(&w, " ", 1);
  put(&w, tg, tl);
  put(&w, " HTTP/1.1\r\n", 11);
  for (i = 0; i < n; i++) {
    size_t nl = hdr_len(h[i].name, h[i].name_len);
    size_t vl = hdr_len(h[i].value, h[i].value_len);
    int kind = om__up_field_kind(h[i].name, nl);
    if (kind == F_HOP || kind == F_CONNECTION || kind == F_TE ||
        kind == F_CONTENT_LENGTH ||
        (named && om__up_named_in_connection(h, n, h[i].name, nl)))
      continue;
    if (kind == F_HOST)
      has_host = 1;
    put(&w, h[i].name, nl);
    put(&w, ": ", 2);
    put(&w, h[i].value, vl);
    put(&w, "\r\n", 2);
  }
  if (!has_host) {
    put(&w, "Host: ", 6);
    put(&w, t->authority, al);
    put(&w, "\r\n", 2);
  }
  if (want_cl) {
    put(&w, "Content-Length: ", 16);
    put(&w, clbuf, (size_t)cll);
    put(&w, "\r\n", 2);
  }
  if (chunked)
    put(&w, "Transfer-Encoding: chunked\r\n", 28);
  if (q->upgrade != NULL && hdr_len(q->upgrade, q->upgrade_len) > 0) {
    put(&w, "Upgrade: ", 9);
    put(&w, q->upgrade, hdr_len(q->upgrade, q->upgrade_len));
    put(&w, "\r\nConnection: upgrade\r\n", 23);
  }
  put(&w, "\r\n", 2);
  r->head_len = (size_t)(w - r->head);
  return 0;
}

static req_t *req_get(om_upstream_pool_t *p) {
  req_t *r = p->free_reqs;
  if (r != NULL) {
    p->free_reqs = r->next;
    p->nfree--;
  } else {
    r = calloc(1, sizeof *r);
    if (r == NULL)
      return NULL;
    om_list_init(&r->plink);
  }
  {
    /* buffers are kept across uses: the head, and HTTP/2's */
    char *head = r->head, *harena = r->harena, *held = r->held;
    struct om__up_h2f_s *hf = r->hf;
    size_t cap = r->head_cap, acap = r->harena_cap, fcap = r->cap_hf,
           hcap = r->held_cap;
    memset(r, 0, sizeof *r);
    r->head = head;
    r->head_cap = cap;
    r->harena = harena;
    r->harena_cap = acap;
    r->hf = hf;
    r->cap_hf = fcap;
    r->held = held;
    r->held_cap = hcap;
    om_list_init(&r->h2link);
  }
  r->pool = p;
  return r;
}

int om_upstream_send(om_upstream_pool_t *p, const om_upstream_target_t *t,
                     const om_upstream_request_t *q,
                     const om_upstream_callbacks_t *cb, void *ud,
                     om_upstream_req_t **out) {
  const char *m, *tg;
  size_t ml, tl, i;
  req_t *r;
  peer_t *e;
  conn_t *c;
  om_tls_ctx_t *tls = NULL;
  const char *sn = "";
  int rc;
  uint64_t now;
  if (p == NULL || t == NULL || q == NULL || cb == NULL || out == NULL ||
      cb->on_done == NULL || q->method == NULL || q->target == NULL ||
      (q->body == NULL && q->body_len > 0))
    return OM_EINVAL;
  if (q->body_stream &&
      (q->body != NULL || q->body_len > 0 || q->body_stream_length < -1))
    return OM_EINVAL;
  if (t->addr.sa.sa_family != AF_INET && t->addr.sa.sa_family != AF_INET6)
    return OM_EINVAL;
  if (p->closing)
    return OM_ESTATE;
  m = q->method;
  ml = hdr_len(m, q->method_len);
  tg = q->target;
  tl = hdr_len(tg, q->target_len);
  if (ml == 0 || method_is(m, ml, "CONNECT") || tl > UINT32_MAX ||
      q->body_len > UINT32_MAX)
    return OM_EINVAL;
  for (i = 0; i < ml; i++)
    if (!om__http_is_tchar((unsigned char)m[i]))
      return OM_EINVAL;
  if (!valid_target(tg, tl, m, ml))
    return OM_EINVAL;
  if (q->max_idle_per_peer > MAX_IDLE_PER_PEER ||
      q->idle_timeout_ms > UINT64_MAX / 4)
    return OM_EINVAL;
  r = req_get(p);
  if (r == NULL)
    return OM_ENOMEM;
  r->http2 = q->http2 != 0;
  rc = r->http2 ? 0 : build_head(r, t, q, m, ml, tg, tl);
  if (rc != 0) {
    om__up_req_recycle(r);
    return rc;
  }
  if (t->tls) {
    tls = om__up_tls_ctx_for(p, q);
    if (q->tls_server_name != NULL)
      sn = q->tls_server_name;
    if (tls == NULL || strlen(sn) > 253) {
      om__up_req_recycle(r);
      return OM_EINVAL;
    }
  }
  e = peer_get(p, t, tls, sn, q->http2);
  if (e == NULL) {
    om__up_req_recycle(r);
    return OM_ENOMEM;
  }
  /* timeouts count from now, not from the start of this loop turn */
  uv_update_time(p->loop);
  now = now_ms(p);
  r->state = R_ACTIVE;
  r->cb = *cb;
  r->ud = ud;
  r->body = q->body;
  r->body_len = q->body_len;
  if (q->body_stream) {
    r->streamed = 1;
    r->body_left = q->body_stream_length;
  }
  r->connect_ms = q->connect_timeout_ms;
  r->first_byte_ms = q->first_byte_timeout_ms;
  r->total_due = q->timeout_ms != 0 ? now + q->timeout_ms : 0;
  r->upgrade =
      q->upgrade != NULL && hdr_len(q->upgrade, q->upgrade_len) > 0 ? 1 : 0;
  /* an upgrade is never replayed once it may have been sent */
  r->retry_stale = q->retry_stale != 0 && !r->upgrade;
  r->head_due = q->head_timeout_ms != 0 ? now + q->head_timeout_ms : 0;
  r->is_head = method_is(m, ml, "HEAD");
  r->max_idle =
      q->max_idle_per_peer != 0 ? q->max_idle_per_peer : p->o.max_idle_per_peer;
  r->idle_ms =
      q->idle_timeout_ms != 0 ? q->idle_timeout_ms : p->o.idle_timeout_ms;
  r->max_reqs = q->max_requests_per_connection != 0
                    ? q->max_requests_per_connection
                    : p->o.max_requests_per_connection;
  r->res.attempts = 1;
  r->peer = e;
  e->refs++;
  p->api++;
  if (r->http2) {
    rc = om__up_h2_send(r, t, q);
    if (rc != 0) {
      p->api--;
      e->refs--;
      om__up_req_recycle(r);
      return rc;
    }
    e->st.requests++;
    p->st.requests++;
    p->api--;
    *out = r;
    return 0;
  }
  c = om_list_empty(&e->idle)
          ? NULL
          : OM_LIST_ENTRY(om_list_first(&e->idle), conn_t, ilink);
  if (c != NULL) {
    om__up_idle_unlink(c);
    c->req = r;
    r->conn = c;
    r->res.reused = 1;
    r->res.reuses++;
    e->st.active++;
    p->st.active++;
    e->st.reuses++;
    p->st.reuses++;
    e->st.requests++;
    p->st.requests++;
    om__up_conn_start(c);
  } else {
    rc = om__up_conn_connect(r);
    if (rc != 0) {
      p->api--;
      e->refs--;
      om__up_req_recycle(r);
      return rc;
    }
    e->st.requests++;
    p->st.requests++;
  }
  p->api--;
  *out = r;
  return 0;
}

int om_upstream_req_reused(const om_upstream_req_t *r) {
  if (r == NULL)
    return -1;
  return r->res.reuses > 0 ? 1 : 0;
}

int om_upstream_cancel(om_upstream_req_t *r) {
  om_upstream_pool_t *p;
  conn_t *c;
  if (r == NULL)
    return OM_EINVAL;
  if (r->state != R_ACTIVE)
    return OM_ESTATE;
  p = r->pool;
  p->api++;
  if (r->pend != PEND_NONE)
    pend_unlink(r);
  c = r->conn;
  if (c != NULL) {
    om__up_detach(c);
    om__up_conn_close(c);
  }
  if (r->http2)
    om__up_h2_cancel(r);
  if (r->peer != NULL) {
    om__up_peer_unref(r->peer);
    r->peer = NULL;
  }
  r->cancelled = 1;
  r->state = R_DONE;
  if (!r->in_cb)
    om__up_req_recycle(r);
  p->api--;
  om__up_pool_maybe_finish(p);
  return 0;
}

int om_upstream_pause(om_upstream_req_t *r) {
  if (r == NULL)
    return OM_EINVAL;
  if (r->state != R_ACTIVE || r->pend == PEND_DONE)
    return OM_ESTATE;
  r->paused = 1;
  if (r->pend == PEND_PROCESS && !r->http2) /* HTTP/2: a drain may be due */
    pend_unlink(r);
  if (r->conn != NULL && r->conn->phase != PH_CONNECTING)
    om__up_read_off(r->conn);
  return 0;
}

int om_upstream_resume(om_upstream_req_t *r) {
  conn_t *c;
  if (r == NULL)
    return OM_EINVAL;
  if (r->state != R_ACTIVE || r->pend == PEND_DONE)
    return OM_ESTATE;
  if (r->conn != NULL && r->conn->lent)
    return OM_ESTATE;
  if (!r->paused)
    return 0;
  r->paused = 0;
  if (r->http2) {
    om__up_h2_resume(r);
    return 0;
  }
  c = r->conn;
  if (c != NULL && c->phase != PH_CONNECTING) {
    om__up_read_on(c);
    /* bytes to deliver, or a body whose last byte went out in the
     * on_body that paused: it ends from the kick */
    if (c->pos < c->len || (c->tls != NULL && om__up_tls_pending(c)) ||
        (c->phase == PH_BODY_CL && c->remaining == 0))
      om__up_pend_push(r, PEND_PROCESS);
  }
  return 0;
}

int om_upstream_response_lend(om_upstream_req_t *r, int *fd, uint64_t *left) {
  conn_t *c;
  uv_os_fd_t s;
  if (r == NULL || fd == NULL || left == NULL)
    return OM_EINVAL;
  c = r->conn;
  if (r->state != R_ACTIVE || r->pend == PEND_DONE || !r->paused || r->http2 ||
      c == NULL || c->closing || c->lent || c->tls != NULL ||
      c->phase != PH_BODY_CL || c->remaining == 0 || c->pos != c->len ||
      uv_fileno((const uv_handle_t *)&c->tcp, &s) != 0)
    return OM_ESTATE;
  om__up_read_off(c);
  c->lent = 1;
  *fd = s;
  *left = c->remaining;
  return 0;
}

int om_upstream_response_unlend(om_upstream_req_t *r, uint64_t moved,
                                int broken) {
  conn_t *c;
  if (r == NULL)
    return OM_EINVAL;
  c = r->conn;
  if (r->state != R_ACTIVE || c == NULL || !c->lent)
    return OM_ESTATE;
  if (moved > c->remaining)
    return OM_EINVAL;
  c->lent = 0;
  c->remaining -= moved;
  r->res.body_bytes += moved;
  if (broken) {
    om_upstream_pool_t *p = r->pool;
    p->api++; /* on_done from the loop, never from inside this call */
    om__up_attempt_fail(c, OM_UPSTREAM_FAIL_RESET_MID_BODY, 0,
                        "the body's socket failed while lent");
    p->api--;
  }
  return 0;
}
