/*
 * test_lpattern.c: the budgeted pattern functions give exactly what stock
 * Lua 5.4 gives, and a pattern that would backtrack forever ends in
 * "pattern too complex" quickly.
 *
 * The differential tests run every case in two states side by side: a
 * plain luaL_openlibs state (the stock string library) and one where
 * om_lpattern_install replaced find / match / gmatch / gsub. Results are
 * compared as a canonical text of every returned value (type included);
 * errors as their message without the "chunk:line: " prefix.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lauxlib.h>
#include <lualib.h>

#include "om_lpattern.h"
#include "om_rng.h"

/* OM_LPATTERN_CASES=N OM_LPATTERN_SEED=S run a longer or other sweep. */
#define RANDOM_CASES 50000

/* Helpers defined in both states: gmatch collected, a replacement function
 * and table whose answers vary (string, number, false, nil, bad types). */
static const char helpers[] =
    "ALL = (function() local t = {} for i = 0, 255 do "
    "  t[#t + 1] = string.char(i) end return table.concat(t) end)()\n"
    "function G(s, p, init, limit)\n"
    "  local it, out = string.gmatch(s, p, init), {}\n"
    "  for _ = 1, limit or 200 do\n"
    "    local r = table.pack(it())\n"
    "    if r.n == 0 then break end\n"
    "    for i = 1, r.n do out[#out + 1] = math.type(r[i]) and\n"
    "      ('#' .. r[i]) or ('[' .. r[i] .. ']') end\n"
    "    out[#out + 1] = '|'\n"
    "  end\n"
    "  return table.concat(out, ' ')\n"
    "end\n"
    "function F(...)\n"
    "  local n, a = select('#', ...), ...\n"
    "  local k = #tostring(a) % 5\n"
    "  if k == 0 then return nil elseif k == 1 then return false\n"
    "  elseif k == 2 then return n * 10 end\n"
    "  local t = table.pack(...)\n"
    "  for i = 1, t.n do t[i] = tostring(t[i]) end\n"
    "  return '<' .. table.concat(t, ',') .. '>'\n"
    "end\n"
    "T = {a = 'A', b = false, ab = '<ab>', ['1'] = 'one', [1] = 'p1',\n"
    "     [2] = 2.5, [3] = 3, c = 7, aa = '', ['('] = 'P', bad = {}}\n";

/* ---- two states ---- */

static lua_State *new_state(int ours, uint64_t budget) {
  lua_State *L = luaL_newstate();
  assert_non_null(L);
  luaL_openlibs(L);
  if (ours) {
    lua_getglobal(L, "string");
    om_lpattern_install(L, -1, budget);
    lua_pop(L, 1);
  }
  if (luaL_dostring(L, helpers) != LUA_OK)
    fail_msg("helpers: %s", lua_tostring(L, -1));
  assert_int_equal(lua_gettop(L), 0);
  return L;
}

/* A growable text buffer for result summaries. */
typedef struct text_s {
  char *p;
  size_t len, cap;
} text_t;

static void text_add(text_t *t, const char *s, size_t n) {
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + n + 1)
      cap *= 2;
    t->p = realloc(t->p, cap);
    assert_non_null(t->p);
    t->cap = cap;
  }
  memcpy(t->p + t->len, s, n);
  t->len += n;
  t->p[t->len] = '\0';
}

static void text_str(text_t *t, const char *s) {
  text_add(t, s, strlen(s));
}

/* Bytes made printable, for summaries and failure messages. */
static void text_escaped(text_t *t, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    if (c >= 32 && c < 127 && c != '\\') {
      text_add(t, (const char *)&c, 1);
    } else {
      snprintf(esc, sizeof esc, "\\%u", c);
      text_str(t, esc);
    }
  }
}

/* The message without a leading "chunk:line: " position. */
static const char *strip_position(const char *msg) {
  const char *c = strchr(msg, ':');
  const char *d;
  if (c == NULL || c[1] < '0' || c[1] > '9')
    return msg;
  for (d = c + 1; *d >= '0' && *d <= '9'; d++)
    ;
  return d[0] == ':' && d[1] == ' ' ? d + 2 : msg;
}

/*
 * Summarize a pcall: status and the values from stack index base up, then
 * drop them. Each value is typed, so 1 and "1" and 1.0 differ.
 */
static void summarize(lua_State *L, int status, int base, text_t *t) {
  t->len = 0;
  text_str(t, "");
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    text_str(t, "error: ");
    text_str(t, msg ? strip_position(msg) : "(not a string)");
    lua_settop(L, base - 1);
    return;
  }
  for (int i = base; i <= lua_gettop(L); i++) {
    char num[64];
    if (i > base)
      text_str(t, ", ");
    switch (lua_type(L, i)) {
    case LUA_TNIL:
      text_str(t, "nil");
      break;
    case LUA_TBOOLEAN:
      text_str(t, lua_toboolean(L, i) ? "true" : "false");
      break;
    case LUA_TNUMBER:
      if (lua_isinteger(L, i))
        snprintf(num, sizeof num, "%lld", (long long)lua_tointeger(L, i));
      else
        snprintf(num, sizeof num, "%.17gf", (double)lua_tonumber(L, i));
      text_str(t, num);
      break;
    case LUA_TSTRING: {
      size_t n;
      const char *s = lua_tolstring(L, i, &n);
      text_str(t, "\"");
      text_escaped(t, s, n);
      text_str(t, "\"");
      break;
    }
    default:
      text_str(t, luaL_typename(L, i));
      break;
    }
  }
  lua_settop(L, base - 1);
}

