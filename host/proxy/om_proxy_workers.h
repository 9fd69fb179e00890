/*
 * om_proxy_workers.h: the proxy on every core. A group runs N workers,
 * each a thread with its own libuv loop and its own om_proxy_t (views,
 * policy VMs, upstream pool, timers, decision cache), beside the control
 * loop of the caller's thread, which keeps everything that is not on the
 * request path: the watches and --static, signals, the admin listener
 * (/metrics, /status, /healthz). docs/ARCHITECTURE.md "Workers".
 *
 *   - One listening socket, bound by the group; every worker accepts on
 *     its own dup of it, so whichever loop is free takes the next
 *     connection, and a second process on the port fails ("address
 *     already in use") instead of silently sharing it (SO_REUSEPORT).
 *   - A snapshot is parsed and validated once, on the control loop, and
 *     the same immutable om_snapshot_t (atomic references) is posted to
 *     every worker's mailbox (a mutex and a uv_async) and applied there
 *     with om_proxy_set_snapshot; SIGHUP and the drain go the same way.
 *   - One metrics registry for the process (every worker registers the
 *     same series; updates are atomic). /metrics and /status are answered
 *     on the control loop from each worker's live part, rendered on the
 *     worker's own loop through the mailbox, then merged: counters and
 *     pool sizes summed, the rest as the first worker has it.
 *   - Circuits: one table for the process (om_proxy_circuits_new): a peer
 *     is ejected after the failures its policy names, counted over every
 *     worker, and a half-open circuit lets one probe through.
 *   - Admission: each worker gets its share of max_inflight and max_queue
 *     (they sum to the policy's values); retry budgets per worker (the
 *     ratio holds, the per-second reserve is split); P2C's in-flight load
 *     is per worker.
 *
 * Threads: every om_proxy_group_* call is made on the control loop's
 * thread. The group owns the workers, their loops and proxies.
 */
#ifndef OM_PROXY_WORKERS_H
#define OM_PROXY_WORKERS_H

#include <stddef.h>

#include <uv.h>

#include "om_http_tls.h"
#include "om_metrics.h"
#include "om_proxy.h"
#include "om_snapshot.h"

#define OM_PROXY_MAX_WORKERS 64

typedef struct om_proxy_group_s om_proxy_group_t;

typedef struct om_proxy_group_opts_s {
  /* Every worker's proxy options (copied; metrics, worker, workers and
   * server.tls are set by the group). */
  om_proxy_opts_t proxy;
  unsigned workers; /* [1, OM_PROXY_MAX_WORKERS] */
  /*
   * The callers' listener TLS of one worker (NULL: plaintext), made on
   * that worker's loop before its thread starts: tls_new(ud, loop, &t)
   * returns 0 and t (NULL for none), or nonzero (the group fails with
   * OM_EINVAL; tls_new has said why). The worker closes it when its
   * proxy has closed, and reloads it on om_proxy_group_reload.
   */
  int (*tls_new)(void *ud, uv_loop_t *loop, om_http_tls_t **out);
  void *tls_ud;
} om_proxy_group_opts_t;

/*
 * om_proxy_group_new: the registry, then N worker loops and proxies, not
 * yet running (om_proxy_group_start). Returns 0 and *out; OM_EINVAL (bad
 * options, a worker count out of range, a TLS that did not load; err says
 * which), OM_ENOTFOUND (a policy file), OM_ENOMEM. On error nothing is
 * left. The group is freed by om_proxy_group_close, started or not.
 */
int om_proxy_group_new(uv_loop_t *control, const om_proxy_group_opts_t *opts,
                       om_proxy_group_t **out, char *err, size_t errlen);

/*
 * om_proxy_group_set_snapshot: make snap the topology of its service on
 * every worker. Before start it is applied at once on each worker (from
 * this thread: their loops are not running) and its error returned as
 * om_proxy_set_snapshot's; once started it is checked here
 * (om_proxy_check_snapshot: OM_EINVAL with err) and posted to every
 * worker, which applies it on its loop and logs a refusal
 * ("snapshot_rejected"). Each worker takes its own reference.
 */
int om_proxy_group_set_snapshot(om_proxy_group_t *g, om_snapshot_t *snap,
                                char *err, size_t errlen);

/* om_proxy_check_snapshot's rules, from the control loop (stateless). */
int om_proxy_group_check_snapshot(const om_proxy_group_t *g,
                                  const om_snapshot_t *snap, char *err,
                                  size_t errlen);

/*
 * om_proxy_group_listen: bind host:port (before start) and have every
 * worker accept on it. Returns 0; OM_EINVAL; OM_EIO (cannot bind: err
 * says why, "address already in use" for a taken port); OM_ESTATE.
 * om_proxy_group_listen_admin: the admin listener, on the control loop.
 */
int om_proxy_group_listen(om_proxy_group_t *g, const char *host, int port,
                          char *err, size_t errlen);
int om_proxy_group_listen_admin(om_proxy_group_t *g, const char *host, int port,
                                char *err, size_t errlen);

/* The bound ports, or OM_ESTATE. */
int om_proxy_group_port(const om_proxy_group_t *g);
int om_proxy_group_admin_port(const om_proxy_group_t *g);

/* The process's registry (borrowed, valid until the group is freed), for
 * what runs on the control loop (the watches) to register on. */
om_metrics_t *om_proxy_group_metrics(om_proxy_group_t *g);

/* As om_proxy_set_status_extra, for /status of the whole process; fn runs
 * on the control loop. */
int om_proxy_group_set_status_extra(om_proxy_group_t *g, const char *key,
                                    om_proxy_status_fn fn, void *ud);

/* Start the worker threads. 0, OM_ESTATE (already), OM_ENOMEM (a thread
 * could not start: the group closes what started; close it as usual). */
int om_proxy_group_start(om_proxy_group_t *g);

/*
 * om_proxy_group_reload: SIGHUP on every worker: the listener TLS, the
 * policy files, the upstream TLS files (each logged by the worker as a
 * single proxy logs them).
 */
void om_proxy_group_reload(om_proxy_group_t *g);

/*
 * om_proxy_group_close: every worker drains (om_proxy_close) and its
 * thread ends; then the admin listener closes, the threads are joined,
 * on_closed(ud) runs on the control loop and the group is freed. Returns
 * 0, OM_EINVAL, OM_ESTATE (already closing). A group never started
 * (a failed listen or snapshot) closes its workers' proxies here, on their
 * loops run from this thread; on_closed still runs from the control loop.
 */
int om_proxy_group_close(om_proxy_group_t *g, void (*on_closed)(void *ud),
                         void *ud);

#endif /* OM_PROXY_WORKERS_H */
