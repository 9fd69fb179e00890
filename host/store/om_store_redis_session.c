/*
 * om_store_redis_session.c: the Redis store's connection
 * (om_store_redis_internal.h): connect, subscribe, check the epoch and
 * resynchronise, reconnect with backoff; and the replies to every request,
 * with the sweep timer that also watches for a connection that stopped
 * answering.
 */
#include "om_store_redis_internal.h"

/* ------------------------------------------------------------------ */
/* the session: connect, subscribe, check the epoch, resync */

static void maybe_up(rstore_t *r) {
  if (r->state != S_SYNCING || !r->subscribed || !r->listed)
    return;
  r->state = S_UP;
  r->backoff = 0;
  r->attempts = 0;
  r->ever_up = 1;
  om_log(OM_LOG_INFO, "store_connected", "store", "redis", "host", r->host,
         NULL);
  if (r->opts.on_state != NULL)
    r->opts.on_state(r->opts.state_ud, 0);
}

static void on_epoch(rstore_t *r, redisReply *rep) {
  char fl[24], need[24];
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
      rep->element[0]->type != REDIS_REPLY_STRING) {
    om__session_fail(r, "unexpected reply to the epoch script");
    return;
  }
  if (r->epoch[0] != '\0' && strcmp(r->epoch, rep->element[0]->str) != 0) {
    /*
     * Redis lost its data (a restart without persistence, a flush, a
     * failover to an empty replica). Re-announce every service we
     * delivered at a revision above it, so watchers move to what Redis
     * holds now instead of keeping instances nobody renews.
     */
    om_log(OM_LOG_WARN, "store_data_lost", "store", "redis", "old_epoch",
           r->epoch, "new_epoch", rep->element[0]->str, NULL);
    for (size_t i = 0; i < r->n_svcs; i++) {
      rsvc_t *svc = r->svcs[i];
      const char *keys[2] = {r->k_rev, r->k_services};
      const char *args[4];
      req_t *q;
      if (svc->snap == NULL)
        continue;
      om__floor_str(r, fl);
      snprintf(need, sizeof need, "%" PRIu64, svc->rev + 1);
      args[0] = svc->name, args[1] = need, args[2] = fl, args[3] = r->chan;
      q = om__req_script(r, RQ_TOUCH, SC_TOUCH, 2, keys, 4, args, NULL);
      if (q == NULL || om__req_send(r, q) != 0) {
        om__session_fail(r, "out of memory during resync");
        return;
      }
    }
  }
  /* created by us (the data set was empty) or another id: state lost */
  if ((rep->element[1]->type == REDIS_REPLY_INTEGER &&
       rep->element[1]->integer == 1) ||
      (r->epoch[0] != '\0' && strcmp(r->epoch, rep->element[0]->str) != 0))
    r->st.state_lost++;
  snprintf(r->epoch, sizeof r->epoch, "%.*s", (int)rep->element[0]->len,
           rep->element[0]->str);
  r->epoch_done = 1;
  if (r->subscribed)
    om__start_resync(r);
}

