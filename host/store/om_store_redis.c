/*
 * om_store_redis.c: the Redis store (om_store_redis.h, docs/STORE.md).
 *
 * Two hiredis async connections on the caller's libuv loop: "cmd" runs the
 * scripts and reads, "sub" is SUBSCRIBEd to the change channel. Both are
 * one session: when either fails, both are dropped and reconnected after a
 * backoff, and the session is ready again only once it is subscribed, has
 * checked the epoch and has listed every service (anything published while
 * it was away is then fetched).
 *
 * Keys (P is the prefix):
 *   P rev            the last revision issued (services and documents)
 *   P services       hash service -> its revision
 *   P i:SERVICE      hash id -> "TTL_MS JSON" (the registration body)
 *   P leases         sorted set "service/id" -> deadline (Redis ms clock)
 *   P c:NAME         hash ct, body, rev of a document
 *   P configs        hash name -> revision
 *   P epoch          random id of this Redis's data set
 *   P watched        sorted set service -> deadline: empty services a
 *                    plane's watchers hold, not to be collected
 *                    (om_store_collect_empty)
 * Channel P events@DB carries "REV PREV OP SERVICE ARGS": OP p (put: id
 * and value), r (remove: ids, maybe none: a new revision of the same
 * membership), g (collected: the empty service is gone) or c (a document
 * changed: fetch it). PREV is the service's
 * revision before the change, so a replica holding PREV applies the change
 * in place (no fetch) and any other replica fetches the whole service.
 *
 * Every script issues revisions with bump() below: the caller passes a
 * floor (max(wall clock us, highest revision seen + 1)), so a Redis that
 * lost P rev still issues revisions above anything a watcher has seen.
 *
 * Files: this one holds the helpers, the replica, requests, the contract
 * and construction; the connection (session, reconnect) and the replies
 * are in om_store_redis_session.c, the scripts and SHA-1 in
 * om_store_redis_scripts.c; om_store_redis_internal.h is what they share.
 */
#include "om_store_redis_internal.h"

/* ------------------------------------------------------------------ */
/* small helpers */

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  return d != NULL ? memcpy(d, s, n) : NULL;
}

/* Names read back from Redis are checked as the front checks callers'. */
int om__valid_name(const char *s) {
  return s != NULL && om_valid_name(s, strnlen(s, OM_NAME_MAX + 1));
}

uint64_t om__realtime_us(rstore_t *r) {
  struct timespec ts;
  if (r->opts.realtime_us != NULL)
    return r->opts.realtime_us(r->opts.clock_ud);
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0 || ts.tv_sec < 0)
    return 0;
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void om__see(rstore_t *r, uint64_t rev) {
  if (rev > r->max_seen)
    r->max_seen = rev;
}

/* The floor of the next revision, as a decimal string. */
void om__floor_str(rstore_t *r, char out[24]) {
  uint64_t f = om__realtime_us(r);
  if (r->max_seen + 1 > f)
    f = r->max_seen + 1;
  snprintf(out, 24, "%" PRIu64, f);
}

/* Parse a decimal revision (a Redis string or integer reply). */
static int parse_rev(const char *s, size_t n, uint64_t *out) {
  uint64_t v = 0;
  if (n == 0 || n > 19)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  *out = v;
  return 0;
}

int om__reply_rev(const redisReply *e, uint64_t *out) {
  if (e == NULL)
    return -1;
  if (e->type == REDIS_REPLY_INTEGER && e->integer >= 0) {
    *out = (uint64_t)e->integer;
    return 0;
  }
  if (e->type == REDIS_REPLY_STRING)
    return parse_rev(e->str, e->len, out);
  if (e->type == REDIS_REPLY_NIL) {
    *out = 0;
    return 0;
  }
  return -1;
}

/* ---- the replica: services and documents by name ---- */

/*
 * Services and documents are arrays of pointers sorted by name (each
 * struct's first member): pos (binary search), find, and get (find, or
 * insert an empty entry; NULL when memory runs out), for each, generated
 * from one definition (om__svc_find, om__cfg_get, ...).
 */
#define NAMED_TABLE(pre, type, arr, n, cap)                                    \
  static size_t pre##_pos(rstore_t *r, const char *name, int *found) {         \
    size_t lo = 0, hi = r->n;                                                  \
    *found = 0;                                                                \
    while (lo < hi) {                                                          \
      size_t mid = lo + (hi - lo) / 2;                                         \
      int c = strcmp(r->arr[mid]->name, name);                                 \
      if (c == 0) {                                                            \
        *found = 1;                                                            \
        return mid;                                                            \
      }                                                                        \
      if (c < 0)                                                               \
        lo = mid + 1;                                                          \
      else                                                                     \
        hi = mid;                                                              \
    }                                                                          \
    return lo;                                                                 \
  }                                                                            \
  type *om__##pre##_find(rstore_t *r, const char *name) {                      \
    int found;                                                                 \
    size_t i = pre##_pos(r, name, &found);                                     \
    return found ? r->arr[i] : NULL;                                           \
  }                                                                            \
  type *om__##pre##_get(rstore_t *r, const char *name) {                       \
    int found;                                                                 \
    size_t i = pre##_pos(r, name, &found);                                     \
    type *e, **a;                                                              \
    if (found)                                                                 \
      return r->arr[i];                                                        \
    a = om__store_grow(r->arr, &r->cap, r->n + 1, sizeof *a);                  \
    if (a == NULL)                                                             \
      return NULL;                                                             \
    r->arr = a;                                                                \
    e = calloc(1, sizeof *e);                                                  \
    if (e == NULL || (e->name = dup_str(name)) == NULL) {                      \
      free(e);                                                                 \
      return NULL;                                                             \
    }                                                                          \
    memmove(a + i + 1, a + i, (r->n - i) * sizeof *a);                         \
    a[i] = e;                                                                  \
    r->n++;                                                                    \
    return e;                                                                  \
  }

