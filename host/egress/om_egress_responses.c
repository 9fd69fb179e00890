/*
 * om_egress_responses.c: POST /v1/responses, the OpenAI Responses API
 * inbound (docs/EGRESS.md "Inbound APIs"), enough for the
 * SDKs that default to it (the Vercel AI SDK's openai(model)). The
 * request (input as a string or items, instructions, function tools) is
 * translated to the internal chat form, runs the same Layer A, and the
 * answer comes back as a response object, or as the Responses SSE events
 * when streamed. The gateway keeps no state: store: true and
 * previous_response_id are refused, as is any field the chat form cannot
 * carry.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "om_egress_inbound.h"
#include "om_egress_server.h"
#include "om_errno.h"

/* ---- Responses request -> the internal (OpenAI chat) request ----------- */

static int short_text(json_t *v, const char *field, size_t max,
                      eg_in_err_t *e) {
  if (!json_is_string(v) || json_string_length(v) == 0 ||
      json_string_length(v) > max)
    return eg_in_refuse(e, "field '%s': a string of 1 to %zu bytes", field,
                        max);
  return 0;
}

/* A message item's content -> chat content (a string, or parts). */
static int item_content(json_t *c, const char *role, const char *field,
                        eg_in_err_t *e, json_t **out) {
  json_t *parts, *p;
  size_t i;
  char f[160];
  *out = NULL;
  if (json_is_string(c)) {
    if (json_string_length(c) > EG_IN_MAX_TEXT)
      return eg_in_refuse(e, "field '%s': longer than %u bytes", field,
                          (unsigned)EG_IN_MAX_TEXT);
    *out = json_incref(c);
    return 0;
  }
  if (!json_is_array(c))
    return eg_in_refuse(e, "field '%s': a string or an array of parts", field);
  if (json_array_size(c) > EG_IN_MAX_BLOCKS)
    return eg_in_refuse(e, "field '%s': more than %u parts", field,
                        (unsigned)EG_IN_MAX_BLOCKS);
  if ((parts = json_array()) == NULL)
    return OM_ENOMEM;
  json_array_foreach(c, i, p) {
    const char *type = json_string_value(json_object_get(p, "type"));
    json_t *text = json_object_get(p, "text");
    snprintf(f, sizeof f, "%s[%zu]", field, i);
    if (type != NULL &&
        (strcmp(type, "input_text") == 0 || strcmp(type, "output_text") == 0)) {
      static const char *const tk[] = {"type", "text", "annotations", NULL};
      static const char *const ik[] = {"type", "text", NULL};
      int rc = eg_in_only_keys(p, type[0] == 'o' ? tk : ik, f, e);
      if (rc == 0 &&
          (!json_is_string(text) || json_string_length(text) > EG_IN_MAX_TEXT))
        rc = eg_in_refuse(e, "field '%s.text': a string", f);
      if (rc == 0 && json_array_size(json_object_get(p, "annotations")) > 0)
        rc = eg_in_refuse(e, "field '%s.annotations': not supported", f);
      if (rc != 0) {
        json_decref(parts);
        return rc;
      }
      json_array_append_new(
          parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
    } else if (type != NULL && strcmp(type, "input_image") == 0 &&
               strcmp(role, "user") == 0) {
      static const char *const k[] = {"type", "image_url", "detail", NULL};
      json_t *url = json_object_get(p, "image_url");
      json_t *detail = json_object_get(p, "detail");
      json_t *iu;
      int rc = eg_in_only_keys(p, k, f, e);
      if (rc == 0 && !json_is_string(url))
        rc = eg_in_refuse(e,
                          "field '%s.image_url': a URL string (file_id is not "
                          "supported)",
                          f);
      if (rc == 0 && detail != NULL && !json_is_string(detail))
        rc = eg_in_refuse(e, "field '%s.detail': a string", f);
      if (rc != 0) {
        json_decref(parts);
        return rc;
      }
      iu = json_pack("{s:O}", "url", url);
      if (iu != NULL && detail != NULL)
        json_object_set(iu, "detail", detail);
      json_array_append_new(
          parts, json_pack("{s:s, s:o}", "type", "image_url", "image_url", iu));
    } else {
      json_decref(parts);
      return eg_in_refuse(
          e, "field '%s.type': '%s' is not accepted in a message of role %s", f,
          type ? type : "(none)", role);
    }
  }
  /* the chat form of an assistant turn is text */
  if (strcmp(role, "user") != 0) {
    size_t len = 0;
    char *buf = calloc(1, 1);
    json_array_foreach(parts, i, p) {
      const char *t = json_string_value(json_object_get(p, "text"));
      size_t n = strlen(t);
      char *nb = buf ? realloc(buf, len + n + 1) : NULL;
      if (nb == NULL) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      memcpy(buf + len, t, n + 1);
      len += n;
    }
    json_decref(parts);
    *out = buf ? json_stringn(buf, len) : NULL;
    free(buf);
  } else {
    *out = parts;
  }
  return *out ? 0 : OM_ENOMEM;
}

/* The chat messages' last assistant message, to which function_call
 * items attach as tool calls (a new one when the last is another role). */
static json_t *assistant_for_calls(json_t *msgs) {
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1), *m;
  const char *role = json_string_value(json_object_get(last, "role"));
  if (role != NULL && strcmp(role, "assistant") == 0) {
    if (json_object_get(last, "tool_calls") == NULL)
      json_object_set_new(last, "tool_calls", json_array());
    return last;
  }
  m = json_pack("{s:s, s:n, s:[]}", "role", "assistant", "content",
                "tool_calls");
  if (m == NULL || json_array_append_new(msgs, m) != 0)
    return NULL;
  return m;
}

