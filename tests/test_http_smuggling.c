/*
 * test_http_smuggling.c: request framing and request-smuggling cases for
 * the HTTP/1.1 server (host/net/om_http_server.c), checked against RFC 9112
 * (message syntax and framing) and RFC 9110 (semantics).
 *
 * Each case is raw bytes sent over a real loopback socket to a real
 * om_http_server, with what a strict RFC 9112 reader makes of them: the
 * statuses of the responses, in order; whether the connection must end
 * after the last one; what the handler saw (method, target, version,
 * de-framed body and Host of every request it was given, in order); and
 * the rejection reason. The property under test is that the server never
 * hands its handler a different number of requests, or different request
 * boundaries, than a strict reader would: a request behind one that was
 * refused is never seen (every closing case is followed on the same write
 * by GET /smuggled), and a connection that stays open still reads the
 * next request correctly (every keep-alive case is followed by GET
 * /probe, which must be answered).
 *
 * Every case runs twice: the whole input in one write, and one byte per
 * write with a loop turn between bytes; both must give the same answer.
 */
#include "om_test.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_test_client.h"
#include "om_errno.h"
#include "om_http_server.h"

/* ------------------------------------------------------------------ */
/* fixture */

typedef struct {
  uv_loop_t loop;
  om_http_server_t *srv;
  int port, closed, seen;
  char log[4096]; /* what the handler saw, "|"-separated */
  /* stream_bodies: the streamed body so far (the limit is 64 bytes) */
  char body[128];
  size_t body_len;
} fx_t;

static htc_resp_t R[8];

/*
 * The handler's view of one request: "METHOD target 1.MINOR LEN:BODY@HOST"
 * (HOST "-" when absent), then " =PATH[?QUERY]" when that is not the
 * target as sent. It answers 200 with that line as the body.
 */
static void answer(fx_t *fx, om_http_request_t *req, const char *body,
                   size_t body_len) {
  char view[512];
  const char *host = om_http_request_header(req, "host", NULL);
  int n = snprintf(view, sizeof view, "%s %s 1.%d %zu:%.*s@%s", req->method,
                   req->target, req->version_minor, body_len,
                   (int)(body_len > 200 ? 200 : body_len), body,
                   host != NULL ? host : "-");
  size_t used = strlen(fx->log);
  char pq[256];
  int k = snprintf(pq, sizeof pq, "%s%s%s", req->path, req->query ? "?" : "",
                   req->query ? req->query : "");
  if (n > 0 && k > 0 && strcmp(pq, req->target) != 0)
    n += snprintf(view + n, sizeof view - (size_t)n, " =%s", pq);
  if (n > 0 && used + (size_t)n + 2 < sizeof fx->log)
    snprintf(fx->log + used, sizeof fx->log - used, "%s%s", used ? "|" : "",
             view);
  fx->seen++;
  om_http_respond(req, 200, NULL, 0, view, n > 0 ? (size_t)n : 0);
}

static void handler(om_http_request_t *req, void *ud) {
  answer(ud, req, req->body, req->body_len);
}

/* stream_bodies: the same view, answered when the body ended, so a body
 * refused after the dispatch leaves no trace in the log (as a refusal
 * before it does in the buffered mode) */
static void on_stream_data(om_http_request_t *req, const char *p, size_t n) {
  fx_t *fx = req->user;
  if (fx->body_len + n <= sizeof fx->body) {
    memcpy(fx->body + fx->body_len, p, n);
    fx->body_len += n;
  }
}

static void on_stream_end(om_http_request_t *req) {
  fx_t *fx = req->user;
  answer(fx, req, fx->body, fx->body_len);
}

/* A body refused after the dispatch ends the request through on_close:
 * the server frees it when this returns (without it the request would
 * stay the holder's, waiting for an end that never comes). */
static void on_stream_close(om_http_request_t *req) {
  (void)req;
}

static void stream_handler(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  req->user = fx;
  fx->body_len = 0;
  if (!req->body_streamed) {
    answer(fx, req, "", 0);
    return;
  }
  assert_int_equal(om_http_request_on_close(req, on_stream_close), 0);
  assert_int_equal(
      om_http_request_body_start(req, on_stream_data, on_stream_end), 0);
}

static void on_closed(om_http_server_t *srv, void *ud) {
  (void)srv;
  ((fx_t *)ud)->closed = 1;
}

static fx_t *fx_new(int stream) {
  fx_t *fx = calloc(1, sizeof *fx);
  om_http_server_opts_t o;
  memset(&o, 0, sizeof o);
  o.max_header_bytes = 1024;
  o.max_headers = 20;
  o.max_body_bytes = 64;
  o.stream_bodies = stream;
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  assert_int_equal(om_http_server_new(&fx->loop, &o,
                                      stream ? stream_handler : handler, fx,
                                      &fx->srv),
                   0);
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), 0);
  fx->port = om_http_server_port(fx->srv);
  OM_ASSERT_CMP(fx->port, >, 0);
  return fx;
}

static void fx_free(fx_t *fx) {
  uint64_t t0 = htc_now_ms();
  assert_int_equal(om_http_server_close(fx->srv, on_closed), 0);
  while (!fx->closed && htc_now_ms() - t0 < 10000)
    htc_step(&fx->loop, NULL, 1);
  assert_true(fx->closed);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  free(fx);
}

static uint64_t rejected_total(fx_t *fx) {
  const om_http_server_metrics_t *m = om_http_server_metrics(fx->srv);
  uint64_t t = 0;
  int i;
  for (i = 0; i < OM_HTTP_REJECT__COUNT; i++)
    t += m->rejected[i];
  return t;
}

