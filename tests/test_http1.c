/*
 * test_http1.c: the HTTP/1.1 framing module (core/om_http1.c): request
 * and response heads, whole and split at every byte; every refusal of
 * the head parser, the framing decision and the chunked decoder; chunked
 * bodies handed back as spans across every split.
 */
#include "om_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_http1.h"

#define MAXF 8

/* Parse msg as kind, fed in two pieces split at `split` (the head parser
 * always sees the whole head so far); returns DONE or ERROR. */
static int parse_split(om_http1_head_t *h, om_http1_field_t *f, int kind,
                       const char *msg, size_t len, size_t split,
                       size_t max_bytes) {
  int rc;
  om_http1_head_init(h, kind, f, MAXF, MAXF, max_bytes);
  rc = om_http1_head_parse(h, msg, split);
  if (rc == OM_HTTP1_MORE)
    rc = om_http1_head_parse(h, msg, len);
  return rc;
}

static int parse_at_every_split(int kind, const char *msg, size_t max_bytes,
                                om_http1_err_t *err, om_http1_head_t *out,
                                om_http1_field_t *fout) {
  size_t len = strlen(msg), s;
  int first = 0;
  for (s = 0; s <= len; s++) {
    om_http1_head_t h;
    om_http1_field_t f[MAXF];
    int rc = parse_split(&h, f, kind, msg, len, s, max_bytes);
    if (s == 0) {
      first = rc;
      *err = h.err;
      *out = h;
      memcpy(fout, f, sizeof f);
    } else if (rc != first || h.err != *err || h.pos != out->pos) {
      fail_msg("%s split at %zu: rc %d err %d pos %zu, whole: %d %d %zu", msg,
               s, rc, (int)h.err, h.pos, first, (int)*err, out->pos);
    }
  }
  return first;
}

static void request_head(void **state) {
  static const char msg[] = "\r\nPOST /a?b HTTP/1.1\r\nHost: x\r\n"
                            "X-A: \t v  w \t\r\nX-E:\r\n\r\nbody";
  om_http1_head_t h;
  om_http1_field_t f[MAXF];
  om_http1_err_t err;
  (void)state;
  assert_int_equal(
      parse_at_every_split(OM_HTTP1_REQUEST, msg, 1024, &err, &h, f),
      OM_HTTP1_DONE);
  assert_int_equal(h.pos, strlen(msg) - 4);
  assert_int_equal(h.line_start, 2);
  assert_int_equal(h.method_len, 4);
  assert_memory_equal(msg + h.target_off, "/a?b", 4);
  assert_int_equal(h.target_len, 4);
  assert_int_equal(h.major, 1);
  assert_int_equal(h.minor, 1);
  assert_int_equal(h.n_fields, 3);
  assert_memory_equal(msg + f[1].name_off, "X-A", 3);
  assert_int_equal(f[1].value_len, 4);
  assert_memory_equal(msg + f[1].value_off, "v  w", 4);
  assert_int_equal(f[2].value_len, 0);
  assert_true(om_http1_head_past_method(&h));
}

static void response_head(void **state) {
  static const char msg[] = "HTTP/1.0 404 Not \xe9 Found\r\nA: b\r\n\r\n";
  om_http1_head_t h;
  om_http1_field_t f[MAXF];
  om_http1_err_t err;
  (void)state;
  assert_int_equal(
      parse_at_every_split(OM_HTTP1_RESPONSE, msg, 1024, &err, &h, f),
      OM_HTTP1_DONE);
  assert_int_equal(h.status, 404);
  assert_int_equal(h.minor, 0);
  assert_int_equal(h.reason_len, 11);
  assert_memory_equal(msg + h.reason_off, "Not \xe9 Found", 11);
  assert_int_equal(h.n_fields, 1);
  /* no reason phrase at all */
  assert_int_equal(parse_at_every_split(OM_HTTP1_RESPONSE,
                                        "HTTP/1.1 204\r\n\r\n", 1024, &err, &h,
                                        f),
                   OM_HTTP1_DONE);
  assert_int_equal(h.status, 204);
  assert_int_equal(h.reason_len, 0);
}

typedef struct {
  int kind;
  const char *msg;
  om_http1_err_t err;
} bad_head_t;

