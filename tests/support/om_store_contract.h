/*
 * om_store_contract.h: the storage contract (om_store.h) as one cmocka
 * suite, run against every store: test_store_memory.c and
 * test_store_redis.c each describe how to open a fresh, empty, ready store
 * and list OM_STORE_CONTRACT_TESTS(&backend) beside their own cases.
 *
 * The cases wait for every outcome on the loop (a callback count reaching
 * its mark), so they hold for a store that answers later (Redis) as for
 * one that answers before the call returns (memory); what only the second
 * kind promises is asserted when backend->sync is set.
 */
#ifndef OM_STORE_CONTRACT_H
#define OM_STORE_CONTRACT_H

#include <uv.h>

#include "om_store.h"
#include "om_test.h"

typedef struct om_store_backend_s {
  const char *name; /* what om_store_name returns */
  /* A new empty store on loop, ready for writes (the case closes it). */
  om_store_t *(*open)(uv_loop_t *loop);
  /* Callbacks run before the call that caused them returns. */
  int sync;
} om_store_backend_t;

/* A write's outcome, as om_store_test_on_write records it. */
typedef struct om_store_wres_s {
  int calls, status;
  om_store_change_t change;
  uint64_t revision;
} om_store_wres_t;

/* An om_store_write_cb that counts calls into the om_store_wres_t ud. */
void om_store_test_on_write(void *ud, int status, om_store_change_t change,
                            uint64_t revision);

/* What om_store_test_on_gone saw of om_store_collect_empty's names: how
 * many, the last, and whether they came in strictly rising name order
 * (start it at {0, "", 1}). */
typedef struct om_store_gone_s {
  size_t n;
  char last[32];
  int ordered;
} om_store_gone_t;

/* om_store_collect_empty's gone callback, into the om_store_gone_t ud. */
void om_store_test_on_gone(void *ud, const char *service);

/* om_store_collect_empty's keep: claims "s00007" only. */
int om_store_test_keep_seven(void *ud, const char *service);

/* An instance of weight 1 (the strings are borrowed, not copied). */
om_instance_t om_store_test_inst(const char *id, const char *url, uint64_t ttl);

void om_store_contract_lifecycle(void **state);
void om_store_contract_subscribers(void **state);
void om_store_contract_reentrant_callbacks(void **state);
void om_store_contract_close_inside_a_callback(void **state);
void om_store_contract_config_documents(void **state);
void om_store_contract_list_services(void **state);

/* The contract's cases for one backend (a om_store_backend_t *). */
#define OM_STORE_CONTRACT_TESTS(backend)                                       \
  cmocka_unit_test_prestate(om_store_contract_lifecycle, (backend)),           \
      cmocka_unit_test_prestate(om_store_contract_subscribers, (backend)),     \
      cmocka_unit_test_prestate(om_store_contract_reentrant_callbacks,         \
                                (backend)),                                    \
      cmocka_unit_test_prestate(om_store_contract_close_inside_a_callback,     \
                                (backend)),                                    \
      cmocka_unit_test_prestate(om_store_contract_config_documents,            \
                                (backend)),                                    \
      cmocka_unit_test_prestate(om_store_contract_list_services, (backend))

#endif /* OM_STORE_CONTRACT_H */
