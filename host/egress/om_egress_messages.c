/*
 * om_egress_messages.c: POST /v1/messages, the Anthropic Messages API
 * inbound (docs/EGRESS.md "Inbound APIs"). The request is
 * translated to the gateway's internal form (an OpenAI chat request, the
 * one om_egress_translate.c sends to either provider kind), runs the same
 * Layer A as /v1/chat/completions, and the answer comes back as an
 * Anthropic message, or as Anthropic's SSE events when streamed. A field
 * the internal form cannot carry is refused (400 naming it), never
 * dropped.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "om_egress_inbound.h"
#include "om_egress_server.h"
#include "om_errno.h"

/* ---- Anthropic request -> the internal (OpenAI chat) request ------------ */

static int check_text(json_t *v, const char *field, size_t max,
                      eg_in_err_t *e) {
  if (!json_is_string(v))
    return eg_in_refuse(e, "field '%s': a string", field);
  if (json_string_length(v) > max)
    return eg_in_refuse(e, "field '%s': longer than %zu bytes", field, max);
  return 0;
}

/* A text block's text (cache_control and citations have no equivalent). */
static int text_block(json_t *b, const char *field, eg_in_err_t *e) {
  static const char *const keys[] = {"type", "text", NULL};
  char f[160];
  int rc = eg_in_only_keys(b, keys, field, e);
  /* a longer path is cut in the message only (paths are built in 160) */
  if (snprintf(f, sizeof f, "%s.text", field) >= (int)sizeof f)
    f[sizeof f - 1] = '\0';
  return rc ? rc : check_text(json_object_get(b, "text"), f, EG_IN_MAX_TEXT, e);
}

/* The text of a content that may only hold text: a string or text blocks
 * (tool results, system), joined. A new string in *out. */
static int text_content(json_t *c, const char *field, eg_in_err_t *e,
                        json_t **out) {
  size_t i;
  json_t *b;
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
    return eg_in_refuse(e, "field '%s': a string or an array of text blocks",
                        field);
  if (json_array_size(c) > EG_IN_MAX_BLOCKS)
    return eg_in_refuse(e, "field '%s': more than %u blocks", field,
                        (unsigned)EG_IN_MAX_BLOCKS);
  {
    size_t len = 0;
    char *buf = calloc(1, 1);
    if (buf == NULL)
      return OM_ENOMEM;
    json_array_foreach(c, i, b) {
      const char *type = json_string_value(json_object_get(b, "type"));
      const char *t;
      size_t n;
      char *nb;
      int rc;
      snprintf(f, sizeof f, "%s[%zu]", field, i);
      if (!json_is_object(b) || type == NULL || strcmp(type, "text") != 0) {
        free(buf);
        return eg_in_refuse(
            e, "field '%s.type': only text blocks are accepted here", f);
      }
      if ((rc = text_block(b, f, e)) != 0) {
        free(buf);
        return rc;
      }
      t = json_string_value(json_object_get(b, "text"));
      n = strlen(t);
      nb = realloc(buf, len + n + 1);
      if (nb == NULL) {
        free(buf);
        return OM_ENOMEM;
      }
      buf = nb;
      memcpy(buf + len, t, n + 1);
      len += n;
    }
    *out = json_stringn(buf, len);
    free(buf);
  }
  return *out ? 0 : OM_ENOMEM;
}

