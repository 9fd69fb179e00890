/*
 * test_egress_translate.c: the OpenAI chat <-> Anthropic messages
 * translation of host/egress/om_egress_translate.c, function by function:
 * requests (tool turns, merging, images, sampling fields, refusals naming
 * the field), answers (content, tool calls, finish reasons, usage) and
 * stream events (deltas, usage, finish). The wire-level checks against the
 * faithful fake provider are in spec/03-integration/egress_spec.lua.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "om_egress_internal.h"
#include "om_errno.h"

static om_route_t ROUTE = {.name = "r",
                           .provider = "anthropic",
                           .base_url = "http://127.0.0.1:1/v1",
                           .model = "claude-x"};

/* Assert that got (borrowed) equals the JSON text want, printing both. */
static void assert_json(json_t *got, const char *want_text) {
  json_error_t err;
  json_t *want = json_loads(want_text, JSON_DECODE_ANY, &err);
  char *g, *w;
  if (want == NULL)
    fail_msg("bad expected JSON (%s): %s", err.text, want_text);
  if (!json_equal(got, want)) {
    g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    w = json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    fail_msg("JSON differs:\n got  %s\n want %s", g ? g : "(null)",
             w ? w : "(null)");
  }
  json_decref(want);
}

/* eg_to_anthropic of the JSON text req; fails the test on refusal. */
static json_t *translate(const char *req_text, int stream) {
  json_t *req = json_loads(req_text, 0, NULL), *out = NULL;
  char why[256];
  int rc;
  assert_non_null(req);
  rc = eg_to_anthropic(req, &ROUTE, stream, &out, why, sizeof why);
  if (rc != 0)
    fail_msg("refused (%d): %s", rc, why);
  json_decref(req);
  return out;
}

static void tool_loop_becomes_tool_blocks(void **state) {
  json_t *out = translate(
      "{\"model\":\"any\",\"messages\":["
      "{\"role\":\"system\",\"content\":\"Be brief.\"},"
      "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":"
      "\"Use tools.\"}]},"
      "{\"role\":\"user\",\"content\":\"Where is 12?\"},"
      "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
      "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
      "\"lookup\",\"arguments\":\"{\\\"id\\\":12}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"shipped\"},"
      "{\"role\":\"user\",\"content\":\"Thanks. And?\"},"
      "{\"role\":\"assistant\",\"content\":\"\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"lookup\","
      "\"description\":\"Find.\",\"parameters\":{\"type\":\"object\"}}},"
      "{\"type\":\"function\",\"function\":{\"name\":\"bare\"}}]}",
      1);
  (void)state;
  assert_json(
      out,
      "{\"model\":\"claude-x\",\"max_tokens\":1024,\"stream\":true,"
      "\"system\":\"Be brief.\\nUse tools.\",\"messages\":["
      "{\"role\":\"user\",\"content\":\"Where is 12?\"},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":"
      "\"call_1\",\"name\":\"lookup\",\"input\":{\"id\":12}}]},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
      "\"tool_use_id\":\"call_1\",\"content\":\"shipped\"},{\"type\":\"text\","
      "\"text\":\"Thanks. And?\"}]}],"
      "\"tools\":[{\"name\":\"lookup\",\"description\":\"Find.\","
      "\"input_schema\":{\"type\":\"object\"}},{\"name\":\"bare\","
      "\"input_schema\":{\"type\":\"object\"}}]}");
  json_decref(out);
}

static void tool_result_goes_before_user_text(void **state) {
  /* a user message first, then a tool result: Anthropic wants the
   * tool_result blocks first in the turn */
  json_t *out = translate(
      "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
      "{\"role\":\"assistant\",\"content\":\"Checking.\",\"tool_calls\":["
      "{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\","
      "\"arguments\":\"\"}}]},"
      "{\"role\":\"user\",\"content\":\"b\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"r\"}]}",
      0);
  (void)state;
  assert_json(json_object_get(out, "messages"),
              "[{\"role\":\"user\",\"content\":\"a\"},"
              "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\","
              "\"text\":\"Checking.\"},{\"type\":\"tool_use\",\"id\":\"c\","
              "\"name\":\"f\",\"input\":{}}]},"
              "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
              "\"tool_use_id\":\"c\",\"content\":\"r\"},{\"type\":\"text\","
              "\"text\":\"b\"}]}]");
  json_decref(out);
}

