/*
 * om_policy.h: a loaded, validated policy (docs/POLICIES.md).
 *
 * om_policy_load compiles a policy in a fresh sandbox, runs its top level
 * under the budgets, validates it with openmesh.contract (shape, then every
 * example) and only then returns it. A caller swaps the returned policy in
 * for the old one; on any failure the caller keeps the old one and shows the
 * message ("file:line: message" or "file: field 'x': ...").
 *
 * The traffic call path (om_policy_set_peers once per snapshot revision,
 * om_policy_route per request) is the proxy's hot path: the Lua view of a
 * peer set is built once and reused; each request builds only its req table.
 */
#ifndef OM_POLICY_H
#define OM_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "om_sandbox.h"

typedef enum {
  OM_POLICY_TRAFFIC = 1,
  OM_POLICY_FALLBACK = 2,
  OM_POLICY_EGRESS_HEURISTICS = 3
} om_policy_kind_t;

typedef struct om_policy_s om_policy_t;

typedef struct om_policy_opts_s {
  const char *lib_dir; /* holds openmesh/contract.lua: required */
  size_t mem_limit;    /* sandbox budgets; 0: the sandbox defaults */
  uint64_t instr_limit;
  uint64_t wall_limit_ns;
} om_policy_opts_t;

/* A name/value pair with lengths (header, metadata entry). */
typedef struct om_policy_kv_s {
  const char *name;
  size_t name_len;
  const char *value;
  size_t value_len;
} om_policy_kv_t;

/*
 * The verified client certificate of a caller, as the policy sees it
 * (req.identity): the subject (RFC 2253 text), the URI and the DNS SANs.
 * The policy also gets `spiffe`, the first URI SAN that starts with
 * "spiffe://". Strings are NUL-terminated and the caller's.
 */
typedef struct om_policy_identity_s {
  const char *subject;
  const char *const *uris;
  size_t n_uris;
  const char *const *dns;
  size_t n_dns;
} om_policy_identity_t;

/* What a traffic policy sees of a request. Strings are NUL-terminated. */
typedef struct om_policy_req_s {
  const char *service;
  const char *method;
  const char *path;
  const om_policy_kv_t *headers; /* names already lower-case */
  size_t n_headers;
  const om_policy_kv_t *metadata;
  size_t n_metadata;
  /* NULL for a plaintext or anonymous caller (req.identity is nil); a
   * policy that declares vary sees it only when its vary names
   * ":identity" (its decisions are shared between callers) */
  const om_policy_identity_t *identity;
  /* a gRPC call (content-type application/grpc, :path
   * "/pkg.Service/Method"): req.grpc = {service, method}; NULL otherwise.
   * It is read from the path: a policy that declares vary sees it only
   * when its vary names ":path". */
  const char *grpc_service, *grpc_method;
  size_t grpc_service_len, grpc_method_len;
} om_policy_req_t;

/* What a traffic policy sees of a peer. zone may be NULL. */
typedef struct om_policy_peer_s {
  const char *id;
  const char *url;
  const char *zone;
  double weight;
  const om_policy_kv_t *metadata;
  size_t n_metadata;
} om_policy_peer_t;

/*
 * om_policy_load: compile, run and validate src as policy `name` (used in
 * messages; by convention the file name). Returns 0 with *out set, or a
 * negative code with *out untouched and a message in err (always
 * NUL-terminated when errlen > 0): OM_EPOLICY for a rejected policy,
 * OM_ENOMEM, OM_EINVAL for bad arguments.
 */
int om_policy_load(const om_policy_opts_t *opts, const char *name,
                   const char *src, size_t len, om_policy_t **out, char *err,
                   size_t errlen);

/* om_policy_load_file: the same, reading path (name = path). */
int om_policy_load_file(const om_policy_opts_t *opts, const char *path,
                        om_policy_t **out, char *err, size_t errlen);

/* om_policy_free: closes the policy's state. NULL is accepted. */
void om_policy_free(om_policy_t *p);

om_policy_kind_t om_policy_kind(const om_policy_t *p);
const char *om_policy_kind_name(om_policy_kind_t kind);
/* The policy's `name` field, else the name it was loaded under. */
const char *om_policy_name(const om_policy_t *p);
om_sandbox_t *om_policy_sandbox(om_policy_t *p);

/* Push the policy table onto its own state (om_sandbox_state). */
void om_policy_push(om_policy_t *p);

/* Push the openmesh.contract module the policy was validated with. */
void om_policy_push_contract(om_policy_t *p);

/*
 * om_policy_set_peers: build the Lua view of a peer set (traffic policies),
 * replacing the previous one. Call once per snapshot revision. On error the
 * previous view stays. Strings are copied into the policy's state.
 */
