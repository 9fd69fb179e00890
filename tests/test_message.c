/* test_message.c: agent messages, egress errors and om_message_split. */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_message.h"
#include "om_rng.h"

/* ------------------------------------------------------------------ */
/* Invariants every split must satisfy                                 */

static int is_fence_open_line(const char *s, size_t n) {
  size_t i = 0;
  while (i < n && i < 3 && s[i] == ' ')
    i++;
  return n >= i + 4 &&
         (memcmp(s + i, "```", 3) == 0 || memcmp(s + i, "~~~", 3) == 0) &&
         s[n - 1] == '\n';
}

/* Checks the contract of om_message_split; returns the number of parts
 * that were re-fenced (a prefix or a suffix was added). */
static size_t check_parts(const char *body, size_t len, size_t limit,
                          const om_message_part_t *parts, size_t n) {
  size_t off = 0, refenced = 0;
  for (size_t i = 0; i < n; i++) {
    const om_message_part_t *p = &parts[i];
    size_t slice = p->len - p->prefix_len - p->suffix_len;
    OM_ASSERT_CMP(p->len, >=, 1);
    if (p->len > limit)
      fail_msg("part %zu: %zu bytes > limit %zu", i, p->len, limit);
    assert_int_equal(p->text[p->len], '\0');
    assert_int_equal(strlen(p->text), p->len);
    assert_true(om_utf8_valid(p->text, p->len));
    assert_int_equal(p->offset, off);
    OM_ASSERT_CMP(slice, >=, 1);
    assert_memory_equal(p->text + p->prefix_len, body + off, slice);
    if (p->prefix_len) {
      assert_true(is_fence_open_line(p->text, p->prefix_len));
      refenced++;
    }
    if (p->suffix_len) {
      const char *sfx = p->text + p->len - p->suffix_len;
      OM_ASSERT_CMP(p->suffix_len, >=, 4);
      static const LargestIntegralType fence_chars[] = {'`', '~'};
      assert_in_set(sfx[0], fence_chars, 2);
      for (size_t k = 0; k + 1 < p->suffix_len; k++)
        assert_int_equal(sfx[k], sfx[0]);
      assert_int_equal(sfx[p->suffix_len - 1], '\n');
      /* the closing line is a line of its own */
      assert_int_equal(p->text[p->len - p->suffix_len - 1], '\n');
      if (!p->prefix_len)
        refenced++;
    }
    off += slice;
  }
  assert_int_equal(off, len);
  return refenced;
}

static om_message_part_t *split_ok(const char *body, size_t limit, size_t *n) {
  om_message_part_t *parts = NULL;
  int rc = om_message_split(body, strlen(body), limit, &parts, n);
  assert_int_equal(rc, 0);
  check_parts(body, strlen(body), limit, parts, *n);
  return parts;
}

/* ------------------------------------------------------------------ */
/* Split rules                                                         */

static void split_fits_whole_and_empty(void **state) {
  om_message_part_t *parts = NULL;
  size_t n = 99;
  (void)state;
  parts = split_ok("hello", 5, &n);
  assert_int_equal(n, 1);
  assert_string_equal(parts[0].text, "hello");
  om_message_parts_free(parts);
  assert_int_equal(om_message_split("", 0, 10, &parts, &n), 0);
  assert_int_equal(n, 0);
  assert_null(parts);
  om_message_parts_free(NULL);
}

static void split_paragraphs_first(void **state) {
  size_t n;
  om_message_part_t *p;
  (void)state;
  /* a line boundary lies later in the window, the paragraph wins */
  p = split_ok("aaa\n\nbbb\nccc\nddd", 12, &n);
  assert_int_equal(n, 2);
  assert_string_equal(p[0].text, "aaa\n\n");
  assert_string_equal(p[1].text, "bbb\nccc\nddd");
  om_message_parts_free(p);
  p = split_ok("one two\n\nthree four\n\nfive", 21, &n);
  assert_int_equal(n, 2);
  assert_string_equal(p[0].text, "one two\n\nthree four\n\n");
  assert_string_equal(p[1].text, "five");
  om_message_parts_free(p);
}

static void split_lines_then_words_then_chars(void **state) {
  size_t n;
  om_message_part_t *p;
  (void)state;
  p = split_ok("line one\nline two\nline three", 20, &n);
  assert_int_equal(n, 2);
  assert_string_equal(p[0].text, "line one\nline two\n");
  assert_string_equal(p[1].text, "line three");
  om_message_parts_free(p);
  p = split_ok("alpha beta gamma delta", 12, &n);
  assert_int_equal(n, 2);
  assert_string_equal(p[0].text, "alpha beta ");
  assert_string_equal(p[1].text, "gamma delta");
  om_message_parts_free(p);
  p = split_ok("abcdefghij", 4, &n);
  assert_int_equal(n, 3);
  assert_string_equal(p[0].text, "abcd");
  assert_string_equal(p[2].text, "ij");
  om_message_parts_free(p);
}

