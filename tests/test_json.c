/*
 * test_json.c: the validating JSON scanner (core/om_json.h).
 *
 * A table of documents with the verdict each must get (and, for some,
 * where), every one of them also put to jansson so the table itself is
 * checked; the limits (depth, open names, number length) at and past
 * their edge; the events of a small document; the readers (om_json_at,
 * om_json_string, om_json_int); a callback that stops the scan.
 *
 * Then the differential run against jansson 2.14 with
 * JSON_REJECT_DUPLICATES, the parser the scanner stands in for: seeded
 * generated documents (objects, arrays, strings with escapes and UTF-8
 * of every length, numbers up to and past the int64 and double limits,
 * literals), a share of them mutated (bytes flipped, inserted, deleted,
 * invalid UTF-8 put in, cut short; a member name repeated). What must
 * hold, per document:
 *  - OK from the scanner: jansson accepts it; INVALID: jansson refuses it;
 *    UNSURE: either, but fewer than 5% of all, or the fast path is not
 *    one;
 *  - when both accept, every event names a value jansson has at that
 *    path, of that type: strings decode (om_json_string) to jansson's
 *    bytes, also cut short, integers (om_json_int) to its integer, reals
 *    to its double, and each container ends with as many members as
 *    jansson counted.
 *
 * OM_FUZZ_SEED and OM_FUZZ_COUNT set the seed and the number of
 * documents (default: a seed from the clock, printed, and 20000).
 */
#include "om_test.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "om_json.h"
#include "om_rng.h"

/* ------------------------------------------------------------------ */
/* helpers */

static int jansson_accepts(const char *s, size_t n) {
  json_error_t err;
  json_t *j = json_loadb(s, n, JSON_REJECT_DUPLICATES, &err);
  json_decref(j);
  return j != NULL;
}

static const char *res_name(om_json_result_t r) {
  switch (r) {
  case OM_JSON_OK:
    return "OK";
  case OM_JSON_INVALID:
    return "INVALID";
  case OM_JSON_UNSURE:
    return "UNSURE";
  case OM_JSON_STOPPED:
    return "STOPPED";
  }
  return "?";
}

/* The document as a C string literal would spell it, on stderr. */
static void show(const char *s, size_t n) {
  size_t lim = n < 4000 ? n : 4000;
  fprintf(stderr, "document (%zu bytes): \"", n);
  for (size_t i = 0; i < lim; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      fprintf(stderr, "\\%c", c);
    else if (c >= 0x20 && c < 0x7F)
      fputc(c, stderr);
    else
      fprintf(stderr, "\\x%02x", c);
  }
  fprintf(stderr, "\"%s\n", lim < n ? "..." : "");
}

/* ------------------------------------------------------------------ */
/* the table */

typedef struct {
  const char *doc;
  size_t len;
  om_json_result_t want;
  long at; /* expected *where, or -1: not checked */
} case_t;

#define OK_(s)                                                                 \
  { s, sizeof(s) - 1, OM_JSON_OK, -1 }
#define BAD(s, at)                                                             \
  { s, sizeof(s) - 1, OM_JSON_INVALID, at }
#define UNS(s, at)                                                             \
  { s, sizeof(s) - 1, OM_JSON_UNSURE, at }

