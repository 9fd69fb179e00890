/*
 * om_store_redis.h: the Redis store behind the storage contract
 * (om_store.h), so several control planes serve one mesh (docs/STORE.md).
 *
 * Redis is the authority; each control plane keeps a replica of every
 * service (and of the documents it has read) that pub/sub keeps current,
 * so watches are fed from Redis and reads survive an outage.
 *
 * - Every change (register, update, delete, expiry, document put) is one
 *   Lua script run on the Redis side: the membership and the revision
 *   change together, atomically, and the change is PUBLISHed from inside
 *   the same script, so two control planes can never hand out one revision
 *   for two memberships and every subscriber sees changes in commit order.
 * - Revisions: the script issues max(last issued + 1, floor, service + 1)
 *   where floor is the caller's max(wall clock in microseconds, highest
 *   revision it has seen + 1): revisions never go backwards, also after
 *   Redis lost its data (a restart without persistence).
 * - Leases: one sorted set of deadlines (Redis server time, ms), swept by a
 *   timer on every control plane with a script: the first plane to run it
 *   removes the expired leases and bumps each service's revision once; the
 *   others find nothing. Instance hashes also carry a PEXPIRE, so a mesh
 *   whose control planes all died leaves nothing behind.
 * - An epoch key (a random id set at first use) tells a Redis that lost its
 *   data from one that kept it: on reconnect, a changed or missing epoch
 *   makes the store re-announce every service it knew at a revision above
 *   any it delivered, then resynchronise from Redis.
 * - Redis unreachable: reads and watches keep the last good state and
 *   status() reports stale = 1; writes answer OM_EIO; the store reconnects
 *   with exponential backoff (and drops a connection that stops answering).
 *
 * Every callback runs on the loop; reads served from the replica (while
 * stale, or when the replica already holds Redis's revision) answer before
 * the call returns, everything else later. Subscribers are called only
 * with revisions newer than the last one delivered for that service.
 */
#ifndef OM_STORE_REDIS_H
#define OM_STORE_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "om_store.h"

#define OM_STORE_REDIS_HOST_MAX 255

typedef struct om_store_redis_opts_s {
  /* "redis://HOST:PORT/DB" (PORT and /DB optional: 6379, 0); NULL:
   * redis://127.0.0.1:6379/0. */
  const char *url;
  /* Key and channel prefix; NULL: "openmesh:". At most 64 bytes of
   * [A-Za-z0-9:._-]. Two meshes on one Redis use two prefixes. */
  const char *prefix;
  uint64_t sweep_ms;       /* lease sweep period; 0: 250 */
  uint64_t backoff_min_ms; /* first reconnect delay; 0: 100 */
  uint64_t backoff_max_ms; /* reconnect delay cap; 0: 5000 */
  /* A connection with a command unanswered this long is dropped and
   * reconnected; 0: 5000. */
  uint64_t command_timeout_ms;
  /* Wall clock in microseconds (revision floor); NULL: CLOCK_REALTIME. */
  uint64_t (*realtime_us)(void *ud);
  void *clock_ud;
  uint64_t min_revision;   /* every revision issued is above this */
  size_t max_config_bytes; /* 0: 1 MiB; larger puts: OM_ETOOBIG */
  /* Called each time the store becomes ready (connected, subscribed and
   * resynchronised: status 0) and each time it loses Redis (OM_EIO). */
  void (*on_state)(void *ud, int status);
  void *state_ud;
} om_store_redis_opts_t;

/*
 * om_store_redis_parse_url: split "redis://HOST:PORT/DB" (RFC 3986 section
 * 3 shape; HOST a name, an IPv4 address or a bracketed IPv6 literal; PORT
 * 1..65535, default 6379; DB 0..15 digits-only, default 0; no userinfo,
 * query or fragment). host receives at most host_cap - 1 bytes and a NUL.
 * Returns 0, or OM_EINVAL with *why set to a static reason; outputs may be
 * partly written on error.
 */
int om_store_redis_parse_url(const char *url, char *host, size_t host_cap,
                             int *port, int *db, const char **why);

/*
 * om_store_redis_new: a Redis store on loop; starts connecting at once and
 * returns without waiting (opts->on_state says when it is ready). Returns 0
 * with *out set (release with om_store_close, then run the loop so close can
 * finish), OM_EINVAL (loop or out NULL, a malformed url or prefix) or
 * OM_ENOMEM; nothing is left behind on error. Names, sizes and change
 * kinds are as in the memory store (om_store_memory.h).
 */
int om_store_redis_new(uv_loop_t *loop, const om_store_redis_opts_t *opts,
                       om_store_t **out);

/*
 * om_store_redis_ready: 1 when s is a Redis store that is connected and
 * resynchronised (writes can succeed), else 0.
 */
int om_store_redis_ready(const om_store_t *s);

/*
 * om_store_redis_wait_ready: at start-up, run loop until s is ready or
 * wait_ms pass (the store logs each failed attempt). 0 when ready, else
 * OM_EDEADLINE. It runs the loop: call it before anything else is on it
 * that must not run yet.
 */
int om_store_redis_wait_ready(uv_loop_t *loop, const om_store_t *s,
                              uint64_t wait_ms);

#endif /* OM_STORE_REDIS_H */
