/*
 * om_proxy.h: the data plane's call path (`openmesh proxy`), on one libuv
 * loop. docs/ARCHITECTURE.md "A proxied request", docs/PROXY.md.
 *
 *   request -> service from Host (port ignored)
 *     -> traffic policy narrows the subset (and may give a key; else the
 *        x-openmesh-key header does)
 *     -> admission per service pool (max_inflight, bounded FIFO max_queue,
 *        optional adaptive limit; waits bounded by the call's deadline)
 *     -> selection inside the subset, skipping open circuits: rendezvous
 *        rank when keyed, power of two choices otherwise
 *     -> attempt, its head due within min(per_try, remaining) -> classify;
 *        the request body is read from the client as the attempt takes
 *        it (om_proxy_body.c: streamed, a replay copy up to replay_limit)
 *     -> retry (safe method / Idempotency-Key / policy opt-in; retryable
 *        outcome; retry budget; room left in the deadline; same subset;
 *        next peer in rank or another P2C pick; full-jitter backoff)
 *     -> commit (a non-5xx head relayed): the deadline ends; the stream
 *        idle timeout and the optional max stream duration bound the body
 *
 * Topology comes in through one seam, om_proxy_set_snapshot, one service
 * at a time: the --static loader uses it now, the control-plane watch
 * client will use it later. Peer state (circuit, P2C load and latency) is
 * kept by peer id across snapshot revisions.
 *
 * Ownership: the proxy owns its listeners, upstream pool, policy watchers
 * and per-service state; snapshots are shared by reference. Everything
 * runs on the loop thread; the process must ignore SIGPIPE.
 */
#ifndef OM_PROXY_H
#define OM_PROXY_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "om_circuit.h"
#include "om_http_server.h"
#include "om_retry.h"
#include "om_snapshot.h"
#include "om_upstream.h"

typedef struct om_proxy_s om_proxy_t;

/*
 * A table of peer circuits for the proxies (workers) of one process to
 * share (om_proxy_opts_t.circuits). Any thread. NULL on allocation
 * failure; free it after every proxy that uses it is freed.
 */
typedef struct om_proxy_circuits_s om_proxy_circuits_t;
om_proxy_circuits_t *om_proxy_circuits_new(void);
void om_proxy_circuits_free(om_proxy_circuits_t *t);

/* A traffic policy file for one service (--service-policy S=FILE). */
typedef struct om_proxy_service_policy_s {
  const char *service;
  const char *path;
} om_proxy_service_policy_t;

/*
 * Options. Zero in a field means its default. Pool settings (max_inflight,
 * max_queue, adaptive, deadline_ms, per_try_timeout_ms, retries,
 * retry_non_idempotent) and the stream timeouts (stream_idle_timeout_ms,
 * max_stream_ms, max_deadline_ms) come from each service's traffic policy;
 * a policy that omits one gets the default listed in docs/PROXY.md.
 */
