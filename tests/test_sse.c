/*
 * test_sse.c: the event-stream parser against WHATWG HTML 9.2.5/9.2.6 and
 * the UTF-8 decoder of the WHATWG Encoding Standard (4.1.1), fed whole,
 * byte by byte and at random split points; a straightforward reference
 * implementation of the same text as an oracle for random streams; the
 * buffering cap, linear work, fault injection, and the writer.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "om_errno.h"
#include "om_lua.h"
#include "om_rng.h"
#include "om_sse.h"

/* ---- an output transcript: events and state as one readable string ---- */

#define OUT_MAX 65536

typedef struct {
  char buf[OUT_MAX];
  size_t len;
} out_t;

static void out_raw(out_t *o, const char *s, size_t n) {
  if (o->len + n + 1 > OUT_MAX)
    fail_msg("transcript overflow");
  memcpy(o->buf + o->len, s, n);
  o->len += n;
  o->buf[o->len] = '\0';
}

static void out_str(out_t *o, const char *s) {
  out_raw(o, s, strlen(s));
}

/* Printable ASCII as is; \n \r \\ and every other byte escaped. */
static void out_esc(out_t *o, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char e[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
    if (c == '\n')
      out_raw(o, "\\n", 2);
    else if (c == '\r')
      out_raw(o, "\\r", 2);
    else if (c == '\\')
      out_raw(o, "\\\\", 2);
    else if (c >= 0x20 && c < 0x7f)
      out_raw(o, (const char *)&c, 1);
    else
      out_raw(o, e, 4);
  }
}

static int record(void *ud, const om_sse_event_t *ev) {
  out_t *o = ud;
  assert_non_null(ev->type);
  assert_non_null(ev->data);
  assert_non_null(ev->id);
  assert_int_equal(ev->type[ev->type_len], '\0');
  assert_int_equal(ev->data[ev->data_len], '\0');
  assert_int_equal(ev->retry_ms, -1);
  out_str(o, "[");
  out_esc(o, ev->type, ev->type_len);
  out_str(o, "|");
  out_esc(o, ev->data, ev->data_len);
  out_str(o, "|");
  out_esc(o, ev->id, ev->id_len);
  out_str(o, "]");
  return 0;
}

enum { WHOLE, BYTES, RANDOM };

/*
 * Parse in one of three ways and write the transcript: the events, then
 * "!ECODE" if feeding failed, then " last=<id> retry=<ms>".
 */
static void transcript(const char *in, size_t len, int mode, uint64_t seed,
                       size_t max, out_t *o) {
  om_sse_parser_opts_t opts = {max};
  om_sse_parser_t *p = NULL;
  om_rng_t rng;
  size_t off = 0, idlen;
  const char *id;
  char tail[64];
  int rc = 0;
  o->len = 0;
  o->buf[0] = '\0';
  om_rng_seed(&rng, seed);
  assert_int_equal(om_sse_parser_new(&opts, &p), 0);
  while (off < len && rc == 0) {
    size_t n = len - off;
    if (mode == BYTES)
      n = 1;
    else if (mode == RANDOM && n > 1)
      n = 1 + om_rng_below(&rng, (uint32_t)(n < 17 ? n : 17));
    rc = om_sse_parser_feed(p, in + off, n, record, o);
    off += n;
  }
  if (rc != 0) {
    out_str(o, "!");
    out_str(o, om_err_name(rc));
    /* The failure is sticky. */
    assert_int_equal(om_sse_parser_feed(p, "\n\n", 2, record, o), rc);
  }
  id = om_sse_parser_last_event_id(p, &idlen);
  out_str(o, " last=");
  out_esc(o, id, idlen);
  snprintf(tail, sizeof tail, " retry=%lld",
           (long long)om_sse_parser_retry_ms(p));
  out_str(o, tail);
  om_sse_parser_free(p);
}

/*
 * The heart of the rule tests: every way of chunking gives `want`.
 */
static void expect_max(const char *in, size_t len, size_t max,
                       const char *want) {
  static out_t o, shown; /* big: not on the stack */
  shown.len = 0;
  out_esc(&shown, in, len < 2000 ? len : 2000);
  transcript(in, len, WHOLE, 0, max, &o);
  if (strcmp(o.buf, want) != 0)
    fail_msg("whole: %s\n  got  %s\n  want %s", shown.buf, o.buf, want);
  transcript(in, len, BYTES, 0, max, &o);
  if (strcmp(o.buf, want) != 0)
    fail_msg("byte by byte: %s\n  got  %s\n  want %s", shown.buf, o.buf, want);
  for (uint64_t seed = 1; seed <= 8; seed++) {
    transcript(in, len, RANDOM, seed, max, &o);
    if (strcmp(o.buf, want) != 0)
      fail_msg("random split (seed %llu): %s\n  got  %s\n  want %s",
               (unsigned long long)seed, shown.buf, o.buf, want);
  }
}

#define EXPECT(lit, want) expect_max(lit, sizeof(lit) - 1, 0, want)
#define EXPECT_MAX(lit, max, want) expect_max(lit, sizeof(lit) - 1, max, want)
#define R "\\xef\\xbf\\xbd" /* U+FFFD as the transcript shows it */

/* ---- 9.2.6: the standard's own examples -------------------------------- */

static void stock_examples(void **state) {
  (void)state;
  /* "three lines ... the first has the data YHOO, the second +2, ..." */
  EXPECT("data: YHOO\ndata: +2\ndata: 10\n\n",
         "[message|YHOO\\n+2\\n10|] last= retry=-1");
  /* The first event gets id 1; the second event has an empty id (the
   * bare "id" line resets it), and so does the third. */
  EXPECT(": test stream\n\ndata: first event\nid: 1\n\ndata:second event\n"
         "id\n\ndata:  third event\n\n",
         "[message|first event|1][message|second event|]"
         "[message| third event|] last= retry=-1");
  /* "The first block fires events with the data set to the empty string,
   * as would the last block if it was followed by a blank line. The middle
   * block fires an event with the data set to a single newline character.
   * The last block is discarded because it is not followed by a blank
   * line." */
  EXPECT("data\n\ndata\ndata\n\ndata:", "[message||][message|\\n|] last= "
                                        "retry=-1");
  /* "two identical events ... the space after the colon is ignored" */
  EXPECT("data:test\n\ndata: test\n\n",
         "[message|test|][message|test|] last= retry=-1");
  /* 9.2.5's event type example. */
  EXPECT("event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\n"
         "event: add\ndata: 113411\n\n",
         "[add|73857293|][remove|2153|][add|113411|] last= retry=-1");
}

/* ---- one rule at a time ------------------------------------------------ */

static void bom_stripped_once_at_start(void **state) {
  (void)state;
  EXPECT("\xEF\xBB\xBF"
         "data: a\n\n",
         "[message|a|] last= retry=-1");
  /* A second BOM is not stripped: it is part of the field name. */
  EXPECT("\xEF\xBB\xBF\xEF\xBB\xBF"
         "data: a\n\ndata: b\n\n",
         "[message|b|] last= retry=-1");
  /* Not at the start: kept as U+FEFF in the value. */
  EXPECT("data: \xEF\xBB\xBF"
         "a\n\n",
         "[message|\\xef\\xbb\\xbfa|] last= retry=-1");
  /* A partial BOM is ordinary (here: invalid) input. */
  EXPECT("\xEF\xBB"
         "data: a\n\ndata: b\n\n",
         "[message|b|] last= retry=-1");
  EXPECT("\xEF"
         ":x\ndata: a\n\n",
         "[message|a|] last= retry=-1");
  EXPECT("\xEF\xBB\xBF", " last= retry=-1");
  EXPECT("\xEF\xBB\xBF\n\n", " last= retry=-1");
}

