/*
 * om_egress_names.c: the addresses of routes whose base_url names a host
 * (api.openai.com), for the provider calls on om_upstream, which connects
 * to numeric addresses only (docs/EGRESS.md "Provider connections").
 *
 * One entry per host name, looked up on demand and never on the loop:
 * uv_getaddrinfo runs on libuv's thread pool. An answer is fresh for
 * NAME_TTL_NS; an attempt on a stale entry uses the addresses it has and
 * starts a lookup behind it, so only the first call to a name (and one
 * after a failure) waits. A failed lookup keeps the last good addresses;
 * a name that never resolved fails its attempts ("connection refused"
 * class, with the resolver's reason) and is not looked up again for
 * NAME_RETRY_NS, so a broken DNS server is not asked once per call.
 * Addresses are kept in the resolver's order (RFC 6724); a connect
 * failure moves the attempt to the next address; the one that answers
 * is where later calls start. OPENMESH_RESOLVE_HOSTS answers instead of
 * the system resolver when set (om_hosts_file.h), as for the proxy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "om_egress_internal.h"
#include "om_errno.h"
#include "om_hosts_file.h"
#include "om_log.h"

#define NAME_TTL_NS (UINT64_C(30) * 1000000000u)
#define NAME_RETRY_NS (UINT64_C(1) * 1000000000u)

struct eg_name_s {
  om_list_t link; /* g->names */
  om_egress_t *g; /* NULL: orphaned (the gateway closed under a lookup) */
  char host[254];
  union {
    uv_getaddrinfo_t gai;
    uv_work_t work; /* the hosts-file hook (om_hosts_file.h) */
  } req;
  int busy;
  /* the hook's answer, written on the thread pool */
  struct sockaddr_storage work_addrs[EG_NAME_MAX_ADDRS];
  size_t work_n;
  struct sockaddr_storage addrs[EG_NAME_MAX_ADDRS];
  size_t n, first; /* the first address to try */
  uint64_t ok_ns, fail_ns;
  char error[384];
  om_list_t waiters; /* eg_name_wait_t */
};

static eg_name_t *name_find(om_egress_t *g, const char *host) {
  OM_LIST_FOREACH(it, &g->names) {
    eg_name_t *e = OM_LIST_ENTRY(it, eg_name_t, link);
    if (strcasecmp(e->host, host) == 0)
      return e;
  }
  return NULL;
}

/* A lookup ended with n addresses (any port), or why it failed. */
static void answer(eg_name_t *e, const struct sockaddr_storage *addrs, size_t n,
                   const char *why) {
  e->busy = 0;
  if (e->g == NULL) {
    free(e);
    return;
  }
  if (n > 0) {
    memcpy(e->addrs, addrs, n * sizeof *addrs);
    e->n = n;
    e->first = 0;
    e->ok_ns = eg_now_ns();
    e->error[0] = '\0';
  } else {
    /* the first failure of a run is logged; the attempts carry the rest */
    int first = e->fail_ns <= e->ok_ns;
    e->fail_ns = eg_now_ns();
    snprintf(e->error, sizeof e->error, "%s does not resolve: %s", e->host,
             why);
    if (first)
      om_log(OM_LOG_WARN, "egress_resolve_failed", "host", e->host, "error",
             e->error, "kept_addresses", e->n > 0 ? "yes" : "no", NULL);
  }
  /* every waiter asks again: an answer now, or the failure */
  while (!om_list_empty(&e->waiters)) {
    eg_name_wait_t *w =
        OM_LIST_ENTRY(om_list_first(&e->waiters), eg_name_wait_t, link);
    om_list_remove(&w->link);
    w->cb(w);
  }
}

static void on_gai(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  eg_name_t *e = req->data;
  struct sockaddr_storage addrs[EG_NAME_MAX_ADDRS];
  size_t n = 0;
  for (struct addrinfo *ai = status == 0 ? res : NULL;
       ai != NULL && n < EG_NAME_MAX_ADDRS; ai = ai->ai_next) {
    if (ai->ai_addr == NULL ||
        (ai->ai_family != AF_INET && ai->ai_family != AF_INET6))
      continue;
    memset(&addrs[n], 0, sizeof addrs[n]);
    memcpy(&addrs[n], ai->ai_addr, ai->ai_addrlen);
    n++;
  }
  uv_freeaddrinfo(res);
  answer(e, addrs, n,
         status != 0 ? uv_strerror(status) : "no IPv4 or IPv6 address");
}

