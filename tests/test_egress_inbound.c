/*
 * test_egress_inbound.c: the inbound APIs' translation to the internal
 * chat form (host/egress/om_egress_messages.c, om_egress_responses.c):
 * what each carries, and that bad input (wrong types, unknown fields,
 * values over their limits) is refused naming the field, with nothing
 * built. The wire-level checks with the real SDKs are in
 * spec/03-integration/sdk_spec.lua; that a refused request sends
 * nothing is in spec/03-integration/egress_inbound_spec.lua.
 */
#include "om_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "om_egress_inbound.h"
#include "om_errno.h"

typedef int (*to_chat_fn)(json_t *, json_t **, char *, size_t);

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

static json_t *translate(to_chat_fn fn, const char *text) {
  char why[256] = "";
  json_t *in = json_loads(text, 0, NULL), *out = NULL;
  int rc;
  assert_non_null(in);
  rc = fn(in, &out, why, sizeof why);
  json_decref(in);
  if (rc != 0)
    fail_msg("refused (%d): %s\n  input %s", rc, why, text);
  return out;
}

/* The input is refused with a message starting with want. */
static void refused(to_chat_fn fn, const char *text, const char *want) {
  char why[256] = "";
  json_t *in = json_loads(text, 0, NULL), *out = NULL;
  int rc;
  if (in == NULL)
    fail_msg("bad test JSON: %s", text);
  rc = fn(in, &out, why, sizeof why);
  json_decref(in);
  if (rc != OM_EINVAL || out != NULL)
    fail_msg("not refused (rc %d, out %p): %s", rc, (void *)out, text);
  if (strncmp(why, want, strlen(want)) != 0)
    fail_msg("message\n got  %s\n want %s...\n  input %s", why, want, text);
}

static void messages_carry_system_images_and_tool_turns(void **state) {
  json_t *out;
  (void)state;
  out = translate(
      eg_messages_to_chat,
      "{\"model\":\"fast\",\"max_tokens\":64,\"system\":[{\"type\":\"text\","
      "\"text\":\"Be brief.\"}],\"stop_sequences\":[\"END\"],"
      "\"metadata\":{\"user_id\":\"u1\"},\"temperature\":0.5,"
      "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
      "\"text\":\"What is this?\"},{\"type\":\"image\",\"source\":{\"type\":"
      "\"base64\",\"media_type\":\"image/png\",\"data\":\"iVBO\"}}]},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":"
      "\"Checking.\"},{\"type\":\"tool_use\",\"id\":\"tu_1\",\"name\":"
      "\"lookup\",\"input\":{\"q\":1}}]},{\"role\":\"user\",\"content\":"
      "[{\"type\":\"tool_result\",\"tool_use_id\":\"tu_1\",\"content\":"
      "\"found\"},{\"type\":\"text\",\"text\":\"And?\"}]}],"
      "\"tools\":[{\"name\":\"lookup\",\"description\":\"Find\","
      "\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":"
      "\"any\",\"disable_parallel_tool_use\":true}}");
  assert_json(
      out,
      "{\"model\":\"fast\",\"max_tokens\":64,\"temperature\":0.5,"
      "\"stop\":[\"END\"],\"user\":\"u1\",\"messages\":["
      "{\"role\":\"system\",\"content\":\"Be brief.\"},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is "
      "this?\"},{\"type\":\"image_url\",\"image_url\":{\"url\":"
      "\"data:image/png;base64,iVBO\"}}]},"
      "{\"role\":\"assistant\",\"content\":\"Checking.\",\"tool_calls\":[{"
      "\"id\":\"tu_1\",\"type\":\"function\",\"function\":{\"name\":"
      "\"lookup\",\"arguments\":\"{\\\"q\\\":1}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"tu_1\",\"content\":\"found\"},"
      "{\"role\":\"user\",\"content\":\"And?\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"lookup\","
      "\"description\":\"Find\",\"parameters\":{\"type\":\"object\"}}}],"
      "\"tool_choice\":\"required\",\"parallel_tool_calls\":false}");
  json_decref(out);
}

