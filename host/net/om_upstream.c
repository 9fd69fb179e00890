/*
 * om_upstream.c: the proxy's upstream HTTP/1.1 client (see om_upstream.h).
 *
 * Shape: a pool owns peers (a hash table keyed by socket address), each
 * peer an MRU list of idle connections; a connection carries at most one
 * request at a time (no pipelining: a reused connection must be provably
 * in sync). A request object lives from om_upstream_send to the end of
 * on_done and can move to a fresh connection once (stale keep-alive).
 * Request objects are recycled through a free list with their head
 * buffers, and connections keep their read buffers, so a warm pool
 * allocates nothing per request.
 *
 * Callbacks never run from inside an om_upstream_* call: anything that
 * ends a request while such a call is on the stack (pool->api > 0) is
 * queued and finished from an idle handle ("kick"), which also delivers
 * bytes buffered while a request was paused.
 */
#include "om_upstream.h"

#include <arpa/inet.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_http1.h"
#include "om_http_chars.h"

#define DEF_MAX_IDLE 32u
#define DEF_IDLE_TIMEOUT_MS 60000u
#define DEF_MAX_HEADER_BYTES (64u * 1024u)
#define MAX_HEADER_BYTES (64u * 1024u)
#define MIN_HEADER_BYTES 256u
#define DEF_MAX_HEADERS 100u
#define MAX_MAX_HEADERS 10000u
#define DEF_READ_BUFFER (16u * 1024u)
#define MIN_READ_BUFFER 1024u
#define DEF_MAX_PEERS 4096u

#define READ_MIN 1024u      /* compact or grow below this much room */
#define FREE_REQS_MAX 256u  /* request objects kept for reuse */
#define REQ_HEAD_KEEP 8192u /* a recycled request keeps this much head */
#define HDRS_INITIAL 16u

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

/* Field names the client handles itself, by kind. */
enum { F_OTHER, F_HOP, F_CONNECTION, F_CONTENT_LENGTH, F_TE, F_HOST };

/*
 * The hop-by-hop fields of RFC 9110 7.6.1 (Connection, Proxy-Connection,
 * Keep-Alive, TE, Transfer-Encoding, Upgrade) and Trailer, which only
 * describes our own chunked framing; plus the framing and Host fields the
 * client treats specially.
 */
