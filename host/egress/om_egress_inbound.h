/*
 * om_egress_inbound.h: the inbound APIs other than chat completions,
 * translated to the gateway's internal form (an OpenAI chat request) and
 * back (docs/EGRESS.md "Inbound APIs"). Pure JSON work, no I/O: the C
 * tests call these directly. Not a public API.
 */
#ifndef OM_EGRESS_INBOUND_H
#define OM_EGRESS_INBOUND_H

#include <stddef.h>

#include <jansson.h>

/* Limits of an inbound request (each refusal names the field and is
 * counted in openmesh_egress_requests_refused_total{api}). The HTTP
 * server's body limit bounds the whole; these bound what one field may
 * make the gateway build. */
#define EG_IN_MAX_MESSAGES 2048u /* messages / input items */
#define EG_IN_MAX_BLOCKS 256u    /* content blocks of one message */
#define EG_IN_MAX_TOOLS 128u
#define EG_IN_MAX_STOP 16u
#define EG_IN_MAX_NAME 256u     /* model, tool names, stop sequences */
#define EG_IN_MAX_ID 256u       /* tool-call ids, user ids */
#define EG_IN_MAX_TEXT 4194304u /* one text */

/* Where a refusal's reason goes: why, cap bytes. */
typedef struct {
  char *why;
  size_t cap;
} eg_in_err_t;

/* Write the reason into e; returns OM_EINVAL (om_egress_inbound.c). */
int eg_in_refuse(eg_in_err_t *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Every key of obj is one of allowed (NULL-terminated): else refused,
 * naming where.key ("field 'tools[0].x': not supported by this gateway"). */
int eg_in_only_keys(json_t *obj, const char *const *allowed, const char *where,
                    eg_in_err_t *e);

/*
 * eg_messages_to_chat: an Anthropic Messages request (borrowed) as the
 * internal OpenAI chat request. 0 and a new reference in *out; OM_EINVAL
 * with why naming the field (wrong type, unknown field, a value over its
 * limit, something the internal form cannot carry); OM_ENOMEM.
 */
int eg_messages_to_chat(json_t *in, json_t **out, char *why, size_t whylen);
/* A chat.completion (borrowed) as an Anthropic message with id and
 * model. A new reference; NULL when out of memory. */
json_t *eg_chat_to_message(json_t *comp, const char *id, const char *model);
/* OpenAI finish_reason -> Anthropic stop_reason (NULL: end_turn). */
const char *eg_stop_reason(const char *finish);

/*
 * eg_responses_to_chat: an OpenAI Responses request (borrowed) as the
 * internal chat request; the same contract as eg_messages_to_chat.
 */
int eg_responses_to_chat(json_t *in, json_t **out, char *why, size_t whylen);

#endif /* OM_EGRESS_INBOUND_H */