static void split_never_inside_a_code_point(void **state) {
  size_t n;
  om_message_part_t *p;
  /* e-acute is 2 bytes, the emoji 4 */
  const char *body = "\xc3\xa9\xc3\xa9\xc3\xa9\xf0\x9f\x98\x80x";
  (void)state;
  p = split_ok(body, 4, &n);
  assert_int_equal(n, 4);
  assert_int_equal(p[0].len, 4);
  assert_int_equal(p[1].len, 2);
  assert_int_equal(p[2].len, 4);
  assert_string_equal(p[3].text, "x");
  om_message_parts_free(p);
  p = split_ok(body, 5, &n);
  assert_int_equal(p[0].len, 4);
  om_message_parts_free(p);
  /* a limit below a code point's length cannot be honoured */
  assert_int_equal(om_message_split(body, strlen(body), 3, &p, &n), OM_ERANGE);
  assert_int_equal(om_message_split("\xf0\x9f\x98\x80", 4, 3, &p, &n),
                   OM_ERANGE);
}

static void split_limit_one_to_n(void **state) {
  const char *body = "ab cd\n\nef\n```\nx\n```\ngh ij";
  size_t len = strlen(body);
  (void)state;
  for (size_t limit = 1; limit <= len + 2; limit++) {
    om_message_part_t *p = NULL;
    size_t n = 0;
    assert_int_equal(om_message_split(body, len, limit, &p, &n), 0);
    check_parts(body, len, limit, p, n);
    if (limit >= len)
      assert_int_equal(n, 1);
    om_message_parts_free(p);
  }
}

static void split_rejects_bad_input(void **state) {
  om_message_part_t *p = (om_message_part_t *)0x1;
  size_t n = 7;
  (void)state;
  assert_int_equal(om_message_split("abc", 3, 0, &p, &n), OM_EINVAL);
  assert_int_equal(om_message_split(NULL, 3, 4, &p, &n), OM_EINVAL);
  assert_int_equal(om_message_split("abc", 3, 4, NULL, &n), OM_EINVAL);
  assert_int_equal(om_message_split("abc", 3, 4, &p, NULL), OM_EINVAL);
  /* invalid UTF-8: a lone continuation, an overlong, a surrogate, beyond
   * U+10FFFF, a truncated sequence */
  assert_int_equal(om_message_split("a\x80", 2, 4, &p, &n), OM_EPARSE);
  assert_int_equal(om_message_split("\xc0\xaf", 2, 4, &p, &n), OM_EPARSE);
  assert_int_equal(om_message_split("\xed\xa0\x80", 3, 4, &p, &n), OM_EPARSE);
  assert_int_equal(om_message_split("\xf4\x90\x80\x80", 4, 4, &p, &n),
                   OM_EPARSE);
  assert_int_equal(om_message_split("\xe2\x82", 2, 4, &p, &n), OM_EPARSE);
  /* outputs untouched on error */
  assert_ptr_equal(p, (om_message_part_t *)0x1);
  assert_int_equal(n, 7);
}

static void split_avoids_fenced_blocks(void **state) {
  size_t n;
  om_message_part_t *p;
  const char *body = "Here is the fix:\n"
                     "```c\n"
                     "int x = 1;\n"
                     "\n"
                     "int y = 2;\n"
                     "```\n"
                     "Done.";
  (void)state;
  /* a paragraph boundary inside the block fits the window, the line
   * boundary before the block is taken instead */
  p = split_ok(body, 40, &n);
  assert_int_equal(n, 2);
  assert_string_equal(p[0].text, "Here is the fix:\n");
  OM_ASSERT_PREFIX(p[1].text, "```c\n");
  assert_int_equal(p[1].prefix_len + p[1].suffix_len, 0);
  om_message_parts_free(p);
}