typedef struct pair_s {
  lua_State *stock, *ours;
  text_t a, b;
  long compared, mismatched;
  int quiet; /* count mismatches without printing them */
} pair_t;

static void pair_open(pair_t *p) {
  memset(p, 0, sizeof *p);
  p->stock = new_state(0, 0);
  p->ours = new_state(1, 0);
}

static void pair_close(pair_t *p) {
  lua_close(p->stock);
  lua_close(p->ours);
  free(p->a.p);
  free(p->b.p);
}

/* Compare the two summaries; report (up to a few) differences. */
static void pair_compare(pair_t *p, const char *what) {
  p->compared++;
  if (strcmp(p->a.p, p->b.p) == 0)
    return;
  if (p->mismatched++ < 12 && !p->quiet)
    print_message("MISMATCH %.300s\n   stock: %.300s\n   ours:  %.300s\n", what,
                  p->a.p, p->b.p);
}

/* ---- the hand-written cases ---- */

static const char *const cases[] = {
    /* find: plain, init, fast path */
    "('hello world'):find('o w')",
    "('hello world'):find('o', 5)",
    "('hello world'):find('o', 6)",
    "('hello world'):find('l', -3)",
    "('hello world'):find('h', -100)",
    "('hello world'):find('h', 0)",
    "('hello'):find('', 10)",
    "('hello'):find('', 6)",
    "('hello'):find('', 7)",
    "('hello'):find('', -1)",
    "('hello'):find('x', 6)",
    "('a.b'):find('.', 1, true)",
    "('a.b'):find('.')",
    "('a+b'):find('+', 1, true)",
    "('a+b'):find('a+b')",
    "('a+b'):find('a%+b')",
    "('a\\0b'):find('\\0')",
    "('xa\\0b.'):find('a\\0b.')",
    "('a\\0b'):find('[\\0]')",
    "('abc'):find('b', 1, false)",
    "('abc'):find('b', 1, nil)",
    "('abc'):find('[b]', 1, 1)",
    "('x[b]'):find('[b]', 1, true)",
    "('abc'):find(')')",
    "('a)'):find(')')",
    "('abc'):find('b', 2^53)",
    "('abc'):find('b', math.mininteger)",
    "('abc'):find('b', math.maxinteger)",
    "('abc'):find('b', '2')",
    "('x'):rep(10):find('x', -3)",
    "(''):find('')",
    "(''):find('', 1)",
    "(''):find('', 2)",
    "(''):find('^$')",
    "('hello'):find('^')",
    "('hello'):find('$')",
    "('aaab'):find('aab', 1, true)",
    "(('ab'):rep(50) .. 'c'):find(('ab'):rep(20) .. 'c', 1, true)",
    /* plain finds long enough to leave memchr for memmem */
    "(('a'):rep(3000) .. 'b' .. ('a'):rep(10)):find(('a'):rep(1000) .. 'b', "
    "1, true)",
    "(('a'):rep(3000) .. 'b'):find(('a'):rep(1000) .. 'c', 1, true)",
    "(('a'):rep(3000) .. 'b'):find(('a'):rep(1000) .. 'b', 2500)",
    "(('a'):rep(3000)):find(('a'):rep(3000))",
    "(('ab'):rep(3000)):find(('ab'):rep(500) .. 'a', -1200, true)",
    /* find with pattern features */
    "('hello'):find('l+')",
    "('hello'):find('(l)(l)')",
    "('hello'):find('()ll()')",
    "('hello'):find('^h')",
    "('hello'):find('^e')",
    "('hello'):find('^e', 2)",
    "('hello'):find('o$')",
    "('hello'):find('l$')",
    "('a$b'):find('$b')",
    "('a$b'):find('a$b')",
    "('x^y'):find('^', 1, true)",
    "('x^y'):find('%^')",
    "('x^y'):match('x^y')",
    "('*a'):find('*')",
    "('+'):find('+')",
    "('?'):find('?')",
    "('a'):find('?')",
    "('-x'):find('-')",
    /* match */
    "('key = value'):match('(%w+)%s*=%s*(%w+)')",
    "('  trim me  '):match('^%s*(.-)%s*$')",
    "('hello'):match('.-')",
    "('hello'):match('.-$')",
    "('hello'):match('l*')",
    "('hello'):match('l-o')",
    "('hello'):match('h?e')",
    "('ello'):match('h?e')",
    "('hello'):match('x?')",
    "('a-b'):match('a-b')",
    "('2024-01-15'):match('(%d+)-(%d+)-(%d+)')",
    "('abc'):match('()b()')",
    "('abc'):match('()')",
    "('abc'):match('()', 4)",
    "('abc'):match('()', 5)",
    "('abc'):match('()', -1)",
    "('abc'):match('.-b')",
    "('abc'):match('a.-$')",
    "('hello world'):match('^(%w+)')",
    "('path/to/file.txt'):match('([^/]+)$')",
    "('path/to/file.txt'):match('(.+)%.(%w+)$')",
    "('192.168.1.1'):match('^(%d+)%.(%d+)%.(%d+)%.(%d+)$')",
    "('[test]'):match('%[(.-)%]')",
    "('abc'):match('((a)(b))')",
    "('abc'):match('(a(b(c)))')",
    "('abc'):match('(a)(b)(c)()')",
    "('aaa'):match('(a)*')",
    "('%%%'):match('%%+')",
    "('aab'):match('[ab]+')",
    "('()+'):match('%b()+')",
    "('x*'):match('%f[x]x*')",
    "('caf\\195\\169'):match('[\\128-\\255]+')",
    "('\\255'):find('%a')",
    "('\\0'):find('%c')",
    "('\\0'):match('[%z]')",
    "('z'):match('%z')",
    "('Z'):match('%Z')",
    "('abc'):match('%z')",
    "('a'):match(('()'):rep(32))",
    "('hello'):match('h(.)(.)%2(.)')",
    /* classes and sets, against all 256 bytes */
    "(ALL):gsub('%a', '')",
    "(ALL):gsub('%A', '')",
    "(ALL):gsub('%c', '')",
    "(ALL):gsub('%C', '')",
    "(ALL):gsub('%d', '')",
    "(ALL):gsub('%D', '')",
    "(ALL):gsub('%g', '')",
    "(ALL):gsub('%G', '')",
    "(ALL):gsub('%l', '')",
    "(ALL):gsub('%L', '')",
    "(ALL):gsub('%p', '')",
    "(ALL):gsub('%P', '')",
    "(ALL):gsub('%s', '')",
    "(ALL):gsub('%S', '')",
    "(ALL):gsub('%u', '')",
    "(ALL):gsub('%U', '')",
    "(ALL):gsub('%w', '')",
    "(ALL):gsub('%W', '')",
    "(ALL):gsub('%x', '')",
    "(ALL):gsub('%X', '')",
    "(ALL):gsub('.', '')",
    "(ALL):gsub('%.', '')",
    "(ALL):gsub('%%', '')",
    "(ALL):gsub('%]', '')",
    "(ALL):gsub('[%a_]', '')",
    "(ALL):gsub('[^%a_]', '')",
    "(ALL):gsub('[a-f]', '')",
    "(ALL):gsub('[]]', '')",
    "(ALL):gsub('[^]]', '')",
    "(ALL):gsub('[]a]', '')",
    "(ALL):gsub('[a-]', '')",
    "(ALL):gsub('[-a]', '')",
    "(ALL):gsub('[%-]', '')",
    "(ALL):gsub('[%]]', '')",
    "(ALL):gsub('[z-a]', '')",
    "(ALL):gsub('[a-a]', '')",
    "(ALL):gsub('[^^]', '')",
    "(ALL):gsub('[\\200-\\255]', '')",
    "(ALL):gsub('[a%-z]', '')",
    "(ALL):gsub('[%a-z]', '')",
    "(ALL):gsub('[a-%%]', '')",
    "(ALL):gsub('[%w%s]', '')",
    "(ALL):gsub('[^%W]', '')",
    "(ALL):gsub('[.]', '')",
    "(ALL):gsub('[%z]', '')",
    "(ALL):gsub('[^]', '')",
    "(ALL):gsub('%f[%w]', '|')",
    "(ALL):gsub('%f[%W]', '|')",
    /* frontier */
    "('THE (quick) fox'):gsub('%f[%a]%a+', 'X')",
    "G('THE (quick) fox', '%f[%a]%a+')",
    "('hello'):find('%f[%l]')",
    "('hello'):find('%f[%L]')",
    "('aaa'):find('%f[a]', 2)",
    "('x'):find('%f[^x]')",
    "('\\0a'):find('%f[a]')",
    "('a'):find('%f[%z]')",
    "G('the cat sat', '%f[%w]%w+%f[%W]')",
    /* %b */
    "('x(a(b)c)y'):match('%b()')",
    "('((a)'):match('%b()')",
    "('no parens'):match('%b()')",
    "('[a[b]]'):find('%b[]')",
    "(\"'quote' x\"):match(\"%b''\")",
    "('a(b)c'):gsub('%b()', '')",
    "G('f(a)(b(c))', '%b()')",
    "('if x then y end end'):match('%bie')",
    /* back-references */
    "('hello'):find('(l)%1')",
    "(\"say 'hi' and \\\"x\\\"\"):match(\"([\\\"'])(.-)%1\")",
    "('abab'):match('(ab)%1')",
    "('xx'):match('(x)%1%1')",
    "('aa'):find('()%1')",
    "('abcabc'):match('(a(b)c)%1')",
    /* gsub */
    "('hello world'):gsub('o', '0')",
    "('hello world'):gsub('o', '0', 1)",
    "('hello world'):gsub('o', '0', 0)",
    "('hello world'):gsub('o', '0', -1)",
    "('hello world'):gsub('', '-')",
    "('abc'):gsub('.-', '-')",
    "('abc'):gsub('x*', '-')",
    "('abc'):gsub('b*', '-')",
    "('hello'):gsub('^h', 'H')",
    "('aaa'):gsub('^a', 'b')",
    "('hello'):gsub('^', '>')",
    "('hello'):gsub('$', '<')",
    "('hello'):gsub('l', {l = 'L'})",
    "('hello'):gsub('%w', T)",
    "('hello world'):gsub('%w+', F)",
    "('abc'):gsub('%w', function() return nil end)",
    "('abc'):gsub('%w', function() return false end)",
    "('abc'):gsub('%w', function() return 1.5 end)",
    "('abc'):gsub('%w', function(c) return c:upper() end)",
    "('abc'):gsub('b', '%1')",
    "('abc'):gsub('b', '%0%0')",
    "('abc'):gsub('b', '%%')",
    "('abc'):gsub('()b', '%1')",
    "('abc'):gsub('(b)()', '%2%1')",
    "('abc'):gsub('b', 5)",
    "('abc'):gsub('b', 5.5)",
    "('abc'):gsub('b', 'x', '2')",
    "(123):gsub('2', 'x')",
    "string.gsub(123, 2, 5)",
    "('a,b,,c'):gsub(',', ';', 2)",
    "('abc'):gsub('%w', '%1%1')",
    "('x = 1, y = 2'):gsub('(%w+) = (%w+)', '%2 = %1')",
    "('hello'):gsub('', {})",
    "('abc'):gsub('()', {[1] = '<1>', [3] = '<3>'})",
    "('abc'):gsub('()(%w)()', F)",
    "('a(b'):gsub('%(', T)",
    "('one two  three'):gsub('%s+', ' ')",
    "('CamelCaseString'):gsub('(%u)', ' %1')",
    "('a,b;c d'):gsub('[,; ]', '|')",
    "('%d'):gsub('%%d', '%%%%')",
    "('50%'):gsub('%%', ' percent')",
    "('a.b'):gsub('%.', '%%')",
    "(('ab'):rep(100)):gsub('ab', 'x')",
    "('abc'):gsub('', '')",
    "('abc'):gsub('b', '\\0%0\\0')",
    "('abc'):gsub('.', {a = 1, b = 2.0})",
    /* gmatch */
    "G('hello world from lua', '%a+')",
    "G('k1=v1, k2=v2', '(%w+)=(%w+)')",
    "G('abc', '')",
    "G('abc', 'x*')",
    "G('baa', 'a*')",
    "G('^a^a', '^a')",
    "G('hello', '.', 3)",
    "G('hello', '.', -2)",
    "G('hello', '.', 10)",
    "G('hello', '.', 6)",
    "G('hello', '', 6)",
    "G('hello', '.', 0)",
    "G('hello', '()')",
    "G('abc', '%f[%w]')",
    "G('a b', '%s*')",
    "G('', '')",
    "G('', 'x')",
    "G('abab', '(a)(b)')",
    "G('a1b22c333', '%d+')",
    "G('aaa', 'a-')",
    "G(123, 2)",
    /* errors */
    "('abc'):find('%')",
    "('abc'):find('[a')",
    "('abc'):find('[')",
    "('abc'):find('[^')",
    "('abc'):find('[]')",
    "('abc'):find('[^]')",
    "('abc'):find('[%')",
    "('abc'):find('a%')",
    "('bbb'):find('a%')",
    "('abc'):find('x[')",
    "('xbc'):find('x[')",
    "('abc'):find('(()')",
    "('abc'):find('(')",
    "('abc'):find('a)')",
    "('abc'):find('%b')",
    "('abc'):find('%ba')",
    "('abc'):find('%b(')",
    "('abc'):find('%fa')",
    "('abc'):find('%f[a')",
    "('abc'):find('(a)%2')",
    "('abc'):find('%1')",
    "('abc'):find('%0')",
    "('abc'):find('(a%1)')",
    "('a'):match(('()'):rep(33))",
    "('abc'):gsub('(b)', '%2')",
    "('abc'):gsub('b', '%2')",
    "('abc'):gsub('b', '%')",
    "('abc'):gsub('b', '%x')",
    "('abc'):gsub('b', 'x%')",
    "('abc'):gsub('%w', function() return {} end)",
    "('abc'):gsub('(%w)', {a = true})",
    "('abc'):gsub('%w', T)",
    "('bad'):gsub('%w+', T)",
    "('abc'):gsub('%w', function() error('boom') end)",
    "('abc'):gsub('b')",
    "('abc'):gsub('b', 'x', 'y')",
    "('abc'):gsub('b', 'x', 1.5)",
    "('abc'):gsub('b', true)",
    "string.find()",
    "string.find('a')",
    "string.find('a', 'b', 'x')",
    "string.find({}, 'a')",
    "string.match('a', {})",
    "string.gmatch()",
    "string.gmatch('a', 'b', 'c')",
    "G('abc', '[')",
    "G('ax[', 'x[')",
    /* nesting depth (stock allows 200 levels) */
    "('a'):rep(300):find(('a?'):rep(199))",
    "('a'):rep(300):find(('a?'):rep(200))",
    "(''):find(('a?'):rep(500))",
    "('a'):rep(250):find(('a-'):rep(250) .. '$')",
    "(''):find(('a*'):rep(250))",
    "('a'):find(('a*'):rep(250))",
    "('a'):rep(300):match(('(a)'):rep(20))",
};

