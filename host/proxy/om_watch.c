/* om_watch.c: the topology watch client (see om_watch.h). */
#include "om_watch.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "om_backoff.h"
#include "om_errno.h"
#include "om_log.h"
#include "om_rng.h"
#include "om_snapshot_json.h"
#include "om_sse.h"
#include "om_url.h"

#define WATCH_PATH "/v1/watch/services/"
#define WATCH_CONFIG_PATH "/v1/watch/config/"
#define MS_NS UINT64_C(1000000)

/* Why a request or stream ended; the reason token is API (om_watch.h). */
#define END_MAP(XX)                                                            \
  XX(EOF, "eof")                                                               \
  XX(TRANSPORT, "transport")                                                   \
  XX(HTTP, "http_status")                                                      \
  XX(AUTH, "unauthorized")                                                     \
  XX(SILENT, "silent")                                                         \
  XX(TOO_BIG, "too_big")                                                       \
  XX(NOMEM, "no_memory")

typedef enum {
  END_NONE = -1,
#define XX(name, s) END_##name,
  END_MAP(XX)
#undef XX
      END__COUNT
} end_t;

static const char *const end_names[] = {
#define XX(name, s) s,
    END_MAP(XX)
#undef XX
};

/* What became of one event; the first labels the metric series. */
#define EV_MAP(XX)                                                             \
  XX(ACCEPTED, "accepted")                                                     \
  XX(DUPLICATE, "duplicate")                                                   \
  XX(MALFORMED, "malformed")                                                   \
  XX(STALE, "stale")                                                           \
  XX(SERVICE, "wrong_service")                                                 \
  XX(TOO_BIG, "too_big")                                                       \
  XX(REFUSED, "refused")                                                       \
  XX(IGNORED, "ignored")

typedef enum {
#define XX(name, s) EV_##name,
  EV_MAP(XX)
#undef XX
      EV__COUNT
} ev_t;

static const char *const ev_names[] = {
#define XX(name, s) s,
    EV_MAP(XX)
#undef XX
};

struct om_watch_s {
  uv_loop_t *loop;
  om_curl_uv_t *cu;
  char *service;
  char *url;    /* the whole watch URL of the plane in use: urls[plane] */
  char **urls;  /* one whole watch URL per control plane */
  char **bases; /* the base URLs, as given */
  size_t n_planes;
  size_t round_left; /* planes still to try before a backoff */
  char *auth_line;   /* "Authorization: Bearer ..." or NULL */
  uint64_t silence_ms, base_ns, cap_ns;
  size_t max_event_bytes;
  om_watch_snapshot_cb on_snapshot;
  om_watch_check_cb check;
  om_watch_error_cb on_error;
  void *ud;
  om_rng_t rng;

  CURL *easy;
  struct curl_slist *headers; /* of the running request */
  om_sse_parser_t *parser;
  char errbuf[CURL_ERROR_SIZE];

  /* the running request */
  int xfer;      /* added to cu */
  int streaming; /* 200 text/event-stream seen */
  int ctype_ok;  /* Content-Type of the response being read */
  int body_seen;
  long status; /* final status, 0 until the header section ended */
  end_t end;   /* set when we cut the transfer ourselves */
  uint64_t last_rx_ms;
  uint32_t attempt; /* consecutive failures: the backoff exponent */

  om_snapshot_t *current;
  int deliver_snapshot; /* current not yet handed to on_snapshot */
  /* current came from a warming plane (merge_warming): the peers it
   * still carries from before are those of carry, NULL: none */
  int warming;
  om_snapshot_t *carry;
  uint64_t plane_rev; /* the plane's revision current stands for */

  /* a config watch (opts.config): the last document taken */
  int is_config;
  om_watch_document_cb on_document;
  char *doc;
  size_t doc_len;
  uint64_t doc_rev; /* 0: none (or opts.last_event_id) */
  int deliver_document;
  int deliver_error; /* last_error not yet handed to on_error */
  const char *error_reason;

  uv_timer_t retry_timer, silence_timer, deliver_timer;
  int handles_open; /* libuv handles not yet closed */
  int closing, cancel_pending;
  void (*done)(void *ud);
  void *done_ud;

  om_watch_stats_t st;

  struct {
    om_metric_t *events[EV__COUNT];
    om_metric_t *ends[END__COUNT];
    om_metric_t *revision, *streaming, *failovers;
    om_metric_t *warming, *kept, *merges;
    om_metric_t *plane[OM_WATCH_MAX_PLANES];
  } m;
};

const char *om_watch_state_name(om_watch_state_t state) {
  switch (state) {
  case OM_WATCH_CONNECTING:
    return "connecting";
  case OM_WATCH_STREAMING:
    return "streaming";
  case OM_WATCH_BACKOFF:
    return "backoff";
  case OM_WATCH_CLOSING:
    return "closing";
  }
  return "?";
}

/* ------------------------------------------------------------------ */
/* bookkeeping */

/* The copies watch_alloc made (any may be NULL). */
static void free_strings(om_watch_t *w) {
  for (size_t i = 0; w->urls != NULL && i < w->n_planes; i++)
    free(w->urls[i]);
  for (size_t i = 0; w->bases != NULL && i < w->n_planes; i++)
    free(w->bases[i]);
  free(w->urls);
  free(w->bases);
  free(w->service);
  free(w->auth_line);
}

/* A fresh round of planes to try, starting with the one in use. */
static void new_round(om_watch_t *w) {
  w->round_left = w->n_planes - 1;
}

static void on_deliver(uv_timer_t *t);

/* Callbacks run from the loop on the next turn, never inside libcurl. */
static void kick_deliver(om_watch_t *w) {
  if (!w->closing)
    uv_timer_start(&w->deliver_timer, on_deliver, 0, 0);
}

