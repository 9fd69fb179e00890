/*
 * om_json.c: the validating JSON scanner (om_json.h).
 *
 * Why it exists: the pass-through path only needs to know that a body is
 * a JSON text the gateway's parser would take, and to read a few fields
 * of it. jansson builds a tree for that (an allocation per value, about
 * 250 instructions a byte); this is one left-to-right pass that builds
 * nothing and hands each value to a callback with its path.
 *
 * How: iterative, never recursive. The open containers live in fixed
 * arrays sized by OM_JSON_MAX_DEPTH, the open member names in a fixed
 * stack of OM_JSON_MAX_KEYS spans (a nested object pushes its names over
 * those of the objects around it and pops them at its end), with a small
 * open-addressing table over that stack so the duplicate check costs the
 * same per name in a wide object as in a narrow one. Nothing is
 * allocated; the whole state is a few kilobytes of stack.
 *
 * What it accepts mirrors jansson 2.14 (src/load.c, src/utf.c) rule by
 * rule, so that OK and INVALID are both exact:
 *  - lex_scan skips SP HTAB LF CR only; parse_json wants '{' or '[' first
 *    and nothing but whitespace after the value;
 *  - stream_get checks every non-ASCII byte as utf8_check_first/full do
 *    (no C0/C1/F5..FF lead, no stray continuation, no overlong form, no
 *    surrogate, nothing above U+10FFFF, nothing cut short);
 *  - lex_scan_string refuses bytes 0..0x1F and any escape but the eight
 *    short ones and \u with four hex digits; its decoding pass wants a
 *    \uD800..\uDBFF immediately followed by \uDC00..\uDFFF and refuses a
 *    lone \uDC00..\uDFFF; parse_value refuses a decoded NUL (\u0000);
 *  - lex_scan_number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
 *    and anything after that starts the next token (so "01" is "0" then a
 *    stray "1"); an integer goes through strtoll (ERANGE refused), a real
 *    through strtod (+-HUGE_VAL with ERANGE refused, underflow kept);
 *  - identifiers are read as a run of letters that must be exactly true,
 *    false or null (so "truex" is refused, as it is here by the 'x');
 *  - JSON_REJECT_DUPLICATES compares decoded names, which equal the raw
 *    bytes because a name with an escape is not decided here.
 *
 * Where it is unsure it stops and says so (om_json.h lists the cases),
 * and in one case more, a quirk of jansson's: after a number or a
 * literal, the byte that ended it is read and put back, and when that
 * byte is a NUL, putting it back leaves stream_get's one-character buffer
 * looking empty, so the NUL is skipped: "[1\0]" and {"a":true\0} are
 * accepted (a second NUL is not). That is no JSON text, and the full
 * parser's answer is the one the caller had before, so the scanner is
 * UNSURE there rather than OK or INVALID.
 *
 * Speed: string bodies, the bulk of real documents, are scanned eight
 * bytes at a time with one word test (special8) that is exact, so only
 * a quote, a backslash, a control byte or a non-ASCII byte leaves the
 * tight loop. Numbers need no conversion except the rare real whose
 * magnitude is within one decade of DBL_MAX, and then strtod runs on a
 * local copy of its digits without a decimal point, so the locale never
 * matters.
 *
 * *where: the first byte at fault: for a string, the control byte, the
 * backslash of the escape at fault (of the high one for a broken pair),
 * or the lead byte of the ill-formed UTF-8 sequence; for a number that
 * does not fit, its first byte; for a duplicate name, its opening quote;
 * n when the input ends before the document does. For OK, n; for
 * STOPPED, the start of the value whose event stopped it.
 */
#include "om_json.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "om_http_chars.h"

typedef unsigned char uchar;

/* The longest number decided here: its digits are copied to the stack
 * for strtod in the worst case. */
#define OM_JSON_NUM_MAX 64
/* Slots of the table over the open names: a power of two, at least
 * twice OM_JSON_MAX_KEYS, so a probe always ends at an empty slot soon. */
#define OM_JSON_SLOTS 1024

_Static_assert((OM_JSON_SLOTS & (OM_JSON_SLOTS - 1)) == 0,
               "OM_JSON_SLOTS is a power of two");
_Static_assert(OM_JSON_SLOTS >= 2 * OM_JSON_MAX_KEYS,
               "the name table stays at most half full");
