/* test_cli_util.c: duration flags and token files (host/cli/om_cli_util.h). */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "om_cli_util.h"
#include "om_errno.h"

static void durations_accepted(void **state) {
  static const struct {
    const char *in;
    uint64_t ms;
  } ok[] = {
      {"0", 0},
      {"0ms", 0},
      {"0s", 0},
      {"1ms", 1},
      {"500ms", 500},
      {"10s", 10000},
      {"2m", 120000},
      {"1h", 3600000},
      {"007s", 7000},
      {"18446744073709551615ms", UINT64_MAX},
      {"5124095576030h", UINT64_C(5124095576030) * 3600000},
      {"18446744073709551s", UINT64_C(18446744073709551000)},
  };
  (void)state;
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    uint64_t v = 12345;
    int rc = om_parse_duration_ms(ok[i].in, &v);
    if (rc != 0)
      fail_msg("'%s': rc %d", ok[i].in, rc);
    if (v != ok[i].ms)
      fail_msg("'%s': got %llu, want %llu", ok[i].in, (unsigned long long)v,
               (unsigned long long)ok[i].ms);
  }
}

static void durations_refused(void **state) {
  static const char *parse[] = {"",     "10",    "-1s",  "+1s",  " 1s",   "1s ",
                                "1.5s", "1e3ms", "1S",   "1sec", "1m30s", "ms",
                                "s",    "1 s",   "0x1s", "1d",   "1us",   "00",
                                "1h\n", "1\0s",  "∞s",   "1m-",  "0.0s"};
  static const char *range[] = {
      "18446744073709551616ms", "18446744073709551615s", "5124095576031h",
      "18446744073709552s", "99999999999999999999999999999h"};
  (void)state;
  for (size_t i = 0; i < sizeof parse / sizeof parse[0]; i++) {
    uint64_t v = 777;
    int rc = om_parse_duration_ms(parse[i], &v);
    if (rc != OM_EPARSE)
      fail_msg("'%s': rc %d, want OM_EPARSE", parse[i], rc);
    assert_int_equal(v, 777); /* untouched */
  }
  for (size_t i = 0; i < sizeof range / sizeof range[0]; i++) {
    uint64_t v = 777;
    int rc = om_parse_duration_ms(range[i], &v);
    if (rc != OM_ERANGE)
      fail_msg("'%s': rc %d, want OM_ERANGE", range[i], rc);
    assert_int_equal(v, 777);
  }
  /* a malformed tail stays a parse error after too many digits */
  assert_int_equal(
      om_parse_duration_ms("99999999999999999999999x", &(uint64_t){0}),
      OM_EPARSE);
  assert_int_equal(om_parse_duration_ms(NULL, &(uint64_t){0}), OM_EINVAL);
  assert_int_equal(om_parse_duration_ms("1s", NULL), OM_EINVAL);
}

static char *write_tmp(const char *content, size_t len) {
  char *path = strdup("/tmp/om_cli_util_XXXXXX");
  int fd;
  assert_non_null(path);
  fd = mkstemp(path);
  OM_ASSERT_CMP(fd, >=, 0);
  assert_int_equal(write(fd, content, len), (ssize_t)len);
  close(fd);
  return path;
}

static void token_file(void **state) {
  static const struct {
    const char *content;
    int rc;
    const char *token;
  } cases[] = {
      {"abc123\n", 0, "abc123"},
      {"  abc123  \r\nsecond line\n", 0, "abc123"},
      {"tok-._~+/==", 0, "tok-._~+/=="},
      {"\tx\n", 0, "x"},
      {"", OM_EPARSE, ""},
      {"\n", OM_EPARSE, ""},
      {"   \nabc\n", OM_EPARSE, ""}, /* the first line is what counts */
      {"a b\n", OM_EPARSE, ""},
      {"a=b\n", OM_EPARSE, ""},
      {"=\n", OM_EPARSE, ""},
      {"t\xc3\xa9\n", OM_EPARSE, ""},
      {"tok\x01\n", OM_EPARSE, ""},
  };
  char out[64];
  const char *why;
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *p = write_tmp(cases[i].content, strlen(cases[i].content));
    int rc = om_read_token_file(p, out, sizeof out, &why);
    if (rc != cases[i].rc)
      fail_msg("case %zu: rc %d want %d (%s)", i, rc, cases[i].rc, why);
    assert_string_equal(out, cases[i].token);
    if (rc != 0)
      OM_ASSERT_CMP(strlen(why), >, 0);
    unlink(p);
    free(p);
  }
  {
    char *p = write_tmp("0123456789abcdef\n", 17);
    char small[17];
    /* 16 characters need 17 bytes */
    assert_int_equal(om_read_token_file(p, small, 16, &why), OM_ETOOBIG);
    assert_string_equal(small, "");
    assert_int_equal(om_read_token_file(p, small, sizeof small, NULL), 0);
    assert_string_equal(small, "0123456789abcdef");
    unlink(p);
    free(p);
  }
  {
    char big[9000];
    char *p;
    memset(big, 'a', sizeof big);
    p = write_tmp(big, sizeof big);
    assert_int_equal(om_read_token_file(p, out, sizeof out, &why), OM_ETOOBIG);
    unlink(p);
    free(p);
  }
  assert_int_equal(
      om_read_token_file("/nonexistent/token", out, sizeof out, &why),
      OM_ENOTFOUND);
  assert_string_equal(why, "cannot be opened");
  assert_int_equal(om_read_token_file(NULL, out, sizeof out, &why), OM_EINVAL);
  assert_int_equal(om_read_token_file("/x", NULL, 1, &why), OM_EINVAL);
}

static void listen_addresses(void **state) {
  (void)state;
  static const struct {
    const char *in, *host;
    int port;
  } good[] = {{"127.0.0.1:7600", "127.0.0.1", 7600},
              {"[::1]:0", "::1", 0},
              {"0.0.0.0:65535", "0.0.0.0", 65535},
              {"localhost:80", "127.0.0.1", 80}};
  static const char *const bad[] = {
      "",        "7600",         ":7600",        "127.0.0.1:",
      "::1:80",  "[::1]80",      "[]:80",        "127.0.0.1:65536",
      "host:80", "127.0.0.1:-1", "127.0.0.1:8x", "[::1]:"};
  char host[64];
  int port;
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    port = -1;
    assert_int_equal(om_parse_listen(good[i].in, host, sizeof host, &port), 0);
    assert_string_equal(host, good[i].host);
    assert_int_equal(port, good[i].port);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (om_parse_listen(bad[i], host, sizeof host, &port) != -1)
      fail_msg("'%s' was accepted", bad[i]);
  assert_int_equal(om_parse_listen("127.0.0.1:1", host, 4, &port), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(listen_addresses),
      cmocka_unit_test(durations_accepted),
      cmocka_unit_test(durations_refused),
      cmocka_unit_test(token_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
