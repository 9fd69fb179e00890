/*
 * om_proxy_resolve.c: peers by name (docs/PROXY.md "Peers by name").
 *
 * A peer whose URL names a host holds a reference to one cache entry per
 * (service, name): several instances behind one name (ports apart) share
 * its lookups. Lookups never run on the loop: uv_getaddrinfo runs on
 * libuv's thread pool, and the test hook (OPENMESH_RESOLVE_HOSTS: a file
 * in /etc/hosts format that then answers every name instead of the
 * system resolver) is read there too. At most MAX_INFLIGHT lookups run at
 * once, so a slow DNS server cannot take the whole pool from file work.
 *
 * One timer per proxy, armed for the earliest entry due. An entry is due
 * once at creation, then resolve_interval_ms after each success (the
 * policy's, default 30 s), sooner after a failure (1 s doubling up to the
 * interval) and soon after a connect failure (at most one lookup a
 * second per name). A failed lookup keeps the last good addresses; a name
 * that never resolved makes its peers unselectable.
 *
 * Addresses are kept in the order the resolver gave them (RFC 6724 for
 * getaddrinfo, file order for the hook), at most MAX_ADDRS. A peer uses
 * one of them (its target) until a connect failure moves it to the next;
 * a new list restarts every peer of the entry at its first address.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <uv.h>

#include "om_errno.h"
#include "om_hosts_file.h"
#include "om_list.h"
#include "om_log.h"
#include "om_proxy_internal.h"
#include "om_url.h"

#define MAX_ADDRS 16
#define MAX_INFLIGHT 2
#define DEF_INTERVAL_MS 30000u
#define RETRY_MIN_MS 1000u
/* a connect failure asks for a lookup no sooner than this after the last */
#define KICK_MIN_MS 1000u

typedef union {
  struct sockaddr sa;
  struct sockaddr_in in4;
  struct sockaddr_in6 in6;
} addr_t;

typedef struct om__proxy_name_s {
  om_list_t link; /* the resolver's entries */
  struct om__proxy_resolver_s *res;
  om__proxy_service_t *s;
  char host[OM_URL_HOST_MAX + 1];
  uint32_t refs; /* its peers, and the lookup in flight */
  int busy;      /* a lookup is in flight (the request below is the pool's) */
  /* the proxy closed while the lookup ran: the entry left the resolver
   * (which may be gone), and only the lookup's answer frees it */
  int orphan;
  union {
    uv_getaddrinfo_t gai;
    uv_work_t work;
  } req;
  addr_t addrs[MAX_ADDRS]; /* the last good list */
  size_t n;
  uint32_t gen; /* bumped when the list changes */
  uint64_t due_ns, last_try_ns, last_ok_ns;
  uint32_t fails_in_row;
  uint64_t lookups, failures;
  char error[160]; /* the latest lookup's failure; "" after a success */
  /* the hosts-file lookup's answer, written on the pool */
  addr_t work_addrs[MAX_ADDRS];
  size_t work_n;
  char work_error[160];
} om__proxy_name_t;

typedef struct om__proxy_resolver_s {
  om_proxy_t *p;
  om_list_t names;
  uv_timer_t timer;
  int timer_open, closing;
  uint32_t inflight;
  char *hosts_file; /* OPENMESH_RESOLVE_HOSTS, or NULL */
} om__proxy_resolver_t;

static uint64_t interval_ns(const om__proxy_name_t *e) {
  uint64_t ms = e->s != NULL ? e->s->set.resolve_interval_ms : 0;
  return (ms ? ms : DEF_INTERVAL_MS) * NS_PER_MS;
}

/* ------------------------------------------------------------------ */
/* scheduling */

static void start_lookup(om__proxy_name_t *e);

static void on_timer(uv_timer_t *t);

