/*
 * om_snapshot_json.c: snapshot and registration JSON (om_snapshot_json.h).
 *
 * Encoding writes straight into one growing buffer. Every string we emit
 * was validated first (ids and urls are ASCII, zones printable ASCII,
 * metadata valid UTF-8), so escaping per RFC 8259 section 7 is enough to
 * produce valid JSON: '"', '\\' and U+0000..U+001F are escaped, every other
 * byte is copied.
 */
#include "om_snapshot_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <xxhash.h>
#include <zlib.h>

#include "om_errno.h"

/* ---- a growing output buffer ---- */

typedef struct jw_s {
  char *p;
  size_t len, cap;
  int oom;
} jw_t;

static int jw_reserve(jw_t *w, size_t n) {
  size_t cap;
  char *p;
  if (w->oom)
    return 0;
  if (n <= w->cap - w->len)
    return 1;
  if (n > SIZE_MAX / 2 - w->len) {
    w->oom = 1;
    return 0;
  }
  cap = w->cap != 0 ? w->cap : 256;
  while (cap - w->len < n)
    cap *= 2;
  p = realloc(w->p, cap);
  if (p == NULL) {
    w->oom = 1;
    return 0;
  }
  w->p = p;
  w->cap = cap;
  return 1;
}

static void jw_raw(jw_t *w, const char *s, size_t n) {
  if (jw_reserve(w, n)) {
    memcpy(w->p + w->len, s, n);
    w->len += n;
  }
}

static void jw_lit(jw_t *w, const char *s) {
  jw_raw(w, s, strlen(s));
}

/* A JSON string (RFC 8259 section 7). */
static void jw_str(jw_t *w, const char *s) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *q = (const unsigned char *)s, *run = q;
  jw_raw(w, "\"", 1);
  for (;; q++) {
    unsigned char c = *q;
    char esc[6];
    size_t en = 2;
    if (c >= 0x20 && c != '"' && c != '\\')
      continue;
    jw_raw(w, (const char *)run, (size_t)(q - run));
    if (c == '\0')
      break;
    esc[0] = '\\';
    switch (c) {
    case '"':
      esc[1] = '"';
      break;
    case '\\':
      esc[1] = '\\';
      break;
    case '\n':
      esc[1] = 'n';
      break;
    case '\r':
      esc[1] = 'r';
      break;
    case '\t':
      esc[1] = 't';
      break;
    case '\b':
      esc[1] = 'b';
      break;
    case '\f':
      esc[1] = 'f';
      break;
    default:
      memcpy(esc + 1, "u00", 3);
      esc[4] = hex[c >> 4];
      esc[5] = hex[c & 15];
      en = 6;
    }
    jw_raw(w, esc, en);
    run = q + 1;
  }
  jw_raw(w, "\"", 1);
}

static void jw_u64(jw_t *w, uint64_t v) {
  char b[24];
  int n = snprintf(b, sizeof b, "%llu", (unsigned long long)v);
  jw_raw(w, b, (size_t)n);
}

/*
 * The shortest of %.15g, %.16g, %.17g that reads back as the same double
 * (17 significant digits always do): 0.1 is written "0.1", not
 * "0.10000000000000001". Callers pass finite values only. Assumes the C
 * locale's decimal point, as the whole host does.
 */
static void jw_double(jw_t *w, double v) {
  char b[40];
  int n = 0;
  for (int prec = 15; prec <= 17; prec++) {
    n = snprintf(b, sizeof b, "%.*g", prec, v);
    if (strtod(b, NULL) == v)
      break;
  }
  jw_raw(w, b, (size_t)n);
}

/* ---- encoding ---- */

static void enc_metadata(jw_t *w, const om_instance_t *in) {
  jw_raw(w, "{", 1);
  for (size_t i = 0; i < in->n_metadata; i++) {
    if (i > 0)
      jw_raw(w, ",", 1);
    jw_str(w, in->metadata[i].key);
    jw_raw(w, ":", 1);
    jw_str(w, in->metadata[i].value);
  }
  jw_raw(w, "}", 1);
}