/* Remember a problem for on_error (coalesced) and for stats. */
static void note_error(om_watch_t *w, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_state(om_watch_t *w, om_watch_state_t s) {
  w->st.state = s;
  om_metric_set(w->m.streaming, s == OM_WATCH_STREAMING ? 1.0 : 0.0);
}

static void count_event(om_watch_t *w, ev_t what) {
  om_metric_inc(w->m.events[what]);
}

static void reject(om_watch_t *w, ev_t what, uint64_t *counter,
                   const om_sse_event_t *ev, uint64_t revision,
                   const char *detail);

/* The log key of the watched name. */
static const char *name_key(const om_watch_t *w) {
  return w->is_config ? "config" : "service";
}

/* The revision the watch holds: the resume point of a reconnect. */
static uint64_t held_revision(const om_watch_t *w) {
  if (w->is_config)
    return w->doc_rev;
  return w->plane_rev;
}

/*
 * What a reconnect sends as Last-Event-ID. Not the revision of a merged
 * topology: the plane may have finished warming since, and would then
 * not resend that revision without "warming" (the client already holds
 * it); with no Last-Event-ID it resends the current snapshot, a
 * duplicate while it warms, the complete topology after.
 */
static uint64_t resume_revision(const om_watch_t *w) {
  return w->warming && !w->is_config ? 0 : held_revision(w);
}

/* A config event's id: the document's revision, decimal digits only. */
static int parse_revision(const char *p, size_t n, uint64_t *out) {
  uint64_t v = 0;
  if (n == 0 || n > 20)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9' || v > (UINT64_MAX - 9) / 10)
      return -1;
    v = v * 10 + (uint64_t)(p[i] - '0');
  }
  *out = v;
  return v > 0 ? 0 : -1;
}

/* One `snapshot` event of a config watch: its id is the revision and its
 * data the document. Only newer revisions are taken. */
static int on_config_event(om_watch_t *w, const om_sse_event_t *ev) {
  uint64_t rev;
  char msg[128], r[24];
  char *copy;
  if (parse_revision(ev->id, ev->id_len, &rev) != 0) {
    reject(w, EV_MALFORMED, &w->st.rejected_malformed, ev, 0,
           "a document event without a revision as its id");
    return 0;
  }
  if (rev < w->doc_rev) {
    snprintf(msg, sizeof msg,
             "revision %" PRIu64 " is older than the current %" PRIu64, rev,
             w->doc_rev);
    reject(w, EV_STALE, &w->st.rejected_stale, ev, rev, msg);
    return 0;
  }
  if (rev == w->doc_rev) {
    w->st.duplicates++;
    count_event(w, EV_DUPLICATE);
    return 0;
  }
  copy = malloc(ev->data_len + 1);
  if (copy == NULL) {
    w->end = END_NOMEM;
    return 1;
  }
  memcpy(copy, ev->data, ev->data_len);
  copy[ev->data_len] = '\0';
  free(w->doc);
  w->doc = copy;
  w->doc_len = ev->data_len;
  w->doc_rev = rev;
  w->st.snapshots++;
  w->st.revision = rev;
  count_event(w, EV_ACCEPTED);
  snprintf(r, sizeof r, "%" PRIu64, rev);
  snprintf(msg, sizeof msg, "%zu", ev->data_len);
  om_log(OM_LOG_INFO, "watch_document", "config", w->service, "revision", r,
         "bytes", msg, NULL);
  w->deliver_document = 1;
  kick_deliver(w);
  return w->closing ? 1 : 0;
}

/* ev: the event (its id helps find a malformed one), NULL when none was
 * dispatched. */
static void reject(om_watch_t *w, ev_t what, uint64_t *counter,
                   const om_sse_event_t *ev, uint64_t revision,
                   const char *detail) {
  char rev[24], id[64];
  (*counter)++;
  count_event(w, what);
  snprintf(rev, sizeof rev, "%" PRIu64, revision);
  if (ev != NULL) {
    size_t cut = ev->id_len > 48 ? 48 : ev->id_len;
    /* the parser's id is valid UTF-8: cut it on a character boundary */
    while (cut < ev->id_len && cut > 0 &&
           ((unsigned char)ev->id[cut] & 0xC0) == 0x80)
      cut--;
    snprintf(id, sizeof id, "%.*s", (int)cut, ev->id);
  }
  om_log(OM_LOG_WARN, "watch_event_rejected", name_key(w), w->service, "reason",
         ev_names[what], "revision", revision ? rev : NULL, "event_id",
         ev != NULL && ev->id_len > 0 ? id : NULL, "detail", detail, NULL);
  note_error(w, ev_names[what], "%s", detail);
}

/* ------------------------------------------------------------------ */
/* events */

/*
 * A snapshot from a plane inside its warm-up window (it lost its store's
 * state and may not know every live instance yet, docs/PROXY.md "A
 * warming control plane"): instead of replacing the topology, keep the
 * peers we knew (carry) that the plane has not mentioned yet, take
 * everything the plane says. A peer the plane has mentioned once leaves
 * carry, so its later removal by that plane (a deregistration, an expiry)
 * is honoured. Returns 0 with *out (a new reference: snap itself when
 * nothing is kept) and *kept, or OM_ENOMEM (nothing changed).
 *
 * A merged topology is no revision the plane issued, and the consumer
 * takes a revision once (om_proxy_set_snapshot: the same revision is a
 * no-op): it is delivered as the plane's revision minus one, so that the
 * plane's own snapshot of that revision, resent without "warming" when
 * its window ends, replaces it. The plane's next revisions are above it
 * anyway. Only when that would not be newer than what was delivered last
 * (a plane whose store bumped the revision by exactly one) is it
 * delivered at the plane's revision; the end of the window then shows
 * with the plane's next change.
 */
