/*
 * om_control.h: the control plane server (`openmesh control`): the leased
 * registry, revisioned discovery, Server-Sent Events watches and validated
 * configuration, over the HTTP/1.1 server (om_http_server.h) and the
 * storage contract (om_store.h), on one libuv loop. docs/CONTROL.md is the
 * operator's description of the routes; this is the embedding API.
 *
 * Routes (names are [A-Za-z0-9._-]{1,128}, percent-decoded per segment):
 *   PUT    /v1/services/{s}/instances/{id}            register / renew
 *   DELETE /v1/services/{s}/instances/{id}            deregister
 *   POST   /v1/services/{s}/instances/{id}/heartbeat  renew (404: re-register)
 *   GET    /v1/services                               services + revisions
 *   GET    /v1/services/{s}?page_size=N&page_token=T  discovery (paged)
 *   GET    /v1/watch/services[/{s}]                   text/event-stream
 *   PUT    /v1/config/{name}, GET /v1/config/{name}   documents / policies
 *   GET    /v1/watch/config/{name}                    text/event-stream
 *   GET    /healthz, /metrics (no auth), /status
 *
 * Watches share one store subscription per kind (every service, every
 * document): a change is encoded once (the snapshot's cached SSE bytes) and
 * written to each watcher of that service, so fan-out costs one writev per
 * watcher. A watcher that still has unsent bytes when the next write would
 * take its backlog past max_watch_backlog is cut (it reconnects and
 * resyncs with Last-Event-ID), so a slow reader costs at most the limit
 * plus one event.
 *
 * Threading: everything on the loop thread.
 */
#ifndef OM_CONTROL_H
#define OM_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "om_auth.h"
#include "om_http_server.h"
#include "om_store.h"

typedef struct om_control_s om_control_t;

#define OM_CONTROL_DEFAULT_PING_MS 15000u
#define OM_CONTROL_DEFAULT_BACKLOG ((size_t)1 << 20)
#define OM_CONTROL_DEFAULT_RETRY_MS 2000u
#define OM_CONTROL_MAX_PAGE_SIZE 1000u
/* A lease renewed at the longest TTL a registration may ask for
 * (OM_TTL_MAX_MS) has been renewed at least once within this. */
#define OM_CONTROL_DEFAULT_WARMUP_MS OM_TTL_MAX_MS
#define OM_CONTROL_MAX_WARMUP_MS (UINT64_C(24) * 3600 * 1000)
/* `openmesh control`'s --empty-service-ttl default: 10 minutes. */
#define OM_CONTROL_DEFAULT_EMPTY_TTL_MS (UINT64_C(10) * 60 * 1000)
#define OM_CONTROL_MAX_EMPTY_TTL_MS (UINT64_C(30) * 24 * 3600 * 1000)
/* Connections over max_connections kept for /healthz and /readyz
 * (om_http_server_opts_t.reserve_connections, when the caller sets none). */
#define OM_CONTROL_HEALTH_RESERVE 16u
/* The largest watch coalescing interval (?min_interval_ms, the floor). */
#define OM_CONTROL_MAX_WATCH_INTERVAL_MS 60000u

