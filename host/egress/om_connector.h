/*
 * om_connector.h: delivery of agent messages to a user channel (Layer B).
 *
 * A connector is the only way egress text reaches a person, and its deliver
 * function accepts an om_agent_message_t and nothing else: there is no
 * void* and no generic "payload" on this path, so an om_egress_error_t (or
 * anything else) handed to it is a compile error
 * (tests/compile_fail/deliver_error.c).
 *
 * Deliver renders the body into parts within the connector's limit
 * (om_message_split) and sends them in order, one at a time; deliveries on
 * one connector are queued FIFO, so the parts of two messages never
 * interleave. Each part is sent as one JSON object:
 *
 *   {"agent":"...","conversation":"...","run_id":"..."|null,
 *    "delivery":"<id>","part":1,"parts":3,"text":"..."}
 *
 * (part is 1-based; delivery identifies the message across retries).
 *
 * Kinds:
 *  - "webhook": POST each part to target (http:// or https://) with
 *    Content-Type: application/json and Idempotency-Key: <delivery>-<part>.
 *    2xx is success. Retries (at most max_retries per part, exponential
 *    backoff from retry_base_ms) are for the transport only: connection
 *    refused / reset / DNS / timeout and 502, 503, 504 (a gateway or the
 *    receiver saying the request was not processed). Any other status (4xx,
 *    500, 3xx) ends the delivery at once: it would fail the same way again,
 *    and retrying a processed request is how duplicates happen. The
 *    Idempotency-Key lets a receiver drop a duplicate that a timeout retry
 *    produced.
 *  - "file": append each part as one JSON line ("\n"-terminated) to target
 *    (created 0600 if missing; O_APPEND, so lines from several writers
 *    never interleave within a line; reopened when the path no longer
 *    names the open file, so rotation and deletion lose nothing; the
 *    writes run on the libuv threadpool). For local use and tests.
 *
 * A new channel is one file: a const om_connector_kind_t with three
 * functions (see "Implementing a kind" below), listed in om_connector.c.
 *
 * Threading: the API and every callback run on the loop thread (a kind may
 * do blocking work on the libuv threadpool, as "file" does).
 */
#ifndef OM_CONNECTOR_H
#define OM_CONNECTOR_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "om_message.h"

typedef struct om_connector_s om_connector_t;

#define OM_CONNECTOR_DEFAULT_TIMEOUT_MS 10000u
#define OM_CONNECTOR_DEFAULT_RETRY_BASE_MS 100u
#define OM_CONNECTOR_MAX_RETRIES 10
/* Deliveries queued on one connector before deliver refuses more. */
#define OM_CONNECTOR_MAX_QUEUE 4096

typedef struct om_connector_opts_s {
  const char *kind;       /* "webhook" | "file" */
  const char *target;     /* webhook URL (http://, https://) or file path */
  size_t part_limit;      /* max bytes of text per part; 0: the kind's default
                             (webhook 4000, file 65536) */
  int max_retries;        /* webhook: transport retries per part, 0..10
                             (0: none); ignored by file */
  uint64_t timeout_ms;    /* webhook: one POST; 0: 10 s */
  uint64_t retry_base_ms; /* webhook: first backoff, doubled per retry
                             (capped at 30x); 0: 100 ms */
} om_connector_opts_t;

/*
 * The end of one delivery: status 0 when every part was accepted, else
 * OM_EIO (a part refused, or transport retries exhausted), OM_EDEADLINE
 * (the last failure was a timeout), OM_ESTATE (cancelled by
 * om_connector_close). parts_sent counts the parts accepted before that:
 * on a failure the first parts_sent parts did reach the channel.
 */
typedef void (*om_connector_done_cb)(void *ud, int status, size_t parts_sent);

/*
 * om_connector_new: a connector of opts->kind on loop (which must outlive
 * it). Validates everything up front so that misconfiguration fails at
 * startup with a message naming the field in err ("target: ..."): an
 * unknown kind, a URL that is not http(s):// with a host, a file that
 * cannot be opened for appending, a part_limit below 64 (room for a
 * re-fenced code line) or above 1 MiB, max_retries out of range. Returns
 * 0 and *out; OM_EINVAL (bad opts, message in err), OM_EIO (the file
 * could not be opened, message in err), OM_ENOMEM. On error nothing is
 * allocated and nothing was added to the loop.
 */
