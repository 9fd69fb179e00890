/*
 * om_lpattern.c: Lua 5.4 patterns with a step budget (see om_lpattern.h).
 *
 * Written from the Lua 5.4 Reference Manual, §6.4 (string.find, match,
 * gmatch, gsub) and §6.4.1 (Patterns), not from lstrlib.c. Where the manual
 * is silent (error wording, which problem is noticed first, how deep the
 * matcher may nest) the behaviour is pinned against the stock interpreter by
 * the differential test in tests/test_lpattern.c.
 *
 * The matcher walks the pattern text itself, with no compile step: a
 * malformed part is reported only when matching reaches it, which is what
 * stock does ("x[" finds nothing in "abc" but raises on "xbc"), so the same
 * inputs raise the same errors. Backtracking is plain recursion; every
 * recursion, every pattern item tried and every subject byte scanned costs
 * steps against the call's budget, and the steps are passed on to the
 * state's count hook as if they were VM instructions.
 */
#define _GNU_SOURCE /* memmem: linear time for the worst plain finds */

#include "om_lpattern.h"

#include <ctype.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>

#include "om_errno.h"

#define MAX_CAPTURES 32 /* as stock LUA_MAXCAPTURES */
#define MAX_DEPTH 200   /* nested match_here calls, as stock */
#define CAP_OPEN (-1)   /* capture length while its ')' is not matched */
#define CAP_POS (-2)    /* capture length of a position capture "()" */
#define GRANT_MAX ((int64_t)1 << 20) /* steps between two slow-path checks */
#define NO_MATCH SIZE_MAX

typedef unsigned char u8;

typedef struct capture_s {
  const u8 *at;
  ptrdiff_t len; /* bytes, or CAP_OPEN / CAP_POS */
} capture_t;

typedef struct matcher_s {
  lua_State *L;
  const u8 *subj, *subj_end; /* the whole subject; *subj_end is its NUL */
  const u8 *pat_end;         /* *pat_end is the pattern's NUL */
  int depth_left;            /* nested match_here calls still allowed */
  int ncap;                  /* captures opened so far */
  /* The budget. The hot path only decrements fuel; refuel() does the rest
   * once per grant, so a step costs one decrement and one branch. */
  int64_t fuel;      /* steps left in the current grant (may go negative) */
  int64_t grant;     /* size of the current grant */
  uint64_t spent;    /* steps of the earlier grants */
  uint64_t budget;   /* steps this top-level call may take */
  uint64_t hook_due; /* steps not yet reported to the count hook */
  capture_t cap[MAX_CAPTURES];
} matcher_t;

/* ---- the step budget ---- */

/* The state's count hook interval, or 0 when no count hook is set. */
static int hook_every(lua_State *L) {
  if (lua_gethook(L) == NULL || !(lua_gethookmask(L) & LUA_MASKCOUNT))
    return 0;
  return lua_gethookcount(L) > 0 ? lua_gethookcount(L) : 0;
}

/* Start a grant: up to the budget, and no further than the next hook tick. */
static void regrant(matcher_t *m, int every) {
  uint64_t left = m->budget - m->spent;
  int64_t g = left < (uint64_t)GRANT_MAX ? (int64_t)left : GRANT_MAX;
  if (every > 0 && m->hook_due < (uint64_t)every &&
      (uint64_t)every - m->hook_due < (uint64_t)g)
    g = (int64_t)((uint64_t)every - m->hook_due);
  m->grant = m->fuel = g;
}

/*
 * The slow path of a step: the grant is used up. Raise once the call's
 * budget is, otherwise report the steps to the count hook (which may raise:
 * a host instruction budget or wall clock) and start the next grant.
 */
