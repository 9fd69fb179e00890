/*
 * om_sse.c: the text/event-stream parser and writer (om_sse.h).
 *
 * The parser is a byte-level state machine over the raw stream that never
 * looks back: each chunk is consumed where it stands and its bytes go
 * straight into the buffer they belong to (data, event type or id value).
 * Resumable state is tiny (the field name's first 5 bytes, a pending CR,
 * a partial BOM, a partial UTF-8 sequence), which is what makes every
 * chunking equivalent and the work linear.
 *
 * UTF-8 (WHATWG HTML 9.2.6: "Streams must be decoded using the UTF-8
 * decode algorithm"). Decoding the whole stream and then splitting lines
 * is the same as decoding each line on its own, because CR, LF and ':' are
 * ASCII: an ASCII byte is never part of a sequence, so a sequence cut short
 * by a line end is an error there in both readings (one U+FFFD) and the
 * line end is then read as itself. Only values we keep (data, event, id)
 * need decoding; names and retry values are compared as bytes, which is
 * exact because the names and digits are ASCII and any non-ASCII byte
 * decodes to a non-ASCII code point. Valid UTF-8 re-encodes to itself, so
 * a valid run is copied as is; an invalid one becomes EF BF BD per error
 * of the WHATWG Encoding Standard's UTF-8 decoder (4.1.1), i.e. one U+FFFD
 * per maximal subpart.
 */
#include "om_sse.h"

#include <stdlib.h>
#include <string.h>

#include "om_errno.h"

/* SSE2 is baseline on x86-64; elsewhere (or with -DOM_SSE_NO_SIMD, which
 * is how the portable path gets tested) 8-byte words stand in. */