static void messages_bad_input_names_the_field(void **state) {
  char big[700], *huge;
  size_t n = EG_IN_MAX_MESSAGES + 1, len = 0;
  (void)state;
#define M(rest)                                                                \
  "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\","        \
  "\"content\":\"hi\"}]" rest "}"
  refused(eg_messages_to_chat, M(",\"top_k\":3"), "field 'top_k'");
  refused(eg_messages_to_chat, M(",\"stream\":\"yes\""), "field 'stream'");
  refused(eg_messages_to_chat, M(",\"temperature\":3"), "field 'temperature'");
  refused(eg_messages_to_chat, M(",\"tools\":{}"), "field 'tools'");
  refused(eg_messages_to_chat,
          M(",\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]"),
          "field 'tools[0].type'");
  refused(eg_messages_to_chat, M(",\"tool_choice\":{\"type\":\"maybe\"}"),
          "field 'tool_choice.type'");
  refused(eg_messages_to_chat, M(",\"metadata\":{\"tenant\":\"x\"}"),
          "field 'metadata.tenant'");
  refused(eg_messages_to_chat,
          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
          "\"hi\"}]}",
          "field 'max_tokens'");
  refused(eg_messages_to_chat, "{\"model\":7,\"max_tokens\":8}",
          "field 'model'");
  refused(eg_messages_to_chat, "{\"model\":\"m\",\"max_tokens\":8}",
          "field 'messages'");
  refused(eg_messages_to_chat,
          "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":"
          "\"system\",\"content\":\"x\"}]}",
          "field 'messages[0].role'");
  refused(eg_messages_to_chat,
          "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":"
          "\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\","
          "\"cache_control\":{\"type\":\"ephemeral\"}}]}]}",
          "field 'messages[0].content[0].cache_control'");
  refused(eg_messages_to_chat,
          "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":"
          "\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
          "\"t\",\"is_error\":true}]}]}",
          "field 'messages[0].content[0].is_error'");
  refused(eg_messages_to_chat,
          "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":"
          "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\","
          "\"name\":\"n\",\"input\":[1]}]}]}",
          "field 'messages[0].content[0].input'");
  /* oversized values */
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  {
    char text[1000];
    snprintf(text, sizeof text,
             "{\"model\":\"%s\",\"max_tokens\":8,\"messages\":[{\"role\":"
             "\"user\",\"content\":\"hi\"}]}",
             big);
    refused(eg_messages_to_chat, text, "field 'model'");
  }
  huge = malloc(n * 40 + 100);
  assert_non_null(huge);
  len += (size_t)sprintf(huge, "{\"model\":\"m\",\"max_tokens\":8,"
                               "\"messages\":[");
  for (size_t i = 0; i < n; i++)
    len += (size_t)sprintf(huge + len,
                           "%s{\"role\":\"user\",\"content\":"
                           "\"x\"}",
                           i ? "," : "");
  sprintf(huge + len, "]}");
  refused(eg_messages_to_chat, huge, "field 'messages': more than 2048");
  free(huge);
#undef M
}

static void message_answer_from_a_completion(void **state) {
  json_t *comp = json_loads(
      "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"Hi\","
      "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{"
      "\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},\"finish_reason\":"
      "\"tool_calls\"}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":"
      "3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}",
      0, NULL);
  json_t *m = eg_chat_to_message(comp, "msg_1", "claude-x");
  (void)state;
  assert_json(m, "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":"
                 "\"assistant\",\"model\":\"claude-x\",\"content\":[{\"type\":"
                 "\"text\",\"text\":\"Hi\"},{\"type\":\"tool_use\",\"id\":"
                 "\"c1\",\"name\":\"f\",\"input\":{\"a\":1}}],\"stop_reason\":"
                 "\"tool_use\",\"stop_sequence\":null,\"usage\":{"
                 "\"input_tokens\":6,\"output_tokens\":3,"
                 "\"cache_read_input_tokens\":4}}");
  assert_string_equal("max_tokens", eg_stop_reason("length"));
  assert_string_equal("end_turn", eg_stop_reason(NULL));
  assert_string_equal("refusal", eg_stop_reason("content_filter"));
  json_decref(m);
  json_decref(comp);
}