NAMED_TABLE(svc, rsvc_t, svcs, n_svcs, cap_svcs)
NAMED_TABLE(cfg, rcfg_t, cfgs, n_cfgs, cap_cfgs)

/* ---- delivery ---- */

/*
 * Make snap (one reference, taken over) the replica's state of svc if it
 * is newer, and deliver it: the one place a service moves forward, so no
 * subscriber ever sees an older revision after a newer one.
 */
void om__replica_set(rstore_t *r, rsvc_t *svc, om_snapshot_t *snap) {
  uint64_t rev = om_snapshot_revision(snap);
  om__see(r, rev);
  if (svc->snap != NULL && rev <= svc->rev) {
    om_snapshot_unref(snap);
    return;
  }
  om_snapshot_unref(svc->snap);
  svc->snap = snap;
  svc->rev = rev;
  svc->gone = 0; /* back, if it was collected */
  if (om_snapshot_count(snap) > 0)
    svc->empty_ms = 0;
  else if (svc->empty_ms == 0)
    svc->empty_ms = uv_now(r->loop) + 1;
  om__store_deliver(&r->base, om__store_stamp(&r->base), snap);
}

void om__cfg_set(rstore_t *r, rcfg_t *c, om_config_doc_t *doc) {
  om__see(r, doc->revision);
  if (c->doc != NULL && doc->revision <= c->doc->revision) {
    om_config_doc_unref(doc);
    return;
  }
  om_config_doc_unref(c->doc);
  c->doc = doc;
  om__store_deliver_config(&r->base, om__store_stamp(&r->base), doc);
}

/* ------------------------------------------------------------------ */
/* requests */

/*
 * A request whose command is argv[0..argc) (copied into the request's one
 * allocation). For a script, argv starts "EVALSHA sha numkeys".
 */
req_t *om__req_new(rstore_t *r, int kind, int script, int argc,
                   const char *const *argv, const size_t *lens) {
  size_t total =
      sizeof(req_t) + (size_t)argc * (sizeof(char *) + sizeof(size_t));
  req_t *q;
  char *p;
  for (int i = 0; i < argc; i++)
    total += lens[i] + 1;
  q = malloc(total);
  if (q == NULL)
    return NULL;
  memset(q, 0, sizeof *q);
  q->r = r;
  q->kind = kind;
  q->script = script;
  q->argc = argc;
  q->argv = (const char **)(q + 1);
  q->argvlen = (size_t *)(q->argv + argc);
  p = (char *)(q->argvlen + argc);
  for (int i = 0; i < argc; i++) {
    memcpy(p, argv[i], lens[i]);
    p[lens[i]] = '\0';
    q->argv[i] = p;
    q->argvlen[i] = lens[i];
    p += lens[i] + 1;
  }
  return q;
}

/* A script request: EVALSHA sha nkeys keys... args... (any number: the
 * collect script takes thousands). NULL when out of memory. */
req_t *om__req_script(rstore_t *r, int kind, int script, int nkeys,
                      const char *const *keys, int nargs,
                      const char *const *args, const size_t *arglens) {
  const char *small_argv[16], **argv = small_argv;
  size_t small_lens[16], *lens = small_lens,
                         total = 3u + (size_t)nkeys + (size_t)nargs;
  char nk[4];
  int n = 0;
  req_t *q;
  if (total > 16) {
    argv = malloc(total * sizeof *argv);
    lens = malloc(total * sizeof *lens);
    if (argv == NULL || lens == NULL) {
      free(argv);
      free(lens);
      return NULL;
    }
  }
  snprintf(nk, sizeof nk, "%d", nkeys);
  argv[n] = "EVALSHA", lens[n++] = 7;
  argv[n] = r->sha[script], lens[n++] = 40;
  argv[n] = nk, lens[n++] = strlen(nk);
  for (int i = 0; i < nkeys; i++)
    argv[n] = keys[i], lens[n++] = strlen(keys[i]);
  for (int i = 0; i < nargs; i++) {
    argv[n] = args[i];
    lens[n++] = arglens != NULL && arglens[i] != SIZE_MAX ? arglens[i]
                                                          : strlen(args[i]);
  }
  q = om__req_new(r, kind, script, n, argv, lens);
  if (argv != small_argv) {
    free(argv);
    free(lens);
  }
  return q;
}

int om__req_send(rstore_t *r, req_t *q) {
  if (r->cmd == NULL || !r->cmd_ok ||
      redisAsyncCommandArgv(r->cmd, om__on_reply, q, q->argc, q->argv,
                            q->argvlen) != REDIS_OK) {
    free(q);
    return OM_EIO;
  }
  if (r->inflight++ == 0)
    r->progress_ms = uv_now(r->loop);
  return 0;
}

/* ---- snapshots from replies ---- */

/*
 * The snapshot of service at rev from HGETALL pairs e[from..n) (id,
 * "TTL JSON"). Entries that fail to decode are skipped and logged: Redis
 * holds only what a control plane validated, so that means tampering.
 */
