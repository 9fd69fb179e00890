/*
 * test_sse_whatwg.c: the event-stream parser (core/om_sse.h) held to the
 * WHATWG HTML Living Standard, 9.2.5 "Parsing an event stream" and 9.2.6
 * "Interpreting an event stream", one test per rule, plus combinations.
 *
 * Every rule input is fed whole, byte by byte (also with empty feeds in
 * between), cut at every single point, cut at every pair of points (short
 * inputs), and cut at random; each chunk is its own exact-size heap copy,
 * so AddressSanitizer sees any read past a chunk. Hostile input (10 MiB
 * lines, a million tiny events, NUL bytes, lone CRs, invalid UTF-8 floods)
 * checks that the buffering bound holds and that unbuffered lines allocate
 * nothing. Last, a differential test: an independent reading of the
 * standard, literal and whole-buffer (decode to code points, split lines,
 * process fields), against the parser on thousands of random streams in
 * random chunkings.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_rng.h"
#include "om_sse.h"

/* ---- a growable byte string ------------------------------------------- */

typedef struct {
  char *p;
  size_t len, cap;
} sb_t;

static void sb_raw(sb_t *s, const void *src, size_t n) {
  if (s->len + n + 1 > s->cap) {
    size_t cap = s->cap != 0 ? s->cap : 256;
    char *np;
    while (cap < s->len + n + 1)
      cap *= 2;
    np = realloc(s->p, cap);
    assert_non_null(np);
    s->p = np;
    s->cap = cap;
  }
  if (n != 0)
    memcpy(s->p + s->len, src, n);
  s->len += n;
  s->p[s->len] = '\0';
}

static void sb_str(sb_t *s, const char *z) {
  sb_raw(s, z, strlen(z));
}

static void sb_clear(sb_t *s) {
  s->len = 0;
  sb_raw(s, "", 0);
}

static void sb_free(sb_t *s) {
  free(s->p);
  s->p = NULL;
  s->len = s->cap = 0;
}

/* Printable ASCII as is; \n \r \\ and every other byte as \xHH. */
static void sb_esc(sb_t *s, const char *src, size_t n) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)src[i];
    char e[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
    if (c == '\n')
      sb_str(s, "\\n");
    else if (c == '\r')
      sb_str(s, "\\r");
    else if (c == '\\')
      sb_str(s, "\\\\");
    else if (c >= 0x20 && c < 0x7f)
      sb_raw(s, &c, 1);
    else
      sb_raw(s, e, 4);
  }
}

/* ---- feeding: every chunk in its own exact-size heap block ------------- */

typedef struct {
  om_sse_parser_t *p;
  sb_t out;
  long events;
} ctx_t;

static int record(void *ud, const om_sse_event_t *ev) {
  ctx_t *c = ud;
  /* The views the header promises: never NULL, NUL-terminated. */
  assert_non_null(ev->type);
  assert_non_null(ev->data);
  assert_non_null(ev->id);
  assert_int_equal(ev->type[ev->type_len], '\0');
  assert_int_equal(ev->data[ev->data_len], '\0');
  assert_int_equal(ev->id[ev->id_len], '\0');
  assert_int_equal(ev->retry_ms, -1);
  sb_str(&c->out, "[");
  sb_esc(&c->out, ev->type, ev->type_len);
  sb_str(&c->out, "|");
  sb_esc(&c->out, ev->data, ev->data_len);
  sb_str(&c->out, "|");
  sb_esc(&c->out, ev->id, ev->id_len);
  sb_str(&c->out, "]");
  c->events++;
  return 0;
}

static int feed_copy(om_sse_parser_t *p, const char *src, size_t n,
                     om_sse_event_cb cb, void *ud) {
  char *chunk;
  int rc;
  if (n == 0)
    return om_sse_parser_feed(p, NULL, 0, cb, ud);
  chunk = malloc(n);
  assert_non_null(chunk);
  memcpy(chunk, src, n);
  rc = om_sse_parser_feed(p, chunk, n, cb, ud);
  free(chunk);
  return rc;
}

/*
 * Feed in[0, len) cut at cuts[0..ncuts) (ascending, inside (0, len)); with
 * empties, an empty feed goes between any two chunks. Stops at the first
 * failure and returns it.
 */
static int feed_cuts(om_sse_parser_t *p, const char *in, size_t len,
                     const size_t *cuts, size_t ncuts, int empties,
                     om_sse_event_cb cb, void *ud) {
  size_t off = 0;
  for (size_t i = 0; i <= ncuts; i++) {
    size_t end = i < ncuts ? cuts[i] : len;
    int rc = feed_copy(p, in + off, end - off, cb, ud);
    if (rc != 0)
      return rc;
    if (empties && (rc = feed_copy(p, NULL, 0, cb, ud)) != 0)
      return rc;
    off = end;
  }
  return 0;
}

/*
 * The transcript of one parse: the events as [type|data|id], "!ECODE" if
 * feeding failed, then " last=<last event ID string> retry=<ms>".
 */
static void transcript(const char *in, size_t len, const size_t *cuts,
                       size_t ncuts, int empties, size_t max, sb_t *out) {
  om_sse_parser_opts_t opts = {max};
  ctx_t c = {NULL, {0}, 0};
  size_t idlen;
  const char *id;
  char tail[64];
  int rc;
  assert_int_equal(om_sse_parser_new(&opts, &c.p), 0);
  sb_clear(&c.out);
  rc = feed_cuts(c.p, in, len, cuts, ncuts, empties, record, &c);
  if (rc != 0) {
    sb_str(&c.out, "!");
    sb_str(&c.out, om_err_name(rc));
  }
  id = om_sse_parser_last_event_id(c.p, &idlen);
  sb_str(&c.out, " last=");
  sb_esc(&c.out, id, idlen);
  snprintf(tail, sizeof tail, " retry=%lld",
           (long long)om_sse_parser_retry_ms(c.p));
  sb_str(&c.out, tail);
  om_sse_parser_free(c.p);
  sb_clear(out);
  sb_raw(out, c.out.p, c.out.len);
  sb_free(&c.out);
}

static void must_match(const char *in, size_t len, const size_t *cuts,
                       size_t ncuts, int empties, size_t max, const char *want,
                       const char *how) {
  sb_t got = {0}, shown = {0}, at = {0};
  transcript(in, len, cuts, ncuts, empties, max, &got);
  if (strcmp(got.p, want) != 0) {
    char num[32];
    sb_esc(&shown, in, len < 400 ? len : 400);
    for (size_t i = 0; i < ncuts && i < 40; i++) {
      snprintf(num, sizeof num, "%zu ", cuts[i]);
      sb_str(&at, num);
    }
    sb_str(&at, "");
    fail_msg("%s (cuts: %s): %s\n  got  %s\n  want %s", how, at.p, shown.p,
             got.p, want);
  }
  sb_free(&got);
  sb_free(&shown);
  sb_free(&at);
}

/* Every chunking of in gives want. */
static void check_max(const char *in, size_t len, size_t max,
                      const char *want) {
  size_t *cuts = malloc((len + 1) * sizeof *cuts);
  om_rng_t rng;
  assert_non_null(cuts);
  must_match(in, len, NULL, 0, 0, max, want, "whole");
  must_match(in, len, NULL, 0, 1, max, want, "whole, empty feeds");
  for (size_t i = 1; i < len; i++)
    cuts[i - 1] = i;
  if (len > 1) {
    must_match(in, len, cuts, len - 1, 0, max, want, "byte by byte");
    must_match(in, len, cuts, len - 1, 1, max, want,
               "byte by byte, empty feeds");
  }
  for (size_t i = 1; i < len; i++)
    must_match(in, len, &i, 1, 0, max, want, "one cut");
  if (len <= 64) {
    for (size_t i = 1; i < len; i++)
      for (size_t j = i + 1; j < len; j++) {
        size_t two[2] = {i, j};
        must_match(in, len, two, 2, 0, max, want, "two cuts");
      }
  }
  om_rng_seed(&rng, len);
  for (int round = 0; round < 16 && len > 1; round++) {
    size_t n = 0;
    for (size_t i = 1; i < len; i++)
      if (om_rng_below(&rng, 4) == 0)
        cuts[n++] = i;
    must_match(in, len, cuts, n, round & 1, max, want, "random cuts");
  }
  free(cuts);
}

#define CHECK(lit, want) check_max(lit, sizeof(lit) - 1, 0, want)
#define CHECK_MAX(lit, max, want) check_max(lit, sizeof(lit) - 1, max, want)
#define R "\\xef\\xbf\\xbd"    /* U+FFFD REPLACEMENT CHARACTER, escaped */
#define FEFF "\\xef\\xbb\\xbf" /* U+FEFF, escaped */
#define NONE " last= retry=-1" /* no event, nothing set */

/* ======================================================================
 * 9.2.6: "Streams must be decoded using the UTF-8 decode algorithm."
 * ====================================================================== */