static void refuel(matcher_t *m) {
  lua_State *L = m->L;
  uint64_t used = (uint64_t)(m->grant - m->fuel);
  int every = hook_every(L);
  m->spent += used;
  if (m->spent > m->budget) {
    luaL_error(L, "%s", OM_LPATTERN_BUDGET_MSG);
    return;
  }
  if (every == 0) {
    m->hook_due = 0;
  } else {
    m->hook_due += used;
    while (every > 0 && m->hook_due >= (uint64_t)every) {
      lua_Debug ar;
      lua_Hook hook = lua_gethook(L);
      m->hook_due -= (uint64_t)every;
      memset(&ar, 0, sizeof ar);
      lua_getstack(L, 0, &ar); /* so lua_getinfo works inside the hook */
      ar.event = LUA_HOOKCOUNT;
      hook(L, &ar);
      every = hook_every(L); /* the hook may have re-armed itself */
    }
    if (every == 0)
      m->hook_due = 0;
  }
  regrant(m, every);
}

static inline void charge(matcher_t *m, size_t n) {
  m->fuel -= (int64_t)n;
  if (m->fuel < 0)
    refuel(m);
}

static void matcher_init(matcher_t *m, lua_State *L, const char *s, size_t ls,
                         const char *p, size_t lp, uint64_t budget) {
  m->L = L;
  m->subj = (const u8 *)s;
  m->subj_end = m->subj + ls;
  m->pat_end = (const u8 *)p + lp;
  m->spent = 0;
  m->hook_due = 0;
  m->budget = budget;
  regrant(m, hook_every(L));
}

/* Before each match attempt from a new subject position. */
static void matcher_reset(matcher_t *m) {
  m->ncap = 0;
  m->depth_left = MAX_DEPTH;
}

/* ---- single-character classes (§6.4.1, "Character Class") ---- */

/*
 * %x where x is a letter names a class (upper case: its complement); any
 * other x stands for itself. Classes use <ctype.h> in the current locale, as
 * stock does. %z (the NUL byte) is gone from the 5.4 manual but stock 5.4
 * still accepts it as a deprecated class, so it is kept.
 */
static int class_has(int cl, int c) {
  int lower = cl >= 'A' && cl <= 'Z' ? cl - 'A' + 'a' : cl;
  int hit;
  switch (lower) {
  case 'a':
    hit = isalpha(c);
    break;
  case 'c':
    hit = iscntrl(c);
    break;
  case 'd':
    hit = isdigit(c);
    break;
  case 'g':
    hit = isgraph(c);
    break;
  case 'l':
    hit = islower(c);
    break;
  case 'p':
    hit = ispunct(c);
    break;
  case 's':
    hit = isspace(c);
    break;
  case 'u':
    hit = isupper(c);
    break;
  case 'w':
    hit = isalnum(c);
    break;
  case 'x':
    hit = isxdigit(c);
    break;
  case 'z':
    hit = c == 0;
    break;
  default:
    return cl == c;
  }
  return lower == cl ? hit != 0 : hit == 0;
}

/*
 * A set "[...]" from open (its '[') to close (its ']'): members are %x
 * classes, ranges a-z (a '-' first or last is itself), and single bytes; a
 * leading '^' complements. The first member is never the closing ']'
 * (item_end already skipped it), so "[]]" holds ']'.
 */
static int set_has(const u8 *open, const u8 *close, int c) {
  const u8 *q = open + 1;
  int in = 1;
  if (*q == '^') {
    in = 0;
    q++;
  }
  while (q < close) {
    if (*q == '%') {
      if (class_has(q[1], c))
        return in;
      q += 2;
    } else if (q[1] == '-' && q + 2 < close) {
      if (q[0] <= c && c <= q[2])
        return in;
      q += 3;
    } else {
      if (*q == c)
        return in;
      q++;
    }
  }
  return !in;
}

/* The grammar's errors, in stock Lua's words; the matcher raises them and
 * om_lpattern_check reports them. */
#define MSG_ENDS_WITH_PERCENT "malformed pattern (ends with '%')"
#define MSG_MISSING_BRACKET "malformed pattern (missing ']')"
#define MSG_MISSING_B_ARGS "malformed pattern (missing arguments to '%b')"
#define MSG_MISSING_F_SET "missing '[' after '%f' in pattern"
#define MSG_TOO_MANY_CAPTURES "too many captures"
#define MSG_INVALID_CAPTURE "invalid pattern capture"
#define MSG_UNFINISHED_CAPTURE "unfinished capture"