static void enc_instance(jw_t *w, const om_instance_t *in) {
  jw_lit(w, "{\"id\":");
  jw_str(w, in->id);
  jw_lit(w, ",\"url\":");
  jw_str(w, in->url);
  jw_lit(w, ",\"weight\":");
  jw_double(w, in->weight);
  if (in->zone != NULL) {
    jw_lit(w, ",\"zone\":");
    jw_str(w, in->zone);
  }
  jw_lit(w, ",\"ttl_ms\":");
  jw_u64(w, in->ttl_ms);
  jw_lit(w, ",\"metadata\":");
  enc_metadata(w, in);
  jw_raw(w, "}", 1);
}

/* A size hint so the common snapshot is written without regrowing. */
static size_t estimate(const om_snapshot_t *s, size_t from, size_t to) {
  size_t n = 128 + strlen(om_snapshot_service(s));
  for (size_t i = from; i < to; i++) {
    const om_instance_t *in = om_snapshot_instance(s, i);
    n += 96 + strlen(in->id) + strlen(in->url);
    if (in->zone != NULL)
      n += 10 + strlen(in->zone);
    for (size_t k = 0; k < in->n_metadata; k++)
      n += 6 + strlen(in->metadata[k].key) + strlen(in->metadata[k].value);
  }
  return n;
}

/* A snapshot document up to the opening of its instance array. */
static void enc_head(jw_t *w, const om_snapshot_t *s, unsigned flags) {
  jw_lit(w, "{\"service\":");
  jw_str(w, om_snapshot_service(s));
  jw_lit(w, ",\"revision\":");
  jw_u64(w, om_snapshot_revision(s));
  if (flags & OM_SNAPSHOT_JSON_WARMING)
    jw_lit(w, ",\"warming\":true");
  jw_lit(w, ",\"instances\":[");
}

/* The document for instances [from, to); page: with next_page_token. */
static void enc_snapshot(jw_t *w, const om_snapshot_t *s, unsigned flags,
                         size_t from, size_t to, int page,
                         const char *next_token) {
  jw_reserve(w, estimate(s, from, to));
  enc_head(w, s, flags);
  for (size_t i = from; i < to; i++) {
    if (i > from)
      jw_raw(w, ",", 1);
    enc_instance(w, om_snapshot_instance(s, i));
  }
  jw_raw(w, "]", 1);
  if (page) {
    jw_lit(w, ",\"next_page_token\":");
    if (next_token != NULL)
      jw_str(w, next_token);
    else
      jw_lit(w, "null");
  }
  jw_raw(w, "}", 1);
}

/* What a cache slot holds: the bytes and their length, one allocation. */
typedef struct blob_s {
  size_t len;
  char data[]; /* NUL-terminated */
} blob_t;

/* Start w after room for a blob header (hint: the bytes expected), so
 * that the buffer becomes the blob. */
static void blob_begin(jw_t *w, size_t hint) {
  jw_reserve(w, sizeof(blob_t) + hint);
  w->len = w->oom ? 0 : sizeof(blob_t);
}

/* The blob w wrote, NUL-terminated, or NULL (freed) when out of memory. */
static blob_t *blob_end(jw_t *w) {
  blob_t *b;
  jw_raw(w, "", 1);
  if (w->oom) {
    free(w->p);
    return NULL;
  }
  b = (blob_t *)(void *)w->p;
  b->len = w->len - sizeof(blob_t) - 1;
  return b;
}

/*
 * Chunk k's instances, comma-separated, cached on the chunk: every
 * revision that shares the chunk shares the bytes, so encoding a snapshot
 * after one change encodes the chunk that changed and copies the rest.
 * NULL when out of memory.
 */
static const blob_t *chunk_fragment(om_snapshot_t *s, size_t k) {
  blob_t *b = om_snapshot_chunk_cache(s, k);
  jw_t w = {0};
  size_t from, to;
  if (b != NULL)
    return b;
  if (om_snapshot_chunk_range(s, k, &from, &to) != 0)
    return NULL;
  blob_begin(&w, estimate(s, from, to));
  for (size_t i = from; i < to; i++) {
    if (i > from)
      jw_raw(&w, ",", 1);
    enc_instance(&w, om_snapshot_instance(s, i));
  }
  if ((b = blob_end(&w)) == NULL)
    return NULL;
  if (om_snapshot_set_chunk_cache(s, k, b, free) != 0) {
    free(b);
    return NULL; /* cannot happen: the slot was empty */
  }
  return b;
}