/* An image block -> an image_url part (base64 source: a data: URL). */
static int image_part(json_t *b, const char *field, eg_in_err_t *e,
                      json_t **out) {
  static const char *const keys[] = {"type", "source", NULL};
  json_t *src = json_object_get(b, "source");
  const char *st = json_string_value(json_object_get(src, "type"));
  int rc = eg_in_only_keys(b, keys, field, e);
  *out = NULL;
  if (rc != 0)
    return rc;
  if (st != NULL && strcmp(st, "base64") == 0) {
    const char *mt = json_string_value(json_object_get(src, "media_type"));
    const char *data = json_string_value(json_object_get(src, "data"));
    char *url;
    size_t n;
    if (mt == NULL || data == NULL || strchr(mt, ';') || strchr(mt, ','))
      return eg_in_refuse(
          e,
          "field '%s.source': a base64 source needs media_type and "
          "data strings",
          field);
    n = strlen(mt) + strlen(data) + 14;
    if ((url = malloc(n)) == NULL)
      return OM_ENOMEM;
    snprintf(url, n, "data:%s;base64,%s", mt, data);
    *out = json_pack("{s:s, s:{s:s}}", "type", "image_url", "image_url", "url",
                     url);
    free(url);
  } else if (st != NULL && strcmp(st, "url") == 0 &&
             json_is_string(json_object_get(src, "url"))) {
    *out = json_pack("{s:s, s:{s:O}}", "type", "image_url", "image_url", "url",
                     json_object_get(src, "url"));
  } else {
    return eg_in_refuse(
        e,
        "field '%s.source.type': \"base64\" or \"url\" (with its "
        "fields)",
        field);
  }
  return *out ? 0 : OM_ENOMEM;
}

/* A user turn: tool_result blocks become tool messages (first, as OpenAI
 * wants them right after the assistant's tool calls), the other blocks
 * one user message. */
static int user_turn(json_t *content, const char *field, eg_in_err_t *e,
                     json_t *msgs) {
  json_t *parts, *b;
  size_t i;
  char f[160];
  int rc = 0;
  if (json_is_string(content)) {
    if (json_string_length(content) > EG_IN_MAX_TEXT)
      return eg_in_refuse(e, "field '%s': longer than %u bytes", field,
                          (unsigned)EG_IN_MAX_TEXT);
    return json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user",
                                                 "content", content))
               ? OM_ENOMEM
               : 0;
  }
  if (!json_is_array(content) || json_array_size(content) == 0)
    return eg_in_refuse(
        e, "field '%s': a string or a non-empty array of blocks", field);
  if (json_array_size(content) > EG_IN_MAX_BLOCKS)
    return eg_in_refuse(e, "field '%s': more than %u blocks", field,
                        (unsigned)EG_IN_MAX_BLOCKS);
  if ((parts = json_array()) == NULL)
    return OM_ENOMEM;
  json_array_foreach(content, i, b) {
    const char *type = json_string_value(json_object_get(b, "type"));
    json_t *p = NULL;
    snprintf(f, sizeof f, "%s[%zu]", field, i);
    if (!json_is_object(b) || type == NULL) {
      rc =
          eg_in_refuse(e, "field '%s': a block object with a string 'type'", f);
    } else if (strcmp(type, "text") == 0) {
      if ((rc = text_block(b, f, e)) == 0)
        p = json_pack("{s:s, s:O}", "type", "text", "text",
                      json_object_get(b, "text"));
    } else if (strcmp(type, "image") == 0) {
      rc = image_part(b, f, e, &p);
    } else if (strcmp(type, "tool_result") == 0) {
      static const char *const keys[] = {"type", "tool_use_id", "content",
                                         "is_error", NULL};
      json_t *id = json_object_get(b, "tool_use_id"), *text = NULL;
      char cf[192];
      snprintf(cf, sizeof cf, "%s.content", f);
      if ((rc = eg_in_only_keys(b, keys, f, e)) != 0)
        break;
      if (!json_is_string(id) || json_string_length(id) == 0 ||
          json_string_length(id) > EG_IN_MAX_ID) {
        rc =
            eg_in_refuse(e, "field '%s.tool_use_id': a string of 1 to %u bytes",
                         f, (unsigned)EG_IN_MAX_ID);
        break;
      }
      if (json_is_true(json_object_get(b, "is_error"))) {
        rc = eg_in_refuse(e,
                          "field '%s.is_error': true has no equivalent in the "
                          "gateway's chat form (say it in the content)",
                          f);
        break;
      }
      if (json_object_get(b, "is_error") != NULL &&
          !json_is_boolean(json_object_get(b, "is_error"))) {
        rc = eg_in_refuse(e, "field '%s.is_error': a boolean", f);
        break;
      }
      if (json_object_get(b, "content") == NULL)
        text = json_string("");
      else if ((rc = text_content(json_object_get(b, "content"), cf, e,
                                  &text)) != 0)
        break;
      if (text == NULL ||
          json_array_append_new(msgs, json_pack("{s:s, s:O, s:o}", "role",
                                                "tool", "tool_call_id", id,
                                                "content", text)) != 0)
        rc = OM_ENOMEM;
      continue;
    } else {
      rc =
          eg_in_refuse(e,
                       "field '%s.type': '%s' is not accepted (text, image and "
                       "tool_result are)",
                       f, type);
    }
    if (rc != 0)
      break;
    if (p == NULL || json_array_append_new(parts, p) != 0) {
      rc = OM_ENOMEM;
      break;
    }
  }
  if (rc == 0 && json_array_size(parts) > 0) {
    json_t *only = json_array_get(parts, 0);
    json_t *c = json_array_size(parts) == 1 &&
                        strcmp(json_string_value(json_object_get(only, "type")),
                               "text") == 0
                    ? json_incref(json_object_get(only, "text"))
                    : json_incref(parts);
    if (json_array_append_new(
            msgs, json_pack("{s:s, s:o}", "role", "user", "content", c)) != 0)
      rc = OM_ENOMEM;
  }
  json_decref(parts);
  return rc;
}