static void split_refences_a_long_block(void **state) {
  char body[2048];
  size_t n, len = 0, opened = 0;
  om_message_part_t *p;
  (void)state;
  len += (size_t)sprintf(body + len, "Intro.\n\n```python\n");
  for (int i = 0; i < 40; i++)
    len += (size_t)sprintf(body + len, "print('line %02d')\n", i);
  len += (size_t)sprintf(body + len, "```\nOutro.");
  p = split_ok(body, 120, &n);
  OM_ASSERT_CMP(n, >, 5);
  for (size_t i = 0; i < n; i++) {
    const char *t = p[i].text;
    /* every part that holds code is a complete fenced block */
    if (strstr(t, "print(") != NULL) {
      const char *open = strstr(t, "```python\n");
      const char *close = strstr(open ? open + 10 : t, "```\n");
      assert_non_null(open);
      assert_non_null(close);
      opened++;
    }
    if (p[i].prefix_len)
      assert_memory_equal(t, "```python\n", 10);
  }
  assert_in_range(opened, n - 2, n - 1);
  om_message_parts_free(p);
}

static void split_fence_rules(void **state) {
  size_t n;
  om_message_part_t *p;
  (void)state;
  /* a ```` block is not closed by ```: the inner line is content */
  const char *b1 = "````\nA\n```\nB\nC\nD\n````\nZ";
  p = split_ok(b1, 14, &n);
  for (size_t i = 0; i < n; i++)
    if (p[i].suffix_len)
      assert_int_equal(p[i].suffix_len, 5); /* "````\n" */
  om_message_parts_free(p);
  /* tildes */
  const char *b2 = "~~~\nA\nB\nC\nD\nE\n~~~\n";
  p = split_ok(b2, 10, &n);
  OM_ASSERT_CMP(n, >, 1);
  assert_int_equal(p[1].prefix_len, 4);
  assert_memory_equal(p[1].text, "~~~\n", 4);
  om_message_parts_free(p);
  /* an unclosed block runs to the end; the last part is not closed */
  const char *b3 = "```\nA\nB\nC\nD\nE\nF\n";
  p = split_ok(b3, 10, &n);
  assert_int_equal(p[n - 1].suffix_len, 0);
  om_message_parts_free(p);
  /* a backtick fence whose info string has a backtick is no fence */
  const char *b4 = "``` a`b\nx\n\ny";
  p = split_ok(b4, 11, &n);
  assert_string_equal(p[0].text, "``` a`b\nx\n\n");
  om_message_parts_free(p);
  /* a code line longer than the limit: cut like text, nothing lost */
  const char *b5 = "```\nabcdefghijklmnopqrstuvwxyz\n```\n";
  p = split_ok(b5, 10, &n);
  OM_ASSERT_CMP(n, >=, 4);
  om_message_parts_free(p);
}

/* Random Markdown-ish bodies, random limits: every invariant holds. */
static void split_fuzz(void **state) {
  static const char *const tokens[] = {"a",
                                       "word ",
                                       " ",
                                       "\n",
                                       "\n\n",
                                       "```\n",
                                       "~~~~\n",
                                       "```py\n",
                                       "\t",
                                       "\xc3\xa9",
                                       "\xf0\x9f\x98\x80",
                                       "  ```\n",
                                       "x`y",
                                       "ends."};
  const size_t nt = sizeof tokens / sizeof tokens[0];
  om_rng_t rng;
  char body[1024];
  (void)state;
  om_rng_seed(&rng, 42);
  for (int iter = 0; iter < 3000; iter++) {
    size_t len = 0, want = om_rng_below(&rng, 600);
    size_t limit = 1 + om_rng_below(&rng, iter % 3 ? 80 : 400);
    om_message_part_t *p = NULL;
    size_t n = 0;
    int rc, has_wide = 0;
    while (len < want) {
      const char *t = tokens[om_rng_below(&rng, (uint32_t)nt)];
      size_t tl = strlen(t);
      if (len + tl >= sizeof body)
        break;
      memcpy(body + len, t, tl);
      has_wide |= (unsigned char)t[0] >= 0xF0   ? 4
                  : (unsigned char)t[0] >= 0xC0 ? 2
                                                : 0;
      len += tl;
    }
    rc = om_message_split(body, len, limit, &p, &n);
    if (rc == OM_ERANGE) {
      OM_ASSERT_CMP(limit, <, 4);
      assert_true(has_wide);
      continue;
    }
    assert_int_equal(rc, 0);
    check_parts(body, len, limit, p, n);
    if (len > 0 && len <= limit)
      assert_int_equal(n, 1);
    om_message_parts_free(p);
  }
}

