/*
 * om_policy_source.h: a policy held by the control plane (`--policy
 * control:NAME`), kept in a local file that the proxy's own policy
 * watchers load.
 *
 * The source watches `/v1/watch/config/NAME` (om_watch.h, config mode).
 * Each revision is loaded in this process's runtime first, exactly as a
 * reload of a file would (om_policy_load: sandbox, shape, examples, with
 * the proxy's library directory and budgets), and must be of the expected
 * kind. Only a revision that passes is written to the policy file (a
 * temporary file in the same directory, fsync, rename over: readers see
 * the old bytes or the new ones, never a mix); the proxy then reloads it
 * as it reloads on SIGHUP. A refused revision changes nothing: the last
 * good one keeps routing. An unreachable control plane changes nothing
 * either: the watch reconnects with backoff and the file stays.
 *
 * The file is `DIR/NAME.lua` in the cache directory (or a private
 * temporary directory, removed at exit, without one). It ends with a
 * trailer line naming the source and revision (om_policy_watch.h), so a
 * proxy that starts while the control plane is down can start from the
 * cached copy and knows which revision it holds.
 *
 * Every verdict is reported to the control plane
 * (`POST /v1/config/NAME/status`: id, address, applied revision, refused
 * revision and reason), again every report interval so the plane's entry
 * does not expire, and after a failed report with backoff. Counted in
 * openmesh_proxy_policy_updates_total{source="control",result} and
 * openmesh_proxy_policy_reports_total{result="sent|failed"}.
 *
 * Threading: the loop's thread only.
 */
#ifndef OM_POLICY_SOURCE_H
#define OM_POLICY_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "om_curl_uv.h"
#include "om_metrics.h"
#include "om_policy.h"

typedef struct om_policy_source_s om_policy_source_t;

/* "control:" + a name: 1 with the name in *name, else 0. */
int om_policy_source_is_control(const char *spec, const char **name);

typedef struct om_policy_source_opts_s {
  const char *name; /* the document: om_valid_name; required */
  const char *const *control_urls;
  size_t n_control_urls;       /* 1..16 base URLs; required */
  const char *token;           /* bearer token; NULL: none */
  const om_curl_tls_t *tls;    /* https:// planes; NULL: defaults */
  const char *cache_dir;       /* NULL: a private temporary directory */
  om_policy_opts_t policy;     /* lib_dir (required) and budgets */
  om_policy_kind_t kind;       /* 0: any */
  const char *id;              /* this proxy in reports; required */
  uint64_t report_interval_ms; /* 0: 60 s */
  uint64_t fetch_timeout_ms;   /* the first fetch, per plane; 0: 3 s */
  om_metrics_t *metrics;       /* optional */
  /* A new revision is in the file: reload it (SIGHUP's path). */
  void (*on_update)(void *ud);
  void *ud;
} om_policy_source_opts_t;

/*
 * om_policy_source_start: fetch the current revision
 * (`GET /v1/config/NAME`, each plane in turn, running loop until an
 * answer), validate it and write the file; when no plane answers, or
 * none holds the document, or it is refused, start from the cached file
 * instead if there is a valid one (logged: policy_from_cache, with why).
 * Then start the watch and the reports. Returns 0 with *out (the file is
 * at om_policy_source_path); OM_EIO / OM_ENOTFOUND (no plane
 * answered / no document, and no cache: err says which and why);
 * OM_EPOLICY (the plane's revision was refused and no cache: err has
 * the reason); OM_EINVAL; OM_ENOMEM; OM_EIO (the directory cannot be
 * made or written).
 */
int om_policy_source_start(uv_loop_t *loop, om_curl_uv_t *cu,
                           const om_policy_source_opts_t *opts,
                           om_policy_source_t **out, char *err, size_t errlen);

/* Register the metrics on r now (the registry may come after the
 * start): counts so far are carried over. */
void om_policy_source_metrics(om_policy_source_t *s, om_metrics_t *r);

/* The policy file the proxy loads (valid until the source is freed). */
const char *om_policy_source_path(const om_policy_source_t *s);
/* "control:NAME" */
const char *om_policy_source_spec(const om_policy_source_t *s);

/* The address reported with each verdict (the proxy's listen URL). */
void om_policy_source_set_address(om_policy_source_t *s, const char *address);

/*
 * /status "policy_source": {"source", "path", "cache_dir", "applied",
 * "refused", "reason", "from_cache", "watch": om_watch_status,
 * "reports": {"sent", "failed", "last_status", "last_error"}}.
 */
json_t *om_policy_source_status(const om_policy_source_t *s);

/* Stop the watch and reports; done(ud) runs from the loop once every
 * handle closed (then the source is freed and a private temporary
 * directory removed). */
void om_policy_source_close(om_policy_source_t *s, void (*done)(void *ud),
                            void *ud);

#endif /* OM_POLICY_SOURCE_H */