#if !defined(OM_SSE_NO_SIMD) && defined(__SSE2__) &&                           \
    (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
#define OM_SSE_SIMD 1
#else
#define OM_SSE_SIMD 0
#endif

typedef unsigned char uchar;

typedef struct {
  char *p;
  size_t len, cap;
} sbuf_t;

enum {
  ST_BOM,      /* stream start: matching EF BB BF */
  ST_LINE,     /* at the start of a line */
  ST_NAME,     /* in a field name */
  ST_VALUE_SP, /* just after the colon: one space to drop */
  ST_VALUE,    /* in the value of data / event / id */
  ST_RETRY,    /* in the value of retry */
  ST_SKIP      /* in a comment or an ignored field, up to the line end */
};

enum { F_NONE, F_DATA, F_EVENT, F_ID, F_RETRY };

/* Buffers smaller than this survive a reset, so reconnects do not churn. */
#define KEEP_ON_RESET ((size_t)64 * 1024)
#define INITIAL_DATA_CAP ((size_t)1024)

struct om_sse_parser_s {
  size_t max; /* max_event_bytes; data.len + type.len + idv.len <= max */
  int err;    /* sticky failure, 0 when healthy */
  uint8_t in_cb;
  uint8_t state, field;
  uint8_t after_cr; /* the last line ended with CR: a following LF is its */
  uint8_t bom_seen; /* bytes of EF BB BF matched at stream start */
  uint8_t name_len;
  char name[5]; /* "retry" is the longest name that matters */
  /* A UTF-8 sequence cut by the chunk end (Encoding 4.1.1 state). */
  uint8_t u8_need, u8_seen, u8_lo, u8_hi;
  uint8_t retry_any; /* at least one digit in the current retry value */
  uint8_t id_dirty;  /* the last event ID buffer changed since dispatch */
  uint64_t retry_acc;
  int64_t retry_ms;
  sbuf_t data; /* data buffer */
  sbuf_t type; /* event type buffer */
  sbuf_t id;   /* last event ID buffer */
  sbuf_t idv;  /* the id value being read (kept apart: NUL voids it) */
  sbuf_t last; /* last event ID string */
  uint64_t work;
};

static const uchar REPLACEMENT[3] = {0xEF, 0xBF, 0xBD}; /* U+FFFD */

/* ---- scanning ------------------------------------------------------- */

static inline int is_eol(uchar b) {
  return b == '\n' || b == '\r';
}

#if OM_SSE_SIMD
static inline int first_bit(unsigned m) {
  return __builtin_ctz(m);
}
/* Mask of the CR, LF and (when high) non-ASCII bytes of v. */
static inline __m128i special_mask(__m128i v, __m128i cr, __m128i lf,
                                   int high) {
  __m128i m = _mm_or_si128(_mm_cmpeq_epi8(v, cr), _mm_cmpeq_epi8(v, lf));
  return high ? _mm_or_si128(m, v) : m; /* v's top bit flags non-ASCII */
}
#endif

/*
 * The first byte in [s, end) that is CR or LF, or also (high) >= 0x80; end
 * if none. This is the one pass over a value's bytes on the hot path: it
 * finds the line end and proves the run in front of it is ASCII at once,
 * 64 bytes per step.
 */
static inline const uchar *scan(const uchar *s, const uchar *end, int high) {
#if OM_SSE_SIMD
  const __m128i cr = _mm_set1_epi8('\r'), lf = _mm_set1_epi8('\n');
  while (end - s >= 64) {
    __m128i a = special_mask(_mm_loadu_si128((const __m128i *)s), cr, lf, high);
    __m128i b =
        special_mask(_mm_loadu_si128((const __m128i *)(s + 16)), cr, lf, high);
    __m128i c =
        special_mask(_mm_loadu_si128((const __m128i *)(s + 32)), cr, lf, high);
    __m128i d =
        special_mask(_mm_loadu_si128((const __m128i *)(s + 48)), cr, lf, high);
    __m128i any = _mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d));
    if (_mm_movemask_epi8(any) != 0) {
      unsigned m;
      if ((m = (unsigned)_mm_movemask_epi8(a)) != 0)
        return s + first_bit(m);
      if ((m = (unsigned)_mm_movemask_epi8(b)) != 0)
        return s + 16 + first_bit(m);
      if ((m = (unsigned)_mm_movemask_epi8(c)) != 0)
        return s + 32 + first_bit(m);
      return s + 48 + first_bit((unsigned)_mm_movemask_epi8(d));
    }
    s += 64;
  }
  while (end - s >= 16) {
    unsigned m = (unsigned)_mm_movemask_epi8(
        special_mask(_mm_loadu_si128((const __m128i *)s), cr, lf, high));
    if (m != 0)
      return s + first_bit(m);
    s += 16;
  }
#else
  /* Portable: test 8 bytes at a time, then find the byte in the word. */
  const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
  while (end - s >= 8) {
    uint64_t w, x, y, hit;
    memcpy(&w, s, 8);
    x = w ^ (ones * '\r');
    y = w ^ (ones * '\n');
    hit = ((x - ones) & ~x) | ((y - ones) & ~y);
    if (high)
      hit |= w;
    if ((hit & highs) != 0)
      break;
    s += 8;
  }
#endif
  while (s < end && !(is_eol(*s) || (high && *s >= 0x80)))
    s++;
  return s;
}

/*
 * One UTF-8 sequence whose lead byte q[0] >= 0x80, per the WHATWG Encoding
 * Standard 4.1.1 "UTF-8 decoder" (byte ranges of its step 3 and the
 * boundaries of its step 4). Returns:
 *   n > 0: a complete valid sequence of n bytes;
 *   -k:    a decoder error after consuming k bytes (the maximal subpart);
 *          the byte after them, if any, is read again as a new start;
 *   0:     [q, end) is a valid but incomplete prefix; *need, *lo and *hi
 *          receive the decoder state to resume with the next chunk.
 */
