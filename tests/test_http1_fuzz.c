/*
 * test_http1_fuzz.c: the HTTP/1.1 framing module (core/om_http1.c)
 * against http-parser 2.9, the differential oracle, on seeded generated
 * messages: requests and responses, valid and hostile (chunked with
 * extensions and trailers, Content-Length, Transfer-Encoding lists,
 * SP/HTAB, obs-fold, bare LF and CR, huge sizes, random byte mutations),
 * each fed to both parsers split at random points.
 *
 * What must hold, per message:
 *  - om_http1 gives the same answer whole and split (state, error,
 *    bytes taken, body);
 *  - when both accept, they frame it the same: method or status,
 *    target, version, every field name and value, body bytes, and where
 *    the message ends (the smuggling property);
 *  - om_http1 never accepts what http-parser refuses, nor waits for more
 *    where http-parser saw a complete message, or the reverse;
 *  - where om_http1 refuses what http-parser accepts (or still waits
 *    on), the refusal is one of our stricter rules, listed in stricter()
 *    with the reason.
 *
 * Known differences mapped on the way in: http-parser is fed each HTAB
 * as a SP (tests/support/om_http_detab.h: it refuses HTAB where RFC 9110
 * allows it as OWS), and its values keep trailing whitespace, which ours
 * trim (RFC 9110 5.5).
 *
 * OM_FUZZ_SEED and OM_FUZZ_COUNT set the seed and the number of messages
 * (default: a seed from the clock, printed, and 3000 messages; `make
 * fuzz` runs 300000).
 */
#include "om_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <time.h>

#include <http_parser.h>

#include "om_http1.h"
#include "om_http_detab.h"

#define MSG_MAX 16384
#define MAX_BODY 65536u
#define MAX_FIELDS 100u
#define MAX_HEAD 65536u

/* ------------------------------------------------------------------ */
/* a seeded generator (splitmix64) */

static uint64_t rng_state;

static uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static unsigned pick(unsigned n) {
  return (unsigned)(rnd() % n);
}

static int chance(unsigned percent) {
  return pick(100) < percent;
}

typedef struct {
  char b[MSG_MAX];
  size_t n;
} buf_t;

/* Append what fits (a message is cut at MSG_MAX, never overrun). */
static void put(buf_t *m, const char *s, size_t n) {
  size_t room = m->n < sizeof m->b ? sizeof m->b - m->n : 0;
  if (n > room)
    n = room;
  if (n > 0)
    memcpy(m->b + m->n, s, n);
  m->n += n;
}

static void puts_(buf_t *m, const char *s) {
  put(m, s, strlen(s));
}

#define PICK(arr) (arr[pick(sizeof(arr) / sizeof(arr[0]))])

static const char *ows(void) {
  static const char *const w[] = {"", "", "", " ", "\t", " \t ", "  "};
  return PICK(w);
}

/* A field line other than the framing ones. */
static void gen_field(buf_t *m) {
  static const char *const names[] = {
      "Host",    "X-A",     "Accept", "x-long-name", "Connection",
      "Trailer", "Trailer", "X-A",    "Host",        "Transfer-Encodings"};
  static const char *const values[] = {"v",    "a b",        "\x80\xff",    "",
                                       "x\ty", "keep-alive", "h.example:80"};
  puts_(m, PICK(names));
  puts_(m, ":");
  puts_(m, ows());
  puts_(m, PICK(values));
  puts_(m, ows());
  puts_(m, "\r\n");
}

enum { B_NONE, B_CL, B_CHUNKED };

