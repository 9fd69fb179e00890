/*
 * om_egress_translate.c: the OpenAI chat shape <-> the Anthropic messages
 * shape (docs/EGRESS.md "Translation"): the request to each provider kind,
 * an Anthropic message back to a chat.completion, and Anthropic stream
 * events to OpenAI content and tool-call deltas.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "om_egress_internal.h"
#include "om_errno.h"

int eg_route_is_anthropic(const om_route_t *r) {
  return strcmp(r->provider, "anthropic") == 0;
}

/* ---- OpenAI chat -> Anthropic messages ---------------------------------- */

/* The default max_tokens when the caller gives neither max_tokens nor
 * max_completion_tokens (Anthropic requires one; OpenAI has none). */
#define EG_ANTHROPIC_MAX_TOKENS 1024

typedef struct {
  char *why;
  size_t cap;
  int oom; /* an insertion failed: the request would be incomplete */
} tr_err_t;

/* Insertions that record their failure in e->oom (a NULL value fails
 * too), so an allocation failure never sends a request with a part
 * missing. */
#define TR_CHECK(e, call)                                                      \
  do {                                                                         \
    if ((call) != 0)                                                           \
      (e)->oom = 1;                                                            \
  } while (0)
#define PUSH(e, a, v) TR_CHECK(e, json_array_append_new((a), (v)))
#define PUSH_REF(e, a, v) TR_CHECK(e, json_array_append((a), (v)))
#define SET(e, o, k, v) TR_CHECK(e, json_object_set_new((o), (k), (v)))
#define SET_REF(e, o, k, v) TR_CHECK(e, json_object_set((o), (k), (v)))

static int refuse(tr_err_t *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int refuse(tr_err_t *e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->why, e->cap, fmt, ap);
  va_end(ap);
  return OM_EINVAL;
}

/* Append s to the malloc'd *buf (len *len), a separator first if not empty. */
static int str_append(char **buf, size_t *len, const char *sep, const char *s) {
  size_t n = strlen(s), sl = *len && sep ? strlen(sep) : 0;
  char *nb = realloc(*buf, *len + sl + n + 1);
  if (nb == NULL)
    return OM_ENOMEM;
  memcpy(nb + *len, sep, sl);
  memcpy(nb + *len + sl, s, n + 1);
  *buf = nb;
  *len += sl + n;
  return 0;
}

/* The text of a content that may only hold text (a string, or text parts:
 * system, developer and tool messages). */
static int text_only(json_t *content, const char *field, tr_err_t *e,
                     char **out) {
  size_t i, len = 0;
  json_t *part;
  *out = NULL;
  if (content == NULL || json_is_null(content))
    return (*out = strdup("")) ? 0 : OM_ENOMEM;
  if (json_is_string(content))
    return (*out = strdup(json_string_value(content))) ? 0 : OM_ENOMEM;
  if (!json_is_array(content))
    return refuse(e, "field '%s': a string or an array of parts", field);
  if ((*out = calloc(1, 1)) == NULL)
    return OM_ENOMEM;
  json_array_foreach(content, i, part) {
    const char *type = json_string_value(json_object_get(part, "type"));
    const char *t = json_string_value(json_object_get(part, "text"));
    if (type == NULL || strcmp(type, "text") != 0 || t == NULL) {
      free(*out);
      *out = NULL;
      return refuse(e, "field '%s[%zu]': only text parts are accepted here",
                    field, i);
    }
    if (str_append(out, &len, "", t) != 0) {
      free(*out);
      *out = NULL;
      return OM_ENOMEM;
    }
  }
  return 0;
}

/* An image_url part -> an Anthropic image block: a data: URL becomes a
 * base64 source, an http(s) URL a url source. */
