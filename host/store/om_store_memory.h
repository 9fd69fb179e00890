/*
 * om_store_memory.h: the in-memory store, the default behind the storage
 * contract (om_store.h). One process, one libuv loop; everything happens
 * on the loop thread, and every callback (write, read, subscriber) runs
 * before the call that caused it returns; only close's done runs later.
 *
 * Leases. Each instance has a deadline, now + ttl_ms on a monotonic
 * millisecond clock (uv_now by default). Deadlines sit in a binary
 * min-heap (ties broken by arming order), and one uv_timer is armed at the
 * earliest: when it fires, every lease whose deadline has passed is removed
 * in one sweep, and each service that lost instances gets one new revision
 * for the whole batch. A renewal moves its lease in the heap (O(log n)); no
 * request ever scans the leases.
 *
 * Revisions. One counter for the whole store (services and configuration
 * documents): each change is issued
 *     revision = max(last issued + 1, wall clock in microseconds)
 * so revisions are strictly increasing per service, and a restarted
 * control plane (whose counter starts empty) issues revisions above every
 * one its predecessor issued, as long as the wall clock did not step back
 * and the predecessor did not issue revisions faster than one per
 * microsecond right up to its death (each change taking a microsecond of
 * lead, a restart taking milliseconds, the lead is gone long before the
 * new process issues anything). A host that persists its last revision can
 * pass it as min_revision to be independent of the clock. Revisions are
 * about 1.7e15 today: exact in a double, so also in JSON and Lua.
 *
 * Snapshots. Each change builds one new immutable snapshot of the service
 * it touched (om_snapshot_edit: unchanged instances are shared, other
 * services keep theirs); a service whose instances all left keeps an empty
 * snapshot and its revision. A renewal builds nothing.
 *
 * Delivery. After a change commits, the subscribers of that service (or
 * document) and the subscribers of every service (document) are called
 * with the new snapshot (document), synchronously, before the write's own
 * callback. Callbacks may call the store again: unsubscribe (any
 * subscription, also their own), subscribe, and write. A change made
 * inside a callback is queued and delivered once the current delivery
 * has reached every subscriber, so every subscriber sees every revision of
 * a service in order. A subscription made inside a callback gets changes
 * made after it only.
 */
#ifndef OM_STORE_MEMORY_H
#define OM_STORE_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "om_store.h"

typedef struct om_store_memory_opts_s {
  /* Monotonic milliseconds for leases; NULL: uv_now(loop). */
  uint64_t (*now_ms)(void *ud);
  /*
   * Wall clock in microseconds since the Unix epoch, the floor of every
   * revision; NULL: clock_gettime(CLOCK_REALTIME).
   */
  uint64_t (*realtime_us)(void *ud);
  void *clock_ud; /* passed to both clocks */
  /* Every revision issued is above this (a persisted high-water mark). */
  uint64_t min_revision;
  /* Largest configuration document; 0: 1 MiB. Larger: OM_ETOOBIG. */
  size_t max_config_bytes;
} om_store_memory_opts_t;

/*
 * om_store_memory_new: an empty memory store on loop (opts may be NULL:
 * all defaults). Returns 0 with *out set (release with om_store_close, then
 * let the loop run so close can finish), OM_EINVAL (loop or out NULL) or
 * OM_ENOMEM; nothing is left behind on error.
 *
 * Names: services, instance ids and document names are om_valid_name;
 * content types 1..255 bytes of printable ASCII. A configuration put whose
 * content type and body equal the current document's is OM_STORE_NOCHANGE
 * (no new revision, no delivery). status() counts creates and updates as
 * registrations, and NOCHANGE puts and renew() calls as renewals.
 */
int om_store_memory_new(uv_loop_t *loop, const om_store_memory_opts_t *opts,
                        om_store_t **out);

/*
 * om_store_memory_expire: sweep now: remove every lease whose deadline
 * has passed on the store's clock, then re-arm the timer. The timer does
 * this at each deadline; a host or test driving a fake now_ms calls it
 * after moving the clock. Returns the number of leases removed (0 also for
 * a store that is not a memory store or is closing). If building a
 * service's next snapshot fails for lack of memory, its leases stay and
 * the sweep is retried 100 ms later.
 */
size_t om_store_memory_expire(om_store_t *s);

#endif /* OM_STORE_MEMORY_H */