/* The whole snapshot document, as enc_snapshot writes it, from the
 * chunks' cached fragments (the fragments' own bytes on w->oom). */
static void enc_whole(jw_t *w, om_snapshot_t *s, unsigned flags) {
  size_t nc = om_snapshot_chunk_count(s), total = 128;
  const blob_t *f;
  for (size_t k = 0; k < nc; k++) {
    if ((f = chunk_fragment(s, k)) == NULL) {
      w->oom = 1;
      return;
    }
    total += f->len + 1;
  }
  jw_reserve(w, total + strlen(om_snapshot_service(s)));
  enc_head(w, s, flags);
  for (size_t k = 0; k < nc; k++) {
    f = om_snapshot_chunk_cache(s, k);
    if (k > 0)
      jw_raw(w, ",", 1);
    jw_raw(w, f->data, f->len);
  }
  jw_lit(w, "]}");
}

/* Hand the buffer over NUL-terminated, or fail cleanly. */
static int jw_finish(jw_t *w, char **out, size_t *len) {
  jw_raw(w, "", 1);
  if (w->oom) {
    free(w->p);
    return OM_ENOMEM;
  }
  *out = w->p;
  *len = w->len - 1;
  return 0;
}

int om_snapshot_to_json(const om_snapshot_t *s, char **out, size_t *len) {
  jw_t w = {0};
  if (s == NULL || out == NULL || len == NULL)
    return OM_EINVAL;
  enc_snapshot(&w, s, 0, 0, om_snapshot_count(s), 0, NULL);
  return jw_finish(&w, out, len);
}

int om_instance_to_json(const om_instance_t *in, char **out, size_t *len) {
  jw_t w = {0};
  if (in == NULL || in->url == NULL || out == NULL || len == NULL ||
      (in->metadata == NULL && in->n_metadata != 0))
    return OM_EINVAL;
  jw_lit(&w, "{\"url\":");
  jw_str(&w, in->url);
  jw_lit(&w, ",\"ttl_ms\":");
  jw_u64(&w, in->ttl_ms);
  jw_lit(&w, ",\"weight\":");
  jw_double(&w, in->weight);
  if (in->zone != NULL) {
    jw_lit(&w, ",\"zone\":");
    jw_str(&w, in->zone);
  }
  jw_lit(&w, ",\"metadata\":");
  enc_metadata(&w, in);
  jw_raw(&w, "}", 1);
  return jw_finish(&w, out, len);
}

/* ---- cached encodings ---- */

/* The cache slots of one encoding: the plain one, or the warming one. */
static int slot_json(unsigned flags) {
  return flags & OM_SNAPSHOT_JSON_WARMING ? OM_SNAPSHOT_SLOT_JSON_WARMING
                                          : OM_SNAPSHOT_SLOT_JSON;
}

static int slot_sse(unsigned flags) {
  return flags & OM_SNAPSHOT_JSON_WARMING ? OM_SNAPSHOT_SLOT_SSE_WARMING
                                          : OM_SNAPSHOT_SLOT_SSE;
}

int om_snapshot_json_cached_flags(om_snapshot_t *s, unsigned flags,
                                  const char **data, size_t *len) {
  blob_t *b;
  jw_t w = {0};
  if (s == NULL || data == NULL || len == NULL ||
      (flags & ~OM_SNAPSHOT_JSON_WARMING) != 0)
    return OM_EINVAL;
  b = om_snapshot_cache(s, slot_json(flags));
  if (b == NULL) {
    blob_begin(&w, 0);
    enc_whole(&w, s, flags);
    if ((b = blob_end(&w)) == NULL)
      return OM_ENOMEM;
    if (om_snapshot_set_cache(s, slot_json(flags), b, free) != 0) {
      free(b);
      return OM_ESTATE; /* cannot happen: the slot was empty */
    }
  }
  *data = b->data;
  *len = b->len;
  return 0;
}

int om_snapshot_json_cached(om_snapshot_t *s, const char **data, size_t *len) {
  return om_snapshot_json_cached_flags(s, 0, data, len);
}