static void line_endings(void **state) {
  (void)state;
  EXPECT("data: a\rdata: b\r\ndata: c\ndata: d\r\r",
         "[message|a\\nb\\nc\\nd|] last= retry=-1");
  EXPECT("data: a\r\n\r\ndata: b\n\ndata: c\r\r",
         "[message|a|][message|b|][message|c|] last= retry=-1");
  /* CRLF is one line end even when a chunk ends between CR and LF: the
   * byte-by-byte and random modes of EXPECT split inside every CRLF. */
  EXPECT("data: a\r\ndata: b\r\n\r\n", "[message|a\\nb|] last= retry=-1");
  /* LF CR is two line ends. */
  EXPECT("data: a\n\rdata: b\n\n", "[message|a|][message|b|] last= retry=-1");
  /* CR CR LF: line end, then a blank line ended by CRLF. */
  EXPECT("data: a\r\r\ndata: b\r\n\r\n",
         "[message|a|][message|b|] last= retry=-1");
}

static void crlf_split_explicitly(void **state) {
  static out_t o;
  om_sse_parser_t *p;
  (void)state;
  o.len = 0;
  assert_int_equal(om_sse_parser_new(NULL, &p), 0);
  assert_int_equal(om_sse_parser_feed(p, "data: a\r", 8, record, &o), 0);
  assert_int_equal(om_sse_parser_feed(p, "\ndata: b\r", 9, record, &o), 0);
  assert_int_equal(om_sse_parser_feed(p, "\n", 1, record, &o), 0);
  assert_int_equal(o.len, 0); /* no blank line yet */
  assert_int_equal(om_sse_parser_feed(p, "\r", 1, record, &o), 0);
  assert_string_equal(o.buf, "[message|a\\nb|]");
  om_sse_parser_free(p);
}

static void comments(void **state) {
  (void)state;
  EXPECT(":x\n: y\ndata: a\n:comment: with colon\n\n",
         "[message|a|] last= retry=-1");
  EXPECT(": ping\n\n:\n\n", " last= retry=-1");
  /* A colon in the middle is not a comment. */
  EXPECT("data: :a\n\n", "[message|:a|] last= retry=-1");
}

static void fields_without_colon(void **state) {
  (void)state;
  EXPECT("data\n\n", "[message||] last= retry=-1");
  EXPECT("data\ndata\n\n", "[message|\\n|] last= retry=-1");
  EXPECT("event: x\nevent\ndata: y\n\n", "[message|y|] last= retry=-1");
  EXPECT("id: 1\nid\ndata: y\n\n", "[message|y|] last= retry=-1");
  EXPECT("retry: 5\nretry\n\n", " last= retry=5");
  EXPECT("nocolon\ndata: y\n\n", "[message|y|] last= retry=-1");
}

static void one_leading_space(void **state) {
  (void)state;
  EXPECT("data:a\n\n", "[message|a|] last= retry=-1");
  EXPECT("data: a\n\n", "[message|a|] last= retry=-1");
  EXPECT("data:  a\n\n", "[message| a|] last= retry=-1");
  EXPECT("data:\ta\n\n", "[message|\\x09a|] last= retry=-1");
  EXPECT("data: \n\n", "[message||] last= retry=-1");
  EXPECT("data:  \n\n", "[message| |] last= retry=-1");
  EXPECT("event:  sp\ndata: a\n\n", "[ sp|a|] last= retry=-1");
  EXPECT("id:  7\ndata: a\n\n", "[message|a| 7] last= 7 retry=-1");
  /* The field name is everything up to the first colon: "data " is not
   * "data". Only the first colon splits. */
  EXPECT("data : a\n\ndata:a:b\n\n", "[message|a:b|] last= retry=-1");
}

static void data_lines_joined_with_lf(void **state) {
  (void)state;
  EXPECT("data: a\ndata:\ndata: b\n\n", "[message|a\\n\\nb|] last= retry=-1");
  /* Only the last LF is removed. */
  EXPECT("data: a\ndata:\n\n", "[message|a\\n|] last= retry=-1");
  EXPECT("data\ndata\ndata\n\n", "[message|\\n\\n|] last= retry=-1");
  /* Other fields between data lines do not break the join. */
  EXPECT("data: a\nfoo: b\nid: 1\ndata: c\n\n",
         "[message|a\\nc|1] last=1 retry=-1");
  /* NUL bytes are data. */
  EXPECT("data: a\0b\n\n", "[message|a\\x00b|] last= retry=-1");
}

static void event_type_buffer(void **state) {
  (void)state;
  EXPECT("event: add\ndata: 1\n\ndata: 2\n\n",
         "[add|1|][message|2|] last= retry=-1");
  EXPECT("event:\ndata: 1\n\n", "[message|1|] last= retry=-1");
  /* The last event line wins. */
  EXPECT("event: a\nevent: b\ndata: 1\n\n", "[b|1|] last= retry=-1");
  /* Reset by a blank line even when no event is dispatched (step 2). */
  EXPECT("event: x\n\ndata: y\n\n", "[message|y|] last= retry=-1");
  EXPECT("event: \xff\ndata: y\n\n", "[" R "|y|] last= retry=-1");
}

static void empty_data_no_dispatch(void **state) {
  (void)state;
  EXPECT("\n\n\n\n", " last= retry=-1");
  EXPECT("event: e\nid: 3\n\n", " last=3 retry=-1");
  EXPECT("foo: bar\n\n", " last= retry=-1");
}

static void last_event_id(void **state) {
  (void)state;
  /* It persists across events. */
  EXPECT("id: 1\ndata: a\n\ndata: b\n\n", "[message|a|1][message|b|1] last=1 "
                                          "retry=-1");
  /* An id containing NUL is ignored: the buffer keeps "1". */
  EXPECT("id: 1\ndata: a\n\nid: 2\0x\ndata: c\n\n",
         "[message|a|1][message|c|1] last=1 retry=-1");
  EXPECT("id: \0\ndata: c\n\n", "[message|c|] last= retry=-1");
  /* An empty value resets it. */
  EXPECT("id: 1\ndata: a\n\nid:\ndata: b\n\n",
         "[message|a|1][message|b|] last= retry=-1");
  /* Step 1 (set the string) comes before step 2 (the empty-data return). */
  EXPECT("id: 5\n\n", " last=5 retry=-1");
  /* The string changes only at a blank line. */
  EXPECT("id: 1\ndata: a\n\nid: 2\n", "[message|a|1] last=1 retry=-1");
  EXPECT("id: 1\ndata: a\n\nid: 2\ndata: b\n", "[message|a|1] last=1 "
                                               "retry=-1");
  /* The last id line before the blank line wins; it applies to the event
   * it ends, whatever the order of the lines. */
  EXPECT("data: a\nid: 1\nid: 2\n\n", "[message|a|2] last=2 retry=-1");
  /* Invalid UTF-8 in an id is replaced like anywhere else. */
  EXPECT("id: \xc3\ndata: a\n\n", "[message|a|" R "] last=" R " retry=-1");
}