static void utf8_valid_text_kept(void **state) {
  (void)state;
  /* 2-, 3- and 4-byte sequences in data, event type and id. */
  CHECK("event:\xC3\xA9\nid:\xE2\x82\xAC\ndata:\xF0\x9F\x98\x80\xC3\xA9\n\n",
        "[\\xc3\\xa9|\\xf0\\x9f\\x98\\x80\\xc3\\xa9|\\xe2\\x82\\xac] "
        "last=\\xe2\\x82\\xac retry=-1");
  /* The largest scalar value and the last before the surrogates. */
  CHECK("data:\xF4\x8F\xBF\xBF\xED\x9F\xBF\n\n",
        "[message|\\xf4\\x8f\\xbf\\xbf\\xed\\x9f\\xbf|]" NONE);
}

/* Decode "with replacement" (Encoding 4.1.1): invalid input is never
 * rejected; each maximal subpart becomes one U+FFFD. */
static void utf8_invalid_replaced_not_rejected(void **state) {
  (void)state;
  CHECK("data:\xFF\n\n", "[message|" R "|]" NONE);
  CHECK("data:\x80\xBF\n\n", "[message|" R R "|]" NONE);
  CHECK("data:\xC0\x80\n\n", "[message|" R R "|]" NONE); /* overlong */
  CHECK("data:\xE0\x9F\xBF\n\n", "[message|" R R R "|]" NONE);
  CHECK("data:\xED\xB0\x80\n\n", "[message|" R R R "|]" NONE); /* surrogate */
  CHECK("data:\xF4\x90\x80\x80\n\n", "[message|" R R R R "|]" NONE);
  CHECK("data:\xF5\x80\n\n", "[message|" R R "|]" NONE);
  CHECK("data:\xF0\x8F\xBF\xBF\n\n", "[message|" R R R R "|]" NONE);
  /* The same right after valid non-ASCII text (another decoding path). */
  CHECK("data:\xC3\xA9\xE0\x9F\xBF\xC3\xA9\xF0\x8F\xBF\xBF\xC3\xA9"
        "\xED\xA0\x80\xC3\xA9\xF4\x90\x80\x80\xC3\xA9\xC1\xBF\n\n",
        "[message|\\xc3\\xa9" R R R "\\xc3\\xa9" R R R R "\\xc3\\xa9" R R R
        "\\xc3\\xa9" R R R R "\\xc3\\xa9" R R "|]" NONE);
  /* The smallest valid 3- and 4-byte sequences. */
  CHECK("data:\xE0\xA0\x80\xF0\x90\x80\x80\n\n",
        "[message|\\xe0\\xa0\\x80\\xf0\\x90\\x80\\x80|]" NONE);
  /* A truncated sequence is one U+FFFD, and the byte after it is read
   * again on its own. */
  CHECK("data:\xE2\x82x\n\n", "[message|" R "x|]" NONE);
  CHECK("data:\xF0\x9F\x98\xC3\xA9\n\n", "[message|" R "\\xc3\\xa9|]" NONE);
  CHECK("data:\xC3\xC3\xA9\n\n", "[message|" R "\\xc3\\xa9|]" NONE);
  /* Cut by a line end: one U+FFFD, and the line end still ends the line. */
  CHECK("data:\xF0\x9F\x98\ndata:\xE2\x82\rdata:\xC3\r\n\n",
        "[message|" R "\\n" R "\\n" R "|]" NONE);
  /* In the event type and the id too. */
  CHECK("event:a\xFF\nid:\xC3\ndata:x\n\n",
        "[a" R "|x|" R "] last=" R " retry=-1");
}

/* Field names are decoded too: no invalid or non-ASCII byte ever turns a
 * name into a known one. */
static void utf8_in_field_names(void **state) {
  (void)state;
  CHECK("\xC3"
        "data:x\n\n",
        NONE);
  CHECK("d\xFF"
        "ata:x\n\n",
        NONE);
  CHECK("data\xC3:x\n\n", NONE);
  CHECK("\xEF\xBC\xA4"
        "ata:x\n\n",
        NONE); /* fullwidth D */
  CHECK("\xC3\n\ndata:ok\n\n", "[message|ok|]" NONE);
}

/* "The UTF-8 decode algorithm strips one leading UTF-8 Byte Order Mark
 * (BOM), if any." */
static void bom_stripped_at_stream_start(void **state) {
  (void)state;
  CHECK("\xEF\xBB\xBF"
        "data:a\n\n",
        "[message|a|]" NONE);
  CHECK("\xEF\xBB\xBF:comment\ndata:a\n\n", "[message|a|]" NONE);
  CHECK("\xEF\xBB\xBF\r\ndata:a\r\n\r\n", "[message|a|]" NONE);
  CHECK("\xEF\xBB\xBF", NONE);
  CHECK("\xEF\xBB\xBF\n\n\n", NONE);
}

static void bom_stripped_only_once(void **state) {
  (void)state;
  /* The second BOM is U+FEFF, part of the name "\uFEFFdata": ignored. */
  CHECK("\xEF\xBB\xBF\xEF\xBB\xBF"
        "data:a\n\ndata:b\n\n",
        "[message|b|]" NONE);
  /* Without a first BOM, the one there is the one stripped. */
  CHECK("\xEF\xBB\xBF"
        "data:a\n\n\xEF\xBB\xBF"
        "data:b\n\n",
        "[message|a|]" NONE);
}

static void bom_not_stripped_later(void **state) {
  (void)state;
  /* Not per event, not per line, not per chunk: only at the stream's
   * first byte. */
  CHECK("data:a\n\n\xEF\xBB\xBF"
        "data:b\n\n",
        "[message|a|]" NONE);
  CHECK(":c\n\xEF\xBB\xBF"
        "data:b\n\n",
        NONE);
  CHECK("\n\xEF\xBB\xBF"
        "data:b\n\n",
        NONE);
  /* Inside a value it is text. */
  CHECK("data:\xEF\xBB\xBF"
        "a\n\n",
        "[message|" FEFF "a|]" NONE);
  CHECK("data: \xEF\xBB\xBF\n\n", "[message|" FEFF "|]" NONE);
}

/* A BOM prefix that does not complete is ordinary (invalid) input. */
static void bom_partial_is_text(void **state) {
  (void)state;
  CHECK("\xEF\xBB"
        "data:a\n\ndata:b\n\n",
        "[message|b|]" NONE);
  CHECK("\xEF"
        "data:a\n\ndata:b\n\n",
        "[message|b|]" NONE);
  /* EF BB BE is U+FEFE, not a BOM. */
  CHECK("\xEF\xBB\xBE"
        "data:a\n\ndata:b\n\n",
        "[message|b|]" NONE);
  /* EF then a real BOM: U+FFFD U+FEFF, a name. */
  CHECK("\xEF\xEF\xBB\xBF"
        "data:a\n\ndata:b\n\n",
        "[message|b|]" NONE);
  /* A cut BOM ended by a line end is a non-empty line, not a blank one. */
  CHECK("\xEF\xBB\ndata:a\n\n", "[message|a|]" NONE);
  CHECK("\xEF\xBB", NONE);
  CHECK("\xEF\xBB\r\n\xEF\xBB\xBF"
        "data:a\n\ndata:b\n\n",
        "[message|b|]" NONE);
}

typedef struct {
  const char *s;
  size_t n;
} piece_t;

#define P(lit)                                                                 \
  { lit, sizeof(lit) - 1 }

/* Feed pieces one per call into one parser; return the transcript. */
static void feed_pieces(om_sse_parser_t *p, const piece_t *pc, size_t n,
                        ctx_t *c) {
  for (size_t i = 0; i < n; i++) {
    if (pc[i].s == NULL) { /* a reset between pieces: a new stream */
      assert_int_equal(om_sse_parser_reset(p), 0);
      continue;
    }
    assert_int_equal(feed_copy(p, pc[i].s, pc[i].n, record, c), 0);
  }
}

static void expect_pieces(const piece_t *pc, size_t n, const char *want) {
  ctx_t c = {NULL, {0}, 0};
  assert_int_equal(om_sse_parser_new(NULL, &c.p), 0);
  sb_clear(&c.out);
  feed_pieces(c.p, pc, n, &c);
  assert_string_equal(c.out.p, want);
  om_sse_parser_free(c.p);
  sb_free(&c.out);
}

static void bom_start_of_stream_not_of_chunk(void **state) {
  static const piece_t a[] = {P("data:a\n\n"), P("\xEF\xBB\xBF"
                                                 "data:b\n\n")};
  /* Empty feeds before it do not move the stream start. */
  static const piece_t b[] = {P(""),     P(""),     P("\xEF"),      P(""),
                              P("\xBB"), P("\xBF"), P("data:a\n\n")};
  /* A new stream (reset: a reconnect) starts again. */
  static const piece_t c[] = {P("\xEF\xBB\xBF"
                                "data:a\n\n"),
                              {NULL, 0},
                              P("\xEF\xBB\xBF"
                                "data:b\n\n")};
  (void)state;
  expect_pieces(a, 2, "[message|a|]");
  expect_pieces(b, 7, "[message|a|]");
  expect_pieces(c, 3, "[message|a|][message|b|]");
}