/*
 * The event is written directly, not through om_sse_encode: the document
 * is one line (jw_str escapes every control character, so it holds no CR
 * or LF) of valid UTF-8 (every string was validated), so the event is
 * exactly what om_sse_encode would make of it ("event", "id", one "data"
 * line, a blank line), without a second copy and scan of a megabyte.
 */
int om_snapshot_sse_cached_flags(om_snapshot_t *s, unsigned flags,
                                 const char **data, size_t *len) {
  blob_t *b;
  jw_t w = {0};
  if (s == NULL || data == NULL || len == NULL ||
      (flags & ~OM_SNAPSHOT_JSON_WARMING) != 0)
    return OM_EINVAL;
  b = om_snapshot_cache(s, slot_sse(flags));
  if (b == NULL) {
    blob_begin(&w, 0);
    jw_lit(&w, "event: snapshot\nid: ");
    jw_u64(&w, om_snapshot_revision(s));
    jw_lit(&w, "\ndata: ");
    enc_whole(&w, s, flags);
    jw_lit(&w, "\n\n");
    if ((b = blob_end(&w)) == NULL)
      return OM_ENOMEM;
    if (om_snapshot_set_cache(s, slot_sse(flags), b, free) != 0) {
      free(b);
      return OM_ESTATE;
    }
  }
  *data = b->data;
  *len = b->len;
  return 0;
}

/* Compress in[0..n) (pieces, in order) into a new blob; NULL on failure. */
static blob_t *gzip_blob(const char *const *in, const size_t *n, int pieces) {
  z_stream z;
  size_t total = 0, bound;
  blob_t *b;
  int rc = Z_OK;
  memset(&z, 0, sizeof z);
  for (int i = 0; i < pieces; i++)
    total += n[i];
  /* windowBits 15 + 16: a gzip wrapper instead of zlib's */
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    return NULL;
  bound = deflateBound(&z, (uLong)total);
  b = malloc(sizeof *b + bound + 1);
  if (b == NULL) {
    deflateEnd(&z);
    return NULL;
  }
  z.next_out = (Bytef *)b->data;
  z.avail_out = (uInt)bound;
  for (int i = 0; i < pieces && (rc == Z_OK || rc == Z_STREAM_END); i++) {
    z.next_in = (Bytef *)(uintptr_t)in[i];
    z.avail_in = (uInt)n[i];
    rc = deflate(&z, i == pieces - 1 ? Z_FINISH : Z_NO_FLUSH);
  }
  b->len = bound - z.avail_out;
  deflateEnd(&z);
  if (rc != Z_STREAM_END) {
    free(b);
    return NULL;
  }
  b->data[b->len] = '\0';
  return b;
}

int om_snapshot_get_gzip_cached_flags(om_snapshot_t *s, unsigned flags,
                                      const char **data, size_t *len) {
  static const char tail[] = ",\"next_page_token\":null}";
  int slot = flags & OM_SNAPSHOT_JSON_WARMING ? OM_SNAPSHOT_SLOT_GZIP_WARMING
                                              : OM_SNAPSHOT_SLOT_GZIP;
  blob_t *b;
  if (s == NULL || data == NULL || len == NULL ||
      (flags & ~OM_SNAPSHOT_JSON_WARMING) != 0)
    return OM_EINVAL;
  b = om_snapshot_cache(s, slot);
  if (b == NULL) {
    const char *json, *in[2];
    size_t jl, n[2];
    int rc = om_snapshot_json_cached_flags(s, flags, &json, &jl);
    if (rc != 0)
      return rc;
    in[0] = json, n[0] = jl - 1; /* without its closing brace */
    in[1] = tail, n[1] = sizeof tail - 1;
    if ((b = gzip_blob(in, n, 2)) == NULL)
      return OM_ENOMEM;
    if (om_snapshot_set_cache(s, slot, b, free) != 0) {
      free(b);
      return OM_ESTATE;
    }
  }
  *data = b->data;
  *len = b->len;
  return 0;
}

int om_snapshot_sse_cached(om_snapshot_t *s, const char **data, size_t *len) {
  return om_snapshot_sse_cached_flags(s, 0, data, len);
}

/* ---- page tokens ---- */