/*
 * One past the single-character class starting at p, or NULL and *why on
 * a '%' that ends the pattern or a set without its ']'. Reading *pat_end
 * is fine: Lua strings end in a NUL, which is neither ']' nor a
 * quantifier.
 */
static const u8 *class_end(const u8 *p, const u8 *pat_end, const char **why) {
  const u8 *q = p + 1;
  if (*p == '%') {
    if (q >= pat_end) {
      *why = MSG_ENDS_WITH_PERCENT;
      return NULL;
    }
    return q + 1;
  }
  if (*p != '[')
    return q;
  if (*q == '^')
    q++;
  do { /* the first member is taken even if it is ']' */
    if (q >= pat_end) {
      *why = MSG_MISSING_BRACKET;
      return NULL;
    }
    if (*q++ == '%' && q < pat_end)
      q++; /* "%]" does not close the set */
  } while (*q != ']');
  return q + 1;
}

/* class_end for the matcher: raises instead. */
static const u8 *item_end(matcher_t *m, const u8 *p) {
  const char *why = NULL;
  const u8 *q = class_end(p, m->pat_end, &why);
  if (q == NULL)
    luaL_error(m->L, "%s", why);
  return q;
}

/* Does byte c belong to the class [p, ep)? */
static inline int item_has(const u8 *p, const u8 *ep, int c) {
  switch (*p) {
  case '.':
    return 1;
  case '%':
    return class_has(p[1], c);
  case '[':
    return set_has(p, ep - 1, c);
  default:
    return *p == c;
  }
}

/* ---- the matcher ---- */

static const u8 *match_here(matcher_t *m, const u8 *s, const u8 *p);

/* x* and x+ (after its first x): the longest run first, then shorter. */
static const u8 *repeat_greedy(matcher_t *m, const u8 *s, const u8 *p,
                               const u8 *ep) {
  const u8 *t = s;
  if (*p == '.')
    t = m->subj_end;
  else
    while (t < m->subj_end && item_has(p, ep, *t))
      t++;
  charge(m, (size_t)(t - s));
  for (;;) {
    const u8 *r = match_here(m, t, ep + 1);
    if (r != NULL)
      return r;
    if (t == s)
      return NULL;
    t--;
  }
}

/* x-: the shortest run first, one more x each time the rest fails. */
static const u8 *repeat_lazy(matcher_t *m, const u8 *s, const u8 *p,
                             const u8 *ep) {
  for (;;) {
    const u8 *r = match_here(m, s, ep + 1);
    if (r != NULL)
      return r;
    if (s < m->subj_end && item_has(p, ep, *s))
      s++;
    else
      return NULL;
  }
}

/* %bxy at s: x, then up to the y that balances it. */
static const u8 *balanced(matcher_t *m, const u8 *s, const u8 *args) {
  const u8 *t = s;
  int open, close, depth = 1;
  if (args + 1 >= m->pat_end)
    luaL_error(m->L, "%s", MSG_MISSING_B_ARGS);
  open = args[0];
  close = args[1];
  if (s >= m->subj_end || *s != open)
    return NULL;
  while (++t < m->subj_end) {
    if (*t == close) { /* tested first: with x == y the first y closes */
      if (--depth == 0) {
        charge(m, (size_t)(t - s));
        return t + 1;
      }
    } else if (*t == open) {
      depth++;
    }
  }
  charge(m, (size_t)(t - s));
  return NULL;
}

/* %1-%9 at s: the same bytes as that (closed) capture. */
static const u8 *back_reference(matcher_t *m, const u8 *s, int digit) {
  int i = digit - '1';
  ptrdiff_t len;
  if (i < 0 || i >= m->ncap || m->cap[i].len == CAP_OPEN)
    luaL_error(m->L, "invalid capture index %%%d", i + 1);
  len = m->cap[i].len;
  if (len < 0) /* a position capture never matches text */
    return NULL;
  charge(m, (size_t)len / 32);
  if ((size_t)(m->subj_end - s) < (size_t)len ||
      memcmp(m->cap[i].at, s, (size_t)len) != 0)
    return NULL;
  return s + len;
}

