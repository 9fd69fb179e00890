/*
 * bench_sse.c: text/event-stream parsing throughput, against the floor of
 * any line-oriented parser: one memchr pass for '\n' over the same bytes.
 *
 * sse_parse_large: events of 1 MiB on the wire, made of 4 KiB `data:`
 *   lines (a big snapshot), fed in 64 KiB chunks as a socket delivers them.
 * sse_parse_small: 64-byte events ("data: <56 bytes>\n\n"), 64 KiB chunks.
 * memchr_scan: memchr for '\n' line by line over the large stream's bytes;
 * memchr_scan_small: the same over the small stream's bytes.
 * sse_parse_utf8: the large stream with multibyte text (2- and 3-byte
 *   sequences), for the non-ASCII validation path.
 * Figures are MB/s (10^6 bytes of input per second), median of 11 rounds
 * after a warm-up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_bench.h"
#include "om_errno.h"
#include "om_sse.h"

#define STREAM_BYTES ((size_t)48 << 20)
#define CHUNK ((size_t)64 << 10)
#define ROUNDS 11

typedef struct {
  uint64_t events, bytes;
} sink_t;

static int on_event(void *ud, const om_sse_event_t *ev) {
  sink_t *s = ud;
  s->events++;
  s->bytes += ev->data_len + (unsigned char)ev->data[0];
  return 0;
}

/* Fill `line` bytes of printable text (ASCII, or UTF-8 when utf8). */
static void fill_text(char *dst, size_t n, int utf8, unsigned *seed) {
  size_t i = 0;
  while (i < n) {
    *seed = *seed * 1103515245u + 12345u;
    if (utf8 && n - i >= 3 && (*seed >> 16) % 4 == 0) {
      memcpy(dst + i, "\xe2\x82\xac", 3); /* U+20AC */
      i += 3;
    } else if (utf8 && n - i >= 2 && (*seed >> 16) % 4 == 1) {
      memcpy(dst + i, "\xc3\xa9", 2); /* U+00E9 */
      i += 2;
    } else {
      dst[i++] = (char)(' ' + 1 + (*seed >> 16) % 94);
    }
  }
}

/* Events of ev_bytes on the wire, made of data lines of line_bytes. */
static char *make_stream(size_t total, size_t ev_bytes, size_t line_bytes,
                         int utf8, size_t *len_out) {
  char *s = malloc(total);
  size_t len = 0;
  unsigned seed = 42;
  if (s == NULL)
    return NULL;
  while (len + ev_bytes <= total) {
    size_t ev_end = len + ev_bytes - 1; /* the blank line's LF */
    while (len < ev_end) {
      size_t payload = line_bytes - 7; /* "data: " + LF */
      if (ev_end - len < line_bytes + 7)
        payload = ev_end - len - 7; /* last line fills the event */
      memcpy(s + len, "data: ", 6);
      fill_text(s + len + 6, payload, utf8, &seed);
      s[len + 6 + payload] = '\n';
      len += payload + 7;
    }
    s[len++] = '\n';
  }
  *len_out = len;
  return s;
}

static double parse_mbs(const char *s, size_t len, size_t max_event_bytes,
                        uint64_t *events) {
  om_sse_parser_opts_t opts = {max_event_bytes};
  om_sse_parser_t *p;
  sink_t sink = {0, 0};
  uint64_t t0, t1;
  size_t off;
  if (om_sse_parser_new(&opts, &p) != 0)
    exit(1);
  t0 = om_bench_now_ns();
  for (off = 0; off < len; off += CHUNK) {
    size_t n = len - off < CHUNK ? len - off : CHUNK;
    int rc = om_sse_parser_feed(p, s + off, n, on_event, &sink);
    if (rc != 0) {
      fprintf(stderr, "feed: %s\n", om_strerror(rc));
      exit(1);
    }
  }
  t1 = om_bench_now_ns();
  OM_BENCH_SINK(sink.bytes);
  *events = sink.events;
  om_sse_parser_free(p);
  return (double)len / ((double)(t1 - t0) / 1e9) / 1e6;
}

static double memchr_mbs(const char *s, size_t len) {
  uint64_t t0 = om_bench_now_ns(), t1, lines = 0;
  const char *q = s, *end = s + len;
  while ((q = memchr(q, '\n', (size_t)(end - q))) != NULL) {
    lines++;
    q++;
  }
  t1 = om_bench_now_ns();
  OM_BENCH_SINK(lines);
  return (double)len / ((double)(t1 - t0) / 1e9) / 1e6;
}

static void bench_parse(const char *name, const char *s, size_t len,
                        size_t max_event_bytes, uint64_t want_events) {
  double v[ROUNDS];
  uint64_t events = 0;
  int i;
  parse_mbs(s, len, max_event_bytes, &events); /* warm-up */
  if (events != want_events) {
    fprintf(stderr, "%s: %llu events, want %llu\n", name,
            (unsigned long long)events, (unsigned long long)want_events);
    exit(1);
  }
  for (i = 0; i < ROUNDS; i++)
    v[i] = parse_mbs(s, len, max_event_bytes, &events);
  om_bench_report(name, om_bench_median(v, ROUNDS), "MB/s");
}

static void bench_memchr(const char *name, const char *s, size_t len) {
  double v[ROUNDS];
  int i;
  memchr_mbs(s, len);
  for (i = 0; i < ROUNDS; i++)
    v[i] = memchr_mbs(s, len);
  om_bench_report(name, om_bench_median(v, ROUNDS), "MB/s");
}

int main(void) {
  const size_t mib = (size_t)1 << 20;
  size_t large_len, small_len, utf8_len;
  char *large = make_stream(STREAM_BYTES, mib, 4096, 0, &large_len);
  char *small = make_stream(STREAM_BYTES / 2, 64, 64, 0, &small_len);
  char *utf8 = make_stream(STREAM_BYTES / 2, mib, 4096, 1, &utf8_len);
  if (large == NULL || small == NULL || utf8 == NULL)
    return 1;
  /* A 1 MiB event holds a bit less than 1 MiB of data: the default cap. */
  bench_parse("sse_parse_large", large, large_len, 0, large_len / mib);
  bench_memchr("memchr_scan", large, large_len);
  bench_parse("sse_parse_small", small, small_len, 0, small_len / 64);
  bench_memchr("memchr_scan_small", small, small_len);
  bench_parse("sse_parse_utf8", utf8, utf8_len, 0, utf8_len / mib);
  free(large);
  free(small);
  free(utf8);
  return 0;
}