static int utf8_seq(const uchar *q, const uchar *end, uint8_t *need,
                    uint8_t *lo_out, uint8_t *hi_out) {
  uchar b = q[0], lo = 0x80, hi = 0xBF;
  int n, i;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0)
      lo = 0xA0; /* overlong */
    else if (b == 0xED)
      hi = 0x9F; /* surrogates */
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0)
      lo = 0x90; /* overlong */
    else if (b == 0xF4)
      hi = 0x8F; /* above U+10FFFF */
  } else {
    return -1; /* 80..C1, F5..FF: never a lead byte */
  }
  for (i = 1; i < n; i++) {
    if (q + i == end) {
      *need = (uint8_t)n;
      *lo_out = lo;
      *hi_out = hi;
      return 0;
    }
    if (q[i] < lo || q[i] > hi)
      return -i;
    lo = 0x80;
    hi = 0xBF;
  }
  return n;
}

/*
 * Text that is not pure ASCII: walk it byte by byte, accepting well-formed
 * sequences inline (the common 2- and 3-byte shapes of 4.1.1 without a
 * call), until a line end, a byte that needs utf8_seq (an ill-formed or
 * cut sequence), or 16 ASCII bytes in a row, where the vector scan pays
 * again. Returns that position (or end).
 */
static const uchar *scan_mixed(const uchar *s, const uchar *end) {
  int ascii = 0;
  while (s < end) {
    uchar c = *s;
    if (c < 0x80) {
      if (is_eol(c) || ++ascii == 16)
        return s;
      s++;
      continue;
    }
    ascii = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      if (end - s < 2 || (s[1] & 0xC0) != 0x80)
        return s;
      s += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      uchar lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
      if (end - s < 3 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80)
        return s;
      s += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      uchar lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
      if (end - s < 4 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 ||
          (s[3] & 0xC0) != 0x80)
        return s;
      s += 4;
    } else {
      return s;
    }
  }
  return s;
}

static int utf8_valid(const uchar *s, const uchar *end) {
  uint8_t need, lo, hi;
  for (;;) {
    const uchar *q = scan(s, end, 1);
    int n;
    if (q == end)
      return 1;
    if (*q < 0x80) { /* a line end: ASCII, fine here */
      s = q + 1;
      continue;
    }
    q = scan_mixed(q, end);
    if (q == end)
      return 1;
    if (*q < 0x80) {
      s = q + 1;
      continue;
    }
    n = utf8_seq(q, end, &need, &lo, &hi);
    if (n <= 0)
      return 0; /* an incomplete final sequence is an error too */
    s = q + n;
  }
}

/* ---- buffers -------------------------------------------------------- */

/* Make room for need bytes (need <= limit); doubling, capped at limit. */
static int sbuf_grow(sbuf_t *b, size_t need, size_t limit) {
  size_t cap = b->cap != 0 ? b->cap : 64;
  char *np;
  while (cap < need)
    cap *= 2; /* no overflow: need <= limit <= SIZE_MAX / 4 + 1 */
  if (cap > limit)
    cap = limit;
  np = realloc(b->p, cap);
  if (np == NULL)
    return OM_ENOMEM;
  b->p = np;
  b->cap = cap;
  return 0;
}

/*
 * Append n bytes to one of the event's buffers, enforcing max_event_bytes
 * over all of them. Every buffer keeps one spare byte for a NUL.
 */
static int append(om_sse_parser_t *p, sbuf_t *b, const void *src, size_t n) {
  /* The standard sets no bound; this one (om_sse.h, max_event_bytes) is
   * the implementation's, and is checked before anything grows. */
  size_t total = p->data.len + p->type.len + p->idv.len;
  if (n > p->max - total)
    return OM_ETOOBIG;
  if (b->len + n + 1 > b->cap) {
    int rc = sbuf_grow(b, b->len + n + 1, p->max + 1);
    if (rc != 0)
      return rc;
  }
  if (n != 0) /* src may be NULL for an empty run */
    memcpy(b->p + b->len, src, n);
  b->len += n;
  p->work += n;
  return 0;
}