static void images_and_sampling(void **state) {
  json_t *out = translate(
      "{\"messages\":[{\"role\":\"user\",\"content\":["
      "{\"type\":\"text\",\"text\":\"see\"},"
      "{\"type\":\"image_url\",\"image_url\":{\"url\":"
      "\"data:image/jpeg;base64,AAAA\"}},"
      "{\"type\":\"image_url\",\"image_url\":{\"url\":"
      "\"https://x.test/a.png\"}}]}],"
      "\"stop\":\"END\",\"top_p\":0.9,\"temperature\":0,"
      "\"max_completion_tokens\":50,\"tool_choice\":\"required\","
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
      "\"parallel_tool_calls\":false,\"user\":\"u\","
      "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
      "\"name\":\"n\",\"schema\":{\"type\":\"object\"}}}}",
      0);
  const char *sys = json_string_value(json_object_get(out, "system"));
  (void)state;
  assert_json(json_object_get(out, "messages"),
              "[{\"role\":\"user\",\"content\":["
              "{\"type\":\"text\",\"text\":\"see\"},"
              "{\"type\":\"image\",\"source\":{\"type\":\"base64\","
              "\"media_type\":\"image/jpeg\",\"data\":\"AAAA\"}},"
              "{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":"
              "\"https://x.test/a.png\"}}]}]");
  assert_json(json_object_get(out, "stop_sequences"), "[\"END\"]");
  assert_json(json_object_get(out, "top_p"), "0.9");
  assert_json(json_object_get(out, "temperature"), "0");
  assert_json(json_object_get(out, "max_tokens"), "50");
  assert_json(json_object_get(out, "tool_choice"),
              "{\"type\":\"any\",\"disable_parallel_tool_use\":true}");
  assert_json(json_object_get(out, "metadata"), "{\"user_id\":\"u\"}");
  assert_non_null(sys);
  assert_non_null(strstr(sys, "one JSON object"));
  assert_non_null(strstr(sys, "{\"type\":\"object\"}"));
  json_decref(out);
}