static void retry_field(void **state) {
  (void)state;
  EXPECT("retry: 1000\n", " last= retry=1000");
  EXPECT("retry:0\n", " last= retry=0");
  EXPECT("retry: 007\n", " last= retry=7");
  /* Applied at the end of its line, with no blank line needed. */
  EXPECT("retry: 10\nretry: 20\ndata: a\n", " last= retry=20");
  /* Not only ASCII digits: ignored, the previous value stays. */
  EXPECT("retry: 10\nretry: 10a\nretry: -1\nretry: 1.5\nretry: +2\n"
         "retry:  5\nretry: \nretry:\nretry\nretry: \xd9\xa3\n",
         " last= retry=10");
  /* Huge values saturate instead of wrapping. */
  EXPECT("retry: 99999999999999999999999999\n",
         " last= retry=9223372036854775807");
  EXPECT("retry: 9223372036854775807\n", " last= retry=9223372036854775807");
  EXPECT("retry: 9223372036854775806\n", " last= retry=9223372036854775806");
  /* An unterminated line is pending input, not a field yet. */
  EXPECT("retry: 5", " last= retry=-1");
}

static void names_are_case_sensitive(void **state) {
  (void)state;
  EXPECT("Data: a\nDATA: b\nEvent: e\nID: 1\nRetry: 5\n\n", " last= retry=-1");
  EXPECT("foo: bar\ndatum: x\ndata2: y\nretryy: 1\nevents: z\ndata: ok\n\n",
         "[message|ok|] last= retry=-1");
  /* Longer than any known name, with and without colon. */
  EXPECT("dataaaaaaaaaaaaaaaaaaa: x\ndataaaaaaaaaaaaaa\n\n", " last= retry=-1");
}

static void unterminated_event_discarded(void **state) {
  (void)state;
  EXPECT("data: x\n", " last= retry=-1");
  EXPECT("data: x", " last= retry=-1");
  EXPECT("id: 9\ndata: x\n", " last= retry=-1");
  EXPECT("data: a\n\ndata: x\n", "[message|a|] last= retry=-1");
}

/* WHATWG Encoding 4.1.1: one U+FFFD per maximal subpart. */
static void utf8_replacement(void **state) {
  (void)state;
  EXPECT("data: \xc3\xa9\xe2\x82\xac\xf0\x9d\x84\x9e\n\n",
         "[message|\\xc3\\xa9\\xe2\\x82\\xac\\xf0\\x9d\\x84\\x9e|] last= "
         "retry=-1");
  EXPECT("data: \x80\n\n", "[message|" R "|] last= retry=-1");
  EXPECT("data: \xc0\xaf\n\n", "[message|" R R "|] last= retry=-1");
  EXPECT("data: \xc1\xbf\n\n", "[message|" R R "|] last= retry=-1");
  EXPECT("data: \xe0\x80\xaf\n\n", "[message|" R R R "|] last= retry=-1");
  EXPECT("data: \xe0\xa0\n\n", "[message|" R "|] last= retry=-1");
  EXPECT("data: \xe2\x82"
         "A\n\n",
         "[message|" R "A|] last= retry=-1");
  EXPECT("data: \xed\xa0\x80\n\n", "[message|" R R R "|] last= retry=-1");
  EXPECT("data: \xed\x9f\xbf\n\n", "[message|\\xed\\x9f\\xbf|] last= "
                                   "retry=-1");
  EXPECT("data: \xf4\x90\x80\x80\n\n", "[message|" R R R R "|] last= retry=-1");
  EXPECT("data: \xf4\x8f\xbf\xbf\n\n",
         "[message|\\xf4\\x8f\\xbf\\xbf|] last= retry=-1");
  EXPECT("data: \xf0\x8f\xbf\xbf\n\n", "[message|" R R R R "|] last= retry=-1");
  EXPECT("data: \xf0\x9f\x98\n\n", "[message|" R "|] last= retry=-1");
  EXPECT("data: \xf5\xff\xfe\n\n", "[message|" R R R "|] last= retry=-1");
  /* Unicode 15 table 3-8, the example WHATWG's decoder reproduces:
   * 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64. */
  EXPECT("data: a\xf1\x80\x80\xe1\x80\xc2"
         "b\x80"
         "c\x80\xbf"
         "d\n\n",
         "[message|a" R R R "b" R "c" R R "d|] last= retry=-1");
  /* A sequence cut by a CR or LF: an error there, and the line still
   * ends. */
  EXPECT("data: \xe2\x82\rdata: \xf0\x9f\r\n\n",
         "[message|" R "\\n" R "|] last= retry=-1");
  /* Invalid bytes in names never match a field. */
  EXPECT("d\xe1ta: x\n\n", " last= retry=-1");
}

static void cap_bounds_buffering(void **state) {
  (void)state;
  /* 15 bytes + LF fill a 16-byte cap exactly... */
  EXPECT_MAX("data: 0123456789abcde\n\n", 16,
             "[message|0123456789abcde|] last= retry=-1");
  /* ...one more does not; events before the failure were delivered. */
  EXPECT_MAX("id: 1\ndata: a\n\ndata: 0123456789abcdef\n\n", 16,
             "[message|a|1]!ETOOBIG last=1 retry=-1");
  /* Event type and id values count too. */
  EXPECT_MAX("event: 0123456789abcdefgh\n", 16,
             "!ETOOBIG last= "
             "retry=-1");
  EXPECT_MAX("event: 01234567\ndata: 01234567\n\n", 16,
             "!ETOOBIG last= retry=-1");
  EXPECT_MAX("id: 0123456789abcdefgh\n", 16, "!ETOOBIG last= retry=-1");
  /* Replacement characters are counted as the 3 bytes they take. */
  EXPECT_MAX("data: \xff\xff\xff\xff\xff\n\n", 16,
             "[message|" R R R R R "|] last= retry=-1");
  EXPECT_MAX("data: \xff\xff\xff\xff\xff\xff\n\n", 16,
             "!ETOOBIG last= retry=-1");
}

/* What is not buffered is not capped: long comments, unknown fields and
 * retry values pass in constant memory. */
static void cap_ignores_unbuffered_lines(void **state) {
  size_t n = 100000;
  char *in = malloc(3 * n + 64);
  size_t len = 0;
  (void)state;
  assert_non_null(in);
  in[len++] = ':';
  memset(in + len, 'c', n);
  len += n;
  memcpy(in + len, "\nunknown:", 9);
  len += 9;
  memset(in + len, 'u', n);
  len += n;
  memcpy(in + len, "\nretry: ", 8);
  len += 8;
  memset(in + len, '0', n);
  len += n;
  memcpy(in + len, "42\ndata: ok\n\n", 13);
  len += 13;
  expect_max(in, len, 16, "[message|ok|] last= retry=42");
  free(in);
}