/* An assistant turn: text blocks -> content, tool_use -> tool_calls. */
static int assistant_turn(json_t *content, const char *field, eg_in_err_t *e,
                          json_t *msgs) {
  json_t *calls, *b, *text = NULL, *m;
  size_t i;
  char f[160];
  int rc = 0;
  if (json_is_string(content))
    return text_content(content, field, e, &text) ||
                   json_array_append_new(msgs, json_pack("{s:s, s:o}", "role",
                                                         "assistant", "content",
                                                         text))
               ? OM_ENOMEM
               : 0;
  if (!json_is_array(content))
    return eg_in_refuse(e, "field '%s': a string or an array of blocks", field);
  if (json_array_size(content) > EG_IN_MAX_BLOCKS)
    return eg_in_refuse(e, "field '%s': more than %u blocks", field,
                        (unsigned)EG_IN_MAX_BLOCKS);
  if ((calls = json_array()) == NULL)
    return OM_ENOMEM;
  {
    size_t len = 0;
    char *buf = calloc(1, 1);
    if (buf == NULL) {
      json_decref(calls);
      return OM_ENOMEM;
    }
    json_array_foreach(content, i, b) {
      const char *type = json_string_value(json_object_get(b, "type"));
      snprintf(f, sizeof f, "%s[%zu]", field, i);
      if (!json_is_object(b) || type == NULL) {
        rc = eg_in_refuse(e, "field '%s': a block object with a string 'type'",
                          f);
      } else if (strcmp(type, "text") == 0) {
        if ((rc = text_block(b, f, e)) == 0) {
          const char *t = json_string_value(json_object_get(b, "text"));
          size_t n = strlen(t);
          char *nb = realloc(buf, len + n + 1);
          if (nb == NULL) {
            rc = OM_ENOMEM;
          } else {
            buf = nb;
            memcpy(buf + len, t, n + 1);
            len += n;
          }
        }
      } else if (strcmp(type, "tool_use") == 0) {
        static const char *const keys[] = {"type", "id", "name", "input", NULL};
        json_t *id = json_object_get(b, "id"),
               *name = json_object_get(b, "name");
        json_t *input = json_object_get(b, "input");
        char *args;
        if ((rc = eg_in_only_keys(b, keys, f, e)) != 0)
          break;
        if (!json_is_string(id) || json_string_length(id) == 0 ||
            json_string_length(id) > EG_IN_MAX_ID) {
          rc = eg_in_refuse(e, "field '%s.id': a string of 1 to %u bytes", f,
                            (unsigned)EG_IN_MAX_ID);
          break;
        }
        if (!json_is_string(name) || json_string_length(name) == 0 ||
            json_string_length(name) > EG_IN_MAX_NAME) {
          rc = eg_in_refuse(e, "field '%s.name': a string of 1 to %u bytes", f,
                            (unsigned)EG_IN_MAX_NAME);
          break;
        }
        if (!json_is_object(input)) {
          rc = eg_in_refuse(e, "field '%s.input': an object", f);
          break;
        }
        args = json_dumps(input, JSON_COMPACT);
        if (args == NULL ||
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}",
                                                   "id", id, "type", "function",
                                                   "function", "name", name,
                                                   "arguments", args)) != 0)
          rc = OM_ENOMEM;
        free(args);
      } else {
        rc = eg_in_refuse(
            e,
            "field '%s.type': '%s' is not accepted in an assistant "
            "turn (text and tool_use are)",
            f, type);
      }
      if (rc != 0)
        break;
    }
    if (rc == 0)
      text = len ? json_stringn(buf, len) : json_null();
    free(buf);
  }
  if (rc == 0) {
    m = json_pack("{s:s, s:o}", "role", "assistant", "content", text);
    if (m != NULL && json_array_size(calls) > 0)
      json_object_set(m, "tool_calls", calls);
    if (m == NULL || json_array_append_new(msgs, m) != 0)
      rc = OM_ENOMEM;
  }
  json_decref(calls);
  return rc;
}

