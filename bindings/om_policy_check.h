/*
 * om_policy_check.h: the checks on a policy's answers, internal. One home
 * for each rule and its message: the proxy's call path (om_policy.c) and
 * the Lua library (openmesh.contract, through om.checks, l_checks.c) both
 * call these, so a spec, an example and production give the same verdict
 * in the same words.
 *
 *   subset(req, peers): an array (keys exactly 1..n) of the very peer
 *     tables offered, each at most once; an empty array is fine.
 *   key(req): a string or nil.
 *   authorize(req): true, or false and an optional reason (a string of
 *     at most OM_POLICY_REASON_MAX bytes of printable ASCII).
 *   decide(req): nil, or a table of per-request settings and header
 *     edits (om__policy_check_decision).
 *   order(ctx): a non-empty array of defined route names, each at most
 *     once.
 *   vary: a policy that declares vary sees a view of the request that
 *     holds only the service and the declared fields, and raises on a
 *     read of anything else.
 */
#ifndef OM_POLICY_CHECK_H
#define OM_POLICY_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <lua.h>

#include "om_policy.h" /* OM_POLICY_REASON_MAX */

/*
 * Which peer a table is: an open-addressing map from a peer table's
 * address (Lua's collector never moves objects, and the view keeps every
 * peer alive) to its index. A lookup never allocates, so checking a
 * result never needs protection.
 */
typedef struct om__peer_map_s {
  const void **keys; /* NULL: empty slot */
  uint32_t *index;
  size_t mask; /* slots - 1 */
} om__peer_map_t;

/* The slot count for n peers: a power of two, at least 16 and 2 n. */
size_t om__peer_map_slots(size_t n);

/* Add key -> i; the map (of om__peer_map_slots(n) zeroed slots) must have
 * room, which it has for up to n keys. */
void om__peer_map_put(om__peer_map_t *m, const void *key, uint32_t i);

/* The index of the peer table at key, or -1. */
int64_t om__peer_map_find(const om__peer_map_t *m, const void *key);

/*
 * om__policy_check_subset: is the value at res (a subset() answer) a
 * subset of the n offered peers in map? seen has n entries, none of which
 * holds stamp or stamp + 1 (the caller advances stamp by 2 per call, so no
 * clearing is needed). On success: 0, *n_out peers, their indexes in out
 * (room for n; NULL only when n is 0). Otherwise -1 and the reason in err,
 * e.g. "subset returned the peer 'a' twice": the first rule broken, in the
 * order the rules are stated (a table, an array, offered peers, each
 * once). Uses raw accesses only and never allocates nor raises: it runs
 * outside a protected call in the proxy. The stack is left as it was.
 */
int om__policy_check_subset(lua_State *L, int res, const om__peer_map_t *map,
                            size_t n, uint32_t *seen, uint32_t stamp,
                            uint32_t *out, size_t *n_out, char *err,
                            size_t errlen);

/*
 * om__policy_check_key: 0 when the value at idx is a string or nil; else
 * -1 and "key returned a number (42), expected a string or nil" in err.
 * Never allocates nor raises.
 */
int om__policy_check_key(lua_State *L, int idx, char *err, size_t errlen);

/*
 * om__policy_check_authorize: the answer of authorize(req), the values at
 * idx and idx + 1 (a missing one reads as nil). 0 for `true` alone; 1 for
 * `false` with no reason or a reason of at most OM_POLICY_REASON_MAX
 * printable ASCII bytes, copied NUL-terminated into reason (room for
 * OM_POLICY_REASON_MAX + 1; "" when none); else -1 and e.g. "authorize
 * returned a string ("yes"), expected true, or false and a reason" in err.
 * Never allocates nor raises.
 */
int om__policy_check_authorize(lua_State *L, int idx, char *reason, char *err,
                               size_t errlen);

/*
 * om__policy_check_decision: the answer of decide(req), the value at idx,
 * into *d: 0 for nil (no decision: d holds no field), 1 for a table of
 * known fields with values in range (docs/POLICIES.md "Per-request
 * decisions"), else -1 and e.g. "decide returned retries = -1, expected
 * an integer in 0..100" in err. Iterates with lua_next only: it never
 * allocates nor raises, and leaves the stack as it was.
 */
int om__policy_check_decision(lua_State *L, int idx, om_policy_decision_t *d,
                              char *err, size_t errlen);

/*
 * om__policy_check_order: 0 (stack unchanged) when the value at names is a
 * non-empty array of names found in the array of route names at routes,
 * each at most once; else -1 with the reason pushed, e.g. "order returned
 * an unknown route 'x' (routes: {a, b})" (it lists every route, so it is a
 * Lua string, not a bounded buffer). Runs in Lua context: it may allocate,
 * and so raise a memory error.
 */
int om__policy_check_order(lua_State *L, int names, int routes);

/*
 * om__policy_push_vary_meta: with the set of declared header names
 * (name -> true) on top of the stack, replace it by the three metatables
 * of a vary view, [headers_mt, req_mt, metadata]: headers_mt and req_mt
 * raise on a read of an undeclared header, of req.method or req.path
 * (unless method / path); metadata is the shared empty, read-only
 * req.metadata whose every read raises. Runs in Lua context.
 */
void om__policy_push_vary_meta(lua_State *L, int method, int path);

/* An empty req.metadata, read-only, its metatable out of the policy's
 * reach; index (or NULL) answers every read. Runs in Lua context. */
void om__policy_push_metadata(lua_State *L, lua_CFunction index);

/*
 * om__policy_show: v as the messages print it after "got" (strings
 * quoted, control characters escaped, long ones cut; numbers as tostring
 * does, NaN and the infinities spelled nan, inf, -inf; other values by
 * type) into buf. Never allocates. Returns buf.
 */
const char *om__policy_show(lua_State *L, int idx, char *buf, size_t len);

#endif /* OM_POLICY_CHECK_H */
