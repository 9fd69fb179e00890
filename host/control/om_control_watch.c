/*
 * om_control_watch.c: the control plane's watches (om_control.c's
 * om_control_internal.h): topics and their watchers, the first events of
 * a stream, the store's changes (the mirror, the change logs) and their
 * fan-out to every watcher of a topic, and the watch routes.
 */
#include "om_control_internal.h"

/* ------------------------------------------------------------------ */
/* topics and watchers */

/*
 * Binary search over n sorted entries: cmp(i) compares the key with entry
 * i (<0, 0, >0). Returns the entry's index with *found = 1, or the
 * insertion point with *found = 0. The one search behind the topic, mirror
 * and document tables.
 */
typedef int (*cmp_at_fn)(const om_control_t *c, size_t i, const void *key);

static size_t sorted_pos(const om_control_t *c, size_t n, cmp_at_fn cmp,
                         const void *key, int *found) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = cmp(c, mid, key);
    if (r == 0) {
      *found = 1;
      return mid;
    }
    if (r < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  *found = 0;
  return lo;
}

static int topic_cmp(tkind_t kind, const char *name, const topic_t *t) {
  if (kind != t->kind)
    return kind < t->kind ? -1 : 1;
  return strcmp(name, t->name);
}

typedef struct {
  tkind_t kind;
  const char *name;
} topic_key_t;

static int topic_at(const om_control_t *c, size_t i, const void *key) {
  const topic_key_t *k = key;
  return topic_cmp(k->kind, k->name, c->topics[i]);
}

static size_t topic_pos(const om_control_t *c, tkind_t kind, const char *name,
                        int *found) {
  topic_key_t k = {kind, name};
  return sorted_pos(c, c->n_topics, topic_at, &k, found);
}

static topic_t *topic_find(const om_control_t *c, tkind_t kind,
                           const char *name) {
  int found;
  size_t i = topic_pos(c, kind, name, &found);
  return found ? c->topics[i] : NULL;
}

static topic_t *topic_get(om_control_t *c, tkind_t kind, const char *name) {
  int found;
  size_t i = topic_pos(c, kind, name, &found);
  topic_t *t;
  if (found)
    return c->topics[i];
  if (om__grow((void **)&c->topics, &c->cap_topics, c->n_topics + 1,
               sizeof *c->topics) != 0)
    return NULL;
  t = calloc(1, sizeof *t);
  if (t == NULL)
    return NULL;
  om_list_init(&t->watchers);
  t->kind = kind;
  snprintf(t->name, sizeof t->name, "%s", name);
  memmove(c->topics + i + 1, c->topics + i,
          (c->n_topics - i) * sizeof *c->topics);
  c->topics[i] = t;
  c->n_topics++;
  return t;
}

void om__topic_free(topic_t *t) {
  om_config_doc_unref(t->doc);
  free(t->ev);
  free(t);
}

/* Drop t if nobody watches it and nobody is walking it. */
void om__topic_release(om_control_t *c, topic_t *t) {
  int found;
  size_t i;
  if (t == NULL || t->n != 0 || t->busy)
    return;
  i = topic_pos(c, t->kind, t->name, &found);
  if (!found)
    return;
  memmove(c->topics + i, c->topics + i + 1,
          (c->n_topics - i - 1) * sizeof *c->topics);
  c->n_topics--;
  om__topic_free(t);
}

/* The kernel send buffer of a watch stream (about 2x this on Linux). */
#define WATCH_SNDBUF (64 * 1024)

static void watcher_unref(watcher_t *w) {
  if (--w->refs > 0)
    return;
  om_snapshot_unref(w->held_snap);
  om_config_doc_unref(w->held_doc);
  om_snapshot_unref(w->due_snap);
  om_config_doc_unref(w->due_doc);
  for (size_t i = 0; i < w->n_due_all; i++)
    om_snapshot_unref(w->due_all[i]);
  free(w->due_all);
  for (size_t i = 0; i < w->n_burst; i++)
    om_snapshot_unref(w->burst[i]);
  free(w->burst);
  free(w);
}

static void on_watch_timer_closed(uv_handle_t *h) {
  watcher_t *w = h->data;
  free(h);
  watcher_unref(w);
}

/* End a stream: cleanly (END), cut (ABORT), or the client left (GONE). */
void om__watcher_finish(watcher_t *w, int how) {
  om_control_t *c = w->c;
  om_http_request_t *req = w->req;
  topic_t *t = w->topic;
  if (req == NULL)
    return;
  w->req = NULL;
  w->topic = NULL;
  om_list_remove(&w->link);
  t->n--;
  c->watchers--;
  om_metric_set(c->m.watchers, (double)c->watchers);
  om__topic_release(c, t);
  if (w->timer != NULL) { /* its reference goes when the handle is closed */
    uv_close((uv_handle_t *)w->timer, on_watch_timer_closed);
    w->timer = NULL;
  }
  if (how == FIN_END) {
    (void)om_http_response_end(req); /* released even if the client left */
  } else if (how == FIN_ABORT) {
    om_http_response_abort(req);
  }
  watcher_unref(w);
}