#define TOKEN_SEED UINT64_C(0x6f6d2d7061676531) /* "om-page1" */

static const char b64url[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static void put_be64(unsigned char *p, uint64_t v) {
  for (int i = 7; i >= 0; i--) {
    p[i] = (unsigned char)(v & 0xff);
    v >>= 8;
  }
}

static uint64_t get_be64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = (v << 8) | p[i];
  return v;
}

void om_page_token_encode(uint64_t revision, uint64_t offset,
                          char out[OM_PAGE_TOKEN_LEN + 1]) {
  unsigned char raw[24];
  put_be64(raw, revision);
  put_be64(raw + 8, offset);
  put_be64(raw + 16, XXH3_64bits_withSeed(raw, 16, TOKEN_SEED));
  /* RFC 4648 section 5: 24 bytes are 8 groups of 3, 4 characters each. */
  for (int g = 0; g < 8; g++) {
    uint32_t v = (uint32_t)raw[3 * g] << 16 | (uint32_t)raw[3 * g + 1] << 8 |
                 raw[3 * g + 2];
    for (int k = 0; k < 4; k++)
      out[4 * g + k] = b64url[(v >> (18 - 6 * k)) & 63];
  }
  out[OM_PAGE_TOKEN_LEN] = '\0';
}

static int b64url_value(char c) {
  const char *p = c != '\0' ? strchr(b64url, c) : NULL;
  return p != NULL ? (int)(p - b64url) : -1;
}

int om_page_token_decode(const char *token, size_t len, uint64_t *revision,
                         uint64_t *offset) {
  unsigned char raw[24];
  if (token == NULL || len != OM_PAGE_TOKEN_LEN)
    return OM_EPARSE;
  for (int g = 0; g < 8; g++) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
      int x = b64url_value(token[4 * g + k]);
      if (x < 0)
        return OM_EPARSE;
      v = v << 6 | (uint32_t)x;
    }
    raw[3 * g] = (unsigned char)(v >> 16);
    raw[3 * g + 1] = (unsigned char)(v >> 8);
    raw[3 * g + 2] = (unsigned char)v;
  }
  if (get_be64(raw + 16) != XXH3_64bits_withSeed(raw, 16, TOKEN_SEED))
    return OM_EPARSE;
  if (revision != NULL)
    *revision = get_be64(raw);
  if (offset != NULL)
    *offset = get_be64(raw + 8);
  return 0;
}

/* ---- errors ---- */

static int err_set(om_json_error_t *err, int code, const char *field,
                   const char *fmt, ...) {
  va_list ap;
  if (err == NULL)
    return code;
  snprintf(err->field, sizeof err->field, "%s", field != NULL ? field : "");
  va_start(ap, fmt);
  vsnprintf(err->why, sizeof err->why, fmt, ap);
  va_end(ap);
  if (err->field[0] != '\0')
    snprintf(err->text, sizeof err->text, "field '%s': %s", err->field,
             err->why);
  else
    snprintf(err->text, sizeof err->text, "%s", err->why);
  return code;
}

int om_snapshot_page_json(const om_snapshot_t *s, const char *token,
                          size_t token_len, size_t limit, char **out,
                          size_t *len, om_json_error_t *err) {
  return om_snapshot_page_json_flags(s, 0, token, token_len, limit, out, len,
                                     err);
}