static int image_block(json_t *part, const char *field, tr_err_t *e,
                       json_t **out) {
  json_t *iu = json_object_get(part, "image_url");
  const char *url =
      json_string_value(json_is_object(iu) ? json_object_get(iu, "url") : iu);
  *out = NULL;
  if (url == NULL)
    return refuse(e, "field '%s.image_url.url': a string is required", field);
  if (strncmp(url, "data:", 5) == 0) {
    const char *semi = strchr(url + 5, ';');
    const char *comma = strchr(url + 5, ',');
    if (semi == NULL || comma == NULL || semi > comma ||
        strncmp(semi, ";base64,", 8) != 0 || semi == url + 5)
      return refuse(e,
                    "field '%s.image_url.url': a data: URL must be "
                    "data:MEDIA_TYPE;base64,DATA",
                    field);
    *out = json_pack("{s:s, s:{s:s, s:s%, s:s}}", "type", "image", "source",
                     "type", "base64", "media_type", url + 5,
                     (size_t)(semi - url - 5), "data", comma + 1);
  } else if (strncmp(url, "https://", 8) == 0 ||
             strncmp(url, "http://", 7) == 0) {
    *out = json_pack("{s:s, s:{s:s, s:s}}", "type", "image", "source", "type",
                     "url", "url", url);
  } else {
    return refuse(e,
                  "field '%s.image_url.url': an http(s) URL or a base64 "
                  "data: URL",
                  field);
  }
  return *out ? 0 : OM_ENOMEM;
}

/* A user message's content -> Anthropic content blocks (appended). */
static int user_blocks(json_t *content, const char *field, tr_err_t *e,
                       json_t *blocks) {
  size_t i;
  json_t *part;
  char pf[128];
  if (json_is_string(content)) {
    if (json_string_length(content) > 0)
      PUSH(e, blocks, json_pack("{s:s, s:O}", "type", "text", "text", content));
    return 0;
  }
  if (!json_is_array(content))
    return refuse(e, "field '%s': a string or an array of parts", field);
  json_array_foreach(content, i, part) {
    const char *type = json_string_value(json_object_get(part, "type"));
    snprintf(pf, sizeof pf, "%s[%zu]", field, i);
    if (type != NULL && strcmp(type, "text") == 0 &&
        json_is_string(json_object_get(part, "text"))) {
      PUSH(e, blocks,
           json_pack("{s:s, s:O}", "type", "text", "text",
                     json_object_get(part, "text")));
    } else if (type != NULL && strcmp(type, "image_url") == 0) {
      json_t *img;
      int rc = image_block(part, pf, e, &img);
      if (rc != 0)
        return rc;
      PUSH(e, blocks, img);
    } else {
      return refuse(e,
                    "field '%s.type': '%s' has no Anthropic equivalent (text "
                    "and image_url are translated)",
                    pf, type ? type : "(none)");
    }
  }
  return 0;
}

/* An assistant message -> text then tool_use blocks (appended). */
static int assistant_blocks(json_t *m, const char *field, tr_err_t *e,
                            json_t *blocks) {
  json_t *tcs = json_object_get(m, "tool_calls"), *tc;
  char *text = NULL, pf[96];
  size_t i;
  int rc;
  snprintf(pf, sizeof pf, "%s.content", field);
  if ((rc = text_only(json_object_get(m, "content"), pf, e, &text)) != 0)
    return rc;
  if (*text != '\0')
    PUSH(e, blocks, json_pack("{s:s, s:s}", "type", "text", "text", text));
  free(text);
  if (tcs != NULL && !json_is_null(tcs) && !json_is_array(tcs))
    return refuse(e, "field '%s.tool_calls': an array", field);
  json_array_foreach(tcs, i, tc) {
    json_t *f = json_object_get(tc, "function"), *input;
    const char *id = json_string_value(json_object_get(tc, "id"));
    const char *name = json_string_value(json_object_get(f, "name"));
    const char *args = json_string_value(json_object_get(f, "arguments"));
    if (id == NULL || name == NULL)
      return refuse(e,
                    "field '%s.tool_calls[%zu]': id and function.name "
                    "are required",
                    field, i);
    json_error_t jerr;
    input = args && *args ? json_loads(args, 0, &jerr) : json_object();
    /* a parse that failed for want of memory is not the caller's error
     * (jansson may fail before it writes the error: code and text empty) */
    if (input == NULL && (args == NULL || !*args ||
                          json_error_code(&jerr) == json_error_out_of_memory ||
                          jerr.text[0] == '\0'))
      return OM_ENOMEM;
    if (!json_is_object(input)) {
      json_decref(input);
      return refuse(e,
                    "field '%s.tool_calls[%zu].function.arguments': a JSON "
                    "object",
                    field, i);
    }
    PUSH(e, blocks,
         json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name",
                   name, "input", input));
  }
  return 0;
}