static void on_watch_close(om_http_request_t *req) {
  om__watcher_finish(req->user, FIN_GONE);
}

static void release_snapshot(void *snap) {
  om_snapshot_unref(snap);
}

/*
 * Write to a stream. With check, a watcher that still has unsent bytes and
 * would go past the backlog limit is cut instead (it resyncs on
 * reconnect). snap (NULL for none) owns data: the server holds a
 * reference to it instead of copying what the kernel does not take at
 * once, so a 1 MB snapshot sent to 100 slow watchers is one buffer, not
 * 100 copies. Returns 0, or -1 when the watcher is gone.
 */
static int watcher_send_lent(watcher_t *w, const char *data, size_t len,
                             int check, om_snapshot_t *snap) {
  om_control_t *c = w->c;
  size_t pending;
  if (w->req == NULL)
    return -1;
  pending = om_http_response_pending(w->req);
  if (check && pending > 0 &&
      (len > c->max_backlog || pending > c->max_backlog - len)) {
    char p[24], ip[46];
    snprintf(p, sizeof p, "%zu", pending);
    snprintf(ip, sizeof ip, "%s", w->req->remote_ip);
    c->dropped++;
    om_metric_inc(c->m.dropped);
    om_log(OM_LOG_WARN, "watcher_dropped", "reason", "backlog", "pending", p,
           "topic", w->topic->name[0] ? w->topic->name : "*", "remote", ip,
           NULL);
    om__watcher_finish(w, FIN_ABORT);
    return -1;
  }
  if (om_http_response_write_lent(w->req, data, len,
                                  snap != NULL ? release_snapshot : NULL,
                                  om_snapshot_ref(snap)) != 0) {
    om__watcher_finish(w, FIN_ABORT);
    return -1;
  }
  return 0;
}

static int watcher_send(watcher_t *w, const char *data, size_t len, int check) {
  return watcher_send_lent(w, data, len, check, NULL);
}

/* An event went out: a coalescing watcher's window starts now. */
static void watcher_wrote(watcher_t *w) {
  w->last_write_ms = uv_now(w->c->loop);
  w->wrote = 1;
}

/* ms until w may be written again (0: now). */
static uint64_t window_left(const watcher_t *w) {
  uint64_t now;
  if (w->interval_ms == 0 || !w->wrote)
    return 0;
  now = uv_now(w->c->loop);
  if (now - w->last_write_ms >= w->interval_ms)
    return 0;
  return w->last_write_ms + w->interval_ms - now;
}

/* A snapshot event to one watcher. */
static int watcher_send_snapshot(watcher_t *w, om_snapshot_t *snap, int check) {
  const char *data;
  size_t len;
  if (om_snapshot_sse_cached_flags(snap, om__snapshot_flags(w->c), &data,
                                   &len) != 0) {
    om_log(OM_LOG_ERROR, "watch_encode_failed", "service",
           om_snapshot_service(snap), NULL);
    om__watcher_finish(w, FIN_ABORT); /* it reconnects and resyncs */
    return -1;
  }
  if (watcher_send_lent(w, data, len, check, snap) != 0)
    return -1;
  watcher_wrote(w);
  w->c->events_sent++;
  om_metric_inc(w->c->m.events);
  return 0;
}

/* The event bytes of a document, cached on its topic. */
static int topic_set_doc(topic_t *t, om_config_doc_t *doc) {
  char id[24];
  om_sse_event_t ev;
  char *out = NULL;
  size_t len = 0;
  int rc;
  if (t->doc == doc)
    return 0;
  snprintf(id, sizeof id, "%" PRIu64, doc->revision);
  memset(&ev, 0, sizeof ev);
  ev.type = "snapshot";
  ev.type_len = 8;
  ev.id = id;
  ev.id_len = strlen(id);
  ev.data = doc->body;
  ev.data_len = doc->len;
  ev.retry_ms = -1;
  rc = om_sse_encode_alloc(&ev, &out, &len);
  if (rc != 0)
    return rc;
  om_config_doc_unref(t->doc);
  free(t->ev);
  t->doc = om_config_doc_ref(doc);
  t->ev = out;
  t->ev_len = len;
  return 0;
}

static int watcher_send_doc(watcher_t *w, om_config_doc_t *doc, int check) {
  if (topic_set_doc(w->topic, doc) != 0) {
    om_log(OM_LOG_ERROR, "watch_encode_failed", "config", doc->name, NULL);
    om__watcher_finish(w, FIN_ABORT);
    return -1;
  }
  if (watcher_send(w, w->topic->ev, w->topic->ev_len, check) != 0)
    return -1;
  watcher_wrote(w);
  w->c->events_sent++;
  om_metric_inc(w->c->m.events);
  return 0;
}