static void run_expr(lua_State *L, const char *expr, text_t *t) {
  size_t n = strlen(expr);
  char *src = malloc(n + 8);
  int status;
  assert_non_null(src);
  memcpy(src, "return ", 7);
  memcpy(src + 7, expr, n + 1);
  status = luaL_loadbuffer(L, src, n + 7, "=case");
  free(src);
  if (status != LUA_OK)
    fail_msg("case does not compile: %s: %s", expr, lua_tostring(L, -1));
  summarize(L, lua_pcall(L, 0, LUA_MULTRET, 0), 1, t);
}

static void hand_written_cases(void **state) {
  (void)state;
  pair_t p;
  size_t ncases = sizeof cases / sizeof cases[0];
  long errors = 0;
  pair_open(&p);
  for (size_t i = 0; i < ncases; i++) {
    run_expr(p.stock, cases[i], &p.a);
    run_expr(p.ours, cases[i], &p.b);
    errors += strncmp(p.a.p, "error: ", 7) == 0;
    pair_compare(&p, cases[i]);
  }
  OM_TEST_NOTE("lpattern_hand_cases %zu (%ld of them errors), %ld mismatched",
               ncases, errors, p.mismatched);
  OM_ASSERT_CMP(ncases, >=, 150);
  OM_ASSERT_CMP(errors, >=, 40);
  assert_int_equal(p.mismatched, 0);
  pair_close(&p);
}