/* The turns so far: append blocks as role, merged into the last turn when
 * it has the same role (Anthropic requires alternation). tool_result
 * blocks go before any other block of their user turn, as Anthropic
 * requires. */
static void turn_append(json_t *msgs, const char *role, json_t *blocks,
                        tr_err_t *e) {
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  json_t *into;
  size_t i, lead = 0;
  json_t *b;
  if (json_array_size(blocks) == 0)
    return;
  if (last != NULL &&
      strcmp(json_string_value(json_object_get(last, "role")), role) == 0) {
    into = json_object_get(last, "content");
  } else {
    into = json_array();
    PUSH(e, msgs, json_pack("{s:s, s:o}", "role", role, "content", into));
  }
  json_array_foreach(into, i, b) {
    const char *t = json_string_value(json_object_get(b, "type"));
    if (t == NULL || strcmp(t, "tool_result") != 0)
      break;
    lead++;
  }
  json_array_foreach(blocks, i, b) {
    const char *t = json_string_value(json_object_get(b, "type"));
    if (t != NULL && strcmp(t, "tool_result") == 0)
      TR_CHECK(e, json_array_insert(into, lead++, b));
    else
      PUSH_REF(e, into, b);
  }
}

/* A turn whose only block is text is sent as a string (the shorter form
 * the API accepts). */
static void turns_compact(json_t *msgs, tr_err_t *e) {
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    json_t *c = json_object_get(m, "content");
    json_t *b = json_array_get(c, 0);
    const char *t = json_string_value(json_object_get(b, "type"));
    if (json_array_size(c) == 1 && t != NULL && strcmp(t, "text") == 0)
      SET_REF(e, m, "content", json_object_get(b, "text"));
  }
}

static int tr_messages(json_t *req, json_t *out, tr_err_t *e) {
  json_t *msgs = json_array(), *m;
  size_t i, slen = 0;
  char *system = NULL, field[64];
  int rc = 0;
  SET(e, out, "messages", msgs);
  json_array_foreach(json_object_get(req, "messages"), i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *blocks;
    snprintf(field, sizeof field, "messages[%zu]", i);
    if (role == NULL) {
      rc = refuse(e, "field '%s.role': a string is required", field);
      break;
    }
    if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) {
      char *text, pf[80];
      snprintf(pf, sizeof pf, "%s.content", field);
      if ((rc = text_only(json_object_get(m, "content"), pf, e, &text)) != 0)
        break;
      rc = *text ? str_append(&system, &slen, "\n", text) : 0;
      free(text);
      if (rc != 0)
        break;
      continue;
    }
    blocks = json_array();
    if (strcmp(role, "user") == 0) {
      char pf[80];
      snprintf(pf, sizeof pf, "%s.content", field);
      rc = user_blocks(json_object_get(m, "content"), pf, e, blocks);
    } else if (strcmp(role, "assistant") == 0) {
      rc = assistant_blocks(m, field, e, blocks);
    } else if (strcmp(role, "tool") == 0) {
      const char *id = json_string_value(json_object_get(m, "tool_call_id"));
      char *text, pf[80];
      snprintf(pf, sizeof pf, "%s.content", field);
      if (id == NULL)
        rc = refuse(e, "field '%s.tool_call_id': a string is required", field);
      else if ((rc = text_only(json_object_get(m, "content"), pf, e, &text)) ==
               0) {
        PUSH(e, blocks,
             json_pack("{s:s, s:s, s:s}", "type", "tool_result", "tool_use_id",
                       id, "content", text));
        free(text);
      }
      role = "user";
    } else {
      rc = refuse(e,
                  "field '%s.role': '%s' has no Anthropic equivalent (system, "
                  "developer, user, assistant and tool are translated)",
                  field, role);
    }
    if (rc == 0)
      turn_append(msgs, role, blocks, e);
    json_decref(blocks);
    if (rc != 0)
      break;
  }
  if (rc == 0 && system != NULL)
    SET(e, out, "system", json_string(system));
  free(system);
  if (rc == 0)
    turns_compact(msgs, e);
  return rc;
}