static int tr_input(json_t *in, json_t *msgs, eg_in_err_t *e) {
  json_t *input = json_object_get(in, "input"), *it;
  size_t i;
  char f[64];
  if (json_is_string(input)) {
    if (json_string_length(input) > EG_IN_MAX_TEXT)
      return eg_in_refuse(e, "field 'input': longer than %u bytes",
                          (unsigned)EG_IN_MAX_TEXT);
    return json_array_append_new(
               msgs, json_pack("{s:s, s:O}", "role", "user", "content", input))
               ? OM_ENOMEM
               : 0;
  }
  if (!json_is_array(input) || json_array_size(input) == 0)
    return eg_in_refuse(
        e, "field 'input': a string or a non-empty array of items");
  if (json_array_size(input) > EG_IN_MAX_MESSAGES)
    return eg_in_refuse(e, "field 'input': more than %u items",
                        (unsigned)EG_IN_MAX_MESSAGES);
  json_array_foreach(input, i, it) {
    const char *type = json_string_value(json_object_get(it, "type"));
    const char *role = json_string_value(json_object_get(it, "role"));
    int rc;
    snprintf(f, sizeof f, "input[%zu]", i);
    if (!json_is_object(it))
      return eg_in_refuse(e, "field '%s': an object", f);
    if (type == NULL || strcmp(type, "message") == 0) {
      static const char *const k[] = {"type", "role",   "content",
                                      "id",   "status", NULL};
      json_t *content;
      char cf[80];
      if ((rc = eg_in_only_keys(it, k, f, e)) != 0)
        return rc;
      if (role == NULL ||
          (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0 &&
           strcmp(role, "system") != 0 && strcmp(role, "developer") != 0))
        return eg_in_refuse(
            e,
            "field '%s.role': \"user\", \"assistant\", \"system\" "
            "or \"developer\"",
            f);
      snprintf(cf, sizeof cf, "%s.content", f);
      if ((rc = item_content(json_object_get(it, "content"), role, cf, e,
                             &content)) != 0)
        return rc;
      if (json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", role,
                                                "content", content)) != 0)
        return OM_ENOMEM;
    } else if (strcmp(type, "function_call") == 0) {
      static const char *const k[] = {"type",      "call_id", "name", "id",
                                      "arguments", "status",  NULL};
      json_t *m, *args = json_object_get(it, "arguments");
      char cf[80];
      if ((rc = eg_in_only_keys(it, k, f, e)) != 0)
        return rc;
      snprintf(cf, sizeof cf, "%s.call_id", f);
      if ((rc = short_text(json_object_get(it, "call_id"), cf, EG_IN_MAX_ID,
                           e)) != 0)
        return rc;
      snprintf(cf, sizeof cf, "%s.name", f);
      if ((rc = short_text(json_object_get(it, "name"), cf, EG_IN_MAX_NAME,
                           e)) != 0)
        return rc;
      if (!json_is_string(args) || json_string_length(args) > EG_IN_MAX_TEXT)
        return eg_in_refuse(e, "field '%s.arguments': a string", f);
      if ((m = assistant_for_calls(msgs)) == NULL ||
          json_array_append_new(json_object_get(m, "tool_calls"),
                                json_pack("{s:O, s:s, s:{s:O, s:O}}", "id",
                                          json_object_get(it, "call_id"),
                                          "type", "function", "function",
                                          "name", json_object_get(it, "name"),
                                          "arguments", args)) != 0)
        return OM_ENOMEM;
    } else if (strcmp(type, "function_call_output") == 0) {
      static const char *const k[] = {"type", "call_id", "output",
                                      "id",   "status",  NULL};
      json_t *out = json_object_get(it, "output");
      char cf[80];
      if ((rc = eg_in_only_keys(it, k, f, e)) != 0)
        return rc;
      snprintf(cf, sizeof cf, "%s.call_id", f);
      if ((rc = short_text(json_object_get(it, "call_id"), cf, EG_IN_MAX_ID,
                           e)) != 0)
        return rc;
      if (!json_is_string(out) || json_string_length(out) > EG_IN_MAX_TEXT)
        return eg_in_refuse(e, "field '%s.output': a string", f);
      if (json_array_append_new(msgs, json_pack("{s:s, s:O, s:O}", "role",
                                                "tool", "tool_call_id",
                                                json_object_get(it, "call_id"),
                                                "content", out)) != 0)
        return OM_ENOMEM;
    } else {
      return eg_in_refuse(e,
                          "field '%s.type': '%s' is not accepted (message, "
                          "function_call and function_call_output are)",
                          f, type);
    }
  }
  return 0;
}