/* The harness itself can fail: a call that differs is reported. */
static void harness_detects_a_difference(void **state) {
  (void)state;
  pair_t p;
  pair_open(&p);
  lua_close(p.ours);
  p.ours = new_state(1, 1000); /* too small for this case */
  p.quiet = 1;
  run_expr(p.stock, "(('ab'):rep(1000)):gsub('a', 'x')", &p.a);
  run_expr(p.ours, "(('ab'):rep(1000)):gsub('a', 'x')", &p.b);
  pair_compare(&p, "budget too small");
  assert_int_equal(p.mismatched, 1);
  assert_string_equal(p.b.p, "error: " OM_LPATTERN_BUDGET_MSG);
  /* and the functions really are replaced, methods included */
  lua_getglobal(p.stock, "string");
  lua_getfield(p.stock, -1, "find");
  lua_getglobal(p.ours, "string");
  lua_getfield(p.ours, -1, "find");
  assert_ptr_not_equal(lua_tocfunction(p.stock, -1),
                       lua_tocfunction(p.ours, -1));
  run_expr(p.ours, "(('ab'):rep(1000)):find('b$')", &p.b);
  assert_string_equal(p.b.p, "error: " OM_LPATTERN_BUDGET_MSG);
  pair_close(&p);
}

/* ---- random cases ---- */

