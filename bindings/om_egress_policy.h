/*
 * om_egress_policy.h: calling the fallback and egress_heuristics policies
 * from C (docs/POLICIES.md).
 *
 * Every call into policy code goes through the policy's sandbox exactly as
 * the traffic path does (om_sandbox_call: protected, instruction, wall and
 * memory budgets) and every answer is checked by openmesh.contract, the same
 * validator hot reload uses. A policy that raises, runs out of budget or
 * returns garbage is OM_EPOLICY with a message in err; the C side never
 * trusts a Lua value it has not checked, so a hostile policy cannot crash
 * the gateway.
 *
 * The policy must be of the matching kind (om_policy_kind); calling a
 * fallback function on a heuristics policy is OM_EINVAL. An allocation
 * failure inside the policy's state is reported like its memory budget
 * (OM_EPOLICY, "budget: memory limit ..."), as om_sandbox_call does; C-side
 * allocation failures are OM_ENOMEM.
 */
#ifndef OM_EGRESS_POLICY_H
#define OM_EGRESS_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "om_policy.h"

/* ------------------------------------------------------------------ */
/* fallback                                                            */

/* What a route's retry budget counts (docs/EGRESS.md "Retry budgets"). */
typedef enum {
  OM_BUDGET_NONE = 0, /* no budget: max_attempts and the deadline only */
  OM_BUDGET_ATTEMPTS, /* retries <= ratio x calls + reserve */
  OM_BUDGET_TOKENS,   /* retry tokens <= ratio x success tokens + reserve */
  OM_BUDGET_COST,     /* the same in USD, by the route's price */
} om_budget_unit_t;

typedef struct om_budget_cfg_s {
  om_budget_unit_t unit;
  double ratio;       /* default 0.2 */
  double min_per_s;   /* the reserve, in the unit per second; default 10 */
  uint64_t window_ms; /* default 10000 */
} om_budget_cfg_t;

/* USD per million tokens (the providers' price lists are per million). */
typedef struct om_price_s {
  int has;
  double input, output, cached_input; /* cached_input defaults to input */
} om_price_t;

typedef struct om_route_s {
  char *name;
  char *provider; /* "openai" | "anthropic" */
  char *base_url;
  char *model;
  char *api_key_env;              /* NULL when the route needs no key */
  uint64_t attempt_timeout_ms;    /* default 30000 */
  uint64_t first_byte_timeout_ms; /* default 10000 */
  uint64_t context_tokens;        /* 0: not given */
  om_budget_cfg_t budget;         /* its own retry_budget, else the policy's */
  om_price_t price;               /* prices[model]; has 0 when none */
} om_route_t;

/* A model alias (the fallback policy's `models`): the name a caller puts
 * in `model`, and the chain of routes it selects (indices into the
 * routes of om_fallback_config, in the listed order). */
typedef struct om_model_alias_s {
  char *name;
  uint32_t *routes;
  size_t n;
} om_model_alias_t;

typedef struct om_fallback_settings_s {
  uint32_t max_attempts;              /* per route; default 3 */
  uint64_t per_wait_ceiling_ms;       /* default 8000 */
  uint64_t deadline_ms;               /* whole turn; default 60000 */
  uint64_t backoff_base_ms;           /* default 500 */
  uint64_t backoff_cap_ms;            /* default 8000 */
  uint64_t pending_retry_interval_ms; /* Layer C, async; default 60000 */
  uint64_t pending_max_age_ms;        /* Layer C, async; default 3600000 */
  uint64_t commitment_ms;             /* Layer C, interactive; default 120000 */
  /* quality gate: opt-in per agent (no agents: the gate is off) */
  char **gate_agents;
  size_t n_gate_agents;
  char *judge_route;         /* a route name; NULL when no gate is configured */
  uint64_t judge_timeout_ms; /* default 2000 */
  int has_order;             /* the policy has an order(ctx) function */
  /* route cooldown (core/om_egress_rules.h om_egress_cooldown_opts_t): after
   * cooldown_after_failures consecutive health failures a route is skipped
   * for cooldown_ms, doubling per repeat up to cooldown_max_ms */
  uint32_t cooldown_after_failures; /* default 3 */
  uint64_t cooldown_ms;             /* default 2000 */
  uint64_t cooldown_max_ms;         /* default 60000 */
  /* the policy-level retry_budget every route without its own takes */
  om_budget_cfg_t budget;
  /* model aliases (none: the caller's model selects nothing) */
  om_model_alias_t *models;
  size_t n_models;
} om_fallback_settings_t;

/*
 * om_fallback_config: read the routes and settings of a fallback policy,
 * with defaults filled in. Call once per policy version: the results are
 * copies that outlive nothing (free with om_fallback_config_free) and
 * never change while the policy lives. Fields the contract already
 * validated are trusted only after a re-check of their type (a policy can
 * mutate its own table from order()). Returns 0 with *routes (array of
 * *n) and *s filled; OM_EINVAL (NULL argument, not a fallback policy),
 * OM_EPOLICY (message in err), OM_ENOMEM. On error nothing is allocated
 * and the outputs are untouched.
 */
int om_fallback_config(om_policy_t *p, om_route_t **routes, size_t *n,
                       om_fallback_settings_t *s, char *err, size_t errlen);