/*
 * Every event is the whole state, so a watcher never needs a state that a
 * newer one replaced: while its client has not taken what was written
 * (bytes still queued in user space), the newest snapshot or document is
 * held by reference instead and written when the output drains. A slow
 * watcher costs one encoding in its output and a pointer, never a queue
 * of revisions, and is never cut for backlog (docs/CONTROL.md "Watches").
 */
static void on_watcher_drain(om_http_request_t *req) {
  watcher_t *w = req->user;
  om_snapshot_t *snap = w->held_snap;
  om_config_doc_t *doc = w->held_doc;
  w->held_snap = NULL;
  w->held_doc = NULL;
  if (snap != NULL)
    watcher_send_snapshot(w, snap, 0);
  else if (doc != NULL && w->topic != NULL)
    watcher_send_doc(w, doc, 0);
  om_snapshot_unref(snap);
  om_config_doc_unref(doc);
}

/* 1 when w's client still has output to take: what comes now is held. */
static int watcher_busy(watcher_t *w) {
  if (w->req == NULL || om_http_response_pending(w->req) == 0)
    return 0;
  return om_http_response_on_drain(w->req, 0, on_watcher_drain) == 0;
}

static void on_watch_due(uv_timer_t *timer);

/*
 * Inside w's window (or with a state already waiting for its end): keep
 * the newest and have the timer write it when the window ends. 1 when
 * the state was kept for later.
 */
static int watcher_defer(watcher_t *w) {
  uint64_t left;
  if (w->timer == NULL)
    return 0;
  if (uv_is_active((uv_handle_t *)w->timer))
    return 1;
  left = window_left(w);
  if (left == 0)
    return 0;
  uv_timer_start(w->timer, on_watch_due, left, 0);
  return 1;
}

static void watcher_offer_snapshot(watcher_t *w, om_snapshot_t *snap) {
  if (watcher_defer(w)) {
    if (w->due_snap != NULL) {
      w->c->coalesced++;
      om_metric_inc(w->c->m.coalesced);
    }
    om_snapshot_unref(w->due_snap);
    w->due_snap = om_snapshot_ref(snap);
    return;
  }
  if (watcher_busy(w)) {
    om_snapshot_unref(w->held_snap);
    w->held_snap = om_snapshot_ref(snap);
    w->c->coalesced++;
    om_metric_inc(w->c->m.coalesced);
    return;
  }
  watcher_send_snapshot(w, snap, 0);
}

static void watcher_offer_doc(watcher_t *w, om_config_doc_t *doc) {
  if (watcher_defer(w)) {
    if (w->due_doc != NULL) {
      w->c->coalesced++;
      om_metric_inc(w->c->m.coalesced);
    }
    om_config_doc_unref(w->due_doc);
    w->due_doc = om_config_doc_ref(doc);
    return;
  }
  if (watcher_busy(w)) {
    om_config_doc_unref(w->held_doc);
    w->held_doc = om_config_doc_ref(doc);
    w->c->coalesced++;
    om_metric_inc(w->c->m.coalesced);
    return;
  }
  watcher_send_doc(w, doc, 0);
}

static int by_revision(const void *a, const void *b);

/*
 * A change of any service to a watcher of every service: inside its
 * window the newest snapshot of each service waits (one per service, the
 * older one of a service replaced), all written at the window's end.
 */
static void watcher_offer_all(watcher_t *w, om_snapshot_t *snap) {
  const char *svc = om_snapshot_service(snap);
  if (!watcher_defer(w)) {
    watcher_send_snapshot(w, snap, 1);
    return;
  }
  for (size_t i = 0; i < w->n_due_all; i++)
    if (strcmp(om_snapshot_service(w->due_all[i]), svc) == 0) {
      om_snapshot_unref(w->due_all[i]);
      w->due_all[i] = om_snapshot_ref(snap);
      w->c->coalesced++;
      om_metric_inc(w->c->m.coalesced);
      return;
    }
  if (om__grow((void **)&w->due_all, &w->cap_due_all, w->n_due_all + 1,
               sizeof *w->due_all) != 0) {
    om__watcher_finish(w, FIN_ABORT); /* a lost change would lie: resync */
    return;
  }
  w->due_all[w->n_due_all++] = om_snapshot_ref(snap);
}

/* The window ended: write what waited for it (still held behind output
 * the client has not taken, as any other change). */
static void on_watch_due(uv_timer_t *timer) {
  watcher_t *w = timer->data;
  om_snapshot_t *snap = w->due_snap;
  om_config_doc_t *doc = w->due_doc;
  om_snapshot_t **all = w->due_all;
  size_t n_all = w->n_due_all;
  w->due_snap = NULL;
  w->due_doc = NULL;
  w->due_all = NULL;
  w->n_due_all = w->cap_due_all = 0;
  w->refs++; /* a send may end the stream */
  if (snap != NULL)
    watcher_offer_snapshot(w, snap);
  else if (doc != NULL)
    watcher_offer_doc(w, doc);
  if (n_all > 0) {
    qsort(all, n_all, sizeof *all, by_revision);
    for (size_t i = 0; i < n_all && w->req != NULL; i++)
      watcher_send_snapshot(w, all[i], 1);
  }
  for (size_t i = 0; i < n_all; i++)
    om_snapshot_unref(all[i]);
  free(all);
  om_snapshot_unref(snap);
  om_config_doc_unref(doc);
  watcher_unref(w);
}