static const case_t CASES[] = {
    /* structure and whitespace */
    OK_("{}"),
    OK_("[]"),
    OK_(" \t\r\n[ \t\r\n] \t\r\n"),
    OK_("{\"a\":1}"),
    OK_("{ \"a\" : [ 1 , 2 ] , \"b\" : { } }"),
    OK_("[[],[[]],{},{\"\":{}}]"),
    OK_("[true,false,null]"),
    BAD("", 0),
    BAD("   ", 3),
    BAD("1", 0),
    BAD("\"a\"", 0),
    BAD("true", 0),
    BAD("null", 0),
    BAD("[1] x", 4),
    BAD("[1]]", 3),
    BAD("{}{}", 2),
    BAD("[1]\0", 3),
    BAD("[1,]", 3),
    BAD("[,1]", 1),
    BAD("[1 2]", 3),
    BAD("[1,,2]", 3),
    BAD("{\"a\":1,}", 7),
    BAD("{,}", 1),
    BAD("{\"a\"}", 4),
    BAD("{\"a\" 1}", 5),
    BAD("{\"a\"::1}", 5),
    BAD("{1:1}", 1),
    BAD("{a:1}", 1),
    BAD("{'a':1}", 1),
    BAD("{\"a\":1 \"b\":2}", 7),
    BAD("[1}", 2),
    BAD("{\"a\":1]", 6),
    BAD("[", 1),
    BAD("{", 1),
    BAD("[1", 2),
    BAD("{\"a\":", 5),
    BAD("{\"a\"", 4),
    BAD("[\f1]", 1),
    BAD("[\v1]", 1),
    BAD("[\xc2\xa0 1]", 1),
    BAD("\xef\xbb\xbf[]", 0),
    BAD("[\xc3\xa9]", 1),
    BAD("[1]\xff", 3),
    BAD("[\0]", 1),
    /* strings */
    OK_("[\"\"]"),
    OK_("[\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"]"),
    OK_("[\"\\u00e9\\u00C9\\uABCD\\uabcd\\u0001\\uFFFF\"]"),
    OK_("[\"\\ud83d\\ude00\\uD800\\uDC00\\uDBFF\\uDFFF\"]"),
    OK_("[\"\\ud7ff\\ue000\"]"),
    OK_("[\"\xc2\x80 \xdf\xbf \xe0\xa0\x80 \xed\x9f\xbf \xee\x80\x80 "
        "\xef\xbf\xbf \xf0\x90\x80\x80 \xf4\x8f\xbf\xbf \x7f\"]"),
    OK_("[\"a long run of plain bytes, longer than one word or two\"]"),
    BAD("[\"abc", 5),
    BAD("[\"abc\\\"]", 8),
    BAD("[\"\x01\"]", 2),
    BAD("[\"0123456789\x1f\"]", 12),
    BAD("[\"\n\"]", 2),
    BAD("[\"\t\"]", 2),
    BAD("[\"a\0\"]", 3),
    BAD("[\"\x80\"]", 2),
    BAD("[\"abcdefgh\xbf\"]", 10),
    BAD("[\"\xc0\x80\"]", 2),
    BAD("[\"\xc1\xbf\"]", 2),
    BAD("[\"\xe0\x80\xaf\"]", 2),
    BAD("[\"\xe0\x9f\xbf\"]", 2),
    BAD("[\"\xf0\x8f\xbf\xbf\"]", 2),
    BAD("[\"\xed\xa0\x80\"]", 2),
    BAD("[\"\xed\xbf\xbf\"]", 2),
    BAD("[\"\xf4\x90\x80\x80\"]", 2),
    BAD("[\"\xf5\x80\x80\x80\"]", 2),
    BAD("[\"\xf8\x88\x80\x80\x80\"]", 2),
    BAD("[\"\xfe\"]", 2),
    BAD("[\"\xff\"]", 2),
    BAD("[\"\xc3\"]", 2),
    BAD("[\"\xe2\x82\"]", 2),
    BAD("[\"\xf0\x9f\x98\"]", 2),
    BAD("[\"\xc3\x28\"]", 2),
    BAD("[\"\xe2\x28\xa1\"]", 2),
    BAD("[\"\xc3\xa9\xc3\"]", 4),
    BAD("[\"\xe2\x82", 2),
    BAD("[\"\\x\"]", 2),
    BAD("[\"\\'\"]", 2),
    BAD("[\"\\a\"]", 2),
    BAD("[\"\\U0041\"]", 2),
    BAD("[\"\\u004\"]", 2),
    BAD("[\"\\u004g\"]", 2),
    BAD("[\"\\u12", 2),
    BAD("[\"\\", 2),
    BAD("[\"\\u0000\"]", 2),
    BAD("[\"ab\\ud800\"]", 4),
    BAD("[\"\\ud800x\"]", 2),
    BAD("[\"\\ud800\\n\"]", 2),
    BAD("[\"\\ud800\\u0041\"]", 2),
    BAD("[\"\\ud800\\ud800\"]", 2),
    BAD("[\"\\ud800\\ud800\\udc00\"]", 2),
    BAD("[\"\\udc00\"]", 2),
    BAD("[\"\\udfff\\udc00\"]", 2),
    BAD("[\"\\ud800\\udc0", 2),
    UNS("{\"a\\u0000\":1}", 3), /* jansson refuses: a NUL in a name */
    /* numbers */
    OK_("[0,-0,1,-1,10,123456789]"),
    OK_("[0.0,-0.0,1.5,-1.25,123.456]"),
    OK_("[1e5,1E5,1e+5,1e-5,1E-0,0e0,-0e-0,1.5e10,2.5E+300]"),
    OK_("[9223372036854775807,-9223372036854775808]"),
    OK_("[1e308,1.7976931348623157e308,1.7976931348623158e308]"),
    OK_("[-1.7976931348623157e308,0.17976931348623157e309]"),
    OK_("[17976931348623157e292,1e-400,4.9e-324,2.4e-324,0e999999999999]"),
    OK_("[0.0000000000000000000000000000000000001e345]"),
    BAD("[-]", 2),
    BAD("[-a]", 2),
    BAD("[- 1]", 2),
    BAD("[1.]", 3),
    BAD("[1.e5]", 3),
    BAD("[.5]", 1),
    BAD("[01]", 2),
    BAD("[-01]", 3),
    BAD("[00]", 2),
    BAD("[1e]", 3),
    BAD("[1e+]", 4),
    BAD("[1E-]", 4),
    BAD("[+1]", 1),
    BAD("[0x1]", 2),
    BAD("[1.5.5]", 4),
    BAD("[1e5e5]", 4),
    BAD("[1_000]", 2),
    BAD("[1", 2),
    BAD("[-", 2),
    BAD("[1.", 3),
    BAD("[9223372036854775808]", 1),
    BAD("[-9223372036854775809]", 1),
    BAD("[10000000000000000000]", 1),
    BAD("[99999999999999999999]", 1),
    BAD("[1e309]", 1),
    BAD("[-1e309]", 1),
    BAD("[1.7976931348623159e308]", 1),
    BAD("[10e308]", 1),
    BAD("[0.18e310]", 1),
    BAD("[1e99999999999999999999]", 1),
    BAD("[Infinity]", 1),
    BAD("[-Infinity]", 2),
    BAD("[NaN]", 1),
    /* literals */
    BAD("[tru]", 4),
    BAD("[truex]", 5),
    BAD("[True]", 1),
    BAD("[nul]", 4),
    BAD("[nulll]", 5),
    BAD("[falsee]", 6),
    BAD("[f]", 2),
    BAD("[t", 2),
    BAD("[true1]", 5),
    /* duplicate names */
    OK_("{\"a\":{\"a\":1},\"b\":{\"a\":2}}"),
    OK_("[{\"a\":1},{\"a\":1}]"),
    OK_("{\"x\":{\"a\":1},\"a\":2}"),
    OK_("{\"a\":1,\"A\":2,\"a \":3,\"\":4,\"ab\":5}"),
    BAD("{\"a\":1,\"a\":2}", 7),
    BAD("{\"\":1,\"\":2}", 6),
    BAD("{\"a\":1,\"b\":{\"x\":1},\"a\":3}", 19),
    BAD("[{\"k\":1,\"k\":1}]", 8),
    BAD("{\"\xc3\xa9\":1,\"\xc3\xa9\":2}", 8),
    BAD("{\"a long member name\":1,\"a long member name\":2}", 24),
    /* what the scanner leaves to jansson */
    UNS("{\"\\u0061\":1}", 2),
    UNS("{\"a\\n\":1}", 3),
    UNS("{\"a\":1,\"\\u0061\":2}", 8),
    /* jansson skips one NUL right after a number or literal (it puts the
     * byte that ended the token back, and a NUL put back reads as none) */
    UNS("[1\0]", 2),
    UNS("[0\0,2]", 2),
    UNS("[-1.5e3\0 ]", 7),
    UNS("[true\0]", 5),
    UNS("{\"a\":null\0}", 9),
    BAD("[\"a\"\0]", 4),
    BAD("[[]\0]", 3),
    BAD("[{}\0]", 3),
};

static void table(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
    const case_t *c = &CASES[i];
    size_t where = (size_t)-1;
    om_json_result_t r = om_json_scan(c->doc, c->len, NULL, NULL, &where);
    int j = jansson_accepts(c->doc, c->len);
    if (r != c->want || (c->at >= 0 && where != (size_t)c->at)) {
      show(c->doc, c->len);
      fail_msg("case %zu: %s at %zu, want %s at %ld", i, res_name(r), where,
               res_name(c->want), c->at);
    }
    /* the table is right about jansson too */
    if (c->want != OM_JSON_UNSURE && j != (c->want == OM_JSON_OK)) {
      show(c->doc, c->len);
      fail_msg("case %zu: jansson %s it", i, j ? "accepts" : "refuses");
    }
    OM_ASSERT_CMP(where, <=, c->len);
  }
  /* no input at all */
  {
    size_t where = 7;
    OM_ASSERT_CMP(om_json_scan(NULL, 0, NULL, NULL, &where), ==,
                  OM_JSON_INVALID);
    OM_ASSERT_CMP(where, ==, 0);
    OM_ASSERT_CMP(om_json_scan("[]", 2, NULL, NULL, NULL), ==, OM_JSON_OK);
  }
}