/* Arm the timer for the earliest idle entry due (none: stop it). */
static void rearm(om__proxy_resolver_t *r) {
  uint64_t next = UINT64_MAX, now;
  if (r->closing || !r->timer_open)
    return;
  if (r->inflight >= MAX_INFLIGHT) {
    uv_timer_stop(&r->timer); /* a completion re-arms */
    return;
  }
  OM_LIST_FOREACH(it, &r->names) {
    om__proxy_name_t *e = OM_LIST_ENTRY(it, om__proxy_name_t, link);
    if (!e->busy && e->due_ns < next)
      next = e->due_ns;
  }
  if (next == UINT64_MAX) {
    uv_timer_stop(&r->timer);
    return;
  }
  now = uv_hrtime();
  uv_timer_start(&r->timer, on_timer,
                 next > now ? (next - now + NS_PER_MS - 1) / NS_PER_MS : 0, 0);
}

static void on_timer(uv_timer_t *t) {
  om__proxy_resolver_t *r = t->data;
  uint64_t now = uv_hrtime();
  OM_LIST_FOREACH_SAFE(it, &r->names) {
    om__proxy_name_t *e = OM_LIST_ENTRY(it, om__proxy_name_t, link);
    if (r->inflight >= MAX_INFLIGHT)
      break;
    if (!e->busy && e->due_ns <= now)
      start_lookup(e);
  }
  rearm(r);
}

static void name_free(om__proxy_name_t *e) {
  om_list_remove(&e->link);
  free(e);
}

/* ------------------------------------------------------------------ */
/* answers */

static int addr_eq(const addr_t *a, const addr_t *b) {
  if (a->sa.sa_family != b->sa.sa_family)
    return 0;
  if (a->sa.sa_family == AF_INET)
    return memcmp(&a->in4.sin_addr, &b->in4.sin_addr, 4) == 0;
  return memcmp(&a->in6.sin6_addr, &b->in6.sin6_addr, 16) == 0;
}

/* Append sa to list (deduplicated, at most MAX_ADDRS). */
static void addr_add(addr_t *list, size_t *n, const struct sockaddr *sa) {
  addr_t a;
  memset(&a, 0, sizeof a);
  if (sa->sa_family == AF_INET)
    memcpy(&a.in4, sa, sizeof a.in4);
  else if (sa->sa_family == AF_INET6)
    memcpy(&a.in6, sa, sizeof a.in6);
  else
    return;
  a.in4.sin_port = 0; /* the peer's port goes in when it is used */
  if (a.sa.sa_family == AF_INET6)
    a.in6.sin6_port = 0;
  for (size_t i = 0; i < *n; i++)
    if (addr_eq(&list[i], &a))
      return;
  if (*n < MAX_ADDRS)
    list[(*n)++] = a;
}

static void addr_text(const addr_t *a, char *buf, size_t cap) {
  if (a->sa.sa_family == AF_INET)
    uv_ip4_name(&a->in4, buf, cap);
  else
    uv_ip6_name(&a->in6, buf, cap);
}

/* A lookup ended: n addresses in list, or err (a static-ish message). */
static void lookup_done(om__proxy_name_t *e, const addr_t *list, size_t n,
                        const char *err) {
  om__proxy_resolver_t *r = e->res;
  uint64_t now = uv_hrtime();
  e->busy = 0;
  if (e->orphan) {
    if (--e->refs == 0)
      free(e);
    return;
  }
  r->inflight--;
  if (--e->refs == 0) { /* every peer left meanwhile */
    name_free(e);
  } else if (r->closing) {
    /* the answer is not needed any more */
  } else if (n > 0) {
    int same = n == e->n;
    for (size_t i = 0; same && i < n; i++)
      same = addr_eq(&list[i], &e->addrs[i]);
    if (!same) {
      memcpy(e->addrs, list, n * sizeof *list);
      e->n = n;
      e->gen++;
    }
    e->last_ok_ns = now;
    e->fails_in_row = 0;
    e->error[0] = '\0';
    e->due_ns = now + interval_ns(e);
  } else {
    uint64_t back = (uint64_t)RETRY_MIN_MS * NS_PER_MS;
    char count[24];
    e->failures++;
    om_metric_inc(e->s->m_resolve_failures);
    for (uint32_t k = 0; k < e->fails_in_row && back < interval_ns(e); k++)
      back *= 2;
    if (back > interval_ns(e))
      back = interval_ns(e);
    e->fails_in_row++;
    e->due_ns = now + back;
    snprintf(e->error, sizeof e->error, "%s", err);
    snprintf(count, sizeof count, "%zu", e->n);
    /* the first failure of a run is logged; the rest are counted */
    if (e->fails_in_row == 1)
      om_log(OM_LOG_WARN, "proxy_resolve_failed", "service", e->s->name, "host",
             e->host, "error", e->error, "kept_addresses", count, NULL);
  }
  if (r->closing)
    om__proxy_maybe_finish(r->p);
  else
    rearm(r);
}

