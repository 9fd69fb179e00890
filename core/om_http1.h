/*
 * om_http1.h: HTTP/1.1 message framing (RFC 9112), for both directions.
 *
 * One home for the grammar the HTTP server (requests) and the upstream
 * client (responses) must agree on byte for byte: the request-line
 * (RFC 9112 3) and the status-line (4), field lines (5; RFC 9110 5.5),
 * the Content-Length / Transfer-Encoding decision (RFC 9112 6.1-6.3) with
 * the smuggling defences, and the chunked transfer coding (7.1) with its
 * extensions and trailer section. Pure C like the SSE parser: no I/O, no
 * clock, no globals, no allocation; the caller owns every buffer and
 * passes every limit.
 *
 * Strictness, where RFC 9112 leaves a choice: a bare LF is never a line
 * end (2.2 says MAY), anywhere; a bare CR is refused (2.2); obs-fold is
 * refused (5.2), as is whitespace before the first field line (2.2) and
 * between a field name and its colon (5.1); a repeated Content-Length is
 * refused even with equal values (RFC 9110 8.6 allows merging them); a
 * message with both Content-Length and Transfer-Encoding is refused
 * (6.1); so are empty elements in a Transfer-Encoding list (RFC 9110
 * 5.6.1.2 would skip them: for the framing field the strict reading is
 * the safe one). A message two implementations could frame differently
 * is a request-smuggling vector: it is refused, never repaired.
 *
 * Every function is incremental where input arrives in pieces: any split
 * of a message into calls gives the same result and refuses at the same
 * byte. The head parser works on the head so far, kept contiguous by the
 * caller (offsets are relative to its first byte, so the caller may move
 * it); the chunked decoder takes arbitrary spans and hands back spans of
 * body data that point into them.
 *
 * http-parser is not used here: tests/test_http1_fuzz.c compares this
 * module against it on generated messages (the differential oracle).
 */
#ifndef OM_HTTP1_H
#define OM_HTTP1_H

#include <stddef.h>
#include <stdint.h>

/*
 * Why a message was refused: XX(name, description). The description is
 * the detail a caller may log or report ("a bare LF in a chunk line");
 * each caller maps the names to its own answer (the server to its
 * OM_HTTP_REJECT_MAP reasons and statuses, the upstream client to its
 * failure details).
 */
#define OM_HTTP1_ERR_MAP(XX)                                                   \
  XX(REQUEST_LINE, "a malformed request-line")                                 \
  XX(METHOD_TOO_LONG, "a method longer than any known one")                    \
  XX(TARGET_BYTE, "a byte that cannot be in a request-target")                 \
  XX(TARGET_TOO_LONG, "the request-target exceeds the header limit")           \
  XX(STATUS_VERSION,                                                           \
     "the status line does not start with HTTP/1.0 or HTTP/1.1")               \
  XX(STATUS_CODE, "the status code is not three digits")                       \
  XX(STATUS_RANGE, "the status code is outside 100..599")                      \
  XX(STATUS_AFTER_CODE, "the status code is not followed by SP or CRLF")       \
  XX(REASON_CTL, "a control character in the reason phrase")                   \
  XX(STATUS_BARE_CR, "a bare CR in the status line")                           \
  XX(BARE_LF, "a bare LF in the head")                                         \
  XX(WS_BEFORE_FIRST_FIELD, "whitespace before the first field line")          \
  XX(OBS_FOLD, "obs-fold (a field line continued on the next line)")           \
  XX(NAME_NOT_TOKEN, "a field name that is not a token")                       \
  XX(WS_BEFORE_COLON, "whitespace between a field name and the colon")         \
  XX(VALUE_CTL, "a control character in a field value")                        \
  XX(VALUE_BARE_CR, "a bare CR in a field value")                              \
  XX(END_BARE_CR, "a bare CR in the empty line ending the head")               \
  XX(TOO_MANY_FIELDS, "more field lines than allowed")                         \
  XX(HEAD_TOO_LARGE, "the head exceeds the header limit")                      \
  XX(CL_INVALID, "an invalid Content-Length")                                  \
  XX(CL_REPEATED, "more than one Content-Length")                              \
  XX(TE_BAD, "a malformed Transfer-Encoding list")                             \
  XX(TE_REPEATED, "more than one Transfer-Encoding field")                     \
  XX(TE_NOT_CHUNKED, "a Transfer-Encoding whose final coding is not chunked")  \
  XX(TE_UNSUPPORTED, "a transfer coding other than chunked")                   \
  XX(TE_HTTP10, "Transfer-Encoding in an HTTP/1.0 message")                    \
  XX(CL_AND_TE, "both Content-Length and Transfer-Encoding")                   \
  XX(CHUNK_SIZE, "a chunk size that is not hex digits")                        \
  XX(CHUNK_TOO_LARGE, "a chunk size past the body limit")                      \
  XX(CHUNK_EXT, "a malformed chunk extension")                                 \
  XX(CHUNK_BARE_CR, "a bare CR in a chunk line")                               \
  XX(CHUNK_BARE_LF, "a bare LF in a chunk line")                               \
  XX(CHUNK_LINE_TOO_LONG, "a chunk line over the line limit")                  \
  XX(CHUNK_DATA_CRLF, "chunk-data not followed by CRLF")                       \
  XX(CHUNK_OVERHEAD, "more chunk framing bytes than allowed")                  \
  XX(TRAILER_FIELD, "a malformed trailer field")                               \
  XX(TRAILER_OBS_FOLD, "obs-fold in the trailer section")                      \
  XX(TRAILER_BARE_LF, "a bare LF in the trailer section")                      \
  XX(TRAILER_TOO_LARGE, "the trailer section exceeds its limit")               \
  XX(TRAILER_TOO_MANY, "more trailer fields than allowed")                     \
  XX(TRAILER_CONTENT_LENGTH, "an invalid Content-Length in the trailers")      \
  XX(CHUNK_END, "no CRLF ending the chunked message")