/* ======================================================================
 * 9.2.6: lines end with CRLF, a lone LF or a lone CR.
 * ====================================================================== */

static void line_end_each_kind(void **state) {
  (void)state;
  CHECK("data:a\n\n", "[message|a|]" NONE);
  CHECK("data:a\r\r", "[message|a|]" NONE);
  CHECK("data:a\r\n\r\n", "[message|a|]" NONE);
  /* Mixed within one event. */
  CHECK("data:a\rdata:b\ndata:c\r\ndata:d\r\n\r",
        "[message|a\\nb\\nc\\nd|]" NONE);
}

static void crlf_is_one_line_end(void **state) {
  (void)state;
  /* CR LF is one end: a single CRLF after a data line dispatches nothing. */
  CHECK("data:a\r\n", NONE);
  CHECK("data:a\r\ndata:b\r\n\r\n", "[message|a\\nb|]" NONE);
  /* LF CR is two ends: the CR is a blank line. */
  CHECK("data:a\n\r", "[message|a|]" NONE);
  /* CR CR LF: a line end, then a blank line ended by CRLF. */
  CHECK("data:a\r\r\ndata:b\r\n\r\n", "[message|a|][message|b|]" NONE);
  /* CR LF LF: a line end, then a blank line ended by LF. */
  CHECK("data:a\r\n\ndata:b\n\n", "[message|a|][message|b|]" NONE);
  /* CR LF CR LF CR LF: end, blank, blank. */
  CHECK("data:a\r\n\r\n\r\ndata:b\r\n\r\n", "[message|a|][message|b|]" NONE);
}

/* A CR ending one chunk and an LF starting the next are one line end,
 * whatever comes between (empty feeds) and however long the gap. */
static void crlf_across_chunks(void **state) {
  static const piece_t a[] = {P("data:a\r"), P("\n"), P("data:b\r"), P(""),
                              P("\n"),       P("\r"), P(""),         P("\n")};
  static const piece_t b[] = {P("data:a\r"), P("\ndata:b\r"), P("\n"),
                              P("\r"),       P("\n\r"),       P("\n")};
  static const piece_t c[] = {P("id:1\r"), P("\n\r"), P("\ndata:x\r"),
                              P("\n\r"), P("\n")};
  (void)state;
  expect_pieces(a, 8, "[message|a\\nb|]");
  expect_pieces(b, 6, "[message|a\\nb|]");
  expect_pieces(c, 5, "[message|x|1]");
}

/* A lone CR is a complete line end the moment it arrives: an event ended
 * by CR CR is dispatched without waiting for the next byte, and an LF
 * that then comes is the CRLF's, not another line. */
static void lone_cr_dispatches_at_once(void **state) {
  ctx_t c = {NULL, {0}, 0};
  (void)state;
  assert_int_equal(om_sse_parser_new(NULL, &c.p), 0);
  sb_clear(&c.out);
  assert_int_equal(feed_copy(c.p, "data:a\r\r", 8, record, &c), 0);
  assert_string_equal(c.out.p, "[message|a|]");
  assert_int_equal(feed_copy(c.p, "\ndata:b\r", 8, record, &c), 0);
  assert_int_equal(feed_copy(c.p, "\r", 1, record, &c), 0);
  assert_string_equal(c.out.p, "[message|a|][message|b|]");
  om_sse_parser_free(c.p);
  sb_free(&c.out);
}

/* ======================================================================
 * 9.2.6: how each line is processed.
 * ====================================================================== */

/* "If the line is empty (a blank line): Dispatch the event". */
static void blank_line_dispatches(void **state) {
  (void)state;
  CHECK("data:a\n\ndata:b\n\n", "[message|a|][message|b|]" NONE);
  CHECK("data:a\n", NONE);
  /* A line of one space is not blank: it is a field named " ". */
  CHECK("data:a\n \n", NONE);
  CHECK("data:a\n\t\n", NONE);
}

/* "If the line starts with a U+003A COLON character (:): Ignore the
 * line." */
static void comment_lines_ignored(void **state) {
  (void)state;
  CHECK(":\n\n", NONE);
  CHECK(": ping\r\n\r\n", NONE);
  CHECK(":data:x\n:id:1\n:retry:5\n\n", NONE);
  CHECK("data:a\n: between\ndata:b\n\n", "[message|a\\nb|]" NONE);
  CHECK(":\xFF\xC3\0\n:\r:\r\ndata:a\n\n", "[message|a|]" NONE);
  /* A colon that is not first does not make a comment. */
  CHECK(" :x\ndata:a\n\n", "[message|a|]" NONE);
}

/* "Collect the characters on the line before the first U+003A COLON
 * character (:), and let field be that string. Collect the characters on
 * the line after the first U+003A COLON character (:), and let value be
 * that string." */
static void field_splits_at_first_colon(void **state) {
  (void)state;
  CHECK("data:a:b\n\n", "[message|a:b|]" NONE);
  CHECK("data::\n\n", "[message|:|]" NONE);
  CHECK("data: :\n\n", "[message|:|]" NONE);
  CHECK("event:a:b\ndata:x\n\n", "[a:b|x|]" NONE);
  CHECK("id:1:2\ndata:x\n\n", "[message|x|1:2] last=1:2 retry=-1");
}

/* "If value starts with a U+0020 SPACE character, remove it from value."
 * One space, only a space, only at the start, only from the value. */
static void one_leading_space_removed(void **state) {
  (void)state;
  CHECK("data:a\n\n", "[message|a|]" NONE);
  CHECK("data: a\n\n", "[message|a|]" NONE);
  CHECK("data:  a\n\n", "[message| a|]" NONE);
  CHECK("data:   a\n\n", "[message|  a|]" NONE);
  CHECK("data: a \n\n", "[message|a |]" NONE);
  CHECK("data:\ta\n\n", "[message|\\x09a|]" NONE);
  CHECK("data:\xC2\xA0"
        "a\n\n",
        "[message|\\xc2\\xa0a|]" NONE); /* NBSP is not a space */
  CHECK("data: \n\n", "[message||]" NONE);
  CHECK("data:  \n\n", "[message| |]" NONE);
  CHECK("event:  t\ndata:x\n\n", "[ t|x|]" NONE);
  CHECK("id:  1\ndata:x\n\n", "[message|x| 1] last= 1 retry=-1");
  /* Not from the name: "data " is another field. */
  CHECK("data :a\n\n", NONE);
  CHECK(" data:a\n\n", NONE);
}

/* "Otherwise, the string is not empty but does not contain a U+003A
 * COLON character (:)": the whole line is the name, the value is empty. */
static void line_without_colon_is_name_with_empty_value(void **state) {
  (void)state;
  CHECK("data\n\n", "[message||]" NONE);
  CHECK("data\ndata\n\n", "[message|\\n|]" NONE);
  CHECK("event:t\nevent\ndata:x\n\n", "[message|x|]" NONE);
  CHECK("id:1\ndata:a\n\nid\ndata:b\n\n", "[message|a|1][message|b|]" NONE);
  CHECK("retry:5\nretry\n", " last= retry=5");
  /* The whole line is the name: trailing space, other text. */
  CHECK("data \n\n", NONE);
  CHECK("datax\n\n", NONE);
  CHECK("dat\n\n", NONE);
}

/* "Field names must be compared literally, with no case folding
 * performed." */
static void field_names_case_sensitive(void **state) {
  (void)state;
  CHECK("Data:a\nDATA:b\ndAta:c\n\n", NONE);
  CHECK("Event:t\nEVENT:t\ndata:x\n\n", "[message|x|]" NONE);
  CHECK("ID:1\nId:1\niD:1\ndata:x\n\n", "[message|x|]" NONE);
  CHECK("Retry:5\nRETRY:5\n", NONE);
  CHECK("Data\n\n", NONE);
}

/* "Otherwise: The field is ignored." */
static void unknown_fields_ignored(void **state) {
  (void)state;
  CHECK("foo:bar\ndat:x\ndatax:x\ndatadata:x\nids:1\ni:1\nevents:t\n"
        "retryy:5\nretr:5\n\n",
        NONE);
  CHECK("foo:bar\ndata:a\nfoo\ndata:b\n\n", "[message|a\\nb|]" NONE);
  /* A NUL in a name: another name. */
  CHECK("data\0:x\n\0data:x\n\n", NONE);
}

/* ======================================================================
 * 9.2.6: the fields.
 * ====================================================================== */

/* "If the field name is "event": Set the event type buffer to field
 * value." */
static void event_sets_type_buffer(void **state) {
  (void)state;
  CHECK("event:add\ndata:x\n\n", "[add|x|]" NONE);
  CHECK("event:a\nevent:b\ndata:x\n\n", "[b|x|]" NONE); /* set, not append */
  CHECK("data:x\nevent:late\n\n", "[late|x|]" NONE);    /* order is free */
  CHECK("event:a\nevent:\ndata:x\n\n", "[message|x|]" NONE);
  CHECK("event:a b\ndata:x\n\n", "[a b|x|]" NONE);
  CHECK("event:a\0b\ndata:x\n\n", "[a\\x00b|x|]" NONE);
  CHECK("event:message\ndata:x\n\n", "[message|x|]" NONE);
}