static const u8 *open_capture(matcher_t *m, const u8 *s, const u8 *p,
                              ptrdiff_t kind) {
  const u8 *r;
  if (m->ncap >= MAX_CAPTURES)
    luaL_error(m->L, "%s", MSG_TOO_MANY_CAPTURES);
  m->cap[m->ncap].at = s;
  m->cap[m->ncap].len = kind;
  m->ncap++;
  r = match_here(m, s, p);
  if (r == NULL)
    m->ncap--;
  return r;
}

/* ')' closes the innermost capture still open. */
static const u8 *close_capture(matcher_t *m, const u8 *s, const u8 *p) {
  const u8 *r;
  int i = m->ncap - 1;
  while (i >= 0 && m->cap[i].len != CAP_OPEN)
    i--;
  if (i < 0)
    luaL_error(m->L, "%s", MSG_INVALID_CAPTURE);
  m->cap[i].len = s - m->cap[i].at;
  r = match_here(m, s, p);
  if (r == NULL)
    m->cap[i].len = CAP_OPEN;
  return r;
}

/*
 * Match pattern [p, pat_end) at s; return the end of the match or NULL.
 * Items that cannot backtrack (a plain class, %b, %f, %1) loop here; the
 * ones that can (?, *, +, -, captures) recurse, and only those count toward
 * the 200-level nesting limit, exactly where stock counts them.
 */
static const u8 *match_here(matcher_t *m, const u8 *s, const u8 *p) {
  if (m->depth_left == 0)
    luaL_error(m->L, "pattern too complex");
  m->depth_left--;
  while (p != m->pat_end) { /* every call either loops or succeeds at once */
    const u8 *ep;
    charge(m, 1);
    switch (*p) {
    case '(':
      if (p[1] == ')')
        s = open_capture(m, s, p + 2, CAP_POS);
      else
        s = open_capture(m, s, p + 1, CAP_OPEN);
      goto done;
    case ')':
      s = close_capture(m, s, p + 1);
      goto done;
    case '$':
      if (p + 1 != m->pat_end)
        break; /* only a final '$' anchors; elsewhere it is a byte */
      if (s != m->subj_end)
        s = NULL;
      goto done;
    case '%':
      if (p[1] == 'b') {
        s = balanced(m, s, p + 2);
        if (s == NULL)
          goto done;
        p += 4;
        continue;
      }
      if (p[1] == 'f') { /* %f[set]: not in set before s, in set at s */
        const u8 *set = p + 2;
        int before, at;
        if (*set != '[')
          luaL_error(m->L, "%s", MSG_MISSING_F_SET);
        ep = item_end(m, set);
        before = s > m->subj ? s[-1] : 0;
        at = s < m->subj_end ? *s : 0;
        if (set_has(set, ep - 1, before) || !set_has(set, ep - 1, at)) {
          s = NULL;
          goto done;
        }
        p = ep;
        continue;
      }
      if (p[1] >= '0' && p[1] <= '9') {
        s = back_reference(m, s, p[1]);
        if (s == NULL)
          goto done;
        p += 2;
        continue;
      }
      break;
    default:
      break;
    }
    ep = item_end(m, p);
    if (s < m->subj_end && item_has(p, ep, *s)) {
      switch (*ep) {
      case '?': {
        const u8 *r = match_here(m, s + 1, ep + 1);
        if (r != NULL) {
          s = r;
          goto done;
        }
        p = ep + 1;
        continue;
      }
      case '+':
        s = repeat_greedy(m, s + 1, p, ep);
        goto done;
      case '*':
        s = repeat_greedy(m, s, p, ep);
        goto done;
      case '-':
        s = repeat_lazy(m, s, p, ep);
        goto done;
      default:
        s++;
        p = ep;
        continue;
      }
    }
    if (*ep == '*' || *ep == '?' || *ep == '-') { /* zero repetitions */
      p = ep + 1;
      continue;
    }
    s = NULL;
    goto done;
  }
done:
  m->depth_left++;
  return s;
}

/* ---- captures ---- */