int om__build_snapshot(const char *service, uint64_t rev, redisReply **e,
                       size_t n, size_t from, om_snapshot_t **out) {
  size_t cnt = (n - from) / 2, k = 0;
  om_instance_t *ins = calloc(cnt != 0 ? cnt : 1, sizeof *ins);
  int rc = 0;
  if (ins == NULL)
    return OM_ENOMEM;
  for (size_t i = from; i + 1 < n; i += 2) {
    const redisReply *id = e[i], *v = e[i + 1];
    const char *json;
    om_json_error_t err;
    if (id->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
      continue;
    json = memchr(v->str, ' ', v->len);
    if (json == NULL) {
      om_log(OM_LOG_WARN, "store_bad_entry", "service", service, "id", id->str,
             NULL);
      continue;
    }
    json++;
    memset(&err, 0, sizeof err);
    rc = om_instance_from_json(json, v->len - (size_t)(json - v->str), id->str,
                               &ins[k], &err);
    if (rc == OM_ENOMEM)
      break;
    if (rc != 0) {
      om_log(OM_LOG_WARN, "store_bad_entry", "service", service, "id", id->str,
             "error", err.text, NULL);
      rc = 0;
      continue;
    }
    k++;
  }
  if (rc == 0)
    rc = om_snapshot_new(service, rev, ins, k, out, NULL, NULL, NULL);
  for (size_t i = 0; i < k; i++)
    om_instance_clear(&ins[i]);
  free(ins);
  return rc;
}

/* ---- fetching into the replica ---- */

void om__fetch_service(rstore_t *r, rsvc_t *svc) {
  const char *keys[2];
  char ihash[PREFIX_MAX + OM_NAME_MAX + 4], known[24];
  const char *args[2];
  req_t *q;
  if (svc->fetching || r->cmd == NULL || !r->cmd_ok)
    return;
  snprintf(ihash, sizeof ihash, "%si:%s", r->prefix, svc->name);
  snprintf(known, sizeof known, "%" PRIu64, svc->rev);
  keys[0] = r->k_services, keys[1] = ihash;
  args[0] = svc->name, args[1] = svc->snap != NULL ? known : "";
  q = om__req_script(r, RQ_FETCH, SC_SNAP, 2, keys, 2, args, NULL);
  if (q == NULL) {
    r->need_resync = 1;
    return;
  }
  snprintf(q->name, sizeof q->name, "%s", svc->name);
  if (om__req_send(r, q) != 0)
    return;
  svc->fetching = 1;
}

void om__fetch_config(rstore_t *r, rcfg_t *c) {
  char key[PREFIX_MAX + OM_NAME_MAX + 4];
  const char *argv[5];
  size_t lens[5];
  req_t *q;
  if (c->fetching || r->cmd == NULL || !r->cmd_ok)
    return;
  snprintf(key, sizeof key, "%sc:%s", r->prefix, c->name);
  argv[0] = "HMGET", argv[1] = key, argv[2] = "rev", argv[3] = "ct",
  argv[4] = "body";
  for (int i = 0; i < 5; i++)
    lens[i] = strlen(argv[i]);
  q = om__req_new(r, RQ_CFGFETCH, -1, 5, argv, lens);
  if (q == NULL) {
    r->need_resync = 1;
    return;
  }
  snprintf(q->name, sizeof q->name, "%s", c->name);
  if (om__req_send(r, q) != 0)
    return;
  c->fetching = 1;
}

void om__start_resync(rstore_t *r) {
  const char *keys[2] = {r->k_services, r->k_configs};
  const char *args[1] = {r->prefix};
  req_t *q = om__req_script(r, RQ_RESYNC, SC_LIST, 2, keys, 1, args, NULL);
  if (q == NULL) {
    r->need_resync = 1;
    return;
  }
  r->need_resync = 0;
  (void)om__req_send(r, q);
}

/* ---- change messages ---- */

/* Apply "REV PREV OP NAME ARGS" from the channel. */
void om__on_change_msg(rstore_t *r, const char *msg, size_t len) {
  char buf[OM_NAME_MAX + 1];
  const char *p = msg, *end = msg + len, *sp;
  uint64_t rev, prev;
  char op;
  rsvc_t *svc;
  om_snapshot_t *snap = NULL;
  int rc;
  /* REV */
  sp = memchr(p, ' ', (size_t)(end - p));
  if (sp == NULL || parse_rev(p, (size_t)(sp - p), &rev) != 0)
    goto bad;
  p = sp + 1;
  sp = memchr(p, ' ', (size_t)(end - p));
  if (sp == NULL || parse_rev(p, (size_t)(sp - p), &prev) != 0)
    goto bad;
  p = sp + 1;
  if (end - p < 3 || p[1] != ' ')
    goto bad;
  op = p[0];
  p += 2;
  sp = memchr(p, ' ', (size_t)(end - p));
  if (sp == NULL)
    sp = end;
  if ((size_t)(sp - p) > OM_NAME_MAX || !om_valid_name(p, (size_t)(sp - p)))
    goto bad;
  memcpy(buf, p, (size_t)(sp - p));
  buf[sp - p] = '\0';
  p = sp < end ? sp + 1 : end;
  om__see(r, rev);
  if (op == 'c') {
    rcfg_t *c = om__cfg_get(r, buf);
    if (c == NULL) {
      r->need_resync = 1;
      return;
    }
    if (c->doc != NULL && rev <= c->doc->revision)
      return;
    if (rev > c->want)
      c->want = rev;
    om__fetch_config(r, c);
    return;
  }
  if (op == 'g') { /* collected (by any plane) at rev: named at the next
                      om_store_collect_empty, unless it comes back first */
    svc = om__svc_find(r, buf);
    if (svc != NULL && svc->snap != NULL && svc->rev <= rev)
      svc->gone = 1;
    return;
  }
  /* p: put; d: deleted; x: expired; r: removed (a resync's touch) */
  if (op != 'p' && op != 'd' && op != 'x' && op != 'r')
    goto bad;
  svc = om__svc_get(r, buf);
  if (svc == NULL) {
    r->need_resync = 1;
    return;
  }
  if (svc->snap != NULL && rev <= svc->rev)
    return; /* already in hand (a read fetched it) */
  if (svc->fetching || (svc->snap != NULL ? svc->rev != prev : prev != 0)) {
    /* We missed something: the whole service from Redis. */
    if (rev > svc->want)
      svc->want = rev;
    om__fetch_service(r, svc);
    return;
  }
  if (op == 'p') {
    om_instance_t in;
    om_json_error_t err;
    const char *id = p, *json;
    sp = memchr(p, ' ', (size_t)(end - p));
    json = sp != NULL ? memchr(sp + 1, ' ', (size_t)(end - sp - 1)) : NULL;
    if (sp == NULL || json == NULL || (size_t)(sp - id) > OM_NAME_MAX)
      goto bad;
    {
      char idb[OM_NAME_MAX + 1];
      memcpy(idb, id, (size_t)(sp - id));
      idb[sp - id] = '\0';
      json++;
      memset(&err, 0, sizeof err);
      rc = om_instance_from_json(json, (size_t)(end - json), idb, &in, &err);
    }
    if (rc != 0)
      goto refetch;
    if (svc->snap != NULL)
      rc = om_snapshot_edit(svc->snap, rev, &in, 1, NULL, 0, &snap, NULL, NULL,
                            NULL);
    else
      rc = om_snapshot_new(svc->name, rev, &in, 1, &snap, NULL, NULL, NULL);
    om_instance_clear(&in);
  } else {
    /* ids separated by single spaces; at most a batch of them */
    const char *ids[1024];
    char *copy = NULL;
    size_t n = 0, rl = (size_t)(end - p);
    if (rl > 0) {
      copy = malloc(rl + 1);
      if (copy == NULL)
        goto refetch;
      memcpy(copy, p, rl);
      copy[rl] = '\0';
      for (char *t = copy; t != NULL && n < 1024;) {
        char *nx = strchr(t, ' ');
        if (nx != NULL)
          *nx++ = '\0';
        if (*t != '\0')
          ids[n++] = t;
        t = nx;
      }
    }
    if (svc->snap != NULL)
      rc = om_snapshot_edit(svc->snap, rev, NULL, 0, ids, n, &snap, NULL, NULL,
                            NULL);
    else
      rc = om_snapshot_new(svc->name, rev, NULL, 0, &snap, NULL, NULL, NULL);
    free(copy);
  }
  if (rc != 0)
    goto refetch;
  r->st.last_removal = op == 'd'   ? OM_STORE_DELETED
                       : op == 'x' ? OM_STORE_EXPIRED
                                   : OM_STORE_NOCHANGE;
  om__replica_set(r, svc, snap);
  r->st.last_removal = OM_STORE_NOCHANGE;
  return;
refetch:
  if (rev > svc->want)
    svc->want = rev;
  om__fetch_service(r, svc);
  return;
bad:
  om_log(OM_LOG_WARN, "store_bad_message", "store", "redis", NULL);
  r->need_resync = 1;
}

/* ------------------------------------------------------------------ */
/* the contract */

static int r_put_instance(om_store_t *s, const char *service,
                          const om_instance_t *in, om_store_write_cb cb,
                          void *ud) {
  rstore_t *r = (rstore_t *)s;
  om_instance_t sorted;
  char *json = NULL, *value, ttl[24], fl[24];
  char ihash[PREFIX_MAX + OM_NAME_MAX + 4];
  size_t jl = 0, tl, vl;
  const char *keys[4], *args[7];
  size_t lens[7];
  req_t *q;
  int rc;
  if (r->state != S_UP) {
    if (cb != NULL)
      cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
    return 0;
  }
  /* The stored value is canonical (metadata sorted) so that an identical
   * renewal compares equal byte for byte inside the script. */
  rc = om_instance_copy(&sorted, in);
  if (rc != 0)
    return rc;
  rc = om_instance_to_json(&sorted, &json, &jl);
  om_instance_clear(&sorted);
  if (rc != 0)
    return rc;
  tl = (size_t)snprintf(ttl, sizeof ttl, "%" PRIu64, in->ttl_ms);
  vl = tl + 1 + jl;
  value = malloc(vl + 1);
  if (value == NULL) {
    free(json);
    return OM_ENOMEM;
  }
  memcpy(value, ttl, tl);
  value[tl] = ' ';
  memcpy(value + tl + 1, json, jl);
  value[vl] = '\0';
  free(json);
  snprintf(ihash, sizeof ihash, "%si:%s", r->prefix, service);
  om__floor_str(r, fl);
  keys[0] = r->k_rev, keys[1] = r->k_services, keys[2] = ihash,
  keys[3] = r->k_leases;
  args[0] = service, args[1] = in->id, args[2] = value, args[3] = ttl,
  args[4] = fl, args[5] = r->chan, args[6] = KEY_GRACE_MS;
  for (int i = 0; i < 7; i++)
    lens[i] = SIZE_MAX;
  lens[2] = vl;
  q = om__req_script(r, RQ_PUT, SC_PUT, 4, keys, 7, args, lens);
  free(value);
  if (q == NULL)
    return OM_ENOMEM;
  q->wcb = cb;
  q->ud = ud;
  if (om__req_send(r, q) != 0 && cb != NULL)
    cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
  return 0;
}

static int instance_op(rstore_t *r, int kind, const char *service,
                       const char *id, om_store_write_cb cb, void *ud) {
  char ihash[PREFIX_MAX + OM_NAME_MAX + 4], fl[24];
  const char *keys[4], *args[4];
  req_t *q;
  if (r->state != S_UP) {
    if (cb != NULL)
      cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
    return 0;
  }
  snprintf(ihash, sizeof ihash, "%si:%s", r->prefix, service);
  keys[0] = r->k_rev, keys[1] = r->k_services, keys[2] = ihash,
  keys[3] = r->k_leases;
  if (kind == RQ_RENEW) {
    args[0] = service, args[1] = id, args[2] = KEY_GRACE_MS;
    q = om__req_script(r, kind, SC_RENEW, 4, keys, 3, args, NULL);
  } else {
    om__floor_str(r, fl);
    args[0] = service, args[1] = id, args[2] = fl, args[3] = r->chan;
    q = om__req_script(r, kind, SC_DELETE, 4, keys, 4, args, NULL);
  }
  if (q == NULL)
    return OM_ENOMEM;
  q->wcb = cb;
  q->ud = ud;
  if (om__req_send(r, q) != 0 && cb != NULL)
    cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
  return 0;
}

static int r_renew(om_store_t *s, const char *service, const char *id,
                   om_store_write_cb cb, void *ud) {
  return instance_op((rstore_t *)s, RQ_RENEW, service, id, cb, ud);
}

static int r_delete_instance(om_store_t *s, const char *service, const char *id,
                             om_store_write_cb cb, void *ud) {
  return instance_op((rstore_t *)s, RQ_DELETE, service, id, cb, ud);
}

static int r_snapshot(om_store_t *s, const char *service,
                      om_store_snapshot_cb cb, void *ud) {
  rstore_t *r = (rstore_t *)s;
  char ihash[PREFIX_MAX + OM_NAME_MAX + 4], known[24];
  const char *keys[2], *args[2];
  rsvc_t *svc;
  req_t *q;
  if (r->state != S_UP) {
    om__serve_snapshot(r, service, cb, ud);
    return 0;
  }
  svc = om__svc_find(r, service);
  snprintf(ihash, sizeof ihash, "%si:%s", r->prefix, service);
  snprintf(known, sizeof known, "%" PRIu64, svc != NULL ? svc->rev : 0);
  keys[0] = r->k_services, keys[1] = ihash;
  args[0] = service, args[1] = svc != NULL && svc->snap != NULL ? known : "";
  q = om__req_script(r, RQ_SNAP, SC_SNAP, 2, keys, 2, args, NULL);
  if (q == NULL)
    return OM_ENOMEM;
  q->scb = cb;
  q->ud = ud;
  snprintf(q->name, sizeof q->name, "%s", service);
  if (om__req_send(r, q) != 0)
    om__serve_snapshot(r, service, cb, ud);
  return 0;
}

static void serve_list(rstore_t *r, om_store_list_cb cb, void *ud) {
  om_service_rev_t *list =
      malloc((r->n_svcs != 0 ? r->n_svcs : 1) * sizeof *list);
  size_t n = 0;
  if (list == NULL) {
    cb(ud, OM_ENOMEM, NULL, 0);
    return;
  }
  for (size_t i = 0; i < r->n_svcs; i++) {
    if (r->svcs[i]->snap == NULL)
      continue;
    list[n].service = r->svcs[i]->name;
    list[n].revision = r->svcs[i]->rev;
    list[n].instances = om_snapshot_count(r->svcs[i]->snap);
    n++;
  }
  if (!r->ever_up)
    cb(ud, OM_EIO, NULL, 0);
  else
    cb(ud, 0, list, n);
  free(list);
}

static int r_list_services(om_store_t *s, om_store_list_cb cb, void *ud) {
  rstore_t *r = (rstore_t *)s;
  const char *keys[2] = {r->k_services, r->k_configs};
  const char *args[1] = {r->prefix};
  req_t *q;
  if (r->state != S_UP) {
    serve_list(r, cb, ud);
    return 0;
  }
  q = om__req_script(r, RQ_LIST, SC_LIST, 2, keys, 1, args, NULL);
  if (q == NULL)
    return OM_ENOMEM;
  q->lcb = cb;
  q->ud = ud;
  if (om__req_send(r, q) != 0)
    serve_list(r, cb, ud);
  return 0;
}

static int r_leases(om_store_t *s, om_store_leases_cb cb, void *ud) {
  rstore_t *r = (rstore_t *)s;
  const char *keys[1] = {r->k_leases};
  req_t *q;
  if (r->state != S_UP) {
    cb(ud, OM_EIO, NULL, 0);
    return 0;
  }
  q = om__req_script(r, RQ_LEASES, SC_LEASES, 1, keys, 0, NULL, NULL);
  if (q == NULL)
    return OM_ENOMEM;
  q->lscb = cb;
  q->ud = ud;
  if (om__req_send(r, q) != 0)
    cb(ud, OM_EIO, NULL, 0);
  return 0;
}

static int r_config_put(om_store_t *s, const char *name,
                        const char *content_type, const char *body, size_t len,
                        om_store_write_cb cb, void *ud) {
  rstore_t *r = (rstore_t *)s;
  char key[PREFIX_MAX + OM_NAME_MAX + 4], fl[24];
  const char *keys[3], *args[5];
  size_t lens[5];
  req_t *q;
  if (len > r->opts.max_config_bytes)
    return OM_ETOOBIG;
  if (r->state != S_UP) {
    if (cb != NULL)
      cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
    return 0;
  }
  snprintf(key, sizeof key, "%sc:%s", r->prefix, name);
  om__floor_str(r, fl);
  keys[0] = r->k_rev, keys[1] = r->k_configs, keys[2] = key;
  args[0] = name, args[1] = content_type, args[2] = body != NULL ? body : "",
  args[3] = fl, args[4] = r->chan;
  for (int i = 0; i < 5; i++)
    lens[i] = SIZE_MAX;
  lens[2] = len;
  q = om__req_script(r, RQ_CFGPUT, SC_CFGPUT, 3, keys, 5, args, lens);
  if (q == NULL)
    return OM_ENOMEM;
  q->wcb = cb;
  q->ud = ud;
  if (om__req_send(r, q) != 0 && cb != NULL)
    cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
  return 0;
}

static int r_config_get(om_store_t *s, const char *name, om_store_config_cb cb,
                        void *ud) {
  rstore_t *r = (rstore_t *)s;
  char key[PREFIX_MAX + OM_NAME_MAX + 4];
  const char *argv[5];
  size_t lens[5];
  rcfg_t *c;
  req_t *q;
  if (r->state != S_UP) {
    c = om__cfg_find(r, name);
    if (c != NULL && c->doc != NULL)
      cb(ud, 0, c->doc);
    else
      cb(ud, r->ever_up ? OM_ENOTFOUND : OM_EIO, NULL);
    return 0;
  }
  snprintf(key, sizeof key, "%sc:%s", r->prefix, name);
  argv[0] = "HMGET", argv[1] = key, argv[2] = "rev", argv[3] = "ct",
  argv[4] = "body";
  for (int i = 0; i < 5; i++)
    lens[i] = strlen(argv[i]);
  q = om__req_new(r, RQ_CFGGET, -1, 5, argv, lens);
  if (q == NULL)
    return OM_ENOMEM;
  q->ccb = cb;
  q->ud = ud;
  snprintf(q->name, sizeof q->name, "%s", name);
  if (om__req_send(r, q) != 0) {
    c = om__cfg_find(r, name);
    if (c != NULL && c->doc != NULL)
      cb(ud, 0, c->doc);
    else
      cb(ud, OM_EIO, NULL);
  }
  return 0;
}

static void r_status(om_store_t *s, om_store_status_t *out) {
  rstore_t *r = (rstore_t *)s;
  *out = r->st;
  out->stale = r->state != S_UP;
  out->services = 0;
  out->instances = 0;
  for (size_t i = 0; i < r->n_svcs; i++)
    if (r->svcs[i]->snap != NULL) {
      out->services++;
      out->instances += om_snapshot_count(r->svcs[i]->snap);
    }
}

static void free_all(rstore_t *r) {
  for (size_t i = 0; i < r->n_svcs; i++) {
    om_snapshot_unref(r->svcs[i]->snap);
    free(r->svcs[i]->name);
    free(r->svcs[i]);
  }
  for (size_t i = 0; i < r->n_cfgs; i++) {
    om_config_doc_unref(r->cfgs[i]->doc);
    free(r->cfgs[i]->name);
    free(r->cfgs[i]);
  }
  om__subs_free(&r->base.subs);
  free(r->svcs);
  free(r->cfgs);
  free(r);
}

/* One of the handles (or the pending name lookup) is done with r; the last
 * one frees it once the store is closing. */
void om__release(rstore_t *r) {
  void (*done)(void *);
  void *ud;
  if (--r->handles_open > 0 || !r->base.closing)
    return;
  done = r->done;
  ud = r->done_ud;
  free_all(r);
  if (done != NULL)
    done(ud);
}

static void on_handle_closed(uv_handle_t *h) {
  om__release(h->data);
}

static void r_close(om_store_t *s, void (*done)(void *ud), void *ud) {
  rstore_t *r = (rstore_t *)s;
  r->done = done;
  r->done_ud = ud;
  om__drop_connections(r);
  if (r->resolving) /* its callback still runs (UV_ECANCELED or done) */
    uv_cancel((uv_req_t *)&r->gai);
  uv_timer_stop(&r->sweep);
  uv_timer_stop(&r->retry);
  uv_close((uv_handle_t *)&r->sweep, on_handle_closed);
  uv_close((uv_handle_t *)&r->retry, on_handle_closed);
}

int om_store_redis_ready(const om_store_t *s) {
  return s != NULL && s->ops == &redis_ops &&
         ((const rstore_t *)s)->state == S_UP;
}

static void on_wait_expired(uv_timer_t *t) {
  *(int *)t->data = 1;
}

int om_store_redis_wait_ready(uv_loop_t *loop, const om_store_t *s,
                              uint64_t wait_ms) {
  uv_timer_t t;
  int expired = 0;
  uv_timer_init(loop, &t);
  t.data = &expired;
  uv_timer_start(&t, on_wait_expired, wait_ms, 0);
  while (!om_store_redis_ready(s) && !expired)
    uv_run(loop, UV_RUN_ONCE);
  uv_timer_stop(&t);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT); /* the timer's close, before t goes away */
  return om_store_redis_ready(s) ? 0 : OM_EDEADLINE;
}