static int wait_responses(fx_t *fx, htc_t *c, int n, int ms) {
  uint64_t t0 = htc_now_ms();
  for (;;) {
    int k = htc_responses(c, NULL, R, 8);
    if (k < 0 || k >= n || c->eof || htc_now_ms() - t0 > (uint64_t)ms)
      return c->eof ? htc_responses(c, NULL, R, 8) : k;
    htc_step(&fx->loop, c, 1);
  }
}

static int wait_eof(fx_t *fx, htc_t *c, int ms) {
  uint64_t t0 = htc_now_ms();
  while (!c->eof && htc_now_ms() - t0 < (uint64_t)ms)
    htc_step(&fx->loop, c, 1);
  return c->eof;
}

/* ------------------------------------------------------------------ */
/* the cases */

typedef struct {
  const char *name;
  const char *req;
  size_t len;
  int close;          /* the connection must end after the last response */
  const char *reason; /* the refusal's reason, NULL when none is refused */
  const char *view;   /* what the handler must have seen, in order */
  int status[6];      /* the responses, in order; 0 ends the list */
} case_t;

#define KEEP(name, req, view, ...)                                             \
  {                                                                            \
    name, req, sizeof(req) - 1, 0, NULL, view, {                               \
      __VA_ARGS__                                                              \
    }                                                                          \
  }
#define CLOSE(name, req, view, ...)                                            \
  {                                                                            \
    name, req, sizeof(req) - 1, 1, NULL, view, {                               \
      __VA_ARGS__                                                              \
    }                                                                          \
  }
#define BAD(name, req, status, reason)                                         \
  {                                                                            \
    name, req, sizeof(req) - 1, 1, reason, "", {                               \
      status                                                                   \
    }                                                                          \
  }
#define BAD_AFTER(name, req, reason, view, ...)                                \
  {                                                                            \
    name, req, sizeof(req) - 1, 1, reason, view, {                             \
      __VA_ARGS__                                                              \
    }                                                                          \
  }

#define H11 " HTTP/1.1\r\nHost: t\r\n"
#define CH "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
#define NEXT "GET /n HTTP/1.1\r\nHost: t\r\n\r\n"
#define V_NEXT "GET /n 1.1 0:@t"
#define V_HELLO "POST /c 1.1 5:hello@t"
#define SMUGGLED "GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"
#define PROBE "GET /probe HTTP/1.1\r\nHost: t\r\n\r\n"