static void responses_carry_items_and_tools(void **state) {
  json_t *out;
  (void)state;
  out = translate(
      eg_responses_to_chat,
      "{\"model\":\"fast\",\"instructions\":\"Be "
      "brief.\",\"max_output_tokens\":"
      "32,\"store\":false,\"input\":[{\"role\":\"user\",\"content\":[{"
      "\"type\":\"input_text\",\"text\":\"Look\"},{\"type\":\"input_image\","
      "\"image_url\":\"https://x/i.png\",\"detail\":\"low\"}]},{\"type\":"
      "\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":"
      "\"{}\"},{\"type\":\"function_call_output\",\"call_id\":\"c1\","
      "\"output\":\"ok\"}],\"tools\":[{\"type\":\"function\",\"name\":\"f\","
      "\"parameters\":{\"type\":\"object\"},\"strict\":false}],"
      "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
      "\"text\":{\"format\":{\"type\":\"json_object\"}}}");
  assert_json(
      out,
      "{\"model\":\"fast\",\"max_tokens\":32,\"messages\":["
      "{\"role\":\"system\",\"content\":\"Be brief.\"},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Look\"},"
      "{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://x/i.png\","
      "\"detail\":\"low\"}}]},"
      "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
      "\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
      "\"arguments\":\"{}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
      "\"parameters\":{\"type\":\"object\"},\"strict\":false}}],"
      "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
      "\"response_format\":{\"type\":\"json_object\"}}");
  json_decref(out);
  out = translate(eg_responses_to_chat, "{\"model\":\"m\",\"input\":\"hi\"}");
  assert_json(out, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                   "\"content\":\"hi\"}]}");
  json_decref(out);
}

static void responses_bad_input_names_the_field(void **state) {
  (void)state;
  refused(eg_responses_to_chat,
          "{\"model\":\"m\",\"input\":\"hi\","
          "\"previous_response_id\":\"r\"}",
          "field 'previous_response_id'");
  refused(eg_responses_to_chat,
          "{\"model\":\"m\",\"input\":\"hi\","
          "\"store\":true}",
          "field 'store'");
  refused(eg_responses_to_chat, "{\"model\":\"m\",\"input\":5}",
          "field 'input'");
  refused(eg_responses_to_chat, "{\"input\":\"hi\"}", "field 'model'");
  refused(eg_responses_to_chat,
          "{\"model\":\"m\",\"input\":\"hi\",\"max_output_tokens\":0}",
          "field 'max_output_tokens'");
  refused(eg_responses_to_chat,
          "{\"model\":\"m\",\"input\":\"hi\",\"tools\":[{\"type\":"
          "\"web_search\"}]}",
          "field 'tools[0].type'");
  refused(eg_responses_to_chat,
          "{\"model\":\"m\",\"input\":[{\"type\":\"reasoning\",\"id\":\"r\"}]}",
          "field 'input[0].type'");
  refused(eg_responses_to_chat,
          "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{"
          "\"type\":\"input_file\",\"file_id\":\"f\"}]}]}",
          "field 'input[0].content[0].type'");
  refused(eg_responses_to_chat,
          "{\"model\":\"m\",\"input\":[{\"type\":\"function_call\","
          "\"call_id\":\"c\",\"name\":\"f\",\"arguments\":{}}]}",
          "field 'input[0].arguments'");
  refused(eg_responses_to_chat,
          "{\"model\":\"m\",\"input\":\"hi\",\"stream\":1}", "field 'stream'");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(messages_carry_system_images_and_tool_turns),
      cmocka_unit_test(messages_bad_input_names_the_field),
      cmocka_unit_test(message_answer_from_a_completion),
      cmocka_unit_test(responses_carry_items_and_tools),
      cmocka_unit_test(responses_bad_input_names_the_field),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