static int tr_tools(json_t *in, json_t *out, eg_in_err_t *e) {
  static const char *const keys[] = {"type", "name", "description",
                                     "input_schema", NULL};
  json_t *tools = json_object_get(in, "tools"), *t, *arr;
  size_t i;
  char f[64];
  if (tools == NULL)
    return 0;
  if (!json_is_array(tools))
    return eg_in_refuse(e, "field 'tools': an array");
  if (json_array_size(tools) > EG_IN_MAX_TOOLS)
    return eg_in_refuse(e, "field 'tools': more than %u tools",
                        (unsigned)EG_IN_MAX_TOOLS);
  if ((arr = json_array()) == NULL || json_object_set_new(out, "tools", arr))
    return OM_ENOMEM;
  json_array_foreach(tools, i, t) {
    const char *type = json_string_value(json_object_get(t, "type"));
    json_t *name = json_object_get(t, "name"), *fn;
    json_t *desc = json_object_get(t, "description");
    json_t *schema = json_object_get(t, "input_schema");
    int rc;
    snprintf(f, sizeof f, "tools[%zu]", i);
    if (!json_is_object(t))
      return eg_in_refuse(e, "field '%s': an object", f);
    if (json_object_get(t, "type") != NULL &&
        (type == NULL || strcmp(type, "custom") != 0))
      return eg_in_refuse(
          e,
          "field '%s.type': only client tools (\"custom\" or no "
          "type) are accepted",
          f);
    if ((rc = eg_in_only_keys(t, keys, f, e)) != 0)
      return rc;
    if (!json_is_string(name) || json_string_length(name) == 0 ||
        json_string_length(name) > EG_IN_MAX_NAME)
      return eg_in_refuse(e, "field '%s.name': a string of 1 to %u bytes", f,
                          (unsigned)EG_IN_MAX_NAME);
    if (desc != NULL && !json_is_string(desc))
      return eg_in_refuse(e, "field '%s.description': a string", f);
    if (!json_is_object(schema))
      return eg_in_refuse(e, "field '%s.input_schema': an object", f);
    fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
    if (fn != NULL && desc != NULL)
      json_object_set(fn, "description", desc);
    if (fn == NULL ||
        json_array_append_new(
            arr, json_pack("{s:s, s:o}", "type", "function", "function", fn)))
      return OM_ENOMEM;
  }
  return 0;
}