static int tr_tools(json_t *in, json_t *out, eg_in_err_t *e) {
  static const char *const k[] = {"type",       "name",   "description",
                                  "parameters", "strict", NULL};
  json_t *tools = json_object_get(in, "tools"), *t, *arr;
  json_t *tc = json_object_get(in, "tool_choice");
  json_t *par = json_object_get(in, "parallel_tool_calls");
  size_t i;
  char f[64];
  int rc;
  if (tools != NULL) {
    if (!json_is_array(tools) || json_array_size(tools) > EG_IN_MAX_TOOLS)
      return eg_in_refuse(e, "field 'tools': an array of at most %u tools",
                          (unsigned)EG_IN_MAX_TOOLS);
    if ((arr = json_array()) == NULL || json_object_set_new(out, "tools", arr))
      return OM_ENOMEM;
    json_array_foreach(tools, i, t) {
      const char *type = json_string_value(json_object_get(t, "type"));
      json_t *fn, *desc = json_object_get(t, "description");
      json_t *params = json_object_get(t, "parameters");
      json_t *strict = json_object_get(t, "strict");
      snprintf(f, sizeof f, "tools[%zu]", i);
      if (type == NULL || strcmp(type, "function") != 0)
        return eg_in_refuse(e, "field '%s.type': only \"function\" tools", f);
      if ((rc = eg_in_only_keys(t, k, f, e)) != 0)
        return rc;
      snprintf(f, sizeof f, "tools[%zu].name", i);
      if ((rc = short_text(json_object_get(t, "name"), f, EG_IN_MAX_NAME, e)))
        return rc;
      if (desc != NULL && !json_is_null(desc) && !json_is_string(desc))
        return eg_in_refuse(e, "field 'tools[%zu].description': a string", i);
      if (params != NULL && !json_is_null(params) && !json_is_object(params))
        return eg_in_refuse(e, "field 'tools[%zu].parameters': an object", i);
      if (strict != NULL && !json_is_null(strict) && !json_is_boolean(strict))
        return eg_in_refuse(e, "field 'tools[%zu].strict': a boolean", i);
      fn = json_pack("{s:O}", "name", json_object_get(t, "name"));
      if (fn == NULL)
        return OM_ENOMEM;
      if (json_is_string(desc))
        json_object_set(fn, "description", desc);
      if (json_is_object(params))
        json_object_set(fn, "parameters", params);
      if (json_is_boolean(strict))
        json_object_set(fn, "strict", strict);
      if (json_array_append_new(
              arr, json_pack("{s:s, s:o}", "type", "function", "function", fn)))
        return OM_ENOMEM;
    }
  }
  if (tc != NULL) {
    const char *s = json_string_value(tc);
    if (s != NULL && (strcmp(s, "auto") == 0 || strcmp(s, "none") == 0 ||
                      strcmp(s, "required") == 0))
      json_object_set(out, "tool_choice", tc);
    else if (json_is_object(tc) &&
             json_is_string(json_object_get(tc, "name")) &&
             strcmp(json_string_value(json_object_get(tc, "type")) ?: "",
                    "function") == 0)
      json_object_set_new(out, "tool_choice",
                          json_pack("{s:s, s:{s:O}}", "type", "function",
                                    "function", "name",
                                    json_object_get(tc, "name")));
    else
      return eg_in_refuse(
          e, "field 'tool_choice': \"auto\", \"none\", "
             "\"required\" or {\"type\":\"function\",\"name\":...}");
  }
  if (par != NULL) {
    if (!json_is_boolean(par))
      return eg_in_refuse(e, "field 'parallel_tool_calls': a boolean");
    json_object_set(out, "parallel_tool_calls", par);
  }
  return 0;
}