static int merge_warming(om_watch_t *w, om_snapshot_t *snap,
                         om_snapshot_t **out, size_t *kept) {
  uint64_t rev = om_snapshot_revision(snap), below = rev - 1;
  uint64_t had = w->current != NULL ? om_snapshot_revision(w->current) : 0;
  size_t nc = w->carry != NULL ? om_snapshot_count(w->carry) : 0, k = 0, r = 0;
  const om_instance_t *in;
  om_instance_t *put = NULL;
  const char **gone = NULL;
  om_snapshot_t *merged = NULL, *rest = NULL;
  int rc = 0;
  *kept = 0;
  if (nc == 0) {
    *out = om_snapshot_ref(snap);
    return 0;
  }
  put = malloc(nc * sizeof *put);
  gone = malloc(nc * sizeof *gone);
  if (put == NULL || gone == NULL) {
    rc = OM_ENOMEM;
    goto done;
  }
  for (size_t i = 0; i < nc; i++) {
    in = om_snapshot_instance(w->carry, i);
    if (om_snapshot_find(snap, in->id) == NULL)
      put[k++] = *in; /* borrowed: om_snapshot_edit copies it */
    else
      gone[r++] = in->id;
  }
  if (k == 0) { /* nothing kept: the plane's snapshot as it is */
    *out = om_snapshot_ref(snap);
  } else {
    rc = om_snapshot_edit(snap, below > had ? below : rev, put, k, NULL, 0,
                          &merged, NULL, NULL, NULL);
    *out = merged;
  }
  if (rc == 0 && r > 0)
    rc = om_snapshot_edit(w->carry, om_snapshot_revision(w->carry), NULL, 0,
                          gone, r, &rest, NULL, NULL, NULL);
  if (rc != 0) {
    om_snapshot_unref(*out);
    *out = NULL;
    goto done;
  }
  if (r > 0) {
    om_snapshot_unref(w->carry);
    w->carry = om_snapshot_count(rest) > 0 ? rest : NULL;
    if (w->carry == NULL)
      om_snapshot_unref(rest);
  }
  *kept = k;
done:
  free(put);
  free(gone);
  return rc;
}

/* One dispatched event (WHATWG HTML 9.2.6): validate, maybe accept. */
static int on_event(void *ud, const om_sse_event_t *ev) {
  om_watch_t *w = ud;
  om_snapshot_t *snap = NULL;
  om_json_error_t err;
  uint64_t rev, cur;
  unsigned flags = 0;
  int warming;
  char msg[256];
  int rc;
  w->st.events++;
  if (ev->type_len != 8 || memcmp(ev->type, "snapshot", 8) != 0) {
    /* a newer control plane may send more kinds of events */
    w->st.ignored++;
    count_event(w, EV_IGNORED);
    return 0;
  }
  if (w->is_config)
    return on_config_event(w, ev);
  rc = om_snapshot_from_json_flags(ev->data, ev->data_len, &snap, &flags, &err);
  if (rc == OM_ENOMEM) {
    /* This update would be lost until the next change: drop the stream,
     * and the resume (Last-Event-ID = current) brings it again. */
    w->end = END_NOMEM;
    return 1;
  }
  if (rc != 0) {
    reject(w, EV_MALFORMED, &w->st.rejected_malformed, ev, 0, err.text);
    return 0;
  }
  rev = om_snapshot_revision(snap);
  cur = w->plane_rev;
  warming = (flags & OM_SNAPSHOT_JSON_WARMING) != 0;
  if (strcmp(om_snapshot_service(snap), w->service) != 0) {
    snprintf(msg, sizeof msg, "snapshot of service '%s' on the watch of '%s'",
             om_snapshot_service(snap), w->service);
    reject(w, EV_SERVICE, &w->st.rejected_service, ev, rev, msg);
  } else if (rev < cur) {
    snprintf(msg, sizeof msg,
             "revision %" PRIu64 " is older than the current %" PRIu64, rev,
             cur);
    reject(w, EV_STALE, &w->st.rejected_stale, ev, rev, msg);
  } else if (rev == cur && (warming || !w->warming)) {
    w->st.duplicates++; /* a resume normally brings the one we hold */
    count_event(w, EV_DUPLICATE);
  } else if (w->check != NULL && w->check(w->ud, snap, msg, sizeof msg) != 0) {
    reject(w, EV_REFUSED, &w->st.rejected_refused, ev, rev, msg);
  } else {
    /* newer, or the one we merged now that the plane is warm */
    char r[24], n[24], k[24];
    om_snapshot_t *next = snap;
    size_t kept = 0;
    if (warming) {
      if (!w->warming) { /* what we knew before the plane lost its state */
        om_snapshot_unref(w->carry);
        w->carry = om_snapshot_ref(w->current);
      }
      if (merge_warming(w, snap, &next, &kept) != 0) {
        w->end = END_NOMEM; /* the resume brings it again */
        om_snapshot_unref(snap);
        return 1;
      }
      om_snapshot_unref(snap);
    } else {
      om_snapshot_unref(w->carry);
      w->carry = NULL;
    }
    snap = NULL;
    w->warming = warming;
    w->plane_rev = rev;
    om_snapshot_unref(w->current);
    w->current = next;
    w->st.snapshots++;
    w->st.revision = rev;
    w->st.warming = warming;
    w->st.warming_kept = kept;
    count_event(w, EV_ACCEPTED);
    om_metric_set(w->m.revision, (double)rev);
    om_metric_set(w->m.warming, warming ? 1.0 : 0.0);
    om_metric_set(w->m.kept, (double)kept);
    snprintf(r, sizeof r, "%" PRIu64, rev);
    snprintf(n, sizeof n, "%zu", om_snapshot_count(w->current));
    snprintf(k, sizeof k, "%zu", kept);
    om_log(OM_LOG_INFO, "watch_snapshot", name_key(w), w->service, "revision",
           r, "instances", n, "warming", warming ? "true" : NULL, NULL);
    if (kept > 0) {
      w->st.warming_merges++;
      om_metric_inc(w->m.merges);
      om_log(OM_LOG_WARN, "watch_warming_merge", name_key(w), w->service,
             "revision", r, "kept", k, "instances", n, "note",
             "the control plane is warming up: peers it did not mention "
             "stay until it is warm",
             NULL);
    }
    w->deliver_snapshot = 1;
    kick_deliver(w);
  }
  om_snapshot_unref(snap);
  return w->closing ? 1 : 0;
}