static int tr_tool_choice(json_t *in, json_t *out, eg_in_err_t *e) {
  static const char *const keys[] = {"type", "name",
                                     "disable_parallel_tool_use", NULL};
  json_t *tc = json_object_get(in, "tool_choice"), *v = NULL;
  json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
  const char *type = json_string_value(json_object_get(tc, "type"));
  int rc;
  if (tc == NULL)
    return 0;
  if (!json_is_object(tc) || type == NULL)
    return eg_in_refuse(e,
                        "field 'tool_choice': an object with a string 'type'");
  if ((rc = eg_in_only_keys(tc, keys, "tool_choice", e)) != 0)
    return rc;
  if (dp != NULL && !json_is_boolean(dp))
    return eg_in_refuse(e, "field 'tool_choice.disable_parallel_tool_use': a "
                           "boolean");
  if (strcmp(type, "auto") == 0)
    v = json_string("auto");
  else if (strcmp(type, "any") == 0)
    v = json_string("required");
  else if (strcmp(type, "none") == 0)
    v = json_string("none");
  else if (strcmp(type, "tool") == 0 &&
           json_is_string(json_object_get(tc, "name")))
    v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
                  json_object_get(tc, "name"));
  else
    return eg_in_refuse(e,
                        "field 'tool_choice.type': \"auto\", \"any\", \"none\" "
                        "or \"tool\" with a name");
  if (v == NULL || json_object_set_new(out, "tool_choice", v) != 0)
    return OM_ENOMEM;
  if (json_is_true(dp) &&
      json_object_set_new(out, "parallel_tool_calls", json_false()) != 0)
    return OM_ENOMEM;
  return 0;
}

static int tr_scalars(json_t *in, json_t *out, eg_in_err_t *e) {
  json_t *v;
  const char *num[] = {"temperature", "top_p"};
  v = json_object_get(in, "max_tokens");
  if (!json_is_integer(v) || json_integer_value(v) < 1)
    return eg_in_refuse(e,
                        "field 'max_tokens': a positive integer is required");
  json_object_set(out, "max_tokens", v);
  for (size_t i = 0; i < 2; i++) {
    v = json_object_get(in, num[i]);
    if (v == NULL)
      continue;
    if (!json_is_number(v) || json_number_value(v) < 0 ||
        json_number_value(v) > 1)
      return eg_in_refuse(e, "field '%s': a number from 0 to 1", num[i]);
    json_object_set(out, num[i], v);
  }
  v = json_object_get(in, "stop_sequences");
  if (v != NULL) {
    size_t i;
    json_t *s;
    if (!json_is_array(v) || json_array_size(v) > EG_IN_MAX_STOP)
      return eg_in_refuse(
          e, "field 'stop_sequences': an array of at most %u strings",
          (unsigned)EG_IN_MAX_STOP);
    json_array_foreach(v, i, s) {
      char f[48];
      int rc;
      snprintf(f, sizeof f, "stop_sequences[%zu]", i);
      if ((rc = check_text(s, f, EG_IN_MAX_NAME, e)) != 0)
        return rc;
    }
    if (json_array_size(v) > 0)
      json_object_set(out, "stop", v);
  }
  v = json_object_get(in, "stream");
  if (v != NULL && !json_is_boolean(v))
    return eg_in_refuse(e, "field 'stream': a boolean");
  if (json_is_true(v))
    json_object_set_new(out, "stream", json_true());
  v = json_object_get(in, "metadata");
  if (v != NULL) {
    static const char *const keys[] = {"user_id", NULL};
    int rc;
    if (!json_is_object(v))
      return eg_in_refuse(e, "field 'metadata': an object");
    if ((rc = eg_in_only_keys(v, keys, "metadata", e)) != 0)
      return rc;
    if (json_object_get(v, "user_id") != NULL) {
      if ((rc = check_text(json_object_get(v, "user_id"), "metadata.user_id",
                           EG_IN_MAX_ID, e)) != 0)
        return rc;
      json_object_set(out, "user", json_object_get(v, "user_id"));
    }
  }
  return 0;
}

