/*
 * om_sse.h: Server-Sent Events, the `text/event-stream` format.
 *
 * The parser follows the WHATWG HTML Living Standard, section 9.2.5
 * "Parsing an event stream" and section 9.2.6 "Interpreting an event
 * stream", to the letter: UTF-8 decoding with U+FFFD replacement exactly as
 * the WHATWG Encoding Standard's UTF-8 decoder (section 4.1.1 "UTF-8
 * decoder"), one leading BOM stripped, CR / LF / CRLF line ends, comments,
 * fields with and without a colon, one leading space of a value removed,
 * `data` lines joined with LF, `event`, `id` (ignored when it contains
 * U+0000), `retry` (ASCII digits only), unknown fields ignored, and the
 * dispatch steps of 9.2.6 in their order (the last event ID string is set
 * before the empty-data check). It is incremental: any split of the input
 * into chunks gives the same events, in time linear in the input.
 *
 * The writer produces blocks that this parser (and a browser's EventSource)
 * reads back as exactly the event that was encoded.
 *
 * Why here: the control plane's watch streams (`/v1/watch/...`) and model
 * providers' streaming completions both speak SSE; one exact, bounded
 * implementation serves the host's clients and servers and the Lua face.
 */
#ifndef OM_SSE_H
#define OM_SSE_H

#include <stddef.h>
#include <stdint.h>

/* Per-event buffering bound used when the options leave it 0: 1 MiB. */
#define OM_SSE_DEFAULT_MAX_EVENT_BYTES ((size_t)1 << 20)
/* Largest accepted max_event_bytes (keeps buffer arithmetic overflow-free). */
#define OM_SSE_MAX_EVENT_BYTES_LIMIT (SIZE_MAX / 4)

typedef struct om_sse_parser_s om_sse_parser_t;

typedef struct om_sse_parser_opts_s {
  /*
   * Bound on the bytes buffered for one event: the decoded data buffer
   * (each `data` line's value plus its LF), the event type buffer and an
   * `id` value being read. 0 selects OM_SSE_DEFAULT_MAX_EVENT_BYTES.
   * Lines that are not buffered (comments, unknown fields, `retry`) are
   * skipped in constant memory whatever their length. Buffers keep their
   * capacity for the next event, so a parser holds at most about five
   * times this bound (data, type, id value, id buffer, id string).
   */
  size_t max_event_bytes;
} om_sse_parser_opts_t;

/*
 * One event. The parser hands out views (not NUL-owned by the caller, but
 * always NUL-terminated for convenience; data may contain NUL bytes, so use
 * the lengths). The writer reads the same struct.
 */
typedef struct om_sse_event_s {
  const char *type; /* parser: never NULL, "message" by default */
  size_t type_len;
  const char *data; /* parser: never NULL */
  size_t data_len;
  const char *id; /* parser: the last event ID string (9.2.6 step 1) */
  size_t id_len;
  /*
   * Writer: a `retry` line when >= 0. Parser: always -1; the reconnection
   * time belongs to the stream, not the event (om_sse_parser_retry_ms).
   */
  int64_t retry_ms;
} om_sse_event_t;

/*
 * Called once per dispatched event. The views in *ev are valid only during
 * the call. Return 0 to go on, nonzero to stop the parse (see
 * om_sse_parser_feed). The callback must not call feed, reset or free on
 * the parser that invoked it.
 */
typedef int (*om_sse_event_cb)(void *ud, const om_sse_event_t *ev);

/*
 * om_sse_parser_new: a parser at the start of a stream (a leading BOM will
 * be stripped), with empty buffers, no last event ID and no reconnection
 * time. opts may be NULL (all defaults).
 *
 * Returns 0 and sets *out (owned by the caller, release with
 * om_sse_parser_free), OM_EINVAL when out is NULL or max_event_bytes
 * exceeds OM_SSE_MAX_EVENT_BYTES_LIMIT, OM_ENOMEM when allocation fails.
 * On error *out is untouched and nothing is leaked.
 */
int om_sse_parser_new(const om_sse_parser_opts_t *opts, om_sse_parser_t **out);

/* om_sse_parser_free: release the parser and its buffers. NULL is a no-op. */
void om_sse_parser_free(om_sse_parser_t *p);