/* text.format -> response_format (json_schema keeps name, schema, strict). */
static int tr_text(json_t *in, json_t *out, eg_in_err_t *e) {
  static const char *const k[] = {"format", NULL};
  json_t *t = json_object_get(in, "text"), *fmt;
  const char *type;
  int rc;
  if (t == NULL)
    return 0;
  if (!json_is_object(t))
    return eg_in_refuse(e, "field 'text': an object");
  if ((rc = eg_in_only_keys(t, k, "text", e)) != 0)
    return rc;
  fmt = json_object_get(t, "format");
  if (fmt == NULL)
    return 0;
  type = json_string_value(json_object_get(fmt, "type"));
  if (type != NULL && strcmp(type, "text") == 0)
    return 0;
  if (type != NULL && strcmp(type, "json_object") == 0) {
    json_object_set_new(out, "response_format",
                        json_pack("{s:s}", "type", "json_object"));
    return 0;
  }
  if (type != NULL && strcmp(type, "json_schema") == 0 &&
      json_is_object(json_object_get(fmt, "schema"))) {
    json_t *js = json_pack("{s:O, s:s}", "schema",
                           json_object_get(fmt, "schema"), "name",
                           json_string_value(json_object_get(fmt, "name"))
                               ? json_string_value(json_object_get(fmt, "name"))
                               : "response");
    if (js != NULL && json_is_boolean(json_object_get(fmt, "strict")))
      json_object_set(js, "strict", json_object_get(fmt, "strict"));
    json_object_set_new(
        out, "response_format",
        json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
    return 0;
  }
  return eg_in_refuse(e,
                      "field 'text.format.type': \"text\", \"json_object\" or "
                      "\"json_schema\" with a schema");
}

int eg_responses_to_chat(json_t *in, json_t **out, char *why, size_t whylen) {
  static const char *const keys[] = {
      "model",       "input",       "instructions",
      "tools",       "tool_choice", "parallel_tool_calls",
      "temperature", "top_p",       "max_output_tokens",
      "stream",      "user",        "store",
      "text",        NULL};
  eg_in_err_t e = {why, whylen};
  json_t *o, *msgs, *v;
  const char *num[] = {"temperature", "top_p"};
  int rc;
  *out = NULL;
  if ((rc = eg_in_only_keys(in, keys, "", &e)) != 0)
    return rc;
  if ((rc = short_text(json_object_get(in, "model"), "model", EG_IN_MAX_NAME,
                       &e)) != 0)
    return rc;
  v = json_object_get(in, "store");
  if (v != NULL && !json_is_false(v))
    return eg_in_refuse(&e,
                        "field 'store': the gateway keeps no responses (false "
                        "or absent)");
  if ((o = json_pack("{s:O, s:[]}", "model", json_object_get(in, "model"),
                     "messages")) == NULL)
    return OM_ENOMEM;
  msgs = json_object_get(o, "messages");
  v = json_object_get(in, "instructions");
  if (v != NULL && !json_is_null(v)) {
    if (!json_is_string(v) || json_string_length(v) > EG_IN_MAX_TEXT)
      rc = eg_in_refuse(&e, "field 'instructions': a string");
    else if (json_string_length(v) > 0)
      json_array_append_new(
          msgs, json_pack("{s:s, s:O}", "role", "system", "content", v));
  }
  if (rc == 0)
    rc = tr_input(in, msgs, &e);
  for (size_t i = 0; rc == 0 && i < 2; i++) {
    v = json_object_get(in, num[i]);
    if (v == NULL || json_is_null(v))
      continue;
    if (!json_is_number(v) || json_number_value(v) < 0 ||
        json_number_value(v) > 2)
      rc = eg_in_refuse(&e, "field '%s': a number from 0 to 2", num[i]);
    else
      json_object_set(o, num[i], v);
  }
  v = json_object_get(in, "max_output_tokens");
  if (rc == 0 && v != NULL && !json_is_null(v)) {
    if (!json_is_integer(v) || json_integer_value(v) < 1)
      rc = eg_in_refuse(&e, "field 'max_output_tokens': a positive integer");
    else
      json_object_set(o, "max_tokens", v);
  }
  v = json_object_get(in, "stream");
  if (rc == 0 && v != NULL) {
    if (!json_is_boolean(v))
      rc = eg_in_refuse(&e, "field 'stream': a boolean");
    else if (json_is_true(v))
      json_object_set_new(o, "stream", json_true());
  }
  v = json_object_get(in, "user");
  if (rc == 0 && v != NULL)
    rc = short_text(v, "user", EG_IN_MAX_ID, &e) ||
         json_object_set(o, "user", v);
  if (rc == 0)
    rc = tr_tools(in, o, &e);
  if (rc == 0)
    rc = tr_text(in, o, &e);
  if (rc != 0) {
    json_decref(o);
    return rc;
  }
  *out = o;
  return 0;
}

/* ---- the answer -------------------------------------------------------- */

static json_t *responses_usage(const eg_usage_t *u) {
  return json_pack("{s:I, s:{s:I}, s:I, s:{s:i}, s:I}", "input_tokens",
                   (json_int_t)u->prompt, "input_tokens_details",
                   "cached_tokens", (json_int_t)u->cached, "output_tokens",
                   (json_int_t)u->completion, "output_tokens_details",
                   "reasoning_tokens", 0, "total_tokens",
                   (json_int_t)(u->prompt + u->completion));
}

static json_t *response_object(const char *id, const char *model,
                               const char *status, json_t *output,
                               const char *finish, const eg_usage_t *u) {
  int cut = finish != NULL && strcmp(finish, "length") == 0;
  json_t *r = json_pack(
      "{s:s, s:s, s:I, s:s, s:s, s:o, s:n, s:o}", "id", id, "object",
      "response", "created_at", (json_int_t)time(NULL), "status",
      cut && strcmp(status, "completed") == 0 ? "incomplete" : status, "model",
      model, "output", output, "error", "incomplete_details",
      cut ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
  if (r != NULL && u != NULL)
    json_object_set_new(r, "usage", responses_usage(u));
  return r;
}

static json_t *message_item(const char *id, const char *text,
                            const char *status) {
  return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s, s:[]}]}", "type",
                   "message", "id", id, "status", status, "role", "assistant",
                   "content", "type", "output_text", "text", text,
                   "annotations");
}

