/* test_metrics.c: the Prometheus registry renders the text format exactly. */
#include "om_test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "om_metrics.h"

static void renders_families(void **state) {
  (void)state;
  om_metrics_t *m = om_metrics_new();
  om_metric_t *a = om_metrics_counter(m, "om_rejections_total",
                                      "Rejected requests.", "reason=\"a\"");
  om_metric_t *g = om_metrics_gauge(m, "om_watchers", "Open watches.", "");
  om_metric_t *b = om_metrics_counter(m, "om_rejections_total",
                                      "Rejected requests.", "reason=\"b\"");
  assert_non_null(a);
  assert_non_null(b);
  assert_ptr_equal(
      om_metrics_counter(m, "om_rejections_total", "x", "reason=\"a\""), a);
  om_metric_inc(a);
  om_metric_add(b, 41);
  om_metric_inc(b);
  om_metric_set(g, 2.5);
  size_t len;
  char *text = om_metrics_render(m, &len);
  assert_non_null(text);
  assert_int_equal(strlen(text), len);
  assert_string_equal(text, "# HELP om_rejections_total Rejected requests.\n"
                            "# TYPE om_rejections_total counter\n"
                            "om_rejections_total{reason=\"a\"} 1\n"
                            "om_rejections_total{reason=\"b\"} 42\n"
                            "# HELP om_watchers Open watches.\n"
                            "# TYPE om_watchers gauge\n"
                            "om_watchers 2.5\n");
  free(text);
  om_metrics_free(m);
}

static void histogram_buckets_are_cumulative(void **state) {
  (void)state;
  const double bounds[] = {0.001, 0.01, 0.1};
  om_metrics_t *m = om_metrics_new();
  om_metric_t *h = om_metrics_histogram(m, "om_latency_seconds", "Latency.",
                                        "route=\"x\"", bounds, 3);
  assert_non_null(h);
  om_metric_observe(h, 0.0005);
  om_metric_observe(h, 0.005);
  om_metric_observe(h, 0.005);
  om_metric_observe(h, 5);
  char *text = om_metrics_render(m, NULL);
  assert_non_null(strstr(text, "om_latency_seconds_bucket{route=\"x\","
                               "le=\"0.001\"} 1\n"));
  assert_non_null(strstr(text, "le=\"0.01\"} 3\n"));
  assert_non_null(strstr(text, "le=\"0.1\"} 3\n"));
  assert_non_null(strstr(text, "le=\"+Inf\"} 4\n"));
  assert_non_null(strstr(text, "om_latency_seconds_count{route=\"x\"} 4\n"));
  assert_non_null(strstr(text, "# TYPE om_latency_seconds histogram\n"));
  free(text);
  om_metrics_free(m);
}

static double seven(void *ud) {
  return *(double *)ud;
}

static void bad_registrations_are_refused(void **state) {
  (void)state;
  const double unsorted[] = {1, 0.5};
  double v = 7;
  om_metrics_t *m = om_metrics_new();
  assert_null(om_metrics_counter(m, "9bad", "x", ""));
  assert_null(om_metrics_counter(m, "has space", "x", ""));
  assert_null(om_metrics_counter(m, "", "x", ""));
  assert_non_null(om_metrics_counter(m, "om_x", "x", ""));
  assert_null(om_metrics_gauge(m, "om_x", "x", "")); /* type clash */
  assert_null(om_metrics_histogram(m, "om_h", "x", "", unsorted, 2));
  om_metric_t *fn = om_metrics_gauge_fn(m, "om_fn", "x", "", seven, &v);
  OM_ASSERT_CMP(om_metric_value(fn), ==, 7);
  /* The updaters accept NULL: a failed registration never crashes. */
  om_metric_inc(NULL);
  om_metric_observe(NULL, 1);
  char esc[16];
  assert_string_equal(om_metrics_escape("a\"b\\c\nd", esc, sizeof esc),
                      "a\\\"b\\\\c\\nd");
  om_metrics_free(m);
}

static void allocation_failures(void **state) {
  (void)state;
  for (long n = 0;; n++) {
    om_test_fail_alloc_after(n);
    om_metrics_t *m = om_metrics_new();
    om_metric_t *c = m ? om_metrics_counter(m, "om_c", "c", "") : NULL;
    char *text = c ? om_metrics_render(m, NULL) : NULL;
    om_test_alloc_reset();
    free(text);
    om_metrics_free(m);
    if (text != NULL)
      break;
    OM_ASSERT_CMP(n, <, 100);
  }
}

/* What every proxy worker does with the one registry: register the same
 * series (and get the same one back), then update it from its thread. */
typedef struct {
  om_metrics_t *m;
  om_metric_t *got, *hist;
} racer_t;

#define RACE_N 1000000

static void *race(void *ud) {
  racer_t *r = ud;
  static const double bounds[] = {1, 2};
  r->got = om_metrics_counter(r->m, "om_calls_total", "Calls.", "w=\"x\"");
  r->hist = om_metrics_histogram(r->m, "om_seconds", "Latency.", "", bounds, 2);
  for (int i = 0; i < RACE_N; i++) {
    om_metric_inc(r->got);
    if ((i & 1023) == 0)
      om_metric_observe(r->hist, 1.5);
  }
  return NULL;
}

static void threads_share_series_and_sum_exactly(void **state) {
  (void)state;
  om_metrics_t *m = om_metrics_new();
  racer_t r[2] = {{.m = m}, {.m = m}};
  pthread_t t[2];
  assert_non_null(m);
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&t[i], NULL, race, &r[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  assert_non_null(r[0].got);
  assert_ptr_equal(r[0].got, r[1].got);
  assert_ptr_equal(r[0].hist, r[1].hist);
  OM_ASSERT_CMP(om_metric_value(r[0].got), ==, 2.0 * RACE_N);
  char *text = om_metrics_render(m, NULL);
  assert_non_null(text);
  /* 977 observations per thread (i = 0, 1024, ... < 1e6) */
  assert_non_null(strstr(text, "om_seconds_count 1954\n"));
  assert_non_null(strstr(text, "om_seconds_sum 2931\n"));
  free(text);
  om_metrics_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(renders_families),
      cmocka_unit_test(histogram_buckets_are_cumulative),
      cmocka_unit_test(bad_registrations_are_refused),
      cmocka_unit_test(allocation_failures),
      cmocka_unit_test(threads_share_series_and_sum_exactly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