static void head_refusals(void **state) {
  static const bad_head_t bad[] = {
      {OM_HTTP1_REQUEST, "\nGET / HTTP/1.1\r\n\r\n", OM_HTTP1_E_REQUEST_LINE},
      {OM_HTTP1_REQUEST, "G(T / HTTP/1.1\r\n\r\n", OM_HTTP1_E_REQUEST_LINE},
      {OM_HTTP1_REQUEST, "GET  / HTTP/1.1\r\n\r\n", OM_HTTP1_E_REQUEST_LINE},
      {OM_HTTP1_REQUEST, "GET /\r\n\r\n", OM_HTTP1_E_REQUEST_LINE},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1 \r\n\r\n", OM_HTTP1_E_REQUEST_LINE},
      {OM_HTTP1_REQUEST, "GET / HTTP/11\r\n\r\n", OM_HTTP1_E_REQUEST_LINE},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\rX\n\r\n", OM_HTTP1_E_REQUEST_LINE},
      {OM_HTTP1_REQUEST, "ABCDEFGHIJKLMNOPQ / HTTP/1.1\r\n\r\n",
       OM_HTTP1_E_METHOD_TOO_LONG},
      {OM_HTTP1_REQUEST, "GET /\x7f HTTP/1.1\r\n\r\n", OM_HTTP1_E_TARGET_BYTE},
      {OM_HTTP1_REQUEST,
       "GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
       OM_HTTP1_E_TARGET_TOO_LONG},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\r\n X: y\r\n\r\n",
       OM_HTTP1_E_WS_BEFORE_FIRST_FIELD},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\r\nX: y\r\n z\r\n\r\n",
       OM_HTTP1_E_OBS_FOLD},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\r\nX : y\r\n\r\n",
       OM_HTTP1_E_WS_BEFORE_COLON},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\r\n: y\r\n\r\n",
       OM_HTTP1_E_NAME_NOT_TOKEN},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\r\nX(: y\r\n\r\n",
       OM_HTTP1_E_NAME_NOT_TOKEN},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\r\nX: a\x01\r\n\r\n",
       OM_HTTP1_E_VALUE_CTL},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
       OM_HTTP1_E_VALUE_BARE_CR},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\r\nX: a\nY: b\r\n\r\n",
       OM_HTTP1_E_BARE_LF},
      {OM_HTTP1_REQUEST, "GET / HTTP/1.1\r\nX: a\r\n\rx",
       OM_HTTP1_E_END_BARE_CR},
      {OM_HTTP1_REQUEST,
       "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\n",
       OM_HTTP1_E_TOO_MANY_FIELDS},
      {OM_HTTP1_REQUEST,
       "GET / HTTP/1.1\r\nX: "
       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
       OM_HTTP1_E_HEAD_TOO_LARGE},
      {OM_HTTP1_RESPONSE, "\r\nHTTP/1.1 200 OK\r\n\r\n",
       OM_HTTP1_E_STATUS_VERSION},
      {OM_HTTP1_RESPONSE, "HTTP/1.2 200 OK\r\n\r\n", OM_HTTP1_E_STATUS_VERSION},
      {OM_HTTP1_RESPONSE, "http/1.1 200 OK\r\n\r\n", OM_HTTP1_E_STATUS_VERSION},
      {OM_HTTP1_RESPONSE, "HTTP/1.1 20 OK\r\n\r\n", OM_HTTP1_E_STATUS_CODE},
      {OM_HTTP1_RESPONSE, "HTTP/1.1  200 OK\r\n\r\n", OM_HTTP1_E_STATUS_CODE},
      {OM_HTTP1_RESPONSE, "HTTP/1.1 099 OK\r\n\r\n", OM_HTTP1_E_STATUS_RANGE},
      {OM_HTTP1_RESPONSE, "HTTP/1.1 600 OK\r\n\r\n", OM_HTTP1_E_STATUS_RANGE},
      {OM_HTTP1_RESPONSE, "HTTP/1.1 2000 OK\r\n\r\n",
       OM_HTTP1_E_STATUS_AFTER_CODE},
      {OM_HTTP1_RESPONSE, "HTTP/1.1 200 O\x01K\r\n\r\n", OM_HTTP1_E_REASON_CTL},
      {OM_HTTP1_RESPONSE, "HTTP/1.1 200 OK\rX\n\r\n",
       OM_HTTP1_E_STATUS_BARE_CR},
      {OM_HTTP1_RESPONSE, "HTTP/1.1 200 OK\n\n", OM_HTTP1_E_BARE_LF},
      {OM_HTTP1_RESPONSE, "HTTP/1\n", OM_HTTP1_E_BARE_LF},
      {OM_HTTP1_RESPONSE, "HTTP/1.1 200 OK\r\nX: y\r\n z\r\n\r\n",
       OM_HTTP1_E_OBS_FOLD},
  };
  size_t i;
  (void)state;
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    om_http1_head_t h;
    om_http1_field_t f[MAXF];
    om_http1_err_t err;
    om_http1_field_t few[4];
    int rc;
    size_t len = strlen(bad[i].msg);
    /* four fields at most, 64 bytes of head */
    om_http1_head_init(&h, bad[i].kind, few, 4, 4, 64);
    rc = om_http1_head_parse(&h, bad[i].msg, len);
    if (rc != OM_HTTP1_ERROR || h.err != bad[i].err)
      fail_msg("case %zu (%s): rc %d err %s, want %s", i, bad[i].msg, rc,
               om_http1_err_desc(h.err), om_http1_err_desc(bad[i].err));
    /* and at every split the same refusal */
    if (bad[i].err != OM_HTTP1_E_TOO_MANY_FIELDS &&
        bad[i].err != OM_HTTP1_E_HEAD_TOO_LARGE &&
        bad[i].err != OM_HTTP1_E_TARGET_TOO_LONG) {
      assert_int_equal(
          parse_at_every_split(bad[i].kind, bad[i].msg, 1024, &err, &h, f),
          OM_HTTP1_ERROR);
      assert_int_equal(err, bad[i].err);
    }
  }
}

