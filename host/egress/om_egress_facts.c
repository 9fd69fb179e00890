/*
 * om_egress_facts.c: what the call reads of an OpenAI route's answer (a
 * chat.completion or one chunk of its stream), without building a tree
 * (docs/EGRESS.md "Pass-through").
 *
 * The pass-through relays the provider's bytes; the call still needs a
 * few facts from them: the first choice's content and finish reason,
 * whether it carries tool calls, the usage, an error member. jansson
 * spends ~250 instructions per byte building a tree for that (most of the
 * gateway's own CPU per call); core/om_json.h proves the document is
 * one jansson would accept and hands over the values by path. Each fact
 * reads as the jansson path reads it (json_object_get, json_array_get,
 * json_string_value, json_is_integer), so both paths agree on every
 * document the scanner accepts; anything else goes to jansson.
 */
#include <stdlib.h>
#include <string.h>

#include "om_egress_internal.h"
#include "om_errno.h"
#include "om_json.h"

typedef struct facts_scan_s {
  eg_facts_t *f;
  const char *msg; /* "delta" (a chunk) or "message" (a completion) */
  size_t msg_len;
  const char *content;
  size_t content_len;
} facts_scan_t;

static int key_is(const om_json_seg_t *s, const char *k, size_t n) {
  return s->key != NULL && s->key_len == n && memcmp(s->key, k, n) == 0;
}

#define KEY_IS(seg, lit) key_is((seg), lit, sizeof lit - 1)

static int facts_int(const om_json_ev_t *ev, int64_t *v) {
  return ev->type == OM_JSON_NUMBER && om_json_int(ev->text, ev->len, v) == 0;
}

static int on_value(void *ud, const om_json_ev_t *ev) {
  facts_scan_t *s = ud;
  eg_facts_t *f = s->f;
  const om_json_seg_t *p = ev->path;
  if (ev->type == OM_JSON_END || ev->depth == 0)
    return 0;
  if (ev->depth == 1) {
    if (KEY_IS(&p[0], "error"))
      f->error = 1; /* any value, as json_object_get sees it */
    else if (KEY_IS(&p[0], "usage"))
      f->has_usage_key = 1;
    return 0;
  }
  if (KEY_IS(&p[0], "usage") && p[1].key != NULL) {
    int64_t v;
    if (ev->depth == 2 && KEY_IS(&p[1], "prompt_tokens") && facts_int(ev, &v))
      f->usage.prompt = v, f->usage.has = 1, f->has_prompt_tokens = 1;
    else if (ev->depth == 2 && KEY_IS(&p[1], "completion_tokens") &&
             facts_int(ev, &v))
      f->usage.completion = v, f->usage.has = 1, f->has_completion_tokens = 1;
    else if (ev->depth == 3 && KEY_IS(&p[1], "prompt_tokens_details") &&
             p[2].key != NULL && KEY_IS(&p[2], "cached_tokens") &&
             facts_int(ev, &v))
      f->usage.cached = v, f->has_cached = 1;
    return 0;
  }
  if (!KEY_IS(&p[0], "choices") || p[1].key != NULL)
    return 0;
  if (ev->depth == 2) {
    f->n_choices = p[1].index + 1;
    return 0;
  }
  if (p[1].index != 0 || p[2].key == NULL)
    return 0;
  if (ev->depth == 3) {
    if (KEY_IS(&p[2], "finish_reason") && ev->type == OM_JSON_STRING) {
      size_t n =
          om_json_string(ev->text, ev->len, f->finish, sizeof f->finish - 1);
      f->finish[n < sizeof f->finish ? n : sizeof f->finish - 1] = '\0';
      f->has_finish = 1;
    }
    return 0;
  }
  if (!key_is(&p[2], s->msg, s->msg_len) || p[3].key == NULL)
    return 0;
  if (ev->depth == 4 && KEY_IS(&p[3], "content") &&
      ev->type == OM_JSON_STRING) {
    s->content = ev->text;
    s->content_len = ev->len;
  } else if (ev->depth == 5 && KEY_IS(&p[3], "tool_calls") &&
             p[4].key == NULL) {
    f->n_tools = p[4].index + 1;
  }
  return 0;
}

void eg_facts_usage(const eg_facts_t *f, eg_usage_t *u) {
  if (f->has_prompt_tokens)
    u->prompt = f->usage.prompt, u->has = 1;
  if (f->has_completion_tokens)
    u->completion = f->usage.completion, u->has = 1;
  if (f->has_cached)
    u->cached = f->usage.cached;
}

int eg_facts_scan(const char *text, size_t len, int chunk, eg_facts_t *f,
                  char **scratch, size_t *cap) {
  facts_scan_t s = {f, chunk ? "delta" : "message", chunk ? 5u : 7u, NULL, 0};
  memset(f, 0, sizeof *f);
  if (len == 0 || text[0] != '{' ||
      om_json_scan(text, len, on_value, &s, NULL) != OM_JSON_OK)
    return OM_EPARSE;
  if (s.content != NULL) {
    size_t n = om_json_string(s.content, s.content_len, *scratch, *cap);
    if (n >= *cap) {
      char *nb = realloc(*scratch, n + 1);
      if (nb == NULL)
        return OM_ENOMEM;
      *scratch = nb;
      *cap = n + 1;
      n = om_json_string(s.content, s.content_len, *scratch, *cap);
    }
    (*scratch)[n] = '\0';
    f->content = *scratch;
    f->content_len = n;
    f->has_content = 1;
  }
  return 0;
}

/* ---- the caller's chat request -------------------------------------- */

