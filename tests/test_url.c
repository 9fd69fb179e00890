/*
 * test_url.c: the one URL rule (core/om_url.h). A table of accepted URLs
 * with what they split into, a table of refused ones with the reason each
 * must name, the literal parsers on their own, and the control plane's
 * view of the same rule (om_instance_validate answers with the same
 * reasons, so a registration is refused for exactly what a proxy would
 * refuse).
 */
#include "om_test.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_snapshot.h"
#include "om_url.h"

typedef struct {
  const char *url;
  int tls;
  om_url_host_kind_t kind;
  const char *host;
  int port, port_given;
  const char *path;
} good_t;

static const good_t GOOD[] = {
    {"http://10.0.0.1", 0, OM_URL_HOST_IPV4, "10.0.0.1", 80, 0, ""},
    {"http://0.0.0.0:1", 0, OM_URL_HOST_IPV4, "0.0.0.0", 1, 1, ""},
    {"HTTP://255.255.255.255:65535/", 0, OM_URL_HOST_IPV4, "255.255.255.255",
     65535, 1, "/"},
    {"https://127.0.0.1", 1, OM_URL_HOST_IPV4, "127.0.0.1", 443, 0, ""},
    {"HtTpS://h:00080/a", 1, OM_URL_HOST_NAME, "h", 80, 1, "/a"},
    {"http://[::1]:9000/x", 0, OM_URL_HOST_IPV6, "::1", 9000, 1, "/x"},
    {"http://[::]", 0, OM_URL_HOST_IPV6, "::", 80, 0, ""},
    {"http://[fe80::1:2:3:4]/", 0, OM_URL_HOST_IPV6, "fe80::1:2:3:4", 80, 0,
     "/"},
    {"http://[1:2:3:4:5:6:7:8]", 0, OM_URL_HOST_IPV6, "1:2:3:4:5:6:7:8", 80, 0,
     ""},
    {"http://[::ffff:1.2.3.4]", 0, OM_URL_HOST_IPV6, "::ffff:1.2.3.4", 80, 0,
     ""},
    {"https://[2001:DB8::]:8443", 1, OM_URL_HOST_IPV6, "2001:DB8::", 8443, 1,
     ""},
    {"http://localhost:8080", 0, OM_URL_HOST_NAME, "localhost", 8080, 1, ""},
    {"http://web-4.internal:8080", 0, OM_URL_HOST_NAME, "web-4.internal", 8080,
     1, ""},
    {"http://Upper.Case", 0, OM_URL_HOST_NAME, "Upper.Case", 80, 0, ""},
    {"http://1.2.3.4a", 0, OM_URL_HOST_NAME, "1.2.3.4a", 80, 0, ""},
    {"http://3com.example", 0, OM_URL_HOST_NAME, "3com.example", 80, 0, ""},
    {"http://a/api/v1/", 0, OM_URL_HOST_NAME, "a", 80, 0, "/api/v1/"},
    {"http://a/p%20q/~x;y=1,z:@!$&'()*+", 0, OM_URL_HOST_NAME, "a", 80, 0,
     "/p%20q/~x;y=1,z:@!$&'()*+"},
    {"http://nonexistent.invalid:1", 0, OM_URL_HOST_NAME, "nonexistent.invalid",
     1, 1, ""},
};

typedef struct {
  const char *url, *why;
} bad_t;