static void cap_failure_is_sticky_until_reset(void **state) {
  static out_t o;
  om_sse_parser_opts_t opts = {8};
  om_sse_parser_t *p;
  (void)state;
  o.len = 0;
  assert_int_equal(om_sse_parser_new(&opts, &p), 0);
  assert_int_equal(om_sse_parser_feed(p, "retry: 5\nid: x\n\n", 16, record, &o),
                   0);
  assert_int_equal(om_sse_parser_feed(p, "data: 123456789\n\n", 17, record, &o),
                   OM_ETOOBIG);
  assert_int_equal(om_sse_parser_feed(p, "data: 1\n\n", 9, record, &o),
                   OM_ETOOBIG);
  assert_int_equal(o.len, 0);
  /* Reset: a new stream; the event source's state is kept. */
  assert_int_equal(om_sse_parser_reset(p), 0);
  assert_string_equal(om_sse_parser_last_event_id(p, NULL), "x");
  assert_int_equal(om_sse_parser_retry_ms(p), 5);
  /* A BOM is stripped again, and the partial event is gone. */
  assert_int_equal(om_sse_parser_feed(p,
                                      "\xEF\xBB\xBF"
                                      "data: 1\n\n",
                                      12, record, &o),
                   0);
  /* 9.2.6: the new stream's last event ID buffer started empty. */
  assert_string_equal(o.buf, "[message|1|]");
  assert_string_equal(om_sse_parser_last_event_id(p, NULL), "");
  om_sse_parser_free(p);
}

static int stop_at_first(void *ud, const om_sse_event_t *ev) {
  int *n = ud;
  (void)ev;
  return ++*n == 1 ? 7 : 0;
}

static void callback_can_stop(void **state) {
  om_sse_parser_t *p;
  int n = 0;
  (void)state;
  assert_int_equal(om_sse_parser_new(NULL, &p), 0);
  assert_int_equal(
      om_sse_parser_feed(p, "data: a\n\ndata: b\n\n", 18, stop_at_first, &n),
      7);
  assert_int_equal(n, 1);
  assert_int_equal(om_sse_parser_feed(p, "data: c\n\n", 9, stop_at_first, &n),
                   OM_ESTATE);
  assert_int_equal(om_sse_parser_reset(p), 0);
  assert_int_equal(om_sse_parser_feed(p, "data: c\n\n", 9, stop_at_first, &n),
                   0);
  assert_int_equal(n, 2);
  om_sse_parser_free(p);
}

typedef struct {
  om_sse_parser_t *p;
  int feed_rc, reset_rc;
} reenter_t;

static int reenter(void *ud, const om_sse_event_t *ev) {
  reenter_t *r = ud;
  (void)ev;
  r->feed_rc = om_sse_parser_feed(r->p, "x", 1, NULL, NULL);
  r->reset_rc = om_sse_parser_reset(r->p);
  return 0;
}

static void callback_cannot_reenter(void **state) {
  reenter_t r = {NULL, 0, 0};
  (void)state;
  assert_int_equal(om_sse_parser_new(NULL, &r.p), 0);
  assert_int_equal(om_sse_parser_feed(r.p, "data: a\n\n", 9, reenter, &r), 0);
  assert_int_equal(r.feed_rc, OM_ESTATE);
  assert_int_equal(r.reset_rc, OM_ESTATE);
  /* Nothing was disturbed. */
  assert_int_equal(om_sse_parser_feed(r.p, "id: 2\n\n", 7, NULL, NULL), 0);
  assert_string_equal(om_sse_parser_last_event_id(r.p, NULL), "2");
  om_sse_parser_free(r.p);
}

static void bad_arguments(void **state) {
  om_sse_parser_opts_t big = {OM_SSE_MAX_EVENT_BYTES_LIMIT + 1};
  om_sse_parser_t *p = (om_sse_parser_t *)&big;
  (void)state;
  assert_int_equal(om_sse_parser_new(NULL, NULL), OM_EINVAL);
  assert_int_equal(om_sse_parser_new(&big, &p), OM_EINVAL);
  assert_ptr_equal(p, (om_sse_parser_t *)&big); /* untouched */
  assert_int_equal(om_sse_parser_new(NULL, &p), 0);
  assert_int_equal(om_sse_parser_feed(NULL, "x", 1, NULL, NULL), OM_EINVAL);
  assert_int_equal(om_sse_parser_feed(p, NULL, 1, NULL, NULL), OM_EINVAL);
  assert_int_equal(om_sse_parser_feed(p, NULL, 0, NULL, NULL), 0);
  assert_int_equal(om_sse_parser_reset(NULL), OM_EINVAL);
  assert_int_equal(om_sse_parser_retry_ms(NULL), -1);
  om_sse_parser_free(p);
  om_sse_parser_free(NULL);
}

/* ---- reset and the stream state the callback sees ----------------------- */

static void feed_ok(om_sse_parser_t *p, const char *s, size_t n, out_t *o) {
  assert_int_equal(om_sse_parser_feed(p, s, n, record, o), 0);
}

#define FEED(p, lit, o) feed_ok(p, lit, sizeof(lit) - 1, o)

/*
 * A reset is a new stream (9.2.6: a stream's buffers start empty, and the
 * UTF-8 decode strips a leading BOM): nothing half-read in the old one
 * (a CR awaiting its LF, a cut BOM or UTF-8 sequence, a field name, a
 * value, pending buffers) leaks into it.
 */
static void reset_starts_a_clean_stream(void **state) {
  static out_t o;
  om_sse_parser_t *p;
  (void)state;
  o.len = 0;
  o.buf[0] = '\0';
  assert_int_equal(om_sse_parser_new(NULL, &p), 0);
  /* A pending CR: the new stream's first LF is a blank line of its own,
   * so the (empty) last event ID buffer is copied into the string. */
  FEED(p, "retry:9\nid:1\n\ndata:a\r", &o);
  assert_int_equal(om_sse_parser_reset(p), 0);
  assert_string_equal(om_sse_parser_last_event_id(p, NULL), "1");
  FEED(p, "\n", &o);
  assert_string_equal(om_sse_parser_last_event_id(p, NULL), "");
  assert_int_equal(o.len, 0); /* "data:a" was dropped with its stream */
  /* A cut BOM (at a stream start): the next stream starts at BF, which
   * is not a BOM. */
  assert_int_equal(om_sse_parser_reset(p), 0);
  FEED(p, "\xEF\xBB", &o);
  assert_int_equal(om_sse_parser_reset(p), 0);
  FEED(p,
       "\xBF"
       "data:x\n\n",
       &o);
  assert_int_equal(o.len, 0);
  /* A cut UTF-8 sequence: nothing of it carries over into a value. */
  FEED(p, "data:\xE2\x82", &o);
  assert_int_equal(om_sse_parser_reset(p), 0);
  FEED(p, "data:x\n\n", &o);
  assert_string_equal(o.buf, "[message|x|]");
  o.len = 0;
  o.buf[0] = '\0';
  /* A cut name, a cut retry value, pending type and data. */
  FEED(p, "da", &o);
  assert_int_equal(om_sse_parser_reset(p), 0);
  FEED(p, "ta:x\n\n", &o);
  FEED(p, "retry:12", &o);
  assert_int_equal(om_sse_parser_reset(p), 0);
  FEED(p, "3\n", &o);
  FEED(p, "event:t\ndata:a\n", &o);
  assert_int_equal(om_sse_parser_reset(p), 0);
  FEED(p, "data:b\n\n", &o);
  assert_string_equal(o.buf, "[message|b|]");
  /* The event source's reconnection time was kept throughout. */
  assert_int_equal(om_sse_parser_retry_ms(p), 9);
  om_sse_parser_free(p);
}

typedef struct {
  om_sse_parser_t *p;
  int64_t retry[4];
  int n;
} seen_t;