static json_t *chat_to_response(json_t *comp, const char *id,
                                const char *model) {
  json_t *ch = json_array_get(json_object_get(comp, "choices"), 0);
  json_t *msg = json_object_get(ch, "message"), *tc;
  json_t *output = json_array();
  const char *text = json_string_value(json_object_get(msg, "content"));
  eg_usage_t u = {0};
  char iid[64];
  size_t i;
  if (output == NULL)
    return NULL;
  if (text != NULL && *text) {
    snprintf(iid, sizeof iid, "msg_%s", id);
    json_array_append_new(output, message_item(iid, text, "completed"));
  }
  json_array_foreach(json_object_get(msg, "tool_calls"), i, tc) {
    json_t *fn = json_object_get(tc, "function");
    snprintf(iid, sizeof iid, "fc_%s_%zu", id, i);
    json_array_append_new(
        output, json_pack("{s:s, s:s, s:s, s:O?, s:O?, s:O?}", "type",
                          "function_call", "id", iid, "status", "completed",
                          "call_id", json_object_get(tc, "id"), "name",
                          json_object_get(fn, "name"), "arguments",
                          json_object_get(fn, "arguments")));
  }
  eg_usage_from_openai(json_object_get(comp, "usage"), &u);
  return response_object(
      id, model, "completed", output,
      json_string_value(json_object_get(ch, "finish_reason")), &u);
}

/* ---- the stream: the Responses events ---------------------------------- */