typedef struct gen_s {
  om_rng_t rng;
  char buf[128];
  size_t len;
} gen_t;

static unsigned below(gen_t *g, unsigned n) {
  return om_rng_below(&g->rng, n);
}

static void put(gen_t *g, char c) {
  if (g->len < sizeof g->buf - 1)
    g->buf[g->len++] = c;
}

static void puts_(gen_t *g, const char *s) {
  while (*s)
    put(g, *s++);
}

static char pick(gen_t *g, const char *from) {
  return from[below(g, (unsigned)strlen(from))];
}

/* Subjects: a small alphabet, biased to a and b, with magic bytes, NUL and
 * a high byte so classes and escapes are exercised. */
static size_t gen_subject(gen_t *g, char *out) {
  static const char alpha[] = "aaaabbbc ()[]1.-%^$xA_\n";
  size_t n = below(g, 15);
  for (size_t i = 0; i < n; i++) {
    unsigned r = below(g, 40);
    out[i] = r == 0 ? '\0' : r == 1 ? (char)0xe9 : pick(g, alpha);
  }
  return n;
}

static void gen_literal(gen_t *g) {
  char c = pick(g, "aabbc1 x.()[]%-^$*+?");
  if (strchr(".()[]%-^$*+?", c) != NULL && below(g, 3) != 0)
    put(g, '%'); /* mostly escaped, sometimes raw magic */
  put(g, c);
}

static void gen_set(gen_t *g) {
  unsigned n = 1 + below(g, 4);
  put(g, '[');
  if (below(g, 3) == 0)
    put(g, '^');
  if (below(g, 8) == 0)
    put(g, ']');
  for (unsigned i = 0; i < n; i++) {
    switch (below(g, 6)) {
    case 0:
      put(g, pick(g, "ab"));
      put(g, '-');
      put(g, pick(g, "abc1"));
      break;
    case 1:
      put(g, '%');
      put(g, pick(g, "adswpluxcgADSWPL]%-^."));
      break;
    case 2:
      put(g, '-');
      break;
    default:
      put(g, pick(g, "abc1 ().^$%"));
      break;
    }
  }
  if (below(g, 40) != 0)
    put(g, ']'); /* sometimes unterminated */
}

static void gen_class(gen_t *g) {
  switch (below(g, 10)) {
  case 0:
  case 1:
  case 2:
    gen_literal(g);
    break;
  case 3:
    put(g, '.');
    break;
  case 4:
  case 5:
    put(g, '%');
    put(g, pick(g, "adswplucxgADSWPLUCXGz."));
    break;
  default:
    gen_set(g);
    break;
  }
}