static void on_gai(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  om__proxy_name_t *e = req->data;
  addr_t list[MAX_ADDRS];
  size_t n = 0;
  const char *err = "";
  char buf[160];
  if (status == 0) {
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next)
      if (ai->ai_addr != NULL)
        addr_add(list, &n, ai->ai_addr);
    if (n == 0)
      err = "no IPv4 or IPv6 address";
  } else {
    snprintf(buf, sizeof buf, "%s (%s)", uv_strerror(status),
             uv_err_name(status));
    err = buf;
  }
  uv_freeaddrinfo(res);
  lookup_done(e, list, n, err);
}

/* On the pool: the hosts file's addresses for e->host, in file order. */
static void hosts_work(uv_work_t *w) {
  om__proxy_name_t *e = w->data;
  struct sockaddr_storage found[MAX_ADDRS];
  size_t n = om_hosts_file_lookup(e->res->hosts_file, e->host, found, MAX_ADDRS,
                                  e->work_error, sizeof e->work_error);
  e->work_n = 0;
  if (n > 0)
    e->work_error[0] = '\0';
  for (size_t i = 0; i < n; i++)
    addr_add(e->work_addrs, &e->work_n, (const struct sockaddr *)&found[i]);
}

static void hosts_done(uv_work_t *w, int status) {
  om__proxy_name_t *e = w->data;
  if (status != 0)
    lookup_done(e, NULL, 0, uv_strerror(status));
  else
    lookup_done(e, e->work_addrs, e->work_n, e->work_error);
}

static void start_lookup(om__proxy_name_t *e) {
  om__proxy_resolver_t *r = e->res;
  om_proxy_t *p = r->p;
  int rc;
  e->last_try_ns = uv_hrtime();
  e->lookups++;
  if (r->hosts_file != NULL) {
    e->req.work.data = e;
    rc = uv_queue_work(p->loop, &e->req.work, hosts_work, hosts_done);
  } else {
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    e->req.gai.data = e;
    rc = uv_getaddrinfo(p->loop, &e->req.gai, on_gai, e->host, NULL, &hints);
  }
  e->busy = 1;
  e->refs++; /* the lookup's: the entry outlives its peers until it ends */
  r->inflight++;
  if (rc != 0) /* not started: a failed lookup, tried again later */
    lookup_done(e, NULL, 0, uv_strerror(rc));
}

/* ------------------------------------------------------------------ */
/* peers */

static void on_timer_closed(uv_handle_t *h) {
  om__proxy_resolver_t *r = h->data;
  r->timer_open = 0;
  om__proxy_maybe_finish(r->p);
}

static om__proxy_resolver_t *resolver_of(om_proxy_t *p) {
  om__proxy_resolver_t *r = p->resolver;
  const char *hosts;
  if (r != NULL)
    return r;
  r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  hosts = om_hosts_file_path();
  if (hosts != NULL && hosts[0] != '\0' &&
      (r->hosts_file = strdup(hosts)) == NULL) {
    free(r);
    return NULL;
  }
  r->p = p;
  om_list_init(&r->names);
  uv_timer_init(p->loop, &r->timer);
  r->timer.data = r;
  r->timer_open = 1;
  p->resolver = r;
  return r;
}