typedef struct om_proxy_opts_s {
  /* The traffic policy for every service without its own: required. */
  const char *policy_path;
  const om_proxy_service_policy_t *service_policies;
  size_t n_service_policies;
  const char *lib_dir; /* the Lua library; NULL: om_lib_dir() */
  /*
   * The downstream listener's limits. Request bodies are streamed
   * (stream_bodies is forced on): server.max_body_bytes, when set, is a
   * hard limit of the listener's own (413); the per-service limit is
   * max_body_bytes below.
   */
  om_http_server_opts_t server;
  om_upstream_pool_opts_t upstream;
  /* Request bodies are kept for a replay while what was sent so far fits
   * this; a larger one is never retried once its first byte left.
   * Default 1 MiB; a policy's replay_limit overrides it. */
  size_t replay_limit;
  /* Replay copies held by all calls together: a body whose copy would take
   * the total past it is forwarded without one (never retried once its
   * first byte left), so many concurrent uploads cannot hold max_inflight
   * x replay_limit per service. Default 64 MiB. */
  size_t replay_budget;
  /* Per-peer circuits; NULL: om_circuit_opts_default with a 10 s probe
   * timeout (a probe whose caller went away must not pin the circuit). */
  const om_circuit_opts_t *circuit;
  /* The retry budget of each service; NULL: 20% over 10 s, 10/s floor. */
  const om_retry_budget_opts_t *budget;
  uint64_t backoff_base_ms; /* full-jitter base; default 25 */
  uint64_t backoff_cap_ms;  /* full-jitter cap; default 1000 */
  /* No attempt starts with less than this left of the deadline: it could
   * not finish. Default 5. */
  uint64_t min_attempt_ms;
  /* Retry 429 too (by default 502, 503, 504 and transport failures). A
   * Retry-After on a retried 429 or 503 is the wait before the retry when
   * it fits in the deadline; when it does not, the response is relayed. */
  int retry_429;
  /* Longest Retry-After honoured (a longer one means: no retry). Default
   * 10 s. */
  uint64_t retry_after_ceiling_ms;
  /* Downstream bytes queued in memory before the upstream read pauses;
   * it resumes below a quarter of it. Default 256 KiB. */
  size_t high_water;
  /* A committed response body of at least this many bytes (by its
   * Content-Length) goes socket to socket by splice(2) when both sides
   * are plaintext HTTP/1.1 (docs/PROXY.md "Large bodies"). Default
   * 1 MiB; UINT64_MAX: never. */
  uint64_t splice_min_bytes;
  /* Seed of the proxy's generator (P2C draws, jitter, request ids); 0:
   * from the clock. */
  uint64_t seed;
  /* The largest request body (413 beyond: at the head for a
   * Content-Length, else when the count passes it); 0: no limit, as
   * Envoy's streaming default. A policy's max_body_bytes overrides it. */
  uint64_t max_body_bytes;
  /* The first cooldown of a service whose traffic policy keeps overrunning
   * its budget (docs/PROXY.md "Policy budgets"); it doubles per failed
   * probe up to 30 times this. Default 10 s. */
  uint64_t policy_shed_cooldown_ms;
  /* TLS to https:// peers (docs/PROXY.md "TLS to upstreams"): the CA
   * certificates to trust (NULL: the system store) and a client
   * certificate and key to present (both or neither), for every service;
   * a policy's tls = {...} overrides them field by field. Read by
   * om_proxy_new (an error names the flag and the file), re-read by
   * om_proxy_reload_tls. upstream.tls_ctx is ignored: this is its
   * source. */
  const char *upstream_ca, *upstream_cert, *upstream_key;
  /* The registry to register the proxy's series on (borrowed: it must
   * outlive the proxy), so that the workers of one process share one
   * (om_proxy_workers.h); NULL: the proxy's own. */
  struct om_metrics_s *metrics;
  /* This proxy is worker `worker` of `workers` (0: one, the whole
   * process): its admission pool gets its share of each service's
   * max_inflight and max_queue (value / workers, one more for the first
   * value % workers; max_inflight at least 1), and its retry budget its
   * share of the per-second minimum; the ratio holds as it is. */
  uint32_t worker, workers;
  /* The process's peer circuits (borrowed; om_proxy_circuits_new), which
   * the workers share: a peer of the same service, id and URL has one
   * circuit whichever worker calls it. NULL: the proxy's own. */
  struct om_proxy_circuits_s *circuits;
  /* The access log (borrowed; om_proxy_access_log.h), which the workers
   * share, each with its own buffers; NULL: off. */
  struct om_access_log_s *access_log;
} om_proxy_opts_t;

/*
 * om_proxy_new: a proxy on loop. Loads nothing yet (a service's policy
 * loads when it first gets a snapshot) but checks that the policy files
 * can be read. Copies opts and every string in it. Returns 0 and *out;
 * OM_EINVAL (a NULL argument, no policy_path, a service policy without a
 * valid service name or a path, circuit or budget options out of range, a
 * listener or pool limit out of range; err says which), OM_ENOTFOUND (a
 * policy file cannot be read), OM_ENOMEM. On error *out is untouched; any
 * libuv handle already opened is being closed, and nothing is left once
 * the loop has run. A proxy is freed only by om_proxy_close (always: it
 * owns libuv handles).
 */
int om_proxy_new(uv_loop_t *loop, const om_proxy_opts_t *opts, om_proxy_t **out,
                 char *err, size_t errlen);