/* "If the field name is "data": Append the field value to the data
 * buffer, then append a single U+000A LINE FEED (LF) character to the data
 * buffer." */
static void data_appends_value_and_lf(void **state) {
  (void)state;
  CHECK("data:a\ndata:b\ndata:c\n\n", "[message|a\\nb\\nc|]" NONE);
  CHECK("data:a\ndata:\ndata:b\n\n", "[message|a\\n\\nb|]" NONE);
  CHECK("data:\ndata:a\n\n", "[message|\\na|]" NONE);
  CHECK("data:\n\n", "[message||]" NONE);
  CHECK("data:a\0b\n\n", "[message|a\\x00b|]" NONE);
  CHECK("data:\0\n\n", "[message|\\x00|]" NONE);
}

/* "If the field name is "id": If the field value does not contain U+0000
 * NULL, then set the last event ID buffer to the field value. Otherwise,
 * ignore the field." */
static void id_sets_last_event_id_buffer(void **state) {
  (void)state;
  CHECK("id:1\ndata:x\n\n", "[message|x|1] last=1 retry=-1");
  CHECK("id:1\nid:2\ndata:x\n\n", "[message|x|2] last=2 retry=-1");
  CHECK("data:x\nid:3\n\n", "[message|x|3] last=3 retry=-1");
  /* An empty value sets it to empty: that is how a server clears it. */
  CHECK("id:1\ndata:a\n\nid:\ndata:b\n\n", "[message|a|1][message|b|]" NONE);
  CHECK("id:1\ndata:a\n\nid: \ndata:b\n\n", "[message|a|1][message|b|]" NONE);
}

static void id_with_nul_ignored_entirely(void **state) {
  (void)state;
  /* Ignored: the buffer keeps its value; it is not set, truncated at the
   * NUL, nor cleared. */
  CHECK("id:1\nid:2\0\ndata:x\n\n", "[message|x|1] last=1 retry=-1");
  CHECK("id:1\nid:\0"
        "2\ndata:x\n\n",
        "[message|x|1] last=1 retry=-1");
  CHECK("id:1\nid:2\0"
        "3\ndata:x\n\n",
        "[message|x|1] last=1 retry=-1");
  CHECK("id:1\nid:\0\ndata:x\n\n", "[message|x|1] last=1 retry=-1");
  CHECK("id:1\nid: \0\ndata:x\n\n", "[message|x|1] last=1 retry=-1");
  CHECK("id:\0\ndata:x\n\n", "[message|x|]" NONE);
  /* Across events: an earlier id survives a later NUL id. */
  CHECK("id:7\ndata:a\n\nid:8\0\ndata:b\n\n",
        "[message|a|7][message|b|7] last=7 retry=-1");
  /* Bytes that decode to U+FFFD are not NUL. */
  CHECK("id:\xC0\x80\ndata:x\n\n", "[message|x|" R R "] last=" R R " retry=-1");
}

/* "If the field name is "retry": If the field value consists of only
 * ASCII digits, then interpret the field value as an integer in base ten,
 * and set the event stream's reconnection time to that integer." */
static void retry_all_ascii_digits(void **state) {
  (void)state;
  CHECK("retry:10\n", " last= retry=10");
  CHECK("retry: 10\n", " last= retry=10"); /* the space goes first */
  CHECK("retry:0\n", " last= retry=0");
  CHECK("retry:007\n", " last= retry=7");
  CHECK("retry:1\r\nretry:2\rretry:3\n", " last= retry=3");
  /* It needs no blank line and dispatches nothing. */
  CHECK("retry:5\n\n", " last= retry=5");
  CHECK("retry:5", NONE); /* no line end yet: not a line */
}

/* "Otherwise, ignore the field." The previous value stays. */
static void retry_otherwise_ignored(void **state) {
  (void)state;
  CHECK("retry:10\nretry:1a\n", " last= retry=10");
  CHECK("retry:10\nretry:\n", " last= retry=10");
  CHECK("retry:10\nretry\n", " last= retry=10");
  CHECK("retry:10\nretry: \n", " last= retry=10");
  CHECK("retry:10\nretry:  20\n", " last= retry=10");
  CHECK("retry:10\nretry:20 \n", " last= retry=10");
  CHECK("retry:10\nretry:\t20\n", " last= retry=10");
  CHECK("retry:10\nretry:-20\n", " last= retry=10");
  CHECK("retry:10\nretry:+20\n", " last= retry=10");
  CHECK("retry:10\nretry:2.5\n", " last= retry=10");
  CHECK("retry:10\nretry:1e3\n", " last= retry=10");
  CHECK("retry:10\nretry:0x10\n", " last= retry=10");
  CHECK("retry:10\nretry:2\0\n", " last= retry=10");
  CHECK("retry:10\nretry:\xEF\xBC\x91\n", " last= retry=10"); /* fullwidth */
  CHECK("retry:10\nretry:\xD9\xA1\n", " last= retry=10");     /* Arabic 1 */
  CHECK("retry:10\nretry:2\xFF\n", " last= retry=10");
  CHECK("retry:1a\n", NONE);
  CHECK("retry:\n", NONE);
}

/* The standard sets no upper bound; the parser saturates at INT64_MAX (its
 * documented contract) rather than wrap. */
static void retry_large_values_saturate(void **state) {
  (void)state;
  CHECK("retry:9223372036854775806\n", " last= retry=9223372036854775806");
  CHECK("retry:9223372036854775807\n", " last= retry=9223372036854775807");
  CHECK("retry:9223372036854775808\n", " last= retry=9223372036854775807");
  CHECK("retry:000000000000000000000000000000000000000001\n", " last= retry=1");
  CHECK("retry:99999999999999999999999999999999999999999999\n",
        " last= retry=9223372036854775807");
}

/* ======================================================================
 * 9.2.6: "dispatch the event".
 * ====================================================================== */

/* Step 1: "Set the last event ID string of the event source to the value
 * of the last event ID buffer." This comes before step 2's return. */
static void dispatch_sets_last_event_id_without_data(void **state) {
  (void)state;
  CHECK("id:7\n\n", " last=7 retry=-1");
  CHECK("id:7\n\ndata:x\n\n", "[message|x|7] last=7 retry=-1");
  CHECK("id:7\nevent:t\n\n", " last=7 retry=-1");
  /* Without a blank line the string does not change. */
  CHECK("id:7\n", NONE);
  CHECK("id:1\n\nid:2\n", " last=1 retry=-1");
}

/* Step 2: "If the data buffer is an empty string, set the data buffer and
 * the event type buffer to the empty string and return." */
static void dispatch_without_data_fires_nothing(void **state) {
  (void)state;
  CHECK("\n\n\n", NONE);
  CHECK("event:t\n\n", NONE);
  CHECK("event:t\n\ndata:x\n\n", "[message|x|]" NONE);
  CHECK("event:t\nretry:1\nfoo:x\n:c\n\ndata:x\n\n", "[message|x|] last= "
                                                     "retry=1");
}

/* Step 3: "If the data buffer's last character is a U+000A LINE FEED (LF)
 * character, then remove the last character from the data buffer." Only
 * one. */
static void dispatch_removes_one_trailing_lf(void **state) {
  (void)state;
  CHECK("data\n\n", "[message||]" NONE);
  CHECK("data\ndata\n\n", "[message|\\n|]" NONE);
  CHECK("data\ndata\ndata\n\n", "[message|\\n\\n|]" NONE);
  CHECK("data:a\ndata:\n\n", "[message|a\\n|]" NONE);
}

/* Steps 5-6: type "message" unless the event type buffer is not empty. */
static void dispatch_type_defaults_to_message(void **state) {
  (void)state;
  CHECK("data:x\n\n", "[message|x|]" NONE);
  CHECK("event:\ndata:x\n\n", "[message|x|]" NONE);
  CHECK("event\ndata:x\n\n", "[message|x|]" NONE);
  CHECK("event:t\ndata:x\n\n", "[t|x|]" NONE);
}

/* Step 7: "Set the data buffer and the event type buffer to the empty
 * string." The last event ID buffer "does not get reset". */
static void dispatch_resets_buffers_keeps_id(void **state) {
  (void)state;
  CHECK("event:t\nid:1\ndata:a\n\ndata:b\n\nevent:u\ndata:c\n\n",
        "[t|a|1][message|b|1][u|c|1] last=1 retry=-1");
  CHECK("id:1\ndata:a\n\nid:2\ndata:b\n\ndata:c\n\n",
        "[message|a|1][message|b|2][message|c|2] last=2 retry=-1");
  /* The data buffer is empty again after each event. */
  CHECK("data:a\n\n\n\ndata:b\n\n", "[message|a|][message|b|]" NONE);
}

/* "Once the end of the file is reached, any pending data must be
 * discarded. (If the file ends in the middle of an event, before the final
 * empty line, the incomplete event is not dispatched.)" */
