/*
 * om_example_service.h: the small HTTP services `openmesh up` runs to show
 * the mesh working on one machine. Each listens on loopback, answers every
 * request with a JSON line naming itself (and an x-served-by header with
 * its id, so a test sees which instance served a call), behaves as configured
 * (fast, slow, flaky, streaming), and keeps a real lease in the store:
 * registered at start, renewed every ttl/3, deleted when it stops.
 */
#ifndef OM_EXAMPLE_SERVICE_H
#define OM_EXAMPLE_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "om_snapshot.h"
#include "om_store.h"

typedef enum {
  OM_EXAMPLE_FAST,
  OM_EXAMPLE_SLOW,      /* answers after delay_ms */
  OM_EXAMPLE_FLAKY,     /* every fail_every-th request gets a 503 */
  OM_EXAMPLE_FAILING,   /* every request gets `status` (default 503) */
  OM_EXAMPLE_THROTTLED, /* 429 with Retry-After: retry_after_s */
  OM_EXAMPLE_DYING,     /* a 200 stream cut after its first chunk */
} om_example_behaviour_t;

typedef struct om_example_opts_s {
  const char *service, *id, *zone; /* zone may be NULL */
  const char *host;                /* IP literal to listen on */
  int port;
  om_example_behaviour_t behaviour;
  uint64_t delay_ms;      /* slow */
  uint32_t fail_every;    /* flaky */
  int status;             /* failing: 500..599 or 4xx; 0: 503 */
  uint32_t retry_after_s; /* throttled: the Retry-After value */
  const om_kv_t *metadata;
  size_t n_metadata;
  uint64_t ttl_ms; /* the lease; 0: 10 s */
} om_example_opts_t;

typedef struct om_example_s om_example_t;

/*
 * om_example_start: listen and register. Returns 0, OM_EIO when the port
 * cannot be bound, OM_EINVAL for bad options, OM_ENOMEM. The store must
 * outlive the service.
 */
int om_example_start(uv_loop_t *loop, om_store_t *store,
                     const om_example_opts_t *opts, om_example_t **out);

/* The URL it registered (http://host:port). */
const char *om_example_url(const om_example_t *e);

/* Requests answered so far. */
uint64_t om_example_requests(const om_example_t *e);

/* Deregister, stop listening, free once closed (then done(ud)). */
void om_example_stop(om_example_t *e, void (*done)(void *ud), void *ud);

/* Behaviour from its name ("fast" or "ok", "slow", "flaky", "failing",
 * "throttled", "dying"); -1 if unknown. */
int om_example_behaviour(const char *name);

#endif /* OM_EXAMPLE_SERVICE_H */