/*
 * om_proxy_listen / om_proxy_listen_admin: bind the call listener and the
 * admin listener (/metrics, /status, /healthz). host is an IP literal,
 * port 0 picks a free port. Returns 0, OM_ESTATE (already listening or
 * closing), OM_EINVAL, OM_EIO (cannot bind), OM_ENOMEM.
 */
int om_proxy_listen(om_proxy_t *p, const char *host, int port);
int om_proxy_listen_admin(om_proxy_t *p, const char *host, int port);

/*
 * om_proxy_listen_fd: accept calls on fd, a socket bound and listening
 * (om_http_listen_socket, or a dup of one another worker accepts on too).
 * The proxy owns fd from the call on, even on error. Returns as
 * om_proxy_listen.
 */
int om_proxy_listen_fd(om_proxy_t *p, int fd);

/* The bound ports, or OM_ESTATE when not listening. */
int om_proxy_port(const om_proxy_t *p);
int om_proxy_admin_port(const om_proxy_t *p);

/*
 * om_proxy_set_snapshot: make snap the topology of its service (named by
 * om_snapshot_service). The first snapshot of a service creates its state
 * and loads its policy (its --service-policy file, else policy_path).
 * The proxy takes its own reference; the caller keeps its own.
 *
 * A snapshot whose revision is older than the current one is refused
 * (OM_ESTATE); the same revision again is a no-op (0). Every peer URL
 * must be one the upstream client can reach (http[s]://IP[:PORT][/path]):
 * otherwise OM_EINVAL naming the instance. A policy that does not load
 * is OM_EPOLICY. On any error (OM_ENOMEM included) the previous snapshot
 * stays in force, nothing changed, and err (may be NULL) says why.
 *
 * Peers are matched by id (and URL) with the previous revision: a peer
 * still present keeps its circuit, its in-flight count and its latency
 * estimate; a new one starts fresh. Calls in flight finish on the view
 * they started with (their subset stays what the policy chose).
 */
/*
 * om_proxy_check_snapshot: whether om_proxy_set_snapshot would refuse snap
 * for its peers (a URL the upstream client cannot reach: a name, a query).
 * 0, or OM_EINVAL with the reason in err. No side effects: a watch calls it
 * before a snapshot becomes its current one (om_watch_opts_t.check).
 */
int om_proxy_check_snapshot(const om_proxy_t *p, const om_snapshot_t *snap,
                            char *err, size_t errlen);

int om_proxy_set_snapshot(om_proxy_t *p, om_snapshot_t *snap, char *err,
                          size_t errlen);

/*
 * om_proxy_reload_policies: re-read every service's policy file now
 * (SIGHUP). A file that fails keeps its last good version (logged,
 * counted, in /status). Returns the number of files rejected (0: all
 * loaded or unchanged).
 */
int om_proxy_reload_policies(om_proxy_t *p);

/*
 * om_proxy_reload_tls: re-read the files of every TLS context (the
 * proxy's --upstream-* and each service policy's tls), on SIGHUP. A
 * context whose files fail keeps its last good ones (logged, in /status).
 * New connections use the new files; open ones keep theirs. Returns the
 * number of contexts that failed, OM_EINVAL for NULL.
 */
int om_proxy_reload_tls(om_proxy_t *p);

/*
 * om_proxy_close: stop accepting, let in-flight calls finish (up to
 * server.drain_timeout_ms, then cut them), then close everything and run
 * on_closed(ud) (may be NULL) from the loop; the proxy is freed after it
 * returns. Returns 0, OM_EINVAL (NULL), OM_ESTATE (already closing).
 */
int om_proxy_close(om_proxy_t *p, void (*on_closed)(void *ud), void *ud);

/*
 * om_proxy_metrics: the proxy's metrics registry (what /metrics renders),
 * for the parts that feed the proxy and live beside it (the control-plane
 * watches) to register their series on. Borrowed: valid until the proxy
 * is freed. NULL p: NULL.
 */
struct om_metrics_s *om_proxy_metrics(om_proxy_t *p);