static int see_state(void *ud, const om_sse_event_t *ev) {
  seen_t *s = ud;
  size_t len;
  const char *id = om_sse_parser_last_event_id(s->p, &len);
  /* The event's id is the last event ID string as of this dispatch. */
  assert_int_equal(len, ev->id_len);
  assert_memory_equal(id, ev->id, len);
  if (s->n < 4)
    s->retry[s->n] = om_sse_parser_retry_ms(s->p);
  s->n++;
  return 0;
}

/* A retry line takes effect at its own line end, before the event after
 * it in the same chunk is dispatched; the getters are usable from the
 * callback. */
static void callback_sees_stream_state(void **state) {
  static const char in[] = "retry:5\nid:9\ndata:x\n\nretry:7\ndata:y\n\n"
                           "retry:x\nid\ndata:z\n\n";
  seen_t s = {NULL, {0}, 0};
  (void)state;
  assert_int_equal(om_sse_parser_new(NULL, &s.p), 0);
  assert_int_equal(om_sse_parser_feed(s.p, in, sizeof in - 1, see_state, &s),
                   0);
  assert_int_equal(s.n, 3);
  assert_int_equal(s.retry[0], 5);
  assert_int_equal(s.retry[1], 7);
  assert_int_equal(s.retry[2], 7);
  om_sse_parser_free(s.p);
}

/* ---- a reference: 9.2.6 read literally, on the whole stream at once ---- */

typedef struct {
  char *p;
  size_t len, cap;
} rstr_t;

static void rput(rstr_t *s, const void *src, size_t n) {
  if (s->len + n + 1 > s->cap) {
    s->cap = (s->len + n + 1) * 2;
    s->p = realloc(s->p, s->cap);
    assert_non_null(s->p);
  }
  memcpy(s->p + s->len, src, n);
  s->len += n;
}

/* The WHATWG UTF-8 decoder, step by step, with "restore byte". */
static void ref_decode(const unsigned char *in, size_t len, rstr_t *out) {
  unsigned need = 0, seen = 0, lo = 0x80, hi = 0xBF;
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i == len) {
      if (need != 0)
        rput(out, "\xef\xbf\xbd", 3);
      break;
    }
    unsigned b = in[i];
    if (need == 0) {
      if (b <= 0x7F) {
        rput(out, &in[i], 1);
      } else if (b >= 0xC2 && b <= 0xDF) {
        need = 1, start = i;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0)
          lo = 0xA0;
        if (b == 0xED)
          hi = 0x9F;
        need = 2, start = i;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0)
          lo = 0x90;
        if (b == 0xF4)
          hi = 0x8F;
        need = 3, start = i;
      } else {
        rput(out, "\xef\xbf\xbd", 3);
      }
      continue;
    }
    if (b < lo || b > hi) {
      need = seen = 0, lo = 0x80, hi = 0xBF;
      rput(out, "\xef\xbf\xbd", 3);
      i--; /* restore the byte */
      continue;
    }
    lo = 0x80, hi = 0xBF;
    if (++seen == need) {
      rput(out, &in[start], need + 1);
      need = seen = 0;
    }
  }
}

static void reference(const char *in, size_t len, out_t *o) {
  rstr_t text = {0}, data = {0}, type = {0}, idbuf = {0}, last = {0};
  long long retry = -1;
  size_t i = 0;
  char tail[64];
  o->len = 0;
  o->buf[0] = '\0';
  if (len >= 3 && memcmp(in, "\xEF\xBB\xBF", 3) == 0)
    in += 3, len -= 3;
  ref_decode((const unsigned char *)in, len, &text);
  rput(&data, "", 0);
  rput(&type, "", 0);
  rput(&idbuf, "", 0);
  rput(&last, "", 0);
  while (i < text.len) {
    size_t s = i, e, next, colon;
    const char *line;
    while (i < text.len && text.p[i] != '\r' && text.p[i] != '\n')
      i++;
    if (i == text.len)
      break; /* not a line: no line end yet */
    e = i;
    next = i + 1;
    if (text.p[i] == '\r' && next < text.len && text.p[next] == '\n')
      next++;
    i = next;
    line = text.p + s;
    if (e == s) { /* dispatch */
      last.len = 0;
      rput(&last, idbuf.p, idbuf.len);
      if (data.len == 0) {
        type.len = 0;
        continue;
      }
      data.len--;
      out_str(o, "[");
      if (type.len != 0)
        out_esc(o, type.p, type.len);
      else
        out_str(o, "message");
      out_str(o, "|");
      out_esc(o, data.p, data.len);
      out_str(o, "|");
      out_esc(o, last.p, last.len);
      out_str(o, "]");
      data.len = type.len = 0;
      continue;
    }
    if (line[0] == ':')
      continue;
    for (colon = 0; colon < e - s && line[colon] != ':'; colon++)
      ;
    {
      const char *name = line, *val = line + colon + 1;
      size_t nlen = colon, vlen = colon < e - s ? e - s - colon - 1 : 0;
      if (vlen > 0 && val[0] == ' ')
        val++, vlen--;
      if (nlen == 5 && memcmp(name, "event", 5) == 0) {
        type.len = 0;
        rput(&type, val, vlen);
      } else if (nlen == 4 && memcmp(name, "data", 4) == 0) {
        rput(&data, val, vlen);
        rput(&data, "\n", 1);
      } else if (nlen == 2 && memcmp(name, "id", 2) == 0) {
        if (vlen == 0 || memchr(val, 0, vlen) == NULL) {
          idbuf.len = 0;
          rput(&idbuf, val, vlen);
        }
      } else if (nlen == 5 && memcmp(name, "retry", 5) == 0) {
        size_t k;
        long long v = 0;
        for (k = 0; k < vlen && val[k] >= '0' && val[k] <= '9'; k++)
          v = v > (INT64_MAX - (val[k] - '0')) / 10 ? INT64_MAX
                                                    : v * 10 + (val[k] - '0');
        if (vlen > 0 && k == vlen)
          retry = v;
      }
    }
  }
  out_str(o, " last=");
  out_esc(o, last.p, last.len);
  snprintf(tail, sizeof tail, " retry=%lld", retry);
  out_str(o, tail);
  free(text.p);
  free(data.p);
  free(type.p);
  free(idbuf.p);
  free(last.p);
}

/* A random stream from tokens that hit every rule and every edge. */
static size_t random_stream(om_rng_t *rng, char *buf, size_t cap) {
  static const char *const tok[] = {"data",
                                    "data:",
                                    "data: ",
                                    "event:",
                                    "event: ",
                                    "id:",
                                    "id: ",
                                    "id",
                                    "retry:",
                                    "retry: ",
                                    "event",
                                    "Data:",
                                    ":",
                                    " ",
                                    "  ",
                                    "x",
                                    "yz",
                                    "123",
                                    "7",
                                    "\n",
                                    "\n",
                                    "\n",
                                    "\r",
                                    "\r\n",
                                    "\n\n",
                                    "\r\r",
                                    "\xEF\xBB\xBF",
                                    "\xEF",
                                    "\xBB",
                                    "\xBF",
                                    "\xE2\x82\xAC",
                                    "\xE2\x82",
                                    "\xC3",
                                    "\xA9",
                                    "\xF0\x9F\x98\x80",
                                    "\xF0\x9F",
                                    "\x80",
                                    "\xFF",
                                    "\xED\xA0\x80",
                                    "\xF4\x90",
                                    "\0",
                                    "foo:",
                                    "da",
                                    "ta:"};
  size_t ntok = sizeof tok / sizeof tok[0], len = 0;
  uint32_t n = 1 + om_rng_below(rng, 120);
  for (uint32_t i = 0; i < n; i++) {
    const char *t = tok[om_rng_below(rng, (uint32_t)ntok)];
    size_t tl = t[0] == '\0' ? 1 : strlen(t); /* "\0" is one NUL byte */
    if (len + tl > cap)
      break;
    memcpy(buf + len, t, tl);
    len += tl;
  }
  return len;
}