/* ---- the first event(s) of a stream ---- */

/* Nothing is re-sent when the client already holds revision rev. */
static int client_has(const watcher_t *w, uint64_t rev) {
  return w->has_last_id && w->last_id == rev;
}

static void on_watch_snapshot(void *ud, int status, om_snapshot_t *snap) {
  watcher_t *w = ud;
  if (w->req != NULL) {
    if (status == 0 && snap != NULL) {
      uint64_t rev = om_snapshot_revision(snap);
      if (client_has(w, rev)) {
        if (rev > w->last_rev)
          w->last_rev = rev;
      } else if (rev > w->last_rev) {
        w->last_rev = rev;
        watcher_send_snapshot(w, snap, 0);
      }
    } else if (status != OM_ENOTFOUND) {
      om__watcher_finish(w, FIN_ABORT);
    } /* not found: the stream waits for the service's first registration */
  }
  watcher_unref(w);
}

static void on_watch_doc(void *ud, int status, om_config_doc_t *doc) {
  watcher_t *w = ud;
  if (w->req != NULL) {
    if (status == 0 && doc != NULL) {
      if (client_has(w, doc->revision)) {
        if (doc->revision > w->last_rev)
          w->last_rev = doc->revision;
      } else if (doc->revision > w->last_rev) {
        w->last_rev = doc->revision;
        watcher_send_doc(w, doc, 0);
      }
    } else if (status != OM_ENOTFOUND) {
      om__watcher_finish(w, FIN_ABORT);
    }
  }
  watcher_unref(w);
}

static int by_revision(const void *a, const void *b) {
  uint64_t x = om_snapshot_revision(*(om_snapshot_t *const *)a);
  uint64_t y = om_snapshot_revision(*(om_snapshot_t *const *)b);
  return x < y ? -1 : x > y;
}

/*
 * Every service's snapshot is in: write them oldest revision first, so the
 * stream's last event ID is the newest revision (what a reconnect sends
 * back) — unless the client already holds exactly that.
 */
static void burst_complete(watcher_t *w) {
  uint64_t max = 0;
  if (w->req == NULL)
    return;
  if (w->n_burst > 1) /* none: burst is NULL, which qsort may not take */
    qsort(w->burst, w->n_burst, sizeof *w->burst, by_revision);
  if (w->n_burst > 0)
    max = om_snapshot_revision(w->burst[w->n_burst - 1]);
  if (!(w->n_burst > 0 && client_has(w, max)))
    for (size_t i = 0; i < w->n_burst; i++)
      if (watcher_send_snapshot(w, w->burst[i], 0) != 0)
        break;
  for (size_t i = 0; i < w->n_burst; i++)
    om_snapshot_unref(w->burst[i]);
  free(w->burst);
  w->burst = NULL;
  w->n_burst = w->cap_burst = 0;
  w->ready = 1;
}

static void burst_done_one(watcher_t *w) {
  if (--w->outstanding == 0)
    burst_complete(w);
}

static void on_burst_snapshot(void *ud, int status, om_snapshot_t *snap) {
  watcher_t *w = ud;
  if (w->req != NULL && status == 0 && snap != NULL) {
    if (om__grow((void **)&w->burst, &w->cap_burst, w->n_burst + 1,
                 sizeof *w->burst) == 0)
      w->burst[w->n_burst++] = om_snapshot_ref(snap);
    else
      om__watcher_finish(w, FIN_ABORT); /* an incomplete burst would lie */
  } else if (w->req != NULL && status != 0 && status != OM_ENOTFOUND) {
    om__watcher_finish(w, FIN_ABORT);
  }
  burst_done_one(w);
  watcher_unref(w);
}

static void on_burst_list(void *ud, int status, const om_service_rev_t *list,
                          size_t n) {
  watcher_t *w = ud;
  om_control_t *c = w->c;
  if (w->req != NULL && status != 0)
    om__watcher_finish(w, FIN_ABORT);
  if (w->req != NULL) {
    w->outstanding = 1; /* held until every read is started */
    for (size_t i = 0; i < n && w->req != NULL; i++) {
      int rc;
      w->outstanding++;
      w->refs++;
      rc = om_store_snapshot(c->store, list[i].service, on_burst_snapshot, w);
      if (rc != 0) {
        w->outstanding--;
        w->refs--;
        om__watcher_finish(w, FIN_ABORT);
      }
    }
    burst_done_one(w);
  }
  watcher_unref(w);
}

/* ---- fan-out ---- */

