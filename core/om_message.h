/*
 * om_message.h: the typed boundary of egress (Layer B, docs/EGRESS.md).
 *
 * An agent's reply and a failure to produce one are different types on
 * purpose. om_agent_message_t is the only thing a connector can deliver to a
 * user channel (host/egress/om_connector.h); om_egress_error_t carries the
 * internal cause, the attempts and the attribution to error tracking and can
 * never be handed to a connector: the deliver function takes a pointer to the
 * first type, so passing the second is a compile error, not a review comment
 * (tests/compile_fail/deliver_error.c proves it).
 *
 * Both are opaque, immutable after construction except for the explicit
 * adders, and own copies of every string they were given.
 *
 * om_message_split renders a body into parts that fit a channel's size limit.
 *
 * Pure C: no I/O, no clock, no globals.
 */
#ifndef OM_MESSAGE_H
#define OM_MESSAGE_H

#include <stddef.h>
#include <stdint.h>

typedef struct om_agent_message_s om_agent_message_t; /* deliverable */
typedef struct om_egress_error_s om_egress_error_t;   /* NEVER deliverable */

/* Longest agent / conversation / run id / route / class name accepted. */
#define OM_MESSAGE_MAX_ID 256
/* Largest body accepted (bytes). */
#define OM_MESSAGE_MAX_BODY ((size_t)1 << 24)

/* ------------------------------------------------------------------ */
/* Agent message                                                       */

/*
 * om_agent_message_new: a deliverable reply. agent and conversation are
 * required non-empty strings, run_id may be NULL (no run); each at most
 * OM_MESSAGE_MAX_ID bytes with no control characters (they end up in
 * headers, JSON and logs). body is canonical Markdown, len bytes, and must
 * be valid UTF-8 (RFC 3629 section 4: no overlongs, no surrogates, nothing
 * above U+10FFFF) of at most OM_MESSAGE_MAX_BODY bytes; it may be empty.
 * Everything is copied. Returns 0 and *out; OM_EINVAL (NULL or bad id),
 * OM_EPARSE (body not UTF-8), OM_ETOOBIG (body too large), OM_ENOMEM. On
 * error *out is untouched and nothing is allocated.
 */
int om_agent_message_new(const char *agent, const char *conversation,
                         const char *run_id, const char *body, size_t len,
                         om_agent_message_t **out);

/* om_agent_message_free: NULL is accepted. */
void om_agent_message_free(om_agent_message_t *m);

/* The body (NUL-terminated as a convenience; len, when not NULL, is the
 * byte length). Valid while m lives. */
const char *om_agent_message_body(const om_agent_message_t *m, size_t *len);
const char *om_agent_message_agent(const om_agent_message_t *m);
const char *om_agent_message_conversation(const om_agent_message_t *m);
/* NULL when the message belongs to no run. */
const char *om_agent_message_run(const om_agent_message_t *m);

/* ------------------------------------------------------------------ */
/* Egress error                                                        */

typedef enum {
  OM_EGRESS_TRANSPORT = 1, /* no usable answer: status, reset, timeout */
  OM_EGRESS_SEMANTIC = 2   /* an answer that is not a reply: empty, bad
                              tool-call JSON, refused by the gate */
} om_egress_error_class_t;

/* Most attempts one error records; later ones are counted, not stored. */
#define OM_EGRESS_MAX_ATTEMPTS 1024

/*
 * om_egress_error_new: an exhausted turn. cls is one of the enum values,
 * retryable is a boolean (any non-zero is 1), cause is the full internal
 * cause (required; copied; truncated to 4 KiB, never shown to a person).
 * Returns 0 and *out, OM_EINVAL, OM_ENOMEM; on error nothing allocated.
 */
int om_egress_error_new(om_egress_error_class_t cls, int retryable,
                        const char *cause, om_egress_error_t **out);

/*
 * om_egress_error_add_attempt: record one attempt, in order. route and
 * class_name are required (copied, at most OM_MESSAGE_MAX_ID bytes);
 * status is the HTTP status or 0 when none arrived. Returns 0, OM_EINVAL,
 * OM_ENOMEM (the error is unchanged). Beyond OM_EGRESS_MAX_ATTEMPTS stored
 * attempts, the attempt is counted (om_egress_error_attempts) but not
 * stored, and 0 is returned: error tracking is best-effort, the turn is not.
 */
int om_egress_error_add_attempt(om_egress_error_t *e, const char *route,
                                int status, const char *class_name,
                                uint64_t duration_ns);