int eg_messages_to_chat(json_t *in, json_t **out, char *why, size_t whylen) {
  static const char *const keys[] = {
      "model",       "messages", "system",         "max_tokens",
      "temperature", "top_p",    "stop_sequences", "stream",
      "metadata",    "tools",    "tool_choice",    NULL};
  eg_in_err_t e = {why, whylen};
  json_t *o, *msgs, *m, *sys = json_object_get(in, "system");
  size_t i;
  int rc;
  char f[48];
  *out = NULL;
  if ((rc = eg_in_only_keys(in, keys, "", &e)) != 0)
    return rc;
  if ((rc = check_text(json_object_get(in, "model"), "model", EG_IN_MAX_NAME,
                       &e)) != 0)
    return rc;
  m = json_object_get(in, "messages");
  if (!json_is_array(m) || json_array_size(m) == 0)
    return eg_in_refuse(&e, "field 'messages': a non-empty array is required");
  if (json_array_size(m) > EG_IN_MAX_MESSAGES)
    return eg_in_refuse(&e, "field 'messages': more than %u messages",
                        (unsigned)EG_IN_MAX_MESSAGES);
  if ((o = json_object()) == NULL || (msgs = json_array()) == NULL) {
    json_decref(o);
    return OM_ENOMEM;
  }
  json_object_set_new(o, "messages", msgs);
  json_object_set(o, "model", json_object_get(in, "model"));
  if (sys != NULL) {
    json_t *t = NULL;
    rc = text_content(sys, "system", &e, &t);
    if (rc == 0 && json_string_length(t) > 0)
      json_array_append_new(
          msgs, json_pack("{s:s, s:o}", "role", "system", "content", t));
    else
      json_decref(t);
  }
  json_array_foreach(json_object_get(in, "messages"), i, m) {
    static const char *const mkeys[] = {"role", "content", NULL};
    const char *role = json_string_value(json_object_get(m, "role"));
    if (rc != 0)
      break;
    snprintf(f, sizeof f, "messages[%zu]", i);
    if (!json_is_object(m)) {
      rc = eg_in_refuse(&e, "field '%s': an object", f);
      break;
    }
    if ((rc = eg_in_only_keys(m, mkeys, f, &e)) != 0)
      break;
    snprintf(f, sizeof f, "messages[%zu].content", i);
    if (role != NULL && strcmp(role, "user") == 0)
      rc = user_turn(json_object_get(m, "content"), f, &e, msgs);
    else if (role != NULL && strcmp(role, "assistant") == 0)
      rc = assistant_turn(json_object_get(m, "content"), f, &e, msgs);
    else
      rc = eg_in_refuse(
          &e, "field 'messages[%zu].role': \"user\" or \"assistant\"", i);
  }
  if (rc == 0)
    rc = tr_scalars(in, o, &e);
  if (rc == 0)
    rc = tr_tools(in, o, &e);
  if (rc == 0)
    rc = tr_tool_choice(in, o, &e);
  if (rc != 0) {
    json_decref(o);
    return rc;
  }
  *out = o;
  return 0;
}

/* ---- the answer: chat.completion -> Anthropic message ------------------ */

const char *eg_stop_reason(const char *finish) {
  if (finish == NULL || strcmp(finish, "stop") == 0)
    return "end_turn";
  if (strcmp(finish, "length") == 0)
    return "max_tokens";
  if (strcmp(finish, "tool_calls") == 0)
    return "tool_use";
  if (strcmp(finish, "content_filter") == 0)
    return "refusal";
  return "end_turn";
}

