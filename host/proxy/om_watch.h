/*
 * om_watch.h: the proxy's view of one service's topology, kept current
 * over the control plane's watch stream.
 *
 * A watch holds one long-lived `GET /v1/watch/services/{s}` (Server-Sent
 * Events, WHATWG HTML 9.2) on the loop's libcurl multi (om_curl_uv.h).
 * Every `snapshot` event is decoded and validated exactly as the registry
 * validates writes (om_snapshot_from_json: shape, unique ids, parseable
 * URLs), then checked against the watch: the service must be the one
 * watched, the revision newer than the current one. Only then does it
 * replace the current snapshot. Anything else (malformed, another service,
 * older, over the size bound) is counted, logged and dropped, and the last
 * good snapshot stays: a broken or confused control plane can stall the
 * topology, never corrupt it. An equal revision is not an error: it is
 * what a resume after a reconnect normally brings.
 *
 * The stream is kept alive the way EventSource does (WHATWG HTML 9.2.3,
 * "reestablish the connection"), with the changes a sidecar needs:
 * - every end of a stream (EOF, reset, HTTP error status, a response that
 *   is not text/event-stream, an event over the size bound) reconnects,
 *   where EventSource would give up on a bad status or type: a control
 *   plane behind a load balancer answers 502/503 while it restarts, and a
 *   service that does not exist yet may answer 404;
 * - the delay is AWS "full jitter" exponential backoff (om_backoff.h), so
 *   a fleet of proxies does not reconnect in lockstep, but never shorter
 *   than the stream's `retry:` (9.2.6), clamped to the backoff cap;
 *   401/403 wait between half the cap and the cap every time: a token is
 *   not fixed by hammering;
 * - a reconnect sends `Last-Event-ID` = the revision of the last GOOD
 *   snapshot (not the parser's last event ID, which a rejected event also
 *   moves), so the control plane resends the current snapshot unless the
 *   watch already holds it;
 * - no byte for 3 heartbeat intervals (the control plane's `: ping`
 *   comments come every heartbeat) means a dead stream, also while
 *   connecting: the transfer is cut and the watch reconnects.
 *
 * Several control planes (on one shared store, so that revisions are the
 * same everywhere) can be given. The watch sticks with the plane that
 * works; an end that says the plane is gone (a connect or read failure,
 * a 5xx, silence, or the plane ending the stream) moves it to the next
 * plane (round robin) at once, with the same Last-Event-ID, so the new
 * plane sends a snapshot only if it holds a newer revision (an equal one
 * counts as a duplicate and is never delivered). The backoff runs only
 * after every plane failed in a row. Answers from a live plane (404,
 * 401/403, other 4xx) and local problems (too_big, no_memory) stay on
 * that plane and back off as with one plane.
 *
 * A snapshot that says "warming": true comes from a plane whose store
 * lost its state and may not know every live instance yet
 * (docs/CONTROL.md "Warm-up"). It does not replace the topology: the
 * watch merges it with the peers it held before that this plane has not
 * mentioned yet, and replaces as usual once a snapshot without "warming"
 * arrives (the plane resends its current one when its window ends, at the
 * same revision, which is then taken though not newer). While merged, a
 * reconnect sends no Last-Event-ID, so it cannot miss that resend.
 *
 * Callbacks never run inside libcurl: events are validated as bytes
 * arrive, but on_snapshot and on_error are called from a loop timer right
 * after, so they may start requests, close this or another watch, or
 * close the loop's other handles. Several snapshots accepted from one read
 * are delivered once, as the newest (the store contract allows skipping
 * superseded revisions; revisions delivered only ever increase).
 *
 * Threading: everything on the loop thread.
 */
#ifndef OM_WATCH_H
#define OM_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "om_curl_uv.h"
#include "om_metrics.h"
#include "om_snapshot.h"

typedef struct om_watch_s om_watch_t;

#define OM_WATCH_DEFAULT_HEARTBEAT_MS 15000u
#define OM_WATCH_DEFAULT_BACKOFF_BASE_MS 200u
#define OM_WATCH_DEFAULT_BACKOFF_CAP_MS 10000u
/* A 10,000-instance snapshot is about 2 MiB of JSON. */
#define OM_WATCH_DEFAULT_MAX_EVENT_BYTES ((size_t)16 << 20)
/* Silence longer than this many heartbeats is a dead stream. */
#define OM_WATCH_MISSED_HEARTBEATS 3u
#define OM_WATCH_TOKEN_MAX 4096u
/* Most control planes one watch fails over between. */
#define OM_WATCH_MAX_PLANES 16u

/*
 * A newer valid snapshot is current. snap is borrowed for the call:
 * om_snapshot_ref it to keep it. Runs from the loop, outside libcurl.
 */
typedef void (*om_watch_snapshot_cb)(void *ud, om_snapshot_t *snap);