static const bad_t BAD[] = {
    {"", "is empty"},
    {"a", "must be an absolute http:// or https:// URL"},
    {"ftp://h", "must be an absolute http:// or https:// URL"},
    {"ws://h", "must be an absolute http:// or https:// URL"},
    {"http:/h", "must be an absolute http:// or https:// URL"},
    {"//h", "must be an absolute http:// or https:// URL"},
    {" http://h", "contains whitespace"},
    {"http://h/\x01", "contains whitespace"},
    {"http://h\xc3\xa9", "contains whitespace"},
    {"http://", "has no host"},
    {"http://:80", "has no host"},
    {"http:///p", "has no host"},
    {"http://user@h", "must not carry userinfo"},
    {"http://u:pw@h/", "must not carry userinfo"},
    {"http://h?q", "must not carry a query"},
    {"http://h/p?q=1", "must not carry a query"},
    {"http://h#f", "must not carry a fragment"},
    {"http://h/p#f", "must not carry a fragment"},
    {"http://999.1.1.1", "IPv4 literal out of range"},
    {"http://1.2.3.256:80", "IPv4 literal out of range"},
    {"http://1.2.3.4444", "IPv4 literal out of range"},
    {"http://01.2.3.4", "leading zero"},
    {"http://1.2.3", "malformed IPv4 literal"},
    {"http://1.2.3.4.5", "malformed IPv4 literal"},
    {"http://1..2.3", "malformed IPv4 literal"},
    {"http://12345", "IPv4 literal out of range"},
    {"http://a.1", "last label is a number"},
    {"http://a.0x1f", "last label is a number"},
    {"http://h.", "ending in '.'"},
    {"http://a..b", "empty label"},
    {"http://.a", "empty label"},
    {"http://-a.b", "starts or ends with '-'"},
    {"http://a-.b", "starts or ends with '-'"},
    {"http://my_host", "'_'"},
    {"http://a%41b", "must not percent-encode the host"},
    {"http://a!b", "invalid character in the host"},
    {"http://a~b", "invalid character in the host"},
    {"http://h:", "empty port"},
    {"http://h:0", "port out of range"},
    {"http://h:65536", "port out of range"},
    {"http://h:123456", "port out of range"},
    {"http://h:8x", "invalid port"},
    {"http://h:-1", "invalid port"},
    {"http://[::1", "closing ']'"},
    {"http://[::1]x", "unexpected character after the host"},
    {"http://[fe80::1%25eth0]", "zone id"},
    {"http://[v1.x]", "IPvFuture"},
    {"http://[]", "invalid IPv6 literal"},
    {"http://[zz::1]", "invalid IPv6 literal"},
    {"http://[1.2.3.4]", "invalid IPv6 literal"},
    {"http://[1:2:3:4:5:6:7:8:9]", "invalid IPv6 literal"},
    {"http://[1::2::3]", "invalid IPv6 literal"},
    {"http://[1:2:3:4:5:6:7]", "invalid IPv6 literal"},
    {"http://[12345::]", "invalid IPv6 literal"},
    {"http://[1:]", "invalid IPv6 literal"},
    {"http://[:1]", "invalid IPv6 literal"},
    {"http://[::1.2.3.256]", "invalid IPv6 literal"},
    {"http://h/a b", "contains whitespace"},
    {"http://h/%zz", "invalid percent-escape"},
    {"http://h/%4", "invalid percent-escape"},
    {"http://h/a^b", "not allowed in a path"},
    {"http://h/a\"b", "not allowed in a path"},
    {"http://h/[x]", "not allowed in a path"},
};

static void accepts_with_parts(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof GOOD / sizeof GOOD[0]; i++) {
    const good_t *g = &GOOD[i];
    om_url_t u;
    const char *why = NULL;
    int rc = om_url_parse(g->url, &u, &why);
    if (rc != 0)
      fail_msg("%s refused: %s", g->url, why ? why : "(null)");
    OM_ASSERT_CMP(u.tls, ==, g->tls);
    OM_ASSERT_CMP((int)u.host_kind, ==, (int)g->kind);
    if (strcmp(u.host, g->host) != 0)
      fail_msg("%s: host '%s', want '%s'", g->url, u.host, g->host);
    OM_ASSERT_CMP(u.port, ==, g->port);
    OM_ASSERT_CMP(u.port_given, ==, g->port_given);
    if (u.path_len != strlen(g->path) ||
        memcmp(u.path, g->path, u.path_len) != 0)
      fail_msg("%s: path '%.*s', want '%s'", g->url, (int)u.path_len, u.path,
               g->path);
  }
}

static void refuses_naming_the_problem(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    om_url_t u;
    const char *why = NULL;
    int rc = om_url_parse(BAD[i].url, &u, &why);
    if (rc != OM_EPARSE || why == NULL || strstr(why, BAD[i].why) == NULL)
      fail_msg("\"%s\": rc %d why '%s', want OM_EPARSE and '%s'", BAD[i].url,
               rc, why ? why : "(null)", BAD[i].why);
  }
}