static void head_grows_on_demand(void **state) {
  static const char msg[] = "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
  om_http1_head_t h;
  om_http1_field_t *f = NULL;
  size_t grows = 0;
  int rc;
  (void)state;
  om_http1_head_init(&h, OM_HTTP1_REQUEST, NULL, 0, 10, 1024);
  while ((rc = om_http1_head_parse(&h, msg, sizeof msg - 1)) == OM_HTTP1_GROW) {
    f = realloc(f, (h.fields_cap + 1) * sizeof *f);
    assert_non_null(f);
    h.fields = f;
    h.fields_cap++;
    grows++;
  }
  assert_int_equal(rc, OM_HTTP1_DONE);
  assert_int_equal(grows, 3);
  assert_int_equal(h.n_fields, 3);
  assert_memory_equal(msg + f[2].name_off, "C", 1);
  free(f);
}

static void methods(void **state) {
  (void)state;
  assert_true(om_http1_method_known("GET", 3));
  assert_true(om_http1_method_known("M-SEARCH", 8));
  assert_true(om_http1_method_known("UNSUBSCRIBE", 11));
  assert_false(om_http1_method_known("get", 3));
  assert_false(om_http1_method_known("FOO", 3));
  assert_false(om_http1_method_known("GETX", 4));
}

/* Framing: fields as "Name: value" lines, minor version, status (0 for a
 * request). */
static om_http1_err_t frame(int kind, const char *const *fl, size_t n,
                            int minor, int status, int *body, uint64_t *cl) {
  om_http1_framing_t fr;
  size_t i;
  om_http1_framing_init(&fr, kind);
  for (i = 0; i < n; i++) {
    const char *c = strchr(fl[i], ':');
    om_http1_err_t e = om_http1_framing_field(&fr, fl[i], (size_t)(c - fl[i]),
                                              c + 2, strlen(c + 2));
    if (e != OM_HTTP1_OK)
      return e;
  }
  *cl = fr.cl;
  return om_http1_framing_end(&fr, minor, status, 0, body);
}