static void matches_reference_on_random_streams(void **state) {
  static out_t want, got;
  static char in[4096];
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 20240601);
  for (int iter = 0; iter < 3000; iter++) {
    size_t len = random_stream(&rng, in, sizeof in);
    int mode = iter % 3;
    reference(in, len, &want);
    transcript(in, len, mode, (uint64_t)iter, 0, &got);
    if (strcmp(want.buf, got.buf) != 0) {
      static out_t shown;
      shown.len = 0;
      out_esc(&shown, in, len < 2000 ? len : 2000);
      fail_msg("stream #%d (mode %d): %s\n  got  %s\n  want %s", iter, mode,
               shown.buf, got.buf, want.buf);
    }
  }
}

/* Every chunking gives the same transcript, failures included. */
static void chunking_invariance(void **state) {
  static out_t whole, other;
  static char in[4096];
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 7);
  for (int iter = 0; iter < 1500; iter++) {
    size_t len = random_stream(&rng, in, sizeof in);
    size_t max = iter % 2 ? 12 : 0; /* half with a tiny cap that trips */
    transcript(in, len, WHOLE, 0, max, &whole);
    transcript(in, len, BYTES, 0, max, &other);
    assert_string_equal(other.buf, whole.buf);
    transcript(in, len, RANDOM, (uint64_t)iter, max, &other);
    assert_string_equal(other.buf, whole.buf);
  }
}

/* ---- linear work ---------------------------------------------------- */

typedef struct {
  size_t events, bytes;
  const char *want;
  size_t want_len;
} big_t;

static int check_big(void *ud, const om_sse_event_t *ev) {
  big_t *b = ud;
  b->events++;
  b->bytes += ev->data_len;
  assert_int_equal(ev->data_len, b->want_len);
  assert_memory_equal(ev->data, b->want, b->want_len);
  return 0;
}

static void feed_in_chunks(om_sse_parser_t *p, const char *s, size_t len,
                           size_t chunk, big_t *b) {
  for (size_t off = 0; off < len; off += chunk) {
    size_t n = len - off < chunk ? len - off : chunk;
    assert_int_equal(om_sse_parser_feed(p, s + off, n, check_big, b), 0);
  }
}

/*
 * A 16 MiB event in 64-byte chunks: 262144 feeds. A parser that rescans
 * what it buffered would do ~2^37 byte visits here and never finish; the
 * work counter must stay within a small multiple of the input.
 */
static void sixteen_mib_in_64_byte_chunks(void **state) {
  const size_t n = (size_t)16 << 20;
  om_sse_parser_opts_t opts = {n + 1024};
  om_sse_parser_t *p;
  char *in = malloc(n + 16), *want = malloc(n);
  big_t b = {0, 0, want, n};
  size_t len = 0;
  uint64_t work;
  (void)state;
  assert_non_null(in);
  assert_non_null(want);
  assert_int_equal(om_sse_parser_new(&opts, &p), 0);
  /* One line of 16 MiB. */
  memcpy(in, "data: ", 6);
  len = 6;
  for (size_t i = 0; i < n; i++)
    want[i] = (char)('a' + i % 26);
  memcpy(in + len, want, n);
  len += n;
  memcpy(in + len, "\n\n", 2);
  len += 2;
  feed_in_chunks(p, in, len, 64, &b);
  assert_int_equal(b.events, 1);
  work = om__sse_parser_work(p);
  OM_TEST_NOTE("work for a 16 MiB line: %llu for %zu bytes",
               (unsigned long long)work, len);
  OM_ASSERT_CMP(work, <=, 3 * (uint64_t)len);
  om_sse_parser_free(p);

  /* 16 MiB of data made of 8-byte lines (2M of them), 64-byte chunks. */
  assert_int_equal(om_sse_parser_new(&opts, &p), 0);
  len = 0;
  for (size_t i = 0; i < n / 8; i++) {
    memcpy(in + len, "data:abc", 8); /* with the LF: 9 bytes */
    in[len + 8] = '\n';
    len += 9;
    if (len + 9 > n + 16 - 2)
      break;
  }
  {
    size_t lines = len / 9;
    in[len++] = '\n';
    for (size_t i = 0; i < lines; i++)
      memcpy(want + 4 * i, "abc\n", 4);
    b.want_len = 4 * lines - 1;
    b.events = 0;
    feed_in_chunks(p, in, len, 64, &b);
    assert_int_equal(b.events, 1);
  }
  work = om__sse_parser_work(p);
  OM_TEST_NOTE("work for 8-byte lines: %llu for %zu bytes",
               (unsigned long long)work, len);
  OM_ASSERT_CMP(work, <=, 3 * (uint64_t)len);
  om_sse_parser_free(p);
  free(in);
  free(want);
}

/* ---- fault injection --------------------------------------------------- */