static void split_fault_injection(void **state) {
  char body[1024];
  size_t len = 0;
  (void)state;
  len += (size_t)sprintf(body + len, "Intro\n\n```\n");
  for (int i = 0; i < 30; i++)
    len += (size_t)sprintf(body + len, "code %d\n", i);
  len += (size_t)sprintf(body + len, "```\n\n~~~\nmore\n~~~\nend");
  for (long k = 0;; k++) {
    om_message_part_t *p = NULL;
    size_t n = 0;
    int rc;
    om_test_fail_alloc_after(k);
    rc = om_message_split(body, len, 30, &p, &n);
    om_test_alloc_reset();
    if (rc == 0) {
      check_parts(body, len, 30, p, n);
      om_message_parts_free(p);
      OM_ASSERT_CMP(k, >, 2);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(p);
  }
}

/* ------------------------------------------------------------------ */
/* Agent message and egress error                                      */

static void agent_message_roundtrip(void **state) {
  om_agent_message_t *m = NULL;
  size_t len = 0;
  (void)state;
  assert_int_equal(
      om_agent_message_new("support", "c-1", NULL, "hi *there*", 10, &m), 0);
  assert_string_equal(om_agent_message_body(m, &len), "hi *there*");
  assert_int_equal(len, 10);
  assert_string_equal(om_agent_message_agent(m), "support");
  assert_string_equal(om_agent_message_conversation(m), "c-1");
  assert_null(om_agent_message_run(m));
  om_agent_message_free(m);
  assert_int_equal(om_agent_message_new("a", "c", "run-9", "", 0, &m), 0);
  assert_string_equal(om_agent_message_run(m), "run-9");
  assert_string_equal(om_agent_message_body(m, NULL), "");
  om_agent_message_free(m);
  om_agent_message_free(NULL);
}

static void agent_message_rejects_hostile_input(void **state) {
  om_agent_message_t *m = (om_agent_message_t *)0x1;
  char big_id[OM_MESSAGE_MAX_ID + 2];
  (void)state;
  memset(big_id, 'x', sizeof big_id - 1);
  big_id[sizeof big_id - 1] = '\0';
  assert_int_equal(om_agent_message_new(NULL, "c", NULL, "x", 1, &m),
                   OM_EINVAL);
  assert_int_equal(om_agent_message_new("", "c", NULL, "x", 1, &m), OM_EINVAL);
  assert_int_equal(om_agent_message_new("a", "c\r\nX: y", NULL, "x", 1, &m),
                   OM_EINVAL);
  assert_int_equal(om_agent_message_new("a", "c", "", "x", 1, &m), OM_EINVAL);
  assert_int_equal(om_agent_message_new(big_id, "c", NULL, "x", 1, &m),
                   OM_EINVAL);
  assert_int_equal(om_agent_message_new("a", "c", NULL, NULL, 1, &m),
                   OM_EINVAL);
  assert_int_equal(om_agent_message_new("a", "c", NULL, "\xff", 1, &m),
                   OM_EPARSE);
  assert_int_equal(
      om_agent_message_new("a", "c", NULL, "x", OM_MESSAGE_MAX_BODY + 1, &m),
      OM_ETOOBIG);
  assert_int_equal(om_agent_message_new("a", "c", NULL, "x", 1, NULL),
                   OM_EINVAL);
  assert_ptr_equal(m, (om_agent_message_t *)0x1);
}

static void agent_message_fault_injection(void **state) {
  (void)state;
  for (long k = 0;; k++) {
    om_agent_message_t *m = NULL;
    int rc;
    om_test_fail_alloc_after(k);
    rc = om_agent_message_new("a", "c", "r", "body", 4, &m);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(k, 5);
      om_agent_message_free(m);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(m);
  }
}

static void egress_error_records_attempts(void **state) {
  om_egress_error_t *e = NULL;
  const char *route, *cls;
  int status;
  uint64_t d;
  (void)state;
  assert_int_equal(om_egress_error_new(OM_EGRESS_TRANSPORT, 7,
                                       "503 from primary: overloaded", &e),
                   0);
  assert_int_equal(om_egress_error_class(e), OM_EGRESS_TRANSPORT);
  assert_string_equal(om_egress_error_class_name(om_egress_error_class(e)),
                      "transport");
  assert_string_equal(om_egress_error_class_name(OM_EGRESS_SEMANTIC),
                      "semantic");
  assert_int_equal(om_egress_error_retryable(e), 1);
  assert_string_equal(om_egress_error_cause(e), "503 from primary: overloaded");
  assert_null(om_egress_error_agent(e));
  for (int i = 0; i < 10; i++)
    assert_int_equal(
        om_egress_error_add_attempt(e, i % 2 ? "backup" : "primary", 500 + i,
                                    "server_error", (uint64_t)i * 1000),
        0);
  assert_int_equal(om_egress_error_attempts(e), 10);
  assert_int_equal(om_egress_error_attempt(e, 3, &route, &status, &cls, &d), 0);
  assert_string_equal(route, "backup");
  assert_int_equal(status, 503);
  assert_string_equal(cls, "server_error");
  assert_int_equal(d, 3000);
  assert_int_equal(om_egress_error_attempt(e, 10, &route, NULL, NULL, NULL),
                   OM_ERANGE);
  assert_int_equal(om_egress_error_add_attempt(e, "", 0, "x", 0), OM_EINVAL);
  assert_int_equal(om_egress_error_add_attempt(e, "r", 0, NULL, 0), OM_EINVAL);
  assert_int_equal(om_egress_error_set_attribution(e, "support", "c-1", NULL),
                   0);
  assert_int_equal(om_egress_error_set_attribution(e, "support", "c-2", "r-1"),
                   0);
  assert_string_equal(om_egress_error_conversation(e), "c-2");
  assert_string_equal(om_egress_error_run(e), "r-1");
  assert_int_equal(om_egress_error_set_attribution(e, "a\n", "c", NULL),
                   OM_EINVAL);
  assert_string_equal(om_egress_error_agent(e), "support");
  om_egress_error_free(e);
  om_egress_error_free(NULL);
}

static void egress_error_bounds(void **state) {
  om_egress_error_t *e = NULL;
  char cause[5000];
  (void)state;
  assert_int_equal(om_egress_error_new(3, 0, "x", &e), OM_EINVAL);
  assert_int_equal(om_egress_error_new(OM_EGRESS_SEMANTIC, 0, NULL, &e),
                   OM_EINVAL);
  /* a long cause is cut at a code point boundary */
  memset(cause, 'a', sizeof cause);
  for (size_t i = 4091; i + 2 < sizeof cause; i += 2)
    memcpy(cause + i, "\xc3\xa9", 2); /* one straddles byte 4096 */
  cause[sizeof cause - 1] = '\0';
  assert_int_equal(om_egress_error_new(OM_EGRESS_SEMANTIC, 0, cause, &e), 0);
  OM_ASSERT_CMP(strlen(om_egress_error_cause(e)), <=, 4096);
  assert_true(om_utf8_valid(om_egress_error_cause(e),
                            strlen(om_egress_error_cause(e))));
  for (int i = 0; i < OM_EGRESS_MAX_ATTEMPTS + 5; i++)
    assert_int_equal(om_egress_error_add_attempt(e, "r", 0, "timeout", 1), 0);
  assert_int_equal(om_egress_error_attempts(e), OM_EGRESS_MAX_ATTEMPTS + 5);
  assert_int_equal(om_egress_error_attempts_stored(e), OM_EGRESS_MAX_ATTEMPTS);
  om_egress_error_free(e);
}

static void egress_error_fault_injection(void **state) {
  (void)state;
  for (long k = 0;; k++) {
    om_egress_error_t *e = NULL;
    int rc;
    om_test_fail_alloc_after(k);
    rc = om_egress_error_new(OM_EGRESS_TRANSPORT, 1, "cause", &e);
    if (rc == 0) {
      for (int i = 0; i < 6 && rc == 0; i++)
        rc = om_egress_error_add_attempt(e, "primary", 503, "server_error", 1);
      if (rc == 0)
        rc = om_egress_error_set_attribution(e, "a", "c", "r");
    }
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(om_egress_error_attempts(e), 6);
      assert_string_equal(om_egress_error_run(e), "r");
      om_egress_error_free(e);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    /* nothing half-added: the stored attempts are whole */
    if (e != NULL) {
      for (size_t i = 0; i < om_egress_error_attempts_stored(e); i++) {
        const char *route;
        assert_int_equal(
            om_egress_error_attempt(e, i, &route, NULL, NULL, NULL), 0);
        assert_string_equal(route, "primary");
      }
      om_egress_error_free(e);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(split_fits_whole_and_empty),
      cmocka_unit_test(split_paragraphs_first),
      cmocka_unit_test(split_lines_then_words_then_chars),
      cmocka_unit_test(split_never_inside_a_code_point),
      cmocka_unit_test(split_limit_one_to_n),
      cmocka_unit_test(split_rejects_bad_input),
      cmocka_unit_test(split_avoids_fenced_blocks),
      cmocka_unit_test(split_refences_a_long_block),
      cmocka_unit_test(split_fence_rules),
      cmocka_unit_test(split_fuzz),
      cmocka_unit_test(split_fault_injection),
      cmocka_unit_test(agent_message_roundtrip),
      cmocka_unit_test(agent_message_rejects_hostile_input),
      cmocka_unit_test(agent_message_fault_injection),
      cmocka_unit_test(egress_error_records_attempts),
      cmocka_unit_test(egress_error_bounds),
      cmocka_unit_test(egress_error_fault_injection),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