static void length_and_arguments(void **state) {
  static char ok[OM_URL_MAX_LEN + 1], too_long[OM_URL_MAX_LEN + 2];
  static char name[300];
  om_url_t u;
  const char *why = "untouched";
  (void)state;
  memcpy(ok, "http://h/", 9);
  memset(ok + 9, 'x', OM_URL_MAX_LEN - 9);
  OM_ASSERT_CMP(om_url_parse(ok, &u, &why), ==, 0);
  OM_ASSERT_CMP(u.path_len, ==, (size_t)OM_URL_MAX_LEN - 8);
  memcpy(too_long, ok, OM_URL_MAX_LEN);
  too_long[OM_URL_MAX_LEN] = 'y';
  OM_ASSERT_CMP(om_url_parse(too_long, &u, &why), ==, OM_EPARSE);
  assert_string_equal(why, "is longer than 2048 bytes");
  /* labels of 63 are fine, 64 is one too many; 253 in all is the most */
  memcpy(name, "http://", 7);
  memset(name + 7, 'a', 63);
  strcpy(name + 70, ".b");
  OM_ASSERT_CMP(om_url_parse(name, &u, &why), ==, 0);
  memset(name + 7, 'a', 64);
  strcpy(name + 71, ".b");
  OM_ASSERT_CMP(om_url_parse(name, &u, &why), ==, OM_EPARSE);
  assert_non_null(strstr(why, "longer than 63"));
  /* 4 x (63 + '.') - 3 = 253 bytes: "aaa...a.aaa...a.aaa...a.a...a" */
  {
    char *h = name + 7;
    size_t k = 0;
    for (int l = 0; l < 4; l++) {
      size_t len = l < 3 ? 63 : 61;
      memset(h + k, 'a', len);
      k += len;
      if (l < 3)
        h[k++] = '.';
    }
    h[k] = '\0';
    OM_ASSERT_CMP(k, ==, (size_t)253);
    OM_ASSERT_CMP(om_url_parse(name, &u, &why), ==, 0);
    OM_ASSERT_CMP(strlen(u.host), ==, (size_t)253);
    h[k] = 'a';
    h[k + 1] = '\0';
    OM_ASSERT_CMP(om_url_parse(name, &u, &why), ==, OM_EPARSE);
    assert_non_null(strstr(why, "longer than 253"));
  }
  why = "untouched";
  OM_ASSERT_CMP(om_url_parse(NULL, &u, &why), ==, OM_EINVAL);
  OM_ASSERT_CMP(om_url_parse("http://h", NULL, &why), ==, OM_EINVAL);
  assert_string_equal(why, "untouched");
  OM_ASSERT_CMP(om_url_parse("ftp://h", &u, NULL), ==, OM_EPARSE);
}

static void literals_match_inet_pton(void **state) {
  static const char *v4[] = {
      "0.0.0.0",   "1.2.3.4",  "255.255.255.255", "10.0.0.1", "1.2.3",
      "256.1.1.1", "01.1.1.1", "1.1.1.1.",        "1.1.1.-1", "a.b.c.d"};
  static const char *v6[] = {"::",
                             "::1",
                             "1::",
                             "1:2:3:4:5:6:7:8",
                             "1:2:3:4:5:6:1.2.3.4",
                             "::ffff:10.0.0.1",
                             "fe80::1:2:3:4",
                             "1:2:3:4:5:6:7::",
                             "::2:3:4:5:6:7:8",
                             "1::2::3",
                             ":::",
                             "1:2:3:4:5:6:7:8:9",
                             "12345::",
                             "1:2:3:4:5:6:7:1.2.3.4",
                             "::1.2.3",
                             "g::1",
                             "1:",
                             ":1"};
  (void)state;
  for (size_t i = 0; i < sizeof v4 / sizeof v4[0]; i++) {
    unsigned char a[4], b[4];
    int mine = om_url_parse_ipv4(v4[i], strlen(v4[i]), a);
    int libc = inet_pton(AF_INET, v4[i], b) == 1;
    if (mine != libc || (mine && memcmp(a, b, 4) != 0))
      fail_msg("IPv4 '%s': ours %d, inet_pton %d", v4[i], mine, libc);
  }
  for (size_t i = 0; i < sizeof v6 / sizeof v6[0]; i++) {
    unsigned char a[16], b[16];
    int mine = om_url_parse_ipv6(v6[i], strlen(v6[i]), a);
    int libc = inet_pton(AF_INET6, v6[i], b) == 1;
    if (mine != libc || (mine && memcmp(a, b, 16) != 0))
      fail_msg("IPv6 '%s': ours %d, inet_pton %d", v6[i], mine, libc);
  }
}

/* The registry refuses with the same reasons: the field is "url". */
static void registry_uses_the_rule(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    om_instance_t in;
    const char *field = NULL, *why = NULL;
    memset(&in, 0, sizeof in);
    in.id = "a";
    in.url = (char *)BAD[i].url;
    in.weight = 1;
    in.ttl_ms = 10000;
    OM_ASSERT_CMP(om_instance_validate(&in, &field, &why), ==, OM_EINVAL);
    assert_string_equal(field, "url");
    if (strstr(why, BAD[i].why) == NULL)
      fail_msg("\"%s\": registry says '%s', want '%s'", BAD[i].url, why,
               BAD[i].why);
  }
  for (size_t i = 0; i < sizeof GOOD / sizeof GOOD[0]; i++) {
    om_instance_t in;
    const char *field = NULL, *why = NULL;
    memset(&in, 0, sizeof in);
    in.id = "a";
    in.url = (char *)GOOD[i].url;
    in.weight = 1;
    in.ttl_ms = 10000;
    if (om_instance_validate(&in, &field, &why) != 0)
      fail_msg("%s refused by the registry: %s", GOOD[i].url, why);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(accepts_with_parts),
      cmocka_unit_test(refuses_naming_the_problem),
      cmocka_unit_test(length_and_arguments),
      cmocka_unit_test(literals_match_inet_pton),
      cmocka_unit_test(registry_uses_the_rule),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