/* Frees what om_fallback_config returned (routes may be NULL, s may be
 * NULL); s is zeroed. */
void om_fallback_config_free(om_route_t *routes, size_t n,
                             om_fallback_settings_t *s);

/* Whether agent opted in to the quality gate under s. */
int om_fallback_gate_enabled(const om_fallback_settings_t *s,
                             const char *agent);

typedef struct om_failed_attempt_s {
  const char *route;
  int status; /* 0: no status */
  const char *class_name;
} om_failed_attempt_t;

typedef struct om_fallback_ctx_s {
  const char *agent;
  const char *context; /* "interactive" | "async" */
  const char *channel;
  const om_failed_attempt_t *failed;
  size_t n_failed;
  const char *model; /* the caller's model (an alias, when declared) */
} om_fallback_ctx_t;

/*
 * om_fallback_order: the routes to try for ctx, best first: order(ctx)
 * when the policy has one (checked by openmesh.contract.order: known
 * names, each at most once, at least one), else the routes as listed.
 * order[] must hold as many entries as the policy has routes (*n on input
 * is its capacity); on 0, order[0..*n) are indices into the routes of
 * om_fallback_config (the policy's listed order). NULL strings in ctx are
 * absent fields. Returns 0; OM_EINVAL (NULL argument, not a fallback
 * policy, capacity too small); OM_EPOLICY (order raised, exceeded a
 * budget or returned garbage; message in err); OM_ENOMEM. On error the
 * outputs are untouched.
 */
int om_fallback_order(om_policy_t *p, const om_fallback_ctx_t *ctx,
                      uint32_t *order, size_t *n, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* egress_heuristics                                                   */

typedef enum { OM_FLAG_LOW = 1, OM_FLAG_HIGH = 2 } om_flag_confidence_t;

typedef struct om_heuristic_flag_s {
  const char *name; /* valid until the next call into the policy */
  om_flag_confidence_t confidence;
} om_heuristic_flag_t;

typedef struct om_heuristics_input_s {
  const char *text; /* the candidate reply; required */
  size_t len;
  const char *system_prompt; /* may be NULL: checks that need it pass */
  size_t system_prompt_len;
  const char *question; /* the user's last message; may be NULL */
  size_t question_len;
  const char *agent;   /* may be NULL */
  const char *channel; /* may be NULL */
} om_heuristics_input_t;

/*
 * om_heuristics_run: evaluate every check of the policy on in->text
 * (openmesh.contract.evaluate; check functions see ctx = {agent, channel,
 * context, system_prompt, question}). On 0, flags[0..*n) are the checks
 * that matched, in policy order (at most max; *n counts only those
 * stored, the rest are dropped, and the confidence of a dropped one is
 * still reflected in *overall when given). *n == 0: unflagged. Returns 0;
 * OM_EINVAL (NULL argument, not a heuristics policy); OM_EPOLICY (a check
 * raised, exceeded a budget, or the answer was malformed; message in err):
 * the caller treats the candidate as flagged high (it was not proven
 * clean); OM_ENOMEM.
 */
int om_heuristics_run(om_policy_t *p, const om_heuristics_input_t *in,
                      om_heuristic_flag_t *flags, size_t max, size_t *n,
                      char *err, size_t errlen);

/*
 * om_heuristics_run_overall: the same, also returning the overall verdict:
 * 0 unflagged, OM_FLAG_LOW or OM_FLAG_HIGH (high when any check matched
 * was high).
 */
int om_heuristics_run_overall(om_policy_t *p, const om_heuristics_input_t *in,
                              om_heuristic_flag_t *flags, size_t max, size_t *n,
                              int *overall, char *err, size_t errlen);

/*
 * The holding line for key (an agent name, as holding_lines is keyed; the
 * parameter is named channel for history), else holding_lines.default.
 * The string is owned by the policy and valid while it lives. NULL when
 * none (a validated policy always has a default) or p is not a heuristics
 * policy.
 */
const char *om_heuristics_holding_line(om_policy_t *p, const char *channel);

/*
 * The handoff message for key: handoff_lines[key], else
 * handoff_lines.default, else NULL (the caller then uses the holding
 * line). Owned by the policy.
 */
const char *om_heuristics_handoff(om_policy_t *p, const char *channel);

/* The handoff target for an agent (handoff[agent], e.g. "human-queue"),
 * else NULL. Owned by the policy. */
const char *om_heuristics_handoff_target(om_policy_t *p, const char *agent);

/*
 * om_heuristics_sanitize: a copy of text with what a sanitizing path may
 * remove removed: every <thinking>...</thinking> (and <think>...</think>)
 * block, an unterminated one to the end of the text, and the whitespace
 * the removal leaves at both ends. The caller re-runs the checks on the
 * result (it may still be flagged, or empty). p may be NULL (no policy
 * code runs today; the parameter lets a policy add rules later). *out is
 * malloc'd and NUL-terminated; the caller frees it. Returns 0, OM_EINVAL,
 * OM_ENOMEM (outputs untouched).
 */
int om_heuristics_sanitize(om_policy_t *p, const char *text, size_t len,
                           char **out, size_t *out_len);

#endif /* OM_EGRESS_POLICY_H */