/*
 * Something went wrong since the last call: reason is a stable token
 * ("malformed", "wrong_service", "stale", "too_big", "eof", "transport",
 * "http_status", "unauthorized", "silent", "no_memory"), detail a message
 * for humans; both valid during the call. Problems are coalesced: when
 * several happen between two loop turns, the latest is reported (the
 * counters in om_watch_stats_t have every one). Runs from the loop,
 * outside libcurl; the last good snapshot is still current.
 */
typedef void (*om_watch_error_cb)(void *ud, const char *reason,
                                  const char *detail);

/*
 * A config watch (opts.config): a newer revision of the document arrived.
 * data is its body as the control plane stored it (not NUL-terminated),
 * borrowed for the call. The watch checks only the revision (the event's
 * id, newer than the last one delivered) and the size bound: what the
 * document means is the consumer's to judge, and a document it refuses
 * stays refused (the next reconnect sends Last-Event-ID = this revision,
 * so the plane does not resend it). Runs from the loop, outside libcurl.
 */
typedef void (*om_watch_document_cb)(void *ud, uint64_t revision,
                                     const char *data, size_t len);

/*
 * The consumer's own rules for a valid, newer snapshot (the proxy's: every
 * peer URL is one its upstream client can reach). Nonzero refuses it, with
 * a message in err (NUL-terminated): counted (rejected_refused), logged,
 * and the current snapshot stays, as for a malformed one; so a resend of
 * the same revision is not mistaken for a duplicate of something held.
 * Runs while events are parsed: no side effects, no call into the watch.
 */
typedef int (*om_watch_check_cb)(void *ud, const om_snapshot_t *snap, char *err,
                                 size_t errlen);

typedef struct om_watch_opts_s {
  /* The control plane's base URL, http:// or https://, without the
   * /v1/... path ("http://127.0.0.1:7600"; a trailing '/' is fine).
   * Required unless control_urls is given; copied. */
  const char *control_url;
  /* Or several base URLs (1..OM_WATCH_MAX_PLANES, each as control_url,
   * no two alike), the first tried first, then the next on failure;
   * used when n_control_urls > 0 (control_url must then be NULL).
   * Copied. */
  const char *const *control_urls;
  size_t n_control_urls;
  /* The service to watch: om_valid_name. Required unless config is
   * given; copied. */
  const char *service;
  /* Or a configuration document to watch (`GET /v1/watch/config/{name}`,
   * om_valid_name; service must then be NULL): its revisions go to
   * on_document; on_snapshot and check are not used, and no metrics are
   * registered (the consumer counts what it does with a document). */
  const char *config;
  /* Config watches: the revision the consumer already holds (a cached
   * copy), sent as the first Last-Event-ID; 0: none. */
  uint64_t last_event_id;
  om_watch_document_cb on_document; /* config watches */
  /* A bearer token (RFC 6750 section 2.1), sent as
   * `Authorization: Bearer <token>`; NULL: none. At most
   * OM_WATCH_TOKEN_MAX visible ASCII bytes. Copied. */
  const char *token;
  /* For https:// planes: the CA file to trust (NULL: the system store)
   * and a client certificate and key to present (both or neither; a
   * control plane with a `san:` entry for it takes it instead of a
   * token). Peer and host are always verified; a verification failure
   * is a transport error of that plane (logged with libcurl's reason),
   * so the watch moves on as for a connect failure. The names are
   * copied; the files are read at each handshake. NULL: defaults. */
  const om_curl_tls_t *tls;
  /* The control plane's ping interval; 0: 15 s. */
  uint64_t heartbeat_ms;
  /* Backoff ceiling for the first retry, doubling up to the cap;
   * 0: 200 ms and 10 s. base > cap means cap. */
  uint64_t backoff_base_ms;
  uint64_t backoff_cap_ms;
  /* Bound on one event's buffered bytes (om_sse.h); 0: 16 MiB. A larger
   * event ends the stream (it cannot be skipped mid-event). */
  size_t max_event_bytes;
  /* Jitter seed; 0: from the clock and the watch's address. */
  uint64_t seed;
  /* Optional registry: openmesh_watch_* series labelled with the service
   * are registered on it (it must outlive the watch), and
   * openmesh_proxy_watch_failovers_total{service} and
   * openmesh_proxy_watch_plane{service,plane} (1 for the plane in use,
   * 0 for the others). */
  om_metrics_t *metrics;
  om_watch_snapshot_cb on_snapshot; /* optional */
  om_watch_check_cb check;          /* optional */
  om_watch_error_cb on_error;       /* optional */
  void *ud;
} om_watch_opts_t;

typedef enum {
  OM_WATCH_CONNECTING, /* a request is out, no stream yet */
  OM_WATCH_STREAMING,  /* 200 text/event-stream: events flow */
  OM_WATCH_BACKOFF,    /* waiting to reconnect */
  OM_WATCH_CLOSING     /* om_watch_close was called */
} om_watch_state_t;