static int field_kind(const char *n, size_t len) {
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
static int conn_walk(const char *v, size_t n,
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

typedef struct {
  int close;  /* "close" seen */
  int others; /* a name other than close / keep-alive seen */
} conn_opts_t;

static int conn_opt(void *arg, const char *t, size_t len) {
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
static int named_in_connection(const om_http_header_t *h, size_t n,
                               const char *name, size_t len) {
  tok_t k = {name, len};
  size_t i;
  for (i = 0; i < n; i++) {
    size_t nl = hdr_len(h[i].name, h[i].name_len);
    if (field_kind(h[i].name, nl) == F_CONNECTION &&
        conn_walk(h[i].value, hdr_len(h[i].value, h[i].value_len), tok_match,
                  &k) == 1)
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

static int fail_url(const char **why, const char *msg) {
  if (why != NULL)
    *why = msg;
  return OM_EPARSE;
}

int om_upstream_parse_url(const char *url, om_upstream_url_t *out,
                          const char **why) {
  const char *p, *h, *he;
  size_t n, i;
  unsigned char tmp[16];
  if (url == NULL || out == NULL)
    return OM_EINVAL;
  n = strlen(url);
  memset(out, 0, sizeof *out);
  if (n >= 8 && om__http_ci_eq(url, 8, "https://"))
    return fail_url(why, "https is not supported yet (TLS comes later)");
  if (n < 7 || !om__http_ci_eq(url, 7, "http://"))
    return fail_url(why, "the URL must start with http://");
  p = url + 7;
  if (*p == '[') {
    h = p + 1;
    he = strchr(h, ']');
    if (he == NULL)
      return fail_url(why, "an IPv6 literal must end with ']'");
    if ((size_t)(he - h) >= sizeof out->host)
      return fail_url(why, "the host must be a numeric IPv6 literal");
    memcpy(out->host, h, (size_t)(he - h));
    out->host[he - h] = 0;
    if (strchr(out->host, '%') != NULL)
      return fail_url(why, "IPv6 zone ids are not supported");
    if (inet_pton(AF_INET6, out->host, tmp) != 1)
      return fail_url(why, "the host must be a numeric IPv6 literal");
    p = he + 1;
  } else {
    h = p;
    while (*p != 0 && *p != ':' && *p != '/' && *p != '?' && *p != '#' &&
           *p != '@')
      p++;
    if (*p == '@')
      return fail_url(why, "userinfo is not allowed in a peer URL");
    if (p == h)
      return fail_url(why, "the URL has no host");
    if ((size_t)(p - h) >= sizeof out->host)
      return fail_url(why, "the host must be a numeric IPv4 literal "
                           "(names are not resolved)");
    memcpy(out->host, h, (size_t)(p - h));
    out->host[p - h] = 0;
    /* inet_pton takes exactly four dotted decimal parts, no leading
     * zeros in glibc's strict form */
    if (inet_pton(AF_INET, out->host, tmp) != 1)
      return fail_url(why, "the host must be a numeric IPv4 literal "
                           "(names are not resolved)");
  }
  out->port = 80;
  if (*p == ':') {
    long port = 0;
    const char *d = ++p;
    while (om__http_is_digit((unsigned char)*p) && p - d < 6)
      port = port * 10 + (*p++ - '0');
    if (p == d)
      return fail_url(why, "the port is empty");
    if (om__http_is_digit((unsigned char)*p) || port < 1 || port > 65535)
      return fail_url(why, "the port must be 1..65535");
    out->port = (int)port;
  }
  if (*p == '@')
    return fail_url(why, "userinfo is not allowed in a peer URL");
  if (*p != 0 && *p != '/') {
    if (*p == '?')
      return fail_url(why, "a peer URL takes no query");
    if (*p == '#')
      return fail_url(why, "a peer URL takes no fragment");
    return fail_url(why, "unexpected character after the host");
  }
  out->path_prefix = p;
  n = strlen(p);
  for (i = 0; i < n;) {
    size_t k;
    if (p[i] == '?')
      return fail_url(why, "a peer URL takes no query");
    if (p[i] == '#')
      return fail_url(why, "a peer URL takes no fragment");
    k = uri_char(p, n, i, 0);
    if (k == 0)
      return fail_url(why, "a character not allowed in a URL path");
    i += k;
  }
  out->path_prefix_len = n;
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
  om_upstream_url_t u;
  int rc;
  if (t == NULL || url == NULL)
    return OM_EINVAL;
  rc = om_upstream_parse_url(url, &u, why);
  if (rc != 0)
    return rc;
  rc = om_upstream_target_init(t, u.host, u.port);
  if (rc != 0)
    return fail_url(why, "the host must be a numeric IP literal");
  return 0;
}

/* ------------------------------------------------------------------ */
/* types */

typedef struct peer_s peer_t;
typedef struct conn_s conn_t;
typedef om_upstream_req_t req_t;

typedef struct {
  uint16_t family;
  uint16_t port; /* network order */
  uint8_t addr[16];
} pkey_t;

struct peer_s {
  peer_t *hnext;
  uint64_t hash;
  pkey_t key;
  om_upstream_target_t target;   /* the address to connect to */
  conn_t *idle_head, *idle_tail; /* most .. least recently used */
  size_t refs;                   /* connections and requests pointing here */
  om_upstream_stats_t st;
};

enum { PH_CONNECTING, PH_HEAD, PH_BODY_CL, PH_CHUNKED, PH_BODY_EOF, PH_IDLE };

struct conn_s {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_connect_t creq;
  uv_write_t wreq;
  om_upstream_pool_t *pool;
  peer_t *peer;
  conn_t *prev, *next;   /* the pool's open connections */
  conn_t *iprev, *inext; /* the peer's idle list */
  req_t *req;
  int phase;
  int handles; /* libuv handles not yet closed */
  unsigned closing : 1, reading : 1, writing : 1, broken : 1, keepalive : 1;
  uint64_t timer_due; /* loop ms the timer is armed for; 0: not armed */
  uint64_t idle_since;
  /* read buffer: unconsumed bytes are [pos, len) */
  char *buf;
  size_t cap, cap_max, len, pos;
  /* the head, relative to pos */
  om_http1_head_t head;
  om_http1_field_t *fields;
  size_t fields_cap;
  size_t interim_bytes; /* 1xx heads already skipped for this response */
  /* body */
  uint64_t remaining;
  om_http1_chunked_t ch; /* a chunked body being read */
  /* the head as handed to on_headers */
  om_http_header_t *hdrs;
  size_t hdrs_cap;
  om_upstream_response_t resp;
  /* the second opinion, for a head with Transfer-Encoding and its body */
};

enum { R_FREE, R_ACTIVE, R_DONE };
enum { PEND_NONE, PEND_DONE, PEND_PROCESS };

struct om_upstream_req_s {
  om_upstream_pool_t *pool;
  peer_t *peer; /* held (refs) until the request ends */
  conn_t *conn;
  req_t *next, *prev; /* free list or pending list */
  om_upstream_callbacks_t cb;
  void *ud;
  const char *body;
  size_t body_len;
  char *head;
  size_t head_len, head_cap;
  uint64_t connect_ms, first_byte_ms;
  uint64_t connect_due, first_byte_due, total_due; /* loop ms; 0 none */
  int state;
  int pend;
  unsigned idempotent : 1, is_head : 1, in_cb : 1, cancelled : 1, paused : 1,
      got_bytes : 1;
  om_upstream_result_t res;
};

struct om_upstream_pool_s {
  uv_loop_t *loop;
  uv_idle_t kick;
  om_upstream_pool_opts_t o;
  peer_t **buckets;
  size_t nbuckets, npeers;
  conn_t *conns; /* open (not closing) connections */
  size_t nconns; /* connections not yet freed */
  req_t *free_reqs;
  size_t nfree;
  req_t *pend_head, *pend_tail;
  int api; /* om_upstream_* calls on the stack */
  unsigned closing : 1, kick_on : 1, finishing : 1;
  om_upstream_closed_fn on_closed;
  void *closed_ud;
  om_upstream_stats_t st;
};

static void conn_close(conn_t *c);
static void conn_process(conn_t *c);
static void conn_arm(conn_t *c);
static int conn_connect(req_t *r);
static void pool_maybe_finish(om_upstream_pool_t *p);

static uint64_t now_ms(const om_upstream_pool_t *p) {
  return uv_now(p->loop);
}

/* ------------------------------------------------------------------ */
/* peers */

static void key_of(const om_upstream_target_t *t, pkey_t *k) {
  memset(k, 0, sizeof *k);
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
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 29);
}

static peer_t *peer_find(const om_upstream_pool_t *p, const pkey_t *k,
                         uint64_t h) {
  peer_t *e;
  for (e = p->buckets[h & (p->nbuckets - 1)]; e != NULL; e = e->hnext)
    if (e->hash == h && memcmp(&e->key, k, sizeof *k) == 0)
      return e;
  return NULL;
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
        free(e);
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

static peer_t *peer_get(om_upstream_pool_t *p, const om_upstream_target_t *t) {
  pkey_t k;
  uint64_t h;
  peer_t *e;
  key_of(t, &k);
  h = key_hash(&k);
  e = peer_find(p, &k, h);
  if (e != NULL)
    return e;
  e = calloc(1, sizeof *e);
  if (e == NULL)
    return NULL;
  if (p->npeers >= p->o.max_peers)
    peer_evict_one(p);
  e->key = k;
  e->hash = h;
  e->target = *t;
  peer_grow(p);
  e->hnext = p->buckets[h & (p->nbuckets - 1)];
  p->buckets[h & (p->nbuckets - 1)] = e;
  p->npeers++;
  return e;
}

/* ------------------------------------------------------------------ */
/* pending work (the kick) */

static void pend_unlink(req_t *r) {
  om_upstream_pool_t *p = r->pool;
  if (r->prev != NULL)
    r->prev->next = r->next;
  else
    p->pend_head = r->next;
  if (r->next != NULL)
    r->next->prev = r->prev;
  else
    p->pend_tail = r->prev;
  r->next = r->prev = NULL;
  r->pend = PEND_NONE;
}

static void on_kick(uv_idle_t *h);

static void pend_push(req_t *r, int kind) {
  om_upstream_pool_t *p = r->pool;
  if (r->pend != PEND_NONE)
    pend_unlink(r);
  r->pend = kind;
  r->next = NULL;
  r->prev = p->pend_tail;
  if (p->pend_tail != NULL)
    p->pend_tail->next = r;
  else
    p->pend_head = r;
  p->pend_tail = r;
  if (!p->kick_on) {
    uv_idle_start(&p->kick, on_kick);
    p->kick_on = 1;
  }
}

/* ------------------------------------------------------------------ */
/* requests */

static void req_recycle(req_t *r) {
  om_upstream_pool_t *p = r->pool;
  if (r->pend != PEND_NONE)
    pend_unlink(r);
  r->state = R_FREE;
  if (p->closing || p->nfree >= FREE_REQS_MAX) {
    free(r->head);
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
  req_recycle(r);
}

static void peer_unref(peer_t *e) {
  e->refs--;
}

/*
 * End r (already detached from any connection) with fail. on_done runs
 * now, from a loop callback, or from the kick when an om_upstream_* call
 * is on the stack.
 */
static void req_end(req_t *r, om_upstream_fail_t fail, int err,
                    const char *detail) {
  om_upstream_pool_t *p = r->pool;
  r->res.fail = fail;
  r->res.err = fail == OM_UPSTREAM_OK ? 0 : err != 0 ? err : fail_errs[fail];
  r->res.reason = fail_names[fail];
  r->res.detail = detail != NULL ? detail : "";
  if (r->peer != NULL) {
    if (fail != OM_UPSTREAM_OK && fail != OM_UPSTREAM_FAIL_ABORTED &&
        fail != OM_UPSTREAM_FAIL_CLOSED && fail != OM_UPSTREAM_FAIL_INTERNAL) {
      r->peer->st.failures++;
      p->st.failures++;
    }
    peer_unref(r->peer);
    r->peer = NULL;
  }
  if (p->api > 0 || r->in_cb)
    pend_push(r, PEND_DONE);
  else
    req_call_done(r);
}

/* Take r off its connection (which the caller then pools or closes). */
static void detach(conn_t *c) {
  req_t *r = c->req;
  if (r == NULL)
    return;
  c->req = NULL;
  r->conn = NULL;
  c->peer->st.active--;
  c->pool->st.active--;
}

/* ------------------------------------------------------------------ */
/* connections */

static void on_conn_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  om_upstream_pool_t *p = c->pool;
  if (--c->handles > 0)
    return;
  peer_unref(c->peer);
  free(c->buf);
  free(c->hdrs);
  free(c->fields);
  free(c);
  p->nconns--;
  pool_maybe_finish(p);
}

static void idle_unlink(conn_t *c) {
  peer_t *e = c->peer;
  if (c->iprev != NULL)
    c->iprev->inext = c->inext;
  else
    e->idle_head = c->inext;
  if (c->inext != NULL)
    c->inext->iprev = c->iprev;
  else
    e->idle_tail = c->iprev;
  c->iprev = c->inext = NULL;
  e->st.idle--;
  c->pool->st.idle--;
}

/* Close c (its request, if any, must be detached first). */
static void conn_close(conn_t *c) {
  om_upstream_pool_t *p = c->pool;
  if (c->closing)
    return;
  c->closing = 1;
  if (c->phase == PH_IDLE)
    idle_unlink(c);
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    p->conns = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  c->prev = c->next = NULL;
  uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
  uv_close((uv_handle_t *)&c->timer, on_conn_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  (void)suggested;
  if (c->pos == c->len) {
    c->pos = c->len = 0;
  } else if (c->pos > 0 && c->cap - c->len < READ_MIN) {
    memmove(c->buf, c->buf + c->pos, c->len - c->pos);
    c->len -= c->pos;
    c->pos = 0;
  }
  if (c->cap - c->len < READ_MIN && c->cap < c->cap_max) {
    size_t n = c->cap * 2 < c->cap_max ? c->cap * 2 : c->cap_max;
    char *nb = realloc(c->buf, n);
    if (nb != NULL) {
      c->buf = nb;
      c->cap = n;
    }
  }
  buf->base = c->buf + c->len;
  buf->len = c->cap - c->len; /* 0 makes libuv report UV_ENOBUFS */
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void head_reset(conn_t *c);

static void read_on(conn_t *c) {
  if (!c->reading && !c->closing &&
      uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
    c->reading = 1;
}

static void read_off(conn_t *c) {
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
}

/* Pool c after a complete response. */
static void conn_make_idle(conn_t *c) {
  om_upstream_pool_t *p = c->pool;
  peer_t *e = c->peer;
  c->phase = PH_IDLE;
  c->pos = c->len = 0;
  c->idle_since = now_ms(p);
  c->iprev = NULL;
  c->inext = e->idle_head;
  if (e->idle_head != NULL)
    e->idle_head->iprev = c;
  else
    e->idle_tail = c;
  e->idle_head = c;
  e->st.idle++;
  p->st.idle++;
  read_on(c); /* an EOF or a stray byte closes it */
  if (e->st.idle > p->o.max_idle_per_peer)
    conn_close(e->idle_tail);
  else
    conn_arm(c);
}

/* The earliest deadline that applies to c now; 0 for none. */
static uint64_t conn_deadline(const conn_t *c) {
  const req_t *r = c->req;
  uint64_t d = 0, x = 0;
  if (r == NULL)
    return c->phase == PH_IDLE ? c->idle_since + c->pool->o.idle_timeout_ms : 0;
  d = r->total_due;
  if (c->phase == PH_CONNECTING)
    x = r->connect_due;
  else if (c->phase == PH_HEAD)
    x = r->first_byte_due;
  if (x != 0 && (d == 0 || x < d))
    d = x;
  return d;
}

static void on_timer(uv_timer_t *t);

/*
 * Arm the timer for c's deadline, lazily: a timer already due earlier is
 * left alone and re-armed when it fires. So a request on a pooled
 * connection costs at most one timer update, not one per phase.
 */
static void conn_arm(conn_t *c) {
  uint64_t d = conn_deadline(c), now;
  if (d == 0 || (c->timer_due != 0 && c->timer_due <= d))
    return;
  now = now_ms(c->pool);
  uv_timer_start(&c->timer, on_timer, d > now ? d - now : 0, 0);
  c->timer_due = d;
}

/*
 * The attempt on c failed. c is closed. A request that met a stale pooled
 * connection (nothing of a response came back) goes again, once, on a
 * fresh connection when its method is idempotent; any other ends.
 */
static void attempt_fail(conn_t *c, om_upstream_fail_t fail, int err,
                         const char *detail) {
  req_t *r = c->req;
  om_upstream_pool_t *p = c->pool;
  detach(c);
  conn_close(c);
  if (r == NULL)
    return;
  if (fail == OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE && r->res.reused &&
      !r->got_bytes && r->idempotent && r->res.attempts == 1 && !p->closing) {
    r->res.attempts = 2;
    r->peer->st.retries++;
    p->st.retries++;
    if (conn_connect(r) == 0)
      return;
    fail = OM_UPSTREAM_FAIL_INTERNAL;
    err = OM_ENOMEM;
    detail = "out of memory for a retry connection";
  }
  req_end(r, fail, err, detail);
}

static void on_timer(uv_timer_t *t) {
  conn_t *c = t->data;
  req_t *r = c->req;
  uint64_t now = now_ms(c->pool);
  c->timer_due = 0;
  if (c->closing)
    return;
  if (r != NULL) {
    if (r->total_due != 0 && now >= r->total_due) {
      attempt_fail(c, OM_UPSTREAM_FAIL_TIMEOUT_TOTAL, 0,
                   "the total timeout passed");
      return;
    }
    if (c->phase == PH_CONNECTING && r->connect_due != 0 &&
        now >= r->connect_due) {
      attempt_fail(c, OM_UPSTREAM_FAIL_TIMEOUT_CONNECT, 0,
                   "the connect timeout passed");
      return;
    }
    if (c->phase == PH_HEAD && r->first_byte_due != 0 &&
        now >= r->first_byte_due) {
      attempt_fail(c, OM_UPSTREAM_FAIL_TIMEOUT_FIRST_BYTE, 0,
                   "no response head within the first-byte timeout");
      return;
    }
  } else if (c->phase == PH_IDLE &&
             now >= c->idle_since + c->pool->o.idle_timeout_ms) {
    conn_close(c);
    return;
  }
  conn_arm(c);
}

static void on_write(uv_write_t *w, int status) {
  conn_t *c = w->data;
  c->writing = 0;
  if (c->closing || status == 0)
    return;
  if (c->req != NULL && c->phase == PH_HEAD) {
    attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                 uv_strerror(status));
    return;
  }
  /* the response is already under way: let the read side end it; the
   * connection is out of sync either way */
  c->broken = 1;
}

/* Send the request head and body: one writev when the socket takes it
 * all (the usual case), uv_write for what a short write left. */
static void conn_write(conn_t *c) {
  req_t *r = c->req;
  uv_buf_t b[2];
  unsigned nb = 1, k = 0;
  size_t total = r->head_len + r->body_len, left;
  int n, rc;
  b[0] = uv_buf_init(r->head, (unsigned)r->head_len);
  if (r->body_len > 0) {
    b[1] = uv_buf_init((char *)r->body, (unsigned)r->body_len);
    nb = 2;
  }
  r->res.sent = 1;
  n = uv_try_write((uv_stream_t *)&c->tcp, b, nb);
  if (n == UV_EAGAIN || n == UV_ENOSYS)
    n = 0;
  if (n < 0) {
    attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0, uv_strerror(n));
    return;
  }
  if ((size_t)n == total)
    return;
  left = (size_t)n;
  while (left >= b[k].len) {
    left -= b[k].len;
    k++;
  }
  b[k].base += left;
  b[k].len -= (unsigned)left;
  c->wreq.data = c;
  rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, b + k, nb - k, on_write);
  if (rc != 0) {
    attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0, uv_strerror(rc));
    return;
  }
  c->writing = 1;
}

/* c (connected or pooled) starts carrying its request. */
static void conn_start(conn_t *c) {
  req_t *r = c->req;
  c->phase = PH_HEAD;
  c->pos = c->len = 0;
  c->interim_bytes = 0;
  head_reset(c);
  c->broken = 0;
  r->got_bytes = 0;
  r->first_byte_due =
      r->first_byte_ms != 0 ? now_ms(c->pool) + r->first_byte_ms : 0;
  conn_arm(c);
  if (r->paused)
    read_off(c);
  else
    read_on(c);
  conn_write(c);
}

static void on_connect(uv_connect_t *cr, int status) {
  conn_t *c = cr->data;
  if (c->closing || c->req == NULL)
    return;
  if (status < 0) {
    attempt_fail(c, OM_UPSTREAM_FAIL_CONNECT, 0, uv_strerror(status));
    return;
  }
  conn_start(c);
}

/*
 * A new connection for r to r->peer. Returns 0 (connecting; or a
 * synchronous connect error already ended r), OM_ENOMEM with nothing
 * changed.
 */
static int conn_connect(req_t *r) {
  om_upstream_pool_t *p = r->pool;
  peer_t *e = r->peer;
  conn_t *c = calloc(1, sizeof *c);
  int rc;
  if (c == NULL)
    return OM_ENOMEM;
  c->cap = p->o.read_buffer_bytes;
  c->cap_max = p->o.max_header_bytes + READ_MIN > c->cap
                   ? p->o.max_header_bytes + READ_MIN
                   : c->cap;
  c->buf = malloc(c->cap);
  if (c->buf == NULL) {
    free(c);
    return OM_ENOMEM;
  }
  c->pool = p;
  c->peer = e;
  e->refs++;
  p->nconns++;
  uv_tcp_init(p->loop, &c->tcp);
  uv_timer_init(p->loop, &c->timer);
  c->tcp.data = c->timer.data = c->creq.data = c->wreq.data = c;
  c->handles = 2;
  c->next = p->conns;
  if (p->conns != NULL)
    p->conns->prev = c;
  p->conns = c;
  c->phase = PH_CONNECTING;
  c->req = r;
  r->conn = c;
  e->st.active++;
  p->st.active++;
  e->st.connects++;
  p->st.connects++;
  r->res.reused = 0;
  r->connect_due = r->connect_ms != 0 ? now_ms(p) + r->connect_ms : 0;
  uv_tcp_nodelay(&c->tcp, 1);
  rc = uv_tcp_connect(&c->creq, &c->tcp, &e->target.addr.sa, on_connect);
  if (rc != 0) {
    detach(c);
    conn_close(c);
    req_end(r, OM_UPSTREAM_FAIL_CONNECT, 0, uv_strerror(rc));
    return 0;
  }
  conn_arm(c);
  return 0;
}

/* ------------------------------------------------------------------ */
/* response parsing (the grammar is core/om_http1.c's) */

enum { STEP_GO, STEP_MORE, STEP_STOP };

/* The failure detail for a refusal of the framing module (the client's
 * own wording, stable for callers and tests), and its error code. */
static const char *fail_detail(om_http1_err_t e, int *err) {
  *err = OM_EPARSE;
  switch (e) {
  case OM_HTTP1_E_STATUS_VERSION:
    return "the status line does not start with HTTP/1.0 or HTTP/1.1";
  case OM_HTTP1_E_BARE_LF:
    return "a bare LF in the response head";
  case OM_HTTP1_E_END_BARE_CR:
    return "a bare CR in the response head";
  case OM_HTTP1_E_TOO_MANY_FIELDS:
    *err = OM_ETOOBIG;
    return "more response header fields than max_headers";
  case OM_HTTP1_E_HEAD_TOO_LARGE:
    *err = OM_ETOOBIG;
    return "the response head exceeds max_header_bytes";
  case OM_HTTP1_E_TE_HTTP10:
    return "Transfer-Encoding in an HTTP/1.0 response";
  case OM_HTTP1_E_TE_BAD:
  case OM_HTTP1_E_TE_NOT_CHUNKED:
  case OM_HTTP1_E_TE_UNSUPPORTED:
    return "a Transfer-Encoding other than chunked";
  case OM_HTTP1_E_CHUNK_TOO_LARGE:
    return "a chunk size over 2^63-1";
  case OM_HTTP1_E_CHUNK_BARE_CR:
    return "a malformed chunk extension";
  case OM_HTTP1_E_CHUNK_LINE_TOO_LONG:
    return "a chunk line over 4 KiB";
  case OM_HTTP1_E_TRAILER_TOO_LARGE:
    *err = OM_ETOOBIG;
    return "the trailer section exceeds max_header_bytes";
  case OM_HTTP1_E_TRAILER_OBS_FOLD:
  case OM_HTTP1_E_CHUNK_END:
    return "a malformed trailer field";
  case OM_HTTP1_E_TRAILER_CONTENT_LENGTH:
    return "an invalid Content-Length in the trailer section";
  default: /* the module's own description is the client's wording */
    return om_http1_err_desc(e);
  }
}

/* A response broke the framing rules: end the attempt. */
static int malformed(conn_t *c, int err, const char *detail) {
  attempt_fail(c, OM_UPSTREAM_FAIL_MALFORMED, err, detail);
  return STEP_STOP;
}

static int refused(conn_t *c, om_http1_err_t e) {
  int err;
  const char *detail = fail_detail(e, &err);
  return malformed(c, err, detail);
}

/* A fresh head parser at c->pos; 1xx heads already skipped count
 * against the limit. */
static void head_reset(conn_t *c) {
  size_t max = c->pool->o.max_header_bytes;
  om_http1_head_init(&c->head, OM_HTTP1_RESPONSE, c->fields, c->fields_cap,
                     c->pool->o.max_headers,
                     max > c->interim_bytes ? max - c->interim_bytes : 0);
}

/*
 * After a user callback: 0 to go on, or STEP_STOP when the request was
 * cancelled (released here), ended (the pool closed) or paused.
 */
static int after_cb(conn_t *c, req_t *r) {
  if (r->cancelled) {
    req_recycle(r);
    return STEP_STOP;
  }
  if (c->req != r || c->closing || r->paused)
    return STEP_STOP;
  return 0;
}

/* The response ended cleanly: pool or close c, then on_done. */
static int msg_complete(conn_t *c) {
  req_t *r = c->req;
  om_upstream_pool_t *p = c->pool;
  int reuse = c->keepalive && !c->writing && !c->broken && c->pos == c->len &&
              !p->closing;
  detach(c);
  if (reuse)
    conn_make_idle(c);
  else
    conn_close(c);
  req_end(r, OM_UPSTREAM_OK, 0, "");
  return STEP_STOP;
}

static int deliver(conn_t *c, req_t *r, const char *data, size_t n) {
  r->res.body_bytes += n;
  if (r->cb.on_body == NULL)
    return 0;
  r->in_cb = 1;
  r->cb.on_body(r->ud, data, n);
  r->in_cb = 0;
  return after_cb(c, r);
}

/* What the head says about the connection and the body. */
typedef struct {
  int body; /* OM_HTTP1_BODY_* */
  int te_lookalike;
  uint64_t cl;
  conn_opts_t co;
} head_t;

/*
 * The complete head b[0, c->head.pos): fields to c->hdrs (exact lengths,
 * not yet NUL-terminated), then the framing decision (RFC 9112 6). 0, or
 * a module error (and *oom for no memory for the fields).
 */
static om_http1_err_t head_fields(conn_t *c, const char *b, head_t *h,
                                  int *oom) {
  const om_http1_head_t *hd = &c->head;
  om_http1_framing_t fr;
  om_http1_err_t e;
  size_t i, n = hd->n_fields;
  memset(h, 0, sizeof *h);
  *oom = 0;
  if (n > c->hdrs_cap) {
    om_http_header_t *nh = realloc(c->hdrs, n * sizeof *nh);
    if (nh == NULL) {
      *oom = 1;
      return OM_HTTP1_OK;
    }
    c->hdrs = nh;
    c->hdrs_cap = n;
  }
  om_http1_framing_init(&fr, OM_HTTP1_RESPONSE);
  for (i = 0; i < n; i++) {
    const om_http1_field_t *f = &c->fields[i];
    om_http_header_t *o = &c->hdrs[i];
    o->name = b + f->name_off;
    o->name_len = f->name_len;
    o->value = b + f->value_off;
    o->value_len = f->value_len;
    e = om_http1_framing_field(&fr, o->name, o->name_len, o->value,
                               o->value_len);
    if (e != OM_HTTP1_OK)
      return e;
    if (field_kind(o->name, o->name_len) == F_CONNECTION &&
        conn_walk(o->value, o->value_len, conn_opt, &h->co) != 0)
      return OM_HTTP1_E__COUNT; /* see step_head */
  }
  h->cl = fr.cl;
  /* beside a real Transfer-Encoding only: alone it changes nothing the
   * client reads (see om_http1_framing_t) */
  h->te_lookalike = fr.te_lookalike_last && fr.n_te > 0;
  return om_http1_framing_end(&fr, hd->minor, hd->status, c->req->is_head,
                              &h->body);
}

/* Keep only the end-to-end fields, NUL-terminate them in place. */
static size_t filter_fields(conn_t *c, size_t n, int named) {
  size_t i, k = 0;
  for (i = 0; i < n; i++) {
    om_http_header_t f = c->hdrs[i];
    int kind = field_kind(f.name, f.name_len);
    int drop = kind == F_HOP || kind == F_CONNECTION || kind == F_TE ||
               (named && named_in_connection(c->hdrs, n, f.name, f.name_len));
    if (drop)
      continue;
    c->hdrs[k++] = f;
  }
  /* only now: the Connection values were needed intact until here */
  for (i = 0; i < k; i++) {
    ((char *)c->hdrs[i].name)[c->hdrs[i].name_len] = 0;
    ((char *)c->hdrs[i].value)[c->hdrs[i].value_len] = 0;
  }
  return k;
}

/* The response head: parse, check, skip 1xx, hand it over. */
static int step_head(conn_t *c) {
  req_t *r = c->req;
  om_http1_head_t *hd = &c->head;
  head_t h;
  char *b = c->buf + c->pos;
  size_t end;
  int rc, oom;
  om_http1_err_t e;
  for (;;) {
    rc = om_http1_head_parse(hd, b, c->len - c->pos);
    if (rc != OM_HTTP1_GROW)
      break;
    {
      size_t cap = c->fields_cap ? c->fields_cap * 2 : HDRS_INITIAL;
      om_http1_field_t *nf;
      if (cap > c->pool->o.max_headers)
        cap = c->pool->o.max_headers;
      nf = realloc(c->fields, cap * sizeof *nf);
      if (nf == NULL) {
        attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                     "out of memory for the response fields");
        return STEP_STOP;
      }
      c->fields = hd->fields = nf;
      c->fields_cap = hd->fields_cap = cap;
    }
  }
  if (rc == OM_HTTP1_MORE)
    return STEP_MORE;
  if (rc == OM_HTTP1_ERROR)
    return refused(c, hd->err);
  end = hd->pos;
  e = head_fields(c, b, &h, &oom);
  if (oom) {
    attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                 "out of memory for the response fields");
    return STEP_STOP;
  }
  if (e == OM_HTTP1_E__COUNT)
    return malformed(c, OM_EPARSE, "a Connection element that is not a token");
  if (e != OM_HTTP1_OK)
    return refused(c, e);
  if (hd->status == 101)
    return malformed(c, OM_EPARSE,
                     "101 Switching Protocols (no upgrade "
                     "was asked for)");
  if (h.te_lookalike)
    return malformed(c, OM_EPARSE,
                     "a field named like Transfer-Encoding beside it");
  if (hd->status < 200) {
    /* an interim response: skip it, the final one follows (RFC 9110
     * 15.2); its bytes count against the head limit */
    c->interim_bytes += end;
    c->pos += end;
    head_reset(c);
    return STEP_GO;
  }
  c->pos += end;
  c->keepalive = hd->minor == 1 && !h.co.close && h.body != OM_HTTP1_BODY_CLOSE;
  b[hd->reason_off + hd->reason_len] = 0;
  c->resp.status = hd->status;
  c->resp.version_minor = hd->minor;
  c->resp.reason = b + hd->reason_off;
  c->resp.reason_len = hd->reason_len;
  c->resp.n_headers = filter_fields(c, hd->n_fields, h.co.others);
  c->resp.headers = c->hdrs;
  c->resp.has_body = h.body != OM_HTTP1_BODY_NONE;
  c->resp.content_length = h.body == OM_HTTP1_BODY_LENGTH ? (int64_t)h.cl
                           : h.body == OM_HTTP1_BODY_NONE ? 0
                                                          : -1;
  switch (h.body) {
  case OM_HTTP1_BODY_LENGTH:
    c->phase = PH_BODY_CL;
    c->remaining = h.cl;
    break;
  case OM_HTTP1_BODY_CHUNKED:
    c->phase = PH_CHUNKED;
    /* the trailer limit counts the section's last LF too */
    om_http1_chunked_init(&c->ch, (uint64_t)INT64_MAX,
                          c->pool->o.max_header_bytes - 1);
    break;
  case OM_HTTP1_BODY_CLOSE:
    c->phase = PH_BODY_EOF;
    break;
  default:
    c->phase = PH_BODY_CL;
    c->remaining = 0;
    break;
  }
  r->res.headers_delivered = 1;
  if (r->cb.on_headers != NULL) {
    int verdict;
    r->in_cb = 1;
    verdict = r->cb.on_headers(r->ud, &c->resp);
    r->in_cb = 0;
    if (r->cancelled) {
      req_recycle(r);
      return STEP_STOP;
    }
    if (c->req != r || c->closing)
      return STEP_STOP;
    if (verdict != 0) {
      detach(c);
      conn_close(c);
      req_end(r, OM_UPSTREAM_FAIL_ABORTED, 0, "on_headers asked to abort");
      return STEP_STOP;
    }
  }
  if (h.body == OM_HTTP1_BODY_NONE)
    return msg_complete(c);
  return r->paused ? STEP_STOP : STEP_GO;
}

/* A chunked body (RFC 9112 7.1): the decoder hands back spans of data in
 * place, which are delivered as they come. */
static int step_chunked(conn_t *c) {
  const char *b = c->buf + c->pos, *span;
  size_t avail = c->len - c->pos, used, span_len;
  int rc;
  if (avail == 0)
    return STEP_MORE;
  rc = om_http1_chunked_decode(&c->ch, b, avail, &used, &span, &span_len);
  if (rc == OM_HTTP1_ERROR)
    return refused(c, c->ch.err);
  c->pos += used;
  if (rc == OM_HTTP1_DONE)
    return msg_complete(c);
  if (rc == OM_HTTP1_DATA)
    return deliver(c, c->req, span, span_len);
  return STEP_MORE;
}

/* Body bytes in place: Content-Length or close-delimited. */
static int step_data(conn_t *c) {
  req_t *r = c->req;
  const char *b = c->buf + c->pos;
  size_t avail = c->len - c->pos, n = avail;
  int rc;
  if (c->phase != PH_BODY_EOF && c->remaining < n)
    n = (size_t)c->remaining;
  if (n == 0)
    return STEP_MORE;
  c->pos += n;
  if (c->phase != PH_BODY_EOF)
    c->remaining -= n;
  rc = deliver(c, r, b, n);
  if (rc != 0)
    return rc;
  if (c->phase == PH_BODY_CL && c->remaining == 0)
    return msg_complete(c);
  return STEP_GO;
}

/* Run c's request through what is buffered, until more bytes are needed
 * or the request stops (ended, paused, cancelled). */
static void conn_process(conn_t *c) {
  for (;;) {
    int rc;
    if (c->closing || c->req == NULL || c->req->paused)
      return;
    switch (c->phase) {
    case PH_HEAD:
      rc = step_head(c);
      break;
    case PH_BODY_CL:
    case PH_BODY_EOF:
      rc = step_data(c);
      break;
    case PH_CHUNKED:
      rc = step_chunked(c);
      break;
    default:
      return;
    }
    if (rc != STEP_GO)
      return;
  }
}

/* EOF or a read error on a connection carrying a request. */
static void conn_eof(conn_t *c, ssize_t err) {
  int eof = err == UV_EOF;
  if (err == UV_ENOBUFS) {
    attempt_fail(c, OM_UPSTREAM_FAIL_INTERNAL, OM_ENOMEM,
                 "out of memory for the read buffer");
    return;
  }
  switch (c->phase) {
  case PH_HEAD:
    attempt_fail(c, OM_UPSTREAM_FAIL_RESET_BEFORE_RESPONSE, 0,
                 !eof                ? uv_strerror((int)err)
                 : c->req->got_bytes ? "the connection closed inside the "
                                       "response head"
                                     : "the connection closed before any "
                                       "response byte");
    return;
  case PH_BODY_EOF:
    if (eof) { /* a close-delimited body ends here (RFC 9112 6.3 item 8) */
      msg_complete(c);
      return;
    }
    break;
  default:
    break;
  }
  attempt_fail(c, OM_UPSTREAM_FAIL_RESET_MID_BODY, 0,
               eof ? "the connection closed before the end of the body"
                   : uv_strerror((int)err));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = s->data;
  (void)buf;
  if (nread == 0 || c->closing)
    return;
  if (c->req == NULL) {
    /* pooled: the server closed it, or sent what nobody asked for */
    conn_close(c);
    return;
  }
  if (nread > 0) {
    c->len += (size_t)nread;
    c->req->got_bytes = 1;
    conn_process(c);
    return;
  }
  conn_eof(c, nread);
}

/* ------------------------------------------------------------------ */
/* the kick: deferred completions and resumed deliveries */

static void on_kick(uv_idle_t *h) {
  om_upstream_pool_t *p = h->data;
  req_t *r;
  while ((r = p->pend_head) != NULL) {
    int kind = r->pend;
    pend_unlink(r);
    if (kind == PEND_DONE) {
      req_call_done(r);
    } else if (r->conn != NULL && !r->paused) {
      conn_t *c = r->conn;
      if (c->phase != PH_CONNECTING)
        conn_process(c);
    }
  }
  uv_idle_stop(&p->kick);
  p->kick_on = 0;
  pool_maybe_finish(p);
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
      free(e);
    }
  }
  while ((r = p->free_reqs) != NULL) {
    p->free_reqs = r->next;
    free(r->head);
    free(r);
  }
  free(p->buckets);
  free(p);
}

