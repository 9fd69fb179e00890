/*
 * om_egress_translate.c: the OpenAI chat shape <-> the Anthropic messages
 * shape (docs/EGRESS.md "Translation"): the request to each provider kind,
 * an Anthropic message back to a chat.completion, and Anthropic stream
 * events to OpenAI content and tool-call deltas.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "om_egress_internal.h"

int eg_route_is_anthropic(const om_route_t *r) {
  return strcmp(r->provider, "anthropic") == 0;
}

/* The text of an OpenAI message content (a string, or text parts). */
static char *content_text(json_t *content) {
  size_t i;
  json_t *part;
  char *out;
  size_t len = 0;
  if (json_is_string(content))
    return strdup(json_string_value(content));
  out = calloc(1, 1);
  json_array_foreach(content, i, part) {
    const char *t = json_string_value(json_object_get(part, "text"));
    if (t != NULL && out != NULL) {
      size_t n = strlen(t);
      char *nb = realloc(out, len + n + 1);
      if (nb == NULL) {
        free(out);
        return NULL;
      }
      out = nb;
      memcpy(out + len, t, n + 1);
      len += n;
    }
  }
  return out;
}

/* OpenAI chat request -> Anthropic messages request (docs/EGRESS.md). */
json_t *eg_to_anthropic(json_t *req, const om_route_t *r, int stream) {
  json_t *out = json_object(), *msgs = json_array(), *m, *v;
  size_t i;
  char *system = NULL;
  size_t slen = 0;
  json_object_set_new(out, "model", json_string(r->model));
  v = json_object_get(req, "max_tokens");
  if (!json_is_integer(v))
    v = json_object_get(req, "max_completion_tokens");
  json_object_set_new(
      out, "max_tokens",
      json_integer(json_is_integer(v) ? json_integer_value(v) : 1024));
  if ((v = json_object_get(req, "temperature")) != NULL && json_is_number(v))
    json_object_set(out, "temperature", v);
  json_array_foreach(json_object_get(req, "messages"), i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    char *text = content_text(json_object_get(m, "content"));
    if (text == NULL)
      text = strdup("");
    if (role != NULL &&
        (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0)) {
      size_t n = strlen(text);
      char *ns = realloc(system, slen + n + 2);
      if (ns != NULL) {
        system = ns;
        if (slen)
          system[slen++] = '\n';
        memcpy(system + slen, text, n + 1);
        slen += n;
      }
    } else {
      json_array_append_new(
          msgs, json_pack("{s:s, s:s}", "role",
                          role && strcmp(role, "assistant") == 0 ? "assistant"
                                                                 : "user",
                          "content", text));
    }
    free(text);
  }
  if (system != NULL)
    json_object_set_new(out, "system", json_string(system));
  free(system);
  json_object_set_new(out, "messages", msgs);
  if ((v = json_object_get(req, "tools")) != NULL && json_is_array(v)) {
    json_t *tools = json_array(), *t;
    json_array_foreach(v, i, t) {
      json_t *f = json_object_get(t, "function");
      json_t *params = json_object_get(f, "parameters");
      json_array_append_new(
          tools,
          json_pack("{s:O?, s:O?, s:O}", "name", json_object_get(f, "name"),
                    "description", json_object_get(f, "description"),
                    "input_schema",
                    params ? params : json_pack("{s:s}", "type", "object")));
    }
    json_object_set_new(out, "tools", tools);
  }
  if (stream)
    json_object_set_new(out, "stream", json_true());
  return out;
}

json_t *eg_to_openai(json_t *req, const om_route_t *r, int stream) {
  json_t *out = json_deep_copy(req);
  json_object_set_new(out, "model", json_string(r->model));
  if (stream)
    json_object_set_new(out, "stream", json_true());
  else
    json_object_del(out, "stream");
  json_object_del(out, "stream_options");
  return out;
}

/* Anthropic message -> OpenAI chat.completion. */
json_t *eg_from_anthropic(json_t *msg, const char *model) {
  json_t *content = json_object_get(msg, "content"), *b, *tools = NULL;
  json_t *message = json_object(), *usage = json_object_get(msg, "usage");
  const char *stop = json_string_value(json_object_get(msg, "stop_reason"));
  const char *finish = "stop";
  char *text = NULL;
  size_t len = 0, i;
  json_array_foreach(content, i, b) {
    const char *type = json_string_value(json_object_get(b, "type"));
    if (type && strcmp(type, "text") == 0) {
      const char *t = json_string_value(json_object_get(b, "text"));
      size_t n = t ? strlen(t) : 0;
      char *nt = realloc(text, len + n + 1);
      if (nt != NULL) {
        text = nt;
        memcpy(text + len, t ? t : "", n + 1);
        len += n;
      }
    } else if (type && strcmp(type, "tool_use") == 0) {
      char *args = json_dumps(json_object_get(b, "input"),
                              JSON_COMPACT | JSON_ENCODE_ANY);
      if (tools == NULL)
        tools = json_array();
      json_array_append_new(tools, json_pack("{s:O?, s:s, s:{s:O?, s:s}}", "id",
                                             json_object_get(b, "id"), "type",
                                             "function", "function", "name",
                                             json_object_get(b, "name"),
                                             "arguments", args ? args : "{}"));
      free(args);
    }
  }
  if (stop && strcmp(stop, "max_tokens") == 0)
    finish = "length";
  else if (stop && strcmp(stop, "tool_use") == 0)
    finish = "tool_calls";
  json_object_set_new(message, "role", json_string("assistant"));
  json_object_set_new(message, "content",
                      text ? json_string(text) : json_null());
  if (tools)
    json_object_set_new(message, "tool_calls", tools);
  free(text);
  return json_pack("{s:O?, s:s, s:I, s:s, s:[{s:i, s:o, s:s}], s:{s:O?, s:O?}}",
                   "id", json_object_get(msg, "id"), "object",
                   "chat.completion", "created", (json_int_t)time(NULL),
                   "model", model, "choices", "index", 0, "message", message,
                   "finish_reason", finish, "usage", "prompt_tokens",
                   json_object_get(usage, "input_tokens"), "completion_tokens",
                   json_object_get(usage, "output_tokens"));
}