/* Anthropic's usage from the call's (OpenAI's prompt counts the cached
 * part; Anthropic's input_tokens does not). */
static json_t *anthropic_usage(const eg_usage_t *u) {
  return json_pack("{s:I, s:I, s:I}", "input_tokens",
                   (json_int_t)(u->prompt - u->cached), "output_tokens",
                   (json_int_t)u->completion, "cache_read_input_tokens",
                   (json_int_t)u->cached);
}

json_t *eg_chat_to_message(json_t *comp, const char *id, const char *model) {
  json_t *ch = json_array_get(json_object_get(comp, "choices"), 0);
  json_t *msg = json_object_get(ch, "message"), *tc;
  json_t *content = json_array();
  const char *text = json_string_value(json_object_get(msg, "content"));
  const char *finish = json_string_value(json_object_get(ch, "finish_reason"));
  eg_usage_t u = {0};
  size_t i;
  if (content == NULL)
    return NULL;
  if (text != NULL && *text)
    json_array_append_new(
        content, json_pack("{s:s, s:s}", "type", "text", "text", text));
  json_array_foreach(json_object_get(msg, "tool_calls"), i, tc) {
    json_t *fn = json_object_get(tc, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    json_t *input = args ? json_loads(args, 0, NULL) : NULL;
    if (!json_is_object(input)) {
      json_decref(input);
      input = json_object();
    }
    json_array_append_new(
        content, json_pack("{s:s, s:O?, s:O?, s:o}", "type", "tool_use", "id",
                           json_object_get(tc, "id"), "name",
                           json_object_get(fn, "name"), "input", input));
  }
  eg_usage_from_openai(json_object_get(comp, "usage"), &u);
  return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:n, s:o}", "id", id, "type",
                   "message", "role", "assistant", "model", model, "content",
                   content, "stop_reason", eg_stop_reason(finish),
                   "stop_sequence", "usage", anthropic_usage(&u));
}

/* ---- the stream: Anthropic's events ------------------------------------ */

typedef struct {
  int open;      /* the content block open now; -1: none */
  int next;      /* the next block's index */
  int open_text; /* the open block is text */
  /* the block index of each OpenAI tool-call index */
  int tool_block[EG_MAX_STREAM_TOOLS];
  size_t n_tools;
} msg_stream_t;

static void block_stop(chat_t *ch, msg_stream_t *s) {
  if (s->open < 0)
    return;
  eg_sse_write(
      ch->req,
      json_pack("{s:s, s:i}", "type", "content_block_stop", "index", s->open),
      "content_block_stop");
  s->open = -1;
}

static int block_start(chat_t *ch, msg_stream_t *s, json_t *block, int text) {
  block_stop(ch, s);
  s->open = s->next++;
  s->open_text = text;
  eg_sse_write(ch->req,
               json_pack("{s:s, s:i, s:o}", "type", "content_block_start",
                         "index", s->open, "content_block", block),
               "content_block_start");
  return s->open;
}

static void msg_commit(void *ud, eg_call_t *c) {
  chat_t *ch = ud;
  if (ch->req == NULL)
    return;
  eg_sse_start(ch);
  eg_sse_write(ch->req,
               json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}}",
                         "type", "message_start", "message", "id", ch->id,
                         "type", "message", "role", "assistant", "model",
                         c->route_model, "content", "stop_reason",
                         "stop_sequence", "usage", anthropic_usage(&c->usage)),
               "message_start");
}

static void msg_delta(void *ud, eg_call_t *c, const char *text, size_t len) {
  chat_t *ch = ud;
  msg_stream_t *s = ch->st;
  (void)c;
  if (ch->req == NULL)
    return;
  if (s->open < 0 || !s->open_text)
    block_start(ch, s, json_pack("{s:s, s:s}", "type", "text", "text", ""), 1);
  eg_sse_write(ch->req,
               json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type",
                         "content_block_delta", "index", s->open, "delta",
                         "type", "text_delta", "text", text, len),
               "content_block_delta");
}