static size_t gen_pattern(gen_t *g, char *out) {
  unsigned items = below(g, 7);
  int open = 0;
  g->len = 0;
  if (below(g, 4) == 0)
    put(g, '^');
  for (unsigned i = 0; i < items; i++) {
    unsigned r = below(g, 100);
    if (r < 55) {
      gen_class(g);
      if (below(g, 2))
        put(g, pick(g, "*+-?"));
    } else if (r < 67) {
      put(g, '(');
      open++;
    } else if (r < 75) {
      if (open > 0 || below(g, 10) == 0) {
        put(g, ')');
        open--;
      }
    } else if (r < 79) {
      puts_(g, "()");
    } else if (r < 84) {
      put(g, '%');
      put(g, 'b');
      puts_(g, below(g, 2) ? "()" : below(g, 2) ? "ab" : "aa");
    } else if (r < 89) {
      puts_(g, "%f");
      if (below(g, 30) != 0)
        gen_set(g);
      else
        put(g, 'a');
    } else if (r < 95) {
      put(g, '%');
      put(g, (char)('1' + below(g, 3)));
    } else if (r < 97) {
      put(g, '$');
    } else {
      puts_(g, below(g, 2) ? "%" : "%b");
      break; /* a malformed tail */
    }
  }
  while (open-- > 0 && below(g, 12) != 0)
    put(g, ')');
  if (below(g, 4) == 0)
    put(g, '$');
  memcpy(out, g->buf, g->len);
  return g->len;
}

typedef struct rcase_s {
  char s[32], p[128], tmpl[16];
  size_t ls, lp, lt;
  int init, has_init, plain, maxn, has_maxn;
} rcase_t;

/* Call a function of the string table (or a global helper) with the case. */
static void call_op(lua_State *L, const rcase_t *c, int op, text_t *t) {
  int nargs = 2;
  static const char *const names[] = {"find", "match", "G",
                                      "gsub", "gsub",  "gsub"};
  if (op == 2) {
    lua_getglobal(L, "G");
  } else {
    lua_getglobal(L, "string");
    lua_getfield(L, -1, names[op]);
    lua_remove(L, -2);
  }
  lua_pushlstring(L, c->s, c->ls);
  lua_pushlstring(L, c->p, c->lp);
  if (op >= 3) { /* gsub: template, table or function, then n */
    if (op == 3)
      lua_pushlstring(L, c->tmpl, c->lt);
    else
      lua_getglobal(L, op == 4 ? "T" : "F");
    nargs++;
    if (c->has_maxn) {
      lua_pushinteger(L, c->maxn);
      nargs++;
    }
  } else if (c->has_init || c->plain) {
    if (c->has_init)
      lua_pushinteger(L, c->init);
    else
      lua_pushnil(L);
    nargs++;
    if (op == 0 && c->plain) {
      lua_pushboolean(L, 1);
      nargs++;
    }
  }
  summarize(L, lua_pcall(L, nargs, LUA_MULTRET, 0), 1, t);
}

static void describe_case(const rcase_t *c, int op, text_t *t) {
  static const char *const names[] = {
      "find", "match", "gmatch", "gsub(str)", "gsub(table)", "gsub(function)"};
  char num[64];
  t->len = 0;
  text_str(t, names[op]);
  text_str(t, " subject \"");
  text_escaped(t, c->s, c->ls);
  text_str(t, "\" pattern \"");
  text_escaped(t, c->p, c->lp);
  text_str(t, "\"");
  snprintf(num, sizeof num, " init %d%s plain %d maxn %d%s", c->init,
           c->has_init ? "" : "(none)", c->plain, c->maxn,
           c->has_maxn ? "" : "(none)");
  text_str(t, num);
  if (op == 3) {
    text_str(t, " repl \"");
    text_escaped(t, c->tmpl, c->lt);
    text_str(t, "\"");
  }
}

static void random_cases(void **state) {
  (void)state;
  static const char *const templates[] = {
      "<%0>", "%1", "[%1|%2]", "x", "", "%%", "%3", "%", "%z", "%1%1%0",
  };
  pair_t p;
  gen_t g;
  text_t what = {0};
  long matched = 0, raised = 0;
  const char *env_n = getenv("OM_LPATTERN_CASES");
  const char *env_seed = getenv("OM_LPATTERN_SEED");
  long ncases = env_n ? atol(env_n) : RANDOM_CASES;
  pair_open(&p);
  om_rng_seed(&g.rng, env_seed ? strtoull(env_seed, NULL, 0) : 0x5eed1a7e);
  for (long i = 0; i < ncases; i++) {
    rcase_t c;
    memset(&c, 0, sizeof c);
    c.ls = gen_subject(&g, c.s);
    c.lp = gen_pattern(&g, c.p);
    c.has_init = below(&g, 5) < 2;
    c.init = (int)below(&g, 33) - 16;
    c.plain = below(&g, 10) == 0;
    c.has_maxn = below(&g, 4) == 0;
    c.maxn = (int)below(&g, 6) - 1;
    {
      const char *tm = templates[below(&g, 10)];
      c.lt = strlen(tm);
      memcpy(c.tmpl, tm, c.lt);
    }
    for (int op = 0; op < 6; op++) {
      call_op(p.stock, &c, op, &p.a);
      call_op(p.ours, &c, op, &p.b);
      if (op == 1) {
        raised += strncmp(p.a.p, "error: ", 7) == 0;
        matched += strcmp(p.a.p, "nil") != 0 && strncmp(p.a.p, "error", 5);
      }
      if (strcmp(p.a.p, p.b.p) != 0) {
        describe_case(&c, op, &what);
        pair_compare(&p, what.p);
      } else {
        p.compared++;
      }
    }
  }
  OM_TEST_NOTE("lpattern_random_pairs %ld, comparisons %ld, mismatched %ld, "
               "match() found %ld, raised %ld",
               ncases, p.compared, p.mismatched, matched, raised);
  assert_int_equal(p.mismatched, 0);
  OM_ASSERT_CMP(ncases, >=, RANDOM_CASES);
  OM_ASSERT_CMP(p.compared, ==, 6L * ncases);
  /* the generator must reach both outcomes, or the test proves little */
  OM_ASSERT_CMP(matched, >, ncases / 5);
  OM_ASSERT_CMP(raised, >, ncases / 100);
  free(what.p);
  pair_close(&p);
}