static void incomplete_event_at_end_not_dispatched(void **state) {
  (void)state;
  CHECK("data:x", NONE);
  CHECK("data:x\n", NONE);
  CHECK("data:x\r", NONE);
  CHECK("data:x\r\n", NONE);
  CHECK("event:t\ndata:x\nid:1\n", NONE);
  CHECK("data:a\n\ndata:b\n", "[message|a|]" NONE);
  CHECK("id:1\ndata:a\n\nid:2\ndata:b", "[message|a|1] last=1 retry=-1");
}

/* ======================================================================
 * Combinations.
 * ====================================================================== */

static void combined_streams(void **state) {
  (void)state;
  /* 9.2.5's examples, one after another. */
  CHECK(": test stream\n\ndata: first event\nid: 1\n\ndata:second event\n"
        "id\n\ndata:  third event\n\n",
        "[message|first event|1][message|second event|]"
        "[message| third event|]" NONE);
  CHECK("data\n\ndata\ndata\n\ndata:", "[message||][message|\\n|]" NONE);
  CHECK("data:test\n\ndata: test\n\n", "[message|test|][message|test|]" NONE);
  /* BOM, CRLF, comments, every field, a NUL id, a bad retry, UTF-8 in
   * every buffer, an invalid byte, and an unterminated tail. */
  CHECK("\xEF\xBB\xBF: hi\r\nretry: 1500\r\nevent: \xC3\xA9t\xC3\xA9\r\n"
        "id: 42\r\ndata: l1\r\ndata:  l2\xFF\r\n\r\n"
        "id: 4\0"
        "3\rretry: x\rdata\r\r"
        "Data: no\nid\ndata:\xE2\x82\xAC\n\n"
        "data: tail\n",
        "[\\xc3\\xa9t\\xc3\\xa9|l1\\n l2" R "|42][message||42]"
        "[message|\\xe2\\x82\\xac|] last= retry=1500");
  /* Every line end kind between the lines of one event. */
  CHECK("event:e\rid:i\r\ndata:1\ndata:2\r\r\n", "[e|1\\n2|i] last=i retry=-1");
}

/* ======================================================================
 * Bounds: the one limit is max_event_bytes (om_sse.h): the decoded data
 * buffer (values plus LFs), the event type buffer and an id value being
 * read, together. Hitting it is OM_ETOOBIG, sticky until reset.
 * ====================================================================== */

static void limit_is_exact_and_documented(void **state) {
  (void)state;
  /* 7 bytes of value + LF = 8 = the cap: fits. */
  CHECK_MAX("data:1234567\n\n", 8, "[message|1234567|]" NONE);
  CHECK_MAX("data:12345678\n\n", 8, "!ETOOBIG" NONE);
  /* Two lines: 3 + LF + 3 + LF. */
  CHECK_MAX("data:123\ndata:456\n\n", 8, "[message|123\\n456|]" NONE);
  /* Type and data share it. */
  CHECK_MAX("event:1234\ndata:123\n\n", 8, "[1234|123|]" NONE);
  CHECK_MAX("event:12345\ndata:123\n\n", 8, "!ETOOBIG" NONE);
  /* An id value counts while it is read. */
  CHECK_MAX("id:12345678\n\n", 8, " last=12345678 retry=-1");
  CHECK_MAX("id:123456789\n\n", 8, "!ETOOBIG" NONE);
  /* U+FFFD counts as its 3 bytes. */
  CHECK_MAX("data:\xFF\xFF\n\n", 8, "[message|" R R "|]" NONE);
  CHECK_MAX("data:\xFF\xFF\xFF\n\n", 8, "!ETOOBIG" NONE);
  /* Events before the failure are delivered; the budget is per event. */
  CHECK_MAX("data:1234567\n\ndata:1234567\n\ndata:12345678\n\ndata:1\n\n", 8,
            "[message|1234567|][message|1234567|]!ETOOBIG" NONE);
}

/* ======================================================================
 * Hostile input.
 * ====================================================================== */

#define MIB ((size_t)1 << 20)

/* Feed a stream of head, then fill repeated to n bytes, then tail, in
 * chunk-sized pieces from a reused buffer; return the first failure. With
 * no_alloc, every allocation fails meanwhile. */
static int feed_long(om_sse_parser_t *p, const char *head, char fill, size_t n,
                     const char *tail, size_t chunk, int no_alloc, ctx_t *c,
                     size_t *fed) {
  char *buf = malloc(chunk);
  size_t done = 0;
  int rc;
  assert_non_null(buf);
  memset(buf, fill, chunk);
  *fed = 0;
  if (no_alloc)
    om_test_fail_alloc_after(0);
  rc = om_sse_parser_feed(p, head, strlen(head), record, c);
  while (rc == 0 && done < n) {
    size_t k = n - done < chunk ? n - done : chunk;
    rc = om_sse_parser_feed(p, buf, k, record, c);
    done += k;
  }
  *fed = done;
  if (rc == 0 && tail != NULL)
    rc = om_sse_parser_feed(p, tail, strlen(tail), record, c);
  om_test_alloc_reset();
  free(buf);
  return rc;
}

/* A 10 MiB data line that never ends: refused at the cap, having buffered
 * no more than the cap, with no event and no growth past it. */
static void hostile_10mib_line_without_newline(void **state) {
  static const char *const heads[] = {"data: ", "event: ", "id: "};
  (void)state;
  for (size_t h = 0; h < 3; h++) {
    for (int cap_case = 0; cap_case < 2; cap_case++) {
      size_t max = cap_case == 0 ? 0 : 64 * 1024;
      size_t eff = max == 0 ? OM_SSE_DEFAULT_MAX_EVENT_BYTES : max;
      om_sse_parser_opts_t opts = {max};
      ctx_t c = {NULL, {0}, 0};
      size_t fed;
      int rc;
      assert_int_equal(om_sse_parser_new(&opts, &c.p), 0);
      rc = feed_long(c.p, heads[h], 'a', 10 * MIB, NULL, 4096, 0, &c, &fed);
      assert_int_equal(rc, OM_ETOOBIG);
      /* It failed in the chunk that crossed the cap, not later. */
      OM_ASSERT_CMP(fed, >, eff - 4096);
      OM_ASSERT_CMP(fed, <=, eff + 4096);
      assert_int_equal(c.events, 0);
      /* Sticky; then a reset makes a usable parser again. */
      assert_int_equal(om_sse_parser_feed(c.p, "\n\n", 2, record, &c),
                       OM_ETOOBIG);
      assert_int_equal(om_sse_parser_reset(c.p), 0);
      assert_int_equal(om_sse_parser_feed(c.p, "data:ok\n\n", 9, record, &c),
                       0);
      assert_int_equal(c.events, 1);
      om_sse_parser_free(c.p);
      sb_free(&c.out);
    }
  }
}

/* Lines the standard ignores, or keeps only a number from, are skipped in
 * constant memory whatever their length: with every allocation failing,
 * 10 MiB of each goes through, and work stays linear. */
static void hostile_10mib_unbuffered_lines_allocate_nothing(void **state) {
  static const struct {
    const char *head, *tail;
    char fill;
  } cases[] = {
      {":", "\n", 'c'},           /* a comment */
      {"unknown:", "\n", 'u'},    /* an unknown field */
      {"Data:", "\n", 'd'},       /* a case-folded name */
      {"", "\n", 'n'},            /* a 10 MiB name, no colon */
      {"", ":x\n", 'n'},          /* a 10 MiB name, with a colon */
      {"", "\n", '\0'},           /* 10 MiB of NUL: a name */
      {"retry:", "\n", '9'},      /* a 10 MiB number */
      {"retry:1", "x\n", '0'},    /* ... that turns out not to be one */
      {":", "\n", (char)0xFF},    /* invalid UTF-8 in a comment */
      {"foo:", "\n", (char)0x80}, /* invalid UTF-8 in an unknown field */
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    om_sse_parser_opts_t opts = {4096};
    ctx_t c = {NULL, {0}, 0};
    size_t fed, total;
    int rc;
    uint64_t work;
    assert_int_equal(om_sse_parser_new(&opts, &c.p), 0);
    /* Warm the buffers the end of an event touches. */
    assert_int_equal(
        om_sse_parser_feed(c.p, "id:1\ndata:w\n\n", 13, NULL, NULL), 0);
    work = om__sse_parser_work(c.p);
    rc = feed_long(c.p, cases[i].head, cases[i].fill, 10 * MIB, cases[i].tail,
                   65536, 1, &c, &fed);
    if (rc != 0)
      fail_msg("case %zu: rc %s", i, om_err_name(rc));
    total = strlen(cases[i].head) + fed + strlen(cases[i].tail);
    work = om__sse_parser_work(c.p) - work;
    OM_ASSERT_CMP(work, <=, 2 * (uint64_t)total);
    /* The stream goes on normally after it. */
    sb_clear(&c.out);
    assert_int_equal(om_sse_parser_feed(c.p, "data:ok\n\n", 9, record, &c), 0);
    assert_string_equal(c.out.p, "[message|ok|1]");
    if (i == 6)
      assert_int_equal(om_sse_parser_retry_ms(c.p), INT64_MAX);
    else
      assert_int_equal(om_sse_parser_retry_ms(c.p), -1);
    om_sse_parser_free(c.p);
    sb_free(&c.out);
  }
}