/* ------------------------------------------------------------------ */
/* libcurl callbacks: nothing here calls the caller or om_curl_uv */

/* RFC 9110 section 8.3.1: media types compare case-insensitively; the
 * essence (type/subtype) must be text/event-stream (WHATWG HTML 9.2.3). */
static int is_event_stream(const char *v, size_t n) {
  static const char want[] = "text/event-stream";
  size_t k = sizeof want - 1;
  while (n > 0 && (*v == ' ' || *v == '\t')) {
    v++;
    n--;
  }
  if (n < k || strncasecmp(v, want, k) != 0)
    return 0;
  return n == k || strchr("; \t\r\n", v[k]) != NULL;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud) {
  om_watch_t *w = ud;
  size_t n = size * nmemb; /* libcurl: size is 1 */
  w->last_rx_ms = uv_now(w->loop);
  if (w->closing)
    return 0;
  if (w->streaming)
    return n; /* trailer fields of a chunked stream that ended */
  if (n >= 5 && memcmp(data, "HTTP/", 5) == 0) {
    w->ctype_ok = 0; /* a new response (after a 1xx) */
    return n;
  }
  if ((n == 2 && data[0] == '\r' && data[1] == '\n') ||
      (n == 1 && data[0] == '\n')) {
    long status = 0;
    curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 100 && status < 200)
      return n;
    w->status = status;
    w->st.last_status = status;
    if (status == 200 && w->ctype_ok) {
      char from[24];
      w->streaming = 1;
      w->st.streams++;
      set_state(w, OM_WATCH_STREAMING);
      snprintf(from, sizeof from, "%" PRIu64, resume_revision(w));
      om_log(OM_LOG_INFO, "watch_connected", name_key(w), w->service, "control",
             w->bases[w->st.plane], "last_event_id",
             resume_revision(w) != 0 ? from : NULL, NULL);
      if (w->warming) {
        /* maybe another plane, or the same one started again: it has
         * mentioned nothing yet, so everything we hold is carried */
        om_snapshot_unref(w->carry);
        w->carry = om_snapshot_ref(w->current);
      }
      return n;
    }
    return 0; /* an error status: its body is of no use to us */
  }
  if (n > 13 && strncasecmp(data, "content-type:", 13) == 0)
    w->ctype_ok = is_event_stream(data + 13, n - 13);
  return n;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud) {
  om_watch_t *w = ud;
  size_t n = size * nmemb;
  int rc;
  w->last_rx_ms = uv_now(w->loop);
  if (w->closing || !w->streaming)
    return 0;
  if (!w->body_seen) {
    /* a live control plane, not one that accepts and hangs up: the next
     * failure starts the backoff from the bottom again */
    w->body_seen = 1;
    w->attempt = 0;
    new_round(w);
  }
  rc = om_sse_parser_feed(w->parser, data, n, on_event, w);
  if (rc == 0)
    return n;
  if (rc == OM_ETOOBIG) {
    char msg[96];
    w->end = END_TOO_BIG;
    snprintf(msg, sizeof msg, "an event exceeds %zu bytes", w->max_event_bytes);
    reject(w, EV_TOO_BIG, &w->st.rejected_too_big, NULL, 0, msg);
  } else if (rc == OM_ENOMEM) {
    w->end = END_NOMEM;
  }
  return 0; /* a short count ends the transfer: CURLE_WRITE_ERROR */
}

/* ------------------------------------------------------------------ */
/* requests and reconnects */

static void on_done(void *ud, CURL *easy, CURLcode result);
static void on_silence(uv_timer_t *t);
static void on_retry(uv_timer_t *t);
static void maybe_finish(om_watch_t *w);

static int append(struct curl_slist **list, const char *line) {
  struct curl_slist *n = curl_slist_append(*list, line);
  if (n == NULL)
    return OM_ENOMEM;
  *list = n;
  return 0;
}

