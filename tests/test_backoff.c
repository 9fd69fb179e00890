/* test_backoff.c: full-jitter backoff, HTTP-date, Retry-After. */
#include "om_test.h"

#include <math.h>
#include <string.h>

#include "om_backoff.h"
#include "om_errno.h"

#define MS UINT64_C(1000000)
#define NOW_1994 INT64_C(784111777) /* Sun, 06 Nov 1994 08:49:37 GMT */

static int date(const char *s, int64_t now_s, int64_t *out) {
  return om_http_date_parse(s, strlen(s), now_s, out);
}

static int ra(const char *s, int64_t now_s, uint64_t ceiling, uint64_t *out) {
  return om_retry_after_parse(s, strlen(s), now_s, ceiling, out);
}

static int ram(const char *s, uint64_t ceiling, uint64_t *out) {
  return om_retry_after_ms_parse(s, strlen(s), ceiling, out);
}

/* ---- backoff ------------------------------------------------------------- */

static void ceiling_doubles_from_base_then_caps(void **state) {
  (void)state;
  /* attempt 1 = the first retry -> base; 0 is treated as 1. */
  assert_int_equal(om_backoff_ceiling_ns(0, 100 * MS, 10000 * MS), 100 * MS);
  assert_int_equal(om_backoff_ceiling_ns(1, 100 * MS, 10000 * MS), 100 * MS);
  assert_int_equal(om_backoff_ceiling_ns(2, 100 * MS, 10000 * MS), 200 * MS);
  assert_int_equal(om_backoff_ceiling_ns(3, 100 * MS, 10000 * MS), 400 * MS);
  assert_int_equal(om_backoff_ceiling_ns(7, 100 * MS, 10000 * MS), 6400 * MS);
  assert_int_equal(om_backoff_ceiling_ns(8, 100 * MS, 10000 * MS), 10000 * MS);
  assert_int_equal(om_backoff_ceiling_ns(9, 100 * MS, 10000 * MS), 10000 * MS);
  /* base above cap -> cap; base 0 -> 0 */
  assert_int_equal(om_backoff_ceiling_ns(1, 5000 * MS, 1000 * MS), 1000 * MS);
  assert_int_equal(om_backoff_ceiling_ns(50, 0, 1000 * MS), 0);
  assert_int_equal(om_backoff_ceiling_ns(50, 100 * MS, 0), 0);
}

static void ceiling_never_overflows(void **state) {
  (void)state;
  uint32_t attempts[] = {62, 63, 64, 65, 100, 1000, 100000, UINT32_MAX};
  for (size_t i = 0; i < sizeof attempts / sizeof attempts[0]; i++) {
    assert_int_equal(om_backoff_ceiling_ns(attempts[i], 100 * MS, 30000 * MS),
                     30000 * MS);
    assert_int_equal(om_backoff_ceiling_ns(attempts[i], 1, UINT64_MAX),
                     attempts[i] <= 64 ? UINT64_C(1) << (attempts[i] - 1)
                                       : UINT64_MAX);
    assert_int_equal(om_backoff_ceiling_ns(attempts[i], UINT64_MAX, UINT64_MAX),
                     UINT64_MAX);
  }
  /* 2^63 is the last doubling that fits; one more must cap, not wrap. */
  assert_int_equal(om_backoff_ceiling_ns(64, 1, UINT64_MAX), UINT64_C(1) << 63);
  assert_int_equal(om_backoff_ceiling_ns(65, 1, UINT64_MAX), UINT64_MAX);
  assert_int_equal(om_backoff_ceiling_ns(64, 2, UINT64_MAX), UINT64_MAX);
  assert_int_equal(om_backoff_full_jitter_ns(1000, 100 * MS, 30000 * MS, 0.5),
                   15000 * MS);
}