typedef struct req_scan_s {
  eg_req_facts_t *f;
  const char *base;
  int role_seen; /* the message in hand has a string role */
  int bad;
} req_scan_t;

static int on_request_value(void *ud, const om_json_ev_t *ev) {
  req_scan_t *s = ud;
  eg_req_facts_t *f = s->f;
  const om_json_seg_t *p = ev->path;
  if (ev->depth == 0)
    return 0;
  if (ev->depth == 1) {
    eg_req_member_t *m;
    int kind = KEY_IS(&p[0], "model")            ? EG_REQ_MODEL
               : KEY_IS(&p[0], "stream")         ? EG_REQ_STREAM
               : KEY_IS(&p[0], "stream_options") ? EG_REQ_STREAM_OPTIONS
               : KEY_IS(&p[0], "messages")       ? EG_REQ_MESSAGES
                                                 : EG_REQ_OTHER;
    if (ev->type == OM_JSON_END) { /* a container member ends here */
      f->members[f->n_members - 1].end = (size_t)(ev->text + ev->len - s->base);
      if (kind == EG_REQ_MESSAGES && f->n_messages == 0)
        s->bad = 1;
      return 0;
    }
    if (f->n_members == EG_REQ_MAX_MEMBERS) {
      s->bad = 1; /* the tree path copes with any number */
      return 1;
    }
    m = &f->members[f->n_members++];
    m->kind = kind;
    m->start = (size_t)(p[0].key - 1 - s->base); /* its name's quote */
    m->end = (size_t)(ev->text + ev->len - s->base);
    switch (kind) {
    case EG_REQ_MODEL:
      if (ev->type != OM_JSON_STRING)
        s->bad = 1;
      f->model_at = (size_t)(ev->text - s->base);
      f->model_len = ev->len;
      f->has_model = 1;
      break;
    case EG_REQ_STREAM:
      if (ev->type != OM_JSON_TRUE && ev->type != OM_JSON_FALSE)
        s->bad = 1;
      f->stream = ev->type == OM_JSON_TRUE;
      break;
    case EG_REQ_STREAM_OPTIONS:
      f->so_object = ev->type == OM_JSON_OBJECT;
      break;
    case EG_REQ_MESSAGES:
      if (ev->type != OM_JSON_ARRAY)
        s->bad = 1;
      break;
    default:
      break;
    }
    return s->bad;
  }
  if (KEY_IS(&p[0], "stream_options")) {
    if (ev->depth == 2 && KEY_IS(&p[1], "include_usage"))
      f->include_usage = ev->type == OM_JSON_TRUE;
    return 0;
  }
  if (!KEY_IS(&p[0], "messages"))
    return 0;
  if (ev->depth == 2) { /* one message: an object with a string role */
    if (ev->type == OM_JSON_OBJECT) {
      s->role_seen = 0;
      f->n_messages++;
    } else if (ev->type == OM_JSON_END) {
      s->bad = !s->role_seen;
    } else {
      s->bad = 1;
    }
  } else if (ev->depth == 3 && KEY_IS(&p[2], "role")) {
    s->role_seen = ev->type == OM_JSON_STRING;
  }
  return s->bad;
}

int eg_request_scan(const char *text, size_t len, eg_req_facts_t *f) {
  req_scan_t s = {f, text, 0, 0};
  memset(f, 0, sizeof *f);
  if (len == 0 || text[0] != '{' ||
      om_json_scan(text, len, on_request_value, &s, NULL) != OM_JSON_OK ||
      s.bad)
    return OM_EPARSE;
  for (size_t i = 0; i < f->n_members; i++)
    if (f->members[i].kind == EG_REQ_MESSAGES)
      return f->n_messages > 0 ? 0 : OM_EPARSE;
  return OM_EPARSE; /* no messages: the tree path says so */
}

/* s as a JSON string (quotes included) at out; the bytes written. */
static size_t json_quote(const char *s, char *out) {
  static const char hex[] = "0123456789abcdef";
  size_t n = 0;
  out[n++] = '"';
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      out[n++] = '\\';
      out[n++] = (char)ch;
    } else if (ch < 0x20) {
      memcpy(out + n, "\\u00", 4);
      out[n + 4] = hex[ch >> 4];
      out[n + 5] = hex[ch & 15];
      n += 6;
    } else {
      out[n++] = (char)ch;
    }
  }
  out[n++] = '"';
  return n;
}

char *eg_openai_body(const char *text, const eg_req_facts_t *f,
                     const char *model, int stream, size_t *out_len) {
  static const char so_usage[] = "\"stream_options\":{\"include_usage\":true}";
  size_t cap = f->members[f->n_members - 1].end + 6 * strlen(model) +
               sizeof so_usage + 64;
  char *out = malloc(cap), *w;
  if (out == NULL)
    return NULL;
  w = out;
  w += sprintf(w, "{\"model\":");
  w += json_quote(model, w);
  if (stream) {
    memcpy(w, ",\"stream\":true,", 15);
    w += 15;
    memcpy(w, so_usage, sizeof so_usage - 1);
    w += sizeof so_usage - 1;
  }
  for (size_t i = 0; i < f->n_members; i++) {
    const eg_req_member_t *m = &f->members[i];
    if (m->kind == EG_REQ_MODEL || m->kind == EG_REQ_STREAM ||
        m->kind == EG_REQ_STREAM_OPTIONS)
      continue;
    *w++ = ',';
    memcpy(w, text + m->start, m->end - m->start);
    w += m->end - m->start;
  }
  *w++ = '}';
  *out_len = (size_t)(w - out);
  return out;
}