int om__proxy_resolve_attach(om_proxy_t *p, om__proxy_service_t *s,
                             om__proxy_peer_t *peer, const char *host) {
  om__proxy_resolver_t *r = resolver_of(p);
  om__proxy_name_t *e = NULL;
  if (r == NULL)
    return OM_ENOMEM;
  OM_LIST_FOREACH(it, &r->names) {
    om__proxy_name_t *x = OM_LIST_ENTRY(it, om__proxy_name_t, link);
    if (x->s == s && x->refs > 0 && strcasecmp(x->host, host) == 0) {
      e = x;
      break;
    }
  }
  if (e == NULL) {
    e = calloc(1, sizeof *e);
    if (e == NULL)
      return OM_ENOMEM;
    e->res = r;
    e->s = s;
    snprintf(e->host, sizeof e->host, "%s", host);
    e->due_ns = uv_hrtime();
    om_list_push_back(&r->names, &e->link);
    rearm(r);
  }
  e->refs++;
  peer->name = e;
  peer->name_gen = 0;
  peer->addr_i = 0;
  peer->addr_fails = 0;
  return 0;
}

void om__proxy_resolve_detach(om__proxy_peer_t *peer) {
  om__proxy_name_t *e = peer->name;
  peer->name = NULL;
  if (e == NULL || --e->refs > 0)
    return;
  name_free(e); /* not busy: a lookup holds a reference */
}

/* Point peer's target at its address in use, with its port. */
static void peer_set_addr(om__proxy_peer_t *peer) {
  const om__proxy_name_t *e = peer->name;
  const addr_t *a = &e->addrs[peer->addr_i];
  if (a->sa.sa_family == AF_INET) {
    peer->target.addr.in4 = a->in4;
    peer->target.addr.in4.sin_port = htons((uint16_t)peer->port);
  } else {
    peer->target.addr.in6 = a->in6;
    peer->target.addr.in6.sin6_port = htons((uint16_t)peer->port);
  }
}

int om__proxy_resolve_ready(om__proxy_peer_t *peer) {
  const om__proxy_name_t *e = peer->name;
  if (e->n == 0)
    return 0;
  if (peer->name_gen != e->gen) {
    peer->name_gen = e->gen;
    peer->addr_i = 0;
    peer->addr_fails = 0;
    peer_set_addr(peer);
  }
  return 1;
}

int om__proxy_resolve_outcome(om__proxy_peer_t *peer, om_upstream_fail_t fail,
                              uint64_t now) {
  om__proxy_name_t *e = peer != NULL ? peer->name : NULL;
  if (e == NULL)
    return 0;
  if (fail != OM_UPSTREAM_FAIL_CONNECT &&
      fail != OM_UPSTREAM_FAIL_TIMEOUT_CONNECT) {
    if (fail != OM_UPSTREAM_FAIL_LOCAL && fail != OM_UPSTREAM_FAIL_CLOSED)
      peer->addr_fails = 0; /* it connected: the address is good */
    return 0;
  }
  if (!e->res->closing && !e->busy) {
    uint64_t soon = e->last_try_ns + (uint64_t)KICK_MIN_MS * NS_PER_MS;
    if (soon < now)
      soon = now;
    if (soon < e->due_ns) {
      e->due_ns = soon;
      rearm(e->res);
    }
  }
  if (e->n == 0 || peer->name_gen != e->gen)
    return 0;
  peer->addr_fails++;
  if (e->n > 1) {
    peer->addr_i = (uint32_t)((peer->addr_i + 1) % e->n);
    peer_set_addr(peer);
  }
  return peer->addr_fails < e->n;
}

/* ------------------------------------------------------------------ */
/* metrics, status, lifecycle */

size_t om__proxy_unresolved_peers(const om__proxy_service_t *s) {
  size_t k = 0;
  for (size_t i = 0; i < s->view->n; i++)
    if (s->view->peers[i]->name != NULL && s->view->peers[i]->name->n == 0)
      k++;
  return k;
}

