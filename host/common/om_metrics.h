/*
 * om_metrics.h: a small Prometheus registry (text exposition format 0.0.4).
 *
 * Metrics are registered at start-up and updated from any thread: one
 * registry serves a whole process (every proxy worker registers the same
 * series and gets the same one back, so /metrics shows the process's
 * totals). Registration and rendering take the registry's mutex; updates
 * are relaxed atomics and take none. A gauge_fn's reader runs on the
 * thread that renders: it must read only what is safe from there (atomics,
 * or state of the rendering thread). Rendering walks the registry and
 * groups series of one name under a single HELP/TYPE header. A series is a name
 * plus a fixed label set given as Prometheus text (`reason="no_peers"`), so a
 * metric that can go wrong per reason is one series per reason, registered up
 * front: no allocation on the hot path.
 */
#ifndef OM_METRICS_H
#define OM_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct om_metrics_s om_metrics_t;
typedef struct om_metric_s om_metric_t;

/* NULL on allocation failure. */
om_metrics_t *om_metrics_new(void);
void om_metrics_free(om_metrics_t *m);

/*
 * Register a series. name must match [a-zA-Z_:][a-zA-Z0-9_:]*; labels is ""
 * or a comma-separated list of name="value" pairs (values escaped by the
 * caller with om_metrics_escape when they come from input). Registering the
 * same name and labels twice returns the existing series. NULL on bad
 * arguments (a kind clash included) or allocation failure; the om_*
 * updaters accept NULL and do nothing, so a failed registration never
 * crashes a hot path.
 */
om_metric_t *om_metrics_counter(om_metrics_t *m, const char *name,
                                const char *help, const char *labels);
om_metric_t *om_metrics_gauge(om_metrics_t *m, const char *name,
                              const char *help, const char *labels);
/* A gauge read at render time from fn(ud). Registered again with the same
 * name and labels, the existing series is returned and keeps its first
 * reader. */
om_metric_t *om_metrics_gauge_fn(om_metrics_t *m, const char *name,
                                 const char *help, const char *labels,
                                 double (*fn)(void *ud), void *ud);
/* bounds: strictly increasing upper bounds; +Inf is implicit. */
om_metric_t *om_metrics_histogram(om_metrics_t *m, const char *name,
                                  const char *help, const char *labels,
                                  const double *bounds, size_t n);

void om_metric_inc(om_metric_t *c);
void om_metric_add(om_metric_t *c, double v); /* counters: v >= 0 */
void om_metric_set(om_metric_t *g, double v);
void om_metric_observe(om_metric_t *h, double v);
double om_metric_value(const om_metric_t *m); /* counter or gauge */

/*
 * om_metrics_render: the exposition text, malloc'd and NUL-terminated
 * (*len excludes the NUL); NULL on allocation failure.
 */
char *om_metrics_render(const om_metrics_t *m, size_t *len);

/*
 * Escape a label value (backslash, double quote, newline) into out (cap
 * bytes, NUL-terminated, truncated if needed). Returns out.
 */
char *om_metrics_escape(const char *value, char *out, size_t cap);

#endif /* OM_METRICS_H */