static void on_resync(rstore_t *r, redisReply *rep) {
  redisReply *svcs, *cfgs;
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
      rep->element[0]->type != REDIS_REPLY_ARRAY ||
      rep->element[1]->type != REDIS_REPLY_ARRAY) {
    om__session_fail(r, "unexpected reply to the list script");
    return;
  }
  svcs = rep->element[0];
  cfgs = rep->element[1];
  for (size_t i = 0; i < r->n_svcs; i++)
    r->svcs[i]->unlisted = 1;
  for (size_t i = 0; i + 2 < svcs->elements; i += 3) {
    uint64_t rev;
    rsvc_t *svc;
    if (svcs->element[i]->type != REDIS_REPLY_STRING ||
        !om__valid_name(svcs->element[i]->str) ||
        om__reply_rev(svcs->element[i + 1], &rev) != 0)
      continue;
    om__see(r, rev);
    svc = om__svc_get(r, svcs->element[i]->str);
    if (svc == NULL) {
      r->need_resync = 1;
      continue;
    }
    svc->unlisted = 0;
    if (svc->snap == NULL || rev > svc->rev) {
      if (rev > svc->want)
        svc->want = rev;
      om__fetch_service(r, svc);
    }
  }
  /* collected while this plane was away (its g message missed) */
  for (size_t i = 0; i < r->n_svcs; i++) {
    rsvc_t *svc = r->svcs[i];
    if (svc->unlisted && svc->snap != NULL && !svc->fetching)
      svc->gone = 1;
  }
  for (size_t i = 0; i + 1 < cfgs->elements; i += 2) {
    uint64_t rev;
    rcfg_t *c;
    if (cfgs->element[i]->type != REDIS_REPLY_STRING ||
        !om__valid_name(cfgs->element[i]->str) ||
        om__reply_rev(cfgs->element[i + 1], &rev) != 0)
      continue;
    om__see(r, rev);
    c = om__cfg_get(r, cfgs->element[i]->str);
    if (c == NULL) {
      r->need_resync = 1;
      continue;
    }
    if (c->doc == NULL || rev > c->doc->revision) {
      if (rev > c->want)
        c->want = rev;
      om__fetch_config(r, c);
    }
  }
  r->listed = 1;
  maybe_up(r);
}

static void on_sub_message(redisAsyncContext *ac, void *reply, void *pd) {
  rstore_t *r = pd;
  redisReply *rep = reply;
  if (rep == NULL || r->base.closing || ac != r->sub)
    return;
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
      rep->element[0]->type != REDIS_REPLY_STRING)
    return;
  if (strcmp(rep->element[0]->str, "subscribe") == 0) {
    r->subscribed = 1;
    if (r->epoch_done)
      om__start_resync(r);
    return;
  }
  if (strcmp(rep->element[0]->str, "message") == 0 &&
      rep->element[2]->type == REDIS_REPLY_STRING)
    om__on_change_msg(r, rep->element[2]->str, rep->element[2]->len);
}

static void on_select(rstore_t *r, redisReply *rep) {
  if (rep->type == REDIS_REPLY_ERROR)
    om__session_fail(r, "SELECT failed: no such database");
}

static void on_connected(const redisAsyncContext *ac, int status);
static void on_disconnected(const redisAsyncContext *ac, int status);
static void on_retry(uv_timer_t *t);

static void send_select(rstore_t *r, redisAsyncContext *ac) {
  char db[16];
  snprintf(db, sizeof db, "%d", r->db);
  if (ac == r->cmd) {
    const char *argv[2] = {"SELECT", db};
    size_t lens[2] = {6, strlen(db)};
    req_t *q = om__req_new(r, RQ_SELECT, -1, 2, argv, lens);
    if (q == NULL || om__req_send(r, q) != 0)
      om__session_fail(r, "out of memory");
  } else {
    redisAsyncCommand(ac, NULL, NULL, "SELECT %s", db);
  }
}

/* Both connections are up: subscribe, check the epoch, then resync. */
static void session_start(rstore_t *r) {
  char cand[40];
  unsigned char rnd[16];
  const char *keys[1] = {r->k_epoch};
  const char *args[1] = {cand};
  req_t *q;
  r->state = S_SYNCING;
  if (r->db != 0) {
    send_select(r, r->cmd);
    send_select(r, r->sub);
    if (r->state != S_SYNCING)
      return;
  }
  if (redisAsyncCommand(r->sub, on_sub_message, r, "SUBSCRIBE %s", r->chan) !=
      REDIS_OK) {
    om__session_fail(r, "cannot subscribe");
    return;
  }
  if (uv_random(NULL, NULL, rnd, sizeof rnd, 0, NULL) != 0) {
    uint64_t x = om__realtime_us(r) ^ (uint64_t)(uintptr_t)r;
    memcpy(rnd, &x, sizeof x);
    memcpy(rnd + 8, &x, sizeof x);
  }
  for (int i = 0; i < 16; i++)
    snprintf(cand + 2 * i, 3, "%02x", rnd[i]);
  q = om__req_script(r, RQ_EPOCH, SC_EPOCH, 1, keys, 1, args, NULL);
  if (q == NULL || om__req_send(r, q) != 0)
    om__session_fail(r, "out of memory");
}