_Static_assert(OM_JSON_MAX_KEYS < 65535, "name indexes fit in uint16_t");

#define OM_ONES 0x0101010101010101ull
#define OM_HIGH 0x8080808080808080ull

static int is_ws(uchar c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static int is_digit(uchar c) {
  return c >= '0' && c <= '9';
}

static const uchar *skip_ws(const uchar *p, const uchar *e) {
  while (p < e && is_ws(*p))
    p++;
  return p;
}

/* A byte a string takes as it is: not a quote, backslash, control byte
 * or the start of a UTF-8 sequence. */
static int plain(uchar c) {
  return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

/*
 * Nonzero iff one of the 8 bytes at p is not plain(). Exact, not a hint:
 * for plain bytes none of the subtractions borrows and no high bit is
 * set; at the lowest byte that is not plain nothing borrows into it, and
 * b - 0x20 (b < 0x20), 0 - 1 (a quote or backslash after the xor) or b
 * itself (b >= 0x80) sets its high bit.
 */
static uint64_t special8(const uchar *p) {
  uint64_t w;
  memcpy(&w, p, sizeof w);
  return ((w - OM_ONES * 0x20) | ((w ^ (OM_ONES * '"')) - OM_ONES) |
          ((w ^ (OM_ONES * '\\')) - OM_ONES) | w) &
         OM_HIGH;
}

/*
 * The first byte that is not plain() among the 8 at p, given special8's
 * nonzero answer m for them. Little-endian, that is the lowest bit of m:
 * the bytes below the first such byte are plain and take no borrow, so
 * their bits are clear. Elsewhere a byte loop finds it, within 8 bytes.
 */
static const uchar *first_special(const uchar *p, uint64_t m) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__BYTE_ORDER__) &&    \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return p + (__builtin_ctzll(m) >> 3);
#else
  (void)m;
  while (plain(*p))
    p++;
  return p;
#endif
}

/* Four hex digits at p (either case) into *v; 0 when there are not. */
static int hex4(const uchar *p, const uchar *e, unsigned *v) {
  unsigned x = 0;
  if (e - p < 4)
    return 0;
  for (int i = 0; i < 4; i++) {
    int d = om__http_hex_val(p[i]);
    if (d < 0)
      return 0;
    x = x << 4 | (unsigned)d;
  }
  *v = x;
  return 1;
}

/* ------------------------------------------------------------------ */
/* strings */

/* The length of the well-formed UTF-8 sequence at p (p[0] >= 0x80), or
 * 0: utf8_check_first and utf8_check_full, with the ranges of the second
 * byte that rule out overlong forms, surrogates and > U+10FFFF. */
static size_t utf8_seq(const uchar *p, const uchar *e) {
  size_t avail = (size_t)(e - p);
  uchar c = p[0], lo = 0x80, hi = 0xBF;
  if (c < 0xC2) /* a continuation byte, or C0/C1 (overlong) */
    return 0;
  if (c < 0xE0)
    return avail >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
  if (c < 0xF0) {
    if (c == 0xE0)
      lo = 0xA0; /* below: overlong */
    else if (c == 0xED)
      hi = 0x9F; /* above: U+D800..U+DFFF */
    return avail >= 3 && p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 ? 3
                                                                           : 0;
  }
  if (c < 0xF5) {
    if (c == 0xF0)
      lo = 0x90; /* below: overlong */
    else if (c == 0xF4)
      hi = 0x8F; /* above: beyond U+10FFFF */
    return avail >= 4 && p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 &&
                   (p[3] & 0xC0) == 0x80
               ? 4
               : 0;
  }
  return 0;
}

/* The escape at p (p[0] is the backslash): past it, or NULL when jansson
 * refuses it. */