static void sbuf_release(sbuf_t *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

/* ---- parser --------------------------------------------------------- */

int om_sse_parser_new(const om_sse_parser_opts_t *opts, om_sse_parser_t **out) {
  om_sse_parser_t *p;
  size_t max = opts != NULL ? opts->max_event_bytes : 0;
  if (out == NULL || max > OM_SSE_MAX_EVENT_BYTES_LIMIT)
    return OM_EINVAL;
  if (max == 0)
    max = OM_SSE_DEFAULT_MAX_EVENT_BYTES;
  p = calloc(1, sizeof *p);
  if (p == NULL)
    return OM_ENOMEM;
  p->max = max;
  p->state = ST_BOM;
  p->retry_ms = -1;
  /* Small events then never allocate. */
  if (sbuf_grow(&p->data,
                INITIAL_DATA_CAP < max + 1 ? INITIAL_DATA_CAP : max + 1,
                max + 1) != 0) {
    free(p);
    return OM_ENOMEM;
  }
  *out = p;
  return 0;
}

void om_sse_parser_free(om_sse_parser_t *p) {
  if (p == NULL)
    return;
  sbuf_release(&p->data);
  sbuf_release(&p->type);
  sbuf_release(&p->id);
  sbuf_release(&p->idv);
  sbuf_release(&p->last);
  free(p);
}

static void shrink_for_reset(sbuf_t *b) {
  b->len = 0;
  if (b->cap > KEEP_ON_RESET)
    sbuf_release(b);
}

int om_sse_parser_reset(om_sse_parser_t *p) {
  if (p == NULL)
    return OM_EINVAL;
  if (p->in_cb)
    return OM_ESTATE;
  p->err = 0;
  p->state = ST_BOM;
  p->field = F_NONE;
  p->after_cr = p->bom_seen = p->name_len = 0;
  p->u8_need = p->u8_seen = 0;
  p->retry_any = 0;
  /* The new stream's last event ID buffer is empty, which now differs from
   * the string: the first blank line of the new stream copies it over. */
  p->id_dirty = 1;
  shrink_for_reset(&p->data);
  shrink_for_reset(&p->type);
  shrink_for_reset(&p->id);
  shrink_for_reset(&p->idv);
  return 0;
}

const char *om_sse_parser_last_event_id(const om_sse_parser_t *p, size_t *len) {
  if (p == NULL || p->last.len == 0) {
    if (len != NULL)
      *len = 0;
    return "";
  }
  if (len != NULL)
    *len = p->last.len;
  return p->last.p;
}

int64_t om_sse_parser_retry_ms(const om_sse_parser_t *p) {
  return p != NULL ? p->retry_ms : -1;
}

uint64_t om__sse_parser_work(const om_sse_parser_t *p) {
  return p->work;
}

static void end_line(om_sse_parser_t *p, uchar b) {
  p->state = ST_LINE;
  p->after_cr = b == '\r';
}

static sbuf_t *value_buf(om_sse_parser_t *p) {
  return p->field == F_DATA    ? &p->data
         : p->field == F_EVENT ? &p->type
                               : &p->idv;
}

/*
 * 9.2.6, "dispatch the event", steps in the standard's order. The buffers
 * are cleared after the callback, whose views point into them.
 */
static int dispatch(om_sse_parser_t *p, om_sse_event_cb cb, void *ud,
                    int *stopped) {
  om_sse_event_t ev;
  int r = 0;
  /* Step 1: last event ID string := last event ID buffer (not reset). */
  if (p->id_dirty) {
    if (p->id.len + 1 > p->last.cap) {
      int rc = sbuf_grow(&p->last, p->id.len + 1, p->max + 1);
      if (rc != 0)
        return rc;
    }
    if (p->id.len != 0)
      memcpy(p->last.p, p->id.p, p->id.len);
    p->last.len = p->id.len;
    p->last.p[p->last.len] = '\0';
    p->id_dirty = 0;
  }
  /* Step 2: no data, no event; the event type buffer is still reset. */
  if (p->data.len == 0) {
    p->type.len = 0;
    return 0;
  }
  /* Step 3: every data line appended an LF; drop the last one. */
  p->data.len--;
  p->data.p[p->data.len] = '\0';
  /* Steps 5-6: type "message" unless the event type buffer says else. */
  if (p->type.len != 0) {
    p->type.p[p->type.len] = '\0';
    ev.type = p->type.p;
    ev.type_len = p->type.len;
  } else {
    ev.type = "message";
    ev.type_len = 7;
  }
  ev.data = p->data.p;
  ev.data_len = p->data.len;
  ev.id = om_sse_parser_last_event_id(p, &ev.id_len);
  ev.retry_ms = -1;
  if (cb != NULL) {
    p->in_cb = 1;
    r = cb(ud, &ev);
    p->in_cb = 0;
  }
  /* Step 7. */
  p->data.len = 0;
  p->type.len = 0;
  if (r != 0)
    *stopped = 1;
  return r;
}

/*
 * A colon ended the field name: pick the field. 9.2.6: "Field names must
 * be compared literally, with no case folding performed"; any other name
 * is "Otherwise: The field is ignored."
 */
static void begin_value(om_sse_parser_t *p) {
  const char *n = p->name;
  uint8_t f = F_NONE;
  switch (p->name_len) {
  case 2:
    if (n[0] == 'i' && n[1] == 'd')
      f = F_ID;
    break;
  case 4:
    if (memcmp(n, "data", 4) == 0)
      f = F_DATA;
    break;
  case 5:
    if (memcmp(n, "event", 5) == 0)
      f = F_EVENT;
    else if (memcmp(n, "retry", 5) == 0)
      f = F_RETRY;
    break;
  default:
    break;
  }
  p->field = f;
  if (f == F_EVENT)
    p->type.len = 0; /* "Set the event type buffer to field value." */
  else if (f == F_ID)
    p->idv.len = 0;
  else if (f == F_RETRY) {
    p->retry_acc = 0;
    p->retry_any = 0;
  }
  p->state = f == F_NONE ? ST_SKIP : ST_VALUE_SP;
}

/* The value of a data / event / id field is complete. */
static int end_value(om_sse_parser_t *p) {
  int rc;
  sbuf_t *b = value_buf(p);
  /* Defensive: value_bytes settles a sequence the chunk end cut before it
   * stops at a line end, so this does not happen today. */
  if (p->u8_need != 0) { /* a sequence cut by the line end: one error */
    b->len -= p->u8_seen;
    p->u8_need = 0;
    rc = append(p, b, REPLACEMENT, 3);
    if (rc != 0)
      return rc;
  }
  if (p->field == F_DATA) {
    /* "Append the field value to the data buffer, then append a single
     * U+000A LINE FEED (LF) character to the data buffer." */
    if (p->data.len + p->type.len + p->idv.len < p->max &&
        b->len + 2 <= b->cap) { /* the common case, without memcpy */
      b->p[b->len++] = '\n';
      return 0;
    }
    return append(p, b, "\n", 1);
  }
  if (p->field == F_ID) {
    /* "If the field value does not contain U+0000 NULL, then set the last
     * event ID buffer to the field value. Otherwise, ignore the field." */
    if (p->idv.len == 0 || memchr(p->idv.p, 0, p->idv.len) == NULL) {
      sbuf_t t = p->id;
      p->id = p->idv;
      p->idv = t;
      p->id_dirty = 1;
    }
    p->idv.len = 0;
  }
  return 0;
}

/* 9.2.6: a line that "is not empty but does not contain a U+003A COLON
 * character (:)": the whole line is the name, the value is empty. */
static int field_without_value(om_sse_parser_t *p) {
  p->field = F_NONE;
  if (p->name_len == 4 && memcmp(p->name, "data", 4) == 0)
    return append(p, &p->data, "\n", 1);
  if (p->name_len == 5 && memcmp(p->name, "event", 5) == 0)
    p->type.len = 0;
  else if (p->name_len == 2 && p->name[0] == 'i' && p->name[1] == 'd') {
    p->id.len = 0;
    p->id_dirty = 1;
  }
  /* "retry" with an empty value has no digit to interpret: ignored. */
  return 0;
}

/*
 * Consume value bytes of a kept field up to a line end or the chunk end,
 * decoding UTF-8 into b. *stop receives where it stopped.
 */
static int value_bytes(om_sse_parser_t *p, sbuf_t *b, const uchar *s,
                       const uchar *end, const uchar **stop) {
  const uchar *run;
  int rc;
  /* Finish a sequence the previous chunk cut, byte by byte (4.1.1 steps
   * 4-11); its bytes are in b already, provisionally. */
  while (p->u8_need != 0 && s < end) {
    uchar c = *s;
    if (c < p->u8_lo || c > p->u8_hi) {
      b->len -= p->u8_seen; /* error; c is read again below */
      p->u8_need = 0;
      rc = append(p, b, REPLACEMENT, 3);
      if (rc != 0)
        return rc;
      break;
    }
    rc = append(p, b, &c, 1);
    if (rc != 0)
      return rc;
    s++;
    p->u8_lo = 0x80;
    p->u8_hi = 0xBF;
    if (++p->u8_seen == p->u8_need)
      p->u8_need = 0;
  }
  run = s;
  for (;;) {
    const uchar *q = scan(s, end, 1);
    uint8_t need, lo, hi;
    int n;
    if (q != end && *q >= 0x80)
      q = scan_mixed(q, end);
    p->work += (uint64_t)(q - s);
    if (q == end || is_eol(*q)) { /* chunk end or line end */
      *stop = q;
      return append(p, b, run, (size_t)(q - run));
    }
    if (*q < 0x80) { /* back to plain ASCII */
      s = q;
      continue;
    }
    n = utf8_seq(q, end, &need, &lo, &hi);
    if (n > 0) { /* valid: the run goes on */
      s = q + n;
      continue;
    }
    rc = append(p, b, run, (size_t)(q - run));
    if (rc != 0)
      return rc;
    if (n == 0) { /* cut by the chunk end: keep the prefix provisionally */
      rc = append(p, b, q, (size_t)(end - q));
      if (rc != 0)
        return rc;
      p->u8_need = need;
      p->u8_seen = (uint8_t)(end - q);
      p->u8_lo = lo;
      p->u8_hi = hi;
      *stop = end;
      return 0;
    }
    rc = append(p, b, REPLACEMENT, 3);
    if (rc != 0)
      return rc;
    s = run = q - n;
  }
}

static int run(om_sse_parser_t *p, const uchar *s, const uchar *end,
               om_sse_event_cb cb, void *ud, int *stopped) {
  static const uchar bom[3] = {0xEF, 0xBB, 0xBF};
  int rc;
  while (s < end) {
    switch (p->state) {
    case ST_BOM: {
      /* "The UTF-8 decode algorithm strips one leading UTF-8 Byte Order
       * Mark (BOM), if any" (9.2.6); only here, at stream start. */
      uint8_t held = p->bom_seen;
      if (*s == bom[held]) {
        s++;
        if (++p->bom_seen == 3)
          p->state = ST_LINE;
        break;
      }
      p->state = ST_LINE;
      if (held != 0 && (rc = run(p, bom, bom + held, cb, ud, stopped)) != 0)
        return rc; /* the held prefix was ordinary input after all */
      break;
    }
    case ST_LINE: {
      uchar c = *s;
      /* 9.2.6: a line ends with CRLF, "a single U+000A LINE FEED (LF)
       * character not preceded by a U+000D CARRIAGE RETURN (CR)
       * character", or "a single U+000D CARRIAGE RETURN (CR) character not
       * followed by a U+000A LINE FEED (LF) character". The line ended at
       * the CR already; an LF right after it (maybe in the next chunk) is
       * the rest of that CRLF, not a blank line. */
      if (p->after_cr) {
        p->after_cr = 0;
        if (c == '\n') {
          s++;
          break;
        }
      }
      if (is_eol(c)) { /* "If the line is empty (a blank line): Dispatch
                          the event" */
        s++;
        p->after_cr = c == '\r';
        p->work++;
        if ((rc = dispatch(p, cb, ud, stopped)) != 0)
          return rc;
        break;
      }
      if (c == ':') { /* "If the line starts with a U+003A COLON character
                         (:): Ignore the line." */
        s++;
        p->state = ST_SKIP;
        break;
      }
      if (c == 'd' && end - s >= 6 && memcmp(s, "data:", 5) == 0) {
        /* The line most streams are made of, without the name loop. */
        s += s[5] == ' ' ? 6 : 5;
        p->work += 6;
        p->field = F_DATA;
        p->state = ST_VALUE;
        break;
      }
      p->name_len = 0;
      p->state = ST_NAME;
    }
    /* fallthrough */
    case ST_NAME:
      while (s < end && p->state == ST_NAME) {
        uchar c = *s;
        p->work++;
        if (c == ':') {
          s++;
          begin_value(p);
        } else if (is_eol(c)) {
          s++;
          if ((rc = field_without_value(p)) != 0)
            return rc;
          end_line(p, c);
        } else if (p->name_len == sizeof p->name) {
          p->state = ST_SKIP; /* longer than any field we know */
        } else {
          p->name[p->name_len++] = (char)c;
          s++;
        }
      }
      break;
    case ST_VALUE_SP:
      /* 9.2.6: "If value starts with a U+0020 SPACE character, remove it
       * from value." One U+0020 only: not a tab, not a second space. */
      if (*s == ' ')
        s++;
      p->state = p->field == F_RETRY ? ST_RETRY : ST_VALUE;
      break;
    case ST_VALUE: {
      const uchar *q;
      if ((rc = value_bytes(p, value_buf(p), s, end, &q)) != 0)
        return rc;
      s = q;
      if (s < end) {
        uchar c = *s++;
        if ((rc = end_value(p)) != 0)
          return rc;
        end_line(p, c);
      }
      break;
    }
    case ST_RETRY:
      while (s < end) {
        uchar c = *s;
        p->work++;
        if (is_eol(c)) {
          /* "consists of only ASCII digits": interpret in base ten. */
          s++;
          if (p->retry_any)
            p->retry_ms = (int64_t)p->retry_acc;
          end_line(p, c);
          break;
        }
        if (c < '0' || c > '9') {
          p->state = ST_SKIP; /* not a number: the field is ignored */
          break;
        }
        s++;
        p->retry_any = 1;
        if (p->retry_acc > (uint64_t)(INT64_MAX - (c - '0')) / 10)
          p->retry_acc = INT64_MAX; /* saturate */
        else
          p->retry_acc = p->retry_acc * 10 + (uint64_t)(c - '0');
      }
      break;
    case ST_SKIP: {
      const uchar *q = scan(s, end, 0);
      p->work += (uint64_t)(q - s);
      s = q;
      if (s < end) {
        uchar c = *s++;
        end_line(p, c);
      }
      break;
    }
    default:
      return OM_ESTATE; /* unreachable */
    }
  }
  return 0;
}

int om_sse_parser_feed(om_sse_parser_t *p, const char *buf, size_t len,
                       om_sse_event_cb cb, void *ud) {
  int rc, stopped = 0;
  if (p == NULL || (buf == NULL && len != 0))
    return OM_EINVAL;
  if (p->in_cb)
    return OM_ESTATE;
  if (p->err != 0)
    return p->err;
  if (len == 0)
    return 0;
  rc = run(p, (const uchar *)buf, (const uchar *)buf + len, cb, ud, &stopped);
  if (rc != 0)
    p->err = stopped ? OM_ESTATE : rc;
  return rc;
}

/* ---- writer --------------------------------------------------------- */

typedef struct {
  char *buf; /* NULL: only count */
  size_t len;
  int overflow;
} writer_t;

static void put(writer_t *w, const void *src, size_t n) {
  if (n > SIZE_MAX - w->len) {
    w->overflow = 1;
    return;
  }
  if (w->buf != NULL && n != 0)
    memcpy(w->buf + w->len, src, n);
  w->len += n;
}

/* "name: value\n", or "name:\n" for an empty value. */
static void put_field(writer_t *w, const char *name, size_t name_len,
                      const void *v, size_t n) {
  put(w, name, name_len);
  if (n != 0) {
    put(w, ": ", 2);
    put(w, v, n);
    put(w, "\n", 1);
  } else {
    put(w, ":\n", 2);
  }
}

static void put_event(writer_t *w, const om_sse_event_t *ev) {
  if (ev->type_len != 0)
    put_field(w, "event", 5, ev->type, ev->type_len);
  if (ev->id != NULL)
    put_field(w, "id", 2, ev->id, ev->id_len);
  if (ev->retry_ms >= 0) {
    char digits[20];
    size_t i = sizeof digits;
    uint64_t v = (uint64_t)ev->retry_ms;
    do {
      digits[--i] = (char)('0' + v % 10);
      v /= 10;
    } while (v != 0);
    put_field(w, "retry", 5, digits + i, sizeof digits - i);
  }
  if (ev->data != NULL) {
    /* One data line per line of data; CR, LF and CRLF all break lines
     * because the receiver reads each of them as a line end (9.2.6). */
    const uchar *s = (const uchar *)ev->data, *end = s + ev->data_len;
    for (;;) {
      const uchar *q = scan(s, end, 0);
      put_field(w, "data", 4, s, (size_t)(q - s));
      if (q == end)
        break;
      s = q + (*q == '\r' && q + 1 < end && q[1] == '\n' ? 2 : 1);
    }
  }
  put(w, "\n", 1);
}

static int check_event(const om_sse_event_t *ev) {
  const uchar *t, *i, *d;
  if (ev == NULL || (ev->type == NULL && ev->type_len != 0) ||
      (ev->id == NULL && ev->id_len != 0) ||
      (ev->data == NULL && ev->data_len != 0))
    return OM_EINVAL;
  t = (const uchar *)ev->type;
  i = (const uchar *)ev->id;
  d = (const uchar *)ev->data;
  if (ev->type_len != 0) {
    if (ev->data == NULL || scan(t, t + ev->type_len, 0) != t + ev->type_len ||
        !utf8_valid(t, t + ev->type_len))
      return OM_EINVAL;
  }
  if (ev->id_len != 0) {
    if (scan(i, i + ev->id_len, 0) != i + ev->id_len ||
        memchr(i, 0, ev->id_len) != NULL || !utf8_valid(i, i + ev->id_len))
      return OM_EINVAL;
  }
  if (ev->data_len != 0 && !utf8_valid(d, d + ev->data_len))
    return OM_EINVAL;
  return 0;
}

int om_sse_encode(const om_sse_event_t *ev, char *buf, size_t cap,
                  size_t *need) {
  writer_t w = {NULL, 0, 0};
  int rc = check_event(ev);
  if (rc != 0)
    return rc;
  if (buf == NULL && cap != 0)
    return OM_EINVAL;
  put_event(&w, ev);
  if (w.overflow)
    return OM_ETOOBIG;
  if (need != NULL)
    *need = w.len;
  if (w.len > cap)
    return OM_ETOOBIG;
  w.buf = buf;
  w.len = 0;
  put_event(&w, ev);
  return 0;
}

int om_sse_encode_alloc(const om_sse_event_t *ev, char **out, size_t *len) {
  writer_t w = {NULL, 0, 0};
  char *b;
  int rc;
  if (out == NULL)
    return OM_EINVAL;
  if ((rc = check_event(ev)) != 0)
    return rc;
  put_event(&w, ev);
  if (w.overflow || w.len == SIZE_MAX)
    return OM_ENOMEM;
  b = malloc(w.len + 1);
  if (b == NULL)
    return OM_ENOMEM;
  w.buf = b;
  w.len = 0;
  put_event(&w, ev);
  b[w.len] = '\0';
  *out = b;
  if (len != NULL)
    *len = w.len;
  return 0;
}