static void on_connected(const redisAsyncContext *ac, int status) {
  rstore_t *r = ac->data;
  if (r == NULL || r->base.closing)
    return;
  if (ac != r->cmd && ac != r->sub)
    return;
  if (status != REDIS_OK) {
    /* hiredis frees a context that failed to connect */
    if (ac == r->cmd)
      r->cmd = NULL;
    else
      r->sub = NULL;
    om__session_fail(r, ac->errstr[0] != '\0' ? ac->errstr : "connect failed");
    return;
  }
  if (ac == r->cmd)
    r->cmd_ok = 1;
  else
    r->sub_ok = 1;
  if (r->cmd_ok && r->sub_ok && r->state == S_CONNECTING)
    session_start(r);
}

static void on_disconnected(const redisAsyncContext *ac, int status) {
  rstore_t *r = ac->data;
  if (r == NULL || r->base.closing)
    return;
  if (ac == r->cmd) {
    r->cmd = NULL;
    r->cmd_ok = 0;
  } else if (ac == r->sub) {
    r->sub = NULL;
    r->sub_ok = 0;
  } else {
    return; /* one we dropped ourselves */
  }
  om__session_fail(r, ac->errstr[0] != '\0' ? ac->errstr : "connection closed");
}

/*
 * The poll callback of hiredis 0.14's libuv adapter returns on a nonzero
 * status, and libuv reports a refused connect (POLLERR) exactly that way
 * after stopping the handle: the context would wait forever. These hooks
 * are the adapter's own, with a callback that hands the error to hiredis
 * (which then reports the failed connect or the lost connection).
 */
static void poll_cb(uv_poll_t *h, int status, int events) {
  redisLibuvEvents *p = h->data;
  if (p->context == NULL)
    return;
  if (status != 0) {
    if (!(p->context->c.flags & REDIS_CONNECTED))
      redisAsyncHandleWrite(p->context);
    else
      redisAsyncHandleRead(p->context);
    return;
  }
  if (events & UV_READABLE)
    redisAsyncHandleRead(p->context);
  if (p->context != NULL && (events & UV_WRITABLE))
    redisAsyncHandleWrite(p->context);
}

static void poll_update(redisLibuvEvents *p) {
  if (p->events != 0)
    uv_poll_start(&p->handle, p->events, poll_cb);
  else
    uv_poll_stop(&p->handle);
}

static void ev_add_read(void *d) {
  ((redisLibuvEvents *)d)->events |= UV_READABLE;
  poll_update(d);
}

static void ev_del_read(void *d) {
  ((redisLibuvEvents *)d)->events &= ~UV_READABLE;
  poll_update(d);
}

static void ev_add_write(void *d) {
  ((redisLibuvEvents *)d)->events |= UV_WRITABLE;
  poll_update(d);
}

static void ev_del_write(void *d) {
  ((redisLibuvEvents *)d)->events &= ~UV_WRITABLE;
  poll_update(d);
}