/* The framing fields; returns the body to generate and *cl. */
static int gen_framing(buf_t *m, unsigned *cl) {
  static const char *const te[] = {
      "chunked",       "Chunked",           "CHUNKED",    "gzip, chunked",
      "chunked, gzip", "chunked,",          ", chunked",  "identity",
      "chunked;a=b",   "chunked , chunked", "x, chunked", "chunked"};
  char line[128];
  unsigned k = pick(10);
  *cl = pick(40);
  if (k < 3)
    return B_NONE;
  if (k < 6) {
    snprintf(line, sizeof line, "Content-Length:%s%u%s\r\n", ows(), *cl, ows());
    puts_(m, line);
    if (chance(8)) /* repeated, same or another value */
      puts_(m, chance(50) ? line : "Content-Length: 3\r\n");
    if (chance(5))
      puts_(m, "Transfer-Encoding: chunked\r\n");
    return B_CL;
  }
  if (k == 6) {
    static const char *const bad[] = {"1, 1", "+5", "99999999999999999999",
                                      "0x5",  "",   "5 5"};
    snprintf(line, sizeof line, "Content-Length: %s\r\n", PICK(bad));
    puts_(m, line);
    return B_CL;
  }
  snprintf(line, sizeof line, "Transfer-Encoding:%s%s%s\r\n", ows(), PICK(te),
           ows());
  puts_(m, line);
  if (chance(5))
    puts_(m, "Transfer-Encoding: chunked\r\n");
  if (chance(5))
    puts_(m, "Content-Length: 5\r\n");
  return B_CHUNKED;
}

static void gen_data(buf_t *m, unsigned n) {
  static const char bytes[] = "abcXYZ019 \t\r\n;:\"\\";
  unsigned i;
  for (i = 0; i < n; i++) {
    char c = bytes[pick(sizeof bytes - 1)];
    put(m, &c, 1);
  }
}

static void gen_ext(buf_t *m) {
  static const char *const ext[] = {
      "",   "",       "",         ";a=b",         " ;a=b", "\t;a=\"q\\\"x\"",
      ";a", ";a = b", "; a=\"\"", ";a=b;c=\"d\"", ";",     " "};
  puts_(m, PICK(ext));
}

static void gen_chunked(buf_t *m) {
  unsigned chunks = pick(4), i;
  char line[64];
  for (i = 0; i < chunks; i++) {
    unsigned n = 1 + pick(20);
    if (chance(3)) {
      puts_(m, chance(50) ? "fffffffffffffffff" : "100000");
    } else {
      snprintf(line, sizeof line, chance(50) ? "%s%x" : "%s%X",
               chance(10) ? "00" : "", n);
      puts_(m, line);
    }
    gen_ext(m);
    puts_(m, "\r\n");
    gen_data(m, n);
    puts_(m, "\r\n");
  }
  puts_(m, chance(10) ? "000" : "0");
  gen_ext(m);
  puts_(m, "\r\n");
  for (i = pick(3); i > 0; i--) {
    static const char *const tr[] = {"X-T: v\r\n", "Content-Length: 5\r\n",
                                     "Content-Length: x\r\n", "X-U:\t\r\n",
                                     "Host: evil\r\n"};
    puts_(m, PICK(tr));
  }
  puts_(m, "\r\n");
}

/* A few hostile edits anywhere in the message. */
static void mutate(buf_t *m) {
  static const char hot[] = "\r\n\t :;\"\\,\0\x7f\x80"
                            "0aZ";
  unsigned edits = 1 + pick(2);
  while (edits-- > 0 && m->n > 0) {
    size_t at = pick((unsigned)m->n);
    char c = hot[pick(sizeof hot - 1)];
    switch (pick(5)) {
    case 0: /* replace */
      m->b[at] = c;
      break;
    case 1: /* insert */
      if (m->n < sizeof m->b) {
        memmove(m->b + at + 1, m->b + at, m->n - at);
        m->b[at] = c;
        m->n++;
      }
      break;
    case 2: /* delete */
      memmove(m->b + at, m->b + at + 1, m->n - at - 1);
      m->n--;
      break;
    case 3: { /* a CRLF becomes a bare LF, or a bare CR */
      char *p = memchr(m->b + at, '\r', m->n - at);
      if (p != NULL && p + 1 < m->b + m->n && p[1] == '\n') {
        if (chance(50)) {
          memmove(p, p + 1, (size_t)(m->b + m->n - p - 1));
          m->n--;
        } else {
          p[1] = 'x';
        }
      }
      break;
    }
    default: { /* obs-fold: a line continued */
      char *p = memchr(m->b + at, '\n', m->n - at);
      if (p != NULL && m->n + 2 < sizeof m->b) {
        size_t o = (size_t)(p - m->b) + 1;
        memmove(m->b + o + 2, m->b + o, m->n - o);
        memcpy(m->b + o, chance(50) ? " x" : "\tx", 2);
        m->n += 2;
      }
      break;
    }
    }
  }
}