static void fault_injection_new(void **state) {
  (void)state;
  for (long n = 0;; n++) {
    om_sse_parser_t *p = NULL;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_sse_parser_new(NULL, &p);
    om_test_alloc_reset();
    if (rc == 0) {
      OM_ASSERT_CMP(n, >=, 2); /* the parser and its data buffer */
      om_sse_parser_free(p);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(p);
  }
}

/* Every buffer grows here: data, event type, id value, last event ID. */
static void fault_injection_growth(void **state) {
  static char in[16384];
  static out_t o, want;
  size_t len = 0;
  int failures_seen = 0;
  (void)state;
  len += (size_t)sprintf(in + len, "event: ");
  memset(in + len, 'e', 300), len += 300;
  len += (size_t)sprintf(in + len, "\nid: ");
  memset(in + len, 'i', 300), len += 300;
  len += (size_t)sprintf(in + len, "\ndata: ");
  memset(in + len, 'd', 9000), len += 9000;
  len += (size_t)sprintf(in + len, "\n\n");
  transcript(in, len, WHOLE, 0, 0, &want);
  for (long n = 0;; n++) {
    for (int mode = WHOLE; mode <= BYTES; mode++) {
      om_sse_parser_t *p;
      int rc = 0;
      o.len = 0;
      o.buf[0] = '\0';
      assert_int_equal(om_sse_parser_new(NULL, &p), 0);
      om_test_fail_alloc_after(n);
      for (size_t off = 0; off < len && rc == 0;) {
        size_t k = mode == WHOLE ? len : 1;
        rc = om_sse_parser_feed(p, in + off, k, record, &o);
        off += k;
      }
      om_test_alloc_reset();
      if (rc != 0) {
        assert_int_equal(rc, OM_ENOMEM);
        assert_int_equal(om_sse_parser_feed(p, "\n", 1, record, &o), OM_ENOMEM);
        /* After a reset the same parser parses the stream. */
        assert_int_equal(om_sse_parser_reset(p), 0);
        o.len = 0;
        assert_int_equal(om_sse_parser_feed(p, in, len, record, &o), 0);
        failures_seen++;
      }
      {
        size_t idlen, wl = (size_t)(strstr(want.buf, " last=") - want.buf);
        const char *id = om_sse_parser_last_event_id(p, &idlen);
        assert_int_equal(idlen, 300);
        assert_int_equal(id[0], 'i');
        assert_int_equal(o.len, wl);
        assert_memory_equal(o.buf, want.buf, wl);
      }
      om_sse_parser_free(p);
      if (rc == 0 && mode == BYTES) {
        OM_ASSERT_CMP(failures_seen, >, 0);
        return;
      }
    }
  }
}

/* ---- the writer -------------------------------------------------------- */

static void encode_expect(const om_sse_event_t *ev, const char *want) {
  char buf[256];
  size_t need = 0;
  assert_int_equal(om_sse_encode(ev, buf, sizeof buf, &need), 0);
  assert_int_equal(need, strlen(want));
  assert_memory_equal(buf, want, need);
}

static void writer_format(void **state) {
  om_sse_event_t ev = {"update", 6, "a\nb", 3, "42", 2, 1500};
  (void)state;
  encode_expect(&ev,
                "event: update\nid: 42\nretry: 1500\ndata: a\ndata: b\n\n");
  /* Defaults: no type, no id, no retry. */
  ev = (om_sse_event_t){NULL, 0, "x", 1, NULL, 0, -1};
  encode_expect(&ev, "data: x\n\n");
  /* Empty data is one empty data line; no data is no data line. */
  ev = (om_sse_event_t){NULL, 0, "", 0, NULL, 0, -1};
  encode_expect(&ev, "data:\n\n");
  ev = (om_sse_event_t){NULL, 0, NULL, 0, "7", 1, 0};
  encode_expect(&ev, "id: 7\nretry: 0\n\n");
  /* An empty id resets the receiver's. */
  ev = (om_sse_event_t){NULL, 0, NULL, 0, "", 0, -1};
  encode_expect(&ev, "id:\n\n");
  /* A leading space survives: the receiver removes exactly one. */
  ev = (om_sse_event_t){" t", 2, " x", 2, " i", 2, -1};
  encode_expect(&ev, "event:  t\nid:  i\ndata:  x\n\n");
  /* CR, CRLF and LF each break a line; a final break leaves an empty
   * line so the data's trailing LF survives. */
  ev = (om_sse_event_t){NULL, 0, "a\rb\r\nc\n", 7, NULL, 0, -1};
  encode_expect(&ev, "data: a\ndata: b\ndata: c\ndata:\n\n");
  ev = (om_sse_event_t){NULL, 0, "\r\n\r", 3, NULL, 0, -1};
  encode_expect(&ev, "data:\ndata:\ndata:\n\n");
  ev = (om_sse_event_t){NULL, 0, "x", 1, NULL, 0, INT64_MAX};
  encode_expect(&ev, "retry: 9223372036854775807\ndata: x\n\n");
  /* The whole block, including NUL in data and a colon-led value. */
  ev = (om_sse_event_t){"a:b", 3, ":\0z", 3, ":", 1, -1};
  {
    char buf[64];
    size_t need;
    static const char want[] = "event: a:b\nid: :\ndata: :\0z\n\n";
    assert_int_equal(om_sse_encode(&ev, buf, sizeof buf, &need), 0);
    assert_int_equal(need, sizeof want - 1);
    assert_memory_equal(buf, want, need);
  }
}

static void writer_rejects_what_would_break_the_stream(void **state) {
  static const struct {
    om_sse_event_t ev;
    const char *why;
  } bad[] = {
      {{"a\nb", 3, "x", 1, NULL, 0, -1}, "LF in type"},
      {{"a\rb", 3, "x", 1, NULL, 0, -1}, "CR in type"},
      {{NULL, 0, "x", 1, "1\n", 2, -1}, "LF in id"},
      {{NULL, 0, "x", 1, "1\r", 2, -1}, "CR in id"},
      {{NULL, 0, "x", 1, "1\0", 2, -1}, "NUL in id"},
      {{"\xff", 1, "x", 1, NULL, 0, -1}, "invalid UTF-8 in type"},
      {{NULL, 0, "x", 1, "\xc3", 1, -1}, "cut UTF-8 in id"},
      {{NULL, 0, "ok\xed\xa0\x80", 5, NULL, 0, -1}, "surrogate in data"},
      {{NULL, 0, "\xc0\xaf", 2, NULL, 0, -1}, "overlong in data"},
      {{"t", 1, NULL, 0, NULL, 0, -1}, "type without data"},
      {{NULL, 3, "x", 1, NULL, 0, -1}, "NULL type with a length"},
      {{NULL, 0, NULL, 2, NULL, 0, -1}, "NULL data with a length"},
      {{NULL, 0, "x", 1, NULL, 2, -1}, "NULL id with a length"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char buf[64] = "canary";
    size_t need = 99;
    char *out = NULL;
    size_t len = 99;
    int rc = om_sse_encode(&bad[i].ev, buf, sizeof buf, &need);
    if (rc != OM_EINVAL)
      fail_msg("%s: rc %d, want OM_EINVAL", bad[i].why, rc);
    assert_string_equal(buf, "canary");
    assert_int_equal(need, 99);
    assert_int_equal(om_sse_encode_alloc(&bad[i].ev, &out, &len), OM_EINVAL);
    assert_null(out);
    assert_int_equal(len, 99);
  }
  assert_int_equal(om_sse_encode(NULL, NULL, 0, NULL), OM_EINVAL);
  {
    om_sse_event_t ok = {NULL, 0, "x", 1, NULL, 0, -1};
    assert_int_equal(om_sse_encode(&ok, NULL, 5, NULL), OM_EINVAL);
    assert_int_equal(om_sse_encode_alloc(&ok, NULL, NULL), OM_EINVAL);
  }
}

static void writer_too_small_writes_nothing(void **state) {
  om_sse_event_t ev = {NULL, 0, "hello", 5, NULL, 0, -1};
  char buf[16];
  size_t need = 0;
  (void)state;
  /* A sizing call. */
  assert_int_equal(om_sse_encode(&ev, NULL, 0, &need), OM_ETOOBIG);
  assert_int_equal(need, 13);
  memset(buf, '#', sizeof buf);
  assert_int_equal(om_sse_encode(&ev, buf, 12, &need), OM_ETOOBIG);
  assert_int_equal(need, 13);
  for (size_t i = 0; i < sizeof buf; i++)
    assert_int_equal(buf[i], '#');
  assert_int_equal(om_sse_encode(&ev, buf, 13, &need), 0);
  assert_memory_equal(buf, "data: hello\n\n", 13);
}

static void writer_alloc_fault_injection(void **state) {
  om_sse_event_t ev = {"t", 1, "a\nb", 3, "1", 1, 5};
  (void)state;
  for (long n = 0;; n++) {
    char *out = NULL;
    size_t len = 0;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_sse_encode_alloc(&ev, &out, &len);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_string_equal(out, "event: t\nid: 1\nretry: 5\ndata: a\ndata: "
                               "b\n\n");
      assert_int_equal(len, strlen(out));
      free(out);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(out);
  }
}

/* Random valid UTF-8 from pieces, with or without line breaks and NUL. */
static size_t random_text(om_rng_t *rng, char *buf, size_t cap, int breaks,
                          int nul) {
  static const char *const piece[] = {"a",
                                      "Z",
                                      " ",
                                      ":",
                                      "data: ",
                                      "id",
                                      "\xc3\xa9",
                                      "\xe2\x82\xac",
                                      "\xf0\x9f\x98\x80",
                                      "\xef\xbb\xbf",
                                      "\xed\x9f\xbf",
                                      "\xf4\x8f\xbf\xbf",
                                      "\t",
                                      "\n",
                                      "\r",
                                      "\r\n",
                                      "\0"};
  size_t np = sizeof piece / sizeof piece[0], len = 0;
  uint32_t n = om_rng_below(rng, 12);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t k = om_rng_below(rng, (uint32_t)np);
    const char *t = piece[k];
    size_t tl = k == np - 1 ? 1 : strlen(t);
    if ((!breaks && (k >= np - 4 && k <= np - 2)) || (!nul && k == np - 1))
      continue;
    if (len + tl > cap)
      break;
    memcpy(buf + len, t, tl);
    len += tl;
  }
  return len;
}

/* What the receiver must reconstruct: CR and CRLF read as LF. */
static size_t normalize(const char *s, size_t n, char *out) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\r') {
      out[k++] = '\n';
      if (i + 1 < n && s[i + 1] == '\n')
        i++;
    } else {
      out[k++] = s[i];
    }
  }
  return k;
}