typedef enum {
  OM_HTTP1_OK = 0,
#define OM__HTTP1_ERR_ENUM(name, desc) OM_HTTP1_E_##name,
  OM_HTTP1_ERR_MAP(OM__HTTP1_ERR_ENUM)
#undef OM__HTTP1_ERR_ENUM
      OM_HTTP1_E__COUNT
} om_http1_err_t;

/* "OM_HTTP1_E_BARE_LF" -> "a bare LF in the head"; "success" for OK,
 * "unknown" out of range. Never NULL; static. */
const char *om_http1_err_desc(om_http1_err_t err);

/* What the incremental functions return. */
enum {
  OM_HTTP1_MORE = 0,  /* every byte taken; call again with more */
  OM_HTTP1_DONE = 1,  /* the head (or the chunked body) is complete */
  OM_HTTP1_GROW = 2,  /* head: the field array is full, see below */
  OM_HTTP1_DATA = 3,  /* chunked: a span of body data is handed back */
  OM_HTTP1_ERROR = -1 /* refused: see ->err; nothing after it is read */
};

/* A method token longer than this is refused at once (RFC 9112 3: 501
 * rather than 431 once the limit is reached); longer than any method
 * om_http1_method_known() knows. */
#define OM_HTTP1_METHOD_MAX 16u

/* One field line, as offsets from the head's first byte. The value has
 * leading and trailing OWS trimmed (RFC 9110 5.5). */
typedef struct {
  uint32_t name_off, name_len, value_off, value_len;
} om_http1_field_t;

enum { OM_HTTP1_REQUEST = 0, OM_HTTP1_RESPONSE = 1 };

/*
 * The head parser. Set it up with om_http1_head_init, then call
 * om_http1_head_parse with the head so far (the same first byte every
 * time, more bytes each time) until it returns DONE or ERROR. The public
 * members after the limits are results, valid once DONE (method and
 * target once past the request-line; om_http1_head_past_method).
 */
typedef struct om_http1_head_s {
  /* set by the caller; may be changed between calls */
  om_http1_field_t *fields; /* room for fields_cap field lines */
  size_t fields_cap;
  size_t max_fields; /* beyond it TOO_MANY_FIELDS */
  size_t max_bytes;  /* head bytes allowed (leading empty lines count) */
  /* results */
  int kind;          /* OM_HTTP1_REQUEST or OM_HTTP1_RESPONSE */
  size_t pos;        /* bytes taken; on DONE the head's length */
  size_t n_fields;   /* field lines recorded in fields */
  size_t line_start; /* request-line or status-line start */
  size_t method_len; /* request: method at line_start */
  size_t target_off, target_len;
  int major, minor; /* request: DIGIT.DIGIT; response: 1.0 or 1.1 */
  int status;       /* response */
  size_t reason_off, reason_len; /* response: the reason phrase, maybe "" */
  om_http1_err_t err;            /* on ERROR */
  /* private */
  int st;
  size_t name_start, name_end, value_start, value_end;
} om_http1_head_t;