/*
 * Propose the empty services this replica has seen unchanged for idle_ms
 * (and no watcher of this plane holds) to the collect script, with the
 * held ones marked so that no other plane collects them either. At most
 * COLLECT_BATCH of each per call; the rest wait for the next.
 */
#define COLLECT_BATCH 1000
#define COLLECT_FIRST_HOLD_MS 60000

static void propose_collect(rstore_t *r, uint64_t idle_ms,
                            int (*keep)(void *ud, const char *service),
                            void *ud, uint64_t now) {
  const char *keys[2] = {r->k_services, r->k_watched};
  const char **args;
  char(*revs)[24], hold[24], nh[24];
  size_t n_held = 0, n_cand = 0, k = 4, cap = 4 + 3 * COLLECT_BATCH;
  uint64_t hold_ms = idle_ms;
  req_t *q;
  /* A held mark lasts idle_ms (a service is collected after idle_ms with
   * no instance and no watcher on any plane) and outlives this plane's
   * next call: three of its intervals, and before the interval is known
   * (the first call) a minute. */
  if (r->collect_ms == 0 && hold_ms < COLLECT_FIRST_HOLD_MS)
    hold_ms = COLLECT_FIRST_HOLD_MS;
  if (r->collect_ms != 0 && 3 * (now - r->collect_ms) > hold_ms)
    hold_ms = 3 * (now - r->collect_ms);
  args = malloc(cap * sizeof *args);
  revs = malloc(COLLECT_BATCH * sizeof *revs);
  if (args == NULL || revs == NULL)
    goto out;
  /* held names first (ARGV 5..), candidates after them: two passes */
  for (size_t i = 0; i < r->n_svcs && n_held < COLLECT_BATCH; i++) {
    rsvc_t *svc = r->svcs[i];
    if (svc->snap != NULL && svc->empty_ms != 0 && !svc->gone && keep != NULL &&
        keep(ud, svc->name))
      args[k + n_held++] = svc->name;
  }
  k += n_held;
  for (size_t i = 0; i < r->n_svcs && n_cand < COLLECT_BATCH; i++) {
    rsvc_t *svc = r->svcs[i];
    if (svc->snap == NULL || svc->empty_ms == 0 || svc->gone || svc->fetching ||
        now + 1 - svc->empty_ms < idle_ms ||
        (keep != NULL && keep(ud, svc->name)))
      continue;
    snprintf(revs[n_cand], sizeof revs[n_cand], "%" PRIu64, svc->rev);
    args[k++] = svc->name;
    args[k++] = revs[n_cand++];
  }
  if (n_cand == 0 && n_held == 0)
    goto out;
  snprintf(hold, sizeof hold, "%" PRIu64, hold_ms);
  snprintf(nh, sizeof nh, "%zu", n_held);
  args[0] = r->chan, args[1] = r->prefix, args[2] = hold, args[3] = nh;
  q = om__req_script(r, RQ_COLLECT, SC_COLLECT, 2, keys, (int)k, args, NULL);
  if (q != NULL && om__req_send(r, q) == 0)
    r->collecting = 1;
out:
  free(args);
  free(revs);
}