static int count_only(void *ud, const om_sse_event_t *ev) {
  long *n = ud;
  if (ev->data_len != 1 || ev->data[0] != 'x')
    fail_msg("event %ld: data length %zu", *n, ev->data_len);
  ++*n;
  return 0;
}

/* A million tiny events: each dispatched, in linear work, and once the
 * buffers are warm, without a single allocation. */
static void hostile_many_tiny_events(void **state) {
  static const char *const shapes[] = {"data:x\n\n", "data:x\r\r",
                                       "data: x\r\n\r\n", "id:1\ndata:x\n\n"};
  const long n = 1000000;
  (void)state;
  for (size_t s = 0; s < 4; s++) {
    size_t sl = strlen(shapes[s]), len = sl * (size_t)n;
    char *in = malloc(len);
    om_sse_parser_t *p;
    long events = 0;
    int rc = 0;
    assert_non_null(in);
    for (long i = 0; i < n; i++)
      memcpy(in + (size_t)i * sl, shapes[s], sl);
    assert_int_equal(om_sse_parser_new(NULL, &p), 0);
    /* Two events warm every buffer (the id buffers swap at each id). */
    assert_int_equal(om_sse_parser_feed(p, in, 2 * sl, count_only, &events), 0);
    om_test_fail_alloc_after(0);
    /* Odd-sized chunks so boundaries fall everywhere, CRLFs included. */
    for (size_t off = 2 * sl; off < len && rc == 0; off += 4093) {
      size_t k = len - off < 4093 ? len - off : 4093;
      rc = om_sse_parser_feed(p, in + off, k, count_only, &events);
    }
    om_test_alloc_reset();
    if (rc != 0)
      fail_msg("shape %zu: %s", s, om_err_name(rc));
    assert_int_equal(events, n);
    OM_ASSERT_CMP(om__sse_parser_work(p), <=, 3 * (uint64_t)len);
    om_sse_parser_free(p);
    free(in);
  }
}

/* NUL is an ordinary character everywhere but in an id. */
static void hostile_nul_bytes(void **state) {
  (void)state;
  CHECK("\0\n\ndata:\0\0\n\n", "[message|\\x00\\x00|]" NONE);
  CHECK("event:\0\ndata:\0\nid:\0\n\n", "[\\x00|\\x00|]" NONE);
  CHECK("\0data:x\n\n\0:\n\n:\0\n\n", NONE);
  CHECK("retry:\0\n", NONE);
  CHECK("id:ok\n\nid:\0\0\0\n\ndata:x\n\n", "[message|x|ok] last=ok retry=-1");
  {
    /* 1 MiB of NUL lines and NUL data lines mixed. */
    size_t len = 0, cap = 3 * MIB;
    char *in = malloc(cap);
    ctx_t c = {NULL, {0}, 0};
    om_sse_parser_t *p;
    assert_non_null(in);
    while (len + 16 < cap) {
      memcpy(in + len, "\0\0\n", 3);
      memcpy(in + len + 3, "data:\0\n\n", 8);
      len += 11;
    }
    assert_int_equal(om_sse_parser_new(NULL, &p), 0);
    c.p = p;
    assert_int_equal(om_sse_parser_feed(p, in, len, record, &c), 0);
    assert_int_equal(c.events, (long)(len / 11));
    om_sse_parser_free(p);
    sb_free(&c.out);
    free(in);
  }
}

/* Lone CRs: every one is a line end (so a run of them is a run of blank
 * lines), never half of a CRLF that is not there. */
static void hostile_lone_crs(void **state) {
  (void)state;
  CHECK("\r\r\r\r", NONE);
  CHECK("data:a\r\r\r\rdata:b\r\r", "[message|a|][message|b|]" NONE);
  CHECK("data:a\rdata:b\r\rdata:c\r\n\rdata:d\r\r",
        "[message|a\\nb|][message|c|][message|d|]" NONE);
  CHECK("id:1\r\r\r\ndata:x\r\r", "[message|x|1] last=1 retry=-1");
  {
    /* 10 MiB of CR, then an event: nothing buffered, nothing allocated. */
    om_sse_parser_t *p;
    char *in = malloc(10 * MIB);
    long events = 0;
    assert_non_null(in);
    memset(in, '\r', 10 * MIB);
    assert_int_equal(om_sse_parser_new(NULL, &p), 0);
    om_test_fail_alloc_after(0);
    for (size_t off = 0; off < 10 * MIB; off += 65535) {
      size_t k = 10 * MIB - off < 65535 ? 10 * MIB - off : 65535;
      assert_int_equal(om_sse_parser_feed(p, in + off, k, count_only, &events),
                       0);
    }
    assert_int_equal(
        om_sse_parser_feed(p, "data:x\r\r", 8, count_only, &events), 0);
    om_test_alloc_reset();
    assert_int_equal(events, 1);
    om_sse_parser_free(p);
    free(in);
  }
}

/* Invalid UTF-8 in a value grows threefold on decoding; the cap is on the
 * decoded bytes, so the bound holds. */
static void hostile_invalid_utf8_flood(void **state) {
  om_sse_parser_opts_t opts = {64 * 1024};
  ctx_t c = {NULL, {0}, 0};
  size_t fed;
  (void)state;
  assert_int_equal(om_sse_parser_new(&opts, &c.p), 0);
  assert_int_equal(
      feed_long(c.p, "data:", (char)0xFF, 10 * MIB, NULL, 4096, 0, &c, &fed),
      OM_ETOOBIG);
  OM_ASSERT_CMP(fed, <=, 64 * 1024 / 3 + 4096);
  om_sse_parser_free(c.p);
  /* Under the cap, each byte is one U+FFFD. */
  {
    char in[64];
    memcpy(in, "data:", 5);
    memset(in + 5, 0x80, 10);
    memcpy(in + 15, "\n\n", 2);
    check_max(in, 17, 31, "[message|" R R R R R R R R R R "|]" NONE);
    check_max(in, 17, 30, "!ETOOBIG" NONE);
  }
}

/* ======================================================================
 * Differential: the standard read literally, on the whole buffer.
 * ====================================================================== */

typedef struct {
  uint32_t *v;
  size_t len, cap;
} cps_t;

static void cp_put(cps_t *s, uint32_t c) {
  if (s->len == s->cap) {
    uint32_t *nv;
    s->cap = s->cap != 0 ? 2 * s->cap : 64;
    nv = realloc(s->v, s->cap * sizeof *nv);
    assert_non_null(nv);
    s->v = nv;
  }
  s->v[s->len++] = c;
}

/*
 * Encoding Standard, "UTF-8 decode": peek three bytes and drop them if
 * they are a BOM, then run the UTF-8 decoder (4.1.1) with error mode
 * "replacement", its variables named as there.
 */
static void ref_utf8_decode(const unsigned char *in, size_t len, cps_t *out) {
  uint32_t code_point = 0, bytes_seen = 0, bytes_needed = 0;
  unsigned lower = 0x80, upper = 0xBF;
  size_t i = 0;
  if (len >= 3 && in[0] == 0xEF && in[1] == 0xBB && in[2] == 0xBF)
    i = 3;
  for (;;) {
    unsigned byte;
    if (i == len) { /* end-of-queue */
      if (bytes_needed != 0)
        cp_put(out, 0xFFFD);
      return;
    }
    byte = in[i++];
    if (bytes_needed == 0) {
      if (byte <= 0x7F) {
        cp_put(out, byte);
      } else if (byte >= 0xC2 && byte <= 0xDF) {
        bytes_needed = 1;
        code_point = byte & 0x1F;
      } else if (byte >= 0xE0 && byte <= 0xEF) {
        if (byte == 0xE0)
          lower = 0xA0;
        if (byte == 0xED)
          upper = 0x9F;
        bytes_needed = 2;
        code_point = byte & 0xF;
      } else if (byte >= 0xF0 && byte <= 0xF4) {
        if (byte == 0xF0)
          lower = 0x90;
        if (byte == 0xF4)
          upper = 0x8F;
        bytes_needed = 3;
        code_point = byte & 0x7;
      } else {
        cp_put(out, 0xFFFD);
      }
      continue;
    }
    if (byte < lower || byte > upper) {
      code_point = bytes_needed = bytes_seen = 0;
      lower = 0x80;
      upper = 0xBF;
      i--; /* restore byte to ioQueue */
      cp_put(out, 0xFFFD);
      continue;
    }
    lower = 0x80;
    upper = 0xBF;
    code_point = (code_point << 6) | (byte & 0x3F);
    if (++bytes_seen == bytes_needed) {
      cp_put(out, code_point);
      code_point = bytes_needed = bytes_seen = 0;
    }
  }
}