/*
 * Capture i for a match [s, e). With no captures at all, capture 0 is the
 * whole match. Returns its length and sets *at, or pushes a position
 * capture's index and returns CAP_POS.
 */
static ptrdiff_t capture_get(matcher_t *m, int i, const u8 *s, const u8 *e,
                             const u8 **at) {
  if (i >= m->ncap) {
    if (i != 0)
      luaL_error(m->L, "invalid capture index %%%d", i + 1);
    *at = s;
    return e - s;
  }
  if (m->cap[i].len == CAP_OPEN)
    luaL_error(m->L, "%s", MSG_UNFINISHED_CAPTURE);
  if (m->cap[i].len == CAP_POS) {
    lua_pushinteger(m->L, (lua_Integer)(m->cap[i].at - m->subj) + 1);
    return CAP_POS;
  }
  *at = m->cap[i].at;
  return m->cap[i].len;
}

static void push_capture(matcher_t *m, int i, const u8 *s, const u8 *e) {
  const u8 *at = NULL;
  ptrdiff_t len = capture_get(m, i, s, e, &at);
  if (len != CAP_POS)
    lua_pushlstring(m->L, (const char *)at, (size_t)len);
}

/* Push every capture (or the whole match when s != NULL and none). */
static int push_captures(matcher_t *m, const u8 *s, const u8 *e) {
  int n = m->ncap == 0 && s != NULL ? 1 : m->ncap;
  luaL_checkstack(m->L, n, "too many captures");
  for (int i = 0; i < n; i++)
    push_capture(m, i, s, e);
  return n;
}

/* ---- the library functions (§6.4) ---- */

static uint64_t budget_of(lua_State *L) {
  uint64_t b = (uint64_t)lua_tointeger(L, lua_upvalueindex(1));
  const uint64_t *cap = lua_touserdata(L, lua_upvalueindex(2));
  return cap != NULL && *cap != 0 && *cap < b ? *cap : b;
}

/* The 0-based offset for a 1-based init that may count from the end. */
static size_t start_offset(lua_Integer init, size_t len) {
  if (init > 0)
    return (size_t)init - 1;
  if (init == 0 || init < -(lua_Integer)len)
    return 0;
  return len - (size_t)(-init);
}

/* Does the pattern use any magic character? Without one, find is plain. */
static int has_magic(const char *p, size_t lp) {
  for (size_t i = 0; i < lp; i++) {
    switch (p[i]) {
    case '^':
    case '$':
    case '*':
    case '+':
    case '?':
    case '.':
    case '(':
    case '[':
    case '%':
    case '-':
      return 1;
    default:
      break;
    }
  }
  return 0;
}

/*
 * The first occurrence of n in h. memchr on the first byte then memcmp is
 * what makes everyday plain finds fast, but it is quadratic on inputs like
 * ("a"):rep(1e6):find(("a"):rep(5e5) .. "b", 1, true); once the compares
 * cost more than a few passes over what was scanned, finish with memmem,
 * which is linear. Either way the answer is the same first occurrence.
 */
static const char *plain_find(const char *h, size_t hl, const char *n,
                              size_t nl) {
  const char *at = h, *last;
  size_t work = 0;
  if (nl == 0)
    return h;
  if (nl > hl)
    return NULL;
  last = h + (hl - nl); /* the last possible start */
  while (at <= last) {
    const char *c = memchr(at, (u8)n[0], (size_t)(last - at) + 1);
    if (c == NULL)
      return NULL;
    if (memcmp(c + 1, n + 1, nl - 1) == 0)
      return c;
    at = c + 1;
    work += nl;
    if (work > 4 * (size_t)(at - h) + 4096)
      return memmem(at, hl - (size_t)(at - h), n, nl);
  }
  return NULL;
}

