/* test_auth.c: token files, roles and checks. */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "om_auth.h"
#include "om_errno.h"

static char path[64];

static void write_tokens(const char *text) {
  FILE *f;
  snprintf(path, sizeof path, "/tmp/om-tokens-%d", (int)getpid());
  f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static om_auth_result_t check(om_auth_t *a, const char *header, int role) {
  return om_auth_check(a, header, header ? strlen(header) : 0, role);
}

static void roles_are_enforced(void **state) {
  (void)state;
  char err[256];
  om_auth_t *a = NULL;
  write_tokens("# comment\n\nreader read\nagent register\n"
               "root admin\nboth read,register\n");
  assert_int_equal(om_auth_load(path, &a, err, sizeof err), 0);
  assert_int_equal(om_auth_count(a), 4);
  assert_int_equal(check(a, NULL, OM_ROLE_READ), OM_AUTH_MISSING);
  assert_int_equal(check(a, "Bearer reader", OM_ROLE_READ), OM_AUTH_OK);
  assert_int_equal(check(a, "bearer  reader ", OM_ROLE_READ), OM_AUTH_OK);
  assert_int_equal(check(a, "Bearer reader", OM_ROLE_REGISTER),
                   OM_AUTH_FORBIDDEN);
  assert_int_equal(check(a, "Bearer agent", OM_ROLE_REGISTER), OM_AUTH_OK);
  assert_int_equal(check(a, "Bearer agent", OM_ROLE_ADMIN), OM_AUTH_FORBIDDEN);
  assert_int_equal(check(a, "Bearer root", OM_ROLE_ADMIN), OM_AUTH_OK);
  assert_int_equal(check(a, "Bearer root", OM_ROLE_READ), OM_AUTH_OK);
  assert_int_equal(check(a, "Bearer both", OM_ROLE_REGISTER), OM_AUTH_OK);
  assert_int_equal(check(a, "Bearer readerx", OM_ROLE_READ), OM_AUTH_INVALID);
  assert_int_equal(check(a, "Bearer reade", OM_ROLE_READ), OM_AUTH_INVALID);
  assert_int_equal(check(a, "Basic cmVhZGVy", OM_ROLE_READ), OM_AUTH_INVALID);
  assert_int_equal(check(a, "Bearer ", OM_ROLE_READ), OM_AUTH_INVALID);
  assert_int_equal(check(a, "", OM_ROLE_READ), OM_AUTH_INVALID);
  om_auth_free(a);
  unlink(path);
}

static void bad_files_name_the_line(void **state) {
  (void)state;
  static const struct {
    const char *text, *want;
  } bad[] = {
      {"tok\n", ":1: expected"},
      {"ok read\ntok superuser\n", ":2: expected"},
      {"tok read extra\n", ":1: expected"},
      {"# nothing\n", "no tokens"},
      {"a read\nb register\na admin\n", ":3: the same token as line 1"},
      {"san:spiffe://x/a read\nsan:spiffe://x/a admin\n",
       ":2: 'san:spiffe://x/a' is already on line 1"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char err[256];
    om_auth_t *a = NULL;
    write_tokens(bad[i].text);
    assert_int_equal(om_auth_load(path, &a, err, sizeof err), OM_EPARSE);
    assert_null(a);
    if (strstr(err, bad[i].want) == NULL)
      fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].want);
  }
  unlink(path);
  char err[256];
  om_auth_t *a = NULL;
  assert_int_equal(om_auth_load("/nonexistent/tokens", &a, err, sizeof err),
                   OM_ENOTFOUND);
}

/* A stream keeps its token as a digest; the digest still means the same
 * token after a reload, so the new file decides whether it goes on. */
