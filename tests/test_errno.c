/* test_errno.c: the error map gives every code a name and a message. */
#include "om_test.h"

#include <string.h>

#include "om_errno.h"

static void names_and_messages(void **state) {
  (void)state;
#define CHECK_ONE(name, value, msg)                                            \
  assert_int_equal(OM_##name, value);                                          \
  OM_ASSERT_CMP(value, <, 0);                                                  \
  assert_string_equal(om_err_name(value), #name);                              \
  assert_string_equal(om_strerror(value), msg);
  OM_ERRNO_MAP(CHECK_ONE)
#undef CHECK_ONE
  assert_string_equal(om_err_name(0), "OK");
  assert_string_equal(om_err_name(-9999), "EUNKNOWN");
  assert_string_equal(om_strerror(-9999), "unknown error");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(names_and_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