/* ------------------------------------------------------------------ */
/* the limits */

typedef struct {
  char *b;
  size_t n, cap;
} sbuf_t;

static void sb_put(sbuf_t *s, const char *fmt, ...) {
  va_list ap;
  int k;
  for (;;) {
    size_t room = s->cap - s->n;
    va_start(ap, fmt);
    k = vsnprintf(s->b + s->n, room, fmt, ap);
    va_end(ap);
    assert_true(k >= 0);
    if ((size_t)k < room)
      break;
    s->cap = s->cap * 2 + (size_t)k;
    s->b = realloc(s->b, s->cap);
    assert_non_null(s->b);
  }
  s->n += (size_t)k;
}

static void sb_init(sbuf_t *s) {
  s->cap = 256;
  s->n = 0;
  s->b = malloc(s->cap);
  assert_non_null(s->b);
  s->b[0] = 0;
}

static om_json_result_t scan_sb(const sbuf_t *s, size_t *where) {
  om_json_result_t r = om_json_scan(s->b, s->n, NULL, NULL, where);
  if (r != OM_JSON_UNSURE && jansson_accepts(s->b, s->n) != (r == OM_JSON_OK))
    fail_msg("jansson disagrees with %s", res_name(r));
  return r;
}

/* `levels` containers, each an array or (odd levels) an object. */
static void nest(sbuf_t *s, int levels) {
  for (int i = 0; i < levels; i++)
    sb_put(s, i % 2 ? "{\"k\":" : "[");
  sb_put(s, "0");
  for (int i = levels - 1; i >= 0; i--)
    sb_put(s, i % 2 ? "}" : "]");
}

/* An object with names nm0..nm<k-1>, then `tail` (a member or empty). */
static void wide(sbuf_t *s, int k, const char *tail) {
  sb_put(s, "{");
  for (int i = 0; i < k; i++)
    sb_put(s, "%s\"nm%d\":%d", i ? "," : "", i, i);
  sb_put(s, "%s}", tail);
}

static void limits(void **state) {
  sbuf_t s;
  size_t where;
  (void)state;

  /* depth: containers at depth 0..OM_JSON_MAX_DEPTH */
  sb_init(&s);
  nest(&s, OM_JSON_MAX_DEPTH + 1);
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_OK);
  s.n = 0;
  nest(&s, OM_JSON_MAX_DEPTH + 2);
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_UNSURE);
  /* the container at depth 65: after 33 "[" and 32 "{\"k\":" */
  OM_ASSERT_CMP(where, ==, 33 + 32 * 5);
  s.n = 0;
  nest(&s, 300); /* far deeper: still unsure, not refused */
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_UNSURE);

  /* open names: OM_JSON_MAX_KEYS in one object, or across nesting */
  s.n = 0;
  wide(&s, OM_JSON_MAX_KEYS, "");
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_OK);
  s.n = 0;
  wide(&s, OM_JSON_MAX_KEYS, ",\"last\":1");
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_UNSURE);
  OM_ASSERT_CMP(where, ==, s.n - 9); /* at ,"last":1} */
  /* a duplicate is found even when the stack is full */
  s.n = 0;
  wide(&s, OM_JSON_MAX_KEYS, ",\"nm7\":1");
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_INVALID);
  OM_ASSERT_CMP(where, ==, s.n - 8); /* at ,"nm7":1} */
  /* 301 names open around an object with 211 more: 512; one more: 513 */
  for (int extra = 0; extra < 2; extra++) {
    s.n = 0;
    sb_put(&s, "{");
    for (int i = 0; i < 300; i++)
      sb_put(&s, "\"o%d\":[],", i);
    sb_put(&s, "\"in\":");
    wide(&s, 211 + extra, "");
    sb_put(&s, "}");
    OM_ASSERT_CMP(scan_sb(&s, &where), ==, extra ? OM_JSON_UNSURE : OM_JSON_OK);
  }
  /* names close with their object: many wide objects in a row */
  s.n = 0;
  sb_put(&s, "[");
  for (int i = 0; i < 6; i++) {
    sb_put(&s, i ? "," : "");
    wide(&s, 400, "");
  }
  sb_put(&s, "]");
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_OK);
  /* every name of a full table is found again (probing past others) */
  for (int d = 0; d < OM_JSON_MAX_KEYS - 1; d += 29) {
    char tail[32];
    snprintf(tail, sizeof tail, ",\"nm%d\":0", d);
    s.n = 0;
    wide(&s, OM_JSON_MAX_KEYS - 1, tail);
    OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_INVALID);
  }

  /* numbers: 64 bytes decided, 65 left to jansson */
  s.n = 0;
  sb_put(&s, "[1.");
  for (int i = 0; i < 62; i++)
    sb_put(&s, "0");
  sb_put(&s, "]");
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_OK);
  s.n = 0;
  sb_put(&s, "[1.");
  for (int i = 0; i < 63; i++)
    sb_put(&s, "0");
  sb_put(&s, "]");
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_UNSURE);
  OM_ASSERT_CMP(where, ==, 1);
  s.n = 0;
  sb_put(&s, "[-");
  for (int i = 0; i < 64; i++)
    sb_put(&s, "9");
  sb_put(&s, "]");
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_UNSURE);
  /* 64 bytes in the decade where strtod decides: the first 60 digits of
   * DBL_MAX + half an ulp, 2^1024 - 2^970, round down to DBL_MAX; one
   * more in the last digit rounds up to infinity */
  s.n = 0;
  sb_put(&s, "[179769313486231580793728971405303415079934132710037826936173"
             "e249]");
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_OK);
  s.n = 0;
  sb_put(&s, "[179769313486231580793728971405303415079934132710037826936174"
             "e249]");
  OM_ASSERT_CMP(scan_sb(&s, &where), ==, OM_JSON_INVALID);
  OM_ASSERT_CMP(where, ==, 1);
  free(s.b);
}

/* ------------------------------------------------------------------ */
/* events */

typedef struct {
  om_json_type_t type;
  size_t off, len, depth;
  char path[64]; /* "a/2/b": names and indexes */
} rec_t;

typedef struct {
  const char *doc;
  rec_t ev[64];
  size_t n;
  size_t stop_at; /* stop on this event (1-based), 0: never */
  int null_at_a2b;
} recorder_t;