static void framing_decisions(void **state) {
  static const struct {
    int kind;
    const char *f[3];
    size_t n;
    int minor, status;
    om_http1_err_t err;
    int body;
  } c[] = {
      {OM_HTTP1_REQUEST,
       {"Content-Length: 5"},
       1,
       1,
       0,
       0,
       OM_HTTP1_BODY_LENGTH},
      {OM_HTTP1_REQUEST, {"Content-Length: 0"}, 1, 1, 0, 0, OM_HTTP1_BODY_NONE},
      {OM_HTTP1_REQUEST, {"X: y"}, 1, 1, 0, 0, OM_HTTP1_BODY_NONE},
      {OM_HTTP1_REQUEST,
       {"Transfer-Encoding: gzip, Chunked"},
       1,
       1,
       0,
       OM_HTTP1_E_TE_UNSUPPORTED,
       0},
      {OM_HTTP1_REQUEST,
       {"transfer-encoding: chunked"},
       1,
       1,
       0,
       0,
       OM_HTTP1_BODY_CHUNKED},
      {OM_HTTP1_REQUEST,
       {"Content-Length: 1", "Content-Length: 1"},
       2,
       1,
       0,
       OM_HTTP1_E_CL_REPEATED,
       0},
      {OM_HTTP1_REQUEST,
       {"Content-Length: 1, 1"},
       1,
       1,
       0,
       OM_HTTP1_E_CL_INVALID,
       0},
      {OM_HTTP1_REQUEST,
       {"Content-Length: "},
       1,
       1,
       0,
       OM_HTTP1_E_CL_INVALID,
       0},
      {OM_HTTP1_REQUEST,
       {"Content-Length: 1", "Transfer-Encoding: chunked"},
       2,
       1,
       0,
       OM_HTTP1_E_CL_AND_TE,
       0},
      {OM_HTTP1_REQUEST,
       {"Transfer-Encoding: chunked"},
       1,
       0,
       0,
       OM_HTTP1_E_TE_HTTP10,
       0},
      {OM_HTTP1_REQUEST,
       {"Transfer-Encoding: chunked, gzip"},
       1,
       1,
       0,
       OM_HTTP1_E_TE_NOT_CHUNKED,
       0},
      {OM_HTTP1_REQUEST,
       {"Transfer-Encoding: chunked,"},
       1,
       1,
       0,
       OM_HTTP1_E_TE_BAD,
       0},
      {OM_HTTP1_REQUEST,
       {"Transfer-Encoding: chunked;a=b"},
       1,
       1,
       0,
       OM_HTTP1_E_TE_BAD,
       0},
      {OM_HTTP1_REQUEST,
       {"Transfer-Encoding: chunked", "Transfer-Encoding: chunked"},
       2,
       1,
       0,
       OM_HTTP1_E_TE_BAD,
       0},
      {OM_HTTP1_RESPONSE,
       {"Transfer-Encoding: chunked", "Transfer-Encoding: chunked"},
       2,
       1,
       200,
       OM_HTTP1_E_TE_REPEATED,
       0},
      {OM_HTTP1_RESPONSE,
       {"Content-Length: 99999999999999999999"},
       1,
       1,
       200,
       OM_HTTP1_E_CL_INVALID,
       0},
      {OM_HTTP1_RESPONSE,
       {"Content-Length: 9223372036854775808"},
       1,
       1,
       200,
       OM_HTTP1_E_CL_INVALID,
       0},
      {OM_HTTP1_RESPONSE,
       {"Content-Length: 9223372036854775807"},
       1,
       1,
       200,
       0,
       OM_HTTP1_BODY_LENGTH},
      {OM_HTTP1_RESPONSE,
       {"Transfer-Encoding: gzip"},
       1,
       1,
       200,
       OM_HTTP1_E_TE_NOT_CHUNKED,
       0},
      {OM_HTTP1_RESPONSE,
       {"Transfer-Encoding: chunked"},
       1,
       0,
       200,
       OM_HTTP1_E_TE_HTTP10,
       0},
      {OM_HTTP1_RESPONSE,
       {"Transfer-Encoding: chunked", "Content-Length: 1"},
       2,
       1,
       200,
       OM_HTTP1_E_CL_AND_TE,
       0},
      {OM_HTTP1_RESPONSE, {"X: y"}, 1, 1, 200, 0, OM_HTTP1_BODY_CLOSE},
      /* not a framing field, whatever http-parser makes of it */
      {OM_HTTP1_REQUEST,
       {"Transfer-Encodings: x", "Content-Length: 2"},
       2,
       1,
       0,
       0,
       OM_HTTP1_BODY_LENGTH},
      {OM_HTTP1_RESPONSE,
       {"Content-Length: 5"},
       1,
       1,
       304,
       0,
       OM_HTTP1_BODY_NONE},
      {OM_HTTP1_RESPONSE,
       {"Transfer-Encoding: chunked"},
       1,
       1,
       204,
       0,
       OM_HTTP1_BODY_NONE},
  };
  size_t i;
  (void)state;
  for (i = 0; i < sizeof c / sizeof c[0]; i++) {
    int body = -1;
    uint64_t cl = 0;
    om_http1_err_t e =
        frame(c[i].kind, c[i].f, c[i].n, c[i].minor, c[i].status, &body, &cl);
    if (e != c[i].err || (e == OM_HTTP1_OK && body != c[i].body))
      fail_msg("case %zu (%s): %s body %d, want %s body %d", i, c[i].f[0],
               om_http1_err_desc(e), body, om_http1_err_desc(c[i].err),
               c[i].body);
  }
}