/*
 * om_sse_parser_feed: parse the next len bytes of the stream. Any split of
 * a stream into chunks (whole, byte by byte, anywhere, including inside a
 * CRLF, a BOM or a UTF-8 sequence) yields the same events. Work is linear
 * in len: nothing already buffered is scanned again. buf is not retained.
 *
 * cb is called for each event dispatched by a blank line in this chunk,
 * in order. It may be NULL: events are then dropped, while their effect on
 * the state (the last event ID string) still applies. Data at the end of a
 * chunk that is not yet terminated by a blank line stays buffered; there is no
 * "end of stream" call because per 9.2.6 an unterminated event is discarded.
 *
 * Returns 0 when the whole chunk was consumed, or:
 * - OM_EINVAL: p NULL, or buf NULL with len > 0 (nothing changed).
 * - OM_ESTATE: called from inside the callback (nothing changed).
 * - OM_ETOOBIG: an event needed more than max_event_bytes of buffering.
 * - OM_ENOMEM: a buffer could not grow.
 * - the callback's nonzero return value: the callback asked to stop.
 * After ETOOBIG, ENOMEM or a stop, the parser is FAILED: events before the
 * failure point were delivered, the rest of the chunk was not consumed,
 * and every later feed returns the same code (OM_ESTATE after a callback
 * stop) until om_sse_parser_reset(). The stream cannot be resumed
 * mid-event; the caller drops the connection and reconnects, sending
 * om_sse_parser_last_event_id() as Last-Event-ID.
 */
int om_sse_parser_feed(om_sse_parser_t *p, const char *buf, size_t len,
                       om_sse_event_cb cb, void *ud);

/*
 * om_sse_parser_reset: prepare for a new stream on the same event source
 * (a reconnect), also clearing a FAILED state. Per 9.2.6 the data, event
 * type and last event ID buffers belong to the stream and start empty, and
 * a new leading BOM is stripped; the last event ID string and the
 * reconnection time belong to the event source and are kept (so the
 * caller can send Last-Event-ID). Note what the standard implies: the new
 * stream's first blank line copies its (empty, unless an `id` field came)
 * last event ID buffer into the string. Buffers grown past a small size
 * are released. Never fails (OM_ESTATE, and nothing changed, when called
 * from the callback; OM_EINVAL for NULL).
 */
int om_sse_parser_reset(om_sse_parser_t *p);

/*
 * om_sse_parser_last_event_id: the last event ID string (9.2.6 dispatch
 * step 1), set at every blank line from the last event ID buffer, empty at
 * first. Returns a NUL-terminated view valid until the next feed, reset or
 * free; *len (if not NULL) gets its length.
 */
const char *om_sse_parser_last_event_id(const om_sse_parser_t *p, size_t *len);

/*
 * om_sse_parser_retry_ms: the reconnection time the stream has set with a
 * `retry` field, in milliseconds, or -1 if it never did. Values beyond
 * INT64_MAX saturate there (the spec sets no bound; a client clamps it to
 * its own ceiling anyway).
 */
int64_t om_sse_parser_retry_ms(const om_sse_parser_t *p);

/*
 * om_sse_encode: serialize one event block, ready to write to a
 * text/event-stream body:
 *   "event: T\n" (if type_len > 0), "id: I\n" (if id != NULL; an empty id
 *   is written as "id:\n", which resets the receiver's last event ID),
 *   "retry: N\n" (if retry_ms >= 0), one "data: L\n" per line L of data
 *   (if data != NULL; an empty line as "data:\n"), then "\n".
 * The receiver gets back type (or "message"), id and data exactly, with one
 * documented exception: SSE cannot carry a CR in data, so each CR, LF or
 * CRLF in data becomes a line break and is read back as LF.
 * "data: " always carries one space, so a value starting with a space
 * survives the receiver removing one.
 *
 * Rejected with OM_EINVAL (nothing written, *need untouched): ev NULL, a
 * NULL pointer with a nonzero length, a type containing CR or LF, an id
 * containing CR, LF or NUL (the receiver would ignore it), a type without
 * data (the receiver never dispatches an event without data), or any of
 * type, id, data that is not valid UTF-8 (the receiver would replace bytes
 * with U+FFFD). Emitting any of these would corrupt the stream instead.
 *
 * Otherwise sets *need (if not NULL) to the exact size of the block (no NUL
 * terminator is counted or written) and writes it to buf when cap >= need
 * (returns 0), or writes nothing and returns OM_ETOOBIG when it does not
 * fit (buf may be NULL when cap is 0: a sizing call).
 */
int om_sse_encode(const om_sse_event_t *ev, char *buf, size_t cap,
                  size_t *need);

/*
 * om_sse_encode_alloc: om_sse_encode into a new malloc'd, NUL-terminated
 * buffer. On success *out (owned by the caller, free()) and *len are set.
 * OM_EINVAL as om_sse_encode or when out is NULL, OM_ENOMEM when allocation
 * fails; on error *out and *len are untouched.
 */
int om_sse_encode_alloc(const om_sse_event_t *ev, char **out, size_t *len);

/*
 * om__sse_parser_work (internal, for tests): bytes the parser has scanned or
 * copied since it was created. A linear parser keeps this within a small
 * constant times the bytes fed, however the input was chunked.
 */
uint64_t om__sse_parser_work(const om_sse_parser_t *p);

#endif /* OM_SSE_H */