/* ---- blow-ups end quickly in "pattern too complex" ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void expect_complex(lua_State *L, const char *expr, const char *want,
                           double max_s) {
  text_t t = {0};
  double t0 = now_s(), took;
  run_expr(L, expr, &t);
  took = now_s() - t0;
  if (strstr(t.p, want) == NULL || strncmp(t.p, "error: ", 7) != 0)
    fail_msg("%s\n  got: %s\n  want an error containing: %s", expr, t.p, want);
  if (took > max_s)
    fail_msg("%s took %.2f s (limit %.2f s)", expr, took, max_s);
  free(t.p);
}

static void blow_ups_end_in_budget_error(void **state) {
  (void)state;
  static const char *const bombs[] = {
      "(('a'):rep(40)):find(('a*'):rep(30) .. 'b')",
      "(('a'):rep(40)):match(('a*'):rep(30) .. 'b')",
      "(('a'):rep(1000)):find('.-.-.-.-.-.-.-.-x')",
      "(('a'):rep(1000)):match('(.-)(.-)(.-)(.-)%1%2%3%4x')",
      "G(('a'):rep(40), ('a*'):rep(30) .. 'b')",
      "(('a'):rep(40)):gsub(('a*'):rep(30) .. 'b', '')",
      "(('a'):rep(40)):gsub(('a-'):rep(30) .. 'b', F)",
      /* nested: each inner gsub is its own call and blows up alone */
      "('ab'):gsub('.', function() return (('a'):rep(40)):gsub(('a*'):rep(30) "
      ".. 'b', '') end)",
      "(('a'):rep(100000)):find(('a'):rep(50000) .. 'b$')",
  };
  lua_State *L = new_state(1, 1000000);
  for (size_t i = 0; i < sizeof bombs / sizeof bombs[0]; i++)
    expect_complex(L, bombs[i], OM_LPATTERN_BUDGET_MSG, 3.0);
  /* a plain find stays linear where memchr + memcmp would be quadratic */
  {
    text_t t = {0};
    double t0 = now_s();
    run_expr(L, "(('a'):rep(1000000)):find(('a'):rep(500000) .. 'b', 1, true)",
             &t);
    assert_string_equal(t.p, "nil");
    if (now_s() - t0 > 1.0)
      fail_msg("plain find took %.2f s", now_s() - t0);
    free(t.p);
  }
  /* the default budget too, once */
  lua_close(L);
  L = new_state(1, 0);
  expect_complex(L, bombs[0], OM_LPATTERN_BUDGET_MSG, 5.0);
  /* nesting is bounded like stock */
  expect_complex(L, "('a'):rep(300):find(('a?'):rep(300))",
                 "pattern too complex", 1.0);
  /* the state is fine afterwards */
  {
    text_t t = {0};
    run_expr(L, "('k=v'):match('(%w+)=(%w+)')", &t);
    assert_string_equal(t.p, "\"k\", \"v\"");
    free(t.p);
  }
  lua_close(L);
}

/* The budget is per top-level call: per gmatch step, per whole gsub. */
static void budget_is_per_call(void **state) {
  (void)state;
  lua_State *L = new_state(1, 20000);
  text_t t = {0};
  run_expr(L,
           "(function() local n = 0 for k, v in "
           "(('ab=cd '):rep(20000)):gmatch('(%w+)=(%w+)') do n = n + 1 "
           "end return n end)()",
           &t);
  assert_string_equal(t.p, "20000");
  run_expr(L, "(('ab=cd '):rep(20000)):gsub('(%w+)=(%w+)', '%2=%1')", &t);
  assert_string_equal(t.p, "error: " OM_LPATTERN_BUDGET_MSG);
  /* reinstalling changes the budget */
  lua_getglobal(L, "string");
  om_lpattern_install(L, -1, 10000000);
  lua_pop(L, 1);
  run_expr(L,
           "select(2, (('ab=cd '):rep(20000)):gsub('(%w+)=(%w+)', "
           "'%2=%1'))",
           &t);
  assert_string_equal(t.p, "20000");
  assert_int_equal(lua_gettop(L), 0);
  free(t.p);
  lua_close(L);
}

/* Steps reach the state's count hook as instructions. */
static long hook_calls;
static long hook_raise_after;

static void counting_hook(lua_State *L, lua_Debug *ar) {
  assert_int_equal(ar->event, LUA_HOOKCOUNT);
  if (++hook_calls == hook_raise_after)
    luaL_error(L, "host budget: instruction limit exceeded");
}

