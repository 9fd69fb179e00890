/*
 * om_sandbox.h: the Lua state a policy runs in.
 *
 * One sandbox is one lua_State owned by one policy version. Code is loaded as
 * text only (mode "t") into an _ENV built from an allow-list: no io, no os
 * beyond time/clock, no debug, no package, no string.dump, no
 * collectgarbage; `require` reaches only `openmesh` and `openmesh.*`. Every
 * call runs under an instruction budget (a count hook that stays tripped, so a
 * pcall inside the policy cannot swallow it) and a wall-clock cap, and the
 * whole state under a memory cap (an accounting allocator that never refuses a
 * shrink). Metatables with __gc are refused, so no finalizer runs unbounded.
 * (Kong's sandbox, Redis's luaMaskCountHook and HAProxy's hlua_alloc, without
 * patching the VM or opening then pruning libraries.)
 */
#ifndef OM_SANDBOX_H
#define OM_SANDBOX_H

#include <stddef.h>
#include <stdint.h>

#include <lua.h>

typedef struct om_sandbox_s om_sandbox_t;

typedef struct om_sandbox_opts_s {
  size_t mem_limit;       /* bytes for the whole state; 0: 32 MiB */
  uint64_t instr_limit;   /* VM instructions per call; 0: 10,000,000 */
  uint64_t wall_limit_ns; /* wall clock per call; 0: 100 ms */
  const char *lib_dir;    /* dir holding openmesh/NAME.lua; may be NULL */
} om_sandbox_opts_t;

/*
 * om_sandbox_new: a fresh sandboxed state. opts may be NULL for defaults.
 * Returns 0 and sets *out, or OM_ENOMEM / OM_EINVAL with *out untouched and
 * nothing allocated. lib_dir is copied.
 */
int om_sandbox_new(const om_sandbox_opts_t *opts, om_sandbox_t **out);

/* om_sandbox_free: closes the state. NULL is accepted. */
void om_sandbox_free(om_sandbox_t *sb);

/* The sandbox's state, for pushing arguments and reading results. */
lua_State *om_sandbox_state(om_sandbox_t *sb);

/*
 * om_sandbox_load: compile src (text only) as chunk `name` with the sandbox
 * _ENV and run its top level under the call budgets. On LUA_OK the chunk's
 * first result is on the stack; otherwise the error message (with traceback)
 * is, and the state is still usable.
 */
int om_sandbox_load(om_sandbox_t *sb, const char *name, const char *src,
                    size_t len);

/*
 * om_sandbox_call: call the function below nargs arguments under fresh
 * budgets, through om_lua_pcall. Same stack contract as lua_pcall. A budget
 * overrun is LUA_ERRRUN with a message starting "budget: ".
 */
int om_sandbox_call(om_sandbox_t *sb, int nargs, int nresults);

/*
 * om_sandbox_call_limited: om_sandbox_call with this call's own budgets:
 * instr_limit VM instructions and wall_limit_ns of wall clock (0 in
 * either: the sandbox's). The proxy runs a traffic policy's per-request
 * calls under budgets far below the load-time ones. The wall-clock cap is
 * read every 1,000 instructions from the monotonic clock; when it passes,
 * the thread's CPU clock over a grace slice of an eighth of the cap
 * decides, so time the process spent descheduled is not charged to the
 * call (a call over its cap costs about 1.125 times the cap, and never
 * more than twice the cap of wall clock). Nested calls
 * share the outer call's budget (the limits of a nested call are ignored).
 */
int om_sandbox_call_limited(om_sandbox_t *sb, int nargs, int nresults,
                            uint64_t instr_limit, uint64_t wall_limit_ns);

/* What ended the last outer call: nothing, or which budget it overran
 * (MEM: the state's memory cap refused a block; a failing malloc of the
 * host is not the policy's overrun and reads NONE). */
enum {
  OM_SANDBOX_TRIP_NONE = 0,
  OM_SANDBOX_TRIP_INSTR = 1,
  OM_SANDBOX_TRIP_WALL = 2,
  OM_SANDBOX_TRIP_MEM = 3
};

/* om_sandbox_last_trip: OM_SANDBOX_TRIP_* of the last outer call (reset
 * when the next one starts). */
int om_sandbox_last_trip(const om_sandbox_t *sb);

/*
 * om_sandbox_require: require(name) as policy code would, but through the
 * sandbox's own loader (a policy cannot have replaced it), under the call
 * budgets. Library modules (openmesh.*) run with an _ENV of their own, out of
 * reach of policy code. LUA_OK leaves the module on the stack.
 */
int om_sandbox_require(om_sandbox_t *sb, const char *name);

/* Bytes the state holds now, and the most it ever held. */
size_t om_sandbox_mem_used(const om_sandbox_t *sb);
size_t om_sandbox_mem_peak(const om_sandbox_t *sb);

/*
 * om_sandbox_set_clock: fix what os.time() and os.clock() return to policy
 * code (fixed != 0: os.time() is floor(now_s), os.clock() is now_s), or give
 * them back the host's clocks (fixed == 0). For tests of time-dependent
 * policies: the policy runs unchanged, only its view of "now" moves. A
 * policy that declares vary still may not read either (om_policy.c).
 */
void om_sandbox_set_clock(om_sandbox_t *sb, int fixed, double now_s);

/* Push the sandbox's _ENV table. */
void om_sandbox_push_env(om_sandbox_t *sb);

#endif /* OM_SANDBOX_H */