static void refusals_name_the_field(void **state) {
  static const struct {
    const char *req, *field;
  } cases[] = {
      {"{\"n\":3}", "'n'"},
      {"{\"logprobs\":true}", "'logprobs'"},
      {"{\"seed\":1}", "'seed'"},
      {"{\"presence_penalty\":0.1}", "'presence_penalty'"},
      {"{\"temperature\":1.2}", "'temperature'"},
      {"{\"top_p\":\"x\"}", "'top_p'"},
      {"{\"stop\":[1]}", "'stop[0]'"},
      {"{\"max_tokens\":0}", "'max_tokens'"},
      {"{\"tools\":{}}", "'tools'"},
      {"{\"tools\":[{\"type\":\"function\",\"function\":{}}]}",
       "'tools[0].function.name'"},
      {"{\"tool_choice\":{\"type\":\"function\"}}", "'tool_choice'"},
      {"{\"parallel_tool_calls\":1}", "'parallel_tool_calls'"},
      {"{\"response_format\":{\"type\":\"json_schema\"}}",
       "'response_format.json_schema.schema'"},
      {"{\"user\":5}", "'user'"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *req = json_loads(cases[i].req, 0, NULL), *out = NULL;
    char why[256] = "";
    assert_non_null(req);
    json_object_set_new(
        req, "messages",
        json_pack("[{s:s, s:s}]", "role", "user", "content", "hi"));
    OM_ASSERT_CMP(eg_to_anthropic(req, &ROUTE, 0, &out, why, sizeof why), ==,
                  OM_EINVAL);
    assert_null(out);
    if (strstr(why, cases[i].field) == NULL)
      fail_msg("case %s: '%s' does not name %s", cases[i].req, why,
               cases[i].field);
    json_decref(req);
  }
}

static void refusals_in_messages(void **state) {
  static const struct {
    const char *msgs, *field;
  } cases[] = {
      {"[{\"role\":\"user\",\"content\":[{\"type\":\"file\"}]}]",
       "'messages[0].content[0].type'"},
      {"[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
       "\"image_url\":{\"url\":\"data:image/png,raw\"}}]}]",
       "'messages[0].content[0].image_url.url'"},
      {"[{\"role\":\"system\",\"content\":[{\"type\":\"image_url\"}]}]",
       "'messages[0].content[0]'"},
      {"[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
       "\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"f\","
       "\"arguments\":\"[1]\"}}]}]",
       "'messages[1].tool_calls[0].function.arguments'"},
      {"[{\"role\":\"tool\",\"content\":\"r\"}]", "'messages[0].tool_call_id'"},
      {"[{\"role\":\"function\",\"content\":\"r\"}]", "'messages[0].role'"},
      {"[{\"role\":\"user\",\"content\":5}]", "'messages[0].content'"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *req = json_pack("{s:o}", "messages",
                            json_loads(cases[i].msgs, 0, NULL)),
           *out = NULL;
    char why[256] = "";
    OM_ASSERT_CMP(eg_to_anthropic(req, &ROUTE, 0, &out, why, sizeof why), ==,
                  OM_EINVAL);
    if (strstr(why, cases[i].field) == NULL)
      fail_msg("case %s: '%s' does not name %s", cases[i].msgs, why,
               cases[i].field);
    json_decref(req);
  }
}

static void to_openai_asks_for_stream_usage(void **state) {
  om_route_t r = ROUTE;
  json_t *req = json_loads("{\"model\":\"a\",\"messages\":[],\"stream\":true,"
                           "\"stream_options\":{\"include_usage\":false}}",
                           0, NULL);
  json_t *out;
  (void)state;
  r.provider = "openai";
  r.model = "gpt-x";
  out = eg_to_openai(req, &r, 1);
  assert_json(out, "{\"model\":\"gpt-x\",\"messages\":[],\"stream\":true,"
                   "\"stream_options\":{\"include_usage\":true}}");
  json_decref(out);
  out = eg_to_openai(req, &r, 0);
  assert_json(out, "{\"model\":\"gpt-x\",\"messages\":[]}");
  json_decref(out);
  json_decref(req);
}

static void from_anthropic_content_tools_usage(void **state) {
  json_t *msg = json_loads(
      "{\"id\":\"msg_1\",\"type\":\"message\",\"content\":["
      "{\"type\":\"text\",\"text\":\"Let me \"},{\"type\":\"text\",\"text\":"
      "\"look.\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\","
      "\"input\":{\"a\":1}}],\"stop_reason\":\"tool_use\",\"usage\":{"
      "\"input_tokens\":10,\"cache_read_input_tokens\":5,"
      "\"cache_creation_input_tokens\":2,\"output_tokens\":7}}",
      0, NULL);
  json_t *comp = eg_from_anthropic(msg, "claude-x"), *ch;
  (void)state;
  ch = json_array_get(json_object_get(comp, "choices"), 0);
  assert_json(json_object_get(ch, "message"),
              "{\"role\":\"assistant\",\"content\":\"Let me look.\","
              "\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\","
              "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]"
              "}");
  assert_json(json_object_get(ch, "finish_reason"), "\"tool_calls\"");
  assert_json(json_object_get(comp, "usage"),
              "{\"prompt_tokens\":17,\"completion_tokens\":7,"
              "\"total_tokens\":24,\"prompt_tokens_details\":{"
              "\"cached_tokens\":5}}");
  json_decref(comp);
  json_decref(msg);
}

static void finish_reasons(void **state) {
  (void)state;
  assert_string_equal(eg_finish_reason("end_turn"), "stop");
  assert_string_equal(eg_finish_reason("stop_sequence"), "stop");
  assert_string_equal(eg_finish_reason("max_tokens"), "length");
  assert_string_equal(eg_finish_reason("tool_use"), "tool_calls");
  assert_string_equal(eg_finish_reason("refusal"), "content_filter");
  assert_string_equal(eg_finish_reason(NULL), "stop");
}

static char deltas[256];
static size_t n_tool_deltas;

static void on_delta(void *ud, eg_call_t *c, const char *s, size_t n) {
  size_t have = strlen(deltas);
  (void)ud;
  (void)c;
  if (have + n < sizeof deltas) {
    memcpy(deltas + have, s, n);
    deltas[have + n] = '\0';
  }
}

static void on_tool_delta(void *ud, eg_call_t *c, json_t *tc) {
  (void)ud;
  (void)c;
  (void)tc;
  n_tool_deltas++;
}

static void feed(eg_call_t *c, const char *ev) {
  json_t *j = json_loads(ev, 0, NULL);
  assert_non_null(j);
  eg_anthropic_sse_event(c, j);
  json_decref(j);
}

static void stream_events_give_deltas_usage_finish(void **state) {
  eg_call_t *c = calloc(1, sizeof *c);
  (void)state;
  assert_non_null(c);
  c->hooks.delta = on_delta;
  c->hooks.tool_delta = on_tool_delta;
  deltas[0] = '\0';
  n_tool_deltas = 0;
  feed(c, "{\"type\":\"message_start\",\"message\":{\"usage\":{"
          "\"input_tokens\":12,\"cache_read_input_tokens\":3,"
          "\"output_tokens\":1}}}");
  feed(c, "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{"
          "\"type\":\"text_delta\",\"text\":\"Hi \"}}");
  feed(c, "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{"
          "\"type\":\"text_delta\",\"text\":\"there\"}}");
  feed(c, "{\"type\":\"content_block_start\",\"index\":1,\"content_block\":{"
          "\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}");
  feed(c, "{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{"
          "\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}");
  OM_ASSERT_CMP(c->stream_done, ==, 0);
  feed(c, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
          "\"stop_sequence\"},\"usage\":{\"output_tokens\":9}}");
  feed(c, "{\"type\":\"message_stop\"}");
  assert_string_equal(deltas, "Hi there");
  OM_ASSERT_CMP(n_tool_deltas, ==, 2);
  assert_string_equal(c->finish, "stop");
  OM_ASSERT_CMP(c->stream_done, ==, 1);
  OM_ASSERT_CMP(c->usage.has, ==, 1);
  OM_ASSERT_CMP(c->usage.prompt, ==, 15);
  OM_ASSERT_CMP(c->usage.cached, ==, 3);
  OM_ASSERT_CMP(c->usage.completion, ==, 9);
  free(c->text);
  free(c);
}

/* jansson is a shared library: its allocations reach the wrapped malloc
 * of this binary only through these. */
static void *jmalloc(size_t n) {
  return malloc(n);
}

static void jfree(void *p) {
  free(p);
}

static void translation_survives_allocation_failure(void **state) {
  const char *text =
      "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
      "{\"type\":\"image_url\",\"image_url\":{\"url\":"
      "\"data:image/png;base64,AA\"}}]},"
      "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"function\":{"
      "\"name\":\"f\",\"arguments\":\"{}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"r\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
      "\"stop\":[\"x\"],\"response_format\":{\"type\":\"json_object\"}}";
  json_t *req = json_loads(text, 0, NULL), *full = translate(text, 0);
  (void)state;
  assert_non_null(req);
  json_set_alloc_funcs(jmalloc, jfree);
  /* allocations fail from the nth on: OM_ENOMEM, or the whole request
   * (never one with a part missing); no crash and, under the sanitizers,
   * no leak */
  for (int n = 1; n < 400; n++) {
    json_t *out = NULL;
    char why[256];
    int rc;
    om_test_fail_alloc_after(n);
    rc = eg_to_anthropic(req, &ROUTE, 0, &out, why, sizeof why);
    om_test_alloc_reset();
    if (rc == 0 && !json_equal(out, full))
      fail_msg("allocation %d failing: an incomplete request was built", n);
    else if (rc != 0)
      if (rc != OM_ENOMEM)
        fail_msg("allocation %d failing: %d (%s)", n, rc, why);
    json_decref(out);
  }
  json_decref(full);
  json_decref(req);
  json_set_alloc_funcs(malloc, free);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(tool_loop_becomes_tool_blocks),
      cmocka_unit_test(tool_result_goes_before_user_text),
      cmocka_unit_test(images_and_sampling),
      cmocka_unit_test(refusals_name_the_field),
      cmocka_unit_test(refusals_in_messages),
      cmocka_unit_test(to_openai_asks_for_stream_usage),
      cmocka_unit_test(from_anthropic_content_tools_usage),
      cmocka_unit_test(finish_reasons),
      cmocka_unit_test(stream_events_give_deltas_usage_finish),
      cmocka_unit_test(translation_survives_allocation_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