typedef struct {
  json_t *output; /* the items so far, as response.completed shows them */
  int open;       /* the output index of the open item; -1: none */
  char *buf;      /* the open item's text or arguments */
  size_t len, cap;
  int64_t seq;
  int tool_item[EG_MAX_STREAM_TOOLS]; /* output index per tool-call index */
  size_t n_tools;
} resp_stream_t;

static void resp_free(void *p) {
  resp_stream_t *s = p;
  if (s == NULL)
    return;
  json_decref(s->output);
  free(s->buf);
  free(s);
}

static void event(chat_t *ch, resp_stream_t *s, const char *type, json_t *j) {
  if (j == NULL)
    return;
  json_object_set_new(j, "type", json_string(type));
  json_object_set_new(j, "sequence_number", json_integer(s->seq++));
  eg_sse_write(ch->req, j, type);
}

static void buf_add(resp_stream_t *s, const char *t, size_t n) {
  if (s->len + n + 1 > s->cap) {
    size_t cap = (s->len + n + 1) * 2;
    char *nb = realloc(s->buf, cap);
    if (nb == NULL)
      return;
    s->buf = nb;
    s->cap = cap;
  }
  memcpy(s->buf + s->len, t, n);
  s->len += n;
  s->buf[s->len] = '\0';
}

static void item_close(chat_t *ch, resp_stream_t *s) {
  json_t *item;
  const char *type, *id;
  if (s->open < 0)
    return;
  item = json_array_get(s->output, (size_t)s->open);
  type = json_string_value(json_object_get(item, "type"));
  id = json_string_value(json_object_get(item, "id"));
  json_object_set_new(item, "status", json_string("completed"));
  if (strcmp(type, "message") == 0) {
    json_t *part = json_pack("{s:s, s:s%, s:[]}", "type", "output_text", "text",
                             s->buf ? s->buf : "", s->len, "annotations");
    event(ch, s, "response.output_text.done",
          json_pack("{s:s, s:i, s:i, s:s%}", "item_id", id, "output_index",
                    s->open, "content_index", 0, "text", s->buf ? s->buf : "",
                    s->len));
    event(ch, s, "response.content_part.done",
          json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index",
                    s->open, "content_index", 0, "part", part));
    json_object_set_new(item, "content", json_pack("[o]", part));
  } else {
    json_object_set_new(item, "arguments",
                        json_stringn(s->buf ? s->buf : "", s->len));
    event(ch, s, "response.function_call_arguments.done",
          json_pack("{s:s, s:i, s:O}", "item_id", id, "output_index", s->open,
                    "arguments", json_object_get(item, "arguments")));
  }
  event(ch, s, "response.output_item.done",
        json_pack("{s:i, s:O}", "output_index", s->open, "item", item));
  s->open = -1;
  s->len = 0;
}

static int item_open(chat_t *ch, resp_stream_t *s, json_t *item) {
  item_close(ch, s);
  if (item == NULL || json_array_append_new(s->output, item) != 0)
    return -1;
  s->open = (int)json_array_size(s->output) - 1;
  s->len = 0;
  event(ch, s, "response.output_item.added",
        json_pack("{s:i, s:O}", "output_index", s->open, "item", item));
  return s->open;
}

static void resp_commit(void *ud, eg_call_t *c) {
  chat_t *ch = ud;
  resp_stream_t *s = ch->st;
  json_t *r;
  if (ch->req == NULL)
    return;
  eg_sse_start(ch);
  r = response_object(ch->id, c->route_model, "in_progress", json_array(), NULL,
                      NULL);
  event(ch, s, "response.created", json_pack("{s:O}", "response", r));
  event(ch, s, "response.in_progress", json_pack("{s:o}", "response", r));
}

static void resp_delta(void *ud, eg_call_t *c, const char *text, size_t len) {
  chat_t *ch = ud;
  resp_stream_t *s = ch->st;
  json_t *item;
  const char *id;
  (void)c;
  if (ch->req == NULL)
    return;
  item = s->open >= 0 ? json_array_get(s->output, (size_t)s->open) : NULL;
  if (item == NULL ||
      strcmp(json_string_value(json_object_get(item, "type")), "message")) {
    char iid[64];
    snprintf(iid, sizeof iid, "msg_%s_%zu", ch->id, json_array_size(s->output));
    if (item_open(ch, s,
                  json_pack("{s:s, s:s, s:s, s:s, s:[]}", "type", "message",
                            "id", iid, "status", "in_progress", "role",
                            "assistant", "content")) < 0)
      return;
    item = json_array_get(s->output, (size_t)s->open);
    event(ch, s, "response.content_part.added",
          json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", iid,
                    "output_index", s->open, "content_index", 0, "part", "type",
                    "output_text", "text", "", "annotations"));
  }
  id = json_string_value(json_object_get(item, "id"));
  buf_add(s, text, len);
  event(ch, s, "response.output_text.delta",
        json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", id, "output_index",
                  s->open, "content_index", 0, "delta", text, len, "logprobs"));
}