/* "connecting", "streaming", "backoff", "closing" ("?" else). */
const char *om_watch_state_name(om_watch_state_t state);

typedef struct om_watch_stats_s {
  om_watch_state_t state;
  uint64_t revision;   /* of the current snapshot; 0: none yet */
  uint64_t connects;   /* requests started */
  uint64_t streams;    /* of them, answered 200 text/event-stream */
  uint64_t reconnects; /* ends of a request or stream followed by a backoff */
  uint64_t events;     /* events dispatched by the SSE parser, any type */
  uint64_t snapshots;  /* accepted: valid and newer (current replaced) */
  uint64_t duplicates; /* valid, same revision as the current one */
  uint64_t rejected_malformed; /* not a valid snapshot document */
  uint64_t rejected_stale;     /* valid, older than the current one */
  uint64_t rejected_service;   /* valid, another service's */
  uint64_t rejected_too_big;   /* over max_event_bytes (stream dropped) */
  uint64_t rejected_refused;   /* valid and newer, refused by opts.check */
  uint64_t ignored;            /* events of a type other than `snapshot` */
  uint64_t http_errors;        /* answers other than 200 text/event-stream */
  uint64_t auth_errors;        /* of them, 401 and 403 */
  uint64_t transport_errors;   /* connect/read failures, resets */
  uint64_t silent;     /* requests or streams cut after 3 silent heartbeats */
  uint64_t failovers;  /* moves to another control plane */
  size_t plane;        /* index of the plane in use (0: the first given) */
  int warming;         /* current came from a warming plane (merged) */
  size_t warming_kept; /* of its peers, those kept from before */
  uint64_t warming_merges; /* warming snapshots that kept a peer */
  long last_status;        /* the last final HTTP status; 0: none */
  char last_error[192];    /* the last problem's message; "" if none */
} om_watch_stats_t;

/*
 * om_watch_new: start watching opts->service at opts->control_url (or
 * the first of opts->control_urls): the first request is added to cu
 * before this returns. loop and cu must
 * outlive the watch (close the watch before the glue: om_curl_uv_close
 * would otherwise cancel its transfer behind its back). Returns 0 with
 * *out; OM_EINVAL (NULL argument, no or invalid service, a URL that is
 * not absolute http(s) or holds bytes a URL cannot, no URL, both
 * control_url and control_urls, more than OM_WATCH_MAX_PLANES or the
 * same URL twice, a tls with a certificate and no key or the reverse, a
 * token with bytes a
 * header cannot carry or longer than OM_WATCH_TOKEN_MAX, max_event_bytes
 * above the parser's limit); OM_ESTATE (called from inside a libcurl
 * callback, or cu is closing); OM_ENOMEM. On error nothing was allocated
 * or left on the loop or in cu. Release with om_watch_close, which is
 * asynchronous because the watch owns libuv handles.
 */
int om_watch_new(uv_loop_t *loop, om_curl_uv_t *cu, const om_watch_opts_t *opts,
                 om_watch_t **out);

/*
 * om_watch_current: the last good snapshot (NULL until the first one),
 * borrowed: valid until the watch replaces it, which only happens from
 * the loop (om_snapshot_ref to keep it longer). It may be one loop turn
 * ahead of the last on_snapshot call.
 */
om_snapshot_t *om_watch_current(const om_watch_t *w);

/* Live figures into *out (NULL w or out: nothing). */
void om_watch_stats(const om_watch_t *w, om_watch_stats_t *out);

/* The watched service or document name (the watch's copy). */
const char *om_watch_service(const om_watch_t *w);

/*
 * om_watch_status: the watch for /status, a new jansson object:
 * {"control": the plane in use, "control_planes": [every base URL],
 * "state", "revision", "failovers", "connects", "reconnects",
 * "snapshots", "duplicates", "last_status", "last_error", "warming",
 * "warming_kept"}. NULL on
 * allocation failure or NULL w.
 */
struct json_t *om_watch_status(const om_watch_t *w);

/* The base URL of the control plane in use, as given (the watch's copy;
 * valid until the next loop turn, when it may move). NULL w: NULL. */
const char *om_watch_control_url(const om_watch_t *w);

/*
 * om_watch_close: stop watching: cancel the request, stop the timers, and
 * free the watch and its current snapshot once its handles have closed;
 * then done(ud) runs from the loop (done may be NULL), never before this
 * returns. No on_snapshot or on_error runs after this returns. Safe from
 * the watch's own callbacks and from inside a libcurl callback (the
 * cancel then happens on the next loop turn). Returns 0; OM_EINVAL
 * (NULL); OM_ESTATE when already closing (nothing changed).
 */
int om_watch_close(om_watch_t *w, void (*done)(void *ud), void *ud);

#endif /* OM_WATCH_H */