static void digests_outlive_reloads(void **state) {
  (void)state;
  char err[256];
  om_auth_t *a = NULL, *b = NULL;
  om_auth_digest_t d, other;
  write_tokens("keeper read\nleaver read\n");
  assert_int_equal(om_auth_load(path, &a, err, sizeof err), 0);
  assert_int_equal(om_auth_digest("Bearer keeper", 13, &d), OM_AUTH_OK);
  assert_int_equal(om_auth_digest("Bearer leaver", 13, &other), OM_AUTH_OK);
  assert_int_equal(om_auth_check_digest(a, &d, OM_ROLE_READ), OM_AUTH_OK);
  assert_int_equal(om_auth_check_digest(a, &other, OM_ROLE_READ), OM_AUTH_OK);
  write_tokens("keeper register\nnewcomer read\n");
  assert_int_equal(om_auth_load(path, &b, err, sizeof err), 0);
  assert_int_equal(om_auth_check_digest(b, &d, OM_ROLE_REGISTER), OM_AUTH_OK);
  assert_int_equal(om_auth_check_digest(b, &d, OM_ROLE_READ),
                   OM_AUTH_FORBIDDEN);
  assert_int_equal(om_auth_check_digest(b, &other, OM_ROLE_READ),
                   OM_AUTH_INVALID);
  assert_int_equal(om_auth_digest(NULL, 0, &d), OM_AUTH_MISSING);
  assert_int_equal(om_auth_digest("Basic eA==", 10, &d), OM_AUTH_INVALID);
  om_auth_free(a);
  om_auth_free(b);
  unlink(path);
}

static void san_lines_grant_roles_to_certificates(void **state) {
  (void)state;
  char err[256];
  om_auth_t *a = NULL;
  const char *deployer[] = {"spiffe://mesh/ns/ops/sa/deployer",
                            "deployer.ops.mesh"};
  const char *reader[] = {"spiffe://mesh/ns/a/sa/x"};
  const char *stranger[] = {"spiffe://mesh/ns/b/sa/y", "b.mesh"};
  write_tokens("tok read\nsan:spiffe://mesh/ns/ops/sa/deployer admin\n"
               "san:spiffe://mesh/ns/a/sa/x read\n"
               "san:reader.mesh read\nsan:b.mesh register\n");
  assert_int_equal(om_auth_load(path, &a, err, sizeof err), 0);
  OM_ASSERT_CMP(om_auth_count(a), ==, 5);
  OM_ASSERT_CMP(om_auth_san_count(a), ==, 4);
  OM_ASSERT_CMP(om_auth_check_sans(a, deployer, 2, OM_ROLE_ADMIN), ==,
                OM_AUTH_OK);
  OM_ASSERT_CMP(om_auth_check_sans(a, reader, 1, OM_ROLE_READ), ==, OM_AUTH_OK);
  OM_ASSERT_CMP(om_auth_check_sans(a, reader, 1, OM_ROLE_REGISTER), ==,
                OM_AUTH_FORBIDDEN);
  /* a DNS SAN matches too; a URI that is not listed does not */
  OM_ASSERT_CMP(om_auth_check_sans(a, stranger, 2, OM_ROLE_REGISTER), ==,
                OM_AUTH_OK);
  OM_ASSERT_CMP(om_auth_check_sans(a, stranger, 1, OM_ROLE_READ), ==,
                OM_AUTH_MISSING);
  OM_ASSERT_CMP(om_auth_check_sans(a, NULL, 0, OM_ROLE_READ), ==,
                OM_AUTH_MISSING);
  /* a SAN name is never a bearer token */
  OM_ASSERT_CMP(check(a, "Bearer san:reader.mesh", OM_ROLE_READ), ==,
                OM_AUTH_INVALID);
  OM_ASSERT_CMP(check(a, "Bearer tok", OM_ROLE_READ), ==, OM_AUTH_OK);
  om_auth_free(a);
  /* a file of SAN lines only is a valid file; an empty name is not */
  write_tokens("san:b.mesh read\n");
  assert_int_equal(om_auth_load(path, &a, err, sizeof err), 0);
  om_auth_free(a);
  a = NULL;
  write_tokens("san: read\n");
  assert_int_equal(om_auth_load(path, &a, err, sizeof err), OM_EPARSE);
  if (strstr(err, ":1: 'san:' needs a name") == NULL)
    fail_msg("'%s' lacks the reason", err);
  unlink(path);
}

static void load_survives_allocation_failures(void **state) {
  (void)state;
  write_tokens("a read\nb register\nsan:x.mesh read\nc admin\n");
  for (long n = 0;; n++) {
    char err[256];
    om_auth_t *a = NULL;
    om_test_fail_alloc_after(n);
    int rc = om_auth_load(path, &a, err, sizeof err);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(om_auth_count(a), 4);
      om_auth_free(a);
      break;
    }
    assert_null(a);
  }
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(roles_are_enforced),
      cmocka_unit_test(bad_files_name_the_line),
      cmocka_unit_test(digests_outlive_reloads),
      cmocka_unit_test(san_lines_grant_roles_to_certificates),
      cmocka_unit_test(load_survives_allocation_failures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
