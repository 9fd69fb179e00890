/*
 * l_admission.c: the Lua face of admission control, the adaptive limiter
 * and the call deadline. Times are milliseconds (numbers); math.huge means
 * "no deadline".
 *
 *   local d = om.deadline(budget_ms, now_ms)      budget_ms >= 0 or math.huge
 *   d:remaining(now_ms) -> ms (0 once expired, math.huge for none)
 *   d:attempt_timeout(now_ms, per_try_ms) -> min(per_try_ms, remaining)
 *     (per_try_ms may be math.huge: no per-try cap)
 *   d:can_start_attempt(now_ms [, min_useful_ms]) -> bool
 *     (remaining > 0 and >= min_useful_ms; default 0)
 *   d:expired(now_ms) -> bool        d:at() -> absolute ms | math.huge
 *
 *   local a = om.admission{max_inflight = n, max_queue = m}
 *     max_inflight: integer >= 1, required; max_queue: integer in
 *     [0, 65536], default 0 (no queue: reject once n are in flight)
 *   a:acquire(now_ms [, deadline]) ->
 *       "admitted"                    a slot is yours: a:release() it later
 *     | "queued", ticket             wait; the ticket comes back from
 *                                    release / set_limit / expire
 *     | nil, "EOVERLOAD: ...", "EOVERLOAD"   limit reached and queue full
 *     | nil, "EDEADLINE: ...", "EDEADLINE"   the deadline already passed
 *     (deadline: an om.deadline, an absolute time in ms, math.huge or nil
 *      for none)
 *   a:release(now_ms) -> admitted, expired
 *     frees one slot and hands it to the head of the queue; both results
 *     are arrays of tickets (often empty): `admitted` now hold a slot,
 *     `expired` were overdue and failed (never admitted). Releasing with
 *     nothing in flight raises.
 *   a:set_limit(n, now_ms) -> admitted, expired   (n integer >= 1; raising
 *     the limit admits queued tickets; lowering it revokes nothing)
 *   a:expire(now_ms) -> expired       fail every ticket whose deadline <= now
 *   a:next_deadline() -> ms | nil     earliest queued deadline: arm a timer
 *   a:cancel(ticket) -> bool          true if it was queued and is now gone
 *   a:stats() -> {inflight, queued, limit, max_queue, admitted, rejected,
 *                 expired, cancelled}
 *   a:close()
 *
 *   local l = om.limiter{min_limit = 1, max_limit = 1000, initial = 20,
 *                        tolerance = 1.5, smoothing = 0.2, backoff = 0.9,
 *                        window_ms = 100, window_samples = 10,
 *                        long_window = 600}
 *   l:sample(rtt_ms, now_ms [, dropped [, inflight]]) -> limit
 *   l:limit() -> n
 *   l:stats() -> {limit, estimate, long_rtt_ms, short_rtt_ms, windows,
 *                 drop_windows}
 *   l:close()
 *     The limiter does not drive an admission by itself: feed it with
 *     a:set_limit(l:limit(), now_ms) (core/om_admission.h says why).
 *
 * Tickets and memory. A ticket is a positive integer, never reused by the
 * same admission, so a stale ticket (already admitted, expired, cancelled)
 * can never cancel someone else's request. The C queue nodes live in the
 * admission userdata itself, a pool of max_queue nodes threaded on a free
 * list: queueing allocates nothing, and the nodes share the userdata's
 * lifetime (its __gc frees the core object first, then Lua frees the pool).
 * Core callbacks only record tickets in a scratch array in the same block;
 * the Lua tables are built after the core call returns, so nothing can
 * raise while the core is mid-operation.
 *
 * Option tables are checked for unknown fields: a typo raises.
 */
#include "om_lua.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "om_admission.h"
#include "om_deadline.h"
#include "om_errno.h"
#include "om_lua_util.h"
#include "om_limiter.h"

#define ADMISSION_MT "openmesh.Admission"
#define LIMITER_MT "openmesh.Limiter"
#define DEADLINE_MT "openmesh.Deadline"
#define MAX_QUEUE_LUA 65536 /* pool memory is ~100 bytes a slot */
#define MS_NS 1e6