/* Decode msg fed in pieces cut at the given points; the body spans are
 * joined into out. Returns the last rc; *at the absolute offset where it
 * stopped. */
static int decode_pieces(om_http1_chunked_t *d, const char *msg, size_t len,
                         const size_t *cuts, size_t n_cuts, char *out,
                         size_t *out_len, size_t *at) {
  size_t start = 0, k;
  int rc = OM_HTTP1_MORE;
  *out_len = 0;
  for (k = 0; k <= n_cuts && rc == OM_HTTP1_MORE; k++) {
    size_t end = k < n_cuts ? cuts[k] : len, off = start;
    while (off < end) {
      const char *data;
      size_t dl, used;
      rc = om_http1_chunked_decode(d, msg + off, end - off, &used, &data, &dl);
      if (rc == OM_HTTP1_DATA) {
        memcpy(out + *out_len, data, dl);
        *out_len += dl;
        off += used;
        rc = OM_HTTP1_MORE;
        continue;
      }
      off += used;
      if (rc != OM_HTTP1_MORE)
        break;
    }
    *at = off;
    start = end;
  }
  return rc;
}

static void chunked_spans_at_every_split(void **state) {
  static const char msg[] = "5;a=b;c=\"q\\\"x\" \t;d\r\nhello\r\n"
                            "1A\r\nabcdefghijklmnopqrstuvwxyz\r\n"
                            "0\r\nX-T: v\r\nContent-Length: 40\r\n\r\nNEXT";
  size_t len = sizeof msg - 1, s1, s2;
  (void)state;
  for (s1 = 0; s1 <= len; s1++) {
    for (s2 = s1; s2 <= len; s2 += 7) {
      om_http1_chunked_t d;
      char out[64];
      size_t out_len, at, cuts[2] = {s1, s2};
      int rc;
      om_http1_chunked_init(&d, 1024, 1024);
      rc = decode_pieces(&d, msg, len, cuts, 2, out, &out_len, &at);
      if (rc != OM_HTTP1_DONE || at != len - 4 || out_len != 31 ||
          memcmp(out, "helloabcdefghijklmnopqrstuvwxyz", 31) != 0)
        fail_msg("split %zu/%zu: rc %d at %zu body %zu", s1, s2, rc, at,
                 out_len);
      assert_int_equal(d.body, 31);
    }
  }
}

typedef struct {
  const char *msg;
  om_http1_err_t err;
  size_t at;  /* offset of the refused byte */
  size_t len; /* 0: strlen(msg) */
} bad_chunk_t;