static void full_jitter_scales_the_ceiling(void **state) {
  (void)state;
  uint64_t c = 400 * MS; /* attempt 3, base 100 ms */
  assert_int_equal(om_backoff_full_jitter_ns(3, 100 * MS, 10000 * MS, 0.0), 0);
  assert_int_equal(om_backoff_full_jitter_ns(3, 100 * MS, 10000 * MS, 0.25),
                   c / 4);
  assert_int_equal(om_backoff_full_jitter_ns(3, 100 * MS, 10000 * MS, 0.5),
                   c / 2);
  assert_in_range(
      om_backoff_full_jitter_ns(3, 100 * MS, 10000 * MS, 0x1.fffffffffffffp-1),
      c - 1, c);
  /* Out-of-contract draws are clamped, never trusted. */
  assert_int_equal(om_backoff_full_jitter_ns(3, 100 * MS, 10000 * MS, -0.5), 0);
  assert_int_equal(om_backoff_full_jitter_ns(3, 100 * MS, 10000 * MS, NAN), 0);
  assert_in_range(om_backoff_full_jitter_ns(3, 100 * MS, 10000 * MS, 7.0),
                  c - 1, c);
  assert_in_range(om_backoff_full_jitter_ns(3, 100 * MS, 10000 * MS, INFINITY),
                  c - 1, c);
  /* A ceiling not representable as a double still bounds the result. */
  OM_ASSERT_CMP(om_backoff_full_jitter_ns(1, UINT64_MAX, UINT64_MAX,
                                          0x1.fffffffffffffp-1),
                <=, UINT64_MAX);
  OM_ASSERT_CMP(om_backoff_full_jitter_ns(1, (UINT64_C(1) << 60) + 1,
                                          UINT64_MAX, 0x1.fffffffffffffp-1),
                <=, (UINT64_C(1) << 60) + 1);
}

static void rng_draws_cover_the_interval(void **state) {
  (void)state;
  om_rng_t rng, again;
  uint64_t c = om_backoff_ceiling_ns(4, 100 * MS, 10000 * MS), lo = c, hi = 0;
  double sum = 0;
  const int n = 20000;
  om_rng_seed(&rng, 42);
  om_rng_seed(&again, 42);
  for (int i = 0; i < n; i++) {
    uint64_t v = om_backoff_ns(4, 100 * MS, 10000 * MS, &rng);
    OM_ASSERT_CMP(v, <, c);
    assert_int_equal(v, om_backoff_ns(4, 100 * MS, 10000 * MS, &again));
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    sum += (double)v;
  }
  /* Uniform on [0, c): mean c/2 (sd of the mean ~ c/sqrt(12 n)). */
  OM_ASSERT_NEAR(sum / n / (double)c, 0.5, 0.01);
  OM_ASSERT_CMP(lo, <, c / 100);
  OM_ASSERT_CMP(hi, >, c - c / 100);
}

/* ---- HTTP-date ------------------------------------------------------------
 */

static void http_date_three_formats(void **state) {
  (void)state;
  int64_t t = 0;
  /* RFC 9110 section 5.6.7's own examples: one instant, three spellings. */
  assert_int_equal(date("Sun, 06 Nov 1994 08:49:37 GMT", NOW_1994, &t), 0);
  assert_int_equal(t, 784111777);
  t = 0;
  assert_int_equal(date("Sunday, 06-Nov-94 08:49:37 GMT", NOW_1994, &t), 0);
  assert_int_equal(t, 784111777);
  t = 0;
  assert_int_equal(date("Sun Nov  6 08:49:37 1994", NOW_1994, &t), 0);
  assert_int_equal(t, 784111777);
  t = 0; /* date3 also allows 2DIGIT */
  assert_int_equal(date("Sun Nov 06 08:49:37 1994", NOW_1994, &t), 0);
  assert_int_equal(t, 784111777);
}