static void resp_tool_delta(void *ud, eg_call_t *c, json_t *tool_calls) {
  chat_t *ch = ud;
  resp_stream_t *s = ch->st;
  json_t *t;
  size_t i;
  (void)c;
  if (ch->req == NULL)
    return;
  json_array_foreach(tool_calls, i, t) {
    json_int_t idx = json_integer_value(json_object_get(t, "index"));
    json_t *fn = json_object_get(t, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    int at = -1;
    if (json_object_get(t, "id") != NULL) {
      char iid[64];
      if (s->n_tools == EG_MAX_STREAM_TOOLS)
        continue;
      snprintf(iid, sizeof iid, "fc_%s_%zu", ch->id, s->n_tools);
      at = item_open(ch, s,
                     json_pack("{s:s, s:s, s:s, s:O, s:O?, s:s}", "type",
                               "function_call", "id", iid, "status",
                               "in_progress", "call_id",
                               json_object_get(t, "id"), "name",
                               json_object_get(fn, "name"), "arguments", ""));
      if (at < 0)
        continue;
      s->tool_item[s->n_tools++] = at;
    } else if (idx >= 0 && (size_t)idx < s->n_tools) {
      at = s->tool_item[idx];
    }
    /* deltas of an item already closed are not sent: the Responses
     * stream carries one open item at a time */
    if (at >= 0 && at == s->open && args != NULL && *args) {
      json_t *item = json_array_get(s->output, (size_t)at);
      buf_add(s, args, strlen(args));
      event(ch, s, "response.function_call_arguments.delta",
            json_pack("{s:O, s:i, s:s}", "item_id", json_object_get(item, "id"),
                      "output_index", at, "delta", args));
    }
  }
}

/* response.completed with the output; or, failed after commit,
 * response.failed with what was produced and the error. */
static void resp_stream_end(chat_t *ch, eg_call_t *c) {
  resp_stream_t *s = ch->st;
  if (c->ok) {
    item_close(ch, s);
    event(
        ch, s, "response.completed",
        json_pack("{s:o}", "response",
                  response_object(ch->id, c->route_model, "completed",
                                  json_incref(s->output),
                                  c->finish[0] ? c->finish : NULL, &c->usage)));
  } else {
    json_t *r = response_object(ch->id, c->route_model, "failed",
                                json_incref(s->output), NULL, NULL);
    if (r != NULL)
      json_object_set_new(r, "error",
                          json_pack("{s:s, s:s}", "code", "stream_interrupted",
                                    "message",
                                    "The response was interrupted."));
    event(ch, s, "response.failed", json_pack("{s:o}", "response", r));
  }
}

static json_t *resp_whole(chat_t *ch, eg_call_t *c) {
  return chat_to_response(c->result, ch->id, c->route_model);
}

static void resp_done(void *ud, eg_call_t *c) {
  eg_chat_finish(ud, c, resp_stream_end, resp_whole);
}

void eg_handle_responses(om_egress_t *g, om_http_request_t *req) {
  json_t *body, *chat;
  resp_stream_t *s;
  eg_hooks_t hooks = {.commit = resp_commit,
                      .delta = resp_delta,
                      .done = resp_done,
                      .tool_delta = resp_tool_delta};
  if (eg_inbound_chat(g, req, EG_API_RESPONSES, eg_responses_to_chat, &body,
                      &chat) != 0)
    return;
  s = calloc(1, sizeof *s);
  if (s == NULL || (s->output = json_array()) == NULL) {
    free(s);
    json_decref(body);
    json_decref(chat);
    eg_respond_api_error(req, EG_API_RESPONSES, 503, "overloaded",
                         "out of memory", 0, NULL);
    return;
  }
  s->open = -1;
  eg_chat_run(g, req, EG_API_RESPONSES, chat, NULL,
              json_string_value(json_object_get(body, "model")), &hooks, s,
              resp_free);
  json_decref(chat);
  json_decref(body);
}
