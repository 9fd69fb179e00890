/*
 * test_proxy_workers.c: what the proxy's workers share. The circuit table
 * gives every worker's peer of one service, id and URL the same circuit,
 * so failures seen by two threads add up to one ejection; a group refuses
 * worker counts out of range, binds once, reports a taken port as "address
 * already in use", runs and closes. Whole-process behaviour (connections
 * on both workers, fan-out, drain) is in spec/03-integration/workers_spec.
 */
#include "om_test.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "om_errno.h"
#include "om_proxy_internal.h"
#include "om_proxy_workers.h"

static void circuits_are_shared_by_key(void **state) {
  om_proxy_circuits_t *t = om_proxy_circuits_new();
  om_circuit_opts_t co;
  (void)state;
  assert_non_null(t);
  om_circuit_opts_default(&co);
  om__proxy_circuit_t *a =
      om__proxy_circuit_get(t, "web", "a", "http://x", &co);
  om__proxy_circuit_t *b =
      om__proxy_circuit_get(t, "web", "a", "http://x", &co);
  om__proxy_circuit_t *c =
      om__proxy_circuit_get(t, "web", "a", "http://y", &co);
  om__proxy_circuit_t *d =
      om__proxy_circuit_get(t, "api", "a", "http://x", &co);
  om__proxy_circuit_t *own =
      om__proxy_circuit_get(NULL, "web", "a", "http://x", &co);
  assert_non_null(a);
  assert_ptr_equal(a, b);
  assert_ptr_not_equal(a, c);
  assert_ptr_not_equal(a, d);
  assert_ptr_not_equal(a, own); /* no table: private */
  om__proxy_circuit_unref(a);
  /* b still holds it: the same record comes back */
  om__proxy_circuit_t *again =
      om__proxy_circuit_get(t, "web", "a", "http://x", &co);
  assert_ptr_equal(b, again);
  om__proxy_circuit_unref(again);
  om__proxy_circuit_unref(b);
  om__proxy_circuit_unref(c);
  om__proxy_circuit_unref(d);
  om__proxy_circuit_unref(own);
  om_proxy_circuits_free(t);
}

typedef struct {
  om_proxy_circuits_t *t;
  const om_circuit_opts_t *co;
  int failures;
} failer_t;

static void *fail_some(void *ud) {
  failer_t *f = ud;
  om__proxy_circuit_t *r =
      om__proxy_circuit_get(f->t, "web", "dead", "http://127.0.0.1:1", f->co);
  for (int i = 0; i < f->failures; i++)
    if (om__proxy_circuit_allow(r, 1000))
      om__proxy_circuit_record(r, 1000, false);
  om__proxy_circuit_unref(r);
  return NULL;
}

/* Two workers' threads, 3 and 2 failures, 5 to trip: the circuit opens. */
static void failures_from_two_threads_open_one_circuit(void **state) {
  om_proxy_circuits_t *t = om_proxy_circuits_new();
  om_circuit_opts_t co;
  pthread_t th[2];
  (void)state;
  om_circuit_opts_default(&co);
  co.failures = 5;
  om__proxy_circuit_t *held =
      om__proxy_circuit_get(t, "web", "dead", "http://127.0.0.1:1", &co);
  failer_t f[2] = {{t, &co, 3}, {t, &co, 2}};
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, fail_some, &f[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  OM_ASSERT_CMP((int)om__proxy_circuit_state(held, 1000), ==,
                (int)OM_CIRCUIT_OPEN);
  om__proxy_circuit_unref(held);
  om_proxy_circuits_free(t);
}

static char policy_path[64];

static void write_policy(void) {
  FILE *f;
  snprintf(policy_path, sizeof policy_path, "/tmp/om_workers_%d.lua",
           (int)getpid());
  f = fopen(policy_path, "w");
  assert_non_null(f);
  fputs("return { kind = \"traffic\" }\n", f);
  fclose(f);
}

static void on_closed(void *ud) {
  (*(int *)ud)++;
}

static void group_binds_once_and_names_a_taken_port(void **state) {
  uv_loop_t loop;
  om_proxy_group_opts_t o;
  om_proxy_group_t *g = NULL, *g2 = NULL;
  char err[256];
  int closed = 0, port;
  (void)state;
  write_policy();
  assert_int_equal(uv_loop_init(&loop), 0);
  memset(&o, 0, sizeof o);
  o.proxy.policy_path = policy_path;
  o.workers = 0;
  assert_int_equal(om_proxy_group_new(&loop, &o, &g, err, sizeof err),
                   OM_EINVAL);
  o.workers = OM_PROXY_MAX_WORKERS + 1;
  assert_int_equal(om_proxy_group_new(&loop, &o, &g, err, sizeof err),
                   OM_EINVAL);
  o.workers = 2;
  assert_int_equal(om_proxy_group_new(&loop, &o, &g, err, sizeof err), 0);
  assert_int_equal(om_proxy_group_listen(g, "127.0.0.1", 0, err, sizeof err),
                   0);
  port = om_proxy_group_port(g);
  OM_ASSERT_CMP(port, >, 0);
  assert_int_equal(om_proxy_group_new(&loop, &o, &g2, err, sizeof err), 0);
  assert_int_equal(
      om_proxy_group_listen(g2, "127.0.0.1", port, err, sizeof err), OM_EIO);
  assert_string_equal(err, "address already in use");
  assert_int_equal(om_proxy_group_close(g2, on_closed, &closed), 0);
  assert_int_equal(om_proxy_group_start(g), 0);
  assert_int_equal(om_proxy_group_close(g, on_closed, &closed), 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(closed, 2);
  assert_int_equal(uv_loop_close(&loop), 0);
  unlink(policy_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(circuits_are_shared_by_key),
      cmocka_unit_test(failures_from_two_threads_open_one_circuit),
      cmocka_unit_test(group_binds_once_and_names_a_taken_port),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
