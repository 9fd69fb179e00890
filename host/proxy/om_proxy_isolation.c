/*
 * om_proxy_isolation.c: trouble stays where it belongs (docs/PROXY.md
 * "Local errors" and "Policy budgets").
 *
 * Local errors: when this process runs out of its own resources
 * (descriptors, kernel buffers, memory, ephemeral ports), the upstream
 * client classifies the connect failure as "local_resources"
 * (om_upstream.h). The call path never holds it against the peer: no
 * circuit record, no latency sample, no adaptive-limit sample. Here it is
 * counted (openmesh_proxy_local_errors_total{errno}) and logged at most
 * once a second, with the number of lines suppressed since the last one,
 * because under descriptor exhaustion every call would log.
 *
 * Policy shedding: every service's traffic policy runs on the proxy's one
 * loop, each call under a budget (om_policy.h, budget_ms). A policy that
 * overruns its budget SHED_TRIPS times within SHED_WINDOW_NS is shed for a
 * cooldown (om_proxy_opts_t's policy_shed_cooldown_ms, 10 s by default,
 * doubling while the probe keeps tripping, up to SHED_MAX_FACTOR times
 * it): its requests fail at once with policy_error,
 * without running it, so a hostile or broken policy costs the other
 * services at most a few budgets per window. Once the cooldown passed, the
 * next request that needs the policy runs it: a call within budget ends
 * the shedding, a trip starts the next, longer cooldown. A new policy
 * version starts afresh.
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "om_log.h"
#include "om_policy.h"
#include "om_proxy_internal.h"

#define SHED_TRIPS 5u
#define SHED_WINDOW_NS (UINT64_C(10000) * NS_PER_MS)
#define SHED_COOLDOWN_MS UINT64_C(10000) /* om_proxy_opts_t's default */
#define SHED_MAX_FACTOR 30u              /* the longest: 300 s by default */
#define LOG_EVERY_NS (UINT64_C(1000) * NS_PER_MS)

/* ------------------------------------------------------------------ */
/* local errors */

void om__proxy_local_error(om_proxy_t *p, const char *service, int os_err,
                           const char *detail, uint64_t now) {
  char labels[64], sup[24];
  const char *name = os_err < 0 ? uv_err_name(os_err) : "ENOMEM";
  uint64_t held;
  p->local_errors++;
  snprintf(labels, sizeof labels, "errno=\"%s\"", name);
  om_metric_inc(om_metrics_counter(
      p->metrics, "openmesh_proxy_local_errors_total",
      "Calls that failed for want of this process's own resources (no "
      "descriptor, buffer, memory or port), by errno; never held against a "
      "peer.",
      labels));
  if (!om__proxy_log_limit(&p->local_log, now, &held))
    return;
  snprintf(sup, sizeof sup, "%llu", (unsigned long long)held);
  om_log(OM_LOG_ERROR, "proxy_local_resources", "service", service, "errno",
         name, "detail", detail != NULL ? detail : "", "suppressed", sup, NULL);
}

int om__proxy_log_limit(om__proxy_log_limit_t *l, uint64_t now,
                        uint64_t *held) {
  if (l->last_ns != 0 && now - l->last_ns < LOG_EVERY_NS) {
    l->suppressed++;
    return 0;
  }
  *held = l->suppressed;
  l->last_ns = now;
  l->suppressed = 0;
  return 1;
}

/* ------------------------------------------------------------------ */
/* policy shedding */

void om__proxy_shed_metrics(om_proxy_t *p, om__proxy_service_t *s,
                            const char *labels) {
  s->m_policy_trips = om_metrics_counter(
      p->metrics, "openmesh_proxy_policy_budget_trips_total",
      "Traffic policy calls that overran their budget (instructions, wall "
      "clock or memory).",
      labels);
  s->m_policy_sheds = om_metrics_counter(
      p->metrics, "openmesh_proxy_policy_sheds_total",
      "Times the service's traffic policy was shed (its calls refused "
      "without running it) after repeated budget overruns.",
      labels);
  s->m_policy_shed_refused = om_metrics_counter(
      p->metrics, "openmesh_proxy_policy_shed_refused_total",
      "Calls refused with policy_error while the service's policy was shed.",
      labels);
}