static const uchar *scan_escape(const uchar *p, const uchar *e) {
  unsigned u, lo;
  if (e - p < 2)
    return NULL;
  switch (p[1]) {
  case '"':
  case '\\':
  case '/':
  case 'b':
  case 'f':
  case 'n':
  case 'r':
  case 't':
    return p + 2;
  case 'u':
    break;
  default:
    return NULL;
  }
  /* \u0000: a NUL in the value (refused without JSON_ALLOW_NUL); a low
   * surrogate with no high one before it */
  if (!hex4(p + 2, e, &u) || u == 0 || (u >= 0xDC00 && u <= 0xDFFF))
    return NULL;
  if (u < 0xD800 || u > 0xDBFF)
    return p + 6;
  /* a high surrogate: its low one must come right after it */
  if (e - p < 12 || p[6] != '\\' || p[7] != 'u' || !hex4(p + 8, e, &lo) ||
      lo < 0xDC00 || lo > 0xDFFF)
    return NULL;
  return p + 12;
}

/*
 * The string whose opening quote is at *pp; on OK *pp is past its closing
 * quote. A member name (name != 0) with an escape is UNSURE: the
 * duplicate check compares raw bytes, which is exact only without
 * escapes. On anything else *fault is the byte at fault.
 */
static om_json_result_t scan_string(const uchar **pp, const uchar *e, int name,
                                    const uchar **fault) {
  const uchar *p = *pp + 1;
  for (;;) {
    while (e - p >= 8) {
      uint64_t m = special8(p);
      if (m != 0) {
        p = first_special(p, m);
        goto special;
      }
      p += 8;
    }
    while (p < e && plain(*p)) /* the last few bytes of the input */
      p++;
    if (p == e) {
      *fault = e;
      return OM_JSON_INVALID;
    }
  special:
    if (*p == '"') {
      *pp = p + 1;
      return OM_JSON_OK;
    }
    if (*p == '\\') {
      const uchar *q;
      if (name) {
        *fault = p;
        return OM_JSON_UNSURE;
      }
      q = scan_escape(p, e);
      if (q == NULL) {
        *fault = p;
        return OM_JSON_INVALID;
      }
      p = q;
      continue;
    }
    if (*p < 0x20) {
      *fault = p;
      return OM_JSON_INVALID;
    }
    /* non-ASCII text comes in runs: stay here while it lasts */
    do {
      size_t k = utf8_seq(p, e);
      if (k == 0) {
        *fault = p;
        return OM_JSON_INVALID;
      }
      p += k;
    } while (p < e && *p >= 0x80);
  }
}

/* ------------------------------------------------------------------ */
/* numbers */

/*
 * 1 when the real with integer digits [ip, ie), fraction digits [fp, fe)
 * and exponent x (saturated, far beyond any decade that matters) rounds
 * to infinity. With D its significant digits (no leading zeros), nd of
 * them, the value is 0.D * 10^P, in [10^(P-1), 10^P): below 10^308 it is
 * finite, from 10^309 on it overflows (DBL_MAX is 1.8e308), and only in
 * between does strtod decide, on "De<P-nd>", which has no decimal point
 * for a locale to misread.
 */
static int real_overflows(const uchar *ip, const uchar *ie, const uchar *fp,
                          const uchar *fe, long x) {
  char buf[OM_JSON_NUM_MAX + 16];
  size_t nd = 0, lz = 0;
  long pow10;
  int saved = errno, over;
  double v;
  /* the significant digits, integer part then fraction */
  for (const uchar *q = ip; q < ie; q++)
    if (nd == 0 && *q == '0')
      lz++;
    else
      buf[nd++] = (char)*q;
  for (const uchar *q = fp; q < fe; q++)
    if (nd == 0 && *q == '0')
      lz++;
    else
      buf[nd++] = (char)*q;
  if (nd == 0) /* zero, whatever the exponent */
    return 0;
  pow10 = (long)(ie - ip) - (long)lz + x;
  if (pow10 <= DBL_MAX_10_EXP)
    return 0;
  if (pow10 > DBL_MAX_10_EXP + 1)
    return 1;
  /* the exponent, DBL_MAX_10_EXP + 1 - nd, is between 245 and 308 */
  {
    long ex = pow10 - (long)nd;
    size_t k = nd;
    buf[k++] = 'e';
    buf[k++] = (char)('0' + ex / 100);
    buf[k++] = (char)('0' + ex / 10 % 10);
    buf[k++] = (char)('0' + ex % 10);
    buf[k] = '\0';
  }
  errno = 0;
  v = strtod(buf, NULL);
  over = v == HUGE_VAL && errno == ERANGE;
  errno = saved;
  return over;
}