static redisAsyncContext *connect_one(rstore_t *r) {
  redisAsyncContext *ac = redisAsyncConnect(r->addr, r->port);
  if (ac == NULL)
    return NULL;
  if (ac->err != 0 || redisLibuvAttach(ac, r->loop) != REDIS_OK) {
    /* A failed attach leaves its hooks set with no data behind them. */
    memset(&ac->ev, 0, sizeof ac->ev);
    redisAsyncFree(ac);
    return NULL;
  }
  ac->ev.addRead = ev_add_read;
  ac->ev.delRead = ev_del_read;
  ac->ev.addWrite = ev_add_write;
  ac->ev.delWrite = ev_del_write;
  ac->data = r;
  redisAsyncSetConnectCallback(ac, on_connected);
  redisAsyncSetDisconnectCallback(ac, on_disconnected);
  return ac;
}

static void connect_pair(rstore_t *r);

static void resolve_failed(rstore_t *r, int rc) {
  char why[OM_STORE_REDIS_HOST_MAX + 128];
  snprintf(why, sizeof why, "cannot resolve '%s': %s", r->host,
           uv_strerror(rc));
  om__session_fail(r, why);
}

static void on_resolved(uv_getaddrinfo_t *g, int status, struct addrinfo *res) {
  rstore_t *r = g->data;
  int rc = status, closing = r->base.closing;
  r->resolving = 0;
  if (rc == 0) {
    const struct addrinfo *a, *pick = NULL;
    uint64_t n = 0;
    for (a = res; a != NULL; a = a->ai_next)
      if (a->ai_family == AF_INET || a->ai_family == AF_INET6)
        n++;
    if (n > 0) {
      uint64_t k = (r->attempts - 1) % n;
      for (a = res; pick == NULL; a = a->ai_next)
        if ((a->ai_family == AF_INET || a->ai_family == AF_INET6) && k-- == 0)
          pick = a;
    }
    if (pick == NULL)
      rc = UV_EAI_NONAME;
    else if (pick->ai_family == AF_INET6)
      rc = uv_ip6_name((const struct sockaddr_in6 *)pick->ai_addr, r->addr,
                       sizeof r->addr);
    else
      rc = uv_ip4_name((const struct sockaddr_in *)pick->ai_addr, r->addr,
                       sizeof r->addr);
  }
  uv_freeaddrinfo(res);
  om__release(r); /* frees r when it was the last thing a close waited for */
  if (closing || r->state != S_CONNECTING)
    return; /* timed out meanwhile: the retry timer owns what comes next */
  if (rc != 0)
    resolve_failed(r, rc);
  else
    connect_pair(r);
}

void om__session_connect(rstore_t *r) {
  r->state = S_CONNECTING;
  r->session_ms = uv_now(r->loop);
  r->cmd_ok = r->sub_ok = r->subscribed = r->epoch_done = r->listed = 0;
  r->sweeping = 0;
  r->attempts++;
  if (r->numeric) {
    connect_pair(r);
    return;
  }
  if (!r->resolving) { /* else the pending answer connects this session */
    struct addrinfo hints;
    int rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    r->gai.data = r;
    rc = uv_getaddrinfo(r->loop, &r->gai, on_resolved, r->host, NULL, &hints);
    if (rc != 0) {
      resolve_failed(r, rc);
      return;
    }
    r->resolving = 1;
    r->handles_open++; /* close waits for the answer */
  }
}

static void connect_pair(rstore_t *r) {
  r->cmd = connect_one(r);
  if (r->cmd == NULL) {
    om__session_fail(r, "cannot create a connection");
    return;
  }
  r->sub = connect_one(r);
  if (r->sub == NULL)
    om__session_fail(r, "cannot create a connection");
}

/* Drop both connections (their pending callbacks om__see NULL replies). */
void om__drop_connections(rstore_t *r) {
  redisAsyncContext *c = r->cmd, *s = r->sub;
  r->cmd = r->sub = NULL;
  r->cmd_ok = r->sub_ok = 0;
  if (c != NULL)
    redisAsyncFree(c);
  if (s != NULL)
    redisAsyncFree(s);
}