static void fanout_snapshot(om_control_t *c, om_snapshot_t *snap) {
  topic_t *ts = topic_find(c, T_SERVICE, om_snapshot_service(snap));
  topic_t *ta = topic_find(c, T_ALL, "");
  uint64_t rev = om_snapshot_revision(snap);
  if (ts != NULL) {
    ts->busy = 1;
    OM_LIST_FOREACH_SAFE(it, &ts->watchers) {
      watcher_t *w = OM_LIST_ENTRY(it, watcher_t, link);
      if (rev > w->last_rev) {
        w->last_rev = rev;
        watcher_offer_snapshot(w, snap);
      }
    }
    ts->busy = 0;
    om__topic_release(c, ts);
  }
  if (ta != NULL) {
    ta->busy = 1;
    OM_LIST_FOREACH_SAFE(it, &ta->watchers) {
      watcher_t *w = OM_LIST_ENTRY(it, watcher_t, link);
      if (w->ready)
        watcher_offer_all(w, snap);
    }
    ta->busy = 0;
    om__topic_release(c, ta);
  }
}

/*
 * The warm-up window ended: every watcher gets the snapshots it holds
 * again, now without "warming" (same revisions, same event ids), so a
 * client that merged while the plane warmed replaces its topology by the
 * complete one. A watcher of every service gets them oldest revision
 * first, as in its first burst.
 */
void om__fanout_warm(om_control_t *c) {
  om_snapshot_t **all;
  topic_t *ta;
  if (c->n_mirror == 0)
    return;
  for (size_t i = 0; i < c->n_mirror; i++) {
    om_snapshot_t *snap = c->mirror[i];
    topic_t *ts = topic_find(c, T_SERVICE, om_snapshot_service(snap));
    uint64_t rev = om_snapshot_revision(snap);
    if (ts == NULL)
      continue;
    ts->busy = 1;
    OM_LIST_FOREACH_SAFE(it, &ts->watchers) {
      watcher_t *w = OM_LIST_ENTRY(it, watcher_t, link);
      if (rev >= w->last_rev) {
        w->last_rev = rev;
        watcher_offer_snapshot(w, snap);
      }
    }
    ts->busy = 0;
    om__topic_release(c, ts);
  }
  ta = topic_find(c, T_ALL, "");
  if (ta == NULL)
    return;
  all = malloc(c->n_mirror * sizeof *all);
  if (all == NULL) {
    /* they would keep merging until the next change: make them resync */
    ta->busy = 1;
    OM_LIST_FOREACH_SAFE(it, &ta->watchers) {
      om__watcher_finish(OM_LIST_ENTRY(it, watcher_t, link), FIN_ABORT);
    }
    ta->busy = 0;
    om__topic_release(c, ta);
    return;
  }
  memcpy(all, c->mirror, c->n_mirror * sizeof *all);
  qsort(all, c->n_mirror, sizeof *all, by_revision);
  ta->busy = 1;
  OM_LIST_FOREACH_SAFE(it, &ta->watchers) {
    watcher_t *w = OM_LIST_ENTRY(it, watcher_t, link);
    for (size_t i = 0; i < c->n_mirror && w->ready; i++)
      if (watcher_send_snapshot(w, all[i], 1) != 0)
        break;
  }
  ta->busy = 0;
  om__topic_release(c, ta);
  free(all);
}

static void fanout_doc(om_control_t *c, om_config_doc_t *doc) {
  topic_t *t = topic_find(c, T_CONFIG, doc->name);
  if (t == NULL)
    return;
  t->busy = 1;
  OM_LIST_FOREACH_SAFE(it, &t->watchers) {
    watcher_t *w = OM_LIST_ENTRY(it, watcher_t, link);
    if (doc->revision > w->last_rev) {
      w->last_rev = doc->revision;
      watcher_offer_doc(w, doc);
    }
  }
  t->busy = 0;
  om__topic_release(c, t);
}

/*
 * The tokens file was reloaded (or auth turned on): every open stream is
 * checked again with the credential that opened it, and one that no
 * longer has its role gets a last event saying so and is ended; the
 * client's reconnect then meets the new file (401 or 403).
 */
void om__watchers_recheck(om_control_t *c) {
  static const char ev[] =
      "event: revoked\ndata: {\"error\":\"unauthorized\",\"message\":"
      "\"the credential of this stream was revoked\"}\n\n";
  for (size_t i = 0; i < c->n_topics; i++) {
    topic_t *t = c->topics[i];
    t->busy = 1;
    OM_LIST_FOREACH_SAFE(it, &t->watchers) {
      watcher_t *w = OM_LIST_ENTRY(it, watcher_t, link);
      char ip[46];
      if (om__watcher_allowed(c, w))
        continue;
      snprintf(ip, sizeof ip, "%s", w->req->remote_ip);
      om_log(OM_LOG_INFO, "watcher_revoked", "topic",
             t->name[0] ? t->name : "*", "remote", ip, NULL);
      om_metric_inc(c->m.revoked);
      if (watcher_send(w, ev, sizeof ev - 1, 0) == 0)
        om__watcher_finish(w, FIN_END);
    }
    t->busy = 0;
  }
  for (size_t i = c->n_topics; i-- > 0;) /* from the end: indices hold */
    om__topic_release(c, c->topics[i]);
}