/* The number at *pp (a '-' or a digit), as lex_scan_number reads it; on
 * OK *pp is past it. */
static om_json_result_t scan_number(const uchar **pp, const uchar *e,
                                    const uchar **fault) {
  const uchar *start = *pp, *p = start, *ip, *ie, *fp = NULL, *fe = NULL;
  long x = 0;
  int real = 0;
  if (*p == '-')
    p++;
  ip = p;
  if (p < e && *p == '0') {
    p++;
  } else if (p < e && *p >= '1' && *p <= '9') {
    do
      p++;
    while (p < e && is_digit(*p));
  } else {
    *fault = p;
    return OM_JSON_INVALID;
  }
  ie = p;
  if (p < e && *p == '.') {
    p++;
    if (p == e || !is_digit(*p)) {
      *fault = p;
      return OM_JSON_INVALID;
    }
    fp = p;
    do
      p++;
    while (p < e && is_digit(*p));
    fe = p;
    real = 1;
  }
  if (p < e && (*p | 0x20) == 'e') {
    int neg = 0;
    p++;
    if (p < e && (*p == '+' || *p == '-')) {
      neg = *p == '-';
      p++;
    }
    if (p == e || !is_digit(*p)) {
      *fault = p;
      return OM_JSON_INVALID;
    }
    do {
      if (x < 1000000) /* saturate: a number is at most 64 bytes */
        x = x * 10 + (*p - '0');
      p++;
    } while (p < e && is_digit(*p));
    if (neg)
      x = -x;
    real = 1;
  }
  *fault = start;
  if (p - start > OM_JSON_NUM_MAX)
    return OM_JSON_UNSURE;
  if (!real) {
    /* strtoll's range: no leading zeros, so the digit count decides
     * except at 19 digits, where the digits compare as text */
    size_t nd = (size_t)(ie - ip);
    const char *lim =
        *start == '-' ? "9223372036854775808" : "9223372036854775807";
    if (nd > 19 || (nd == 19 && memcmp(ip, lim, 19) > 0))
      return OM_JSON_INVALID;
  } else {
    if (fp == NULL) /* no fraction */
      fp = fe = ie;
    if (real_overflows(ip, ie, fp, fe, x))
      return OM_JSON_INVALID;
  }
  *pp = p;
  return OM_JSON_OK;
}

/* ------------------------------------------------------------------ */
/* the open member names */

typedef struct {
  const uchar *p[OM_JSON_MAX_KEYS];
  size_t len[OM_JSON_MAX_KEYS];
  uint32_t hash[OM_JSON_MAX_KEYS];
  uint16_t slot[OM_JSON_MAX_KEYS]; /* where in table name i is, or NO_SLOT */
  uint16_t table[OM_JSON_SLOTS];   /* 1 + the index of a name, 0: empty */
  size_t n;
  int ready; /* table cleared: done at the first name, not per scan */
} om_json_names_t;