void om__session_fail(rstore_t *r, const char *why) {
  int was_up = r->state == S_UP;
  char delay[24], tries[24];
  if (r->base.closing || r->state == S_DOWN)
    return;
  r->state = S_DOWN;
  om__drop_connections(r);
  r->inflight = 0;
  r->sweeping = 0;
  for (size_t i = 0; i < r->n_svcs; i++)
    r->svcs[i]->fetching = 0;
  for (size_t i = 0; i < r->n_cfgs; i++)
    r->cfgs[i]->fetching = 0;
  if (r->backoff == 0)
    r->backoff = r->opts.backoff_min_ms;
  else if (r->backoff < r->opts.backoff_max_ms / 2)
    r->backoff *= 2;
  else
    r->backoff = r->opts.backoff_max_ms;
  snprintf(delay, sizeof delay, "%" PRIu64, r->backoff);
  snprintf(tries, sizeof tries, "%" PRIu64, r->attempts);
  om_log(OM_LOG_WARN, "store_unavailable", "store", "redis", "host", r->host,
         "reason", why, "retry_ms", delay, "attempt", tries, NULL);
  uv_timer_start(&r->retry, on_retry, r->backoff, 0);
  if (was_up && r->opts.on_state != NULL)
    r->opts.on_state(r->opts.state_ud, OM_EIO);
}

static void on_retry(uv_timer_t *t) {
  rstore_t *r = t->data;
  if (!r->base.closing && r->state == S_DOWN)
    om__session_connect(r);
}

/* ------------------------------------------------------------------ */
/* replies */

static om_store_change_t change_of(long long code) {
  switch (code) {
  case 1:
    return OM_STORE_CREATED;
  case 2:
    return OM_STORE_UPDATED;
  case 3:
    return OM_STORE_DELETED;
  default:
    return OM_STORE_NOCHANGE;
  }
}

/* {code, rev} from a write script: code < 0 is "not found". */
static int write_result(redisReply *rep, long long *code, uint64_t *rev) {
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
      rep->element[0]->type != REDIS_REPLY_INTEGER ||
      om__reply_rev(rep->element[1], rev) != 0)
    return -1;
  *code = rep->element[0]->integer;
  return 0;
}

static void answer_write(rstore_t *r, req_t *q, redisReply *rep) {
  long long code = 0;
  uint64_t rev = 0;
  if (rep == NULL) {
    /* The connection went away with the script sent (or in hiredis's
     * output buffer): Redis may have run it, and with appendfsync always
     * even persisted it, before it died. Nobody can say "not applied";
     * the caller hears "outcome unknown" and retries, which is safe:
     * every write here is idempotent by key (a lease PUT renews what
     * the first one created, a DELETE of a gone instance is not found,
     * a config PUT stores the same content again). */
    if (q->wcb != NULL)
      q->wcb(q->ud, OM_EOUTCOME, OM_STORE_NOCHANGE, 0);
    return;
  }
  if (write_result(rep, &code, &rev) != 0) {
    om_log(OM_LOG_ERROR, "store_error", "store", "redis", "error",
           rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply",
           NULL);
    if (q->wcb != NULL)
      q->wcb(q->ud, OM_EIO, OM_STORE_NOCHANGE, 0);
    return;
  }
  om__see(r, rev);
  if (code < 0) {
    if (q->wcb != NULL)
      q->wcb(q->ud, OM_ENOTFOUND, OM_STORE_NOCHANGE, rev);
    return;
  }
  switch (q->kind) {
  case RQ_PUT:
    if (code == 0)
      r->st.renewals++;
    else
      r->st.registrations++;
    break;
  case RQ_RENEW:
    r->st.renewals++;
    break;
  case RQ_DELETE:
    r->st.deletions++;
    break;
  default:
    break;
  }
  if (q->wcb != NULL)
    q->wcb(q->ud, 0, change_of(code), rev);
}