int om_snapshot_page_json_flags(const om_snapshot_t *s, unsigned flags,
                                const char *token, size_t token_len,
                                size_t limit, char **out, size_t *len,
                                om_json_error_t *err) {
  uint64_t rev = 0, off = 0;
  size_t n, end;
  char next[OM_PAGE_TOKEN_LEN + 1];
  jw_t w = {0};
  if (s == NULL || out == NULL || len == NULL)
    return err_set(err, OM_EINVAL, "", "no snapshot or output");
  if (limit == 0)
    return err_set(err, OM_EINVAL, "page_size", "must be at least 1");
  if ((flags & ~OM_SNAPSHOT_JSON_WARMING) != 0)
    return err_set(err, OM_EINVAL, "", "unknown flags");
  n = om_snapshot_count(s);
  if (token != NULL) {
    if (om_page_token_decode(token, token_len, &rev, &off) != 0)
      return err_set(err, OM_EPARSE, "page_token",
                     "is malformed or was not issued by this service");
    if (rev != om_snapshot_revision(s))
      return err_set(err, OM_ESTATE, "page_token",
                     "was issued at revision %llu; the service is now at "
                     "revision %llu (revision_changed): restart from the "
                     "first page",
                     (unsigned long long)rev,
                     (unsigned long long)om_snapshot_revision(s));
    if (off > n)
      return err_set(err, OM_ERANGE, "page_token",
                     "points past the last instance");
  }
  end = (size_t)off + (limit < n - (size_t)off ? limit : n - (size_t)off);
  if (end < n)
    om_page_token_encode(om_snapshot_revision(s), end, next);
  enc_snapshot(&w, s, flags, (size_t)off, end, 1, end < n ? next : NULL);
  if (jw_finish(&w, out, len) != 0)
    return err_set(err, OM_ENOMEM, "", "out of memory");
  return 0;
}

/* ---- decoding ---- */

static int load_error(om_json_error_t *err, const json_error_t *je) {
  /* jansson 2.14 returns an untouched error (empty text) when it cannot
   * allocate its lexer buffer, and json_error_out_of_memory elsewhere. */
  if (json_error_code(je) == json_error_out_of_memory || je->text[0] == '\0')
    return err_set(err, OM_ENOMEM, "", "out of memory");
  return err_set(err, OM_EPARSE, "", "invalid JSON at line %d, column %d: %s",
                 je->line, je->column, je->text);
}

/*
 * A metadata key as a path segment: ".env" for a short plain key, nothing
 * for anything that would make the path ambiguous or unreadable.
 */
static void key_suffix(char *out, size_t cap, const char *key) {
  size_t n = strlen(key);
  int plain = n >= 1 && n <= 40;
  for (size_t i = 0; plain && i < n; i++)
    plain = om_valid_name(key + i, 1);
  snprintf(out, cap, "%s%s", plain ? "." : "", plain ? key : "");
}

/* An object key as the name of an unknown field: printable, bounded. */
static void printable_key(char *out, size_t cap, const char *key) {
  size_t i = 0;
  for (; key[i] != '\0' && i + 1 < cap && i < 48; i++) {
    unsigned char c = (unsigned char)key[i];
    out[i] = c >= 0x20 && c < 0x7f && c != '\'' ? (char)c : '?';
  }
  out[i] = '\0';
}

/*
 * The fields of one instance object, borrowed from the JSON tree into *in
 * (metadata into kv, which has room for json_object_size entries).
 * registration: strict (unknown fields, optional ttl/weight rules);
 * else the snapshot reading (unknown fields ignored, all required).
 * prefix is the path of the object ("instances[3]" or "").
 */