typedef struct om_control_opts_s {
  /* Required, borrowed: it must outlive the control plane (close the
   * control plane first, then the store). */
  om_store_t *store;
  /* Bearer tokens; NULL: no authentication. Taken over on success only
   * (freed by the control plane, or replaced by om_control_set_auth). */
  om_auth_t *auth;
  /* Access-Control-Allow-Origin on every answer ("*" or an origin);
   * NULL: no CORS header (same-origin pages, EventSource included, need
   * none). Copied. */
  const char *cors_origin;
  /* Where openmesh/contract.lua lives, to validate text/x-lua documents;
   * NULL: om_lib_dir(). Copied. */
  const char *lib_dir;
  uint64_t ping_interval_ms; /* `: ping` on every stream; 0: 15 s */
  size_t max_watch_backlog;  /* unsent bytes per watcher; 0: 1 MiB */
  uint64_t retry_ms;         /* `retry:` at the start of each stream; 0: 2 s */
  /*
   * The warm-up window: for this long after the store lost its state
   * (om_store_status_t.state_lost grew: a memory store at start, a Redis
   * that came back empty), every snapshot served carries "warming": true,
   * /readyz answers 503, and at its end every watcher gets its snapshot
   * again without the member (docs/CONTROL.md "Warm-up"). 0: no window
   * (the embedding default; `openmesh control` defaults to
   * OM_CONTROL_DEFAULT_WARMUP_MS). At most OM_CONTROL_MAX_WARMUP_MS.
   */
  uint64_t warmup_ms;
  /*
   * A service with no instance and no watcher of its own for this long is
   * removed from the store (om_store_collect_empty; checked with each
   * ping), so services registered once are not listed forever. 0: never
   * (the embedding default; `openmesh control` defaults to
   * OM_CONTROL_DEFAULT_EMPTY_TTL_MS). At most OM_CONTROL_MAX_EMPTY_TTL_MS.
   */
  uint64_t empty_service_ttl_ms;
  /* The least interval between two events of one watch stream
   * (?min_interval_ms raises it, never lowers it); 0: none. At most
   * OM_CONTROL_MAX_WATCH_INTERVAL_MS, else om_control_new is OM_EINVAL. */
  uint64_t watch_min_interval_ms;
  om_http_server_opts_t http; /* limits; zeroes are the server defaults */
} om_control_opts_t;

/*
 * om_control_new: a control plane on loop, not yet listening. Returns 0
 * with *out, OM_EINVAL (loop, out or opts->store NULL, a cors_origin with
 * bytes a header value cannot carry, warmup_ms above
 * OM_CONTROL_MAX_WARMUP_MS, empty_service_ttl_ms above
 * OM_CONTROL_MAX_EMPTY_TTL_MS), OM_ENOMEM, or what the store's
 * subscribe returned; on error nothing is left on the loop or the store,
 * and the caller still owns opts->auth. Release with om_control_close.
 */
int om_control_new(uv_loop_t *loop, const om_control_opts_t *opts,
                   om_control_t **out);

/*
 * om_control_listen: bind host (an IP literal) and port (0: any free
 * port, see om_control_port). Returns 0, OM_EINVAL, OM_ESTATE (already
 * listening, or closing) or OM_EIO (cannot bind; the control plane must be
 * closed).
 */
int om_control_listen(om_control_t *c, const char *host, int port);

/* The bound port, or OM_ESTATE when not listening. */
int om_control_port(const om_control_t *c);

/*
 * om_control_set_auth: replace the token set (NULL turns authentication
 * off). Takes auth over and frees the previous set; requests already
 * answered are unaffected, open watches keep running.
 */
void om_control_set_auth(om_control_t *c, om_auth_t *auth);

/*
 * om_control_reload_auth: re-read a token file (SIGHUP). On success the
 * new set replaces the old one and an "auth_reloaded" line is logged; on
 * failure the old set stays, an "auth_reload_failed" line with the file's
 * message is logged, and the failure is counted. Returns 0 or the
 * om_auth_load error (message in err when errlen > 0).
 */
int om_control_reload_auth(om_control_t *c, const char *path, char *err,
                           size_t errlen);

typedef struct om_control_stats_s {
  size_t watchers;           /* open watch streams */
  uint64_t events_sent;      /* snapshot events written to watchers */
  uint64_t watchers_dropped; /* cut for their backlog */
  uint64_t revision;         /* highest revision seen (high-water mark) */
  int warming;               /* inside the warm-up window */
} om_control_stats_t;

/* Live figures (tests, embedding hosts). */
void om_control_stats(const om_control_t *c, om_control_stats_t *out);

/*
 * om_control_close: stop accepting, end every watch stream cleanly (the
 * final zero-length chunk, so a client sees a complete response and
 * reconnects), answer or drain what is in flight (om_http_server_close),
 * unsubscribe from the store, then free everything and call done(ud) from
 * the loop (done may be NULL). The store is not closed. Returns 0, or
 * OM_ESTATE when already closing (nothing changed), OM_EINVAL for NULL.
 */
int om_control_close(om_control_t *c, void (*done)(void *ud), void *ud);

#endif /* OM_CONTROL_H */
