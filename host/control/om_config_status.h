/*
 * om_config_status.h: which revision of a configuration document each
 * proxy runs, and which it refused and why (the ACK/NACK of xDS).
 *
 * Proxies that take a policy from the control plane report every verdict
 * (`POST /v1/config/{name}/status`); operators read the table back
 * (`GET /v1/config/{name}/status`). The table is memory on one plane,
 * bounded three ways against a confused or hostile fleet:
 * - at most max_proxies entries per document: a report from a new proxy
 *   into a full table replaces the entry reported least recently (counted
 *   as evicted), so a churning fleet never locks the live proxies out;
 * - entries not refreshed for ttl_ns are dropped (a proxy re-reports
 *   periodically, so only gone proxies expire);
 * - a refusal's reason is cut to OM_CFG_REASON_MAX bytes (on a UTF-8
 *   character boundary), ids and addresses have fixed bounds.
 * The number of documents is bounded by the caller (it only reports on
 * documents that exist). Not thread-safe: one loop.
 */
#ifndef OM_CONFIG_STATUS_H
#define OM_CONFIG_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define OM_CFG_ID_MAX 128u
#define OM_CFG_ADDRESS_MAX 256u
#define OM_CFG_REASON_MAX 512u
#define OM_CFG_DEFAULT_MAX_PROXIES 10000u
#define OM_CFG_DEFAULT_TTL_NS (UINT64_C(600) * 1000000000u) /* 10 min */

typedef struct om_cfg_status_s om_cfg_status_t;

/* One proxy's report on one document. Strings are NUL-terminated. */
typedef struct om_cfg_report_s {
  const char *id;      /* 1..OM_CFG_ID_MAX visible ASCII bytes */
  const char *address; /* NULL or up to OM_CFG_ADDRESS_MAX visible bytes */
  uint64_t applied;    /* the revision it runs; 0: none yet */
  uint64_t refused;    /* the last revision it refused; 0: none */
  const char *reason;  /* why it refused (any length: cut here) */
} om_cfg_report_t;

typedef struct om_cfg_status_stats_s {
  uint64_t entries; /* over every document */
  uint64_t evicted; /* replaced by a new proxy in a full table */
  uint64_t expired; /* not refreshed within the ttl */
} om_cfg_status_stats_t;

/* max_proxies 0: OM_CFG_DEFAULT_MAX_PROXIES; ttl_ns 0: 10 minutes.
 * 0 or OM_ENOMEM. */
int om_cfg_status_new(size_t max_proxies, uint64_t ttl_ns,
                      om_cfg_status_t **out);
void om_cfg_status_free(om_cfg_status_t *t);

/*
 * 1 when r's fields are within the bounds above (id valid, address
 * valid or NULL), else 0 with the offending field's name in *field.
 */
int om_cfg_report_valid(const om_cfg_report_t *r, const char **field);

/*
 * om_cfg_status_report: record r for document name at now_ns (the
 * entry of r->id is replaced; a refusal keeps the time it was first
 * reported while the same revision is refused). 0; OM_EINVAL (an invalid
 * report, see om_cfg_report_valid); OM_ENOMEM (nothing changed).
 */
int om_cfg_status_report(om_cfg_status_t *t, const char *name,
                         const om_cfg_report_t *r, uint64_t now_ns);

/*
 * om_cfg_status_json: {"name", "proxies": [{"id", "address", "applied",
 * "applied_at", "refused", "reason", "refused_at", "last_report",
 * "age_s"}] sorted by id, "count", "max_proxies", "ttl_s"}, times as
 * Unix seconds from wall_s (the wall clock matching now_ns). Expired
 * entries are dropped first. NULL on allocation failure.
 */
json_t *om_cfg_status_json(om_cfg_status_t *t, const char *name,
                           uint64_t now_ns, double wall_s);

/* Entries of name (after dropping the expired ones). */
size_t om_cfg_status_count(om_cfg_status_t *t, const char *name,
                           uint64_t now_ns);

void om_cfg_status_stats(const om_cfg_status_t *t, om_cfg_status_stats_t *out);

#endif /* OM_CONFIG_STATUS_H */