static int find_or_match(lua_State *L, int find) {
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  size_t init = start_offset(luaL_optinteger(L, 3, 1), ls);
  matcher_t m;
  const u8 *at;
  int anchored;
  if (init > ls) { /* starts past the end: nothing to find */
    luaL_pushfail(L);
    return 1;
  }
  if (find && (lua_toboolean(L, 4) || !has_magic(p, lp))) {
    const char *hit = plain_find(s + init, ls - init, p, lp);
    if (hit == NULL) {
      luaL_pushfail(L);
      return 1;
    }
    lua_pushinteger(L, (lua_Integer)(hit - s) + 1);
    lua_pushinteger(L, (lua_Integer)(hit - s + lp));
    return 2;
  }
  anchored = *p == '^';
  if (anchored) {
    p++;
    lp--;
  }
  matcher_init(&m, L, s, ls, p, lp, budget_of(L));
  at = m.subj + init;
  for (;;) {
    const u8 *e;
    matcher_reset(&m);
    e = match_here(&m, at, (const u8 *)p);
    if (e != NULL) {
      if (!find)
        return push_captures(&m, at, e);
      lua_pushinteger(L, (lua_Integer)(at - m.subj) + 1);
      lua_pushinteger(L, (lua_Integer)(e - m.subj));
      return push_captures(&m, NULL, NULL) + 2;
    }
    if (anchored || at >= m.subj_end)
      break;
    at++;
  }
  luaL_pushfail(L);
  return 1;
}

/* string.find (s, pattern [, init [, plain]]) */
static int lp_find(lua_State *L) {
  return find_or_match(L, 1);
}

/* string.match (s, pattern [, init]) */
static int lp_match(lua_State *L) {
  return find_or_match(L, 0);
}

/* The iterator's state; the subject and pattern are its upvalues 1 and 2. */
typedef struct gmatch_s {
  size_t pos;  /* next offset to try */
  size_t last; /* end of the previous match, or NO_MATCH */
  uint64_t budget;
} gmatch_t;

/*
 * One step of a gmatch iterator, a top-level call with its own budget. A
 * '^' is a plain byte here (§6.4: it would stop the iteration), and an
 * empty match ending where the previous match ended is skipped, so "a*"
 * over "baa" gives "", "aa", "" and not a second "" after "aa".
 */
static int gmatch_next(lua_State *L) {
  size_t ls, lp;
  const char *s = lua_tolstring(L, lua_upvalueindex(1), &ls);
  const char *p = lua_tolstring(L, lua_upvalueindex(2), &lp);
  gmatch_t *g = lua_touserdata(L, lua_upvalueindex(3));
  matcher_t m;
  matcher_init(&m, L, s, ls, p, lp, g->budget);
  for (size_t pos = g->pos; pos <= ls; pos++) {
    const u8 *e;
    matcher_reset(&m);
    e = match_here(&m, m.subj + pos, (const u8 *)p);
    if (e != NULL && (size_t)(e - m.subj) != g->last) {
      g->pos = g->last = (size_t)(e - m.subj);
      return push_captures(&m, m.subj + pos, e);
    }
  }
  g->pos = ls + 1; /* exhausted: later calls return nothing at once */
  return 0;
}

/* string.gmatch (s, pattern [, init]) */
static int lp_gmatch(lua_State *L) {
  size_t ls, lp;
  gmatch_t *g;
  size_t init;
  uint64_t budget = budget_of(L);
  luaL_checklstring(L, 1, &ls);
  luaL_checklstring(L, 2, &lp);
  init = start_offset(luaL_optinteger(L, 3, 1), ls);
  lua_settop(L, 2); /* [s, p]: the iterator keeps both alive */
  g = lua_newuserdatauv(L, sizeof *g, 0);
  g->pos = init > ls ? ls + 1 : init;
  g->last = NO_MATCH;
  g->budget = budget;
  lua_pushcclosure(L, gmatch_next, 3);
  return 1;
}