/* ---- helpers ----------------------------------------------------------- */

/* Milliseconds (finite >= 0, or math.huge) to ns; math.huge and anything
 * past the end of the clock are OM_DEADLINE_NEVER. */
static uint64_t ms_or_never(lua_State *L, int idx, const char *what) {
  lua_Number ms = luaL_checknumber(L, idx);
  double ns;
  if (isnan(ms) || ms < 0) {
    lua_pushfstring(L, "%s must be a number >= 0 (math.huge for none)", what);
    luaL_argerror(L, idx, lua_tostring(L, -1));
  }
  ns = ms * MS_NS;
  if (ns >= 18446744073709549568.0) /* largest double below 2^64 */
    return OM_DEADLINE_NEVER;
  return (uint64_t)ns;
}

static void push_ms_or_huge(lua_State *L, uint64_t ns) {
  if (ns == OM_DEADLINE_NEVER)
    lua_pushnumber(L, HUGE_VAL);
  else
    lua_pushnumber(L, om__lua_ns_to_ms(ns));
}

static void set_int(lua_State *L, const char *k, uint64_t v) {
  lua_pushinteger(L, v > (uint64_t)LUA_MAXINTEGER ? LUA_MAXINTEGER
                                                  : (lua_Integer)v);
  lua_setfield(L, -2, k);
}