static void utf8_encode(const uint32_t *v, size_t n, sb_t *out) {
  sb_clear(out);
  for (size_t i = 0; i < n; i++) {
    uint32_t c = v[i];
    unsigned char b[4];
    size_t k;
    if (c < 0x80) {
      b[0] = (unsigned char)c, k = 1;
    } else if (c < 0x800) {
      b[0] = (unsigned char)(0xC0 | c >> 6);
      b[1] = (unsigned char)(0x80 | (c & 0x3F)), k = 2;
    } else if (c < 0x10000) {
      b[0] = (unsigned char)(0xE0 | c >> 12);
      b[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
      b[2] = (unsigned char)(0x80 | (c & 0x3F)), k = 3;
    } else {
      b[0] = (unsigned char)(0xF0 | c >> 18);
      b[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
      b[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
      b[3] = (unsigned char)(0x80 | (c & 0x3F)), k = 4;
    }
    sb_raw(out, b, k);
  }
}

/* One dispatched event, and the reconnection time when it fired. */
typedef struct {
  sb_t type, data, id;
  int64_t retry;
} rev_t;

typedef struct {
  rev_t *v;
  size_t len, cap;
  sb_t last;
  int64_t retry;
} run_t;

static rev_t *run_add(run_t *r) {
  rev_t *e;
  if (r->len == r->cap) {
    rev_t *nv;
    r->cap = r->cap != 0 ? 2 * r->cap : 16;
    nv = realloc(r->v, r->cap * sizeof *nv);
    assert_non_null(nv);
    r->v = nv;
  }
  e = &r->v[r->len++];
  memset(e, 0, sizeof *e);
  return e;
}

static void run_free(run_t *r) {
  for (size_t i = 0; i < r->len; i++) {
    sb_free(&r->v[i].type);
    sb_free(&r->v[i].data);
    sb_free(&r->v[i].id);
  }
  free(r->v);
  sb_free(&r->last);
  memset(r, 0, sizeof *r);
}

static int cps_is(const uint32_t *v, size_t n, const char *name) {
  size_t k = strlen(name);
  if (n != k)
    return 0;
  for (size_t i = 0; i < k; i++)
    if (v[i] != (unsigned char)name[i])
      return 0;
  return 1;
}

/* Set a code point buffer to a slice. */
static void cps_set(cps_t *b, const uint32_t *v, size_t n) {
  b->len = 0;
  for (size_t i = 0; i < n; i++)
    cp_put(b, v[i]);
}

/* 9.2.6, "Interpreting an event stream", as written. */
static void ref_interpret(const char *in, size_t len, run_t *r) {
  cps_t text = {0}, data = {0}, type = {0}, idbuf = {0}, last = {0};
  int64_t retry = -1;
  size_t pos = 0;
  ref_utf8_decode((const unsigned char *)in, len, &text);
  for (;;) {
    size_t start = pos, end;
    const uint32_t *line;
    size_t n;
    /* A line ends with CRLF, or a lone LF, or a lone CR. */
    while (pos < text.len && text.v[pos] != '\r' && text.v[pos] != '\n')
      pos++;
    if (pos == text.len)
      break; /* the end of the file: pending data is discarded */
    end = pos;
    if (text.v[pos] == '\r' && pos + 1 < text.len && text.v[pos + 1] == '\n')
      pos += 2;
    else
      pos += 1;
    line = text.v + start;
    n = end - start;
    if (n == 0) {
      /* Dispatch the event. */
      cps_set(&last, idbuf.v, idbuf.len);
      if (data.len == 0) {
        data.len = type.len = 0;
        continue;
      }
      if (data.v[data.len - 1] == '\n')
        data.len--;
      {
        rev_t *e = run_add(r);
        static const uint32_t message[] = {'m', 'e', 's', 's', 'a', 'g', 'e'};
        if (type.len != 0)
          utf8_encode(type.v, type.len, &e->type);
        else
          utf8_encode(message, 7, &e->type);
        utf8_encode(data.v, data.len, &e->data);
        utf8_encode(last.v, last.len, &e->id);
        e->retry = retry;
      }
      data.len = type.len = 0;
    } else if (line[0] == ':') {
      continue; /* ignore the line */
    } else {
      const uint32_t *name = line, *value;
      size_t colon = 0, nlen, vlen;
      while (colon < n && line[colon] != ':')
        colon++;
      if (colon < n) {
        nlen = colon;
        value = line + colon + 1;
        vlen = n - colon - 1;
        if (vlen != 0 && value[0] == ' ')
          value++, vlen--;
      } else {
        nlen = n;
        value = line + n;
        vlen = 0;
      }
      if (cps_is(name, nlen, "event")) {
        cps_set(&type, value, vlen);
      } else if (cps_is(name, nlen, "data")) {
        for (size_t i = 0; i < vlen; i++)
          cp_put(&data, value[i]);
        cp_put(&data, '\n');
      } else if (cps_is(name, nlen, "id")) {
        size_t i = 0;
        while (i < vlen && value[i] != 0)
          i++;
        if (i == vlen)
          cps_set(&idbuf, value, vlen);
      } else if (cps_is(name, nlen, "retry")) {
        size_t i = 0;
        uint64_t v = 0;
        while (i < vlen && value[i] >= '0' && value[i] <= '9') {
          uint64_t d = value[i] - '0';
          v = v > ((uint64_t)INT64_MAX - d) / 10 ? (uint64_t)INT64_MAX
                                                 : v * 10 + d;
          i++;
        }
        /* An empty value has no digits to interpret: ignored. */
        if (vlen != 0 && i == vlen)
          retry = (int64_t)v;
      }
    }
  }
  utf8_encode(last.v, last.len, &r->last);
  r->retry = retry;
  free(text.v);
  free(data.v);
  free(type.v);
  free(idbuf.v);
  free(last.v);
}

typedef struct {
  om_sse_parser_t *p;
  run_t *r;
} diff_ctx_t;

static int record_run(void *ud, const om_sse_event_t *ev) {
  diff_ctx_t *d = ud;
  rev_t *e = run_add(d->r);
  sb_raw(&e->type, ev->type, ev->type_len);
  sb_raw(&e->data, ev->data, ev->data_len);
  sb_raw(&e->id, ev->id, ev->id_len);
  /* The reconnection time as of this event (a getter, allowed here). */
  e->retry = om_sse_parser_retry_ms(d->p);
  return 0;
}

static int sb_eq(const sb_t *a, const sb_t *b) {
  return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

static void show_run(sb_t *s, const run_t *r) {
  char num[48];
  for (size_t i = 0; i < r->len; i++) {
    sb_str(s, "[");
    sb_esc(s, r->v[i].type.p, r->v[i].type.len);
    sb_str(s, "|");
    sb_esc(s, r->v[i].data.p, r->v[i].data.len);
    sb_str(s, "|");
    sb_esc(s, r->v[i].id.p, r->v[i].id.len);
    snprintf(num, sizeof num, "|r=%lld]", (long long)r->v[i].retry);
    sb_str(s, num);
  }
  sb_str(s, " last=");
  sb_esc(s, r->last.p, r->last.len);
  snprintf(num, sizeof num, " retry=%lld", (long long)r->retry);
  sb_str(s, num);
}

static int runs_equal(const run_t *a, const run_t *b) {
  if (a->len != b->len || a->retry != b->retry || !sb_eq(&a->last, &b->last))
    return 0;
  for (size_t i = 0; i < a->len; i++)
    if (!sb_eq(&a->v[i].type, &b->v[i].type) ||
        !sb_eq(&a->v[i].data, &b->v[i].data) ||
        !sb_eq(&a->v[i].id, &b->v[i].id) || a->v[i].retry != b->v[i].retry)
      return 0;
  return 1;
}

/* The parser's run on in, cut at cuts. */
static void parser_run(const char *in, size_t len, const size_t *cuts,
                       size_t ncuts, run_t *r) {
  diff_ctx_t d = {NULL, r};
  size_t idlen;
  const char *id;
  assert_int_equal(om_sse_parser_new(NULL, &d.p), 0);
  assert_int_equal(feed_cuts(d.p, in, len, cuts, ncuts, 0, record_run, &d), 0);
  id = om_sse_parser_last_event_id(d.p, &idlen);
  sb_raw(&r->last, id, idlen);
  r->retry = om_sse_parser_retry_ms(d.p);
  om_sse_parser_free(d.p);
}

/* The alphabet of tricky pieces. */
static const piece_t alphabet[] = {
    P("\r"),
    P("\n"),
    P("\r\n"),
    P(":"),
    P(" "),
    P("data"),
    P("event"),
    P("id"),
    P("retry"),
    P("\xEF\xBB\xBF"),
    P("\0"),
    P("0"),
    P("1"),
    P("7"),
    P("9"),
    P("\xC3\xA9"),
    P("\xC3"), /* cut 2-byte sequence */
    P("\xA9"), /* lone continuation */
    P("\xE2\x82"),
    P("\xF0\x9F\x98"),
    P("\xF0\x9F\x98\x80"),
    P("\xFF"),
    P("\x80"),
    P("\xC0\xAF"),
    P("\xED\xA0\x80"),
    P("\xF4\x90\x80\x80"),
    P("\xEF\xBB"), /* index 26: a cut BOM */
    P("\xE0\x9F\xBF"),
    P("\xF0\x8F\xBF\xBF"),
    P("\xE0\xA0\x80"),
    P("\xF0\x90\x80\x80"),
    P("\xF4\x8F\xBF\xBF"),
    P("\t"),
    P("x"),
    P("Data"),
};
#define NALPHA (sizeof alphabet / sizeof alphabet[0])

/* Long runs make the vector paths (16- and 64-byte steps, the mixed-text
 * walk that returns after 16 ASCII bytes) meet every piece. */
static const piece_t long_runs[] = {
    P("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
    P("bbbbbbbbbbbbbbb"),
    P("cccccccccccccccc"),
    P("ddddddddddddddddd"),
    P("\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9"
      "\xC3\xA9\xC3\xA9\xC3\xA9"),
    P("\xE2\x82\xAC"
      "eeeeeeeeeeeeeeee\xE2\x82\xAC"),
    P("data: "),
    P("data:"),
    P("\n\n"),
};
#define NLONG (sizeof long_runs / sizeof long_runs[0])

static const piece_t *pick(om_rng_t *rng, int longs) {
  uint32_t k = om_rng_below(rng, 10);
  if (longs && om_rng_below(rng, 3) == 0)
    return &long_runs[om_rng_below(rng, (uint32_t)NLONG)];
  if (k < 2) /* line ends more often, so lines end */
    return &alphabet[om_rng_below(rng, 3)];
  if (k < 3) /* and field names */
    return &alphabet[5 + om_rng_below(rng, 4)];
  return &alphabet[om_rng_below(rng, (uint32_t)NALPHA)];
}

static int put(char *buf, size_t cap, size_t *len, const piece_t *t) {
  if (*len + t->n > cap)
    return 0;
  memcpy(buf + *len, t->s, t->n);
  *len += t->n;
  return 1;
}

/*
 * A random stream: a BOM (whole or cut) a third of the time, then lines.
 * Half the lines are well-formed in shape (a known name, maybe a colon,
 * maybe a space, a few random pieces, a line end) so that events do
 * happen; the rest are pieces thrown together.
 */
static size_t random_stream(om_rng_t *rng, char *buf, size_t cap, int longs) {
  static const piece_t colon = P(":"), space = P(" ");
  size_t len = 0;
  uint32_t lines = om_rng_below(rng, 40);
  uint32_t start = om_rng_below(rng, 9);
  if (start < 2)
    put(buf, cap, &len, &alphabet[9]); /* EF BB BF */
  else if (start == 2)
    put(buf, cap, &len, &alphabet[26]); /* EF BB */
  for (uint32_t l = 0; l < lines; l++) {
    uint32_t n = om_rng_below(rng, 5);
    if (om_rng_below(rng, 3) != 0) {
      /* data half the time, else event, id or retry */
      uint32_t f = om_rng_below(rng, 2) == 0 ? 0 : om_rng_below(rng, 4);
      if (!put(buf, cap, &len, &alphabet[5 + f]))
        break;
      if (om_rng_below(rng, 4) != 0 && !put(buf, cap, &len, &colon))
        break;
      if (om_rng_below(rng, 2) == 0 && !put(buf, cap, &len, &space))
        break;
      for (uint32_t i = 0; i < n; i++)
        if (!put(buf, cap, &len, &alphabet[3 + om_rng_below(rng, NALPHA - 3)]))
          break;
      if (!put(buf, cap, &len, &alphabet[om_rng_below(rng, 3)]))
        break;
      if (om_rng_below(rng, 2) == 0 &&
          !put(buf, cap, &len, &alphabet[om_rng_below(rng, 3)]))
        break;
    } else {
      for (uint32_t i = 0; i < 2 * n + 1; i++)
        if (!put(buf, cap, &len, pick(rng, longs)))
          break;
    }
  }
  return len;
}

static void differential(uint64_t seed, int iters, int longs) {
  static char in[8192];
  static size_t cuts[sizeof in];
  om_rng_t rng;
  long events = 0;
  om_rng_seed(&rng, seed);
  for (int iter = 0; iter < iters; iter++) {
    size_t len = random_stream(&rng, in, sizeof in, longs);
    run_t want = {0};
    ref_interpret(in, len, &want);
    events += (long)want.len;
    for (int way = 0; way < 3; way++) {
      run_t got = {0};
      size_t n = 0;
      if (way == 1 && iter % 4 == 0) { /* byte by byte */
        for (size_t i = 1; i < len; i++)
          cuts[n++] = i;
      } else if (way >= 1) { /* random cuts, sparse or dense */
        uint32_t every =
            way == 1 ? 2 + om_rng_below(&rng, 6) : 8 + om_rng_below(&rng, 64);
        for (size_t i = 1; i < len; i++)
          if (om_rng_below(&rng, every) == 0)
            cuts[n++] = i;
      }
      parser_run(in, len, cuts, n, &got);
      if (!runs_equal(&want, &got)) {
        sb_t s = {0};
        sb_str(&s, "stream ");
        sb_esc(&s, in, len);
        sb_str(&s, "\n  parser: ");
        show_run(&s, &got);
        sb_str(&s, "\n  literal: ");
        show_run(&s, &want);
        fail_msg("differential #%d (way %d, %zu cuts): %s", iter, way, n, s.p);
      }
      run_free(&got);
    }
    run_free(&want);
  }
  OM_TEST_NOTE("differential seed %llu: %d streams, %ld events compared",
               (unsigned long long)seed, iters, events);
  OM_ASSERT_CMP(events, >, 2 * iters); /* the streams did produce events */
}

static void differential_random_streams(void **state) {
  (void)state;
  differential(0x55E5EED, 4000, 0);
}

static void differential_long_runs(void **state) {
  (void)state;
  differential(0xB16B00B5, 1500, 1);
}

/* The oracle itself, on hand-checked cases, so a bug in it cannot hide
 * one in the parser. */
static void reference_self_check(void **state) {
  static const struct {
    piece_t in;
    const char *want;
  } cases[] = {
      {P("\xEF\xBB\xBF"
         "data: a\r\n\r\n"),
       "[message|a||r=-1] last= retry=-1"},
      {P("data:\xE2\x82x\nid:1\n\n"),
       "[message|" R "x|1|r=-1] last=1 retry=-1"},
      {P("retry: 5\nid:\0\nevent:e\ndata\n\r"), "[e|||r=5] last= retry=5"},
      {P("\xEF\xBB\xBF\xEF\xBB\xBF"
         "data:a\n\ndata:b\r\rdata:c"),
       "[message|b||r=-1] last= retry=-1"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_t r = {0};
    sb_t s = {0};
    ref_interpret(cases[i].in.s, cases[i].in.n, &r);
    show_run(&s, &r);
    assert_string_equal(s.p, cases[i].want);
    sb_free(&s);
    run_free(&r);
  }
}

/* A failed assertion inside a no-allocation window must not leave
 * allocations failing for the tests after it. */
static int alloc_reset(void **state) {
  (void)state;
  om_test_alloc_reset();
  return 0;
}

#define T(f) cmocka_unit_test_teardown(f, alloc_reset)

int main(void) {
  const struct CMUnitTest tests[] = {
      /* decoding */
      T(utf8_valid_text_kept),
      T(utf8_invalid_replaced_not_rejected),
      T(utf8_in_field_names),
      T(bom_stripped_at_stream_start),
      T(bom_stripped_only_once),
      T(bom_not_stripped_later),
      T(bom_partial_is_text),
      T(bom_start_of_stream_not_of_chunk),
      /* line ends */
      T(line_end_each_kind),
      T(crlf_is_one_line_end),
      T(crlf_across_chunks),
      T(lone_cr_dispatches_at_once),
      /* lines */
      T(blank_line_dispatches),
      T(comment_lines_ignored),
      T(field_splits_at_first_colon),
      T(one_leading_space_removed),
      T(line_without_colon_is_name_with_empty_value),
      T(field_names_case_sensitive),
      T(unknown_fields_ignored),
      /* fields */
      T(event_sets_type_buffer),
      T(data_appends_value_and_lf),
      T(id_sets_last_event_id_buffer),
      T(id_with_nul_ignored_entirely),
      T(retry_all_ascii_digits),
      T(retry_otherwise_ignored),
      T(retry_large_values_saturate),
      /* dispatch */
      T(dispatch_sets_last_event_id_without_data),
      T(dispatch_without_data_fires_nothing),
      T(dispatch_removes_one_trailing_lf),
      T(dispatch_type_defaults_to_message),
      T(dispatch_resets_buffers_keeps_id),
      T(incomplete_event_at_end_not_dispatched),
      /* combinations, bounds, hostile input */
      T(combined_streams),
      T(limit_is_exact_and_documented),
      T(hostile_10mib_line_without_newline),
      T(hostile_10mib_unbuffered_lines_allocate_nothing),
      T(hostile_many_tiny_events),
      T(hostile_nul_bytes),
      T(hostile_lone_crs),
      T(hostile_invalid_utf8_flood),
      /* differential */
      T(reference_self_check),
      T(differential_random_streams),
      T(differential_long_runs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