static void steps_reach_the_count_hook(void **state) {
  (void)state;
  lua_State *L = new_state(1, 5000000);
  text_t t = {0};
  hook_calls = 0;
  hook_raise_after = -1;
  lua_sethook(L, counting_hook, LUA_MASKCOUNT, 1000);
  run_expr(L, "(('a'):rep(40)):find(('a*'):rep(30) .. 'b')", &t);
  assert_string_equal(t.p, "error: " OM_LPATTERN_BUDGET_MSG);
  /* 5M steps at one hook call per 1000 */
  if (hook_calls < 4900 || hook_calls > 5100)
    fail_msg("hook called %ld times, want about 5000", hook_calls);
  /* a host hook that raises stops the match from inside C */
  hook_calls = 0;
  hook_raise_after = 50;
  run_expr(L, "(('a'):rep(40)):find(('a*'):rep(30) .. 'b')", &t);
  assert_string_equal(t.p, "error: host budget: instruction limit exceeded");
  assert_int_equal(hook_calls, 50);
  lua_sethook(L, NULL, 0, 0);
  run_expr(L, "('x=1'):gsub('%d', '2')", &t);
  assert_string_equal(t.p, "\"x=2\", 1");
  free(t.p);
  lua_close(L);
}

/* A failed install (out of memory) leaves the string table as it was. */
static int install_in(lua_State *L) {
  lua_getglobal(L, "string");
  om_lpattern_install(L, -1, 0);
  return 0;
}

/* Lua's own allocator lives in liblua, out of reach of the malloc wrap:
 * allocate from here so fault injection sees the state's allocations. */
static void *wrapped_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud;
  (void)osize;
  if (nsize == 0) {
    free(ptr);
    return NULL;
  }
  return realloc(ptr, nsize);
}

static void install_survives_allocation_failures(void **state) {
  (void)state;
  for (long n = 0;; n++) {
    lua_State *L = lua_newstate(wrapped_alloc, NULL);
    assert_non_null(L);
    luaL_openlibs(L);
    lua_CFunction stock, now;
    int rc;
    lua_getglobal(L, "string");
    lua_getfield(L, -1, "gsub");
    stock = lua_tocfunction(L, -1);
    lua_pop(L, 2);
    lua_pushcfunction(L, install_in);
    om_test_fail_alloc_after(n);
    rc = lua_pcall(L, 0, 0, 0);
    om_test_alloc_reset();
    lua_settop(L, 0);
    lua_getglobal(L, "string");
    lua_getfield(L, -1, "gsub");
    now = lua_tocfunction(L, -1);
    lua_pop(L, 2);
    if (rc == LUA_OK) {
      assert_ptr_not_equal(now, stock);
      OM_ASSERT_CMP(n, >, 0);
      lua_close(L);
      break;
    }
    assert_int_equal(rc, LUA_ERRMEM);
    assert_ptr_equal(now, stock);
    lua_close(L);
  }
}

/* ---- the compile-check and the literal prefix ---- */

/*
 * om_lpattern_check against stock string.find on random patterns and
 * subjects: whenever stock raises a grammar error, the check flagged the
 * pattern with that message; a pattern the check accepts never raises one
 * (the depth limit aside, which depends on the subject). And every match of
 * an accepted pattern starts with its literal prefix.
 */
static void check_agrees_with_the_matcher(void **state) {
  (void)state;
  lua_State *L = luaL_newstate();
  gen_t g;
  long flagged = 0, raised = 0, prefixed = 0;
  luaL_openlibs(L);
  om_rng_seed(&g.rng, 0xc4ec4);
  for (long i = 0; i < 20000; i++) {
    char p[129], s[32], err[256] = "", pre[129];
    size_t lp = gen_pattern(&g, p), lpre;
    int bad;
    p[lp] = '\0'; /* as in a Lua string */
    bad = om_lpattern_check(p, lp, err, sizeof err) != 0;
    lpre = om_lpattern_literal_prefix(p, lp, pre);
    flagged += bad;
    for (int k = 0; k < 8; k++) {
      size_t ls = gen_subject(&g, s);
      lua_getglobal(L, "string");
      lua_getfield(L, -1, "find");
      lua_remove(L, -2);
      lua_pushlstring(L, s, ls);
      lua_pushlstring(L, p, lp);
      if (lua_pcall(L, 2, 2, 0) != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        if (strstr(msg, "pattern too complex") == NULL) {
          if (!bad || strstr(msg, err) == NULL)
            fail_msg("pattern '%s': stock raised '%s', the check said '%s'", p,
                     msg, bad ? err : "fine");
          raised++;
        }
        lua_pop(L, 1);
        continue;
      }
      if (!bad && lua_isinteger(L, -2)) {
        size_t at = (size_t)lua_tointeger(L, -2) - 1;
        if (ls - at < lpre || memcmp(s + at, pre, lpre) != 0)
          fail_msg("pattern '%s' matched at %zu without its prefix '%.*s'", p,
                   at + 1, (int)lpre, pre);
        prefixed += lpre > 0;
      }
      lua_pop(L, 2);
    }
  }
  /* the generator must reach every outcome, or the test proves little */
  OM_ASSERT_CMP(flagged, >, 200);
  OM_ASSERT_CMP(raised, >, 200);
  OM_ASSERT_CMP(prefixed, >, 200);
  lua_close(L);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hand_written_cases),
      cmocka_unit_test(harness_detects_a_difference),
      cmocka_unit_test(random_cases),
      cmocka_unit_test(blow_ups_end_in_budget_error),
      cmocka_unit_test(budget_is_per_call),
      cmocka_unit_test(steps_reach_the_count_hook),
      cmocka_unit_test(install_survives_allocation_failures),
      cmocka_unit_test(check_agrees_with_the_matcher),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