static void chunked_refusals(void **state) {
  static const bad_chunk_t bad[] = {
      {"zz\r\n", OM_HTTP1_E_CHUNK_SIZE, 0, 0},
      {"\r\n", OM_HTTP1_E_CHUNK_SIZE, 0, 0},
      {"3 \r\nabc\r\n", OM_HTTP1_E_CHUNK_EXT, 2, 0},
      {"1\t0\r\n", OM_HTTP1_E_CHUNK_EXT, 2, 0},
      {"3;=x\r\n", OM_HTTP1_E_CHUNK_EXT, 2, 0},
      {"3;a=\"x\r\n", OM_HTTP1_E_CHUNK_EXT, 6, 0},
      {"3;a \r\n", OM_HTTP1_E_CHUNK_EXT, 4, 0},
      {"3\nabc\r\n", OM_HTTP1_E_CHUNK_BARE_LF, 1, 0},
      {"3;a=\"\n", OM_HTTP1_E_CHUNK_BARE_LF, 5, 0},
      {"3\rX", OM_HTTP1_E_CHUNK_BARE_CR, 2, 0},
      {"3\r\nabcX\r\n", OM_HTTP1_E_CHUNK_DATA_CRLF, 6, 0},
      {"3\r\nabc\r\r", OM_HTTP1_E_CHUNK_DATA_CRLF, 7, 0},
      {"401\r\n", OM_HTTP1_E_CHUNK_TOO_LARGE, 2, 0},
      {"fffffffffffffffff\r\n", OM_HTTP1_E_CHUNK_TOO_LARGE, 2, 0},
      {"0\r\n bad\r\n\r\n", OM_HTTP1_E_TRAILER_FIELD, 3, 0},
      {"0\r\nX: a\r\n b\r\n\r\n", OM_HTTP1_E_TRAILER_OBS_FOLD, 9, 0},
      {"0\r\nX : y\r\n\r\n", OM_HTTP1_E_TRAILER_FIELD, 4, 0},
      {"0\r\nX\r\n\r\n", OM_HTTP1_E_TRAILER_FIELD, 4, 0},
      {"0\r\nX: a\0\r\n\r\n", OM_HTTP1_E_TRAILER_FIELD, 7, 12},
      {"0\r\nX: a\n\r\n", OM_HTTP1_E_TRAILER_BARE_LF, 7, 0},
      {"0\r\n\n", OM_HTTP1_E_TRAILER_BARE_LF, 3, 0},
      {"0\r\nX: a\rb", OM_HTTP1_E_TRAILER_FIELD, 8, 0},
      {"0\r\n\rX", OM_HTTP1_E_CHUNK_END, 4, 0},
      {"0\r\nContent-Length: 1\r\ncontent-length: 2\r\n\r\n",
       OM_HTTP1_E_TRAILER_CONTENT_LENGTH, 38, 0},
      {"0\r\nContent-Length: x\r\n\r\n", OM_HTTP1_E_TRAILER_CONTENT_LENGTH, 19,
       0},
      {"0\r\nContent-Length:  \r\n\r\n", OM_HTTP1_E_TRAILER_CONTENT_LENGTH, 22,
       0},
      {"0\r\nContent-Length:\r\n\r\n", OM_HTTP1_E_TRAILER_CONTENT_LENGTH, 20,
       0},
      {"0\r\nContent-Length: 1 2\r\n\r\n", OM_HTTP1_E_TRAILER_CONTENT_LENGTH,
       21, 0},
  };
  size_t i;
  (void)state;
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t len = bad[i].len ? bad[i].len : strlen(bad[i].msg), s;
    for (s = 0; s <= len; s++) {
      om_http1_chunked_t d;
      char out[64];
      size_t out_len, at;
      int rc;
      om_http1_chunked_init(&d, 1024, 1024);
      rc = decode_pieces(&d, bad[i].msg, len, &s, 1, out, &out_len, &at);
      if (rc != OM_HTTP1_ERROR || d.err != bad[i].err || at != bad[i].at)
        fail_msg("case %zu split %zu: rc %d %s at %zu, want %s at %zu", i, s,
                 rc, om_http1_err_desc(d.err), at,
                 om_http1_err_desc(bad[i].err), bad[i].at);
    }
  }
}

