/* test_metrics.c: the Prometheus registry renders the text format exactly. */
#include "om_test.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(renders_families),
      cmocka_unit_test(histogram_buckets_are_cumulative),
      cmocka_unit_test(bad_registrations_are_refused),
      cmocka_unit_test(allocation_failures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