/* A replacement string: %0-%9 are captures, %% is '%', any other % raises. */
static void add_template(matcher_t *m, luaL_Buffer *b, const char *t, size_t tl,
                         const u8 *s, const u8 *e) {
  const char *end = t + tl;
  for (;;) {
    const char *pc = memchr(t, '%', (size_t)(end - t));
    int d;
    if (pc == NULL) {
      luaL_addlstring(b, t, (size_t)(end - t));
      return;
    }
    luaL_addlstring(b, t, (size_t)(pc - t));
    d = (u8)pc[1]; /* the string's NUL when '%' is last */
    if (d == '%') {
      luaL_addchar(b, '%');
    } else if (d == '0') {
      luaL_addlstring(b, (const char *)s, (size_t)(e - s));
    } else if (d >= '1' && d <= '9') {
      const u8 *at = NULL;
      ptrdiff_t len = capture_get(m, d - '1', s, e, &at);
      if (len == CAP_POS)
        luaL_addvalue(b);
      else
        luaL_addlstring(b, (const char *)at, (size_t)len);
    } else {
      luaL_error(m->L, "invalid use of '%%' in replacement string");
    }
    t = pc + 2;
  }
}

/*
 * Append the replacement for the match [s, e): the template, the function's
 * result for the captures, or the table's value for the first capture; a
 * false or nil result keeps the matched text. Returns whether it changed.
 */
static int add_replacement(matcher_t *m, luaL_Buffer *b, int kind,
                           const char *t, size_t tl, const u8 *s, const u8 *e) {
  lua_State *L = m->L;
  if (kind == LUA_TFUNCTION) {
    int n;
    lua_pushvalue(L, 3);
    n = push_captures(m, s, e);
    lua_call(L, n, 1);
  } else if (kind == LUA_TTABLE) {
    push_capture(m, 0, s, e);
    lua_gettable(L, 3);
  } else {
    add_template(m, b, t, tl, s, e);
    return 1;
  }
  if (!lua_toboolean(L, -1)) {
    lua_pop(L, 1);
    luaL_addlstring(b, (const char *)s, (size_t)(e - s));
    return 0;
  }
  if (!lua_isstring(L, -1))
    return luaL_error(L, "invalid replacement value (a %s)",
                      luaL_typename(L, -1));
  luaL_addvalue(b);
  return 1;
}

/* string.gsub (s, pattern, repl [, n]) */
static int lp_gsub(lua_State *L) {
  size_t ls, lp, tl = 0;
  const char *src = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  int kind = lua_type(L, 3);
  lua_Integer max_n = luaL_optinteger(L, 4, (lua_Integer)ls + 1);
  const char *t = NULL;
  const u8 *at, *last = NULL;
  lua_Integer n = 0;
  int anchored, changed = 0;
  matcher_t m;
  luaL_Buffer b;
  luaL_argexpected(L,
                   kind == LUA_TNUMBER || kind == LUA_TSTRING ||
                       kind == LUA_TFUNCTION || kind == LUA_TTABLE,
                   3, "string/function/table");
  if (kind == LUA_TNUMBER || kind == LUA_TSTRING)
    t = lua_tolstring(L, 3, &tl);
  anchored = *p == '^';
  if (anchored) {
    p++;
    lp--;
  }
  matcher_init(&m, L, src, ls, p, lp, budget_of(L));
  at = m.subj;
  luaL_buffinit(L, &b);
  while (n < max_n) {
    const u8 *e;
    matcher_reset(&m);
    e = match_here(&m, at, (const u8 *)p);
    if (e != NULL && e != last) { /* never an empty match where one ended */
      n++;
      changed |= add_replacement(&m, &b, kind, t, tl, at, e);
      at = last = e;
    } else if (at < m.subj_end) {
      luaL_addchar(&b, (char)*at++);
    } else {
      break;
    }
    if (anchored)
      break;
  }
  if (changed) {
    luaL_addlstring(&b, (const char *)at, (size_t)(m.subj_end - at));
    luaL_pushresult(&b);
  } else {
    lua_pushvalue(L, 1); /* nothing replaced: the subject itself */
  }
  lua_pushinteger(L, n);
  return 2;
}

void om_lpattern_install(lua_State *L, int string_table_idx,
                         uint64_t step_budget) {
  om_lpattern_install_capped(L, string_table_idx, step_budget, NULL);
}