/* Add the request to cu; the caller arms the silence timer. */
static int start_request(om_watch_t *w) {
  struct curl_slist *h = NULL;
  char line[48];
  int rc = 0;
  /* WHATWG HTML 9.2.2: Accept: text/event-stream, no cached answers;
   * 9.2.3: Last-Event-ID on a reconnect. */
  rc = append(&h, "Accept: text/event-stream");
  if (rc == 0)
    rc = append(&h, "Cache-Control: no-cache");
  if (rc == 0 && w->auth_line != NULL)
    rc = append(&h, w->auth_line);
  if (rc == 0 && resume_revision(w) != 0) {
    snprintf(line, sizeof line, "Last-Event-ID: %" PRIu64, resume_revision(w));
    rc = append(&h, line);
  }
  if (rc != 0) {
    curl_slist_free_all(h);
    return rc;
  }
  curl_easy_setopt(w->easy, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(w->easy, CURLOPT_URL, w->url); /* the plane in use */
  w->streaming = w->ctype_ok = w->body_seen = 0;
  w->status = 0;
  w->end = END_NONE;
  w->errbuf[0] = '\0';
  om_sse_parser_reset(w->parser); /* keeps `retry` (9.2.6) */
  rc = om_curl_uv_add(w->cu, w->easy, on_done, w);
  if (rc != 0) {
    curl_easy_setopt(w->easy, CURLOPT_HTTPHEADER, w->headers);
    curl_slist_free_all(h);
    return rc;
  }
  curl_slist_free_all(w->headers);
  w->headers = h;
  w->xfer = 1;
  w->st.connects++;
  w->last_rx_ms = uv_now(w->loop);
  set_state(w, OM_WATCH_CONNECTING);
  return 0;
}

static void arm_silence(om_watch_t *w) {
  uv_timer_start(&w->silence_timer, on_silence, w->silence_ms, 0);
}

/* An end that says the plane is gone, not that our request or our side is
 * wrong: worth trying another plane. */
static int plane_gone(const om_watch_t *w, end_t why) {
  return why == END_TRANSPORT || why == END_SILENT || why == END_EOF ||
         (why == END_HTTP && w->status >= 500);
}

/* Move to the next plane (round robin); the next request goes there. */
static void fail_over(om_watch_t *w, end_t why) {
  size_t from = w->st.plane;
  w->st.plane = (from + 1) % w->n_planes;
  w->url = w->urls[w->st.plane];
  w->st.failovers++;
  om_metric_inc(w->m.failovers);
  om_metric_set(w->m.plane[from], 0.0);
  om_metric_set(w->m.plane[w->st.plane], 1.0);
  om_log(OM_LOG_WARN, "watch_failover", name_key(w), w->service, "from",
         w->bases[from], "to", w->bases[w->st.plane], "reason", end_names[why],
         NULL);
}

static void schedule_retry(om_watch_t *w, end_t why, const char *detail) {
  uint64_t delay_ns, delay_ms;
  int64_t retry = om_sse_parser_retry_ms(w->parser);
  char ms[24], st[24];
  int now = 0;
  if (w->n_planes > 1 && plane_gone(w, why)) {
    /* another plane of this round is untried: go there at once; after a
     * whole round failed, back off first */
    now = w->round_left > 0;
    if (now)
      w->round_left--;
    else
      new_round(w);
  } else {
    new_round(w); /* the plane answered: stay with it */
  }
  if (now) {
    w->st.reconnects++;
    om_metric_inc(w->m.ends[why]);
    set_state(w, OM_WATCH_BACKOFF);
    snprintf(st, sizeof st, "%ld", w->status);
    om_log(why == END_EOF ? OM_LOG_INFO : OM_LOG_WARN, "watch_disconnected",
           name_key(w), w->service, "control", w->bases[w->st.plane], "reason",
           end_names[why], "status", w->status ? st : NULL, "detail", detail,
           "retry_in_ms", "0", NULL);
    fail_over(w, why);
    uv_timer_start(&w->retry_timer, on_retry, 0, 0);
    note_error(w, end_names[why], "%s", detail);
    return;
  }
  if (w->attempt < UINT32_MAX)
    w->attempt++;
  if (why == END_AUTH) {
    /* "at the cap": between half the cap and the cap, still jittered */
    uint64_t half = w->cap_ns / 2;
    delay_ns =
        half + (uint64_t)(om_rng_double(&w->rng) * (double)(w->cap_ns - half));
  } else {
    delay_ns = om_backoff_ns(w->attempt, w->base_ns, w->cap_ns, &w->rng);
  }
  /* The stream's reconnection time is a floor, but a server cannot park
   * us beyond our own cap. */
  if (retry >= 0) {
    uint64_t r = (uint64_t)retry > w->cap_ns / MS_NS ? w->cap_ns
                                                     : (uint64_t)retry * MS_NS;
    if (r > delay_ns)
      delay_ns = r;
  }
  delay_ms = (delay_ns + MS_NS - 1) / MS_NS;
  w->st.reconnects++;
  om_metric_inc(w->m.ends[why]);
  set_state(w, OM_WATCH_BACKOFF);
  uv_timer_start(&w->retry_timer, on_retry, delay_ms, 0);
  snprintf(ms, sizeof ms, "%" PRIu64, delay_ms);
  snprintf(st, sizeof st, "%ld", w->status);
  om_log(why == END_EOF ? OM_LOG_INFO : OM_LOG_WARN, "watch_disconnected",
         name_key(w), w->service, "control", w->bases[w->st.plane], "reason",
         end_names[why], "status", w->status ? st : NULL, "detail", detail,
         "retry_in_ms", ms, NULL);
  if (w->n_planes > 1 && plane_gone(w, why))
    fail_over(w, why); /* the round failed: the next plane, after the wait */
  note_error(w, end_names[why], "%s", detail);
}

static void on_retry(uv_timer_t *t) {
  om_watch_t *w = t->data;
  int rc;
  if (w->closing)
    return;
  rc = start_request(w);
  if (rc != 0) {
    w->st.transport_errors++;
    schedule_retry(w, rc == OM_ENOMEM ? END_NOMEM : END_TRANSPORT,
                   om_strerror(rc));
    return;
  }
  arm_silence(w);
}

static void on_silence(uv_timer_t *t) {
  om_watch_t *w = t->data;
  uint64_t now = uv_now(w->loop), quiet = now - w->last_rx_ms;
  char msg[96];
  if (w->closing || !w->xfer)
    return;
  if (quiet < w->silence_ms) {
    uv_timer_start(&w->silence_timer, on_silence, w->silence_ms - quiet, 0);
    return;
  }
  /* a timer callback is outside libcurl: cancel works here */
  if (om_curl_uv_cancel(w->cu, w->easy) != 0)
    return; /* it already ended: on_done handles it */
  w->xfer = 0;
  w->st.silent++;
  snprintf(msg, sizeof msg, "no byte for %" PRIu64 " ms (%u heartbeats)", quiet,
           OM_WATCH_MISSED_HEARTBEATS);
  schedule_retry(w, END_SILENT, msg);
}

static void on_done(void *ud, CURL *easy, CURLcode result) {
  om_watch_t *w = ud;
  char msg[CURL_ERROR_SIZE + 64];
  end_t why;
  (void)easy;
  w->xfer = 0;
  uv_timer_stop(&w->silence_timer);
  if (w->closing) {
    maybe_finish(w);
    return;
  }
  if (w->end == END_TOO_BIG) {
    why = END_TOO_BIG;
    snprintf(msg, sizeof msg, "an event exceeded the size bound");
  } else if (w->end == END_NOMEM) {
    why = END_NOMEM;
    snprintf(msg, sizeof msg, "out of memory while reading the stream");
  } else if (w->status != 0 && !w->streaming) {
    w->st.http_errors++;
    why = END_HTTP;
    if (w->status == 401 || w->status == 403) {
      w->st.auth_errors++;
      why = END_AUTH;
    }
    if (w->status == 200)
      snprintf(msg, sizeof msg, "200 answer that is not text/event-stream");
    else
      snprintf(msg, sizeof msg, "HTTP status %ld", w->status);
  } else if (result != CURLE_OK) {
    w->st.transport_errors++;
    why = END_TRANSPORT;
    om_curl_error_text(result, w->errbuf, msg, sizeof msg);
  } else {
    why = END_EOF;
    snprintf(msg, sizeof msg, "the control plane ended the stream");
  }
  schedule_retry(w, why, msg);
}

/* ------------------------------------------------------------------ */
/* deferred callbacks and closing */

static void note_error(om_watch_t *w, const char *reason, const char *fmt,
                       ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->st.last_error, sizeof w->st.last_error, fmt, ap);
  va_end(ap);
  w->error_reason = reason;
  w->deliver_error = 1;
  kick_deliver(w);
}

