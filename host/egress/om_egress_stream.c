/*
 * om_egress_stream.c: a streamed attempt's events (docs/EGRESS.md
 * "Layer A", "Pass-through"): each provider event read (by its facts on
 * an OpenAI route, om_egress_facts.c; else as a tree, Anthropic events
 * through om_egress_translate.c), the stream held until its first content
 * or tool-call delta, then committed to the route: deltas to the call's
 * hooks, or the provider's own events to the raw hook (relayed as sent).
 */
#include <stdlib.h>
#include <string.h>

#include "om_egress_internal.h"
#include "om_sse.h"

#define EG_MAX_HELD ((size_t)4 << 20) /* events held before the commit */

void eg_call_text_append(eg_call_t *c, const char *s, size_t n) {
  if (c->text_len + n + 1 > c->text_cap) {
    size_t cap = (c->text_len + n + 1) * 2;
    char *nb = realloc(c->text, cap);
    if (nb == NULL)
      return;
    c->text = nb;
    c->text_cap = cap;
  }
  memcpy(c->text + c->text_len, s, n);
  c->text_len += n;
  c->text[c->text_len] = '\0';
}

void eg_call_content(eg_call_t *c, const char *s, size_t n) {
  if (n == 0)
    return;
  if (!c->committed) {
    c->committed = 1;
    if (c->hooks.commit)
      c->hooks.commit(c->ud, c);
  }
  eg_call_text_append(c, s, n);
  if (c->hooks.delta)
    c->hooks.delta(c->ud, c, s, n);
}

/* Tool-call deltas count as first content: the stream commits on them. */
void eg_call_tool_calls(eg_call_t *c, json_t *tool_calls) {
  if (!c->committed) {
    c->committed = 1;
    if (c->hooks.commit)
      c->hooks.commit(c->ud, c);
  }
  if (c->hooks.tool_delta)
    c->hooks.tool_delta(c->ud, c, tool_calls);
}

int eg_call_relaying(const eg_call_t *c) {
  return c->hooks.raw != NULL &&
         !eg_route_is_anthropic(&c->cfg->routes[c->cur]);
}

/* One event of a relayed stream: held until the commit (an event with
 * content or tool calls), then the held ones and it go to the raw hook. */
static void relay_event(eg_call_t *c, const char *d, size_t n, int commits) {
  if (!c->committed && !commits) {
    size_t need = c->held_len + sizeof n + n;
    if (need > EG_MAX_HELD)
      return; /* a provider sending empty chunks without end: not kept */
    if (need > c->held_cap) {
      size_t cap = need * 2;
      char *nb = realloc(c->held, cap);
      if (nb == NULL)
        return;
      c->held = nb;
      c->held_cap = cap;
    }
    memcpy(c->held + c->held_len, &n, sizeof n);
    memcpy(c->held + c->held_len + sizeof n, d, n);
    c->held_len = need;
    return;
  }
  if (!c->committed) {
    c->committed = 1;
    if (c->hooks.commit)
      c->hooks.commit(c->ud, c);
    for (size_t off = 0; off + sizeof n <= c->held_len;) {
      size_t len;
      memcpy(&len, c->held + off, sizeof len);
      c->hooks.raw(c->ud, c, c->held + off + sizeof len, len);
      off += sizeof len + len;
    }
    c->held_len = 0;
  }
  c->hooks.raw(c->ud, c, d, n);
}

/* One chunk of an OpenAI stream read from its facts, the way the jansson
 * path below reads it. 0 when it could not be (the scanner was not sure,
 * or tool calls must go to the tool_delta hook as JSON): jansson then. */
static int openai_chunk_fast(eg_call_t *c, const char *d, size_t n) {
  eg_facts_t f;
  if (eg_facts_scan(d, n, 1, &f, &c->scratch, &c->scratch_cap) != 0 ||
      (f.n_tools > 0 && !eg_call_relaying(c)))
    return 0;
  if (f.error) {
    c->stream_done = -1;
  } else if (eg_call_relaying(c)) {
    if (!f.has_usage_key || c->include_usage || f.n_choices > 0)
      relay_event(c, d, n, f.content_len > 0 || f.n_tools > 0);
    if (f.has_content)
      eg_call_text_append(c, f.content, f.content_len);
  } else if (f.has_content) {
    eg_call_content(c, f.content, f.content_len);
  }
  if (f.has_finish)
    snprintf(c->finish, sizeof c->finish, "%s", f.finish);
  eg_facts_usage(&f, &c->usage);
  return 1;
}

int eg_call_sse_event(void *ud, const om_sse_event_t *ev) {
  eg_call_t *c = ud;
  json_t *j;
  const om_route_t *r = &c->cfg->routes[c->cur];
  if (!eg_route_is_anthropic(r) && ev->data_len == 6 &&
      memcmp(ev->data, "[DONE]", 6) == 0) {
    c->stream_done = 1;
    return 0;
  }
  if (!eg_route_is_anthropic(r) && openai_chunk_fast(c, ev->data, ev->data_len))
    return 0;
  j = json_loadb(ev->data, ev->data_len, 0, NULL);
  if (j == NULL)
    return 0;
  if (eg_route_is_anthropic(r)) {
    eg_anthropic_sse_event(c, j);
  } else {
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *delta = json_object_get(ch, "delta");
    json_t *tools = json_object_get(delta, "tool_calls");
    const char *t = json_string_value(json_object_get(delta, "content"));
    const char *f = json_string_value(json_object_get(ch, "finish_reason"));
    json_t *usage = json_object_get(j, "usage");
    int has_tools = json_is_array(tools) && json_array_size(tools) > 0;
    if (json_object_get(j, "error") != NULL) {
      c->stream_done = -1;
    } else if (eg_call_relaying(c)) {
      /* the usage chunk (choices []) the gateway asked for itself is
       * not the caller's */
      if (usage == NULL || c->include_usage ||
          json_array_size(json_object_get(j, "choices")) > 0)
        relay_event(c, ev->data, ev->data_len, (t && *t) || has_tools);
      if (t)
        eg_call_text_append(c, t, strlen(t));
    } else {
      if (t)
        eg_call_content(c, t, strlen(t));
      /* passed through as the provider sent them (OpenAI chat completions
       * streaming: choices[].delta.tool_calls) */
      if (has_tools)
        eg_call_tool_calls(c, tools);
    }
    if (f)
      snprintf(c->finish, sizeof c->finish, "%s", f);
    /* the final chunk of stream_options.include_usage: choices [] */
    eg_usage_from_openai(usage, &c->usage);
  }
  json_decref(j);
  return 0;
}