static int tr_tools(json_t *req, json_t *out, tr_err_t *e) {
  json_t *v = json_object_get(req, "tools"), *t, *tools;
  size_t i;
  if (v == NULL || json_is_null(v))
    return 0;
  if (!json_is_array(v))
    return refuse(e, "field 'tools': an array");
  tools = json_array();
  SET(e, out, "tools", tools);
  json_array_foreach(v, i, t) {
    json_t *f = json_object_get(t, "function");
    json_t *params = json_object_get(f, "parameters");
    json_t *desc = json_object_get(f, "description");
    const char *type = json_string_value(json_object_get(t, "type"));
    json_t *one;
    if (type == NULL || strcmp(type, "function") != 0)
      return refuse(e, "field 'tools[%zu].type': only \"function\" tools", i);
    if (!json_is_string(json_object_get(f, "name")))
      return refuse(e, "field 'tools[%zu].function.name': a string", i);
    if (params != NULL && !json_is_object(params))
      return refuse(e, "field 'tools[%zu].function.parameters': an object", i);
    if (desc != NULL && !json_is_null(desc) && !json_is_string(desc))
      return refuse(e, "field 'tools[%zu].function.description': a string", i);
    one = json_pack(
        "{s:O, s:o}", "name", json_object_get(f, "name"), "input_schema",
        params ? json_incref(params) : json_pack("{s:s}", "type", "object"));
    if (json_is_string(desc))
      SET_REF(e, one, "description", desc);
    PUSH(e, tools, one);
  }
  return 0;
}

static int tr_tool_choice(json_t *req, json_t *out, tr_err_t *e) {
  json_t *v = json_object_get(req, "tool_choice");
  json_t *par = json_object_get(req, "parallel_tool_calls");
  json_t *tc = NULL;
  const char *s = json_string_value(v);
  if (par != NULL && !json_is_boolean(par))
    return refuse(e, "field 'parallel_tool_calls': a boolean");
  if (v == NULL || json_is_null(v)) {
    if (json_is_false(par) && json_object_get(out, "tools") != NULL)
      tc = json_pack("{s:s}", "type", "auto");
  } else if (s != NULL && strcmp(s, "auto") == 0) {
    tc = json_pack("{s:s}", "type", "auto");
  } else if (s != NULL && strcmp(s, "none") == 0) {
    tc = json_pack("{s:s}", "type", "none");
  } else if (s != NULL && strcmp(s, "required") == 0) {
    tc = json_pack("{s:s}", "type", "any");
  } else if (json_is_object(v) &&
             json_is_string(
                 json_object_get(json_object_get(v, "function"), "name"))) {
    tc = json_pack("{s:s, s:O}", "type", "tool", "name",
                   json_object_get(json_object_get(v, "function"), "name"));
  } else {
    return refuse(e, "field 'tool_choice': \"auto\", \"none\", \"required\" or "
                     "{\"type\":\"function\",\"function\":{\"name\":...}}");
  }
  if (tc == NULL) /* nothing to send, or no memory to send it */
    return v == NULL || json_is_null(v)
               ? (json_is_false(par) && json_object_get(out, "tools")
                      ? OM_ENOMEM
                      : 0)
               : OM_ENOMEM;
  if (json_is_false(par) &&
      strcmp(json_string_value(json_object_get(tc, "type")), "none") != 0)
    SET(e, tc, "disable_parallel_tool_use", json_true());
  SET(e, out, "tool_choice", tc);
  return 0;
}

/* response_format: JSON output is asked for with an instruction at the end
 * of the system prompt (the reply stays text content, as OpenAI returns
 * it), not a forced tool (which would turn the answer into a tool call the
 * caller did not define). */