/* Serve a read from the replica (Redis away, or it has nothing newer). */
void om__serve_snapshot(rstore_t *r, const char *name, om_store_snapshot_cb cb,
                        void *ud) {
  rsvc_t *svc = om__svc_find(r, name);
  if (svc != NULL && svc->snap != NULL)
    cb(ud, 0, svc->snap);
  else
    cb(ud, r->ever_up ? OM_ENOTFOUND : OM_EIO, NULL);
}

/* A snapshot reply: {} | {rev} | {rev, {id, value, ...}}. */
static void answer_snapshot(rstore_t *r, req_t *q, redisReply *rep) {
  rsvc_t *svc;
  uint64_t rev;
  om_snapshot_t *snap = NULL;
  int rc;
  int internal = q->kind == RQ_FETCH;
  if (internal) {
    svc = om__svc_find(r, q->name);
    if (svc != NULL)
      svc->fetching = 0;
  }
  if (rep == NULL || rep->type != REDIS_REPLY_ARRAY) {
    if (rep != NULL)
      om_log(OM_LOG_ERROR, "store_error", "store", "redis", "error",
             rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply",
             NULL);
    if (!internal)
      om__serve_snapshot(r, q->name, q->scb, q->ud);
    else
      r->need_resync = 1;
    return;
  }
  if (rep->elements == 0) {
    if (!internal)
      q->scb(q->ud, OM_ENOTFOUND, NULL);
    return;
  }
  if (om__reply_rev(rep->element[0], &rev) != 0) {
    if (!internal)
      q->scb(q->ud, OM_EIO, NULL);
    return;
  }
  om__see(r, rev);
  svc = om__svc_find(r, q->name);
  if (rep->elements == 1) {
    /* the replica was current when the script ran */
    if (!internal && svc != NULL && svc->snap != NULL && svc->rev >= rev)
      q->scb(q->ud, 0, svc->snap);
    else if (!internal)
      q->scb(q->ud, OM_EIO, NULL);
    return;
  }
  if (rep->element[1]->type != REDIS_REPLY_ARRAY) {
    if (!internal)
      q->scb(q->ud, OM_EIO, NULL);
    return;
  }
  rc = om__build_snapshot(q->name, rev, rep->element[1]->element,
                          rep->element[1]->elements, 0, &snap);
  if (rc != 0) {
    if (!internal)
      q->scb(q->ud, rc, NULL);
    else
      r->need_resync = 1;
    return;
  }
  if (svc == NULL)
    svc = om__svc_get(r, q->name);
  if (!internal)
    q->scb(q->ud, 0, snap);
  if (svc != NULL) {
    om__replica_set(r, svc, snap); /* takes our reference */
    if (!r->base.closing && svc->want > svc->rev)
      om__fetch_service(r, svc); /* something newer was announced meanwhile */
  } else {
    om_snapshot_unref(snap);
  }
}

static void answer_list(rstore_t *r, req_t *q, redisReply *rep) {
  redisReply *svcs;
  om_service_rev_t *list;
  size_t n = 0;
  if (rep == NULL || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
      rep->element[0]->type != REDIS_REPLY_ARRAY) {
    q->lcb(q->ud, OM_EIO, NULL, 0);
    return;
  }
  svcs = rep->element[0];
  list = malloc((svcs->elements / 3 + 1) * sizeof *list);
  if (list == NULL) {
    q->lcb(q->ud, OM_ENOMEM, NULL, 0);
    return;
  }
  for (size_t i = 0; i + 2 < svcs->elements; i += 3) {
    uint64_t rev;
    if (svcs->element[i]->type != REDIS_REPLY_STRING ||
        !om__valid_name(svcs->element[i]->str) ||
        om__reply_rev(svcs->element[i + 1], &rev) != 0 ||
        svcs->element[i + 2]->type != REDIS_REPLY_INTEGER)
      continue;
    om__see(r, rev);
    list[n].service = svcs->element[i]->str;
    list[n].revision = rev;
    list[n].instances = (size_t)svcs->element[i + 2]->integer;
    n++;
  }
  q->lcb(q->ud, 0, list, n);
  free(list);
}