static int record(void *ud, const om_json_ev_t *ev) {
  recorder_t *r = ud;
  rec_t *x = &r->ev[r->n];
  size_t o = 0;
  static const char *const a2b_keys[] = {"a", NULL, "b"};
  static const size_t a2b_idx[] = {0, 2, 0};
  assert_true(r->n < 64);
  x->type = ev->type;
  x->off = (size_t)(ev->text - r->doc);
  x->len = ev->len;
  x->depth = ev->depth;
  x->path[0] = 0;
  for (size_t i = 0; i < ev->depth; i++) {
    const om_json_seg_t *g = &ev->path[i];
    int k = g->key != NULL ? snprintf(x->path + o, sizeof x->path - o, "%s%.*s",
                                      i ? "/" : "", (int)g->key_len, g->key)
                           : snprintf(x->path + o, sizeof x->path - o, "%s%zu",
                                      i ? "/" : "", g->index);
    o += (size_t)k;
  }
  if (ev->type == OM_JSON_NULL && om_json_at(ev, 3, a2b_keys, a2b_idx))
    r->null_at_a2b = 1;
  r->n++;
  return r->stop_at != 0 && r->n == r->stop_at;
}

static void events(void **state) {
  const char *doc = "{\"a\":[1,\"x\\n\",{\"b\":null}], \"c\" :true}";
  static const rec_t want[] = {
      {OM_JSON_OBJECT, 0, 1, 0, ""},     {OM_JSON_ARRAY, 5, 1, 1, "a"},
      {OM_JSON_NUMBER, 6, 1, 2, "a/0"},  {OM_JSON_STRING, 8, 5, 2, "a/1"},
      {OM_JSON_OBJECT, 14, 1, 2, "a/2"}, {OM_JSON_NULL, 19, 4, 3, "a/2/b"},
      {OM_JSON_END, 23, 1, 2, "a/2"},    {OM_JSON_END, 24, 1, 1, "a"},
      {OM_JSON_TRUE, 32, 4, 1, "c"},     {OM_JSON_END, 36, 1, 0, ""},
  };
  size_t nwant = sizeof want / sizeof want[0], where;
  recorder_t r;
  (void)state;
  memset(&r, 0, sizeof r);
  r.doc = doc;
  OM_ASSERT_CMP(om_json_scan(doc, strlen(doc), record, &r, &where), ==,
                OM_JSON_OK);
  OM_ASSERT_CMP(where, ==, strlen(doc));
  OM_ASSERT_CMP(r.n, ==, nwant);
  for (size_t i = 0; i < nwant; i++) {
    const rec_t *g = &r.ev[i], *w = &want[i];
    if (g->type != w->type || g->off != w->off || g->len != w->len ||
        g->depth != w->depth || strcmp(g->path, w->path) != 0)
      fail_msg("event %zu: type %d at %zu len %zu depth %zu path \"%s\"; "
               "want type %d at %zu len %zu depth %zu path \"%s\"",
               i, (int)g->type, g->off, g->len, g->depth, g->path, (int)w->type,
               w->off, w->len, w->depth, w->path);
  }
  assert_int_equal(r.null_at_a2b, 1);

  /* stopping: on a value, and on an end; nothing after */
  for (size_t stop = 1; stop <= nwant; stop++) {
    memset(&r, 0, sizeof r);
    r.doc = doc;
    r.stop_at = stop;
    OM_ASSERT_CMP(om_json_scan(doc, strlen(doc), record, &r, &where), ==,
                  OM_JSON_STOPPED);
    OM_ASSERT_CMP(r.n, ==, stop);
    OM_ASSERT_CMP(where, ==, want[stop - 1].off);
  }

  /* events come as the scan meets values: a later fault still refuses */
  memset(&r, 0, sizeof r);
  r.doc = "[1,2,x]";
  OM_ASSERT_CMP(om_json_scan(r.doc, 7, record, &r, &where), ==,
                OM_JSON_INVALID);
  OM_ASSERT_CMP(where, ==, 5);
  OM_ASSERT_CMP(r.n, ==, 3);
}

static void at(void **state) {
  om_json_seg_t path[3] = {{"ab", 2, 0}, {NULL, 0, 4}, {"c", 1, 1}};
  om_json_ev_t ev = {OM_JSON_STRING, "\"v\"", 3, 3, path};
  const char *const keys[] = {"ab", NULL, "c"};
  const char *const other[] = {"a", NULL, "c"};
  const char *const prefix[] = {"abc", NULL, "c"};
  const char *const named[] = {"ab", "4", "c"};
  size_t idx[] = {0, 4, 0}, idx5[] = {0, 5, 0};
  (void)state;
  assert_int_equal(om_json_at(&ev, 3, keys, idx), 1);
  assert_int_equal(om_json_at(&ev, 2, keys, idx), 0);
  assert_int_equal(om_json_at(&ev, 3, keys, idx5), 0);
  assert_int_equal(om_json_at(&ev, 3, keys, NULL), 0);
  assert_int_equal(om_json_at(&ev, 3, other, idx), 0);
  assert_int_equal(om_json_at(&ev, 3, prefix, idx), 0);
  assert_int_equal(om_json_at(&ev, 3, named, idx), 0);
  ev.depth = 0;
  assert_int_equal(om_json_at(&ev, 0, NULL, NULL), 1);
  assert_int_equal(om_json_at(NULL, 0, NULL, NULL), 0);
}

/* ------------------------------------------------------------------ */
/* the readers */

static void decode_is(const char *text, const char *want, size_t want_len) {
  char out[64];
  size_t k = om_json_string(text, strlen(text), out, sizeof out);
  if (k != want_len || memcmp(out, want, want_len) != 0)
    fail_msg("%s: decoded %zu bytes \"%.*s\", want %zu", text, k, (int)k, out,
             want_len);
}

static void string(void **state) {
  char out[16];
  size_t k;
  (void)state;
  decode_is("\"\"", "", 0);
  decode_is("\"abc\"", "abc", 3);
  decode_is("\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"", "a\"b\\c/d\b\f\n\r\t", 12);
  decode_is("\"\\u0041\\u00e9\\u00C9\\u20AC\\uffff\"",
            "A\xc3\xa9\xc3\x89\xe2\x82\xac\xef\xbf\xbf", 11);
  decode_is("\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80", 4);
  decode_is("\"x\\uD800\\uDC00\\uDBFF\\uDFFFy\"",
            "x\xf0\x90\x80\x80\xf4\x8f\xbf\xbfy", 10);
  decode_is("\"\xc3\xa9\xf0\x9f\x98\x80\"", "\xc3\xa9\xf0\x9f\x98\x80", 6);
  /* cut short: only cap bytes written, the whole length returned */
  memset(out, '#', sizeof out);
  k = om_json_string("\"hello\\u00e9!\"", 14, out, 3);
  OM_ASSERT_CMP(k, ==, 8);
  assert_memory_equal(out, "hel###", 6);
  memset(out, '#', sizeof out);
  k = om_json_string("\"hello\\u00e9!\"", 14, out, 6);
  OM_ASSERT_CMP(k, ==, 8);
  assert_memory_equal(out, "hello\xc3#", 7);
  k = om_json_string("\"hello\\u00e9!\"", 14, NULL, 0);
  OM_ASSERT_CMP(k, ==, 8);
  k = om_json_string("\"\\ud83d\\ude00\"", 14, out, 2);
  OM_ASSERT_CMP(k, ==, 4);
  assert_memory_equal(out, "\xf0\x9f", 2);
}