static int tr_response_format(json_t *req, json_t *out, tr_err_t *e) {
  json_t *v = json_object_get(req, "response_format");
  const char *type = json_string_value(json_object_get(v, "type"));
  const char *sys = json_string_value(json_object_get(out, "system"));
  char *buf = NULL, *schema = NULL;
  size_t len = 0;
  int rc = 0;
  if (v == NULL || json_is_null(v) || (type && strcmp(type, "text") == 0))
    return 0;
  if (type == NULL ||
      (strcmp(type, "json_object") != 0 && strcmp(type, "json_schema") != 0))
    return refuse(e, "field 'response_format.type': \"text\", \"json_object\" "
                     "or \"json_schema\"");
  if (strcmp(type, "json_schema") == 0) {
    json_t *s = json_object_get(json_object_get(v, "json_schema"), "schema");
    if (!json_is_object(s))
      return refuse(e, "field 'response_format.json_schema.schema': an "
                       "object");
    schema = json_dumps(s, JSON_COMPACT | JSON_SORT_KEYS);
    if (schema == NULL)
      return OM_ENOMEM;
  }
  if (sys != NULL && *sys)
    rc = str_append(&buf, &len, "", sys);
  if (rc == 0)
    rc = str_append(&buf, &len, "\n\n",
                    "Answer with one JSON object and nothing else: no prose, "
                    "no code fence.");
  if (rc == 0 && schema != NULL) {
    rc = str_append(&buf, &len, " ", "The object must match this JSON Schema:");
    if (rc == 0)
      rc = str_append(&buf, &len, " ", schema);
  }
  if (rc == 0)
    SET(e, out, "system", json_string(buf));
  free(buf);
  free(schema);
  return rc;
}

/* The request fields with no Anthropic equivalent: refused unless they
 * hold the value that means "not used". Any field not in this list nor
 * translated is refused too (nothing is dropped silently). */
static int tr_unsupported(json_t *req, tr_err_t *e) {
  static const char *translated[] = {"model",
                                     "messages",
                                     "stream",
                                     "stream_options",
                                     "max_tokens",
                                     "max_completion_tokens",
                                     "temperature",
                                     "top_p",
                                     "stop",
                                     "tools",
                                     "tool_choice",
                                     "parallel_tool_calls",
                                     "response_format",
                                     "user",
                                     "n",
                                     "logprobs",
                                     "presence_penalty",
                                     "frequency_penalty"};
  const char *k;
  json_t *v;
  json_object_foreach(req, k, v) {
    size_t i;
    for (i = 0; i < sizeof translated / sizeof translated[0]; i++)
      if (strcmp(k, translated[i]) == 0)
        break;
    if (i == sizeof translated / sizeof translated[0])
      return refuse(e, "field '%s': has no Anthropic equivalent on this route",
                    k);
  }
  v = json_object_get(req, "n");
  if (v != NULL && !json_is_null(v) &&
      !(json_is_integer(v) && json_integer_value(v) == 1))
    return refuse(e, "field 'n': only 1 choice on an Anthropic route");
  v = json_object_get(req, "logprobs");
  if (v != NULL && !json_is_null(v) && !json_is_false(v))
    return refuse(e, "field 'logprobs': has no Anthropic equivalent");
  v = json_object_get(req, "presence_penalty");
  if (v != NULL && !json_is_null(v) &&
      !(json_is_number(v) && json_number_value(v) == 0))
    return refuse(e, "field 'presence_penalty': has no Anthropic equivalent");
  v = json_object_get(req, "frequency_penalty");
  if (v != NULL && !json_is_null(v) &&
      !(json_is_number(v) && json_number_value(v) == 0))
    return refuse(e, "field 'frequency_penalty': has no Anthropic equivalent");
  return 0;
}