/*
 * om_egress_error_set_attribution: who the failed turn belonged to; same
 * rules as om_agent_message_new (run_id may be NULL). Replaces an earlier
 * attribution. Returns 0, OM_EINVAL, OM_ENOMEM; on error e is unchanged.
 */
int om_egress_error_set_attribution(om_egress_error_t *e, const char *agent,
                                    const char *conversation,
                                    const char *run_id);

/* om_egress_error_free: NULL is accepted. */
void om_egress_error_free(om_egress_error_t *e);

om_egress_error_class_t om_egress_error_class(const om_egress_error_t *e);
/* "transport" / "semantic" / "unknown" (static strings). */
const char *om_egress_error_class_name(om_egress_error_class_t cls);
int om_egress_error_retryable(const om_egress_error_t *e);
const char *om_egress_error_cause(const om_egress_error_t *e);
/* Attempts made (stored or not). */
size_t om_egress_error_attempts(const om_egress_error_t *e);
/* Attempts stored: the ones om_egress_error_attempt can return. */
size_t om_egress_error_attempts_stored(const om_egress_error_t *e);
/*
 * om_egress_error_attempt: attempt i (0-based, < attempts_stored). Any out
 * pointer may be NULL. Strings valid while e lives. Returns 0 or
 * OM_ERANGE (outputs untouched).
 */
int om_egress_error_attempt(const om_egress_error_t *e, size_t i,
                            const char **route, int *status,
                            const char **class_name, uint64_t *duration_ns);
/* Attribution; NULL until set (run: NULL when none). */
const char *om_egress_error_agent(const om_egress_error_t *e);
const char *om_egress_error_conversation(const om_egress_error_t *e);
const char *om_egress_error_run(const om_egress_error_t *e);

/* ------------------------------------------------------------------ */
/* Splitting a body into parts                                         */

/*
 * One part, inside the block om_message_split returned. text is
 * prefix_len bytes of added fence line, then body[offset, offset +
 * len - prefix_len - suffix_len), then suffix_len bytes of added closing
 * fence line: stripping the added bytes and concatenating gives the body.
 */
typedef struct om_message_part_s {
  const char *text;  /* NUL-terminated */
  size_t len;        /* 1..limit bytes */
  size_t offset;     /* where the part's slice of the body starts */
  size_t prefix_len; /* re-opened fence line added before the slice */
  size_t suffix_len; /* closing fence line added after the slice */
} om_message_part_t;

/*
 * om_message_split: render body (len bytes, valid UTF-8) into the fewest
 * parts of at most limit bytes that the rules allow, in order:
 *
 *  - the whole body when it fits;
 *  - else cut at the last paragraph boundary ("\n\n") that fits, then the
 *    last line boundary ("\n"), then the last whitespace, then (last resort)
 *    the last UTF-8 code point boundary (RFC 3629 section 3): a part never
 *    ends inside a code point;
 *  - never inside a fenced code block (CommonMark 0.31 section 4.5: a line
 *    opening with ``` or ~~~, closed by a line of the same character at
 *    least as long) when a boundary outside it fits;
 *  - a fenced block that cannot fit is split at its line boundaries, and
 *    each piece is closed and re-opened with the same fence (info string
 *    kept) so that every part renders as code; when the limit cannot even
 *    hold the fence lines, the block is cut like plain text.
 *
 * Separators at a cut stay with the part before it, so the concatenation of
 * the parts equals the body, except for the fence lines added when a
 * block is re-fenced. An empty body gives zero parts.
 *
 * On 0, *parts is one malloc'd block (the array and the texts) that the
 * caller frees with om_message_parts_free, and *n its count. Returns
 * OM_EINVAL (NULL argument, limit 0), OM_EPARSE (body not valid UTF-8),
 * OM_ERANGE (limit smaller than some code point of the body), OM_ENOMEM; on
 * error the outputs are untouched.
 */
int om_message_split(const char *body, size_t len, size_t limit,
                     om_message_part_t **parts, size_t *n);

/* om_message_parts_free: frees what om_message_split returned; NULL ok. */
void om_message_parts_free(om_message_part_t *parts);

/*
 * om_utf8_valid: whether s[0..len) is valid UTF-8 (RFC 3629 section 4).
 * Exposed because every layer that builds a message checks the same rule.
 */
int om_utf8_valid(const char *s, size_t len);

#endif /* OM_MESSAGE_H */