static void msg_tool_delta(void *ud, eg_call_t *c, json_t *tool_calls) {
  chat_t *ch = ud;
  msg_stream_t *s = ch->st;
  json_t *t;
  size_t i;
  (void)c;
  if (ch->req == NULL)
    return;
  json_array_foreach(tool_calls, i, t) {
    json_int_t idx = json_integer_value(json_object_get(t, "index"));
    json_t *fn = json_object_get(t, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    int block = -1;
    if (json_object_get(t, "id") != NULL ||
        json_object_get(fn, "name") != NULL) {
      if (s->n_tools == EG_MAX_STREAM_TOOLS || idx < 0)
        continue;
      block =
          block_start(ch, s,
                      json_pack("{s:s, s:O?, s:O?, s:{}}", "type", "tool_use",
                                "id", json_object_get(t, "id"), "name",
                                json_object_get(fn, "name"), "input"),
                      0);
      s->tool_block[s->n_tools++] = block;
    } else if (idx >= 0 && (size_t)idx < s->n_tools) {
      block = s->tool_block[idx];
    }
    if (block >= 0 && args != NULL && *args)
      eg_sse_write(ch->req,
                   json_pack("{s:s, s:i, s:{s:s, s:s}}", "type",
                             "content_block_delta", "index", block, "delta",
                             "type", "input_json_delta", "partial_json", args),
                   "content_block_delta");
  }
}

/* message_delta (stop reason, usage) and message_stop; or, failed after
 * commit, Anthropic's error event. */
static void msg_stream_end(chat_t *ch, eg_call_t *c) {
  om_http_request_t *req = ch->req;
  if (c->ok) {
    block_stop(ch, ch->st);
    eg_sse_write(req,
                 json_pack("{s:s, s:{s:s, s:n}, s:o}", "type", "message_delta",
                           "delta", "stop_reason",
                           eg_stop_reason(c->finish[0] ? c->finish : NULL),
                           "stop_sequence", "usage",
                           anthropic_usage(&c->usage)),
                 "message_delta");
    eg_sse_write(req, json_pack("{s:s}", "type", "message_stop"),
                 "message_stop");
  } else {
    eg_sse_write(req,
                 json_pack("{s:s, s:{s:s, s:s, s:s}}", "type", "error", "error",
                           "type", "api_error", "message",
                           "The response was interrupted.", "reason",
                           "stream_interrupted"),
                 "error");
  }
}

static json_t *msg_whole(chat_t *ch, eg_call_t *c) {
  return eg_chat_to_message(c->result, ch->id, c->route_model);
}

static void msg_done(void *ud, eg_call_t *c) {
  eg_chat_finish(ud, c, msg_stream_end, msg_whole);
}

void eg_handle_messages(om_egress_t *g, om_http_request_t *req) {
  json_t *body, *chat;
  msg_stream_t *s;
  eg_hooks_t hooks = {.commit = msg_commit,
                      .delta = msg_delta,
                      .done = msg_done,
                      .tool_delta = msg_tool_delta};
  if (eg_inbound_chat(g, req, EG_API_MESSAGES, eg_messages_to_chat, &body,
                      &chat) != 0)
    return;
  s = calloc(1, sizeof *s);
  if (s == NULL) {
    json_decref(body);
    json_decref(chat);
    eg_respond_api_error(req, EG_API_MESSAGES, 503, "overloaded",
                         "out of memory", 0, NULL);
    return;
  }
  s->open = -1;
  eg_chat_run(g, req, EG_API_MESSAGES, chat, NULL,
              json_string_value(json_object_get(body, "model")), &hooks, s,
              free);
  json_decref(chat);
  json_decref(body);
}