static int tr_sampling(json_t *req, json_t *out, tr_err_t *e) {
  json_t *v = json_object_get(req, "max_tokens");
  const char *mt = "max_tokens";
  if (v == NULL || json_is_null(v)) {
    v = json_object_get(req, "max_completion_tokens");
    mt = "max_completion_tokens";
  }
  if (v != NULL && !json_is_null(v) &&
      !(json_is_integer(v) && json_integer_value(v) > 0))
    return refuse(e, "field '%s': a positive integer", mt);
  SET(e, out, "max_tokens",
      json_integer(json_is_integer(v) ? json_integer_value(v)
                                      : EG_ANTHROPIC_MAX_TOKENS));
  v = json_object_get(req, "temperature");
  if (v != NULL && !json_is_null(v)) {
    if (!json_is_number(v) || json_number_value(v) < 0 ||
        json_number_value(v) > 1)
      return refuse(e, "field 'temperature': a number from 0 to 1 on an "
                       "Anthropic route");
    SET_REF(e, out, "temperature", v);
  }
  v = json_object_get(req, "top_p");
  if (v != NULL && !json_is_null(v)) {
    if (!json_is_number(v) || json_number_value(v) < 0 ||
        json_number_value(v) > 1)
      return refuse(e, "field 'top_p': a number from 0 to 1");
    SET_REF(e, out, "top_p", v);
  }
  v = json_object_get(req, "stop");
  if (json_is_string(v)) {
    SET(e, out, "stop_sequences", json_pack("[O]", v));
  } else if (json_is_array(v)) {
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) if (!json_is_string(s)) return refuse(
        e, "field 'stop[%zu]': a string", i);
    if (json_array_size(v) > 0)
      SET_REF(e, out, "stop_sequences", v);
  } else if (v != NULL && !json_is_null(v)) {
    return refuse(e, "field 'stop': a string or an array of strings");
  }
  v = json_object_get(req, "user");
  if (json_is_string(v))
    SET(e, out, "metadata", json_pack("{s:O}", "user_id", v));
  else if (v != NULL && !json_is_null(v))
    return refuse(e, "field 'user': a string");
  return 0;
}

int eg_to_anthropic(json_t *req, const om_route_t *r, int stream, json_t **out,
                    char *why, size_t whylen) {
  tr_err_t e = {why, whylen, 0};
  json_t *o = json_object();
  int rc;
  *out = NULL;
  if (whylen)
    why[0] = '\0';
  if (o == NULL)
    return OM_ENOMEM;
  SET(&e, o, "model", json_string(r->model));
  if ((rc = tr_unsupported(req, &e)) == 0 &&
      (rc = tr_sampling(req, o, &e)) == 0 &&
      (rc = tr_messages(req, o, &e)) == 0 && (rc = tr_tools(req, o, &e)) == 0 &&
      (rc = tr_tool_choice(req, o, &e)) == 0)
    rc = tr_response_format(req, o, &e);
  if (rc != 0) {
    json_decref(o);
    return rc;
  }
  if (stream)
    SET(&e, o, "stream", json_true());
  if (e.oom) {
    json_decref(o);
    return OM_ENOMEM;
  }
  *out = o;
  return 0;
}

/*
 * A streamed call on an OpenAI route always asks for the final usage
 * chunk (stream_options.include_usage), so every call's tokens are known;
 * the caller sees that chunk only when it asked for it (eg_call_t
 * include_usage). Without stream, stream_options is removed (OpenAI
 * refuses it then).
 */
json_t *eg_to_openai(json_t *req, const om_route_t *r, int stream) {
  json_t *out = json_deep_copy(req);
  if (out == NULL)
    return NULL;
  json_object_set_new(out, "model", json_string(r->model));
  if (stream) {
    json_t *so = json_object_get(out, "stream_options");
    json_object_set_new(out, "stream", json_true());
    if (!json_is_object(so)) {
      so = json_object();
      json_object_set_new(out, "stream_options", so);
    }
    json_object_set_new(so, "include_usage", json_true());
  } else {
    json_object_del(out, "stream");
    json_object_del(out, "stream_options");
  }
  return out;
}

/* ---- Anthropic -> OpenAI ----------------------------------------------- */

const char *eg_finish_reason(const char *stop_reason) {
  if (stop_reason == NULL)
    return "stop";
  if (strcmp(stop_reason, "max_tokens") == 0)
    return "length";
  if (strcmp(stop_reason, "tool_use") == 0)
    return "tool_calls";
  if (strcmp(stop_reason, "refusal") == 0)
    return "content_filter";
  return "stop"; /* end_turn, stop_sequence, pause_turn */
}