/*
 * Anthropic streaming tool use -> OpenAI tool_calls deltas. Anthropic
 * (Messages API, "Streaming messages": content_block_start with a tool_use
 * block, then content_block_delta events of type input_json_delta carrying
 * partial_json) numbers content blocks, text included; OpenAI numbers tool
 * calls only, the first delta of each carrying id, type and function.name,
 * the next ones function.arguments fragments.
 */
static void anthropic_tool_start(eg_call_t *c, json_t *ev) {
  json_t *cb = json_object_get(ev, "content_block"), *input, *arr;
  json_int_t block = json_integer_value(json_object_get(ev, "index"));
  char *args = NULL;
  size_t ti;
  if (c->n_tools == EG_MAX_STREAM_TOOLS) {
    c->stream_done = -1; /* more tool calls than anyone asks for: broken */
    return;
  }
  ti = c->n_tools++;
  c->tool_block[ti] = (int)block;
  input = json_object_get(cb, "input");
  /* the input is normally {} here and arrives as partial_json; a provider
   * that sends it whole gets it forwarded whole */
  if (json_is_object(input) && json_object_size(input) > 0)
    args = json_dumps(input, JSON_COMPACT);
  arr = json_pack("[{s:I, s:O?, s:s, s:{s:O?, s:s}}]", "index", (json_int_t)ti,
                  "id", json_object_get(cb, "id"), "type", "function",
                  "function", "name", json_object_get(cb, "name"), "arguments",
                  args ? args : "");
  free(args);
  if (arr != NULL)
    eg_call_tool_calls(c, arr);
  json_decref(arr);
}

static void anthropic_tool_args(eg_call_t *c, json_t *ev, const char *frag) {
  json_int_t block = json_integer_value(json_object_get(ev, "index"));
  json_t *arr;
  for (size_t ti = 0; ti < c->n_tools; ti++) {
    if (c->tool_block[ti] != block)
      continue;
    if (*frag == '\0')
      return; /* Anthropic opens with an empty fragment; OpenAI never */
    arr = json_pack("[{s:I, s:{s:s}}]", "index", (json_int_t)ti, "function",
                    "arguments", frag);
    if (arr != NULL)
      eg_call_tool_calls(c, arr);
    json_decref(arr);
    return;
  }
}

/* One event of an Anthropic stream (Messages API, "Streaming messages"):
 * text deltas become content, tool_use blocks OpenAI tool-call deltas,
 * message_delta's stop_reason the finish reason, message_stop the end, an
 * error event a broken stream. */
void eg_anthropic_sse_event(eg_call_t *c, json_t *j) {
  const char *type = json_string_value(json_object_get(j, "type"));
  if (type && strcmp(type, "content_block_delta") == 0) {
    json_t *d = json_object_get(j, "delta");
    const char *dtype = json_string_value(json_object_get(d, "type"));
    const char *frag = json_string_value(json_object_get(d, "partial_json"));
    const char *t = json_string_value(json_object_get(d, "text"));
    if (dtype && strcmp(dtype, "input_json_delta") == 0) {
      if (frag)
        anthropic_tool_args(c, j, frag);
    } else if (t) {
      eg_call_content(c, t, strlen(t));
    }
  } else if (type && strcmp(type, "content_block_start") == 0) {
    const char *bt = json_string_value(
        json_object_get(json_object_get(j, "content_block"), "type"));
    if (bt && strcmp(bt, "tool_use") == 0)
      anthropic_tool_start(c, j);
  } else if (type && strcmp(type, "message_delta") == 0) {
    const char *s = json_string_value(
        json_object_get(json_object_get(j, "delta"), "stop_reason"));
    if (s)
      snprintf(c->finish, sizeof c->finish, "%s",
               strcmp(s, "max_tokens") == 0 ? "length"
               : strcmp(s, "tool_use") == 0 ? "tool_calls"
                                            : "stop");
  } else if (type && strcmp(type, "message_stop") == 0) {
    c->stream_done = 1;
  } else if (type && strcmp(type, "error") == 0) {
    c->stream_done = -1; /* an error event mid-stream */
  }
}