static void on_handle_closed(uv_handle_t *h) {
  om_watch_t *w = h->data;
  if (--w->handles_open > 0)
    return;
  if (w->done != NULL)
    w->done(w->done_ud);
  curl_easy_cleanup(w->easy);
  curl_slist_free_all(w->headers);
  om_sse_parser_free(w->parser);
  om_snapshot_unref(w->current);
  om_snapshot_unref(w->carry);
  free(w->doc);
  free_strings(w);
  free(w);
}

/* Once the request is gone, close the handles (the last frees w). */
static void maybe_finish(om_watch_t *w) {
  if (!w->closing || w->xfer || w->handles_open != 3 || w->cancel_pending)
    return;
  uv_close((uv_handle_t *)&w->retry_timer, on_handle_closed);
  uv_close((uv_handle_t *)&w->silence_timer, on_handle_closed);
  uv_close((uv_handle_t *)&w->deliver_timer, on_handle_closed);
}

static void on_deliver(uv_timer_t *t) {
  om_watch_t *w = t->data;
  if (w->closing) {
    if (w->cancel_pending) {
      /* om_watch_close came from inside libcurl; we are outside now */
      w->cancel_pending = 0;
      if (w->xfer && om_curl_uv_cancel(w->cu, w->easy) == 0)
        w->xfer = 0;
      maybe_finish(w);
    }
    return;
  }
  if (w->deliver_snapshot && w->current != NULL) {
    om_snapshot_t *s = om_snapshot_ref(w->current);
    w->deliver_snapshot = 0;
    if (w->on_snapshot != NULL)
      w->on_snapshot(w->ud, s);
    om_snapshot_unref(s);
  }
  if (w->deliver_document && w->doc != NULL) {
    /* w->doc only changes inside libcurl, never during this call; a
     * close from the callback frees it on a later loop turn */
    w->deliver_document = 0;
    if (w->on_document != NULL)
      w->on_document(w->ud, w->doc_rev, w->doc, w->doc_len);
  }
  if (w->deliver_error && !w->closing) {
    char detail[sizeof w->st.last_error];
    w->deliver_error = 0;
    memcpy(detail, w->st.last_error, sizeof detail);
    if (w->on_error != NULL)
      w->on_error(w->ud, w->error_reason, detail);
  }
}

int om_watch_close(om_watch_t *w, void (*done)(void *ud), void *ud) {
  if (w == NULL)
    return OM_EINVAL;
  if (w->closing)
    return OM_ESTATE;
  w->closing = 1;
  w->done = done;
  w->done_ud = ud;
  w->st.state = OM_WATCH_CLOSING;
  om_metric_set(w->m.streaming, 0.0);
  uv_timer_stop(&w->retry_timer);
  uv_timer_stop(&w->silence_timer);
  uv_timer_stop(&w->deliver_timer);
  if (w->xfer) {
    int rc = om_curl_uv_cancel(w->cu, w->easy);
    if (rc == OM_ESTATE) {
      /* inside a libcurl callback: our callbacks now refuse every byte,
       * and the cancel happens from the loop, outside */
      w->cancel_pending = 1;
      uv_timer_start(&w->deliver_timer, on_deliver, 0, 0);
      return 0;
    }
    w->xfer = 0;
  }
  maybe_finish(w);
  return 0;
}

/* ------------------------------------------------------------------ */
/* creation */

/* The base URL under the one URL rule of instance URLs (om_url.h), which
 * also refuses a query and a fragment: the watch path is appended. */
static int valid_base_url(const char *url) {
  om_url_t u;
  return om_url_parse(url, &u, NULL) == 0;
}

/* RFC 6750 section 2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" /
 * "~" / "+" / "/" ) *"="; we accept any visible ASCII (a stricter control
 * plane refuses it with a 401 that the operator sees), never CR/LF. */
static int valid_token(const char *t) {
  size_t n = strlen(t);
  if (n == 0 || n > OM_WATCH_TOKEN_MAX)
    return 0;
  for (; *t != '\0'; t++)
    if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f)
      return 0;
  return 1;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d != NULL)
    memcpy(d, s, n);
  return d;
}