/*
 * The services collected in Redis since the last call (by this plane's
 * proposals or another's, told on the channel) leave the replica here,
 * named to gone in name order (the table is sorted), so the caller drops
 * them in the same turn; then the next proposal goes out. A service that
 * came back in between is not named (its new snapshot cleared the mark).
 */
static int r_collect_empty(om_store_t *s, uint64_t idle_ms,
                           int (*keep)(void *ud, const char *service),
                           void (*gone)(void *ud, const char *service),
                           void *ud, size_t *n) {
  rstore_t *r = (rstore_t *)s;
  uint64_t now = uv_now(r->loop);
  size_t j = 0, removed = 0;
  for (size_t i = 0; i < r->n_svcs; i++) {
    rsvc_t *svc = r->svcs[i];
    if (svc->gone && !svc->fetching) {
      if (gone != NULL)
        gone(ud, svc->name);
      om_snapshot_unref(svc->snap);
      free(svc->name);
      free(svc);
      removed++;
      continue;
    }
    r->svcs[j++] = svc;
  }
  r->n_svcs = j;
  r->st.collected += removed;
  if (n != NULL)
    *n = removed;
  if (r->state == S_UP && !r->collecting)
    propose_collect(r, idle_ms, keep, ud, now);
  r->collect_ms = now;
  return 0;
}