static void chunked_limits(void **state) {
  om_http1_chunked_t d;
  char line[5000], out[8];
  size_t out_len, at, none = 0;
  int rc;
  (void)state;
  /* a chunk line: 4096 bytes with its CRLF, no more */
  memset(line, 'a', sizeof line);
  line[0] = '1';
  line[1] = ';';
  line[4094] = '\r';
  line[4095] = '\n';
  om_http1_chunked_init(&d, 1024, 1024);
  rc = decode_pieces(&d, line, 4097, &none, 0, out, &out_len, &at);
  assert_int_equal(rc, OM_HTTP1_MORE);
  assert_int_equal(out_len, 1);
  line[4094] = 'a';
  line[4095] = '\r';
  line[4096] = '\n';
  om_http1_chunked_init(&d, 1024, 1024);
  rc = decode_pieces(&d, line, 4097, &none, 0, out, &out_len, &at);
  assert_int_equal(rc, OM_HTTP1_ERROR);
  assert_int_equal(d.err, OM_HTTP1_E_CHUNK_LINE_TOO_LONG);
  assert_int_equal(at, 4096);
  /* trailer bytes and fields */
  om_http1_chunked_init(&d, 1024, 10);
  rc = decode_pieces(&d, "0\r\nX: 12345678\r\n\r\n", 19, &none, 0, out,
                     &out_len, &at);
  assert_int_equal(d.err, OM_HTTP1_E_TRAILER_TOO_LARGE);
  assert_int_equal(at, 13);
  om_http1_chunked_init(&d, 1024, 1024);
  d.max_trailer_fields = 1;
  rc = decode_pieces(&d, "0\r\nX: 1\r\nY: 2\r\n\r\n", 18, &none, 0, out,
                     &out_len, &at);
  assert_int_equal(d.err, OM_HTTP1_E_TRAILER_TOO_MANY);
  /* overhead: framing bytes in all */
  om_http1_chunked_init(&d, 1024, 1024);
  d.max_overhead = 10;
  rc = decode_pieces(&d, "1\r\na\r\n1\r\nb\r\n0\r\n\r\n", 20, &none, 0, out,
                     &out_len, &at);
  assert_int_equal(rc, OM_HTTP1_ERROR);
  assert_int_equal(d.err, OM_HTTP1_E_CHUNK_OVERHEAD);
  /* the body limit applies to the sum of the chunks */
  om_http1_chunked_init(&d, 5, 1024);
  rc = decode_pieces(&d, "3\r\nabc\r\n3\r\n", 11, &none, 0, out, &out_len, &at);
  assert_int_equal(d.err, OM_HTTP1_E_CHUNK_TOO_LARGE);
  assert_int_equal(at, 8);
  /* after DONE, nothing more is taken */
  om_http1_chunked_init(&d, 5, 1024);
  rc = decode_pieces(&d, "0\r\n\r\nX", 6, &none, 0, out, &out_len, &at);
  assert_int_equal(rc, OM_HTTP1_DONE);
  assert_int_equal(at, 5);
}

static void lookalike_names_are_marked(void **state) {
  om_http1_framing_t fr;
  (void)state;
  om_http1_framing_init(&fr, OM_HTTP1_REQUEST);
  assert_int_equal(om_http1_framing_field(&fr, "Transfer-Encodin", 16, "x", 1),
                   OM_HTTP1_OK);
  assert_false(fr.te_lookalike);
  assert_int_equal(
      om_http1_framing_field(&fr, "TRANSFER-ENCODINGX", 18, "chunked", 7),
      OM_HTTP1_OK);
  assert_true(fr.te_lookalike);
  assert_int_equal(fr.n_te, 0);
}

static void descriptions(void **state) {
  int e;
  (void)state;
  for (e = 0; e < OM_HTTP1_E__COUNT; e++)
    assert_non_null(om_http1_err_desc((om_http1_err_t)e));
  assert_string_equal(om_http1_err_desc(OM_HTTP1_E__COUNT), "unknown");
  assert_string_equal(om_http1_err_desc(OM_HTTP1_E_CHUNK_BARE_LF),
                      "a bare LF in a chunk line");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(request_head),
      cmocka_unit_test(response_head),
      cmocka_unit_test(head_refusals),
      cmocka_unit_test(head_grows_on_demand),
      cmocka_unit_test(methods),
      cmocka_unit_test(framing_decisions),
      cmocka_unit_test(chunked_spans_at_every_split),
      cmocka_unit_test(chunked_refusals),
      cmocka_unit_test(chunked_limits),
      cmocka_unit_test(lookalike_names_are_marked),
      cmocka_unit_test(descriptions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