static void writer_round_trip(void **state) {
  static char stream[1 << 16];
  static out_t want, got;
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 99);
  for (int iter = 0; iter < 400; iter++) {
    size_t len = 0;
    char last[64] = "";
    size_t last_len = 0;
    want.len = 0;
    want.buf[0] = '\0';
    for (int e = 0; e < 5; e++) {
      char type[64], id[64], data[128], norm[128];
      om_sse_event_t ev;
      size_t need;
      ev.type = type;
      ev.type_len = random_text(&rng, type, sizeof type, 0, 1);
      ev.data = data;
      ev.data_len = random_text(&rng, data, sizeof data, 1, 1);
      ev.id = om_rng_below(&rng, 2) ? id : NULL;
      ev.id_len = ev.id != NULL ? random_text(&rng, id, sizeof id, 0, 0) : 0;
      ev.retry_ms = om_rng_below(&rng, 4) == 0 ? (int64_t)iter : -1;
      assert_int_equal(
          om_sse_encode(&ev, stream + len, sizeof stream - len, &need), 0);
      len += need;
      if (ev.id != NULL) {
        memcpy(last, id, ev.id_len);
        last_len = ev.id_len;
      }
      out_str(&want, "[");
      if (ev.type_len != 0)
        out_esc(&want, type, ev.type_len);
      else
        out_str(&want, "message");
      out_str(&want, "|");
      out_esc(&want, norm, normalize(data, ev.data_len, norm));
      out_str(&want, "|");
      out_esc(&want, last, last_len);
      out_str(&want, "]");
    }
    transcript(stream, len, iter % 3, (uint64_t)iter, 0, &got);
    if (strncmp(got.buf, want.buf, want.len) != 0 ||
        strncmp(got.buf + want.len, " last=", 6) != 0)
      fail_msg("round trip #%d:\n  got  %s\n  want %s", iter, got.buf,
               want.buf);
  }
}

/* ---- the Lua face under memory pressure -------------------------------- */

typedef struct {
  long budget; /* growing allocations left; -1: unlimited */
} lua_limit_t;

static void *limited_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  lua_limit_t *l = ud;
  if (nsize == 0) {
    free(ptr);
    return NULL;
  }
  if (l->budget >= 0 && (ptr == NULL || nsize > osize)) {
    if (l->budget == 0)
      return NULL;
    l->budget--;
  }
  return realloc(ptr, nsize);
}

/*
 * The binding builds event tables from inside core's callback; an
 * allocation failure there must surface as a Lua error after core has
 * returned, never longjmp through the parser, and leak nothing (ASan).
 */
static void lua_binding_out_of_memory(void **state) {
  static const char script[] =
      "local om = require 'openmesh'\n"
      "local sp = om.sse.parser()\n"
      "local n = 0\n"
      "for i = 1, 3 do\n"
      "  local evs = assert(sp:feed(('id: 1\\ndata: x\\n\\n'):rep(20)))\n"
      "  n = n + #evs\n"
      "end\n"
      "local s = om.sse.encode{type = 't', id = '1', data = ('y'):rep(300)}\n"
      "sp:close()\n"
      "return n .. ':' .. #s\n";
  int failures = 0;
  (void)state;
  for (long n = 0;; n++) {
    lua_limit_t lim = {-1};
    lua_State *L = lua_newstate(limited_alloc, &lim);
    int rc;
    assert_non_null(L);
    luaL_openlibs(L);
    luaL_requiref(L, "openmesh", luaopen_openmesh, 0);
    lua_pop(L, 1);
    assert_int_equal(luaL_loadstring(L, script), LUA_OK);
    lim.budget = n;
    rc = lua_pcall(L, 0, 1, 0);
    lim.budget = -1;
    if (rc == LUA_OK) {
      assert_string_equal(lua_tostring(L, -1), "60:323");
      lua_close(L);
      OM_TEST_NOTE("Lua allocation failures survived: %d", failures);
      OM_ASSERT_CMP(failures, >, 10);
      return;
    }
    failures++;
    if (rc != LUA_ERRMEM) {
      const char *msg = lua_tostring(L, -1);
      assert_non_null(msg);
      if (strstr(msg, "not enough memory") == NULL)
        fail_msg("allocation %ld: %s", n, msg);
    }
    lua_close(L);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(stock_examples),
      cmocka_unit_test(bom_stripped_once_at_start),
      cmocka_unit_test(line_endings),
      cmocka_unit_test(crlf_split_explicitly),
      cmocka_unit_test(comments),
      cmocka_unit_test(fields_without_colon),
      cmocka_unit_test(one_leading_space),
      cmocka_unit_test(data_lines_joined_with_lf),
      cmocka_unit_test(event_type_buffer),
      cmocka_unit_test(empty_data_no_dispatch),
      cmocka_unit_test(last_event_id),
      cmocka_unit_test(retry_field),
      cmocka_unit_test(names_are_case_sensitive),
      cmocka_unit_test(unterminated_event_discarded),
      cmocka_unit_test(utf8_replacement),
      cmocka_unit_test(cap_bounds_buffering),
      cmocka_unit_test(cap_ignores_unbuffered_lines),
      cmocka_unit_test(cap_failure_is_sticky_until_reset),
      cmocka_unit_test(callback_can_stop),
      cmocka_unit_test(callback_cannot_reenter),
      cmocka_unit_test(bad_arguments),
      cmocka_unit_test(reset_starts_a_clean_stream),
      cmocka_unit_test(callback_sees_stream_state),
      cmocka_unit_test(matches_reference_on_random_streams),
      cmocka_unit_test(chunking_invariance),
      cmocka_unit_test(sixteen_mib_in_64_byte_chunks),
      cmocka_unit_test(fault_injection_new),
      cmocka_unit_test(fault_injection_growth),
      cmocka_unit_test(writer_format),
      cmocka_unit_test(writer_rejects_what_would_break_the_stream),
      cmocka_unit_test(writer_too_small_writes_nothing),
      cmocka_unit_test(writer_alloc_fault_injection),
      cmocka_unit_test(writer_round_trip),
      cmocka_unit_test(lua_binding_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