static void set_num(lua_State *L, const char *k, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

/* ---- deadline ------------------------------------------------------------
 * A value (om_deadline_t) in a userdata: it owns nothing, so it needs no
 * __gc or close. */

static om_deadline_t *check_deadline(lua_State *L, int idx) {
  return luaL_checkudata(L, idx, DEADLINE_MT);
}

static int l_deadline_new(lua_State *L) {
  uint64_t budget = ms_or_never(L, 1, "budget_ms");
  uint64_t now = om__lua_checkms(L, 2, "now_ms");
  om_deadline_t *d = lua_newuserdatauv(L, sizeof *d, 0); /* [d] */
  *d = om_deadline_after(now, budget);
  luaL_setmetatable(L, DEADLINE_MT);
  return 1;
}

static int l_deadline_remaining(lua_State *L) {
  om_deadline_t *d = check_deadline(L, 1);
  push_ms_or_huge(L,
                  om_deadline_remaining(*d, om__lua_checkms(L, 2, "now_ms")));
  return 1;
}

static int l_deadline_attempt_timeout(lua_State *L) {
  om_deadline_t *d = check_deadline(L, 1);
  uint64_t now = om__lua_checkms(L, 2, "now_ms");
  uint64_t per_try = ms_or_never(L, 3, "per_try_ms");
  push_ms_or_huge(L, om_deadline_attempt_timeout(*d, now, per_try));
  return 1;
}

static int l_deadline_can_start_attempt(lua_State *L) {
  om_deadline_t *d = check_deadline(L, 1);
  uint64_t now = om__lua_checkms(L, 2, "now_ms");
  uint64_t min_useful = om__lua_optms(L, 3, "min_useful_ms", 0);
  lua_pushboolean(L, om_deadline_can_start_attempt(*d, now, min_useful));
  return 1;
}

static int l_deadline_expired(lua_State *L) {
  om_deadline_t *d = check_deadline(L, 1);
  lua_pushboolean(L, om_deadline_expired(*d, om__lua_checkms(L, 2, "now_ms")));
  return 1;
}

static int l_deadline_at(lua_State *L) {
  push_ms_or_huge(L, om_deadline_at_ns(*check_deadline(L, 1)));
  return 1;
}

static int l_deadline_tostring(lua_State *L) {
  om_deadline_t *d = check_deadline(L, 1);
  if (om_deadline_is_never(*d))
    lua_pushliteral(L, "openmesh.Deadline (never)");
  else
    lua_pushfstring(L, "openmesh.Deadline (at %f ms)",
                    om__lua_ns_to_ms(om_deadline_at_ns(*d)));
  return 1;
}

/* ---- admission ----------------------------------------------------------- */

typedef struct {
  om_admission_waiter_t w; /* w.data: next free slot while unqueued */
  lua_Integer ticket;
} slot_t;

typedef struct {
  lua_Integer ticket;
  int status;
} result_t;

typedef struct {
  om_admission_t *a; /* NULL once closed */
  uint32_t cap;      /* pool size = max_queue */
  slot_t *free_list;
  uint64_t serial; /* tickets issued */
  result_t *results;
  uint32_t nresults;
  slot_t pool[]; /* cap slots, then cap results */
} ladmission_t;

static ladmission_t *check_admission_ud(lua_State *L, int idx) {
  return luaL_checkudata(L, idx, ADMISSION_MT);
}

static ladmission_t *check_admission(lua_State *L, int idx) {
  ladmission_t *u = check_admission_ud(L, idx);
  if (u->a == NULL)
    luaL_argerror(L, idx, "admission is closed");
  return u;
}

static int l_admission_close(lua_State *L) {
  ladmission_t *u = check_admission_ud(L, 1);
  om_admission_free(u->a);
  u->a = NULL;
  return 0;
}

static int l_admission_new(lua_State *L) {
  static const char *const fields[] = {"max_inflight", "max_queue", NULL};
  om_admission_opts_t o;
  ladmission_t *u;
  size_t size;
  int rc;
  luaL_checktype(L, 1, LUA_TTABLE);
  om__lua_check_fields(L, 1, fields);
  if (!om__lua_has_field(L, 1, "max_inflight"))
    om__lua_field_fail(L, 1, "max_inflight", "required");
  o.max_inflight =
      (uint32_t)om__lua_field_int(L, 1, "max_inflight", 1, 1, UINT32_MAX);
  o.max_queue =
      (uint32_t)om__lua_field_int(L, 1, "max_queue", 0, 0, MAX_QUEUE_LUA);

  size = offsetof(ladmission_t, pool) +
         (size_t)o.max_queue * (sizeof(slot_t) + sizeof(result_t));
  u = lua_newuserdatauv(L, size, 0); /* [a] closed */
  u->a = NULL;
  u->cap = o.max_queue;
  u->serial = 0;
  u->nresults = 0;
  u->results = (result_t *)(void *)(u->pool + o.max_queue);
  u->free_list = NULL;
  for (uint32_t i = o.max_queue; i-- > 0;) {
    om_admission_waiter_init(&u->pool[i].w);
    u->pool[i].ticket = 0;
    u->pool[i].w.data = u->free_list;
    u->free_list = &u->pool[i];
  }
  luaL_setmetatable(L, ADMISSION_MT);
  rc = om_admission_new(&o, &u->a);
  if (rc != 0)
    return om__lua_fail(L, rc, NULL);
  return 1;
}

/* Core callback: record the ticket, put the slot back on the free list.
 * No Lua API here: nothing may raise while the core is mid-operation. */
static void collect_cb(om_admission_waiter_t *w, int status, void *ud) {
  ladmission_t *u = ud;
  slot_t *s = (slot_t *)(void *)((char *)w - offsetof(slot_t, w));
  u->results[u->nresults].ticket = s->ticket;
  u->results[u->nresults].status = status;
  u->nresults++;
  s->ticket = 0;
  s->w.data = u->free_list;
  u->free_list = s;
}

/* Push the collected tickets as two arrays: admitted, expired. */
static int push_results(lua_State *L, ladmission_t *u) {
  uint32_t nadm = 0, i;
  lua_Integer ia = 0, ie = 0;
  for (i = 0; i < u->nresults; i++)
    nadm += u->results[i].status == 0;
  lua_createtable(L, (int)nadm, 0);                 /* [adm] */
  lua_createtable(L, (int)(u->nresults - nadm), 0); /* [adm, exp] */
  for (i = 0; i < u->nresults; i++) {
    lua_pushinteger(L, u->results[i].ticket);
    if (u->results[i].status == 0)
      lua_rawseti(L, -3, ++ia);
    else
      lua_rawseti(L, -2, ++ie);
  }
  u->nresults = 0;
  return 2;
}

/* The optional deadline argument: an om.deadline, absolute ms, or none. */
static uint64_t opt_deadline(lua_State *L, int idx) {
  om_deadline_t *d;
  if (lua_isnoneornil(L, idx))
    return OM_DEADLINE_NEVER;
  if (lua_type(L, idx) == LUA_TNUMBER)
    return ms_or_never(L, idx, "deadline");
  d = luaL_testudata(L, idx, DEADLINE_MT);
  if (d == NULL)
    luaL_typeerror(L, idx, "openmesh.Deadline, number of ms or nil");
  return om_deadline_at_ns(*d);
}

static int l_admission_acquire(lua_State *L) {
  ladmission_t *u = check_admission(L, 1);
  uint64_t now = om__lua_checkms(L, 2, "now_ms");
  uint64_t deadline = opt_deadline(L, 3);
  slot_t *s = u->free_list;
  int rc = om_admission_acquire(u->a, s != NULL ? &s->w : NULL, deadline, now);
  switch (rc) {
  case OM_ADMISSION_ADMITTED:
    lua_pushliteral(L, "admitted");
    return 1;
  case OM_ADMISSION_QUEUED:
    u->free_list = s->w.data;
    s->w.data = NULL;
    /* serial * cap + index: unique, and the index is recoverable. */
    s->ticket =
        (lua_Integer)(u->serial++ * u->cap + (uint64_t)(s - u->pool)) + 1;
    lua_pushliteral(L, "queued");
    lua_pushinteger(L, s->ticket);
    return 2;
  default:
    return om__lua_fail(L, rc, NULL);
  }
}

static int l_admission_release(lua_State *L) {
  ladmission_t *u = check_admission(L, 1);
  uint64_t now = om__lua_checkms(L, 2, "now_ms");
  int rc = om_admission_release(u->a, now, collect_cb, u);
  if (rc == OM_ESTATE)
    return luaL_error(L, "release without an admitted request in flight");
  return push_results(L, u);
}

static int l_admission_set_limit(lua_State *L) {
  ladmission_t *u = check_admission(L, 1);
  lua_Integer n = luaL_checkinteger(L, 2);
  uint64_t now = om__lua_checkms(L, 3, "now_ms");
  if (n < 1 || (lua_Unsigned)n > UINT32_MAX)
    luaL_argerror(L, 2, "limit must be an integer in [1, 4294967295]");
  om_admission_set_limit(u->a, (uint32_t)n, now, collect_cb, u);
  return push_results(L, u);
}

static int l_admission_expire(lua_State *L) {
  ladmission_t *u = check_admission(L, 1);
  uint64_t now = om__lua_checkms(L, 2, "now_ms");
  om_admission_expire(u->a, now, collect_cb, u);
  push_results(L, u); /* [adm (empty), exp] */
  return 1;
}

static int l_admission_next_deadline(lua_State *L) {
  ladmission_t *u = check_admission(L, 1);
  uint64_t at = om_admission_next_deadline(u->a);
  if (at == OM_DEADLINE_NEVER)
    lua_pushnil(L);
  else
    lua_pushnumber(L, om__lua_ns_to_ms(at));
  return 1;
}

static int l_admission_cancel(lua_State *L) {
  ladmission_t *u = check_admission(L, 1);
  lua_Integer t = luaL_checkinteger(L, 2);
  slot_t *s;
  if (t < 1 || u->cap == 0) {
    lua_pushboolean(L, 0);
    return 1;
  }
  s = &u->pool[(uint64_t)(t - 1) % u->cap];
  if (s->ticket != t || om_admission_cancel(u->a, &s->w) != 0) {
    lua_pushboolean(L, 0);
    return 1;
  }
  s->ticket = 0;
  s->w.data = u->free_list;
  u->free_list = s;
  lua_pushboolean(L, 1);
  return 1;
}

static int l_admission_stats(lua_State *L) {
  ladmission_t *u = check_admission(L, 1);
  om_admission_stats_t st;
  om_admission_stats(u->a, &st);
  lua_createtable(L, 0, 8);
  set_int(L, "inflight", st.inflight);
  set_int(L, "queued", st.queued);
  set_int(L, "limit", st.limit);
  set_int(L, "max_queue", st.max_queue);
  set_int(L, "admitted", st.admitted);
  set_int(L, "rejected", st.rejected);
  set_int(L, "expired", st.expired);
  set_int(L, "cancelled", st.cancelled);
  return 1;
}

static int l_admission_tostring(lua_State *L) {
  ladmission_t *u = check_admission_ud(L, 1);
  if (u->a == NULL)
    lua_pushliteral(L, "openmesh.Admission (closed)");
  else
    lua_pushfstring(L, "openmesh.Admission (inflight %d/%d, queued %d/%d)",
                    (int)om_admission_inflight(u->a),
                    (int)om_admission_limit(u->a),
                    (int)om_admission_queued(u->a), (int)u->cap);
  return 1;
}

/* ---- limiter ------------------------------------------------------------- */

typedef struct {
  om_limiter_t *l; /* NULL once closed */
} llimiter_t;

static om_limiter_t *check_limiter(lua_State *L, int idx) {
  llimiter_t *u = luaL_checkudata(L, idx, LIMITER_MT);
  if (u->l == NULL)
    luaL_argerror(L, idx, "limiter is closed");
  return u->l;
}

static int l_limiter_close(lua_State *L) {
  llimiter_t *u = luaL_checkudata(L, 1, LIMITER_MT);
  om_limiter_free(u->l);
  u->l = NULL;
  return 0;
}

static int l_limiter_new(lua_State *L) {
  static const char *const fields[] = {
      "min_limit", "max_limit",      "initial",     "tolerance", "smoothing",
      "backoff",   "window_samples", "long_window", "window_ms", NULL};
  om_limiter_opts_t o;
  llimiter_t *u;
  int rc;
  om_limiter_opts_init(&o);
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    om__lua_check_fields(L, 1, fields);
    o.min_limit = (uint32_t)om__lua_field_int(L, 1, "min_limit", o.min_limit, 1,
                                              UINT32_MAX);
    o.max_limit = (uint32_t)om__lua_field_int(L, 1, "max_limit", o.max_limit, 1,
                                              UINT32_MAX);
    if (o.max_limit < o.min_limit)
      om__lua_field_fail(L, 1, "max_limit", "must be >= min_limit");
    /* The default initial limit follows the bounds the caller chose. */
    if (o.initial_limit < o.min_limit)
      o.initial_limit = o.min_limit;
    if (o.initial_limit > o.max_limit)
      o.initial_limit = o.max_limit;
    o.initial_limit = (uint32_t)om__lua_field_int(
        L, 1, "initial", o.initial_limit, o.min_limit, o.max_limit);
    o.tolerance =
        om__lua_field_num(L, 1, "tolerance", o.tolerance, 1.0, HUGE_VAL);
    if (!isfinite(o.tolerance))
      om__lua_field_fail(L, 1, "tolerance", "must be finite");
    o.smoothing = om__lua_field_num(L, 1, "smoothing", o.smoothing, 0, 1);
    if (o.smoothing == 0)
      om__lua_field_fail(L, 1, "smoothing", "must be > 0");
    o.backoff = om__lua_field_num(L, 1, "backoff", o.backoff, 0, 1);
    if (o.backoff == 0 || o.backoff == 1)
      om__lua_field_fail(L, 1, "backoff", "must be in (0, 1)");
    o.window_ns = om__lua_field_ms(L, 1, "window_ms", o.window_ns);
    o.window_samples = (uint32_t)om__lua_field_int(
        L, 1, "window_samples", o.window_samples, 1, UINT32_MAX);
    o.long_window = (uint32_t)om__lua_field_int(L, 1, "long_window",
                                                o.long_window, 1, UINT32_MAX);
  }
  u = lua_newuserdatauv(L, sizeof *u, 0); /* [l] closed */
  u->l = NULL;
  luaL_setmetatable(L, LIMITER_MT);
  rc = om_limiter_new(&o, &u->l);
  if (rc != 0)
    return om__lua_fail(L, rc, NULL);
  return 1;
}