static void pool_maybe_finish(om_upstream_pool_t *p) {
  if (!p->closing || p->finishing || p->nconns > 0 || p->pend_head != NULL ||
      p->api > 0)
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
  p->nbuckets = 16;
  p->buckets = calloc(p->nbuckets, sizeof *p->buckets);
  if (p->buckets == NULL) {
    free(p);
    return OM_ENOMEM;
  }
  p->loop = loop;
  p->o = o;
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
  while ((c = p->conns) != NULL) {
    req_t *r = c->req;
    detach(c);
    conn_close(c);
    if (r != NULL)
      req_end(r, OM_UPSTREAM_FAIL_CLOSED, 0, "the pool was closed");
  }
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
  key_of(t, &k);
  e = peer_find(p, &k, key_hash(&k));
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

/* RFC 9110 9.2.2 */
static int method_idempotent(const char *m, size_t n) {
  return method_is(m, n, "GET") || method_is(m, n, "HEAD") ||
         method_is(m, n, "OPTIONS") || method_is(m, n, "PUT") ||
         method_is(m, n, "DELETE") || method_is(m, n, "TRACE");
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

static int valid_value(const char *v, size_t n) {
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
  int has_host = 0, named = 0, want_cl;
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
      if (!valid_value(h[i].value, vl))
        return OM_EINVAL;
    }
    if (field_kind(h[i].name, nl) == F_CONNECTION) {
      conn_opts_t co = {0, 0};
      if (conn_walk(h[i].value, vl, conn_opt, &co) != 0)
        return OM_EINVAL;
      named |= co.others;
    }
    need += nl + vl + 4;
  }
  want_cl = q->body_len > 0 || method_is(m, ml, "POST") ||
            method_is(m, ml, "PUT") || method_is(m, ml, "PATCH");
  cll = want_cl ? (int)om__http_u64_dec(clbuf, q->body_len) : 0;
  need += 6 + al + 2 + 16 + (size_t)cll + 2;
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
    int kind = field_kind(h[i].name, nl);
    if (kind == F_HOP || kind == F_CONNECTION || kind == F_TE ||
        kind == F_CONTENT_LENGTH ||
        (named && named_in_connection(h, n, h[i].name, nl)))
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
  }
  {
    char *head = r->head;
    size_t cap = r->head_cap;
    memset(r, 0, sizeof *r);
    r->head = head;
    r->head_cap = cap;
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
  int rc;
  uint64_t now;
  if (p == NULL || t == NULL || q == NULL || cb == NULL || out == NULL ||
      cb->on_done == NULL || q->method == NULL || q->target == NULL ||
      (q->body == NULL && q->body_len > 0))
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
  r = req_get(p);
  if (r == NULL)
    return OM_ENOMEM;
  rc = build_head(r, t, q, m, ml, tg, tl);
  if (rc != 0) {
    req_recycle(r);
    return rc;
  }
  e = peer_get(p, t);
  if (e == NULL) {
    req_recycle(r);
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
  r->connect_ms = q->connect_timeout_ms;
  r->first_byte_ms = q->first_byte_timeout_ms;
  r->total_due = q->timeout_ms != 0 ? now + q->timeout_ms : 0;
  r->idempotent = method_idempotent(m, ml);
  r->is_head = method_is(m, ml, "HEAD");
  r->res.attempts = 1;
  r->peer = e;
  e->refs++;
  p->api++;
  c = e->idle_head;
  if (c != NULL) {
    idle_unlink(c);
    c->req = r;
    r->conn = c;
    r->res.reused = 1;
    e->st.active++;
    p->st.active++;
    e->st.reuses++;
    p->st.reuses++;
    e->st.requests++;
    p->st.requests++;
    conn_start(c);
  } else {
    rc = conn_connect(r);
    if (rc != 0) {
      p->api--;
      e->refs--;
      req_recycle(r);
      return rc;
    }
    e->st.requests++;
    p->st.requests++;
  }
  p->api--;
  *out = r;
  return 0;
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
    detach(c);
    conn_close(c);
  }
  if (r->peer != NULL) {
    peer_unref(r->peer);
    r->peer = NULL;
  }
  r->cancelled = 1;
  r->state = R_DONE;
  if (!r->in_cb)
    req_recycle(r);
  p->api--;
  pool_maybe_finish(p);
  return 0;
}

int om_upstream_pause(om_upstream_req_t *r) {
  if (r == NULL)
    return OM_EINVAL;
  if (r->state != R_ACTIVE || r->pend == PEND_DONE)
    return OM_ESTATE;
  r->paused = 1;
  if (r->pend == PEND_PROCESS)
    pend_unlink(r);
  if (r->conn != NULL && r->conn->phase != PH_CONNECTING)
    read_off(r->conn);
  return 0;
}

int om_upstream_resume(om_upstream_req_t *r) {
  conn_t *c;
  if (r == NULL)
    return OM_EINVAL;
  if (r->state != R_ACTIVE || r->pend == PEND_DONE)
    return OM_ESTATE;
  if (!r->paused)
    return 0;
  r->paused = 0;
  c = r->conn;
  if (c != NULL && c->phase != PH_CONNECTING) {
    read_on(c);
    if (c->pos < c->len)
      pend_push(r, PEND_PROCESS);
  }
  return 0;
}
