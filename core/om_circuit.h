/*
 * om_circuit.h: a per-peer circuit breaker.
 *
 * A failing instance is bypassed; the service is not (docs/ARCHITECTURE.md).
 * One om_circuit_t per peer, driven by the caller's clock (now_ns, monotonic):
 *
 *   closed --(N consecutive failures, or failure ratio over the window)--> open
 *   open --(cooldown elapsed; state() already reports it)--> half_open
 *   half_open: allow() admits exactly one probe, then refuses
 *   half_open --(probe succeeds)--> closed
 *   half_open --(probe fails)--> open, with a longer cooldown
 *
 * Defaults (om_circuit_opts_default), and why:
 * - failures = 5 consecutive: fast detection of a dead peer at any traffic.
 * - ratio rule: >= 50% failures among >= 20 requests within the last 10 s:
 *   catches a peer that fails half the time but never 5 in a row. The
 *   window is a ring of OM_CIRCUIT_BUCKETS time buckets, so "the last 10 s"
 *   means the current bucket plus the 9 before it (between 9 and 10 s); the
 *   minimum keeps 2 failures out of 3 requests from tripping a quiet peer.
 * - cooldown = 30 s x trips, capped at max_cooldown = 300 s: a peer that
 *   keeps failing its probe is probed less and less often.
 * - reset = 300 s: the trip count (the cooldown multiplier) goes back to 0
 *   once the circuit has stayed closed that long, so one bad hour does not
 *   make every later incident start at a 300 s cooldown. A close alone does
 *   not forgive trips: a peer that flaps closed -> open quickly keeps its
 *   growing cooldown.
 * - probe_timeout = 0 (off): the single probe blocks further probes until
 *   its result is recorded. A host whose attempts can vanish without a
 *   record should set it; after it, allow() admits a replacement probe.
 *
 * Results recorded while open (requests admitted before the trip finishing
 * late) are ignored: they say nothing about the peer after the trip. In
 * half_open the first result recorded is taken as the probe's.
 *
 * The struct is public only so that a peer table can embed it
 * (om_circuit_init); its fields are private to om_circuit.c. Not
 * thread-safe: one worker loop owns a circuit.
 */
#ifndef OM_CIRCUIT_H
#define OM_CIRCUIT_H

#include <stdbool.h>
#include <stdint.h>

#define OM_CIRCUIT_BUCKETS 10

typedef enum {
  OM_CIRCUIT_CLOSED = 0,
  OM_CIRCUIT_OPEN = 1,
  OM_CIRCUIT_HALF_OPEN = 2,
} om_circuit_state_t;

typedef struct om_circuit_opts_s {
  uint32_t failures;         /* consecutive failures to trip; 0: rule off */
  uint64_t cooldown_ns;      /* first open period; > 0 */
  uint64_t max_cooldown_ns;  /* cap on cooldown x trips; >= cooldown_ns */
  uint64_t window_ns;        /* ratio window; 0: rule off, else >= BUCKETS */
  uint32_t min_requests;     /* ratio rule needs this many in the window */
  double failure_ratio;      /* trip when failed/total >= this; (0, 1] */
  uint64_t reset_ns;         /* closed this long -> trips back to 0 */
  uint64_t probe_timeout_ns; /* half_open: re-probe after; 0: never */
} om_circuit_opts_t;

/* Private: see om_circuit.c. Embed, never touch. */
typedef struct om_circuit_s {
  uint64_t cooldown_ns, max_cooldown_ns, bucket_ns, reset_ns, probe_timeout_ns;
  uint64_t at_ns; /* open: cooldown end; half_open: probe start;
                     closed: when it closed (trip reset) */
  uint64_t head;  /* epoch of the newest window bucket */
  uint32_t failures, min_requests, ratio_ppm;
  uint32_t consecutive, trips;
  uint32_t total, failed; /* sums over the window */
  uint32_t req[OM_CIRCUIT_BUCKETS], fail[OM_CIRCUIT_BUCKETS];
  uint8_t state;
} om_circuit_t;

/*
 * om_circuit_opts_default: fill *opts with the defaults above. Exists so a
 * caller changes one field without restating the others.
 */
void om_circuit_opts_default(om_circuit_opts_t *opts);

/*
 * om_circuit_init: set up a circuit in caller-owned memory (a peer array),
 * closed, no history. opts NULL means defaults. Returns 0, or OM_EINVAL
 * when c is NULL or opts break a rule stated on om_circuit_opts_t (also:
 * both trip rules off, min_requests 0 with the window on); then *c is
 * untouched. Nothing to free.
 */
int om_circuit_init(om_circuit_t *c, const om_circuit_opts_t *opts);

/*
 * om_circuit_new: the same on the heap. On success *out owns a circuit the
 * caller frees with om_circuit_free. Returns OM_EINVAL as om_circuit_init
 * (or out NULL), OM_ENOMEM; *out is untouched on error.
 */
int om_circuit_new(const om_circuit_opts_t *opts, om_circuit_t **out);

/* om_circuit_free: free a circuit from om_circuit_new. NULL is a no-op. */
void om_circuit_free(om_circuit_t *c);

/*
 * om_circuit_allow: may a request go to this peer now? Closed: yes. Open
 * before the cooldown ends: no. Once it ends, the first call moves to
 * half_open and admits the probe; later calls refuse until the probe's
 * result is recorded (or probe_timeout passes). The caller must record the
 * outcome of every admitted request.
 */
bool om_circuit_allow(om_circuit_t *c, uint64_t now_ns);

/*
 * om_circuit_peek: what om_circuit_allow would answer now, without
 * admitting anything. For selection, which skips unavailable peers before
 * committing to one.
 */
bool om_circuit_peek(const om_circuit_t *c, uint64_t now_ns);

/*
 * om_circuit_release: the request allow() admitted ended without telling
 * anything about the peer (it never reached it: this process ran out of
 * descriptors; or the caller went away first). Half_open: the probe slot
 * is free again at once, so the next allow() admits a new probe instead of
 * every call skipping the peer until probe_timeout (or for ever when it is
 * 0); the cooldown is over either way. Closed and open: nothing changes.
 */
void om_circuit_release(om_circuit_t *c, uint64_t now_ns);

/*
 * om_circuit_record: the outcome of a request that allow() admitted.
 * Returns the state after it, so the caller can log transitions.
 */
om_circuit_state_t om_circuit_record(om_circuit_t *c, uint64_t now_ns, bool ok);

/*
 * om_circuit_state: the state at now_ns. Reports half_open as soon as the
 * cooldown has passed, before any allow() (for /status and selection).
 */
om_circuit_state_t om_circuit_state(const om_circuit_t *c, uint64_t now_ns);

/* "closed", "open", "half_open"; "unknown" for other values. Static. */
const char *om_circuit_state_name(om_circuit_state_t state);

/*
 * om_circuit_trips: the current cooldown multiplier (trips since the last
 * reset; 0 once closed for reset_ns).
 */
uint32_t om_circuit_trips(const om_circuit_t *c, uint64_t now_ns);

/*
 * om_circuit_open_until: while open, when the cooldown ends (ns, the
 * caller's clock); 0 in any other state.
 */
uint64_t om_circuit_open_until(const om_circuit_t *c, uint64_t now_ns);

#endif /* OM_CIRCUIT_H */
