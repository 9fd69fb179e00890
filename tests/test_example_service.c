/*
 * test_example_service.c: the services `openmesh up` runs answer as their
 * behaviour says and keep a real lease in the store.
 */
#include "om_test.h"

#include "http_test_client.h"

#include "om_errno.h"
#include "om_example_service.h"
#include "om_store_memory.h"

typedef struct {
  uv_loop_t loop;
  om_store_t *store;
  int stopped;
} fx_t;

static void on_snapshot(void *ud, int status, om_snapshot_t *snap) {
  size_t *count = ud;
  *count = status == 0 && snap != NULL ? om_snapshot_count(snap) : 0;
}

static size_t registered(fx_t *fx) {
  size_t count = 99;
  om_store_snapshot(fx->store, "orders", on_snapshot, &count);
  for (int i = 0; i < 100 && count == 99; i++)
    uv_run(&fx->loop, UV_RUN_NOWAIT);
  return count;
}

/* One GET; returns the status, the body in body (cap bytes). */
static int get(fx_t *fx, int port, uint64_t *elapsed_ms) {
  htc_t *c = htc_new("127.0.0.1", port);
  htc_resp_t r[1];
  uint64_t t0 = htc_now_ms();
  int n = 0;
  assert_non_null(c);
  assert_int_equal(
      htc_sends(&fx->loop, c, "GET / HTTP/1.1\r\nHost: orders\r\n\r\n"), 0);
  while ((n = htc_responses(c, NULL, r, 1)) == 0 && htc_now_ms() - t0 < 3000)
    htc_step(&fx->loop, c, 5);
  if (elapsed_ms != NULL)
    *elapsed_ms = htc_now_ms() - t0;
  htc_free(c);
  assert_int_equal(n, 1);
  return r[0].status;
}

static void on_stopped(void *ud) {
  ((fx_t *)ud)->stopped++;
}

static void on_store_closed(void *ud) {
  (void)ud;
}

static void behaviours_and_leases(void **state) {
  (void)state;
  fx_t fx = {0};
  const om_kv_t v2[] = {{"version", "v2"}};
  om_example_t *fast, *slow, *flaky;
  om_example_opts_t o = {.service = "orders", .host = "127.0.0.1"};
  uint64_t ms;
  assert_int_equal(uv_loop_init(&fx.loop), 0);
  assert_int_equal(om_store_memory_new(&fx.loop, NULL, &fx.store), 0);
  o.id = "fast";
  o.metadata = v2;
  o.n_metadata = 1;
  assert_int_equal(om_example_start(&fx.loop, fx.store, &o, &fast), 0);
  o.id = "slow";
  o.behaviour = OM_EXAMPLE_SLOW;
  o.delay_ms = 150;
  o.n_metadata = 0;
  assert_int_equal(om_example_start(&fx.loop, fx.store, &o, &slow), 0);
  o.id = "flaky";
  o.behaviour = OM_EXAMPLE_FLAKY;
  o.fail_every = 2;
  assert_int_equal(om_example_start(&fx.loop, fx.store, &o, &flaky), 0);
  assert_int_equal(registered(&fx), 3);

  int fast_port = atoi(strrchr(om_example_url(fast), ':') + 1);
  int slow_port = atoi(strrchr(om_example_url(slow), ':') + 1);
  int flaky_port = atoi(strrchr(om_example_url(flaky), ':') + 1);
  assert_int_equal(get(&fx, fast_port, NULL), 200);
  assert_int_equal(get(&fx, slow_port, &ms), 200);
  OM_TEST_NOTE("slow answered after %llu ms", (unsigned long long)ms);
  OM_ASSERT_CMP(ms, >=, 140);
  assert_int_equal(get(&fx, flaky_port, NULL), 200);
  assert_int_equal(get(&fx, flaky_port, NULL), 503);
  assert_int_equal(get(&fx, flaky_port, NULL), 200);
  assert_int_equal(om_example_requests(flaky), 3);

  /* a second service on a taken port fails cleanly */
  om_example_t *dup = NULL;
  o.id = "dup";
  o.port = fast_port;
  assert_int_equal(om_example_start(&fx.loop, fx.store, &o, &dup), OM_EIO);
  assert_null(dup);
  o.id = "bad id!";
  o.port = 0;
  assert_int_equal(om_example_start(&fx.loop, fx.store, &o, &dup), OM_EINVAL);

  /* stopping deregisters before the services go away */
  om_example_stop(fast, on_stopped, &fx);
  om_example_stop(slow, on_stopped, &fx);
  om_example_stop(flaky, on_stopped, &fx);
  while (fx.stopped < 3)
    uv_run(&fx.loop, UV_RUN_ONCE);
  assert_int_equal(registered(&fx), 0);
  om_store_close(fx.store, on_store_closed, NULL);
  uv_run(&fx.loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx.loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(behaviours_and_leases),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