static int l_limiter_sample(lua_State *L) {
  om_limiter_t *l = check_limiter(L, 1);
  uint64_t rtt = om__lua_checkms(L, 2, "rtt_ms");
  uint64_t now = om__lua_checkms(L, 3, "now_ms");
  int dropped = 0;
  uint32_t inflight = UINT32_MAX;
  if (!lua_isnoneornil(L, 4)) {
    luaL_checktype(L, 4, LUA_TBOOLEAN);
    dropped = lua_toboolean(L, 4);
  }
  if (!lua_isnoneornil(L, 5)) {
    lua_Integer n = luaL_checkinteger(L, 5);
    if (n < 0)
      luaL_argerror(L, 5, "inflight must be >= 0");
    inflight = (lua_Unsigned)n >= UINT32_MAX ? UINT32_MAX : (uint32_t)n;
  }
  lua_pushinteger(L, om_limiter_sample(l, now, rtt, inflight, dropped));
  return 1;
}

static int l_limiter_limit(lua_State *L) {
  lua_pushinteger(L, om_limiter_limit(check_limiter(L, 1)));
  return 1;
}

static int l_limiter_stats(lua_State *L) {
  om_limiter_stats_t st;
  om_limiter_stats(check_limiter(L, 1), &st);
  lua_createtable(L, 0, 6);
  set_int(L, "limit", st.limit);
  set_num(L, "estimate", st.estimate);
  set_num(L, "long_rtt_ms", st.long_rtt_ns / MS_NS);
  set_num(L, "short_rtt_ms", st.short_rtt_ns / MS_NS);
  set_int(L, "windows", st.windows);
  set_int(L, "drop_windows", st.drop_windows);
  return 1;
}

