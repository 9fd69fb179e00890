/*
 * om_lpattern.h: Lua 5.4 pattern matching (string.find, string.match,
 * string.gmatch, string.gsub) with a step budget, for states that run
 * untrusted code.
 *
 * Why: the stock functions run their backtracking matcher in C, where no VM
 * instruction executes, so a count hook never fires and a pattern such as
 * ("a*"):rep(30) .. "b" against ("a"):rep(40) hangs the host. These
 * replacements give the same results as stock Lua 5.4 for every input
 * (Reference Manual §6.4 and §6.4.1, checked differentially in
 * tests/test_lpattern.c), but count matcher steps:
 *
 * - Each top-level call (one find / match / gsub, one step of a gmatch
 *   iterator) may take at most `step_budget` steps; past it the call raises
 *   OM_LPATTERN_BUDGET_MSG. Nesting is bounded like stock (200 levels,
 *   "pattern too complex").
 * - Steps also count as VM instructions toward the state's count hook: every
 *   lua_gethookcount(L) steps the matcher calls the installed count hook
 *   (event LUA_HOOKCOUNT, `ar` filled by lua_getstack level 0), so a host
 *   instruction budget or wall-clock check keeps working while C matches,
 *   and a loop of calls each just under the step budget cannot escape it.
 *   The hook may raise (lua_error); it must not yield.
 */
#ifndef OM_LPATTERN_H
#define OM_LPATTERN_H

#include <stddef.h>
#include <stdint.h>

#include <lua.h>

/* Steps per top-level call when the caller passes 0. */
#define OM_LPATTERN_DEFAULT_STEPS 10000000u

/* The error raised when a call runs out of steps. */
#define OM_LPATTERN_BUDGET_MSG "pattern too complex: step budget exceeded"

/*
 * om_lpattern_install: set fields find, match, gmatch and gsub of the table
 * at string_table_idx to budgeted implementations. Pass the real string
 * library table (the one the string metatable's __index points to) so that
 * method calls like s:find() use them too, and do it before any copy of the
 * table is made. step_budget is the number of matcher steps per top-level
 * call (0: OM_LPATTERN_DEFAULT_STEPS; clamped to LUA_MAXINTEGER); a step is
 * one pattern item tried at one subject position, or one subject byte
 * scanned by a repetition or %b (32 bytes compared by a back-reference),
 * roughly the cost of one VM instruction. Call again to change the budget.
 *
 * Like any Lua API call this may raise a memory error; the four closures are
 * built before any field is set, so a table that already holds the four
 * fields (the string library does) is then unchanged. The stack is balanced
 * on return.
 */
void om_lpattern_install(lua_State *L, int string_table_idx,
                         uint64_t step_budget);

/*
 * om_lpattern_install_capped: the same, and each top-level call takes at
 * most *cap steps when *cap is not 0 (read at every call; cap may be NULL,
 * and must outlive the state). The sandbox points it at half of the
 * running call's instruction budget, so a blow-up inside a call with a
 * small budget still ends in "pattern too complex", not in the call's
 * budget error.
 */
void om_lpattern_install_capped(lua_State *L, int string_table_idx,
                                uint64_t step_budget, const uint64_t *cap);

/*
 * om_lpattern_check: would some subject make the matcher raise on this
 * pattern? Lua compiles a pattern while it matches, so string.find("",
 * "a[") succeeds and the same pattern raises later on text that starts
 * with "a"; a policy's patterns are checked whole at load instead. Walks
 * the grammar the matcher uses (the same item scanner, the same messages)
 * and returns 0, or -1 with stock Lua's message in err ("malformed
 * pattern (missing ']')", "invalid capture index %1", ...). A pattern
 * without magic characters is a plain search and always fine. The byte
 * at pattern[len] must be readable and NUL, as in a Lua string. Pure: no
 * Lua state, no allocation.
 */
int om_lpattern_check(const char *pattern, size_t len, char *err,
                      size_t errlen);

/*
 * om_lpattern_literal_prefix: the literal every match of a valid pattern
 * starts with (after zero-width %f[set] frontiers), into out (room for len
 * bytes); returns its length, 0 when it starts with no literal or is
 * anchored with '^'. A character followed by '*', '?' or '-' is optional
 * and ends the literal; one followed by '+' is required once and ends it
 * too. A plain search for the prefix then an anchored match at each
 * occurrence finds what the pattern finds, faster. pattern[len] must be
 * NUL, as for om_lpattern_check.
 */
size_t om_lpattern_literal_prefix(const char *pattern, size_t len, char *out);

#endif /* OM_LPATTERN_H */