int om_connector_new(uv_loop_t *loop, const om_connector_opts_t *opts,
                     om_connector_t **out, char *err, size_t errlen);

/*
 * om_connector_deliver: THE boundary. Queue msg for delivery: it is
 * rendered into parts now (the caller may free msg on return) and cb(ud,
 * status, parts_sent) runs exactly once, later, from the loop (never from
 * inside this call). Returns 0; OM_EINVAL (NULL argument, or an empty
 * body: there is nothing to deliver), OM_ESTATE
 * (closing), OM_EOVERLOAD (OM_CONNECTOR_MAX_QUEUE deliveries queued),
 * OM_ERANGE (a code point longer than the part limit; cannot happen with
 * the >= 64 limit), OM_ENOMEM. On error cb will not run and nothing was
 * sent.
 */
int om_connector_deliver(om_connector_t *c, const om_agent_message_t *msg,
                         om_connector_done_cb cb, void *ud);

/*
 * om_connector_close: cancel every queued or in-flight delivery (each cb
 * runs now, synchronously, with OM_ESTATE and the parts already sent) and
 * free the connector once its libuv handles closed (the loop must keep
 * running for that). NULL is accepted. Must not be called from inside a
 * done callback of the same connector more than once (c is gone after).
 */
void om_connector_close(om_connector_t *c);

/* Deliveries queued or in flight. */
size_t om_connector_pending(const om_connector_t *c);
/* The kind name ("webhook"). */
const char *om_connector_kind(const om_connector_t *c);
/* The effective part limit. */
size_t om_connector_part_limit(const om_connector_t *c);
/* Why the last failed delivery failed (for logs, never for users); ""
 * when none failed. Valid until the next call into c. */
const char *om_connector_last_error(const om_connector_t *c);

/* Counters for /metrics. */
typedef struct om_connector_stats_s {
  uint64_t delivered; /* deliveries whose every part was accepted */
  uint64_t failed;    /* deliveries that ended with an error (not close) */
  uint64_t parts;     /* parts accepted */
  uint64_t retries;   /* transport retries (webhook) */
} om_connector_stats_t;
void om_connector_stats(const om_connector_t *c, om_connector_stats_t *out);

/* ------------------------------------------------------------------ */
/* Implementing a kind                                                 */

/*
 * The outcome of sending one part. OM_CONNECTOR_RETRY means the transport
 * failed in a way worth another attempt (the shared code decides whether
 * retries remain and waits the backoff).
 */
typedef enum {
  OM_CONNECTOR_OK = 0,
  OM_CONNECTOR_RETRY = 1,
  OM_CONNECTOR_FAIL = 2,
  OM_CONNECTOR_TIMEOUT = 3 /* retryable; reported as OM_EDEADLINE at the end */
} om_connector_outcome_t;

typedef struct om_connector_kind_s {
  const char *name;
  size_t default_part_limit;
  /* Validate opts and build the kind's state (*state). Message in err
   * naming the field. Nothing left allocated on error. */
  int (*open)(om_connector_t *c, uv_loop_t *loop,
              const om_connector_opts_t *opts, void **state, char *err,
              size_t errlen);
  /* Start sending one part (a JSON object of len bytes, no newline; valid
   * until om__connector_sent is called). Must call om__connector_sent(c,
   * outcome, why) exactly once, later, from the loop; or return a negative
   * code now (treated as OM_CONNECTOR_FAIL, no om__connector_sent). */
  int (*send)(void *state, om_connector_t *c, const char *json, size_t len);
  /* Abort the part in flight, if any, without calling om__connector_sent,
   * and release state; call done(c) from the loop once every handle is
   * closed (the connector is freed then). */
  void (*close)(void *state, om_connector_t *c,
                void (*done)(om_connector_t *c));
} om_connector_kind_t;

/* The idempotency key of the part in flight ("<delivery>-<part>"): the
 * same across the retries of one part, different for every other part. */
const char *om__connector_part_key(const om_connector_t *c);

/* Report the end of the part in flight; why (may be NULL) is for logs. */
void om__connector_sent(om_connector_t *c, om_connector_outcome_t outcome,
                        const char *why);

extern const om_connector_kind_t om__connector_webhook;
extern const om_connector_kind_t om__connector_file;

#endif /* OM_CONNECTOR_H */
