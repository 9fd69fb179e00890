/*
 * om_json.h: a validating JSON scanner that allocates nothing, for the
 * gateway's pass-through (docs/EGRESS.md "Pass-through"): it proves a
 * document is one JSON text the gateway's full parser (jansson, with
 * JSON_REJECT_DUPLICATES) would accept, and reports every value with its
 * path, so a caller reads the few fields it needs without building a tree.
 *
 * Accepted exactly as jansson 2.14 accepts (RFC 8259): one object or
 * array at the top (a scalar is refused, as without JSON_DECODE_ANY),
 * whitespace SP HTAB LF CR around tokens, nothing after the value but
 * whitespace; strings of UTF-8 (no overlong form, no surrogate code
 * point, nothing above U+10FFFF), no control character below 0x20, the
 * escapes \" \\ \/ \b \f \n \r \t \uXXXX (a high surrogate escape only
 * followed by a low one; a lone low one refused; \u0000 refused, as
 * without JSON_ALLOW_NUL); numbers by the RFC 8259 grammar, an integer
 * that does not fit in int64 and a real that overflows a double refused;
 * true, false, null; no object with two members of the same name.
 *
 * Where it cannot be sure cheaply it says so instead of guessing
 * (OM_JSON_UNSURE): nesting deeper than OM_JSON_MAX_DEPTH, more than
 * OM_JSON_MAX_KEYS member names open at once (the duplicate check keeps
 * them), a member name with an escape, a number longer than 64 bytes,
 * a NUL byte right after a number or literal (jansson 2.14 reads one byte
 * past them and skips a NUL it puts back, so it accepts `[1\0]`: not
 * JSON, and not ours to accept either).
 * The caller then uses the full parser, which decides.
 */
#ifndef OM_JSON_H
#define OM_JSON_H

#include <stddef.h>
#include <stdint.h>

#define OM_JSON_MAX_DEPTH 64
#define OM_JSON_MAX_KEYS 512

typedef enum {
  OM_JSON_OBJECT = 1, /* an object begins */
  OM_JSON_ARRAY,      /* an array begins */
  OM_JSON_END,        /* the object or array at this path ends */
  OM_JSON_STRING,
  OM_JSON_NUMBER,
  OM_JSON_TRUE,
  OM_JSON_FALSE,
  OM_JSON_NULL
} om_json_type_t;

/* One step of a path: a member name (raw, without its quotes; never
 * escaped) or, when key is NULL, an array index. */
typedef struct om_json_seg_s {
  const char *key;
  size_t key_len;
  size_t index;
} om_json_seg_t;

/*
 * One value as the scanner meets it. path[0..depth-1] is where it is:
 * depth 0 is the top-level value itself, depth 1 a member (or element)
 * of it, and so on. text/len: the value's bytes in the document (a
 * string with its quotes and escapes as written; an object or array
 * from its bracket, len 1; END: its closing bracket, len 1).
 */
typedef struct om_json_ev_s {
  om_json_type_t type;
  const char *text;
  size_t len;
  size_t depth;
  const om_json_seg_t *path;
} om_json_ev_t;

/* Called for each value in document order; nonzero stops the scan, which
 * then returns OM_JSON_STOPPED. */
typedef int (*om_json_cb)(void *ud, const om_json_ev_t *ev);

typedef enum {
  OM_JSON_OK = 0,
  OM_JSON_INVALID = 1, /* not a JSON text jansson would accept */
  OM_JSON_UNSURE = 2,  /* see above: ask the full parser */
  OM_JSON_STOPPED = 3  /* the callback stopped it */
} om_json_result_t;

/*
 * om_json_scan: scan s[0..n) (need not be NUL-terminated); cb may be
 * NULL (validate only). *where (may be NULL) gets the byte offset of the
 * refusal or doubt. Nothing is allocated; at most a few hundred bytes of
 * stack per depth level are used (the path and the open names).
 */
om_json_result_t om_json_scan(const char *s, size_t n, om_json_cb cb, void *ud,
                              size_t *where);

/* 1 when ev is at exactly the path given as depth segments, each a
 * member name or, for an array element, NULL with its index in idx[]. */
int om_json_at(const om_json_ev_t *ev, size_t depth, const char *const *keys,
               const size_t *idx);

/*
 * om_json_string: decode a STRING value's text (with its quotes, as the
 * scanner gave it; already validated) into out[0..cap) as UTF-8, without
 * a terminator. Returns the decoded length, which may exceed cap (then
 * only cap bytes were written).
 */
size_t om_json_string(const char *text, size_t len, char *out, size_t cap);

/* om_json_int: a NUMBER value that is an integer (no fraction or
 * exponent) into *v. 0; -1 when it is not such an integer. */
int om_json_int(const char *text, size_t len, int64_t *v);

#endif /* OM_JSON_H */