/*
 * om_proxy_set_status_extra: /status gains a top-level member key whose
 * value fn(ud) builds on each request (a new jansson reference the proxy
 * takes; NULL leaves the member out). For what the proxy does not own but
 * an operator looks for there (which control plane each watch uses). One
 * hook per proxy: a second call replaces the first; fn NULL removes it.
 * key is copied (at most 31 bytes). Returns 0, OM_EINVAL (NULL p or key,
 * a longer key).
 */
typedef struct json_t *(*om_proxy_status_fn)(void *ud);
int om_proxy_set_status_extra(om_proxy_t *p, const char *key,
                              om_proxy_status_fn fn, void *ud);

/*
 * om_proxy_status_json: what /status answers, as a new jansson object
 * (the caller's), without the om_proxy_set_status_extra member, plus
 * "connections_accepted" (calls listener); om_proxy_live_metrics: the
 * part of /metrics read from live state (per service, per peer), malloc'd
 * text (*len its length). Both NULL on allocation failure. For a process
 * of several workers, which renders these on each worker's loop and
 * merges them (om_proxy_workers.c). Loop thread only.
 */
struct json_t *om_proxy_status_json(const om_proxy_t *p);
char *om_proxy_live_metrics(const om_proxy_t *p, size_t *len);

/* Counters of one service, for tests and tools (metrics carry the same). */
typedef struct om_proxy_stats_s {
  uint64_t revision;       /* current snapshot revision */
  uint64_t policy_version; /* 1 for the first load, +1 per swap */
  uint64_t policy_failures;
  uint64_t requests; /* calls routed to this service */
  uint64_t attempts; /* upstream attempts started */
  uint64_t retries;  /* attempts after the first */
  uint64_t budget_exhausted;
  uint64_t paused;            /* upstream reads paused for a slow client */
  uint32_t inflight;          /* admitted calls */
  uint32_t queued;            /* calls waiting for a slot */
  uint32_t limit;             /* current in-flight limit */
  size_t peers;               /* in the current snapshot */
  uint64_t policy_cache_hits; /* decisions reused (a policy with `vary`) */
  uint64_t policy_cache_misses;
  uint64_t retries_pre_send; /* of retries: no byte of the request had left
                                (the rest are post-send) */
  uint64_t denied; /* refused by the policy's authorize (403 forbidden) */
  uint64_t spliced_bytes; /* response body bytes moved by splice(2) */
} om_proxy_stats_t;

/* Returns 0 and fills *out; OM_ENOTFOUND for an unknown service. */
int om_proxy_stats(const om_proxy_t *p, const char *service,
                   om_proxy_stats_t *out);

/*
 * om_proxy_peer_circuit: the circuit state of peer id of service now.
 * Returns 0 and *out; OM_ENOTFOUND when no such peer is current.
 */
int om_proxy_peer_circuit(const om_proxy_t *p, const char *service,
                          const char *id, om_circuit_state_t *out);

/* ------------------------------------------------------------------ */
/* the static topology (--static FILE) */

/*
 * om_proxy_static_load: read a static topology,
 *   {"services": {"orders": {"revision": 1, "instances": [
 *     {"id", "url", "weight", "zone", "metadata"}, ...]}, ...}}
 * ("revision" optional, default 1; "weight" default 1; "zone" and
 * "metadata" optional), validated with the snapshot model and the
 * upstream URL rules. On success *out is a malloc'd array of *n snapshots
 * (one reference each; free with om_proxy_static_free). Errors, with err
 * naming the field ("services.orders.instances[2].url: ..."):
 * OM_ENOTFOUND (unreadable), OM_ETOOBIG (over 64 MiB), OM_EPARSE (not
 * JSON), OM_EINVAL (a missing, unknown or invalid field), OM_EDUPLICATE
 * (two instances with one id), OM_ENOMEM. Nothing is allocated on error.
 */
int om_proxy_static_load(const char *path, om_snapshot_t ***out, size_t *n,
                         char *err, size_t errlen);

/* om_proxy_static_parse: the same from buf[0..len) (messages lack the
 * file name). */
int om_proxy_static_parse(const char *buf, size_t len, om_snapshot_t ***out,
                          size_t *n, char *err, size_t errlen);

/* Drop the snapshots and the array. NULL is fine. */
void om_proxy_static_free(om_snapshot_t **snaps, size_t n);

#endif /* OM_PROXY_H */