/*
 * om_http1_head_init: a parser for a request or response head, with room
 * for fields_cap field lines in fields (may be NULL with 0: the first
 * field line then asks to GROW), at most max_fields of them and
 * max_bytes of head. Never fails.
 */
void om_http1_head_init(om_http1_head_t *h, int kind, om_http1_field_t *fields,
                        size_t fields_cap, size_t max_fields, size_t max_bytes);

/*
 * om_http1_head_parse: go on scanning b[0, len) (the head so far, from
 * its first byte; len never shrinks between calls) where the last call
 * stopped. Returns MORE, DONE (h->pos is the head's length: the bytes
 * after it are the body or the next message), ERROR (h->err; h->pos is
 * the refused byte), or GROW: a field line is complete but fields is
 * full; point fields at a larger array holding the same first n_fields
 * entries, raise fields_cap, and call again (nothing is lost).
 *
 * A request may be preceded by empty lines (RFC 9112 2.2); a response may
 * not. The limit counts from b[0]; reaching it inside the request-target
 * is TARGET_TOO_LONG, elsewhere HEAD_TOO_LARGE.
 */
int om_http1_head_parse(om_http1_head_t *h, const char *b, size_t len);

/* Whether a request parser has read its whole method (so the method is
 * b[line_start, line_start + method_len)). */
int om_http1_head_past_method(const om_http1_head_t *h);

/* Whether m[0, n) is a method this implementation knows (RFC 9110 9 and
 * the registered WebDAV, versioning, UPnP and link methods: the set
 * http-parser 2.9 knows, so that both refuse the same tokens with 501).
 * Methods are case-sensitive. */
int om_http1_method_known(const char *m, size_t n);

/*
 * The request-target (RFC 9112 3.2): origin-form, absolute-form (http
 * and https only, an authority without userinfo), asterisk-form (with
 * OPTIONS only); every byte RFC 3986 allows there, %-escapes whole, no
 * fragment. Offsets are relative to the target.
 */
typedef struct {
  size_t path_off, path_len, query_off, query_len;
  size_t auth_off, auth_len; /* absolute-form: the authority */
  int has_query, root;       /* root: absolute-form with an empty path */
  int absolute;
} om_http1_target_t;

/* om_http1_target_parse: t[0, n) (n > 0) for method m[0, ml). Returns 0
 * and *out, or -1 (a target a server must refuse: 400). */
int om_http1_target_parse(const char *m, size_t ml, const char *t, size_t n,
                          om_http1_target_t *out);

/* Whether a[0, n) is authority = host [":" port] without userinfo (RFC
 * 9110 4.2.4, 7.2: a Host value, or the authority of an absolute-form
 * target); require_host: an http(s) URI must not have an empty host
 * (RFC 9110 4.2.1). */
int om_http1_authority_valid(const char *a, size_t n, int require_host);

/* The reason phrase a response with this status carries ("Not Found"):
 * the IANA registry's names (RFC 9110 15), "" for a status without one.
 * Static, never NULL. */
const char *om_http1_reason_phrase(int status);

/*
 * The framing decision (RFC 9112 6.1-6.3), field by field, in arrival
 * order, then once at the end. Requests and responses differ only where
 * the callers' contracts do: a response may carry one Transfer-Encoding
 * field only and a Content-Length up to 2^63-1 (the client reports it as
 * an int64_t); a request's length saturates at UINT64_MAX (the caller's
 * body limit refuses it). The order of the checks follows each
 * direction's documented answers.
 */