static int l_limiter_tostring(lua_State *L) {
  llimiter_t *u = luaL_checkudata(L, 1, LIMITER_MT);
  if (u->l == NULL)
    lua_pushliteral(L, "openmesh.Limiter (closed)");
  else
    lua_pushfstring(L, "openmesh.Limiter (limit %d)",
                    (int)om_limiter_limit(u->l));
  return 1;
}

/* ---- registration -------------------------------------------------------- */

void om__lua_open_admission(lua_State *L) {
  static const luaL_Reg deadline_methods[] = {
      {"remaining", l_deadline_remaining},
      {"attempt_timeout", l_deadline_attempt_timeout},
      {"can_start_attempt", l_deadline_can_start_attempt},
      {"expired", l_deadline_expired},
      {"at", l_deadline_at},
      {NULL, NULL}};
  static const luaL_Reg deadline_meta[] = {{"__tostring", l_deadline_tostring},
                                           {NULL, NULL}};
  static const luaL_Reg admission_methods[] = {
      {"acquire", l_admission_acquire},
      {"release", l_admission_release},
      {"set_limit", l_admission_set_limit},
      {"expire", l_admission_expire},
      {"next_deadline", l_admission_next_deadline},
      {"cancel", l_admission_cancel},
      {"stats", l_admission_stats},
      {"close", l_admission_close},
      {NULL, NULL}};
  static const luaL_Reg admission_meta[] = {
      {"__gc", l_admission_close},
      {"__close", l_admission_close},
      {"__tostring", l_admission_tostring},
      {NULL, NULL}};
  static const luaL_Reg limiter_methods[] = {{"sample", l_limiter_sample},
                                             {"limit", l_limiter_limit},
                                             {"stats", l_limiter_stats},
                                             {"close", l_limiter_close},
                                             {NULL, NULL}};
  static const luaL_Reg limiter_meta[] = {{"__gc", l_limiter_close},
                                          {"__close", l_limiter_close},
                                          {"__tostring", l_limiter_tostring},
                                          {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"deadline", l_deadline_new},
                                   {"admission", l_admission_new},
                                   {"limiter", l_limiter_new},
                                   {NULL, NULL}};
  /* [om] */
  om__lua_newclass(L, DEADLINE_MT, deadline_methods, deadline_meta);
  om__lua_newclass(L, ADMISSION_MT, admission_methods, admission_meta);
  om__lua_newclass(L, LIMITER_MT, limiter_methods, limiter_meta);
  luaL_setfuncs(L, funcs, 0); /* [om] */
}