static const om_store_ops_t redis_ops = {
    .name = "redis",
    .put_instance = r_put_instance,
    .renew = r_renew,
    .delete_instance = r_delete_instance,
    .snapshot = r_snapshot,
    .list_services = r_list_services,
    .config_put = r_config_put,
    .config_get = r_config_get,
    .status = r_status,
    .close = r_close,
    .leases = r_leases,
    .collect_empty = r_collect_empty,
};

/* ------------------------------------------------------------------ */
/* the URL and construction */

static int is_reg_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_';
}

#define URL_FAIL(msg)                                                          \
  do {                                                                         \
    if (why != NULL)                                                           \
      *why = (msg);                                                            \
    return OM_EINVAL;                                                          \
  } while (0)

int om_store_redis_parse_url(const char *url, char *host, size_t host_cap,
                             int *port, int *db, const char **why) {
  const char *p, *h, *he;
  long v;
  if (url == NULL || host == NULL || host_cap == 0 || port == NULL ||
      db == NULL)
    URL_FAIL("missing argument");
  if (strncmp(url, "rediss://", 9) == 0)
    URL_FAIL("TLS (rediss://) is not supported");
  if (strncmp(url, "redis://", 8) != 0)
    URL_FAIL("must start with redis://");
  p = url + 8;
  if (*p == '[') {
    h = p + 1;
    he = strchr(h, ']');
    if (he == NULL || he == h)
      URL_FAIL("an IPv6 host must be [ADDRESS]");
    for (const char *q = h; q < he; q++)
      if (!((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f') ||
            (*q >= 'A' && *q <= 'F') || *q == ':' || *q == '.'))
        URL_FAIL("an IPv6 host must be [ADDRESS]");
    p = he + 1;
  } else {
    h = p;
    while (is_reg_char(*p))
      p++;
    he = p;
    if (he == h)
      URL_FAIL("the host is missing");
    if (*p == '@')
      URL_FAIL("credentials in the URL are not supported");
  }
  if ((size_t)(he - h) >= host_cap ||
      (size_t)(he - h) > OM_STORE_REDIS_HOST_MAX)
    URL_FAIL("the host is too long");
  memcpy(host, h, (size_t)(he - h));
  host[he - h] = '\0';
  *port = 6379;
  *db = 0;
  if (*p == ':') {
    p++;
    v = 0;
    if (*p < '0' || *p > '9')
      URL_FAIL("the port must be a number in [1, 65535]");
    while (*p >= '0' && *p <= '9') {
      v = v * 10 + (*p++ - '0');
      if (v > 65535)
        URL_FAIL("the port must be a number in [1, 65535]");
    }
    if (v < 1)
      URL_FAIL("the port must be a number in [1, 65535]");
    *port = (int)v;
  }
  if (*p == '/') {
    p++;
    if (*p != '\0') {
      v = 0;
      while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v > 9999)
          URL_FAIL("the database must be a number in [0, 9999]");
      }
      if (*p != '\0')
        URL_FAIL("the database must be a number in [0, 9999]");
      *db = (int)v;
    }
  }
  if (*p != '\0')
    URL_FAIL("unexpected characters after the host (query, fragment or "
             "path are not supported)");
  return 0;
}