static void integer(void **state) {
  static const struct {
    const char *text;
    int rc;
    int64_t v;
  } T[] = {
      {"0", 0, 0},
      {"-0", 0, 0},
      {"7", 0, 7},
      {"-42", 0, -42},
      {"9223372036854775807", 0, INT64_MAX},
      {"-9223372036854775808", 0, INT64_MIN},
      {"9223372036854775808", -1, 0},
      {"-9223372036854775809", -1, 0},
      {"18446744073709551616", -1, 0},
      {"99999999999999999999", -1, 0},
      {"1.5", -1, 0},
      {"1.0", -1, 0},
      {"1e5", -1, 0},
      {"1E5", -1, 0},
      {"-1e-5", -1, 0},
      {"-", -1, 0},
      {"", -1, 0},
      {"01", -1, 0},
      {"12a", -1, 0},
      {"+1", -1, 0},
  };
  (void)state;
  for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
    int64_t v = 12345;
    int rc = om_json_int(T[i].text, strlen(T[i].text), &v);
    if (rc != T[i].rc || v != (rc == 0 ? T[i].v : 12345))
      fail_msg("om_json_int(\"%s\") = %d, %lld; want %d, %lld", T[i].text, rc,
               (long long)v, T[i].rc, (long long)T[i].v);
  }
}

/* ------------------------------------------------------------------ */
/* the differential run: a seeded generator (core/om_rng.h) */

#define DOC_MAX 16384

static om_rng_t rng;

static uint64_t rnd(void) {
  return om_rng_next(&rng);
}

static unsigned pick(unsigned n) {
  return (unsigned)(rnd() % n);
}

static int chance(unsigned per_mille) {
  return pick(1000) < per_mille;
}

#define PICK(arr) (arr[pick(sizeof(arr) / sizeof(arr[0]))])

typedef struct {
  char b[DOC_MAX];
  size_t n;
  /* what this document may contain: each a source of UNSURE or INVALID,
   * kept to a few documents */
  int esc_names, long_nums, deep, wide, dup;
  unsigned nodes;
} doc_t;

static void put(doc_t *d, const void *s, size_t n) {
  size_t room = sizeof d->b - d->n;
  if (n > room)
    n = room;
  memcpy(d->b + d->n, s, n);
  d->n += n;
}

static void puts_(doc_t *d, const char *s) {
  put(d, s, strlen(s));
}