/* The sweep's cursor over the mirror: both it and the store's services
 * are in name order, so the mirror is compacted in one pass as the store
 * names what it removes (r reads, w writes). */
typedef struct {
  om_control_t *c;
  size_t r, w;
} collect_t;

static int collect_keep(void *ud, const char *service) {
  const collect_t *g = ud;
  const topic_t *t = topic_find(g->c, T_SERVICE, service);
  return t != NULL && t->n > 0;
}

static void collect_gone(void *ud, const char *service) {
  collect_t *g = ud;
  om_control_t *c = g->c;
  while (g->r < c->n_mirror) {
    int cmp = strcmp(om_snapshot_service(c->mirror[g->r]), service);
    if (cmp > 0)
      break;
    if (cmp == 0) {
      om_snapshot_unref(c->mirror[g->r++]);
      break;
    }
    c->mirror[g->w++] = c->mirror[g->r++];
  }
}

void om__collect_empty(om_control_t *c) {
  collect_t g = {c, 0, 0};
  size_t n = 0;
  char count[24];
  int rc;
  if (c->empty_ttl_ms == 0 || c->closing || c->collect_unsupported)
    return;
  rc = om_store_collect_empty(c->store, c->empty_ttl_ms, collect_keep,
                              collect_gone, &g, &n);
  if (rc == OM_ESTATE && !c->store->closing) {
    c->collect_unsupported = 1;
    om_log(OM_LOG_WARN, "control_collect_unsupported", "store",
           om_store_name(c->store), "detail",
           "this store does not collect empty services; "
           "--empty-service-ttl has no effect",
           NULL);
    return;
  }
  if (rc != 0 || n == 0)
    return;
  while (g.r < c->n_mirror)
    c->mirror[g.w++] = c->mirror[g.r++];
  c->n_mirror = g.w;
  om_metric_add(c->m.collected, (double)n);
  snprintf(count, sizeof count, "%zu", n);
  om_log(OM_LOG_INFO, "control_services_collected", "count", count, NULL);
}

void om__on_ping(uv_timer_t *timer) {
  om_control_t *c = timer->data;
  static const char ping[] = ": ping\n\n";
  size_t i = 0;
  om__collect_empty(c);
  while (i < c->n_topics) {
    topic_t *t = c->topics[i];
    t->busy = 1;
    OM_LIST_FOREACH_SAFE(it, &t->watchers) {
      watcher_t *w = OM_LIST_ENTRY(it, watcher_t, link);
      /* a client with output still to take is not idle: no ping piles up
       * behind it */
      if (w->req != NULL && om_http_response_pending(w->req) > 0)
        continue;
      if (watcher_send(w, ping, sizeof ping - 1, 1) == 0) {
        c->pings_sent++;
        om_metric_inc(c->m.pings);
      }
    }
    t->busy = 0;
    if (t->n == 0)
      om__topic_release(c, t); /* shifts the array: same i is the next one */
    else
      i++;
  }
}

/* ------------------------------------------------------------------ */
/* the store's changes: mirror, logs, fan-out */

static int mirror_at(const om_control_t *c, size_t i, const void *key) {
  return strcmp(key, om_snapshot_service(c->mirror[i]));
}

static size_t mirror_pos(const om_control_t *c, const char *name, int *found) {
  return sorted_pos(c, c->n_mirror, mirror_at, name, found);
}

static uint64_t ring_key(const char *service, uint64_t rev) {
  return om_hash(service, strlen(service), rev);
}

int om__ring_has(const change_ring_t *r, const char *service, uint64_t rev) {
  uint64_t k = ring_key(service, rev);
  for (size_t i = 0; i < CHANGE_RING; i++)
    if (r->rev[i] == rev && r->key[i] == k)
      return 1;
  return 0;
}

void om__ring_add(change_ring_t *r, const char *service, uint64_t rev) {
  r->key[r->next] = ring_key(service, rev);
  r->rev[r->next] = rev;
  r->next = (r->next + 1) % CHANGE_RING;
}

void om__log_change(const char *change, const char *service, const char *id,
                    uint64_t rev, const char *url, const char *remote) {
  char r[24];
  snprintf(r, sizeof r, "%" PRIu64, rev);
  om_log(OM_LOG_INFO, "registration", "change", change, "service", service,
         "id", id, "revision", r, "url", url, "remote", remote, NULL);
}

/*
 * The caller's address of our own write that made this change, when its
 * answer has not come yet (with Redis the change's event can come
 * first: the two connections are not ordered): a PUT of that instance
 * with that URL (url), or a DELETE of it (url NULL); else NULL, a change
 * we did not make.
 */