/* On the pool: the hook's file instead of the system resolver. */
static void hosts_work(uv_work_t *w) {
  eg_name_t *e = w->data;
  e->work_n =
      om_hosts_file_lookup(om_hosts_file_path(), e->host, e->work_addrs,
                           EG_NAME_MAX_ADDRS, e->error, sizeof e->error);
}

static void hosts_done(uv_work_t *w, int status) {
  eg_name_t *e = w->data;
  char why[sizeof e->error];
  snprintf(why, sizeof why, "%s", status != 0 ? uv_strerror(status) : e->error);
  answer(e, e->work_addrs, status != 0 ? 0 : e->work_n, why);
}

static int lookup(eg_name_t *e) {
  struct addrinfo hints;
  int rc;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  /* no AI_ADDRCONFIG: on a host with loopback only it hides "localhost";
   * an address family the host cannot reach fails its connect, and the
   * attempt moves to the next address */
  hints.ai_socktype = SOCK_STREAM;
  if (om_hosts_file_path() != NULL) {
    e->req.work.data = e;
    rc = uv_queue_work(e->g->loop, &e->req.work, hosts_work, hosts_done);
  } else {
    e->req.gai.data = e;
    rc = uv_getaddrinfo(e->g->loop, &e->req.gai, on_gai, e->host, NULL, &hints);
  }
  if (rc != 0) {
    e->fail_ns = eg_now_ns();
    snprintf(e->error, sizeof e->error, "%s: lookup not started: %s", e->host,
             uv_strerror(rc));
    return OM_EIO;
  }
  e->busy = 1;
  return 0;
}

static void set_port(struct sockaddr_storage *a, int port) {
  if (a->ss_family == AF_INET)
    ((struct sockaddr_in *)a)->sin_port = htons((uint16_t)port);
  else
    ((struct sockaddr_in6 *)a)->sin6_port = htons((uint16_t)port);
}

int eg_name_get(om_egress_t *g, const char *host, int port, size_t nth,
                om_upstream_target_t *t, eg_name_wait_t *w, const char **why) {
  eg_name_t *e = name_find(g, host);
  uint64_t now = eg_now_ns();
  if (e == NULL) {
    if (strlen(host) >= sizeof e->host || (e = calloc(1, sizeof *e)) == NULL) {
      *why = "out of memory for a host name";
      return OM_ENOMEM;
    }
    e->g = g;
    snprintf(e->host, sizeof e->host, "%s", host);
    om_list_init(&e->waiters);
    om_list_push_back(&g->names, &e->link);
  }
  if (e->n > 0) {
    if (nth >= e->n) {
      *why = "every address of the name refused the connection";
      return OM_ENOTFOUND;
    }
    if (!e->busy && now - e->ok_ns > NAME_TTL_NS &&
        now - e->fail_ns > NAME_RETRY_NS)
      (void)lookup(e); /* refreshed behind the calls that use it */
    memcpy(&t->addr, &e->addrs[(e->first + nth) % e->n],
           sizeof e->addrs[0] < sizeof t->addr ? sizeof e->addrs[0]
                                               : sizeof t->addr);
    set_port((struct sockaddr_storage *)&t->addr, port);
    return 0;
  }
  if (!e->busy && e->fail_ns != 0 && now - e->fail_ns < NAME_RETRY_NS) {
    *why = e->error;
    return OM_ENOTFOUND;
  }
  if (!e->busy && lookup(e) != 0) {
    *why = e->error;
    return OM_ENOTFOUND;
  }
  w->name = e;
  om_list_push_back(&e->waiters, &w->link);
  return 1;
}

void eg_name_cancel(eg_name_wait_t *w) {
  if (w->name != NULL && om_list_linked(&w->link))
    om_list_remove(&w->link);
  w->name = NULL;
}

void eg_name_worked(om_egress_t *g, const char *host, size_t nth) {
  eg_name_t *e = name_find(g, host);
  /* the addresses before it refused: later calls start at this one */
  if (e != NULL && e->n > 0 && nth > 0 && nth < e->n)
    e->first = (e->first + nth) % e->n;
}

void eg_names_free(om_egress_t *g) {
  while (!om_list_empty(&g->names)) {
    eg_name_t *e = OM_LIST_ENTRY(om_list_first(&g->names), eg_name_t, link);
    om_list_remove(&e->link);
    /* calls are gone by now: no waiter is left */
    if (e->busy) {
      e->g = NULL; /* its answer frees it */
      uv_cancel((uv_req_t *)&e->req);
    } else {
      free(e);
    }
  }
}