void eg_usage_from_anthropic(json_t *usage, eg_usage_t *u) {
  json_t *v;
  if (!json_is_object(usage))
    return;
  /* Anthropic's input_tokens leaves out the cached part; OpenAI's
   * prompt_tokens counts it */
  if (json_is_integer(v = json_object_get(usage, "input_tokens")) ||
      json_object_get(usage, "cache_read_input_tokens") != NULL) {
    u->prompt =
        json_integer_value(v) +
        json_integer_value(json_object_get(usage, "cache_read_input_tokens")) +
        json_integer_value(
            json_object_get(usage, "cache_creation_input_tokens"));
    u->cached =
        json_integer_value(json_object_get(usage, "cache_read_input_tokens"));
    u->has = 1;
  }
  if (json_is_integer(v = json_object_get(usage, "output_tokens"))) {
    u->completion = json_integer_value(v);
    u->has = 1;
  }
}

json_t *eg_usage_json(const eg_usage_t *u) {
  json_t *j =
      json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)u->prompt,
                "completion_tokens", (json_int_t)u->completion, "total_tokens",
                (json_int_t)(u->prompt + u->completion));
  if (j != NULL && u->cached > 0)
    json_object_set_new(
        j, "prompt_tokens_details",
        json_pack("{s:I}", "cached_tokens", (json_int_t)u->cached));
  return j;
}

void eg_usage_from_openai(json_t *usage, eg_usage_t *u) {
  json_t *v;
  if (!json_is_object(usage))
    return;
  if (json_is_integer(v = json_object_get(usage, "prompt_tokens")))
    u->prompt = json_integer_value(v), u->has = 1;
  if (json_is_integer(v = json_object_get(usage, "completion_tokens")))
    u->completion = json_integer_value(v), u->has = 1;
  v = json_object_get(json_object_get(usage, "prompt_tokens_details"),
                      "cached_tokens");
  if (json_is_integer(v))
    u->cached = json_integer_value(v);
}

/* Anthropic message -> OpenAI chat.completion. */
json_t *eg_from_anthropic(json_t *msg, const char *model) {
  json_t *content = json_object_get(msg, "content"), *b, *tools = NULL;
  json_t *message = json_object();
  const char *stop = json_string_value(json_object_get(msg, "stop_reason"));
  eg_usage_t u = {0};
  char *text = NULL;
  size_t len = 0, i;
  json_array_foreach(content, i, b) {
    const char *type = json_string_value(json_object_get(b, "type"));
    if (type && strcmp(type, "text") == 0) {
      const char *t = json_string_value(json_object_get(b, "text"));
      if (str_append(&text, &len, "", t ? t : "") != 0)
        break;
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
  json_object_set_new(message, "role", json_string("assistant"));
  json_object_set_new(message, "content",
                      text ? json_string(text) : json_null());
  if (tools)
    json_object_set_new(message, "tool_calls", tools);
  free(text);
  eg_usage_from_anthropic(json_object_get(msg, "usage"), &u);
  return json_pack("{s:O?, s:s, s:I, s:s, s:[{s:i, s:o, s:s}], s:o}", "id",
                   json_object_get(msg, "id"), "object", "chat.completion",
                   "created", (json_int_t)time(NULL), "model", model, "choices",
                   "index", 0, "message", message, "finish_reason",
                   eg_finish_reason(stop), "usage", eg_usage_json(&u));
}

/* ---- Anthropic stream -> OpenAI deltas ------------------------------- */

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
  } else if (type && strcmp(type, "message_start") == 0) {
    eg_usage_from_anthropic(
        json_object_get(json_object_get(j, "message"), "usage"), &c->usage);
  } else if (type && strcmp(type, "message_delta") == 0) {
    const char *s = json_string_value(
        json_object_get(json_object_get(j, "delta"), "stop_reason"));
    /* message_delta's usage is cumulative: output_tokens replaces the
     * message_start figure */
    eg_usage_from_anthropic(json_object_get(j, "usage"), &c->usage);
    if (s)
      snprintf(c->finish, sizeof c->finish, "%s", eg_finish_reason(s));
  } else if (type && strcmp(type, "message_stop") == 0) {
    c->stream_done = 1;
  } else if (type && strcmp(type, "error") == 0) {
    c->stream_done = -1; /* an error event mid-stream */
  }
}