static void register_metrics(om_watch_t *w, om_metrics_t *r) {
  char svc[OM_NAME_MAX * 2 + 1], labels[OM_NAME_MAX * 2 + 64];
  if (r == NULL)
    return;
  /* A failed registration leaves a NULL series, which every updater
   * ignores: metrics never make a watch fail. */
  om_metrics_escape(w->service, svc, sizeof svc);
  for (int i = 0; i < EV__COUNT; i++) {
    snprintf(labels, sizeof labels, "service=\"%s\",result=\"%s\"", svc,
             ev_names[i]);
    w->m.events[i] = om_metrics_counter(
        r, "openmesh_watch_events_total",
        "Watch stream events received, by what became of them", labels);
  }
  for (int i = 0; i < END__COUNT; i++) {
    snprintf(labels, sizeof labels, "service=\"%s\",reason=\"%s\"", svc,
             end_names[i]);
    w->m.ends[i] = om_metrics_counter(
        r, "openmesh_watch_reconnects_total",
        "Watch requests or streams that ended and were retried, by reason",
        labels);
  }
  snprintf(labels, sizeof labels, "service=\"%s\"", svc);
  w->m.revision =
      om_metrics_gauge(r, "openmesh_watch_revision",
                       "Revision of the current (last good) snapshot", labels);
  w->m.streaming = om_metrics_gauge(r, "openmesh_watch_streaming",
                                    "1 while the watch stream is up", labels);
  w->m.warming = om_metrics_gauge(
      r, "openmesh_watch_warming",
      "1 while the topology comes from a control plane that is warming up "
      "(merged with the peers known before)",
      labels);
  w->m.kept = om_metrics_gauge(
      r, "openmesh_watch_warming_kept_peers",
      "Peers of the topology the warming control plane did not mention "
      "(kept from before)",
      labels);
  w->m.merges = om_metrics_counter(
      r, "openmesh_watch_warming_merges_total",
      "Snapshots of a warming control plane merged with peers it did not "
      "mention instead of replacing the topology",
      labels);
  w->m.failovers = om_metrics_counter(
      r, "openmesh_proxy_watch_failovers_total",
      "Moves of a service's watch to another control plane", labels);
  for (size_t i = 0; i < w->n_planes; i++) {
    char plane[OM_URL_MAX * 2 + 1], pl[sizeof svc + sizeof plane + 32];
    om_metrics_escape(w->bases[i], plane, sizeof plane);
    snprintf(pl, sizeof pl, "service=\"%s\",plane=\"%s\"", svc, plane);
    w->m.plane[i] = om_metrics_gauge(
        r, "openmesh_proxy_watch_plane",
        "1 for the control plane a service's watch uses, 0 for the others", pl);
    om_metric_set(w->m.plane[i], i == w->st.plane ? 1.0 : 0.0);
  }
}

/* The base URL (its first n bytes) without trailing '/'. */
static size_t base_len(const char *url) {
  size_t n = strlen(url);
  while (n > 0 && url[n - 1] == '/')
    n--;
  return n;
}

/* The whole watch URL of one plane. */
static char *watch_url(const char *base, const char *path,
                       const char *service) {
  size_t n = base_len(base), k = strlen(path);
  char *u = malloc(n + k + strlen(service) + 1);
  if (u == NULL)
    return NULL;
  memcpy(u, base, n);
  memcpy(u + n, path, k);
  strcpy(u + n + k, service);
  return u;
}

/* Everything but the request and the handles. planes: n base URLs. */
static int watch_alloc(const om_watch_opts_t *o, const char *const *planes,
                       size_t n, om_watch_t **out) {
  om_sse_parser_opts_t po;
  om_watch_t *w = calloc(1, sizeof *w);
  int oom = 0;
  if (w == NULL)
    return OM_ENOMEM;
  const char *name = o->config != NULL ? o->config : o->service;
  w->is_config = o->config != NULL;
  w->service = dup_str(name);
  w->urls = calloc(n, sizeof *w->urls);
  w->bases = calloc(n, sizeof *w->bases);
  if (w->urls != NULL && w->bases != NULL) {
    w->n_planes = n;
    for (size_t i = 0; i < n; i++) {
      w->urls[i] = watch_url(
          planes[i], w->is_config ? WATCH_CONFIG_PATH : WATCH_PATH, name);
      w->bases[i] = dup_str(planes[i]);
      oom |= w->urls[i] == NULL || w->bases[i] == NULL;
    }
  }
  if (o->token != NULL) {
    size_t len = strlen(o->token) + sizeof "Authorization: Bearer ";
    w->auth_line = malloc(len);
    if (w->auth_line != NULL)
      snprintf(w->auth_line, len, "Authorization: Bearer %s", o->token);
  }
  memset(&po, 0, sizeof po);
  po.max_event_bytes = o->max_event_bytes ? o->max_event_bytes
                                          : OM_WATCH_DEFAULT_MAX_EVENT_BYTES;
  w->max_event_bytes = po.max_event_bytes;
  if (oom || w->service == NULL || w->urls == NULL || w->bases == NULL ||
      (o->token != NULL && w->auth_line == NULL) ||
      om_sse_parser_new(&po, &w->parser) != 0 ||
      (w->easy = curl_easy_init()) == NULL) {
    om_sse_parser_free(w->parser);
    free_strings(w);
    free(w);
    return OM_ENOMEM;
  }
  w->url = w->urls[0];
  new_round(w);
  *out = w;
  return 0;
}

static void watch_free_unstarted(om_watch_t *w) {
  curl_easy_cleanup(w->easy);
  curl_slist_free_all(w->headers);
  om_sse_parser_free(w->parser);
  free_strings(w);
  free(w);
}

/* The handle is set up once and reused for every request of the watch;
 * libcurl keeps its copies of the TLS file names, so tls is not kept. */
static int setup_easy(om_watch_t *w, const om_curl_tls_t *tls) {
  CURL *e = w->easy;
  int rc = om_curl_easy_base(e, w->url, w->errbuf);
  if (rc == 0)
    rc = om_curl_easy_tls(e, tls);
  if (rc != 0)
    return rc;
  /* a stream has no end: the silence timer is the only timeout, and it
   * covers the connect too */
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 0L);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                   w->silence_ms > LONG_MAX ? LONG_MAX : (long)w->silence_ms);
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, w);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, w);
  return 0;
}

/* The planes of opts: one control_url or 1..OM_WATCH_MAX_PLANES
 * control_urls, each a valid base URL, no two alike. NULL when not. */