static const case_t cases[] = {
    /* --- CL.TE and TE.CL: RFC 9112 6.1 (a server MAY reject a message
     * with both, and MUST close after responding) and 6.3 item 3 --- */
    BAD("cl.te",
        "POST /a" H11 "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n"
        "0\r\n\r\nX",
        400, "content_length_and_transfer_encoding"),
    BAD("te.cl",
        "POST /a" H11 "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
        "8\r\nSMUGGLED\r\n0\r\n\r\n",
        400, "content_length_and_transfer_encoding"),
    BAD("cl 0 + te",
        "POST /a" H11 "Content-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n",
        400, "content_length_and_transfer_encoding"),
    BAD("cl + te identity",
        "POST /a" H11 "Content-Length: 5\r\nTransfer-Encoding: identity\r\n\r\n"
        "hello",
        400, "content_length_and_transfer_encoding"),
    BAD("cl + obfuscated te",
        "POST /a" H11 "Content-Length: 5\r\nTransfer-Encoding: xchunked\r\n\r\n"
        "hello",
        400, "content_length_and_transfer_encoding"),
    BAD("cl + te in http/1.0",
        "POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: "
        "5\r\n\r\nhello",
        400, "content_length_and_transfer_encoding"),

    /* --- Transfer-Encoding values (RFC 9112 6.1, 6.3 item 4, 7; RFC 9110
     * 5.5: OWS around a value is not part of it; codings are
     * case-insensitive) --- */
    KEEP("te chunked + trailing sp",
         "POST /c" H11 "Transfer-Encoding: chunked \r\n\r\n"
         "5\r\nhello\r\n0\r\n\r\n",
         V_HELLO, 200),
    KEEP("te Chunked",
         "POST /c" H11 "Transfer-Encoding: Chunked\r\n\r\n"
         "5\r\nhello\r\n0\r\n\r\n",
         V_HELLO, 200),
    /* HTAB is OWS/BWS like SP (RFC 9110 5.6.3, 9112 7.1.1), also in the
     * three places http-parser 2.9 refuses it (the differential test
     * feeds it a SP there); the message is read as the RFC says. */
    KEEP("te chunked + trailing htab",
         "POST /c" H11 "Transfer-Encoding: chunked\t\r\n\r\n"
         "5\r\nhello\r\n0\r\n\r\n",
         V_HELLO, 200),
    KEEP("te htab around chunked",
         "POST /c" H11 "Transfer-Encoding:\t \tchunked \t\r\n\r\n"
         "5\r\nhello\r\n0\r\n\r\n",
         V_HELLO, 200),
    KEEP("cl + trailing htab",
         "POST /c" H11 "Content-Length: 5\t\r\n\r\nhello" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    KEEP("chunk ext BWS htab", CH "5\t;a=b\r\nhello\r\n0\r\n\r\n" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    KEEP("chunk ext BWS htab and sp, around = too",
         CH "5 \t; a\t=\tb\r\nhello\r\n0\r\n\r\n", V_HELLO, 200),
    KEEP("htab in chunk data is data", CH "5\r\nh\t\t\tj\r\n0\r\n\r\n",
         "POST /c 1.1 5:h\t\t\tj@t", 200),
    /* where no whitespace may be, a HTAB is still refused */
    BAD("htab inside a chunk-size",
        CH "1\t0\r\n"
           "0123456789abcdef\r\n0\r\n\r\n",
        400, "bad_chunk"),
    BAD("htab inside a content-length",
        "POST /c" H11 "Content-Length: 1\t0\r\n\r\n0123456789", 400,
        "bad_content_length"),
    BAD("htab before a field's colon",
        "POST /c" H11 "Content-Length\t: 5\r\n\r\nhello", 400, "bad_header"),
    BAD("htab before a chunk's CRLF", CH "5\r\nhello\t\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    /* Stricter than the RFC: empty elements in the Transfer-Encoding list
     * (RFC 9110 5.6.1.2 asks recipients to skip them). For the framing
     * header the strict reading is the safe one: http-parser 2.9, like
     * other readers a proxy may sit in front of, refuses them. */
    BAD("te chunked + empty element (stricter)",
        "POST /c" H11 "Transfer-Encoding: chunked,\r\n\r\n0\r\n\r\n", 400,
        "bad_transfer_encoding"),
    BAD("te empty element + chunked (stricter)",
        "POST /c" H11 "Transfer-Encoding: , chunked\r\n\r\n0\r\n\r\n", 400,
        "bad_transfer_encoding"),
    BAD("trailer content-length twice (stricter)",
        CH "0\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400,
        "bad_content_length"),
    KEEP("cl after htab", "POST /c" H11 "Content-Length:\t5\r\n\r\nhello",
         V_HELLO, 200),
    KEEP("te CHUNKED after htab",
         "POST /c" H11 "Transfer-Encoding:\tCHUNKED\r\n\r\n"
         "5\r\nhello\r\n0\r\n\r\n",
         V_HELLO, 200),
    BAD("te xchunked", "POST /c" H11 "Transfer-Encoding: xchunked\r\n\r\n", 400,
        "bad_transfer_encoding"),
    BAD("te chunkedx", "POST /c" H11 "Transfer-Encoding: chunkedx\r\n\r\n", 400,
        "bad_transfer_encoding"),
    BAD("te chunked, identity",
        "POST /c" H11 "Transfer-Encoding: chunked, identity\r\n\r\n"
        "0\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te identity, chunked (identity is no coding)",
        "POST /c" H11 "Transfer-Encoding: identity, chunked\r\n\r\n"
        "0\r\n\r\n",
        501, "unsupported_transfer_coding"),
    BAD("te identity", "POST /c" H11 "Transfer-Encoding: identity\r\n\r\n", 400,
        "bad_transfer_encoding"),
    BAD("te gzip, chunked",
        "POST /c" H11 "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
        "unsupported_transfer_coding"),
    BAD("te gzip then chunked fields",
        "POST /c" H11
        "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        "0\r\n\r\n",
        501, "unsupported_transfer_coding"),
    BAD("te chunked in two fields",
        "POST /c" H11
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
        "0\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te chunked then identity fields",
        "POST /c" H11
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n"
        "0\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te chunked, chunked",
        "POST /c" H11 "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te chunked with parameter",
        "POST /c" H11 "Transfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n", 400,
        "bad_transfer_encoding"),
    BAD("te quoted", "POST /c" H11 "Transfer-Encoding: \"chunked\"\r\n\r\n",
        400, "bad_transfer_encoding"),
    BAD("te empty", "POST /c" H11 "Transfer-Encoding:\r\n\r\n", 400,
        "bad_transfer_encoding"),
    /* RFC 9112 6.1: TE in HTTP/1.0 means faulty framing */
    BAD("te in http/1.0",
        "POST /c HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400,
        "bad_transfer_encoding"),
    /* RFC 9112 2.2: whitespace before the first field line */
    BAD("te leading sp on first field",
        "POST /c HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: t\r\n\r\n"
        "0\r\n\r\n",
        400, "bad_header"),
    /* RFC 9112 5.2: obs-fold */
    BAD("te leading sp on later field",
        "POST /c" H11 " Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400,
        "obs_fold"),
    BAD("te value folded",
        "POST /c" H11 "Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", 400,
        "obs_fold"),
    /* RFC 9112 5.1: no whitespace between name and colon, MUST 400 */
    BAD("te sp before colon",
        "POST /c" H11 "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400,
        "bad_header"),
    BAD("te htab before colon",
        "POST /c" H11 "Transfer-Encoding\t: chunked\r\n\r\n0\r\n\r\n", 400,
        "bad_header"),
    BAD("te vertical tab",
        "POST /c" H11 "Transfer-Encoding: \x0b"
        "chunked\r\n\r\n0\r\n\r\n",
        400, "bad_header"),
    /* Transfer_Encoding is another field: Content-Length frames */
    KEEP("transfer_encoding is not te",
         "POST /a" H11 "Transfer_Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
         "0\r\n\r\n" NEXT,
         "POST /a 1.1 5:0\r\n\r\n@t|" V_NEXT, 200, 200),

    /* --- Content-Length (RFC 9110 8.6, RFC 9112 6.3 item 5) --- */
    BAD("cl twice equal",
        "POST /a" H11 "Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        400, "bad_content_length"),
    BAD("cl twice differing",
        "POST /a" H11 "Content-Length: 5\r\ncontent-length: 6\r\n\r\nhello!",
        400, "bad_content_length"),
    BAD("cl list equal", "POST /a" H11 "Content-Length: 5, 5\r\n\r\nhello", 400,
        "bad_content_length"),
    BAD("cl list no space", "POST /a" H11 "Content-Length: 5,5\r\n\r\nhello",
        400, "bad_content_length"),
    BAD("cl plus", "POST /a" H11 "Content-Length: +5\r\n\r\nhello", 400,
        "bad_content_length"),
    BAD("cl minus", "POST /a" H11 "Content-Length: -1\r\n\r\nhello", 400,
        "bad_content_length"),
    BAD("cl inner space", "POST /a" H11 "Content-Length: 5 5\r\n\r\nhello", 400,
        "bad_content_length"),
    BAD("cl hex", "POST /a" H11 "Content-Length: 0x5\r\n\r\nhello", 400,
        "bad_content_length"),
    BAD("cl decimal point", "POST /a" H11 "Content-Length: 5.0\r\n\r\nhello",
        400, "bad_content_length"),
    BAD("cl empty", "POST /a" H11 "Content-Length:\r\n\r\nhello", 400,
        "bad_content_length"),
    BAD("cl blank", "POST /a" H11 "Content-Length:   \r\n\r\nhello", 400,
        "bad_content_length"),
    /* 1*DIGIT too big for 64 bits: RFC 9110 8.6 (no overflow); it is more
     * than any body we take, so 413 */
    BAD("cl over 2^64",
        "POST /a" H11 "Content-Length: 18446744073709551616\r\n\r\nhello", 413,
        "body_too_large"),
    BAD("cl over 2^63",
        "POST /a" H11 "Content-Length: 9223372036854775808\r\n\r\nhello", 413,
        "body_too_large"),
    BAD("cl over the limit", "POST /a" H11 "Content-Length: 65\r\n\r\nhello",
        413, "body_too_large"),
    KEEP("cl leading zeros",
         "POST /c" H11 "Content-Length: 0005\r\n\r\nhello" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    KEEP("cl with OWS", "POST /c" H11 "Content-Length:  5 \r\n\r\nhello" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    KEEP("cl short body then next",
         "POST /c" H11 "Content-Length: 3\r\n\r\nhel" NEXT,
         "POST /c 1.1 3:hel@t|" V_NEXT, 200, 200),
    KEEP("cl 0 then next", "POST /c" H11 "Content-Length: 0\r\n\r\n" NEXT,
         "POST /c 1.1 0:@t|" V_NEXT, 200, 200),
    KEEP("cl on GET", "GET /g" H11 "Content-Length: 5\r\n\r\nhello" NEXT,
         "GET /g 1.1 5:hello@t|" V_NEXT, 200, 200),
    /* no framing field: no body (RFC 9112 6.3 item 7) */
    BAD_AFTER("no framing, bytes after are the next request",
              "POST /c" H11 "\r\nhello", "method_not_implemented",
              "POST /c 1.1 0:@t", 200, 501),

    /* --- chunked (RFC 9112 7.1) --- */
    KEEP("chunked then next", CH "5\r\nhello\r\n0\r\n\r\n" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    KEEP("chunked two chunks", CH "2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n", V_HELLO,
         200),
    KEEP("chunk size leading zeros", CH "0005\r\nhello\r\n000\r\n\r\n", V_HELLO,
         200),
    KEEP("chunk size upper hex", CH "A\r\n0123456789\r\n0\r\n\r\n",
         "POST /c 1.1 10:0123456789@t", 200),
    KEEP("chunk ext token", CH "5;a=b\r\nhello\r\n0;z\r\n\r\n", V_HELLO, 200),
    KEEP("chunk ext quoted", CH "5;a=\"x; y \\\" z\"\r\nhello\r\n0\r\n\r\n",
         V_HELLO, 200),
    KEEP("chunk ext names only", CH "5;a;b;c\r\nhello\r\n0\r\n\r\n", V_HELLO,
         200),
    KEEP("chunk ext BWS (SP)", CH "5 ; a = b ;c\r\nhello\r\n0\r\n\r\n", V_HELLO,
         200),
    BAD("chunk size not hex", CH "5g\r\nhello\r\n0\r\n\r\n", 400, "bad_chunk"),
    BAD("chunk size 0x", CH "0x5\r\nhello\r\n0\r\n\r\n", 400, "bad_chunk"),
    BAD("chunk size negative", CH "-5\r\nhello\r\n0\r\n\r\n", 400, "bad_chunk"),
    BAD("chunk size leading sp", CH " 5\r\nhello\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    BAD("chunk size trailing sp", CH "5 \r\nhello\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    BAD("chunk size empty", CH "\r\nhello\r\n0\r\n\r\n", 400, "bad_chunk"),
    /* as for Content-Length: a size past the limit is 413 at the digit
     * that takes it there, however many digits follow */
    BAD("chunk size over 64 bits", CH "10000000000000005\r\nhello\r\n", 413,
        "body_too_large"),
    BAD("chunk size huge", CH "FFFFFFFFFFFFFFFF\r\nhello\r\n", 413,
        "body_too_large"),
    BAD("chunk ext no name", CH "5;=b\r\nhello\r\n0\r\n\r\n", 400, "bad_chunk"),
    BAD("chunk ext open quote", CH "5;a=\"b\r\nhello\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    BAD("chunk ext lf in quote", CH "5;a=\"x\ny\"\r\nhello\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    BAD("chunk ext bare cr", CH "5;a\rb\r\nhello\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    BAD("chunk ext nul", CH "5;a\0b\r\nhello\r\n0\r\n\r\n", 400, "bad_chunk"),
    BAD("chunk ext junk", CH "5;a=b c\r\nhello\r\n0\r\n\r\n", 400, "bad_chunk"),
    BAD("chunk ext empty value", CH "5;a=\r\nhello\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    /* RFC 9112 2.2 lets a recipient take a bare LF as a line end; we do
     * not, anywhere (see om_http_server.h) */
    BAD("chunk size line bare lf", CH "5\nhello\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    BAD("chunk data bare lf", CH "5\r\nhello\n0\r\n\r\n", 400, "bad_chunk"),
    BAD("last chunk bare lf", CH "5\r\nhello\r\n0\n\r\n", 400, "bad_chunk"),
    BAD("final crlf bare lf", CH "5\r\nhello\r\n0\r\n\n", 400, "bad_header"),
    BAD("chunk data no crlf", CH "5\r\nhelloXX0\r\n\r\n", 400, "bad_chunk"),
    BAD("chunk data longer than size", CH "3\r\nhello\r\n0\r\n\r\n", 400,
        "bad_chunk"),
    BAD("chunk data shorter than size", CH "7\r\nhello\r\n0\r\n\r\n" NEXT, 400,
        "bad_chunk"),
    /* without the final CRLF the next request line is read as a trailer
     * field line, and is not one */
    BAD("no final crlf", CH "5\r\nhello\r\n0\r\n" NEXT, 400, "bad_header"),
    /* trailer fields (RFC 9112 7.1.2): allowed, and dropped; the ones that
     * cannot be trailers (RFC 9110 6.5.1) are never applied */
    KEEP("trailer field", CH "5\r\nhello\r\n0\r\nX-T: a\r\nX-U:\r\n\r\n" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    KEEP("trailer content-length",
         CH "5\r\nhello\r\n0\r\nContent-Length: 40\r\n\r\n" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    KEEP("trailer transfer-encoding",
         CH "5\r\nhello\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    KEEP("trailer host", CH "5\r\nhello\r\n0\r\nHost: evil\r\n\r\n" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    BAD("trailer obs-fold", CH "0\r\nX-T: a\r\n b\r\n\r\n", 400, "obs_fold"),
    BAD("trailer bare lf", CH "0\r\nX-T: a\n\r\n", 400, "bad_header"),
    BAD("trailer no colon", CH "0\r\nX-T\r\n\r\n", 400, "bad_header"),
    BAD("trailer sp before colon", CH "0\r\nX-T : a\r\n\r\n", 400,
        "bad_header"),
    BAD("trailer nul", CH "0\r\nX-T: a\0\r\n\r\n", 400, "bad_header"),

    /* --- line endings and bytes of the head (RFC 9112 2.2, 5; RFC 9110
     * 5.5) --- */
    KEEP("empty lines before request line", "\r\n\r\nGET /a" H11 "\r\n",
         "GET /a 1.1 0:@t", 200),
    BAD("bare lf before request line", "\nGET /a" H11 "\r\n", 400,
        "bad_request_line"),
    BAD("request line bare lf", "GET /a HTTP/1.1\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("all bare lf", "GET /a HTTP/1.1\nHost: t\n\n", 400, "bad_request_line"),
    BAD("field line bare lf", "GET /a" H11 "X-A: b\nX-B: c\r\n\r\n", 400,
        "bad_header"),
    BAD("section end bare lf", "GET /a" H11 "\n", 400, "bad_header"),
    BAD("request line bare cr", "GET /a\rb HTTP/1.1\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("version bare cr", "GET /a HTTP/1.1\rHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("field value bare cr", "GET /a" H11 "X-A: b\rc\r\n\r\n", 400,
        "bad_header"),
    BAD("field name bare cr", "GET /a" H11 "X-A\r: b\r\n\r\n", 400,
        "bad_header"),
    BAD("nul in method", "G\0T /a" H11 "\r\n", 400, "bad_request_line"),
    BAD("nul in target", "GET /a\0b" H11 "\r\n", 400, "bad_target"),
    BAD("nul in version", "GET /a HTTP/1.\0\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("nul in field name", "GET /a" H11 "X\0A: b\r\n\r\n", 400, "bad_header"),
    BAD("nul in field value", "GET /a" H11 "X-A: b\0c\r\n\r\n", 400,
        "bad_header"),
    BAD("del in field value", "GET /a" H11 "X-A: b\x7f\r\n\r\n", 400,
        "bad_header"),
    BAD("obs-fold sp", "GET /a" H11 "X-A: b\r\n c\r\n\r\n", 400, "obs_fold"),
    BAD("obs-fold htab", "GET /a" H11 "X-A: b\r\n\tc\r\n\r\n", 400, "obs_fold"),
    BAD("field name with (", "GET /a" H11 "X(A: b\r\n\r\n", 400, "bad_header"),
    BAD("field name with /", "GET /a" H11 "X/A: b\r\n\r\n", 400, "bad_header"),
    BAD("field name empty", "GET /a" H11 ": b\r\n\r\n", 400, "bad_header"),
    BAD("whitespace line before fields",
        "GET /a HTTP/1.1\r\n \r\nHost: t\r\n\r\n", 400, "bad_header"),
    KEEP("obs-text and htab in a value",
         "GET /a" H11 "X-A: \t\x80\xff b\t\r\n\r\n", "GET /a 1.1 0:@t", 200),

    /* --- the request line (RFC 9112 3, 3.2, 2.3; RFC 9110 6.2, 9.1) --- */
    BAD("method with @", "G@T /a" H11 "\r\n", 400, "bad_request_line"),
    BAD("method unknown", "FOO /a" H11 "\r\n", 501, "method_not_implemented"),
    BAD("method lower case", "get /a" H11 "\r\n", 501,
        "method_not_implemented"),
    BAD("two spaces after method", "GET  /a" H11 "\r\n", 400,
        "bad_request_line"),
    BAD("two spaces before version", "GET /a  HTTP/1.1\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("htab separator", "GET\t/a HTTP/1.1\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("trailing space", "GET /a HTTP/1.1 \r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("no version", "GET /a\r\nHost: t\r\n\r\n", 400, "bad_request_line"),
    KEEP("absolute-form", "GET http://t/x?q HTTP/1.1\r\nHost: t\r\n\r\n",
         "GET http://t/x?q 1.1 0:@t =/x?q", 200),
    /* RFC 9112 3.2.2: the target's authority wins over Host */
    KEEP("absolute-form, Host differs",
         "GET http://a.example:81/x HTTP/1.1\r\nHost: b.example\r\n\r\n",
         "GET http://a.example:81/x 1.1 0:@a.example:81 =/x", 200),
    KEEP("absolute-form https, empty Host",
         "GET https://A.example HTTP/1.1\r\nHost:\r\n\r\n",
         "GET https://A.example 1.1 0:@A.example =/", 200),
    CLOSE("absolute-form in HTTP/1.0 without Host",
          "GET http://a.example/x HTTP/1.0\r\n\r\n",
          "GET http://a.example/x 1.0 0:@a.example =/x", 200),
    /* RFC 9112 3.2.4: OPTIONS with an empty path means the server as a
     * whole, "*" in origin-form; with a query it is "/" */
    KEEP("OPTIONS absolute-form, empty path",
         "OPTIONS http://t HTTP/1.1\r\nHost: t\r\n\r\n",
         "OPTIONS http://t 1.1 0:@t =*", 200),
    KEEP("OPTIONS absolute-form, query",
         "OPTIONS http://t?q HTTP/1.1\r\nHost: t\r\n\r\n",
         "OPTIONS http://t?q 1.1 0:@t =/?q", 200),
    BAD("authority-form with GET", "GET t:80" H11 "\r\n", 400, "bad_target"),
    BAD("connect", "CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\n\r\n", 501,
        "method_not_implemented"),
    KEEP("asterisk-form with OPTIONS", "OPTIONS *" H11 "\r\n",
         "OPTIONS * 1.1 0:@t", 200),
    BAD("asterisk-form with GET", "GET *" H11 "\r\n", 400, "bad_target"),
    BAD("fragment", "GET /a#f" H11 "\r\n", 400, "bad_target"),
    /* RFC 9110 6.2: a higher minor version is processed as 1.1 */
    KEEP("HTTP/1.2", "GET /a HTTP/1.2\r\nHost: t\r\n\r\n", "GET /a 1.1 0:@t",
         200),
    BAD("HTTP/1.9 without Host", "GET /a HTTP/1.9\r\n\r\n", 400, "bad_host"),
    BAD("HTTP/2.0", "GET /a HTTP/2.0\r\nHost: t\r\n\r\n", 505,
        "version_not_supported"),
    BAD("HTTP/3.0", "GET /a HTTP/3.0\r\nHost: t\r\n\r\n", 505,
        "version_not_supported"),
    BAD("HTTP/0.9", "GET /a HTTP/0.9\r\nHost: t\r\n\r\n", 505,
        "version_not_supported"),
    BAD("HTTP/1", "GET /a HTTP/1\r\nHost: t\r\n\r\n", 400, "bad_request_line"),
    BAD("HTTP/1.1.1", "GET /a HTTP/1.1.1\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("HTTP/11.1", "GET /a HTTP/11.1\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),
    BAD("http/1.1", "GET /a http/1.1\r\nHost: t\r\n\r\n", 400,
        "bad_request_line"),

    /* --- Host (RFC 9112 3.2, RFC 9110 7.2) --- */
    BAD("no Host in 1.1", "GET /a HTTP/1.1\r\n\r\n", 400, "bad_host"),
    CLOSE("no Host in 1.0", "GET /a HTTP/1.0\r\n\r\n", "GET /a 1.0 0:@-", 200),
    BAD("two Host", "GET /a" H11 "Host: u\r\n\r\n", 400, "bad_host"),
    BAD("two equal Host", "GET /a" H11 "Host: t\r\n\r\n", 400, "bad_host"),
    BAD("Host list", "GET /a HTTP/1.1\r\nHost: a, b\r\n\r\n", 400, "bad_host"),
    BAD("Host userinfo", "GET /a HTTP/1.1\r\nHost: u@t\r\n\r\n", 400,
        "bad_host"),
    BAD("Host path", "GET /a HTTP/1.1\r\nHost: t/x\r\n\r\n", 400, "bad_host"),
    BAD("Host bad port", "GET /a HTTP/1.1\r\nHost: t:8x\r\n\r\n", 400,
        "bad_host"),
    BAD("two Host with absolute-form",
        "GET http://t/ HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n", 400,
        "bad_host"),
    BAD("no Host with absolute-form in 1.1", "GET http://t/ HTTP/1.1\r\n\r\n",
        400, "bad_host"),
    KEEP("Host empty", "GET /a HTTP/1.1\r\nHost:\r\n\r\n", "GET /a 1.1 0:@",
         200),
    KEEP("Host IPv6 and port", "GET /a HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
         "GET /a 1.1 0:@[::1]:8080", 200),

    /* --- pipelining and persistence (RFC 9112 9.3, 9.6) --- */
    KEEP("two requests in one packet", "GET /a" H11 "\r\n" NEXT,
         "GET /a 1.1 0:@t|" V_NEXT, 200, 200),
    BAD("bad then good", "GET /a#b" H11 "\r\n" NEXT, 400, "bad_target"),
    BAD_AFTER("good then bad",
              "GET /a" H11 "\r\n"
              "GET /a#b" H11 "\r\n",
              "bad_target", "GET /a 1.1 0:@t", 200, 400),
    CLOSE("Connection: close stops the next",
          "GET /a" H11 "Connection: close\r\n\r\n" NEXT, "GET /a 1.1 0:@t",
          200),
    CLOSE("Connection: close, then garbage is never parsed",
          "GET /a" H11 "Connection: keep-alive, close\r\n\r\n\x01garbage\r\n",
          "GET /a 1.1 0:@t", 200),
    CLOSE("HTTP/1.0 without keep-alive stops the next",
          "GET /a HTTP/1.0\r\n\r\n" NEXT, "GET /a 1.0 0:@-", 200),
    KEEP("HTTP/1.0 keep-alive persists",
         "GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" NEXT,
         "GET /a 1.0 0:@-|" V_NEXT, 200, 200),
    KEEP("body then next", "POST /c" H11 "Content-Length: 5\r\n\r\nhello" NEXT,
         V_HELLO "|" V_NEXT, 200, 200),
    BAD("413 before the body, body never read as requests",
        "POST /a" H11 "Content-Length: 100\r\n\r\n" NEXT NEXT NEXT, 413,
        "body_too_large"),

    /* --- Expect (RFC 9110 10.1.1) --- */
    KEEP("expect 100-continue",
         "POST /c" H11 "Expect: 100-continue\r\nContent-Length: 5\r\n\r\nhello",
         V_HELLO, 100, 200),
    KEEP("expect 100-continue any case, chunked",
         "POST /c" H11 "Expect: 100-Continue\r\nTransfer-Encoding: "
         "chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
         V_HELLO, 100, 200),
    KEEP("expect 100-continue without a body",
         "GET /a" H11 "Expect: 100-continue\r\n\r\n", "GET /a 1.1 0:@t", 200),
    BAD("expect other",
        "POST /c" H11 "Expect: x\r\nContent-Length: 5\r\n\r\nhello", 417,
        "expectation_failed"),
    BAD("expect 100-continue, over the limit",
        "POST /c" H11 "Expect: 100-continue\r\nContent-Length: 65\r\n\r\n", 413,
        "body_too_large"),
    CLOSE("expect ignored in HTTP/1.0",
          "POST /c HTTP/1.0\r\nExpect: x\r\nContent-Length: 5\r\n\r\nhello",
          "POST /c 1.0 5:hello@-", 200),
};

/* ------------------------------------------------------------------ */
/* running one case */

static size_t n_status(const case_t *k) {
  size_t n = 0;
  while (n < 6 && k->status[n] != 0)
    n++;
  return n;
}

/* How the bytes go out: all in one write, one byte per write, or two
 * writes split at a position, with loop turns between writes. */
#define ONE_WRITE 0
#define DRIBBLE ((size_t)-1)

static void send_all(fx_t *fx, htc_t *c, const char *d, size_t n,
                     size_t split) {
  size_t i;
  if (split == ONE_WRITE || (split != DRIBBLE && split >= n)) {
    (void)htc_send(&fx->loop, c, d, n); /* the server may close early */
    return;
  }
  if (split != DRIBBLE) {
    if (htc_send(&fx->loop, c, d, split) != 0)
      return;
    for (i = 0; i < 3; i++)
      htc_step(&fx->loop, c, 1);
    if (!c->eof)
      (void)htc_send(&fx->loop, c, d + split, n - split);
    return;
  }
  for (i = 0; i < n && !c->eof; i++) {
    if (htc_send(&fx->loop, c, d + i, 1) != 0)
      return;
    htc_step(&fx->loop, c, 0);
  }
}

/* Failures are printed and counted, so one run shows every wrong case. */
#define FAIL(...)                                                              \
  do {                                                                         \
    print_error(__VA_ARGS__);                                                  \
    print_error("\n");                                                         \
    htc_free(c);                                                               \
    return 1;                                                                  \
  } while (0)

static int run_case(fx_t *fx, const case_t *k, size_t split) {
  static char wire[8192];
  char mode[48];
  htc_t *c = htc_new("127.0.0.1", fx->port);
  size_t ns = n_status(k), len = k->len, i;
  uint64_t rej0 = rejected_total(fx);
  char view[sizeof fx->log];
  int n;
  assert_non_null(c);
  if (split == ONE_WRITE)
    snprintf(mode, sizeof mode, "one write");
  else if (split == DRIBBLE)
    snprintf(mode, sizeof mode, "byte at a time");
  else
    snprintf(mode, sizeof mode, "split at %zu", split);
  fx->log[0] = 0;
  fx->seen = 0;
  OM_ASSERT_CMP(len + sizeof SMUGGLED, <, sizeof wire);
  memcpy(wire, k->req, len);
  if (k->close) { /* never to be seen */
    memcpy(wire + len, SMUGGLED, sizeof SMUGGLED - 1);
    len += sizeof SMUGGLED - 1;
  }
  send_all(fx, c, wire, len, split);
  if (k->close) {
    if (!wait_eof(fx, c, 3000))
      FAIL("%s (%s): the connection stayed open", k->name, mode);
    n = htc_responses(c, NULL, R, 8);
  } else {
    n = wait_responses(fx, c, (int)ns, 3000);
  }
  snprintf(view, sizeof view, "%s", fx->log);
  if (n != (int)ns)
    FAIL("%s (%s): %d responses, want %zu (%zu bytes: %.*s) saw [%s]", k->name,
         mode, n, ns, c->len, (int)(c->len > 300 ? 300 : c->len), c->buf, view);
  for (i = 0; i < ns; i++)
    if (R[i].status != k->status[i])
      FAIL("%s (%s): response %zu is %d, want %d (%s)", k->name, mode, i,
           R[i].status, k->status[i], R[i].body);
  if (strcmp(view, k->view) != 0)
    FAIL("%s (%s): the handler saw [%s], want [%s]", k->name, mode, view,
         k->view);
  if (k->reason != NULL) {
    char body[128];
    snprintf(body, sizeof body, "{\"error\":\"%s\"}", k->reason);
    if (strcmp(R[ns - 1].body, body) != 0)
      FAIL("%s (%s): answer %s, want %s", k->name, mode, R[ns - 1].body, body);
  }
  if (rejected_total(fx) - rej0 != (k->reason != NULL ? 1u : 0u))
    FAIL("%s (%s): %llu rejections counted, want %d", k->name, mode,
         (unsigned long long)(rejected_total(fx) - rej0), k->reason != NULL);
  if (k->close) {
    if (!R[ns - 1].close)
      FAIL("%s (%s): no Connection: close", k->name, mode);
  } else {
    /* still open, and the next request on it reads right */
    if (c->eof)
      FAIL("%s (%s): the connection was closed", k->name, mode);
    for (i = 0; i < ns; i++)
      if (R[i].close)
        FAIL("%s (%s): Connection: close on response %zu", k->name, mode, i);
    assert_int_equal(htc_sends(&fx->loop, c, PROBE), 0);
    n = wait_responses(fx, c, (int)ns + 1, 3000);
    if (n != (int)ns + 1 || R[ns].status != 200 ||
        strcmp(R[ns].body, "GET /probe 1.1 0:@t") != 0)
      FAIL("%s (%s): the probe after it was not answered right (%d "
           "responses, saw [%s])",
           k->name, mode, n, fx->log);
  }
  htc_free(c);
  return 0;
}

/* splits: 0 one write, 1 byte at a time, 2 two writes split at a third,
 * a half and two thirds of the case (three runs per case) */
static void run_table(const case_t *t, size_t n, int splits, int stream) {
  fx_t *fx = fx_new(stream);
  size_t i, rejected = 0;
  int failed = 0;
  for (i = 0; i < n; i++) {
    if (splits == 0) {
      failed += run_case(fx, &t[i], ONE_WRITE);
    } else if (splits == 1) {
      failed += run_case(fx, &t[i], DRIBBLE);
    } else {
      int j;
      for (j = 1; j <= 3; j++) {
        size_t at = t[i].len * (size_t)(j + 1) / 6; /* 1/3, 1/2, 2/3 */
        failed += run_case(fx, &t[i], at > 0 ? at : 1);
        rejected += t[i].reason != NULL;
      }
      continue;
    }
    rejected += t[i].reason != NULL;
  }
  assert_int_equal(failed, 0);
  assert_int_equal(rejected_total(fx), rejected);
  fx_free(fx);
}

static void table_in_one_write(void **state) {
  (void)state;
  run_table(cases, sizeof cases / sizeof cases[0], 0, 0);
  OM_TEST_NOTE("cases: %zu", sizeof cases / sizeof cases[0]);
}

static void table_byte_at_a_time(void **state) {
  (void)state;
  run_table(cases, sizeof cases / sizeof cases[0], 1, 0);
}

static void table_in_two_writes(void **state) {
  (void)state;
  run_table(cases, sizeof cases / sizeof cases[0], 2, 0);
}

/* The same table with streamed bodies (stream_bodies): the handler runs
 * at the head and reads the body through callbacks; every answer, every
 * view and every count must be the same, however the bytes are split. */
static void streamed_table_in_one_write(void **state) {
  (void)state;
  run_table(cases, sizeof cases / sizeof cases[0], 0, 1);
}

static void streamed_table_byte_at_a_time(void **state) {
  (void)state;
  run_table(cases, sizeof cases / sizeof cases[0], 1, 1);
}

static void streamed_table_in_two_writes(void **state) {
  (void)state;
  run_table(cases, sizeof cases / sizeof cases[0], 2, 1);
}

/* ------------------------------------------------------------------ */
/* cases too long to write out: limits (RFC 9112 3, RFC 6585 5) */

static char *repeat(char *p, char ch, size_t n) {
  memset(p, ch, n);
  return p + n;
}

static void limits(void **state) {
  static char b[6][4096];
  static const char *views[6] = {"", "", "", "", "", ""};
  char *p;
  int i;
  case_t t[7];
  fx_t *fx;
  int failed = 0;
  (void)state;
  memset(t, 0, sizeof t);
  /* 0: a request-target over the header limit: 414 */
  p = b[0] + sprintf(b[0], "GET /");
  p = repeat(p, 'a', 1100);
  strcpy(p, H11 "\r\n");
  t[0] = (case_t)BAD("target too long", "", 414, "target_too_long");
  /* 1: a header section over the limit: 431 */
  p = b[1] + sprintf(b[1], "GET /a" H11 "X-Big: ");
  p = repeat(p, 'v', 1100);
  strcpy(p, "\r\n\r\n");
  t[1] = (case_t)BAD("head too large", "", 431, "headers_too_large");
  /* 2: 21 field lines, over max_headers: 431 */
  p = b[2] + sprintf(b[2], "GET /a" H11);
  for (i = 0; i < 20; i++)
    p += sprintf(p, "X-%d: v\r\n", i);
  strcpy(p, "\r\n");
  t[2] = (case_t)BAD("too many fields", "", 431, "headers_too_large");
  /* 3: exactly max_headers: fine */
  p = b[3] + sprintf(b[3], "GET /a" H11);
  for (i = 0; i < 19; i++)
    p += sprintf(p, "X-%d: v\r\n", i);
  strcpy(p, "\r\n");
  t[3] = (case_t)KEEP("max fields", "", "GET /a 1.1 0:@t", 200);
  /* 4: a method longer than any we implement: 501 (RFC 9112 3), even
   * when it does not fit the header limit */
  p = repeat(b[4], 'M', 1500);
  strcpy(p, " /a" H11 "\r\n");
  t[4] = (case_t)BAD("method too long", "", 501, "method_not_implemented");
  /* 5: a trailer section over the limit: 431 */
  p = b[5] + sprintf(b[5], CH "0\r\nX-T: ");
  p = repeat(p, 't', 1100);
  strcpy(p, "\r\n\r\n");
  t[5] = (case_t)BAD("trailers too large", "", 431, "headers_too_large");
  for (i = 0; i < 6; i++) {
    t[i].req = b[i];
    t[i].len = strlen(b[i]);
    if (t[i].close == 0)
      continue;
    t[i].view = views[i];
  }
  fx = fx_new(0);
  for (i = 0; i < 6; i++)
    failed += run_case(fx, &t[i], ONE_WRITE);
  assert_int_equal(failed, 0);
  fx_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(table_in_one_write),
      cmocka_unit_test(table_byte_at_a_time),
      cmocka_unit_test(table_in_two_writes),
      cmocka_unit_test(streamed_table_in_one_write),
      cmocka_unit_test(streamed_table_byte_at_a_time),
      cmocka_unit_test(streamed_table_in_two_writes),
      cmocka_unit_test(limits),
  };
  signal(SIGPIPE, SIG_IGN); /* libuv writes with writev */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