typedef struct {
  int kind;            /* OM_HTTP1_REQUEST or OM_HTTP1_RESPONSE */
  unsigned n_cl, n_te; /* Content-Length and Transfer-Encoding fields */
  uint64_t cl;         /* the Content-Length (saturated) */
  /* the Transfer-Encoding list, over every field (RFC 9110 5.3) */
  unsigned te_codings; /* codings in it */
  int te_chunked, te_last_chunked, te_unknown, te_bad;
  /* a field whose name begins with "Transfer-Encoding" and goes on
   * ("Transfer-Encodings"): not a framing field, but http-parser 2.9
   * reads it as one (it refuses the message then, or reads the body to
   * the close), and so could a reader behind us; callers refuse it where
   * that would change the framing. te_lookalike_last: one came after the
   * last Transfer-Encoding field (or there is none), which is when
   * http-parser no longer reads the message as chunked */
  int te_lookalike, te_lookalike_last;
} om_http1_framing_t;

/* Start a decision for kind. */
void om_http1_framing_init(om_http1_framing_t *f, int kind);

/*
 * om_http1_framing_field: take one field (name and its trimmed value).
 * Returns OM_HTTP1_OK (a framing field recorded, or any other field,
 * ignored) or the error that refuses the message at this field
 * (CL_INVALID, CL_REPEATED, TE_REPEATED).
 */
om_http1_err_t om_http1_framing_field(om_http1_framing_t *f, const char *name,
                                      size_t name_len, const char *value,
                                      size_t value_len);

/* The body the fields announce. */
enum {
  OM_HTTP1_BODY_NONE = 0,    /* no body (or a zero Content-Length) */
  OM_HTTP1_BODY_LENGTH = 1,  /* f->cl bytes */
  OM_HTTP1_BODY_CHUNKED = 2, /* the chunked coding */
  OM_HTTP1_BODY_CLOSE = 3    /* response: until the connection closes */
};

/*
 * om_http1_framing_end: after the last field, decide. minor is the
 * message's HTTP/1 minor version (0 or 1). For a response, status and
 * request_is_head apply RFC 9112 6.3 items 1-2 (HEAD, 1xx, 204, 304: no
 * body whatever the fields say, once they were valid). Returns
 * OM_HTTP1_OK and *body, or the error (CL_AND_TE, TE_BAD, TE_NOT_CHUNKED,
 * TE_UNSUPPORTED, TE_HTTP10).
 */
om_http1_err_t om_http1_framing_end(const om_http1_framing_t *f, int minor,
                                    int status, int request_is_head, int *body);

/*
 * The chunked decoder (RFC 9112 7.1): chunk-size, chunk-ext (7.1.1),
 * chunk-data and its CRLF, last-chunk, trailer section (7.1.2). Trailer
 * fields are checked like header fields and dropped; a Content-Length
 * among them must still be one 1*DIGIT (as http-parser checks it), so no
 * reader can take it for framing.
 */
typedef struct om_http1_chunked_s {
  /* limits, set by the caller after om_http1_chunked_init */
  uint64_t max_body;         /* decoded bytes; beyond it CHUNK_TOO_LARGE */
  size_t max_line;           /* chunk-size + chunk-ext + CRLF bytes */
  size_t max_overhead;       /* framing bytes in all; 0: no limit */
  size_t max_trailer_bytes;  /* trailer section bytes (not its last LF) */
  size_t max_trailer_fields; /* 0: no limit */
  /* results */
  uint64_t body;      /* decoded bytes so far */
  om_http1_err_t err; /* on ERROR */
  /* private */
  int st, tcl;
  uint64_t left, size, tcl_val;
  size_t line, tr_bytes, tr_fields, overhead;
  unsigned tcl_seen : 1, tcl_empty : 1;
} om_http1_chunked_t;

/* A decoder at the start of a chunked body, with max_line 4096, no
 * overhead or trailer-field limit, and max_body and max_trailer_bytes as
 * given. */
void om_http1_chunked_init(om_http1_chunked_t *d, uint64_t max_body,
                           size_t max_trailer_bytes);

/*
 * om_http1_chunked_decode: go on decoding p[0, n). Returns
 *  DATA: body bytes *data[0, *data_len), a span of p; *used bytes of p are
 *        taken, that span included; call again with the rest;
 *  MORE: all n bytes taken, no data in them;
 *  DONE: the message ended; *used bytes taken (what follows is the next
 *        message);
 *  ERROR: d->err; *used is the offset of the refused byte in p (the bytes
 *        before it were valid as far as they went).
 * After DONE or ERROR further calls return the same and take nothing.
 */
int om_http1_chunked_decode(om_http1_chunked_t *d, const char *p, size_t n,
                            size_t *used, const char **data, size_t *data_len);

#endif /* OM_HTTP1_H */