static int gen(buf_t *m) {
  int kind = chance(50) ? OM_HTTP1_REQUEST : OM_HTTP1_RESPONSE;
  unsigned nf = pick(4), cl, i;
  int body;
  m->n = 0;
  if (kind == OM_HTTP1_REQUEST) {
    static const char *const methods[] = {
        "GET",  "POST",     "PUT",      "DELETE", "PATCH", "OPTIONS",
        "HEAD", "PROPFIND", "M-SEARCH", "FOO",    "get",   "POST"};
    static const char *const targets[] = {
        "/", "/a/b?c=d", "/%7e", "/x?y", "http://h.example/p",
        "*", "/a#f",     "/a|b"};
    static const char *const versions[] = {"HTTP/1.1", "HTTP/1.1", "HTTP/1.1",
                                           "HTTP/1.0", "HTTP/2.0", "HTTP/1.2"};
    if (chance(5))
      puts_(m, "\r\n");
    puts_(m, PICK(methods));
    puts_(m, " ");
    puts_(m, PICK(targets));
    puts_(m, " ");
    puts_(m, PICK(versions));
    puts_(m, "\r\n");
  } else {
    static const char *const lines[] = {
        "HTTP/1.1 200 OK\r\n",         "HTTP/1.1 404 Not Found\r\n",
        "HTTP/1.0 200 OK\r\n",         "HTTP/1.1 500\r\n",
        "HTTP/1.1 299 A \t b\xe9\r\n", "HTTP/1.1 201 \r\n"};
    puts_(m, PICK(lines));
  }
  for (i = 0; i < nf; i++)
    gen_field(m);
  body = gen_framing(m, &cl);
  if (chance(30))
    gen_field(m);
  puts_(m, "\r\n");
  if (body == B_CL)
    gen_data(m, chance(90) ? cl : pick(40));
  else if (body == B_CHUNKED)
    gen_chunked(m);
  else if (kind == OM_HTTP1_RESPONSE)
    gen_data(m, pick(10));
  if (chance(35))
    mutate(m);
  return kind;
}

/* ------------------------------------------------------------------ */
/* a parse, as either side reads it */

enum { ST_ACCEPT, ST_REJECT, ST_MORE };

typedef struct {
  int st;
  om_http1_err_t err; /* ours: the module's refusal */
  const char *rule;   /* ours: or the server's / client's rule that refused */
  int te_lookalike;   /* ours: a field named like Transfer-Encoding */
  int hp_errno;       /* http-parser's */
  char method[32], target[256];
  int major, minor, status;
  char fields[4096]; /* "name:value\n" in order */
  size_t fields_len;
  char body[MSG_MAX];
  size_t body_len;
  size_t used;   /* bytes the message took */
  int head_done; /* ours: the head parser has seen the whole head */
} res_t;

static void addf(res_t *r, const char *s, size_t n) {
  if (r->fields_len + n < sizeof r->fields) {
    memcpy(r->fields + r->fields_len, s, n);
    r->fields_len += n;
  }
}