void om__proxy_resolve_metrics(om_proxy_t *p, om__proxy_service_t *s,
                               const char *labels) {
  s->m_resolve_failures = om_metrics_counter(
      p->metrics, "openmesh_proxy_resolve_failures_total",
      "Name lookups of the service's peers that failed (the last good "
      "addresses stay in use).",
      labels);
  /* openmesh_proxy_unresolved_peers is rendered from live state
   * (om_proxy_admin.c): a reader in the shared registry would read one
   * worker's view from the thread that renders */
}

void om__proxy_resolve_status(const om__proxy_peer_t *peer, json_t *o,
                              uint64_t now) {
  const om__proxy_name_t *e = peer->name;
  json_t *addrs = json_array();
  char buf[INET6_ADDRSTRLEN + 8];
  const char *state;
  if (o == NULL || addrs == NULL) {
    json_decref(addrs);
    return;
  }
  if (e == NULL) {
    state = "literal";
    if (peer->target.addr.sa.sa_family == AF_INET ||
        peer->target.addr.sa.sa_family == AF_INET6) {
      addr_text((const addr_t *)(const void *)&peer->target.addr, buf,
                sizeof buf);
      json_array_append_new(addrs, json_string(buf));
    }
  } else {
    for (size_t i = 0; i < e->n; i++) {
      addr_text(&e->addrs[i], buf, sizeof buf);
      json_array_append_new(addrs, json_string(buf));
    }
    if (e->n == 0)
      state = e->lookups == 0 || (e->busy && e->failures == 0) ? "pending"
                                                               : "failed";
    else
      state = e->error[0] != '\0' ? "stale" : "resolved";
  }
  json_object_set_new(o, "resolve", json_string(state));
  json_object_set_new(o, "addresses", addrs);
  if (e != NULL) {
    int ready = e->n > 0 && peer->name_gen == e->gen;
    if (ready)
      addr_text(&e->addrs[peer->addr_i], buf, sizeof buf);
    json_object_set_new(o, "address", ready ? json_string(buf) : json_null());
    json_object_set_new(o, "resolve_error", json_string(e->error));
    json_object_set_new(o, "resolve_failures",
                        json_integer((json_int_t)e->failures));
    json_object_set_new(
        o, "resolved_ms_ago",
        e->last_ok_ns
            ? json_integer((json_int_t)((now - e->last_ok_ns) / NS_PER_MS))
            : json_null());
  }
  {
    const char *why = e != NULL && e->n == 0 ? "unresolved" : NULL;
    json_object_set_new(o, "available", json_boolean(why == NULL));
    json_object_set_new(o, "unavailable_reason",
                        why ? json_string(why) : json_null());
  }
}

void om__proxy_resolve_close(om_proxy_t *p) {
  om__proxy_resolver_t *r = p->resolver;
  if (r == NULL || r->closing)
    return;
  r->closing = 1;
  /* Lookups in flight are cancelled if they have not started; one that
   * runs (a slow DNS server) is not waited for: its entry leaves the
   * resolver and is freed by the last of its answer and its peers. */
  OM_LIST_FOREACH_SAFE(it, &r->names) {
    om__proxy_name_t *e = OM_LIST_ENTRY(it, om__proxy_name_t, link);
    if (!e->busy)
      continue;
    uv_cancel((uv_req_t *)&e->req);
    if (r->hosts_file != NULL)
      continue; /* reads the resolver's path: quick, and waited for */
    e->orphan = 1;
    om_list_remove(&e->link);
    r->inflight--;
  }
  if (r->timer_open)
    uv_close((uv_handle_t *)&r->timer, on_timer_closed);
}

int om__proxy_resolve_busy(const om_proxy_t *p) {
  const om__proxy_resolver_t *r = p->resolver;
  return r != NULL && (r->timer_open || r->inflight > 0);
}

void om__proxy_resolve_free(om_proxy_t *p) {
  om__proxy_resolver_t *r = p->resolver;
  if (r == NULL)
    return;
  /* every peer is gone, so every entry was freed with its last one */
  OM_LIST_FOREACH_SAFE(it, &r->names) {
    name_free(OM_LIST_ENTRY(it, om__proxy_name_t, link));
  }
  free(r->hosts_file);
  free(r);
  p->resolver = NULL;
}