static int valid_prefix(const char *s) {
  size_t n = strnlen(s, PREFIX_MAX + 1);
  if (n > PREFIX_MAX)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!is_reg_char(s[i]) && s[i] != ':' && s[i] != '{' && s[i] != '}')
      return 0;
  return 1;
}

int om_store_redis_new(uv_loop_t *loop, const om_store_redis_opts_t *opts,
                       om_store_t **out) {
  rstore_t *r;
  const char *url, *prefix;
  if (loop == NULL || out == NULL)
    return OM_EINVAL;
  url = opts != NULL && opts->url != NULL ? opts->url
                                          : "redis://127.0.0.1:6379/0";
  prefix = opts != NULL && opts->prefix != NULL ? opts->prefix : DEFAULT_PREFIX;
  if (!valid_prefix(prefix))
    return OM_EINVAL;
  r = calloc(1, sizeof *r);
  if (r == NULL)
    return OM_ENOMEM;
  if (om_store_redis_parse_url(url, r->host, sizeof r->host, &r->port, &r->db,
                               NULL) != 0) {
    free(r);
    return OM_EINVAL;
  }
  {
    unsigned char buf[sizeof(struct in6_addr)];
    r->numeric = inet_pton(AF_INET, r->host, buf) == 1 ||
                 inet_pton(AF_INET6, r->host, buf) == 1;
    if (r->numeric)
      snprintf(r->addr, sizeof r->addr, "%s", r->host);
  }
  if (opts != NULL)
    r->opts = *opts;
  r->opts.url = NULL; /* not kept: the caller owns it */
  r->opts.prefix = NULL;
  if (r->opts.sweep_ms == 0)
    r->opts.sweep_ms = DEFAULT_SWEEP_MS;
  if (r->opts.backoff_min_ms == 0)
    r->opts.backoff_min_ms = DEFAULT_BACKOFF_MIN;
  if (r->opts.backoff_max_ms == 0)
    r->opts.backoff_max_ms = DEFAULT_BACKOFF_MAX;
  if (r->opts.backoff_max_ms < r->opts.backoff_min_ms)
    r->opts.backoff_max_ms = r->opts.backoff_min_ms;
  if (r->opts.command_timeout_ms == 0)
    r->opts.command_timeout_ms = DEFAULT_CMD_TIMEOUT;
  if (r->opts.max_config_bytes == 0)
    r->opts.max_config_bytes = DEFAULT_MAX_CONFIG;
  r->max_seen = r->opts.min_revision;
  snprintf(r->prefix, sizeof r->prefix, "%s", prefix);
  snprintf(r->k_rev, sizeof r->k_rev, "%srev", prefix);
  snprintf(r->k_services, sizeof r->k_services, "%sservices", prefix);
  snprintf(r->k_leases, sizeof r->k_leases, "%sleases", prefix);
  snprintf(r->k_configs, sizeof r->k_configs, "%sconfigs", prefix);
  snprintf(r->k_epoch, sizeof r->k_epoch, "%sepoch", prefix);
  snprintf(r->k_watched, sizeof r->k_watched, "%swatched", prefix);
  snprintf(r->chan, sizeof r->chan, "%sevents@%d", prefix, r->db);
  for (int i = 0; i < SC__COUNT; i++)
    om__sha1_hex(om__redis_scripts[i], r->sha[i]);
  r->loop = loop;
  r->base.ops = &redis_ops;
  om__subs_init(&r->base.subs);
  if (uv_timer_init(loop, &r->sweep) != 0) {
    free(r);
    return OM_ENOMEM;
  }
  if (uv_timer_init(loop, &r->retry) != 0) {
    /* an initialised handle must be closed before its memory goes */
    r->handles_open = 1;
    r->base.closing = 1;
    r->sweep.data = r;
    uv_close((uv_handle_t *)&r->sweep, on_handle_closed);
    return OM_ENOMEM;
  }
  r->sweep.data = r;
  r->retry.data = r;
  r->handles_open = 2;
  uv_timer_start(&r->sweep, om__on_sweep, r->opts.sweep_ms, r->opts.sweep_ms);
  om__session_connect(r);
  *out = &r->base;
  return 0;
}