/* om_http1 as the server and the upstream client drive it. */
static void ours(int kind, const char *b, size_t n, const size_t *cuts,
                 size_t n_cuts, res_t *r) {
  om_http1_head_t h;
  om_http1_field_t f[MAX_FIELDS];
  om_http1_framing_t fr;
  om_http1_err_t e = OM_HTTP1_OK;
  int rc = OM_HTTP1_MORE, body;
  size_t k, i;
  memset(r, 0, sizeof *r);
  r->st = ST_MORE;
  om_http1_head_init(&h, kind, f, MAX_FIELDS, MAX_FIELDS, MAX_HEAD);
  for (k = 0; k <= n_cuts && rc == OM_HTTP1_MORE; k++)
    rc = om_http1_head_parse(&h, b, k < n_cuts ? cuts[k] : n);
  if (rc == OM_HTTP1_ERROR) {
    r->st = ST_REJECT;
    r->err = h.err;
    return;
  }
  if (rc != OM_HTTP1_DONE)
    return;
  r->head_done = 1;
  if (kind == OM_HTTP1_REQUEST) {
    snprintf(r->method, sizeof r->method, "%.*s", (int)h.method_len,
             b + h.line_start);
    snprintf(r->target, sizeof r->target, "%.*s", (int)h.target_len,
             b + h.target_off);
  }
  r->major = h.major;
  r->minor = h.minor;
  r->status = h.status;
  om_http1_framing_init(&fr, kind);
  for (i = 0; i < h.n_fields && e == OM_HTTP1_OK; i++) {
    addf(r, b + f[i].name_off, f[i].name_len);
    addf(r, ":", 1);
    addf(r, b + f[i].value_off, f[i].value_len);
    addf(r, "\n", 1);
    e = om_http1_framing_field(&fr, b + f[i].name_off, f[i].name_len,
                               b + f[i].value_off, f[i].value_len);
  }
  if (e == OM_HTTP1_OK)
    e = om_http1_framing_end(&fr, h.minor > 1 ? 1 : h.minor, h.status, 0,
                             &body);
  if (e != OM_HTTP1_OK) {
    r->st = ST_REJECT;
    r->err = e;
    return;
  }
  r->te_lookalike = fr.te_lookalike;
  /* the server's rules past the head's grammar, in its order: a target
   * form it takes, a body within its limit, a method it knows, no field
   * named like Transfer-Encoding; the client's: no such field beside a
   * Transfer-Encoding */
  if (kind == OM_HTTP1_REQUEST) {
    om_http1_target_t tg;
    if (om_http1_target_parse(r->method, h.method_len, b + h.target_off,
                              h.target_len, &tg) != 0)
      r->rule = "target";
    else if (body == OM_HTTP1_BODY_LENGTH && fr.cl > MAX_BODY)
      r->rule = "body limit";
    else if (!om_http1_method_known(r->method, h.method_len))
      r->rule = "method";
    else if (fr.te_lookalike && (fr.n_cl > 0 || fr.te_lookalike_last))
      r->rule = "transfer-encoding lookalike";
  } else if (fr.te_lookalike_last && fr.n_te > 0) {
    r->rule = "transfer-encoding lookalike";
  }
  if (r->rule != NULL) {
    r->st = ST_REJECT;
    return;
  }
  r->used = h.pos;
  if (body == OM_HTTP1_BODY_NONE) {
    r->st = ST_ACCEPT;
  } else if (body == OM_HTTP1_BODY_LENGTH) {
    if (n - h.pos >= fr.cl) {
      memcpy(r->body, b + h.pos, (size_t)fr.cl);
      r->body_len = (size_t)fr.cl;
      r->used += (size_t)fr.cl;
      r->st = ST_ACCEPT;
    }
  } else if (body == OM_HTTP1_BODY_CLOSE) {
    memcpy(r->body, b + h.pos, n - h.pos);
    r->body_len = n - h.pos;
    r->used = n;
    r->st = ST_ACCEPT;
  } else {
    om_http1_chunked_t d;
    size_t off = h.pos;
    om_http1_chunked_init(&d, kind == OM_HTTP1_REQUEST ? MAX_BODY : INT64_MAX,
                          16384);
    d.max_overhead = MAX_BODY;
    d.max_trailer_fields = MAX_FIELDS;
    rc = OM_HTTP1_MORE;
    for (k = 0; k <= n_cuts && rc == OM_HTTP1_MORE; k++) {
      size_t end = k < n_cuts ? cuts[k] : n;
      while (off < end) {
        const char *span;
        size_t used, sl;
        rc = om_http1_chunked_decode(&d, b + off, end - off, &used, &span, &sl);
        off += used;
        if (rc == OM_HTTP1_DATA) {
          memcpy(r->body + r->body_len, span, sl);
          r->body_len += sl;
          rc = OM_HTTP1_MORE;
          continue;
        }
        if (rc != OM_HTTP1_MORE)
          break;
      }
    }
    r->used = off;
    if (rc == OM_HTTP1_DONE) {
      r->st = ST_ACCEPT;
    } else if (rc == OM_HTTP1_ERROR) {
      r->st = ST_REJECT;
      r->err = d.err;
    }
  }
}

/* http-parser, fed each HTAB as a SP; pointers into the copy are mapped
 * back to the original bytes (the body and values keep their HTABs). */