int om_policy_set_peers(om_policy_t *p, const om_policy_peer_t *peers,
                        size_t n);

/*
 * om_policy_set_peers_from: the same, naming the new view `tag`; when the
 * current view is the one named prev_tag, prev[i] >= 0 says peer i is
 * unchanged (id, url, zone, weight, metadata) from the current view's peer
 * prev[i], and its Lua table is kept instead of built again. A policy
 * that writes to a peer table sees the write for as long as that peer is
 * unchanged. With prev NULL, or another current view, it builds all.
 */
int om_policy_set_peers_from(om_policy_t *p, const om_policy_peer_t *peers,
                             size_t n, const int32_t *prev, uint64_t prev_tag,
                             uint64_t tag);

/* The number of peers in the current view. */
size_t om_policy_peer_count(const om_policy_t *p);

/*
 * What om_policy_route and om_policy_authorize return when the policy's
 * authorize(req) refused the call: positive, since it is the policy's
 * answer and not a failure. err then holds the policy's reason (at most
 * OM_POLICY_REASON_MAX bytes of printable ASCII, "" when it gave none).
 */
#define OM_POLICY_DENIED 2
#define OM_POLICY_REASON_MAX 200

/*
 * om_policy_route: run a traffic policy for one request: authorize(req)
 * when the policy has one, then key(req) when it has one, then
 * subset(req, peers), all in one call under one budget. On 0,
 * out[0..*n_out) are indices into the current peer view (out must hold
 * om_policy_peer_count entries) and *key / *key_len the policy's key (NULL
 * when none; valid until the next call into this policy). OM_POLICY_DENIED
 * when authorize refused (key and subset did not run; *n_out 0, *key NULL;
 * the reason in err): the caller answers 403 and reaches no peer. Anything
 * but a proper answer (authorize: true, or false and a reason; subset: a
 * subset) is OM_EPOLICY with the reason in err: the caller fails the
 * request, never widens it.
 */
int om_policy_route(om_policy_t *p, const om_policy_req_t *req, uint32_t *out,
                    size_t *n_out, const char **key, size_t *key_len, char *err,
                    size_t errlen);

/*
 * Why the last om_policy_route / om_policy_authorize call failed with
 * OM_EPOLICY: the policy's code raised (RUNTIME), it overran a budget
 * (BUDGET: instructions, wall clock or memory), or it answered something
 * that is not an answer (ANSWER: a subset with a foreign or repeated
 * peer, a key that is not a string, an authorize that is neither true nor
 * false). The proxy counts and logs the three apart; callers see one
 * public error either way.
 */
enum {
  OM_POLICY_FAIL_NONE = 0,
  OM_POLICY_FAIL_RUNTIME = 1,
  OM_POLICY_FAIL_BUDGET = 2,
  OM_POLICY_FAIL_ANSWER = 3
};

/* om_policy_last_failure: OM_POLICY_FAIL_* of the last route or
 * authorize call (NONE when it succeeded or was refused). */
int om_policy_last_failure(const om_policy_t *p);

/*
 * om_policy_route_view: om_policy_route, and when all is not NULL and the
 * policy answered with the peer table it was given (`return peers`),
 * *all = 1 and out is left untouched (*n_out is the peer count): the
 * caller treats the subset as every peer of the view, which costs nothing
 * whatever its size. Otherwise *all = 0 and out is filled as
 * om_policy_route fills it.
 */
int om_policy_route_view(om_policy_t *p, const om_policy_req_t *req,
                         uint32_t *out, size_t *n_out, int *all,
                         const char **key, size_t *key_len, char *err,
                         size_t errlen);

/*
 * A per-request decision: what decide(req) of a traffic policy answered
 * (docs/POLICIES.md "Per-request decisions"). `fields` says which of the
 * numbers it set (OM_DECIDE_*); the others stay the service's. Header
 * edits are headers[0..n_headers): a name (lower-case) and a value to set
 * (replacing the caller's fields of that name), or value_len
 * OM_DECIDE_REMOVE to remove them; names and values are offsets into
 * bytes. A decision is a plain value: om_policy_decision_size bytes of it
 * copy it whole (memcpy), as the proxy's decision cache does.
 */