void om__proxy_shed_reset(om__proxy_service_t *s) {
  s->shed_until_ns = 0;
  s->shed_cooldown_ns = 0;
  s->trips_in_window = 0;
  s->trip_window_ns = 0;
}

int om__proxy_shed_gate(om__proxy_service_t *s, uint64_t now, char *err,
                        size_t errlen) {
  if (s->shed_until_ns == 0 || now >= s->shed_until_ns)
    return 0; /* not shed, or the cooldown is over: this call probes */
  s->shed_refused++;
  om_metric_inc(s->m_policy_shed_refused);
  snprintf(err, errlen,
           "the service's traffic policy is shed for %llu ms more: it "
           "overran its budget of %g ms repeatedly (%llu overruns in all); "
           "calls are refused without running it",
           (unsigned long long)((s->shed_until_ns - now + NS_PER_MS - 1) /
                                NS_PER_MS),
           om_policy_budget_ms(om__proxy_policy(s)),
           (unsigned long long)s->policy_trips);
  return 1;
}

static void shed(om__proxy_service_t *s, uint64_t now, uint64_t cooldown) {
  char ms[24], trips[24];
  s->shed_cooldown_ns = cooldown;
  s->shed_until_ns = now + cooldown;
  s->trips_in_window = 0;
  s->policy_sheds++;
  om_metric_inc(s->m_policy_sheds);
  snprintf(ms, sizeof ms, "%llu", (unsigned long long)(cooldown / NS_PER_MS));
  snprintf(trips, sizeof trips, "%llu", (unsigned long long)s->policy_trips);
  om_log(OM_LOG_WARN, "proxy_policy_shed", "service", s->name, "cooldown_ms",
         ms, "trips", trips, NULL);
}

void om__proxy_shed_outcome(om__proxy_service_t *s, int rc, int ran,
                            uint64_t now) {
  om_policy_t *pol = om__proxy_policy(s);
  int trip =
      rc != 0 && ran && pol != NULL &&
      om_sandbox_last_trip(om_policy_sandbox(pol)) != OM_SANDBOX_TRIP_NONE;
  if (!trip) {
    if (ran && s->shed_until_ns != 0 && now >= s->shed_until_ns) {
      om__proxy_shed_reset(s); /* the probe kept within its budget */
      om_log(OM_LOG_INFO, "proxy_policy_unshed", "service", s->name, NULL);
    }
    return;
  }
  uint64_t base = (s->proxy->opts.policy_shed_cooldown_ms != 0
                       ? s->proxy->opts.policy_shed_cooldown_ms
                       : SHED_COOLDOWN_MS) *
                  NS_PER_MS;
  s->policy_trips++;
  om_metric_inc(s->m_policy_trips);
  if (s->shed_until_ns != 0) { /* the probe tripped: a longer cooldown */
    uint64_t next = s->shed_cooldown_ns * 2;
    shed(s, now, next > base * SHED_MAX_FACTOR ? base * SHED_MAX_FACTOR : next);
    return;
  }
  if (s->trips_in_window == 0 || now - s->trip_window_ns > SHED_WINDOW_NS) {
    s->trip_window_ns = now;
    s->trips_in_window = 0;
  }
  if (++s->trips_in_window >= SHED_TRIPS)
    shed(s, now, base);
}

/* ------------------------------------------------------------------ */
/* /status */

void om__proxy_isolation_status(const om__proxy_service_t *s, json_t *o,
                                uint64_t now) {
  json_t *pol = json_object_get(o, "policy");
  const om_policy_t *cur = om__proxy_policy(s);
  if (pol == NULL)
    return;
  json_object_set_new(pol, "budget_ms",
                      json_real(cur != NULL ? om_policy_budget_ms(cur) : 0));
  json_object_set_new(pol, "budget_trips",
                      json_integer((json_int_t)s->policy_trips));
  json_object_set_new(pol, "sheds", json_integer((json_int_t)s->policy_sheds));
  json_object_set_new(pol, "shed", json_boolean(s->shed_until_ns > now));
  json_object_set_new(
      pol, "shed_until_ms",
      json_integer((json_int_t)(s->shed_until_ns > now
                                    ? (s->shed_until_ns - now) / NS_PER_MS
                                    : 0)));
}