typedef struct {
  res_t *r;
  const char *copy, *orig;
  size_t copy_len;
  int last; /* 0 none, 1 field, 2 value, 3 headers complete */
  int done, needs_eof;
  char value[2048];
  size_t value_len;
} hx_t;

static const char *hx_orig(const hx_t *x, const char *at) {
  if (x->copy != NULL && at >= x->copy && at < x->copy + x->copy_len)
    return x->orig + (at - x->copy);
  return at;
}

static void hx_slice(void *arg, const char *copy, const char *orig,
                     size_t len) {
  hx_t *x = arg;
  x->copy = copy;
  x->orig = orig;
  x->copy_len = len;
}

static void hx_end_value(hx_t *x) {
  size_t n = x->value_len;
  /* http-parser keeps trailing OWS in a value; RFC 9110 5.5 drops it */
  while (n > 0 && (x->value[n - 1] == ' ' || x->value[n - 1] == '\t'))
    n--;
  addf(x->r, x->value, n);
  addf(x->r, "\n", 1);
  x->value_len = 0;
}

static int hx_url(http_parser *p, const char *at, size_t n) {
  hx_t *x = p->data;
  size_t l = strlen(x->r->target);
  if (l + n < sizeof x->r->target) {
    memcpy(x->r->target + l, hx_orig(x, at), n);
    x->r->target[l + n] = 0;
  }
  return 0;
}

static int hx_field(http_parser *p, const char *at, size_t n) {
  hx_t *x = p->data;
  if (x->last == 3) /* a trailer field: ours are checked and dropped */
    return 0;
  /* after a field callback, this one continues the same name (a split);
   * an empty value still gets its (empty) value callback */
  if (x->last == 2)
    hx_end_value(x);
  addf(x->r, hx_orig(x, at), n);
  x->last = 1;
  return 0;
}

static int hx_value(http_parser *p, const char *at, size_t n) {
  hx_t *x = p->data;
  if (x->last == 3)
    return 0;
  if (x->last == 1)
    addf(x->r, ":", 1);
  if (x->value_len + n < sizeof x->value) {
    memcpy(x->value + x->value_len, hx_orig(x, at), n);
    x->value_len += n;
  }
  x->last = 2;
  return 0;
}

static int hx_headers_complete(http_parser *p) {
  hx_t *x = p->data;
  if (x->last == 1)
    addf(x->r, ":\n", 2); /* a field without a value callback */
  if (x->last == 2)
    hx_end_value(x);
  x->last = 3;
  /* no Content-Length, not chunked: a response read until the close */
  x->needs_eof = !(p->flags & F_CHUNKED) && p->content_length == ULLONG_MAX;
  return 0;
}

static int hx_body(http_parser *p, const char *at, size_t n) {
  hx_t *x = p->data;
  if (x->r->body_len + n <= sizeof x->r->body) {
    memcpy(x->r->body + x->r->body_len, hx_orig(x, at), n);
    x->r->body_len += n;
  }
  return 0;
}

static int hx_done(http_parser *p) {
  hx_t *x = p->data;
  x->done = 1;
  http_parser_pause(p, 1);
  return 0;
}

static void theirs(int kind, const char *b, size_t n, const size_t *cuts,
                   size_t n_cuts, res_t *r) {
  static const http_parser_settings st = {
      .on_url = hx_url,
      .on_header_field = hx_field,
      .on_header_value = hx_value,
      .on_headers_complete = hx_headers_complete,
      .on_body = hx_body,
      .on_message_complete = hx_done,
  };
  http_parser hp;
  hx_t x;
  size_t k, off = 0;
  enum http_errno err = HPE_OK;
  memset(r, 0, sizeof *r);
  memset(&x, 0, sizeof x);
  x.r = r;
  http_parser_init(&hp,
                   kind == OM_HTTP1_REQUEST ? HTTP_REQUEST : HTTP_RESPONSE);
  hp.data = &x;
  for (k = 0; k <= n_cuts && !x.done && err == HPE_OK; k++) {
    size_t end = k < n_cuts ? cuts[k] : n;
    if (end > off) {
      off += om_http_detab_execute(&hp, &st, b + off, end - off, hx_slice, &x);
      x.copy = NULL;
      err = HTTP_PARSER_ERRNO(&hp);
    }
  }
  /* a response without framing fields ends with the connection */
  if (!x.done && err == HPE_OK && kind == OM_HTTP1_RESPONSE && x.needs_eof) {
    http_parser_execute(&hp, &st, NULL, 0);
    err = HTTP_PARSER_ERRNO(&hp);
  }
  r->used = off;
  r->hp_errno = (int)err;
  if (x.done)
    r->st = ST_ACCEPT;
  else if (err != HPE_OK && err != HPE_PAUSED)
    r->st = ST_REJECT;
  else
    r->st = ST_MORE;
  if (kind == OM_HTTP1_REQUEST)
    snprintf(r->method, sizeof r->method, "%s",
             http_method_str((enum http_method)hp.method));
  r->major = hp.http_major;
  r->minor = hp.http_minor;
  r->status = (int)hp.status_code;
}