static const char *const *planes_of(const om_watch_opts_t *o, size_t *n) {
  const char *const *p =
      o->n_control_urls > 0 ? o->control_urls : &o->control_url;
  *n = o->n_control_urls > 0 ? o->n_control_urls : 1;
  if (*n > OM_WATCH_MAX_PLANES || p == NULL ||
      (o->n_control_urls > 0 && o->control_url != NULL))
    return NULL;
  for (size_t i = 0; i < *n; i++) {
    if (p[i] == NULL || !valid_base_url(p[i]))
      return NULL;
    for (size_t j = 0; j < i; j++)
      if (base_len(p[i]) == base_len(p[j]) &&
          memcmp(p[i], p[j], base_len(p[i])) == 0)
        return NULL;
  }
  return p;
}

int om_watch_new(uv_loop_t *loop, om_curl_uv_t *cu, const om_watch_opts_t *opts,
                 om_watch_t **out) {
  om_watch_t *w = NULL;
  const char *const *planes = NULL;
  uint64_t hb, base, cap;
  size_t n_planes = 0;
  char np[24];
  int rc;
  if (loop == NULL || cu == NULL || opts == NULL || out == NULL ||
      (planes = planes_of(opts, &n_planes)) == NULL ||
      (opts->service == NULL) == (opts->config == NULL) ||
      (opts->service != NULL &&
       !om_valid_name(opts->service, strlen(opts->service))) ||
      (opts->config != NULL &&
       !om_valid_name(opts->config, strlen(opts->config))) ||
      (opts->token != NULL && !valid_token(opts->token)) ||
      (opts->tls != NULL &&
       (opts->tls->cert_file == NULL) != (opts->tls->key_file == NULL)) ||
      opts->max_event_bytes > OM_SSE_MAX_EVENT_BYTES_LIMIT)
    return OM_EINVAL;
  hb = opts->heartbeat_ms ? opts->heartbeat_ms : OM_WATCH_DEFAULT_HEARTBEAT_MS;
  base = opts->backoff_base_ms ? opts->backoff_base_ms
                               : OM_WATCH_DEFAULT_BACKOFF_BASE_MS;
  cap = opts->backoff_cap_ms ? opts->backoff_cap_ms
                             : OM_WATCH_DEFAULT_BACKOFF_CAP_MS;
  /* bounds that keep the ns arithmetic and uv timeouts exact: a day */
  if (hb > UINT64_C(86400000) || base > UINT64_C(86400000) ||
      cap > UINT64_C(86400000))
    return OM_EINVAL;
  rc = watch_alloc(opts, planes, n_planes, &w);
  if (rc != 0)
    return rc;
  w->loop = loop;
  w->cu = cu;
  w->silence_ms = hb * OM_WATCH_MISSED_HEARTBEATS;
  w->base_ns = base * MS_NS;
  w->cap_ns = cap * MS_NS;
  w->on_snapshot = opts->on_snapshot;
  w->check = opts->check;
  w->on_error = opts->on_error;
  w->on_document = opts->on_document;
  if (w->is_config) {
    w->doc_rev = opts->last_event_id;
    w->st.revision = opts->last_event_id;
  }
  w->ud = opts->ud;
  om_rng_seed(&w->rng,
              opts->seed ? opts->seed : uv_hrtime() ^ (uint64_t)(uintptr_t)w);
  rc = setup_easy(w, opts->tls);
  if (rc == 0)
    rc = start_request(w);
  if (rc != 0) {
    watch_free_unstarted(w);
    return rc;
  }
  /* Past the last failure point: handles now, so a failed new never
   * needs an asynchronous close. */
  uv_timer_init(loop, &w->retry_timer); /* cannot fail */
  uv_timer_init(loop, &w->silence_timer);
  uv_timer_init(loop, &w->deliver_timer);
  w->retry_timer.data = w->silence_timer.data = w->deliver_timer.data = w;
  w->handles_open = 3;
  arm_silence(w);
  if (!w->is_config)
    register_metrics(w, opts->metrics);
  set_state(w, OM_WATCH_CONNECTING);
  snprintf(np, sizeof np, "%zu", w->n_planes);
  om_log(OM_LOG_INFO, "watch_started", name_key(w), w->service, "url", w->url,
         "control_planes", np, NULL);
  *out = w;
  return 0;
}

om_snapshot_t *om_watch_current(const om_watch_t *w) {
  return w != NULL ? w->current : NULL;
}

void om_watch_stats(const om_watch_t *w, om_watch_stats_t *out) {
  if (w == NULL || out == NULL)
    return;
  *out = w->st;
}

const char *om_watch_service(const om_watch_t *w) {
  return w != NULL ? w->service : NULL;
}

const char *om_watch_control_url(const om_watch_t *w) {
  return w != NULL ? w->bases[w->st.plane] : NULL;
}

json_t *om_watch_status(const om_watch_t *w) {
  json_t *planes, *o;
  if (w == NULL || (planes = json_array()) == NULL)
    return NULL;
  for (size_t i = 0; i < w->n_planes; i++)
    if (json_array_append_new(planes, json_string(w->bases[i])) != 0) {
      json_decref(planes);
      return NULL;
    }
  o = json_pack(
      "{s:s, s:o, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:s, s:b, s:I}",
      "control", w->bases[w->st.plane], "control_planes", planes, "state",
      om_watch_state_name(w->st.state), "revision", (json_int_t)w->st.revision,
      "failovers", (json_int_t)w->st.failovers, "connects",
      (json_int_t)w->st.connects, "reconnects", (json_int_t)w->st.reconnects,
      "snapshots", (json_int_t)w->st.snapshots, "duplicates",
      (json_int_t)w->st.duplicates, "last_status", (int)w->st.last_status,
      "last_error", w->st.last_error, "warming", w->warming, "warming_kept",
      (json_int_t)w->st.warming_kept);
  return o; /* json_pack's "o" took planes, also on failure */
}