static const char *write_remote(const om_control_t *c, const char *svc,
                                const char *id, const char *url) {
  OM_LIST_FOREACH(it, &c->writes) {
    const op_t *op = OM_LIST_ENTRY(it, op_t, wlink);
    if (op->deleting == (url == NULL) && strcmp(op->id, id) == 0 &&
        strcmp(op->service, svc) == 0 &&
        (url == NULL || (op->url != NULL && strcmp(op->url, url) == 0)))
      return op->x.req->remote_ip;
  }
  return NULL;
}

/*
 * A change seen as a store event before any answer of ours logged it: a
 * lease expiry, a write by another holder of the store (such as `openmesh
 * up`'s example services), or our own write whose event came before its
 * answer (then with the caller's address, write_remote). One log line per
 * instance, by comparing the service's previous snapshot with the new one
 * (both sorted by id). A removal is what the store says it was
 * (om_store_status_t.last_removal); when it cannot say, "deleted" if it
 * counted a deletion since the last event (each write is its own event),
 * else "expired".
 */
static void log_store_change(const om_control_t *c, const om_snapshot_t *prev,
                             const om_snapshot_t *next, const char *removed) {
  size_t np = prev != NULL ? om_snapshot_count(prev) : 0;
  size_t nn = om_snapshot_count(next), i = 0, j = 0;
  const char *svc = om_snapshot_service(next);
  uint64_t rev = om_snapshot_revision(next);
  while (i < np || j < nn) {
    const om_instance_t *a = i < np ? om_snapshot_instance(prev, i) : NULL;
    const om_instance_t *b = j < nn ? om_snapshot_instance(next, j) : NULL;
    int r = a == NULL ? 1 : b == NULL ? -1 : strcmp(a->id, b->id);
    if (r < 0) {
      om__log_change(removed, svc, a->id, rev, a->url,
                     strcmp(removed, "deleted") == 0
                         ? write_remote(c, svc, a->id, NULL)
                         : NULL);
      i++;
    } else if (r > 0) {
      om__log_change("created", svc, b->id, rev, b->url,
                     write_remote(c, svc, b->id, b->url));
      j++;
    } else {
      if (a != b && !om_instance_equal(a, b))
        om__log_change("updated", svc, b->id, rev, b->url,
                       write_remote(c, svc, b->id, b->url));
      i++;
      j++;
    }
  }
}

void om__on_service_event(void *ud, om_snapshot_t *snap) {
  om_control_t *c = ud;
  uint64_t rev = om_snapshot_revision(snap);
  om_store_status_t st;
  int found;
  size_t i = mirror_pos(c, om_snapshot_service(snap), &found);
  (void)om__warming(c); /* a Redis that lost its data: before its changes */
  /* A store fed by several writers (Redis) must never make a watcher of
   * every service see a service go back: anything not newer than what we
   * passed on for that service is dropped here, once for every stream. */
  if (found && rev <= om_snapshot_revision(c->mirror[i]))
    return;
  if (rev > c->rev_max)
    c->rev_max = rev;
  memset(&st, 0, sizeof st);
  om_store_status(c->store, &st);
  if (!c->writing &&
      !om__ring_has(&c->answered, om_snapshot_service(snap), rev)) {
    log_store_change(c, found ? c->mirror[i] : NULL, snap,
                     st.last_removal == OM_STORE_DELETED   ? "deleted"
                     : st.last_removal == OM_STORE_EXPIRED ? "expired"
                     : st.deletions != c->seen_deletions   ? "deleted"
                                                           : "expired");
    om__ring_add(&c->announced, om_snapshot_service(snap), rev);
  }
  c->seen_deletions = st.deletions;
  if (found) {
    om_snapshot_unref(c->mirror[i]);
    c->mirror[i] = om_snapshot_ref(snap);
  } else if (om__grow((void **)&c->mirror, &c->cap_mirror, c->n_mirror + 1,
                      sizeof *c->mirror) == 0) {
    memmove(c->mirror + i + 1, c->mirror + i,
            (c->n_mirror - i) * sizeof *c->mirror);
    c->mirror[i] = om_snapshot_ref(snap);
    c->n_mirror++;
  } /* else: only a later log line loses its baseline */
  fanout_snapshot(c, snap);
}

static int doc_at(const om_control_t *c, size_t i, const void *key) {
  return strcmp(key, c->docs[i]->name);
}

static size_t doc_pos(const om_control_t *c, const char *name, int *found) {
  return sorted_pos(c, c->n_docs, doc_at, name, found);
}