/* ------------------------------------------------------------------ */
/* the comparison */

/*
 * Our refusals of what http-parser 2.9 (built with HTTP_PARSER_STRICT=0,
 * as Debian ships it) accepts or still waits on, by design: each one is
 * a reading two implementations can differ on, which a proxy must refuse
 * (om_http1.h). 1 when err is one of them for this message kind.
 */
static int stricter(int kind, om_http1_err_t err) {
  switch (err) {
  /* RFC 9112 2.2: a bare LF is not a line end; a bare CR is refused.
   * http-parser takes a bare LF as a line end and skips some bare CRs */
  case OM_HTTP1_E_BARE_LF:
  case OM_HTTP1_E_VALUE_BARE_CR:
  case OM_HTTP1_E_END_BARE_CR:
  case OM_HTTP1_E_STATUS_BARE_CR:
  case OM_HTTP1_E_CHUNK_BARE_LF:
  case OM_HTTP1_E_CHUNK_BARE_CR:
  case OM_HTTP1_E_TRAILER_BARE_LF:
  case OM_HTTP1_E_CHUNK_END:
  /* RFC 9112 5.2 and 2.2: obs-fold and whitespace before the first field
   * line; http-parser unfolds */
  case OM_HTTP1_E_OBS_FOLD:
  case OM_HTTP1_E_WS_BEFORE_FIRST_FIELD:
  case OM_HTTP1_E_TRAILER_OBS_FOLD:
  /* RFC 9112 5.1, RFC 9110 5.5: whitespace before the colon, a name that
   * is not a token, a control character in a value (non-strict
   * http-parser lets some through) */
  case OM_HTTP1_E_WS_BEFORE_COLON:
  case OM_HTTP1_E_NAME_NOT_TOKEN:
  case OM_HTTP1_E_VALUE_CTL:
  case OM_HTTP1_E_TRAILER_FIELD:
  /* RFC 9112 3: exactly one SP between the parts, a visible target;
   * http-parser is lenient about both */
  case OM_HTTP1_E_REQUEST_LINE:
  case OM_HTTP1_E_TARGET_BYTE:
  /* RFC 9112 4: a response is HTTP/1.0 or HTTP/1.1 with a 3-digit
   * status in 100..599 and a reason without CTLs; http-parser takes any
   * version digits and a status without range */
  case OM_HTTP1_E_STATUS_VERSION:
  case OM_HTTP1_E_STATUS_CODE:
  case OM_HTTP1_E_STATUS_RANGE:
  case OM_HTTP1_E_STATUS_AFTER_CODE:
  case OM_HTTP1_E_REASON_CTL:
  /* RFC 9112 7.1.1: the chunk-ext grammar, and the CRLF after
   * chunk-data; http-parser skips an extension unread and does not check
   * that CRLF */
  case OM_HTTP1_E_CHUNK_EXT:
  case OM_HTTP1_E_CHUNK_DATA_CRLF:
  /* RFC 9112 6.1-6.3: Transfer-Encoding must end in chunked, which we
   * decode alone, once; an HTTP/1.0 message with it is refused; one
   * Content-Length only, digits only (http-parser merges or skips some
   * of these) */
  case OM_HTTP1_E_TE_BAD:
  case OM_HTTP1_E_TE_NOT_CHUNKED:
  case OM_HTTP1_E_TE_UNSUPPORTED:
  case OM_HTTP1_E_TE_HTTP10:
  case OM_HTTP1_E_TE_REPEATED:
  case OM_HTTP1_E_CL_INVALID:
  case OM_HTTP1_E_CL_AND_TE:
  /* our limits: body and chunk sizes, framing overhead */
  case OM_HTTP1_E_CHUNK_TOO_LARGE:
  case OM_HTTP1_E_CHUNK_OVERHEAD:
  case OM_HTTP1_E_CHUNK_SIZE:
    return 1;
  default:
    (void)kind;
    return 0;
  }
}