#define OM_DECIDE_DEADLINE 0x01u
#define OM_DECIDE_PER_TRY 0x02u
#define OM_DECIDE_RETRIES 0x04u
#define OM_DECIDE_RETRY_UNSAFE 0x08u
#define OM_DECIDE_STREAM_IDLE 0x10u
#define OM_DECIDE_MAX_STREAM 0x20u
#define OM_DECIDE_MAX_BODY 0x40u
#define OM_DECIDE_HEADERS_MAX 16   /* header edits per decision */
#define OM_DECIDE_BYTES 4096       /* their names and values, in all */
#define OM_DECIDE_VALUE_MAX 1024   /* one value */
#define OM_DECIDE_RETRIES_MAX 100  /* the proxy's ceiling on retries */
#define OM_DECIDE_MS_MAX 86400000u /* a day: the longest time field */
#define OM_DECIDE_REMOVE UINT16_MAX

typedef struct om_policy_header_edit_s {
  uint16_t name, name_len, value, value_len; /* value_len: or REMOVE */
} om_policy_header_edit_t;

typedef struct om_policy_decision_s {
  unsigned fields;
  uint64_t deadline_ms, per_try_ms, stream_idle_ms, max_stream_ms;
  uint64_t max_body_bytes;
  uint32_t retries;
  int retry_non_idempotent;
  uint32_t n_headers, n_bytes;
  om_policy_header_edit_t headers[OM_DECIDE_HEADERS_MAX];
  char bytes[OM_DECIDE_BYTES];
} om_policy_decision_t;

/* The bytes of d that carry it: the struct up to the header bytes used. */
size_t om_policy_decision_size(const om_policy_decision_t *d);

/* om_policy_has_decide: 1 when the traffic policy has decide(req). */
int om_policy_has_decide(const om_policy_t *p);

/*
 * om_policy_route_decide: om_policy_route_view, and after subset (in the
 * same call, under the same budget) decide(req) when the policy has one
 * and decision is not NULL: 0 with *decided = 1 and *decision filled when
 * it answered a table, *decided = 0 when it answered nil or the policy
 * has no decide (decision is then untouched). An answer that is neither
 * (a wrong type, an unknown field, a value out of range, a header the
 * proxy owns) is OM_EPOLICY with the reason in err, like a bad subset.
 */
int om_policy_route_decide(om_policy_t *p, const om_policy_req_t *req,
                           uint32_t *out, size_t *n_out, int *all,
                           const char **key, size_t *key_len,
                           om_policy_decision_t *decision, int *decided,
                           char *err, size_t errlen);

/*
 * om_policy_authorize: only authorize(req) of a traffic policy, under the
 * budget of a route call (what openmesh.testing's policy:authorize runs).
 * 0 when the policy allows the call or has no authorize; OM_POLICY_DENIED
 * with the reason in err; OM_EPOLICY with the message in err for any
 * other answer or a raised error; OM_EINVAL for another kind.
 */
int om_policy_authorize(om_policy_t *p, const om_policy_req_t *req, char *err,
                        size_t errlen);

/* om_policy_has_authorize: 1 when the traffic policy has authorize(req). */
int om_policy_has_authorize(const om_policy_t *p);

/*
 * The budget of one om_policy_route call, from the traffic policy's
 * `budget_ms` field (default 1, at most 50): that much wall clock and
 * OM_POLICY_INSTR_PER_MS VM instructions per millisecond of it, whichever
 * runs out first (om_sandbox_call_limited). The proxy runs every service's
 * policy on one event loop: a call may hold it that long, no longer.
 * The instruction rate is what a plain Lua loop runs in a millisecond on
 * the reference machine, so on a faster one the instruction count trips
 * first and the outcome does not depend on the clock.
 */
#define OM_POLICY_DEFAULT_BUDGET_MS 1.0
#define OM_POLICY_MAX_BUDGET_MS 50.0
#define OM_POLICY_INSTR_PER_MS 400000.0

/* om_policy_budget_ms: the wall-clock budget of one route call, in ms (the
 * policy's budget_ms, or the load options' wall_limit_ns when set). */
double om_policy_budget_ms(const om_policy_t *p);

/*
 * om_policy_vary: 1 when the traffic policy declares `vary`, with its
 * header names (lower-case; owned by the policy) and whether :method,
 * :path and :identity are among them; 0 otherwise. Such a policy sees
 * only the service and those fields (om_policy_route builds nothing
 * else), so for one peer view its decision (authorize's included) is a
 * function of them: a caller may reuse it for every request that agrees
 * on them (the proxy's decision cache), the caller's identity included
 * when :identity is declared.
 */
int om_policy_vary(const om_policy_t *p, const char *const **names, size_t *n,
                   int *method, int *path, int *identity);

/* The value of header `name` (lower-case) in req: the last occurrence, as
 * the policy's headers table has it; NULL when absent. */
const om_policy_kv_t *om_policy_req_header(const om_policy_req_t *req,
                                           const char *name);

#endif /* OM_POLICY_H */