void om__on_config_event(void *ud, om_config_doc_t *doc) {
  om_control_t *c = ud;
  int found;
  size_t i = doc_pos(c, doc->name, &found);
  if (doc->revision > c->rev_max)
    c->rev_max = doc->revision;
  if (found) {
    om_config_doc_unref(c->docs[i]);
    c->docs[i] = om_config_doc_ref(doc);
  } else if (om__grow((void **)&c->docs, &c->cap_docs, c->n_docs + 1,
                      sizeof *c->docs) == 0) {
    memmove(c->docs + i + 1, c->docs + i, (c->n_docs - i) * sizeof *c->docs);
    c->docs[i] = om_config_doc_ref(doc);
    c->n_docs++;
  }
  fanout_doc(c, doc);
}

/* ------------------------------------------------------------------ */
/* watches */

static void sse_headers(const om_control_t *c, om_http_header_t *h, size_t *n) {
  memset(h, 0, 4 * sizeof *h);
  h[0].name = "Content-Type";
  h[0].value = "text/event-stream";
  h[1].name = "Cache-Control";
  h[1].value = "no-cache";
  h[2].name = "X-Accel-Buffering"; /* reverse proxies: do not buffer */
  h[2].value = "no";
  *n = 3;
  if (c->cors != NULL) {
    h[3].name = "Access-Control-Allow-Origin";
    h[3].value = c->cors;
    *n = 4;
  }
}

void om__h_watch(ctx_t *x, tkind_t kind, const char *name) {
  om_control_t *c = x->c;
  om_http_request_t *req = x->req;
  om_http_header_t h[4];
  size_t nh, idl = 0, vl = 0;
  const char *idv, *v;
  uint64_t interval = 0;
  topic_t *t;
  watcher_t *w;
  int rc, dup;
  if (c->closing) {
    reply_error(x, REJ_SHUTTING_DOWN, NULL, "shutting down");
    return;
  }
  v = om__query_param(req->query, req->query_len, "min_interval_ms", &vl, &dup);
  if (v != NULL && (dup || om__parse_u64(v, vl, &interval) != 0 ||
                    interval > OM_CONTROL_MAX_WATCH_INTERVAL_MS)) {
    reply_error(x, REJ_INVALID_FIELD, "min_interval_ms",
                "field 'min_interval_ms': must be an integer in [0, %u] "
                "(given once)",
                OM_CONTROL_MAX_WATCH_INTERVAL_MS);
    return;
  }
  if (interval < c->watch_min_interval_ms) /* the plane's floor */
    interval = c->watch_min_interval_ms;
  sse_headers(c, h, &nh);
  if (x->method == M_HEAD) {
    om_http_respond(req, 200, h, nh, NULL, 0);
    return;
  }
  t = topic_get(c, kind, name);
  w = t != NULL ? calloc(1, sizeof *w) : NULL;
  if (w == NULL) {
    om__topic_release(c, t);
    om__reply_store_error(x, OM_ENOMEM);
    return;
  }
  w->c = c;
  w->refs = 1;
  w->cred = x->cred;
  w->role = x->role;
  w->digest = x->digest;
  idv = om_http_request_header(req, "last-event-id", &idl);
  if (idv != NULL && om__parse_u64(idv, idl, &w->last_id) == 0)
    w->has_last_id = 1;
  if (om_http_request_on_close(req, on_watch_close) != 0) {
    free(w); /* the client is already gone */
    om__topic_release(c, t);
    om_http_response_abort(req);
    return;
  }
  req->user = w;
  /* a client that stops reading: what the kernel holds for it stays
   * small, the rest is the newest state held by reference (see
   * watcher_offer_snapshot), never a queue of superseded ones */
  (void)om_http_request_set_send_buffer(req, WATCH_SNDBUF);
  rc = om_http_response_start(req, 200, h, nh);
  if (rc != 0) {
    om_http_request_on_close(req, NULL);
    free(w);
    om__topic_release(c, t);
    om_http_response_abort(req);
    return;
  }
  w->req = req;
  w->topic = t;
  om_list_push_front(&t->watchers, &w->link);
  t->n++;
  c->watchers++;
  om_metric_set(c->m.watchers, (double)c->watchers);
  om_metric_observe(c->m.latency[x->label],
                    (double)(om__now_ns() - x->t0) / 1e9);
  x->req = NULL;
  if (interval > 0) {
    w->timer = malloc(sizeof *w->timer);
    if (w->timer == NULL) {
      om__watcher_finish(w, FIN_ABORT);
      return;
    }
    uv_timer_init(c->loop, w->timer); /* cannot fail */
    w->timer->data = w;
    w->interval_ms = interval;
    w->refs++; /* the timer's, given back when it is closed */
  }
  if (watcher_send(w, c->retry_block, c->retry_len, 0) != 0)
    return;
  w->refs++;
  if (kind == T_SERVICE)
    rc = om_store_snapshot(c->store, name, on_watch_snapshot, w);
  else if (kind == T_CONFIG)
    rc = om_store_config_get(c->store, name, on_watch_doc, w);
  else
    rc = om_store_list_services(c->store, on_burst_list, w);
  if (rc != 0) {
    w->refs--;
    om__watcher_finish(w, FIN_ABORT);
  }
}