typedef struct {
  unsigned long both_accept, both_reject, stricter, more, later, lookalike;
  unsigned long by_err[OM_HTTP1_E__COUNT + 1];
} tally_t;

static const char *err_name(om_http1_err_t e) {
  switch (e) {
#define OM__ERR_NAME(name, desc)                                               \
  case OM_HTTP1_E_##name:                                                      \
    return #name;
    OM_HTTP1_ERR_MAP(OM__ERR_NAME)
#undef OM__ERR_NAME
  default:
    return "?";
  }
}

static void show(const char *b, size_t n) {
  size_t i;
  fprintf(stderr, "message (%zu bytes): \"", n);
  for (i = 0; i < n; i++) {
    unsigned char c = (unsigned char)b[i];
    if (c == '\r')
      fputs("\\r", stderr);
    else if (c == '\n')
      fputs("\\n", stderr);
    else if (c == '\t')
      fputs("\\t", stderr);
    else if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
      fprintf(stderr, "\\x%02x", c);
    else
      fputc(c, stderr);
  }
  fputs("\"\n", stderr);
}

static const char *st_name(int st) {
  return st == ST_ACCEPT ? "accept" : st == ST_REJECT ? "reject" : "more";
}

/* "" when the two agree on this message, else what differs. */
static const char *compare(int kind, const res_t *o, const res_t *h,
                           tally_t *t) {
  if (o->st == ST_REJECT) {
    if (h->st == ST_REJECT) {
      t->both_reject++;
      return "";
    }
    /* a caller's rule: the target forms a server takes (RFC 9112 3.2,
     * stricter than http-parser's URL reader) and its body limit; the
     * known methods are http-parser's own list and the lookalike rule
     * follows it, so those two never count here */
    /* in a response, the client refuses a lookalike after the last
     * Transfer-Encoding, which http-parser reads as a body to the close */
    if (o->rule != NULL
            ? strcmp(o->rule, "target") == 0 ||
                  strcmp(o->rule, "body limit") == 0 ||
                  (kind == OM_HTTP1_RESPONSE &&
                   strcmp(o->rule, "transfer-encoding lookalike") == 0)
            : stricter(kind, o->err)) {
      if (o->rule == NULL)
        t->by_err[o->err]++;
      t->stricter++;
      return "";
    }
    return "om_http1 refuses what http-parser does not";
  }
  if (kind == OM_HTTP1_RESPONSE && h->st == ST_REJECT &&
      h->hp_errno == HPE_UNEXPECTED_CONTENT_LENGTH && o->te_lookalike) {
    /* http-parser 2.9.4 takes a field name that begins with
     * "Transfer-Encoding" for it, and then refuses a Content-Length; the
     * client reads a response with such a field by its Content-Length,
     * as the field is not Transfer-Encoding (the server, which relays
     * requests to readers it does not know, refuses them instead) */
    t->lookalike++;
    return "";
  }
  if (h->st == ST_REJECT && o->st == ST_MORE && !o->head_done) {
    /* http-parser refuses a method, a target or a framing value as it
     * reads it; a server on om_http1 decides those once the head is
     * complete (the order of its answers is documented), so an
     * incomplete head is still waited on */
    t->later++;
    return "";
  }
  if (h->st == ST_REJECT)
    return "om_http1 does not refuse what http-parser refuses";
  if (o->st != h->st)
    return "one sees a complete message, the other waits for more";
  if (o->st == ST_MORE) {
    t->more++;
    return "";
  }
  t->both_accept++;
  if (kind == OM_HTTP1_REQUEST && strcmp(o->method, h->method) != 0)
    return "method";
  if (kind == OM_HTTP1_REQUEST && strcmp(o->target, h->target) != 0)
    return "target";
  if (o->major != h->major || o->minor != h->minor)
    return "version";
  if (kind == OM_HTTP1_RESPONSE && o->status != h->status)
    return "status";
  if (o->fields_len != h->fields_len ||
      memcmp(o->fields, h->fields, o->fields_len) != 0)
    return "fields";
  if (o->body_len != h->body_len || memcmp(o->body, h->body, o->body_len) != 0)
    return "body";
  if (o->used != h->used)
    return "where the message ends";
  return "";
}