static int lease_cmp(const void *a, const void *b) {
  const om_lease_left_t *x = a, *y = b;
  int c = strcmp(x->service, y->service);
  return c != 0 ? c : strcmp(x->id, y->id);
}

/* {"svc/id", ms left, ...}: split in place, sorted by service then id */
static void answer_leases(req_t *q, redisReply *rep) {
  om_lease_left_t *list;
  size_t n = 0;
  if (rep == NULL || rep->type != REDIS_REPLY_ARRAY) {
    q->lscb(q->ud, OM_EIO, NULL, 0);
    return;
  }
  list = malloc((rep->elements / 2 + 1) * sizeof *list);
  if (list == NULL) {
    q->lscb(q->ud, OM_ENOMEM, NULL, 0);
    return;
  }
  for (size_t i = 0; i + 1 < rep->elements; i += 2) {
    redisReply *m = rep->element[i], *left = rep->element[i + 1];
    char *slash;
    if (m->type != REDIS_REPLY_STRING || left->type != REDIS_REPLY_INTEGER ||
        (slash = strchr(m->str, '/')) == NULL)
      continue;
    *slash = '\0';
    if (!om__valid_name(m->str) || !om__valid_name(slash + 1))
      continue;
    list[n].service = m->str;
    list[n].id = slash + 1;
    list[n].expires_in_ms = left->integer > 0 ? (uint64_t)left->integer : 0;
    n++;
  }
  qsort(list, n, sizeof *list, lease_cmp);
  q->lscb(q->ud, 0, list, n);
  free(list);
}

/* HMGET rev ct body */
static void answer_config(rstore_t *r, req_t *q, redisReply *rep) {
  int internal = q->kind == RQ_CFGFETCH;
  rcfg_t *c = om__cfg_find(r, q->name);
  uint64_t rev;
  om_config_doc_t *doc;
  if (internal && c != NULL)
    c->fetching = 0;
  if (rep == NULL || rep->type != REDIS_REPLY_ARRAY || rep->elements != 3) {
    if (!internal) {
      if (c != NULL && c->doc != NULL)
        q->ccb(q->ud, 0, c->doc);
      else
        q->ccb(q->ud, r->ever_up ? OM_ENOTFOUND : OM_EIO, NULL);
    }
    return;
  }
  if (rep->element[0]->type == REDIS_REPLY_NIL) {
    if (!internal)
      q->ccb(q->ud, OM_ENOTFOUND, NULL);
    return;
  }
  if (om__reply_rev(rep->element[0], &rev) != 0 ||
      rep->element[1]->type != REDIS_REPLY_STRING ||
      rep->element[2]->type != REDIS_REPLY_STRING) {
    if (!internal)
      q->ccb(q->ud, OM_EIO, NULL);
    return;
  }
  doc = om_config_doc_new(q->name, rep->element[1]->str, rep->element[2]->str,
                          rep->element[2]->len, rev);
  if (doc == NULL) {
    if (!internal)
      q->ccb(q->ud, OM_ENOMEM, NULL);
    return;
  }
  if (!internal)
    q->ccb(q->ud, 0, doc);
  if (c == NULL)
    c = om__cfg_get(r, q->name);
  if (c != NULL) {
    om__cfg_set(r, c, doc);
    if (!r->base.closing && c->want > (c->doc != NULL ? c->doc->revision : 0))
      om__fetch_config(r, c);
  } else {
    om_config_doc_unref(doc);
  }
}

