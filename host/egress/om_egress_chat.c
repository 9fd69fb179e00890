/*
 * om_egress_chat.c: POST /v1/chat/completions, the OpenAI chat API
 * inbound (docs/EGRESS.md "Endpoints"): the request is the gateway's
 * internal form already, so it runs Layer A as it is, and the answer is
 * the call's chat.completion or its chunks. With every route an OpenAI
 * one, the body goes to the provider as it came and the answer comes back
 * as the provider sent it (docs/EGRESS.md "Pass-through"); otherwise the
 * tree path below parses, checks and re-encodes.
 */
#include <string.h>
#include <time.h>

#include "om_egress_server.h"
#include "om_errno.h"
#include "om_json.h"

static json_t *chunk(chat_t *ch, eg_call_t *c, json_t *delta,
                     const char *finish) {
  return json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:s?}]}", "id", ch->id,
                   "object", "chat.completion.chunk", "created",
                   (json_int_t)time(NULL), "model", c->route_model, "choices",
                   "index", 0, "delta", delta, "finish_reason", finish);
}

static void chat_commit(void *ud, eg_call_t *c) {
  chat_t *ch = ud;
  if (ch->req == NULL)
    return;
  eg_sse_start(ch);
  if (eg_call_relaying(c))
    return; /* the provider's own role chunk comes first */
  eg_sse_write(ch->req,
               chunk(ch, c, json_pack("{s:s}", "role", "assistant"), NULL),
               NULL);
}

static void chat_delta(void *ud, eg_call_t *c, const char *text, size_t len) {
  chat_t *ch = ud;
  if (ch->req == NULL)
    return;
  eg_sse_write(ch->req,
               chunk(ch, c, json_pack("{s:s%}", "content", text, len), NULL),
               NULL);
}

static void chat_tool_delta(void *ud, eg_call_t *c, json_t *tool_calls) {
  chat_t *ch = ud;
  if (ch->req == NULL)
    return;
  eg_sse_write(ch->req,
               chunk(ch, c, json_pack("{s:O}", "tool_calls", tool_calls), NULL),
               NULL);
}

/* An OpenAI route's event, passed through (docs/EGRESS.md "Pass-through"). */
static void chat_raw(void *ud, eg_call_t *c, const char *data, size_t len) {
  chat_t *ch = ud;
  (void)c;
  if (ch->req == NULL)
    return;
  eg_sse_event(ch->req, NULL, data, len);
}

/* The last chunk (with the finish reason), the usage chunk when asked
 * for, [DONE]; or, failed after commit, an error event. A relayed
 * stream's own chunks said the first two already. */
static void chat_stream_end(chat_t *ch, eg_call_t *c) {
  om_http_request_t *req = ch->req;
  if (c->ok && eg_call_relaying(c)) {
    om_http_response_write(req, "data: [DONE]\n\n", 14);
  } else if (c->ok) {
    eg_sse_write(req,
                 chunk(ch, c, json_object(), c->finish[0] ? c->finish : "stop"),
                 NULL);
    if (c->include_usage) {
      /* stream_options.include_usage: one more chunk, choices [] and the
       * call's usage, as OpenAI sends it */
      json_t *u = chunk(ch, c, json_object(), NULL);
      json_object_set_new(u, "choices", json_array());
      json_object_set_new(u, "usage", eg_usage_json(&c->usage));
      eg_sse_write(req, u, NULL);
    }
    om_http_response_write(req, "data: [DONE]\n\n", 14);
  } else {
    eg_sse_write(req,
                 json_pack("{s:{s:s, s:s}}", "error", "type",
                           "stream_interrupted", "message",
                           "The response was interrupted."),
                 "error");
  }
}

static json_t *chat_whole(chat_t *ch, eg_call_t *c) {
  (void)ch;
  return json_incref(c->result);
}

static void chat_done(void *ud, eg_call_t *c) {
  eg_chat_finish(ud, c, chat_stream_end,
                 c->raw_result != NULL ? NULL : chat_whole);
}

static json_t *parse_request(om_http_request_t *req, const char **why) {
  json_t *j = eg_parse_body(req, why);
  json_t *msgs;
  size_t i;
  json_t *m;
  if (j == NULL)
    return NULL;
  msgs = json_object_get(j, "messages");
  if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
    *why = "field 'messages': a non-empty array is required";
    json_decref(j);
    return NULL;
  }
  json_array_foreach(msgs, i, m) {
    if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
      *why = "field 'messages': each message needs a string 'role'";
      json_decref(j);
      return NULL;
    }
  }
  if (json_object_get(j, "stream") != NULL &&
      !json_is_boolean(json_object_get(j, "stream"))) {
    *why = "field 'stream': a boolean";
    json_decref(j);
    return NULL;
  }
  if (json_object_get(j, "model") != NULL &&
      !json_is_string(json_object_get(j, "model"))) {
    *why = "field 'model': a string";
    json_decref(j);
    return NULL;
  }
  return j;
}

void eg_handle_chat(om_egress_t *g, om_http_request_t *req) {
  const char *why = NULL;
  json_t *body;
  eg_hooks_t hooks = {.commit = chat_commit,
                      .delta = chat_delta,
                      .done = chat_done,
                      .tool_delta = chat_tool_delta,
                      .raw = chat_raw};
  eg_req_facts_t raw;
  /* every route speaks the caller's API: its body goes through as it is
   * (docs/EGRESS.md "Pass-through"), read without a tree */
  if (g->cfg != NULL && g->cfg->all_openai &&
      eg_request_scan(req->body, req->body_len, &raw) == 0) {
    char model[512];
    size_t n = raw.has_model
                   ? om_json_string(req->body + raw.model_at, raw.model_len,
                                    model, sizeof model - 1)
                   : 0;
    if (n < sizeof model) {
      model[n] = '\0';
      eg_chat_run(g, req, EG_API_CHAT, NULL, &raw, raw.has_model ? model : NULL,
                  &hooks, NULL, NULL);
      return;
    }
  }
  body = parse_request(req, &why);
  if (body == NULL) {
    om_metric_inc(g->srv->m_refused[EG_API_CHAT]);
    eg_respond_error(req, 400, "invalid_request", why);
    return;
  }
  eg_chat_run(g, req, EG_API_CHAT, body, NULL,
              json_string_value(json_object_get(body, "model")), &hooks, NULL,
              NULL);
  json_decref(body);
}