static unsigned long env_ul(const char *name, unsigned long def) {
  const char *v = getenv(name);
  return v != NULL && *v != 0 ? strtoul(v, NULL, 0) : def;
}

static void differential(void **state) {
  static buf_t m;
  static res_t whole, split, hp;
  unsigned long seed = env_ul("OM_FUZZ_SEED", (unsigned long)time(NULL));
  unsigned long count = env_ul("OM_FUZZ_COUNT", 3000), i;
  tally_t t;
  (void)state;
  memset(&t, 0, sizeof t);
  rng_state = seed;
  fprintf(stderr, "# OM_FUZZ_SEED=%lu OM_FUZZ_COUNT=%lu\n", seed, count);
  for (i = 0; i < count; i++) {
    int kind = gen(&m);
    size_t cuts[3], nc = 0, k;
    const char *why;
    for (k = 0; k < 3 && m.n > 0; k++)
      cuts[nc++] = pick((unsigned)m.n + 1);
    if (nc == 3) { /* in order */
      size_t a;
      for (k = 0; k < 2; k++)
        for (a = 0; a + 1 < 3 - k; a++)
          if (cuts[a] > cuts[a + 1]) {
            size_t x = cuts[a];
            cuts[a] = cuts[a + 1];
            cuts[a + 1] = x;
          }
    }
    ours(kind, m.b, m.n, NULL, 0, &whole);
    ours(kind, m.b, m.n, cuts, nc, &split);
    if (whole.st != split.st || whole.err != split.err ||
        whole.used != split.used || whole.body_len != split.body_len ||
        memcmp(whole.body, split.body, whole.body_len) != 0) {
      show(m.b, m.n);
      fail_msg("message %lu (seed %lu): om_http1 split at %zu/%zu/%zu: %s %s "
               "used %zu, whole: %s %s used %zu",
               i, seed, cuts[0], cuts[1], cuts[2], st_name(split.st),
               om_http1_err_desc(split.err), split.used, st_name(whole.st),
               om_http1_err_desc(whole.err), whole.used);
    }
    theirs(kind, m.b, m.n, cuts, nc, &hp);
    why = compare(kind, &whole, &hp, &t);
    if (*why != 0) {
      show(m.b, m.n);
      fprintf(stderr, "ours: %s (%s) used %zu fields [%.*s] body %zu\n",
              st_name(whole.st),
              whole.rule ? whole.rule : om_http1_err_desc(whole.err),
              whole.used, (int)whole.fields_len, whole.fields, whole.body_len);
      fprintf(stderr, "http-parser: %s (%s) used %zu fields [%.*s] body %zu\n",
              st_name(hp.st), http_errno_name((enum http_errno)hp.hp_errno),
              hp.used, (int)hp.fields_len, hp.fields, hp.body_len);
      fail_msg("message %lu (seed %lu, %s): %s", i, seed,
               kind == OM_HTTP1_REQUEST ? "request" : "response", why);
    }
  }
  fprintf(stderr,
          "# %lu messages: both accept %lu (framed alike), both refuse %lu, "
          "ours stricter %lu, both wait %lu, ours decides later %lu, "
          "http-parser misreads a name %lu\n",
          count, t.both_accept, t.both_reject, t.stricter, t.more, t.later,
          t.lookalike);
  fprintf(stderr, "# ours stricter, by refusal:");
  for (i = 0; i < OM_HTTP1_E__COUNT; i++)
    if (t.by_err[i] > 0)
      fprintf(stderr, " %s=%lu", err_name((om_http1_err_t)i), t.by_err[i]);
  fprintf(stderr, "\n");
  /* the generator reaches every outcome, or the run proves little */
  OM_ASSERT_CMP(t.both_accept, >, count / 20);
  OM_ASSERT_CMP(t.both_reject + t.stricter, >, count / 20);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(differential),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