void om__on_reply(redisAsyncContext *ac, void *reply, void *privdata) {
  req_t *q = privdata;
  rstore_t *r = q->r;
  redisReply *rep = reply;
  if (rep != NULL && ac == r->cmd) {
    if (r->inflight > 0)
      r->inflight--;
    r->progress_ms = uv_now(r->loop);
  }
  if (r->base.closing) {
    free(q);
    return;
  }
  /* Scripts vanish when Redis restarts or SCRIPT FLUSH runs: EVAL once. */
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR && q->script >= 0 &&
      !q->retried && strncmp(rep->str, "NOSCRIPT", 8) == 0) {
    q->retried = 1;
    q->argv[0] = "EVAL";
    q->argvlen[0] = 4;
    q->argv[1] = om__redis_scripts[q->script];
    q->argvlen[1] = strlen(om__redis_scripts[q->script]);
    if (r->cmd != NULL &&
        redisAsyncCommandArgv(r->cmd, om__on_reply, q, q->argc, q->argv,
                              q->argvlen) == REDIS_OK) {
      r->inflight++;
      return;
    }
    rep = NULL;
  }
  switch (q->kind) {
  case RQ_PUT:
  case RQ_RENEW:
  case RQ_DELETE:
  case RQ_CFGPUT:
    answer_write(r, q, rep);
    break;
  case RQ_SNAP:
  case RQ_FETCH:
    answer_snapshot(r, q, rep);
    break;
  case RQ_LIST:
    answer_list(r, q, rep);
    break;
  case RQ_LEASES:
    answer_leases(q, rep);
    break;
  case RQ_CFGGET:
  case RQ_CFGFETCH:
    answer_config(r, q, rep);
    break;
  case RQ_RESYNC:
    if (rep != NULL)
      on_resync(r, rep);
    break;
  case RQ_EPOCH:
    if (rep != NULL)
      on_epoch(r, rep);
    break;
  case RQ_SELECT:
    if (rep != NULL)
      on_select(r, rep);
    break;
  case RQ_SWEEP:
    r->sweeping = 0;
    if (rep != NULL && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0)
      r->st.expiries += (uint64_t)rep->integer;
    else if (rep != NULL && rep->type == REDIS_REPLY_ERROR)
      om_log(OM_LOG_ERROR, "store_error", "store", "redis", "error", rep->str,
             NULL);
    break;
  case RQ_COLLECT: /* what it removed comes back on the channel */
    r->collecting = 0;
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR)
      om_log(OM_LOG_ERROR, "store_error", "store", "redis", "error", rep->str,
             NULL);
    break;
  case RQ_TOUCH:
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR)
      om_log(OM_LOG_ERROR, "store_error", "store", "redis", "error", rep->str,
             NULL);
    break;
  default:
    break;
  }
  free(q);
}

/* ---- the sweep timer: leases, the watchdog, deferred resyncs ---- */

void om__on_sweep(uv_timer_t *t) {
  rstore_t *r = t->data;
  char fl[24];
  if (r->base.closing)
    return;
  if (r->state != S_DOWN && r->inflight > 0 &&
      uv_now(r->loop) - r->progress_ms > r->opts.command_timeout_ms) {
    om__session_fail(r, "redis stopped answering");
    return;
  }
  /* a connect that neither completes nor fails (a silent network) */
  if ((r->state == S_CONNECTING || r->state == S_SYNCING) &&
      uv_now(r->loop) - r->session_ms > r->opts.command_timeout_ms) {
    om__session_fail(r, "connect timed out");
    return;
  }
  if (r->state != S_UP)
    return;
  if (r->need_resync)
    om__start_resync(r);
  if (!r->sweeping) {
    const char *keys[3] = {r->k_rev, r->k_services, r->k_leases};
    const char *args[4];
    req_t *q;
    om__floor_str(r, fl);
    args[0] = fl, args[1] = r->chan, args[2] = r->prefix, args[3] = SWEEP_BATCH;
    q = om__req_script(r, RQ_SWEEP, SC_SWEEP, 3, keys, 4, args, NULL);
    if (q != NULL && om__req_send(r, q) == 0)
      r->sweeping = 1;
  }
}