static void putf(doc_t *d, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  int k;
  va_start(ap, fmt);
  k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k > 0)
    put(d, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

static void ws(doc_t *d) {
  static const char *const w[] = {" ", "\n", "\t", "\r\n", "\n  ", " \t "};
  if (chance(300))
    puts_(d, PICK(w));
}

static void utf8(doc_t *d, unsigned cp) {
  unsigned char u[4];
  size_t k;
  if (cp < 0x80) {
    u[0] = (unsigned char)cp;
    k = 1;
  } else if (cp < 0x800) {
    u[0] = (unsigned char)(0xC0 | cp >> 6);
    u[1] = (unsigned char)(0x80 | (cp & 0x3F));
    k = 2;
  } else if (cp < 0x10000) {
    u[0] = (unsigned char)(0xE0 | cp >> 12);
    u[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    u[2] = (unsigned char)(0x80 | (cp & 0x3F));
    k = 3;
  } else {
    u[0] = (unsigned char)(0xF0 | cp >> 18);
    u[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    u[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    u[3] = (unsigned char)(0x80 | (cp & 0x3F));
    k = 4;
  }
  put(d, u, k);
}

/* A code point, not a surrogate, from every UTF-8 length and edge. */
static unsigned code_point(void) {
  static const unsigned edge[] = {0x80,     0x7FF,  0x800,   0xD7FF,  0xE000,
                                  0xFFFD,   0xFFFF, 0x10000, 0x1F600, 0xFFFFF,
                                  0x10FFFF, 0xE9,   0x20AC,  0x4E2D};
  unsigned cp;
  switch (pick(4)) {
  case 0:
    return PICK(edge);
  case 1:
    return 0x80 + pick(0x800 - 0x80);
  case 2:
    cp = 0x800 + pick(0x10000 - 0x800);
    return cp >= 0xD800 && cp <= 0xDFFF ? cp - 0x800 : cp;
  default:
    return 0x10000 + pick(0x110000 - 0x10000);
  }
}

static void hex_escape(doc_t *d, unsigned u) {
  putf(d, pick(2) ? "\\u%04x" : "\\u%04X", u);
}

/* A string's body (no quotes). `escapes`: may it use them. */
static void string_body(doc_t *d, unsigned pieces, int escapes) {
  static const char *const shorts[] = {"\\\"", "\\\\", "\\/", "\\b",
                                       "\\f",  "\\n",  "\\r", "\\t"};
  for (unsigned i = 0; i < pieces; i++) {
    unsigned k = pick(100);
    if (k < 45 || (!escapes && k < 70)) {
      char c = (char)(0x20 + pick(0x5F)); /* printable ASCII */
      if (c == '"' || c == '\\')
        c = 'q';
      put(d, &c, 1);
    } else if (k < 50) {
      unsigned run = 8 + pick(60);
      for (unsigned j = 0; j < run; j++) {
        char c = (char)('a' + pick(26));
        put(d, &c, 1);
      }
    } else if (k < 70) {
      if (k < 60) {
        puts_(d, PICK(shorts));
      } else if (k < 67) {
        unsigned u = 1 + pick(0xFFFF);
        if (u >= 0xD800 && u <= 0xDFFF)
          u -= 0x800;
        hex_escape(d, u);
      } else {
        unsigned cp = 0x10000 + pick(0x100000);
        hex_escape(d, 0xD800 + ((cp - 0x10000) >> 10));
        hex_escape(d, 0xDC00 + ((cp - 0x10000) & 0x3FF));
      }
    } else if (k < 97) {
      utf8(d, code_point());
    } else {
      puts_(d, "\x7f");
    }
  }
}

static void number(doc_t *d) {
  static const char *const edge[] = {
      "0",
      "-0",
      "9223372036854775807",
      "-9223372036854775808",
      "9223372036854775808",
      "-9223372036854775809",
      "18446744073709551615",
      "99999999999999999999",
      "1e308",
      "1.7976931348623157e308",
      "1.7976931348623158e308",
      "1.7976931348623159e308",
      "-1.7976931348623159E+308",
      "1e309",
      "-1e309",
      "2e308",
      "0.1e310",
      "0.01e310",
      "1e-400",
      "4.9e-324",
      "2.4e-324",
      "0e999999",
      "-0.0",
      "1E+2",
      "123.456e-7",
      "17976931348623158e292",
      "17976931348623159e292",
      "0.000000000000000000000000000000000000001e347",
  };
  unsigned k = pick(10);
  if (d->long_nums && chance(300)) {
    unsigned n = 62 + pick(12);
    puts_(d, chance(500) ? "-" : "");
    puts_(d, "1");
    for (unsigned i = 0; i < n; i++)
      putf(d, "%u", pick(10));
    if (chance(500))
      putf(d, ".%u", pick(10));
    return;
  }
  if (k < 1) {
    puts_(d, PICK(edge));
  } else if (k < 6) {
    unsigned nd = 1 + (chance(100) ? pick(20) : pick(6));
    puts_(d, chance(300) ? "-" : "");
    putf(d, "%u", 1 + pick(9));
    for (unsigned i = 1; i < nd; i++)
      putf(d, "%u", pick(10));
  } else {
    unsigned nd = chance(300) ? 1 : 1 + pick(5);
    puts_(d, chance(300) ? "-" : "");
    if (nd == 1 && chance(300))
      puts_(d, "0");
    else
      for (unsigned i = 0; i < nd; i++)
        putf(d, "%u", i == 0 ? 1 + pick(9) : pick(10));
    if (chance(600)) {
      unsigned nf = 1 + pick(8);
      puts_(d, ".");
      for (unsigned i = 0; i < nf; i++)
        putf(d, "%u", pick(10));
    }
    if (chance(600)) {
      static const char *const e[] = {"e", "E", "e+", "e-", "E-", "E+"};
      puts_(d, PICK(e));
      if (chance(200))
        putf(d, "%u", 300 + pick(20));
      else
        putf(d, "%u", pick(chance(100) ? 1000 : 40));
    }
  }
}

static void value(doc_t *d, unsigned depth);
static void chain(doc_t *d, unsigned levels);

/* A member name; unique in its object unless d->dup asks otherwise. */
static void member_name(doc_t *d, char names[][48], unsigned i) {
  size_t at = d->n;
  if (d->dup && i > 0 && chance(150)) {
    puts_(d, names[pick(i)]);
    memcpy(names[i], "", 1);
    d->dup = 0; /* one per document */
    return;
  }
  /* unique: the digits before the first '#' are i */
  putf(d, "\"%u#", i);
  if (d->esc_names && chance(200))
    puts_(d, "\\u0061");
  string_body(d, pick(5), 0);
  puts_(d, "\"");
  {
    size_t k = d->n - at < 47 ? d->n - at : 47;
    memcpy(names[i], d->b + at, k);
    names[i][k] = 0;
  }
}

static void object(doc_t *d, unsigned depth) {
  char names[24][48];
  unsigned n = pick(7);
  puts_(d, "{");
  ws(d);
  for (unsigned i = 0; i < n; i++) {
    if (i > 0) {
      puts_(d, ",");
      ws(d);
    }
    member_name(d, names, i);
    ws(d);
    puts_(d, ":");
    ws(d);
    value(d, depth + 1);
    ws(d);
  }
  puts_(d, "}");
}

static void array(doc_t *d, unsigned depth) {
  unsigned n = pick(7);
  puts_(d, "[");
  ws(d);
  for (unsigned i = 0; i < n; i++) {
    if (i > 0) {
      puts_(d, ",");
      ws(d);
    }
    value(d, depth + 1);
    ws(d);
  }
  puts_(d, "]");
}

/* `levels` containers, one in the other, around a scalar */
static void chain(doc_t *d, unsigned levels) {
  char open[128];
  for (unsigned i = 0; i < levels && i < sizeof open; i++) {
    open[i] = pick(2) ? '[' : '{';
    puts_(d, open[i] == '[' ? "[" : "{\"k\":");
    ws(d);
  }
  value(d, 6);
  for (unsigned i = levels < sizeof open ? levels : sizeof open; i-- > 0;) {
    ws(d);
    puts_(d, open[i] == '[' ? "]" : "}");
  }
}

static void value(doc_t *d, unsigned depth) {
  unsigned k = pick(100);
  d->nodes++;
  if (d->deep) { /* once: a chain of containers around the limit */
    unsigned levels = d->deep;
    d->deep = 0;
    chain(d, levels);
    return;
  }
  if (depth < 5 && d->nodes < 30 && k < 40) {
    if (k < 20)
      object(d, depth);
    else
      array(d, depth);
    return;
  }
  k = pick(100);
  if (k < 45) {
    puts_(d, "\"");
    string_body(d, pick(chance(100) ? 40 : 8), 1);
    puts_(d, "\"");
  } else if (k < 85) {
    number(d);
  } else {
    static const char *const lit[] = {"true", "false", "null"};
    puts_(d, PICK(lit));
  }
}

/* A wide object: a few hundred names, near OM_JSON_MAX_KEYS. */
static void wide_object(doc_t *d) {
  unsigned n = OM_JSON_MAX_KEYS - 20 + pick(40);
  puts_(d, "{");
  for (unsigned i = 0; i < n; i++)
    putf(d, "%s\"w%x\":%u", i ? "," : "", i * 2654435761u, pick(100));
  puts_(d, "}");
}

static void mutate(doc_t *d) {
  static const char interesting[] = {
      '"',        '\\',       ',',        ':',        '{',        '}',
      '[',        ']',        '0',        '1',        '-',        '.',
      'e',        'E',        '+',        'u',        ' ',        '\n',
      '\t',       '\r',       '\f',       '\v',       0x00,       0x1F,
      0x7F,       'a',        'n',        't',        (char)0x80, (char)0xBF,
      (char)0xC0, (char)0xC3, (char)0xE0, (char)0xED, (char)0xF0, (char)0xF4,
      (char)0xF5, (char)0xFF};
  static const char *const bad_utf8[] = {"\x80",
                                         "\xbf",
                                         "\xc0\x80",
                                         "\xc1\xbf",
                                         "\xe0\x80\x80",
                                         "\xe0\x9f\xbf",
                                         "\xed\xa0\x80",
                                         "\xed\xbf\xbf",
                                         "\xf0\x80\x80\x80",
                                         "\xf0\x8f\xbf\xbf",
                                         "\xf4\x90\x80\x80",
                                         "\xf5\x80\x80\x80",
                                         "\xf8\x88\x80\x80\x80",
                                         "\xfe",
                                         "\xff",
                                         "\xc3",
                                         "\xe2\x82",
                                         "\xf0\x9f\x98",
                                         "\xc3\x28",
                                         "\xc2\xa0",
                                         "\xef\xbb\xbf"};
  unsigned ops = 1 + pick(3);
  for (unsigned o = 0; o < ops && d->n > 0; o++) {
    size_t at = pick((unsigned)d->n);
    switch (pick(8)) {
    case 0:
      d->b[at] = (char)pick(256);
      break;
    case 1:
      d->b[at] = PICK(interesting);
      break;
    case 2:
    case 3: {
      const char *ins;
      size_t k;
      char one;
      if (pick(2)) {
        ins = PICK(bad_utf8);
        k = strlen(ins);
      } else {
        one = PICK(interesting);
        ins = &one;
        k = 1;
      }
      if (d->n + k <= sizeof d->b) {
        memmove(d->b + at + k, d->b + at, d->n - at);
        memcpy(d->b + at, ins, k);
        d->n += k;
      }
      break;
    }
    case 4: {
      size_t k = 1 + pick(3);
      if (k > d->n - at)
        k = d->n - at;
      memmove(d->b + at, d->b + at + k, d->n - at - k);
      d->n -= k;
      break;
    }
    case 5:
      d->n = at;
      break;
    case 6:
      if (at + 1 < d->n) {
        char c = d->b[at];
        d->b[at] = d->b[at + 1];
        d->b[at + 1] = c;
      }
      break;
    default: /* a byte doubled */
      if (d->n < sizeof d->b) {
        memmove(d->b + at + 1, d->b + at, d->n - at);
        d->n++;
      }
      break;
    }
  }
}

static int gen(doc_t *d) {
  d->n = 0;
  d->nodes = 0;
  d->esc_names = chance(10);
  d->long_nums = chance(10);
  d->deep = chance(8) ? OM_JSON_MAX_DEPTH - 3 + pick(6) : 0;
  d->wide = chance(5);
  d->dup = chance(60);
  ws(d);
  if (chance(20)) { /* a scalar at the top: refused */
    value(d, 6);
  } else if (d->wide) {
    wide_object(d);
  } else if (pick(2)) {
    object(d, 0);
  } else {
    array(d, 0);
  }
  ws(d);
  if (chance(400)) {
    mutate(d);
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* the differential run: checking one document */

typedef struct {
  unsigned long cases, ok, invalid, unsure, mutated, strings, ints, reals;
  unsigned long dups, overflows, unsure_accepted;
} tally_t;

typedef struct {
  const char *doc;
  size_t n;
  json_t *root;
  json_t *node[OM_JSON_MAX_DEPTH + 2];
  size_t count[OM_JSON_MAX_DEPTH + 3];
  tally_t *t;
  char why[512];
} walk_t;

static int walk_fail(walk_t *w, const om_json_ev_t *ev, const char *fmt, ...) {
  va_list ap;
  int k = snprintf(w->why, sizeof w->why,
                   "event type %d at %zu depth %zu: ", (int)ev->type,
                   (size_t)(ev->text - w->doc), ev->depth);
  va_start(ap, fmt);
  vsnprintf(w->why + k, sizeof w->why - (size_t)k, fmt, ap);
  va_end(ap);
  return 1;
}

static int walk(void *ud, const om_json_ev_t *ev) {
  static char buf[DOC_MAX], cut[DOC_MAX + 1];
  walk_t *w = ud;
  size_t d = ev->depth;
  json_t *v;
  if (ev->text < w->doc || ev->len == 0 || ev->text + ev->len > w->doc + w->n)
    return walk_fail(w, ev, "text outside the document");
  if (d > OM_JSON_MAX_DEPTH + 1)
    return walk_fail(w, ev, "too deep");
  if (ev->type == OM_JSON_END) {
    v = w->node[d];
    if (ev->len != 1 || *ev->text != (json_is_object(v) ? '}' : ']'))
      return walk_fail(w, ev, "end of the wrong container");
    if (w->count[d + 1] !=
        (json_is_object(v) ? json_object_size(v) : json_array_size(v)))
      return walk_fail(w, ev, "%zu members, jansson has %zu", w->count[d + 1],
                       json_is_object(v) ? json_object_size(v)
                                         : json_array_size(v));
    return 0;
  }
  if (d == 0) {
    v = w->root;
  } else {
    json_t *up = w->node[d - 1];
    const om_json_seg_t *g = &ev->path[d - 1];
    if (json_is_object(up)) {
      if (g->key == NULL)
        return walk_fail(w, ev, "no name in an object");
      v = json_object_getn(up, g->key, g->key_len);
      if (v == NULL)
        return walk_fail(w, ev, "jansson has no member \"%.*s\"",
                         (int)g->key_len, g->key);
    } else {
      if (g->key != NULL || g->index != w->count[d])
        return walk_fail(w, ev, "index %zu, want %zu", g->index, w->count[d]);
      v = json_array_get(up, g->index);
      if (v == NULL)
        return walk_fail(w, ev, "jansson has no element %zu", g->index);
    }
    w->count[d]++;
  }
  switch (ev->type) {
  case OM_JSON_OBJECT:
  case OM_JSON_ARRAY:
    if (ev->type == OM_JSON_OBJECT ? !json_is_object(v) : !json_is_array(v))
      return walk_fail(w, ev, "jansson has type %d", (int)json_typeof(v));
    if (ev->len != 1 || *ev->text != (ev->type == OM_JSON_OBJECT ? '{' : '['))
      return walk_fail(w, ev, "text is not the bracket");
    w->node[d] = v;
    w->count[d + 1] = 0;
    break;
  case OM_JSON_STRING: {
    size_t k, half;
    if (!json_is_string(v))
      return walk_fail(w, ev, "jansson has type %d", (int)json_typeof(v));
    if (ev->len < 2 || ev->text[0] != '"' || ev->text[ev->len - 1] != '"')
      return walk_fail(w, ev, "text is not quoted");
    k = om_json_string(ev->text, ev->len, buf, sizeof buf);
    if (k != json_string_length(v) || memcmp(buf, json_string_value(v), k) != 0)
      return walk_fail(w, ev, "decoded %zu bytes, jansson has %zu", k,
                       json_string_length(v));
    /* cut short: the same length, the first bytes, nothing past cap */
    half = k / 2;
    cut[half] = '#';
    if (om_json_string(ev->text, ev->len, cut, half) != k ||
        memcmp(cut, json_string_value(v), half) != 0 || cut[half] != '#')
      return walk_fail(w, ev, "decoding into %zu bytes differs", half);
    w->t->strings++;
    break;
  }
  case OM_JSON_NUMBER: {
    int64_t x;
    char num[80];
    if (om_json_int(ev->text, ev->len, &x) == 0) {
      if (!json_is_integer(v) || json_integer_value(v) != x)
        return walk_fail(w, ev, "integer %lld, jansson has type %d %lld",
                         (long long)x, (int)json_typeof(v),
                         json_is_integer(v) ? (long long)json_integer_value(v)
                                            : 0LL);
      w->t->ints++;
    } else {
      double r;
      if (memchr(ev->text, '.', ev->len) == NULL &&
          memchr(ev->text, 'e', ev->len) == NULL &&
          memchr(ev->text, 'E', ev->len) == NULL)
        return walk_fail(w, ev, "an integer om_json_int refuses");
      if (ev->len >= sizeof num)
        return walk_fail(w, ev, "a number of %zu bytes", ev->len);
      memcpy(num, ev->text, ev->len);
      num[ev->len] = 0;
      r = strtod(num, NULL);
      if (!json_is_real(v) ||
          memcmp(&r, &(double){json_real_value(v)}, sizeof r) != 0)
        return walk_fail(w, ev, "real %.17g, jansson has type %d %.17g", r,
                         (int)json_typeof(v),
                         json_is_real(v) ? json_real_value(v) : 0.0);
      w->t->reals++;
    }
    break;
  }
  case OM_JSON_TRUE:
  case OM_JSON_FALSE:
  case OM_JSON_NULL: {
    static const char *const lit[] = {"true", "false", "null"};
    const char *want = lit[ev->type - OM_JSON_TRUE];
    if (ev->len != strlen(want) || memcmp(ev->text, want, ev->len) != 0)
      return walk_fail(w, ev, "literal text");
    if ((ev->type == OM_JSON_TRUE && !json_is_true(v)) ||
        (ev->type == OM_JSON_FALSE && !json_is_false(v)) ||
        (ev->type == OM_JSON_NULL && !json_is_null(v)))
      return walk_fail(w, ev, "jansson has type %d", (int)json_typeof(v));
    break;
  }
  case OM_JSON_END:
    break;
  }
  return 0;
}

static void check(const char *b, size_t n, tally_t *t, unsigned long i,
                  unsigned long seed) {
  /* exactly n bytes on the heap: a read past the end is ASan's to see */
  char *s = malloc(n > 0 ? n : 1);
  size_t where = (size_t)-1;
  om_json_result_t r;
  json_error_t err;
  json_t *root;
  assert_non_null(s);
  memcpy(s, b, n);
  r = om_json_scan(s, n, NULL, NULL, &where);
  root = json_loadb(s, n, JSON_REJECT_DUPLICATES, &err);
  t->cases++;
  if (where > n) {
    show(s, n);
    fail_msg("document %lu (seed %lu): %s at %zu, past the end", i, seed,
             res_name(r), where);
  }
  if ((r == OM_JSON_OK && root == NULL) ||
      (r == OM_JSON_INVALID && root != NULL) ||
      (r != OM_JSON_OK && r != OM_JSON_INVALID && r != OM_JSON_UNSURE)) {
    show(s, n);
    fprintf(stderr, "jansson: %s (%s at %d)\n",
            root != NULL ? "accepts" : "refuses", root != NULL ? "" : err.text,
            err.position);
    fail_msg("document %lu (seed %lu): om_json_scan %s at %zu, jansson %s", i,
             seed, res_name(r), where, root != NULL ? "accepts" : "refuses");
  }
  if (r == OM_JSON_OK) {
    walk_t w;
    om_json_result_t r2;
    memset(&w, 0, sizeof w);
    w.doc = s;
    w.n = n;
    w.root = root;
    w.t = t;
    r2 = om_json_scan(s, n, walk, &w, NULL);
    if (r2 != OM_JSON_OK) {
      show(s, n);
      fail_msg("document %lu (seed %lu): events: %s (%s)", i, seed,
               res_name(r2), w.why);
    }
    t->ok++;
  } else if (r == OM_JSON_INVALID) {
    t->invalid++;
    /* the refusals the generator aims at, to see that it reaches them */
    if (json_error_code(&err) == json_error_duplicate_key)
      t->dups++;
    else if (json_error_code(&err) == json_error_numeric_overflow)
      t->overflows++;
  } else {
    t->unsure++;
    t->unsure_accepted += root != NULL;
  }
  json_decref(root);
  free(s);
}

static unsigned long env_ul(const char *name, unsigned long def) {
  const char *v = getenv(name);
  return v != NULL && *v != 0 ? strtoul(v, NULL, 0) : def;
}

static void differential(void **state) {
  static doc_t d;
  unsigned long seed = env_ul("OM_FUZZ_SEED", (unsigned long)time(NULL));
  unsigned long count = env_ul("OM_FUZZ_COUNT", 20000), i;
  tally_t t;
  (void)state;
  memset(&t, 0, sizeof t);
  om_rng_seed(&rng, seed);
  fprintf(stderr, "# OM_FUZZ_SEED=%lu OM_FUZZ_COUNT=%lu\n", seed, count);
  for (i = 0; i < count; i++) {
    t.mutated += (unsigned long)gen(&d);
    check(d.b, d.n, &t, i, seed);
  }
  fprintf(stderr,
          "# %lu documents (%lu mutated): OK %lu, INVALID %lu (duplicate "
          "names %lu, numbers out of range %lu), UNSURE %lu (jansson "
          "accepts %lu); checked against jansson: %lu strings, %lu integers, "
          "%lu reals\n",
          t.cases, t.mutated, t.ok, t.invalid, t.dups, t.overflows, t.unsure,
          t.unsure_accepted, t.strings, t.ints, t.reals);
  /* the fast path decides nearly everything, and both verdicts occur */
  OM_ASSERT_CMP(t.unsure * 20, <, t.cases);
  OM_ASSERT_CMP(t.ok, >, count / 5);
  OM_ASSERT_CMP(t.invalid, >, count / 5);
  OM_ASSERT_CMP(t.dups, >, count / 1000);
  OM_ASSERT_CMP(t.overflows, >, count / 1000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(table),        cmocka_unit_test(limits),
      cmocka_unit_test(events),       cmocka_unit_test(at),
      cmocka_unit_test(string),       cmocka_unit_test(integer),
      cmocka_unit_test(differential),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