void om_lpattern_install_capped(lua_State *L, int string_table_idx,
                                uint64_t step_budget, const uint64_t *cap) {
  static const luaL_Reg fns[] = {{"find", lp_find},
                                 {"match", lp_match},
                                 {"gmatch", lp_gmatch},
                                 {"gsub", lp_gsub}};
  int n = (int)(sizeof fns / sizeof fns[0]);
  int idx = lua_absindex(L, string_table_idx);
  if (step_budget == 0)
    step_budget = OM_LPATTERN_DEFAULT_STEPS;
  if (step_budget > (uint64_t)LUA_MAXINTEGER)
    step_budget = (uint64_t)LUA_MAXINTEGER;
  for (int i = 0; i < n; i++) { /* [closures...] */
    lua_pushinteger(L, (lua_Integer)step_budget);
    lua_pushlightuserdata(L, (void *)cap);
    lua_pushcclosure(L, fns[i].func, 2);
  }
  for (int i = n - 1; i >= 0; i--)
    lua_setfield(L, idx, fns[i].name);
}

/* ---- checking a pattern without a subject ---- */

int om_lpattern_check(const char *pattern, size_t lp, char *err,
                      size_t errlen) {
  const u8 *p = (const u8 *)pattern, *end = p + lp;
  int level = 0, nopen = 0;
  int open[MAX_CAPTURES], closed[MAX_CAPTURES + 1] = {0};
  const char *why = NULL;
  if (!has_magic(pattern, lp))
    return 0; /* a plain search: nothing to compile (stock nospecials) */
  if (p < end && *p == '^')
    p++;
  while (why == NULL && p < end) {
    int next = p + 1 < end ? p[1] : 0;
    if (*p == '(') {
      if (++level > MAX_CAPTURES) {
        why = MSG_TOO_MANY_CAPTURES;
      } else if (next == ')') { /* a position capture is complete at once */
        closed[level] = 1;
        p += 2;
      } else {
        open[nopen++] = level;
        p++;
      }
    } else if (*p == ')') {
      if (nopen == 0)
        why = MSG_INVALID_CAPTURE;
      else
        closed[open[--nopen]] = 1;
      p++;
    } else if (*p == '$' && p + 1 == end) {
      p++;
    } else if (*p == '%' && next == 'b') {
      if (end - p < 4)
        why = MSG_MISSING_B_ARGS;
      p += 4;
    } else if (*p == '%' && next == 'f') {
      if (end - p < 3 || p[2] != '[')
        why = MSG_MISSING_F_SET;
      else
        p = class_end(p + 2, end, &why);
    } else if (*p == '%' && next >= '0' && next <= '9') {
      if (!closed[next - '0']) {
        om_errbuf(err, errlen, "invalid capture index %%%d", next - '0');
        return -1;
      }
      p += 2;
    } else {
      p = class_end(p, end, &why);
      if (p != NULL && p < end &&
          (*p == '*' || *p == '+' || *p == '-' || *p == '?'))
        p++;
    }
  }
  if (why == NULL && nopen > 0)
    why = MSG_UNFINISHED_CAPTURE;
  if (why != NULL) {
    om_errbuf(err, errlen, "%s", why);
    return -1;
  }
  return 0;
}

size_t om_lpattern_literal_prefix(const char *pattern, size_t lp, char *out) {
  const u8 *p = (const u8 *)pattern, *end = p + lp;
  const char *why = NULL;
  size_t n = 0;
  if (lp > 0 && *p == '^')
    return 0; /* already anchored: nothing to gain */
  while (end - p >= 2 && p[0] == '%' && p[1] == 'f') { /* zero-width */
    if (p + 2 >= end || (p = class_end(p + 2, end, &why)) == NULL)
      return 0;
  }
  while (p < end) {
    int c = *p, w = 1, q;
    if (c == '%') {
      if (p + 1 >= end || isalnum(p[1]))
        break; /* a class (%d), a back-reference, %b or %f */
      c = p[1];
      w = 2;
    } else if (c != '\0' && strchr("^$*+?.()[-", c) != NULL) {
      break;
    }
    q = p + w < end ? p[w] : 0;
    if (q == '*' || q == '?' || q == '-')
      break; /* optional: not part of every match */
    out[n++] = (char)c;
    if (q == '+')
      break; /* required once, then a run of unknown length */
    p += w;
  }
  return n;
}