static uint32_t name_hash(const uchar *p, size_t n) {
  uint64_t h = (uint64_t)n * 0x9e3779b97f4a7c15ull, w;
  for (; n >= 8; p += 8, n -= 8) {
    memcpy(&w, p, sizeof w);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  w = 0;
  for (size_t i = 0; i < n; i++)
    w |= (uint64_t)p[i] << (8 * i);
  h = (h ^ w) * 0xff51afd7ed558ccdull;
  return (uint32_t)(h ^ (h >> 33));
}

/* An object's names are compared one by one up to this many (most
 * objects are small: no table to clear per scan), then go to the table. */
#define LINEAR_MAX 16
#define NO_SLOT UINT16_MAX

static void names_insert(om_json_names_t *t, size_t k) {
  size_t i = t->hash[k] & (OM_JSON_SLOTS - 1);
  while (t->table[i] != 0)
    i = (i + 1) & (OM_JSON_SLOTS - 1);
  t->slot[k] = (uint16_t)i;
  t->table[i] = (uint16_t)(k + 1);
}

/*
 * Open the name p[0..len) in the object whose names start at index base:
 * INVALID when that object already has it, UNSURE when the stack is
 * full. An object with up to LINEAR_MAX names compares them in turn; one
 * more moves its names into the table. Names of enclosing objects may be
 * in the table too (they stay open) but below base, so they never count
 * as duplicates.
 */
static om_json_result_t names_push(om_json_names_t *t, size_t base,
                                   const uchar *p, size_t len) {
  int hashed = t->n > base && t->slot[base] != NO_SLOT;
  uint32_t h;
  size_t i;
  if (!hashed) {
    for (size_t k = base; k < t->n; k++)
      if (t->len[k] == len && memcmp(t->p[k], p, len) == 0)
        return OM_JSON_INVALID;
    if (t->n == OM_JSON_MAX_KEYS)
      return OM_JSON_UNSURE;
    t->p[t->n] = p;
    t->len[t->n] = len;
    t->slot[t->n] = NO_SLOT;
    t->n++;
    if (t->n - base > LINEAR_MAX) {
      if (!t->ready) {
        memset(t->table, 0, sizeof t->table);
        t->ready = 1;
      }
      for (size_t k = base; k < t->n; k++) {
        t->hash[k] = name_hash(t->p[k], t->len[k]);
        names_insert(t, k);
      }
    }
    return OM_JSON_OK;
  }
  h = name_hash(p, len);
  for (i = h & (OM_JSON_SLOTS - 1); t->table[i] != 0;
       i = (i + 1) & (OM_JSON_SLOTS - 1)) {
    size_t k = t->table[i] - 1u;
    if (k >= base && t->hash[k] == h && t->len[k] == len &&
        memcmp(t->p[k], p, len) == 0)
      return OM_JSON_INVALID;
  }
  if (t->n == OM_JSON_MAX_KEYS)
    return OM_JSON_UNSURE;
  t->p[t->n] = p;
  t->len[t->n] = len;
  t->hash[t->n] = h;
  t->slot[t->n] = (uint16_t)i;
  t->table[i] = (uint16_t)(t->n + 1);
  t->n++;
  return OM_JSON_OK;
}

/*
 * Close the names from base up. Clearing a slot is a correct removal
 * from linear probing here only because names leave in the reverse order
 * they came: no name still in the table was placed after the one leaving,
 * so none probed past its slot.
 */
static void names_pop(om_json_names_t *t, size_t base) {
  while (t->n > base) {
    t->n--;
    if (t->slot[t->n] != NO_SLOT)
      t->table[t->slot[t->n]] = 0;
  }
}

/* ------------------------------------------------------------------ */
/* the scan */

static int emit(om_json_cb cb, void *ud, om_json_ev_t *ev, om_json_type_t t,
                const uchar *text, size_t len, size_t depth) {
  ev->type = t;
  ev->text = (const char *)text;
  ev->len = len;
  ev->depth = depth;
  return cb(ud, ev) != 0;
}

om_json_result_t om_json_scan(const char *s, size_t n, om_json_cb cb, void *ud,
                              size_t *where) {
  const uchar *b = (const uchar *)s, *p, *e, *fault, *start;
  /* path[d]: where the value at depth d + 1 is; its index counts the
   * members of an object as well as the elements of an array */
  om_json_seg_t path[OM_JSON_MAX_DEPTH + 1];
  uchar open[OM_JSON_MAX_DEPTH + 1];    /* '{' or '[' per open container */
  uint16_t base[OM_JSON_MAX_DEPTH + 1]; /* its first name, for an object */
  om_json_names_t names;
  om_json_ev_t ev;
  om_json_result_t rc;
  size_t depth = 0; /* open containers: the depth of the next value */
  uchar c;

  if (s == NULL) {
    if (where != NULL)
      *where = 0;
    return OM_JSON_INVALID;
  }
  e = b + n;
  names.n = 0;
  names.ready = 0;
  ev.path = path;
  p = skip_ws(b, e);
  if (p == e || (*p != '{' && *p != '[')) { /* no scalar at the top */
    fault = p;
    rc = OM_JSON_INVALID;
    goto out;
  }

value: /* a value starts at p, at path[0..depth) */
  rc = OM_JSON_INVALID;
  fault = p;
  if (p == e)
    goto out;
  start = p;
  switch (*p) {
  case '{':
  case '[':
    if (depth > OM_JSON_MAX_DEPTH) {
      rc = OM_JSON_UNSURE;
      goto out;
    }
    c = *p;
    if (cb != NULL &&
        emit(cb, ud, &ev, c == '{' ? OM_JSON_OBJECT : OM_JSON_ARRAY, p, 1,
             depth))
      goto stopped;
    open[depth] = c;
    base[depth] = (uint16_t)names.n;
    path[depth].key = NULL;
    path[depth].key_len = 0;
    path[depth].index = 0;
    depth++;
    p = skip_ws(p + 1, e);
    if (p < e && *p == (c == '{' ? '}' : ']'))
      goto close;
    if (c == '{')
      goto member;
    goto value;
  case '"':
    rc = scan_string(&p, e, 0, &fault);
    if (rc != OM_JSON_OK)
      goto out;
    if (cb != NULL &&
        emit(cb, ud, &ev, OM_JSON_STRING, start, (size_t)(p - start), depth))
      goto stopped;
    break;
  case 't':
  case 'f':
  case 'n': {
    const char *lit = *p == 't' ? "true" : *p == 'f' ? "false" : "null";
    om_json_type_t t = *p == 't'   ? OM_JSON_TRUE
                       : *p == 'f' ? OM_JSON_FALSE
                                   : OM_JSON_NULL;
    size_t k = strlen(lit);
    for (size_t i = 0; i < k; i++)
      if (p + i == e || p[i] != (uchar)lit[i]) {
        fault = p + i;
        goto out;
      }
    p += k;
    if (p < e && *p == 0) { /* see the top */
      fault = p;
      rc = OM_JSON_UNSURE;
      goto out;
    }
    if (cb != NULL && emit(cb, ud, &ev, t, start, k, depth))
      goto stopped;
    break;
  }
  default:
    if (*p != '-' && !is_digit(*p))
      goto out;
    rc = scan_number(&p, e, &fault);
    if (rc != OM_JSON_OK)
      goto out;
    if (p < e && *p == 0) { /* see the top */
      fault = p;
      rc = OM_JSON_UNSURE;
      goto out;
    }
    if (cb != NULL &&
        emit(cb, ud, &ev, OM_JSON_NUMBER, start, (size_t)(p - start), depth))
      goto stopped;
    break;
  }

after: /* a value ended before p: a separator, a close or the end */
  p = skip_ws(p, e);
  rc = OM_JSON_INVALID;
  fault = p;
  if (depth == 0) {
    if (p == e)
      rc = OM_JSON_OK;
    goto out;
  }
  if (p == e)
    goto out;
  c = open[depth - 1];
  if (*p == ',') {
    path[depth - 1].index++;
    p = skip_ws(p + 1, e);
    if (c == '{')
      goto member;
    goto value;
  }
  if (*p != (c == '{' ? '}' : ']'))
    goto out;

close: /* p is at the bracket closing the container at depth - 1 */
  depth--;
  if (open[depth] == '{')
    names_pop(&names, base[depth]);
  if (cb != NULL && emit(cb, ud, &ev, OM_JSON_END, p, 1, depth)) {
    start = p;
    goto stopped;
  }
  p++;
  goto after;

member: /* a member name is due at p */
  rc = OM_JSON_INVALID;
  fault = p;
  if (p == e || *p != '"')
    goto out;
  start = p;
  rc = scan_string(&p, e, 1, &fault);
  if (rc != OM_JSON_OK)
    goto out;
  fault = start;
  rc = names_push(&names, base[depth - 1], start + 1, (size_t)(p - start - 2));
  if (rc != OM_JSON_OK)
    goto out;
  path[depth - 1].key = (const char *)start + 1;
  path[depth - 1].key_len = (size_t)(p - start - 2);
  p = skip_ws(p, e);
  rc = OM_JSON_INVALID;
  fault = p;
  if (p == e || *p != ':')
    goto out;
  p = skip_ws(p + 1, e);
  goto value;

stopped:
  rc = OM_JSON_STOPPED;
  fault = start;
out:
  if (where != NULL)
    *where = (size_t)(fault - b);
  return rc;
}

/* ------------------------------------------------------------------ */
/* reading values */

int om_json_at(const om_json_ev_t *ev, size_t depth, const char *const *keys,
               const size_t *idx) {
  if (ev == NULL || ev->depth != depth)
    return 0;
  for (size_t i = 0; i < depth; i++) {
    const om_json_seg_t *g = &ev->path[i];
    const char *k = keys != NULL ? keys[i] : NULL;
    if (k != NULL) {
      size_t kl = strlen(k);
      if (g->key == NULL || g->key_len != kl || memcmp(g->key, k, kl) != 0)
        return 0;
    } else if (g->key != NULL || idx == NULL || g->index != idx[i]) {
      return 0;
    }
  }
  return 1;
}

/* Append n bytes as far as cap allows; count them all. */
static void put(char *out, size_t cap, size_t *o, const void *src, size_t n) {
  if (*o < cap)
    memcpy(out + *o, src, n < cap - *o ? n : cap - *o);
  *o += n;
}

static void utf8_put(char *out, size_t cap, size_t *o, unsigned cp) {
  uchar u[4];
  size_t k;
  if (cp < 0x80) {
    u[0] = (uchar)cp;
    k = 1;
  } else if (cp < 0x800) {
    u[0] = (uchar)(0xC0 | cp >> 6);
    u[1] = (uchar)(0x80 | (cp & 0x3F));
    k = 2;
  } else if (cp < 0x10000) {
    u[0] = (uchar)(0xE0 | cp >> 12);
    u[1] = (uchar)(0x80 | (cp >> 6 & 0x3F));
    u[2] = (uchar)(0x80 | (cp & 0x3F));
    k = 3;
  } else {
    u[0] = (uchar)(0xF0 | cp >> 18);
    u[1] = (uchar)(0x80 | (cp >> 12 & 0x3F));
    u[2] = (uchar)(0x80 | (cp >> 6 & 0x3F));
    u[3] = (uchar)(0x80 | (cp & 0x3F));
    k = 4;
  }
  put(out, cap, o, u, k);
}

size_t om_json_string(const char *text, size_t len, char *out, size_t cap) {
  const uchar *p, *e;
  size_t o = 0;
  if (text == NULL || len < 2)
    return 0;
  if (out == NULL)
    cap = 0;
  p = (const uchar *)text + 1;
  e = (const uchar *)text + len - 1; /* the closing quote */
  while (p < e) {
    const uchar *bs = memchr(p, '\\', (size_t)(e - p));
    unsigned cp, lo;
    char ch;
    if (bs == NULL)
      bs = e;
    put(out, cap, &o, p, (size_t)(bs - p));
    p = bs;
    /* the text was validated; a malformed one is cut where it breaks */
    if (p == e || e - p < 2)
      break;
    switch (p[1]) {
    case 'b':
      ch = '\b';
      break;
    case 'f':
      ch = '\f';
      break;
    case 'n':
      ch = '\n';
      break;
    case 'r':
      ch = '\r';
      break;
    case 't':
      ch = '\t';
      break;
    case 'u':
      if (!hex4(p + 2, e, &cp))
        return o;
      p += 6;
      if (cp >= 0xD800 && cp <= 0xDBFF && e - p >= 6 && p[0] == '\\' &&
          p[1] == 'u' && hex4(p + 2, e, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        p += 6;
      } else if (cp >= 0xD800 && cp <= 0xDFFF) {
        cp = 0xFFFD; /* unpaired: not in a validated text */
      }
      utf8_put(out, cap, &o, cp);
      continue;
    default: /* '"', '\\', '/' stand for themselves */
      ch = (char)p[1];
      break;
    }
    put(out, cap, &o, &ch, 1);
    p += 2;
  }
  return o;
}

int om_json_int(const char *text, size_t len, int64_t *v) {
  uint64_t acc = 0, lim = (uint64_t)INT64_MAX;
  size_t i = 0;
  int neg = 0;
  if (text == NULL || v == NULL || len == 0)
    return -1;
  if (text[0] == '-') {
    neg = 1;
    lim = (uint64_t)INT64_MAX + 1;
    i = 1;
  }
  if (i == len || (text[i] == '0' && len - i > 1))
    return -1; /* no digits, or a leading zero: not a JSON integer */
  for (; i < len; i++) {
    unsigned d = (unsigned)(uchar)text[i] - '0';
    if (d > 9 || acc > (lim - d) / 10)
      return -1;
    acc = acc * 10 + d;
  }
  /* -(INT64_MAX + 1) is INT64_MIN: negate in unsigned, then convert */
  *v = neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc)
           : (int64_t)acc;
  return 0;
}