static int read_instance(json_t *obj, int registration, const char *prefix,
                         const char *path_id, om_instance_t *in, om_kv_t *kv,
                         om_json_error_t *err) {
  char f[96], seg[48];
  const char *dot = prefix[0] != '\0' ? "." : "";
  const char *key;
  json_t *v;
  memset(in, 0, sizeof *in);
  in->weight = 1.0;
  if (!json_is_object(obj))
    return err_set(err, OM_EINVAL, prefix, "must be an object");
  json_object_foreach(obj, key, v) {
    if (strcmp(key, "url") == 0) {
      if (!json_is_string(v))
        goto not_string;
      in->url = (char *)json_string_value(v);
    } else if (strcmp(key, "id") == 0) {
      if (!json_is_string(v))
        goto not_string;
      in->id = (char *)json_string_value(v);
      if (registration && strcmp(in->id, path_id) != 0)
        return err_set(err, OM_EINVAL, "id",
                       "does not match the id in the request path");
    } else if (strcmp(key, "ttl_ms") == 0) {
      json_int_t t;
      if (!json_is_integer(v)) {
        snprintf(f, sizeof f, "%s%sttl_ms", prefix, dot);
        return err_set(err, OM_EINVAL, f, "must be an integer (milliseconds)");
      }
      t = json_integer_value(v);
      in->ttl_ms = t < 0 ? 0 : (uint64_t)t;
    } else if (strcmp(key, "weight") == 0) {
      if (!json_is_number(v)) {
        snprintf(f, sizeof f, "%s%sweight", prefix, dot);
        return err_set(err, OM_EINVAL, f, "must be a number");
      }
      in->weight = json_number_value(v);
    } else if (strcmp(key, "zone") == 0) {
      if (json_is_null(v))
        in->zone = NULL;
      else if (json_is_string(v))
        in->zone = (char *)json_string_value(v);
      else {
        snprintf(f, sizeof f, "%s%szone", prefix, dot);
        return err_set(err, OM_EINVAL, f, "must be a string or null");
      }
    } else if (strcmp(key, "metadata") == 0) {
      const char *mk;
      json_t *mv;
      if (json_is_null(v))
        continue;
      if (!json_is_object(v)) {
        snprintf(f, sizeof f, "%s%smetadata", prefix, dot);
        return err_set(err, OM_EINVAL, f,
                       "must be an object (a flat map of strings)");
      }
      if (json_object_size(v) > OM_META_MAX_ENTRIES) {
        snprintf(f, sizeof f, "%s%smetadata", prefix, dot);
        return err_set(err, OM_EINVAL, f, "has more than 64 entries");
      }
      in->metadata = kv;
      json_object_foreach(v, mk, mv) {
        if (!json_is_string(mv)) {
          key_suffix(seg, sizeof seg, mk);
          snprintf(f, sizeof f, "%s%smetadata%s", prefix, dot, seg);
          return err_set(err, OM_EINVAL, f,
                         "must be a string (metadata is a flat map of "
                         "strings)");
        }
        kv[in->n_metadata].key = (char *)mk;
        kv[in->n_metadata].value = (char *)json_string_value(mv);
        in->n_metadata++;
      }
    } else if (registration) {
      printable_key(seg, sizeof seg, key);
      return err_set(err, OM_EINVAL, seg,
                     "unknown field (expected url, ttl_ms, weight, zone, "
                     "metadata)");
    }
  }
  if (registration && in->id == NULL)
    in->id = (char *)path_id;
  {
    static const char *required_snap[] = {"id", "url", "ttl_ms", "weight"};
    static const char *required_reg[] = {"url", "ttl_ms"};
    const char *const *req = registration ? required_reg : required_snap;
    size_t nreq = registration ? 2 : 4;
    for (size_t i = 0; i < nreq; i++)
      if (json_object_get(obj, req[i]) == NULL) {
        snprintf(f, sizeof f, "%s%s%s", prefix, dot, req[i]);
        return err_set(err, OM_EINVAL, f, "is required");
      }
  }
  return 0;
not_string:
  snprintf(f, sizeof f, "%s%s%s", prefix, dot, key);
  return err_set(err, OM_EINVAL, f, "must be a string");
}

int om_snapshot_from_json(const char *buf, size_t len, om_snapshot_t **out,
                          om_json_error_t *err) {
  return om_snapshot_from_json_flags(buf, len, out, NULL, err);
}