static void http_date_known_values(void **state) {
  (void)state;
  static const struct {
    const char *s;
    int64_t want;
  } cases[] = {
      {"Thu, 01 Jan 1970 00:00:00 GMT", 0},
      {"Wed, 31 Dec 1969 23:59:59 GMT", -1},
      {"Tue, 29 Feb 2000 12:00:00 GMT", 951825600},
      {"Thu, 29 Feb 2024 00:00:00 GMT", 1709164800},
      {"Fri, 31 Dec 9999 23:59:59 GMT", INT64_C(253402300799)},
      {"Mon, 01 Jan 0001 00:00:00 GMT", INT64_C(-62135596800)},
      /* the leap second the grammar allows: 23:59:60 */
      {"Wed, 31 Dec 2008 23:59:60 GMT", 1230768000},
      {"Tue Feb 29 12:00:00 2000", 951825600},
      {"Thu Jan  1 00:00:00 1970", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t t = 12345;
    int rc = date(cases[i].s, NOW_1994, &t);
    if (rc != 0 || t != cases[i].want)
      fail_msg("%s: rc %d, got %lld, want %lld", cases[i].s, rc, (long long)t,
               (long long)cases[i].want);
  }
}

static void rfc850_two_digit_years(void **state) {
  (void)state;
  const int64_t now2025 = 1748736000; /* Sun, 01 Jun 2025 00:00:00 GMT */
  const int64_t now2090 = INT64_C(3786912000); /* 2090-01-01 */
  int64_t t = 0;
  assert_int_equal(date("Friday, 15-Mar-30 00:00:00 GMT", now2025, &t), 0);
  assert_int_equal(t, 1899763200); /* 2030: in the near future */
  /* exactly 50 years ahead is not "more than 50 years": 2075 */
  assert_int_equal(date("Saturday, 01-Jun-75 00:00:00 GMT", now2025, &t), 0);
  assert_int_equal(t, INT64_C(3326572800));
  /* one second more is: the most recent past year ending in 75 */
  assert_int_equal(date("Sunday, 01-Jun-75 00:00:01 GMT", now2025, &t), 0);
  assert_int_equal(t, 170812801);
  assert_int_equal(date("Thursday, 06-Nov-75 00:00:00 GMT", now2025, &t), 0);
  assert_int_equal(t, 184464000);
  /* ... and so 2075's weekday for that date is a mismatch */
  assert_int_equal(date("Wednesday, 06-Nov-75 00:00:00 GMT", now2025, &t),
                   OM_EPARSE);
  /* late in a century, a small year is in the next one (20 years ahead) */
  assert_int_equal(date("Wednesday, 01-Jan-10 00:00:00 GMT", now2090, &t), 0);
  assert_int_equal(t, INT64_C(4417977600));
  /* 29-Feb-00 is valid in 2000 (leap) ... */
  assert_int_equal(date("Tuesday, 29-Feb-00 12:00:00 GMT", now2025, &t), 0);
  assert_int_equal(t, 951825600);
  /* ... and the year is resolved before the day is checked: in 2060,
   * "00" is 2100, which is not a leap year. */
  assert_int_equal(date("Monday, 29-Feb-00 12:00:00 GMT",
                        INT64_C(2840140800) /* 2060-01-01 */, &t),
                   OM_EPARSE);
  /* extreme clocks must not overflow */
  {
    int rc = date("Sunday, 06-Nov-94 08:49:37 GMT", INT64_MAX, &t);
    if (rc != OM_EPARSE) {
      assert_int_equal(rc, 0);
      OM_ASSERT_CMP(t, >, 0);
    }
    rc = date("Sunday, 06-Nov-94 08:49:37 GMT", INT64_MIN, &t);
    if (rc != OM_EPARSE) {
      assert_int_equal(rc, 0);
      OM_ASSERT_CMP(t, <, 0);
    }
  }
}

static void http_date_rejects_malformed(void **state) {
  (void)state;
  static const char *const bad[] = {
      "",
      "Sun, 31 Feb 1994 08:49:37 GMT",    /* no 31 Feb */
      "Tue, 29 Feb 1994 08:49:37 GMT",    /* not a leap year */
      "Mon, 29 Feb 2100 08:49:37 GMT",    /* century, not leap */
      "Sun, 00 Nov 1994 08:49:37 GMT",    /* day 0 */
      "Sun, 06 Nov 1994 25:00:00 GMT",    /* hour */
      "Sun, 06 Nov 1994 24:00:00 GMT",    /* hour */
      "Sun, 06 Nov 1994 08:60:00 GMT",    /* minute */
      "Sun, 06 Nov 1994 08:49:61 GMT",    /* second */
      "Sun, 06 Nov 1994 12:00:60 GMT",    /* leap second only at 23:59 */
      "Sun, 06 nov 1994 08:49:37 GMT",    /* lower-case month */
      "Sun, 06 NOV 1994 08:49:37 GMT",    /* upper-case month */
      "sun, 06 Nov 1994 08:49:37 GMT",    /* lower-case day name */
      "Sun, 06 Nov 1994 08:49:37",        /* missing GMT */
      "Sun, 06 Nov 1994 08:49:37 UTC",    /* not GMT */
      "Sun, 06 Nov 1994 08:49:37 gmt",    /* GMT is case-sensitive */
      "Sun, 06 Nov 1994 08:49:37 GMT ",   /* trailing (trimmed by caller) */
      " Sun, 06 Nov 1994 08:49:37 GMT",   /* leading */
      "Sun, 06 Nov 1994 08:49:37 GMTx",   /* trailing junk */
      "Mon, 06 Nov 1994 08:49:37 GMT",    /* wrong weekday */
      "Sun, 6 Nov 1994 08:49:37 GMT",     /* day is 2DIGIT */
      "Sun, 06 Nov 94 08:49:37 GMT",      /* year is 4DIGIT */
      "Sun,06 Nov 1994 08:49:37 GMT",     /* SP after comma */
      "Sun, 06  Nov 1994 08:49:37 GMT",   /* one SP only */
      "Sun, 06 Nov 1994 8:49:37 GMT",     /* hour is 2DIGIT */
      "Sun, 06 Nov 1994 08.49.37 GMT",    /* colons */
      "Sun, 06-Nov-1994 08:49:37 GMT",    /* IMF with dashes */
      "Sunday, 06-Nov-1994 08:49:37 GMT", /* rfc850 year is 2DIGIT */
      "Sunday, 06 Nov 1994 08:49:37 GMT", /* long name, IMF body */
      "Sun, 06-Nov-94 08:49:37 GMT",      /* short name, rfc850 body */
      "Sunday, 06-Nov-94 08:49:37",       /* rfc850 needs GMT */
      "Monday, 06-Nov-94 08:49:37 GMT",   /* wrong weekday */
      "Sundy, 06-Nov-94 08:49:37 GMT",
      "Sun Nov 6 08:49:37 1994", /* asctime: SP SP DIGIT */
      "Sun Nov   6 08:49:37 1994",
      "Sun Nov  6 08:49:37 94",
      "Sun Nov  6 08:49:37 1994 GMT", /* asctime has no zone */
      "Sun Nov 36 08:49:37 1994",
      "Sun Nov  6 08:49:37 1994\n",
      "Sun",
      "Sun, ",
      "Sun, 06 Nov 1994 08:49:3",
      "Xyz, 06 Nov 1994 08:49:37 GMT",
      "Sun, 06 Foo 1994 08:49:37 GMT",
      "Sun, +6 Nov 1994 08:49:37 GMT",
      "1994-11-06T08:49:37Z", /* ISO 8601 is not an HTTP-date */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int64_t t = 777;
    int rc = date(bad[i], NOW_1994, &t);
    if (rc != OM_EPARSE || t != 777)
      fail_msg("\"%s\": rc %d (want %d), out %lld", bad[i], rc, OM_EPARSE,
               (long long)t);
  }
  /* an embedded NUL is not the end of the value */
  {
    int64_t t = 777;
    const char s[] = "Sun, 06 Nov 1994 08:49:37 GMT\0junk";
    assert_int_equal(om_http_date_parse(s, sizeof s - 1, NOW_1994, &t),
                     OM_EPARSE);
    assert_int_equal(t, 777);
  }
  {
    int64_t t;
    assert_int_equal(om_http_date_parse(NULL, 3, 0, &t), OM_EINVAL);
    assert_int_equal(om_http_date_parse("x", 1, 0, NULL), OM_EINVAL);
    assert_int_equal(om_http_date_parse(NULL, 0, 0, &t), OM_EPARSE);
  }
}

/* ---- Retry-After ----------------------------------------------------------
 */

static void retry_after_delay_seconds(void **state) {
  (void)state;
  uint64_t ms = 1;
  assert_int_equal(ra("0", 0, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 0);
  assert_int_equal(ra("120", 0, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 120000);
  assert_int_equal(ra("007", 0, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 7000);
  assert_int_equal(ra(" \t120\t ", 0, UINT64_MAX, &ms), 0); /* OWS */
  assert_int_equal(ms, 120000);
  /* clamped to the ceiling */
  assert_int_equal(ra("120", 0, 60000, &ms), 0);
  assert_int_equal(ms, 60000);
  assert_int_equal(ra("60", 0, 60000, &ms), 0);
  assert_int_equal(ms, 60000);
  /* huge values saturate, then clamp: never wrap to something small */
  assert_int_equal(ra("99999999999999999999999", 0, 60000, &ms), 0);
  assert_int_equal(ms, 60000);
  assert_int_equal(ra("99999999999999999999999", 0, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, UINT64_MAX);
  /* 2^64 / 1000 + 1 seconds: the x1000 must saturate too */
  assert_int_equal(ra("18446744073709552", 0, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, UINT64_MAX);
  assert_int_equal(ra("18446744073709551", 0, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, UINT64_C(18446744073709551000));
  /* 18446744073709551616 = 2^64 would wrap to 0 with naive parsing */
  assert_int_equal(ra("18446744073709551616", 0, 5000, &ms), 0);
  assert_int_equal(ms, 5000);
}

static void retry_after_http_date(void **state) {
  (void)state;
  uint64_t ms = 1;
  const char *d = "Sun, 06 Nov 1994 08:49:37 GMT";
  assert_int_equal(ra(d, NOW_1994 - 10, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 10000);
  assert_int_equal(
      ra("Sunday, 06-Nov-94 08:49:37 GMT", NOW_1994 - 10, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 10000);
  assert_int_equal(
      ra("  Sun Nov  6 08:49:37 1994 ", NOW_1994 - 10, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 10000);
  /* now, and the past -> 0 */
  assert_int_equal(ra(d, NOW_1994, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 0);
  ms = 1;
  assert_int_equal(ra(d, NOW_1994 + 86400 * 365, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 0);
  /* far future -> ceiling */
  assert_int_equal(ra(d, NOW_1994 - 3600, 60000, &ms), 0);
  assert_int_equal(ms, 60000);
  assert_int_equal(
      ra("Fri, 31 Dec 9999 23:59:59 GMT", INT64_MIN, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, UINT64_MAX); /* (2^63 + 2.5e11) s x 1000 saturates */
  assert_int_equal(ra(d, INT64_MAX, UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 0);
}

static void retry_after_rejects_malformed(void **state) {
  (void)state;
  static const char *const bad[] = {
      "",
      " ",
      "\t \t",
      "-1",
      "+1",
      "1.5", /* delay-seconds is 1*DIGIT */
      "1,5",
      "12abc",
      "abc",
      "1 2",
      "0x10",
      "1e3",
      "\v12", /* VT is not OWS */
      "12\r\n",
      "Sun, 31 Feb 1994 08:49:37 GMT",
      "Sun, 06 Nov 1994 25:00:00 GMT",
      "Sun, 06 nov 1994 08:49:37 GMT",
      "Sun, 06 Nov 1994 08:49:37",
      "Sun, 06 Nov 1994 08:49:37 GMT, 120",
      "120, Sun, 06 Nov 1994 08:49:37 GMT",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t ms = 777;
    int rc = ra(bad[i], NOW_1994 - 10, 60000, &ms);
    if (rc != OM_EPARSE || ms != 777)
      fail_msg("\"%s\": rc %d (want %d), out %llu", bad[i], rc, OM_EPARSE,
               (unsigned long long)ms);
  }
  {
    uint64_t ms = 777;
    const char s[] = "12\0";
    assert_int_equal(om_retry_after_parse(s, 3, 0, 60000, &ms), OM_EPARSE);
    assert_int_equal(ms, 777);
    assert_int_equal(om_retry_after_parse(NULL, 0, 0, 60000, &ms), OM_EPARSE);
    assert_int_equal(om_retry_after_parse(NULL, 2, 0, 60000, &ms), OM_EINVAL);
    assert_int_equal(om_retry_after_parse("1", 1, 0, 60000, NULL), OM_EINVAL);
    assert_int_equal(ms, 777);
  }
}

static void retry_after_ms_values(void **state) {
  (void)state;
  uint64_t ms = 1;
  assert_int_equal(ram("1500", UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 1500);
  assert_int_equal(ram(" 0 ", UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 0);
  /* a fraction rounds up: never wait less than asked */
  assert_int_equal(ram("1.5", UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 2);
  assert_int_equal(ram("0.001", UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 1);
  assert_int_equal(ram("7.000", UINT64_MAX, &ms), 0);
  assert_int_equal(ms, 7);
  assert_int_equal(ram("90000", 60000, &ms), 0);
  assert_int_equal(ms, 60000);
  assert_int_equal(ram("99999999999999999999999.9", UINT64_MAX, &ms), 0);
  assert_int_equal(ms, UINT64_MAX);
  assert_int_equal(ram("99999999999999999999999", 1000, &ms), 0);
  assert_int_equal(ms, 1000);
  {
    static const char *const bad[] = {
        "",    " ",   "-1",  "+1",   ".5",   "5.",  "1..5", "1.5.",
        "1e3", "1,5", "abc", "12ms", "0x10", "1 2", "NaN",  "inf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      uint64_t v = 777;
      int rc = ram(bad[i], 60000, &v);
      if (rc != OM_EPARSE || v != 777)
        fail_msg("\"%s\": rc %d (want %d), out %llu", bad[i], rc, OM_EPARSE,
                 (unsigned long long)v);
    }
  }
  assert_int_equal(om_retry_after_ms_parse(NULL, 1, 0, &ms), OM_EINVAL);
  assert_int_equal(om_retry_after_ms_parse("1", 1, 0, NULL), OM_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(ceiling_doubles_from_base_then_caps),
      cmocka_unit_test(ceiling_never_overflows),
      cmocka_unit_test(full_jitter_scales_the_ceiling),
      cmocka_unit_test(rng_draws_cover_the_interval),
      cmocka_unit_test(http_date_three_formats),
      cmocka_unit_test(http_date_known_values),
      cmocka_unit_test(rfc850_two_digit_years),
      cmocka_unit_test(http_date_rejects_malformed),
      cmocka_unit_test(retry_after_delay_seconds),
      cmocka_unit_test(retry_after_http_date),
      cmocka_unit_test(retry_after_rejects_malformed),
      cmocka_unit_test(retry_after_ms_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