int om_snapshot_from_json_flags(const char *buf, size_t len,
                                om_snapshot_t **out, unsigned *flags,
                                om_json_error_t *err) {
  json_error_t je;
  json_t *root, *jservice, *jrev, *jinst, *jwarm;
  unsigned fl = 0;
  om_instance_t *ins = NULL;
  om_kv_t *kv = NULL;
  size_t n, nkv = 0, used = 0, idx = 0;
  const char *field = NULL, *why = NULL;
  char path[96];
  json_int_t rev;
  int rc = 0;
  if (buf == NULL || out == NULL)
    return err_set(err, OM_EINVAL, "", "no document");
  root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  if (root == NULL)
    return load_error(err, &je);
  if (!json_is_object(root)) {
    rc = err_set(err, OM_EPARSE, "", "the document must be a JSON object");
    goto done;
  }
  jservice = json_object_get(root, "service");
  jrev = json_object_get(root, "revision");
  jinst = json_object_get(root, "instances");
  if (!json_is_string(jservice)) {
    rc = err_set(err, OM_EINVAL, "service",
                 jservice == NULL ? "is required" : "must be a string");
    goto done;
  }
  if (!om_valid_name(json_string_value(jservice),
                     json_string_length(jservice))) {
    rc = err_set(err, OM_EINVAL, "service",
                 "must be 1 to 128 characters of [A-Za-z0-9._-], not \".\" "
                 "or \"..\"");
    goto done;
  }
  if (!json_is_integer(jrev) || (rev = json_integer_value(jrev)) < 1) {
    rc = err_set(err, OM_EINVAL, "revision",
                 jrev == NULL ? "is required" : "must be an integer >= 1");
    goto done;
  }
  if (!json_is_array(jinst)) {
    rc = err_set(err, OM_EINVAL, "instances",
                 jinst == NULL ? "is required" : "must be an array");
    goto done;
  }
  jwarm = json_object_get(root, "warming");
  if (jwarm != NULL && !json_is_boolean(jwarm)) {
    rc = err_set(err, OM_EINVAL, "warming", "must be true or false");
    goto done;
  }
  if (json_is_true(jwarm))
    fl |= OM_SNAPSHOT_JSON_WARMING;
  n = json_array_size(jinst);
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_object_get(json_array_get(jinst, i), "metadata");
    if (json_is_object(m)) /* capped per instance in read_instance */
      nkv += json_object_size(m) < OM_META_MAX_ENTRIES + 1
                 ? json_object_size(m)
                 : OM_META_MAX_ENTRIES + 1;
  }
  if ((n != 0 && (ins = malloc(n * sizeof *ins)) == NULL) ||
      (nkv != 0 && (kv = malloc(nkv * sizeof *kv)) == NULL)) {
    rc = err_set(err, OM_ENOMEM, "", "out of memory");
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    snprintf(path, sizeof path, "instances[%zu]", i);
    rc = read_instance(json_array_get(jinst, i), 0, path, NULL, &ins[i],
                       kv + used, err);
    if (rc != 0)
      goto done;
    used += ins[i].n_metadata;
  }
  rc = om_snapshot_new(json_string_value(jservice), (uint64_t)rev, ins, n, out,
                       &idx, &field, &why);
  if (rc == 0 && flags != NULL)
    *flags = fl;
  if (rc == OM_EDUPLICATE) {
    snprintf(path, sizeof path, "instances[%zu].id", idx);
    rc = err_set(err, rc, path, "duplicate id \"%s\"", ins[idx].id);
  } else if (rc == OM_EINVAL) {
    snprintf(path, sizeof path, "instances[%zu].%s", idx, field);
    rc = err_set(err, rc, path, "%s", why);
  } else if (rc != 0)
    rc = err_set(err, rc, "", "out of memory");
done:
  free(ins);
  free(kv);
  json_decref(root);
  return rc;
}

int om_instance_from_json(const char *buf, size_t len, const char *id,
                          om_instance_t *out, om_json_error_t *err) {
  json_error_t je;
  json_t *root;
  om_instance_t in, copy;
  om_kv_t kv[OM_META_MAX_ENTRIES];
  const char *field = NULL, *why = NULL;
  int rc;
  if (buf == NULL || out == NULL || id == NULL)
    return err_set(err, OM_EINVAL, "", "no body");
  if (!om_valid_name(id, strlen(id)))
    return err_set(err, OM_EINVAL, "id",
                   "must be 1 to 128 characters of [A-Za-z0-9._-], not \".\" "
                   "or \"..\"");
  if (len > OM_INSTANCE_JSON_MAX)
    return err_set(err, OM_ETOOBIG, "", "the body is larger than %zu bytes",
                   (size_t)OM_INSTANCE_JSON_MAX);
  root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  if (root == NULL)
    return load_error(err, &je);
  if (!json_is_object(root)) {
    rc = err_set(err, OM_EPARSE, "", "the body must be a JSON object");
    goto done;
  }
  rc = read_instance(root, 1, "", id, &in, kv, err);
  if (rc != 0)
    goto done;
  if (om_instance_validate(&in, &field, &why) != 0) {
    rc = err_set(err, OM_EINVAL, field, "%s", why);
    goto done;
  }
  rc = om_instance_copy(&copy, &in);
  if (rc != 0) {
    rc = err_set(err, rc, "", "out of memory");
    goto done;
  }
  *out = copy;
done:
  json_decref(root);
  return rc;
}
