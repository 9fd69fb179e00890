/*
 * om_store.h: the storage contract of the control plane.
 *
 * The HTTP layer and the watches talk to this interface only; the memory
 * store (om_store_memory.h) and the Redis store (om_store_redis.h)
 * implement it. Every operation is
 * asynchronous (the Redis store answers from its event loop): it returns 0
 * when the operation was started (the callback will run exactly once, maybe
 * before the call returns) or a negative code when it was not (no callback).
 *
 * Argument errors (an invalid name or instance, NULL where a value is
 * required, a closed store) and OM_ENOMEM are returned and nothing
 * changes; outcomes (OM_ENOTFOUND, a backend failure) go to the callback.
 * A write callback may be NULL (nothing to report back). The front
 * functions below check the arguments once and then call the backend
 * (om_store_ops_t), as libuv's uv_* functions check and call uv__*.
 *
 * Semantics every store must keep:
 * - put_instance registers or renews; a renewal that changes nothing does
 *   not bump the revision. A lease not renewed within ttl_ms is removed
 *   (within 1 s of its expiry) and that bumps the revision once.
 * - Revisions are per service, strictly increasing, and never go backwards,
 *   also across a restart (each store says how).
 * - Subscribers see every revision in order (they may skip revisions that
 *   were superseded before delivery, never see an older after a newer).
 * - Snapshots are immutable and reference-counted (core/om_snapshot.h):
 *   callbacks borrow them; om_snapshot_ref to keep one.
 */
#ifndef OM_STORE_H
#define OM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "om_list.h"
#include "om_snapshot.h"

typedef struct om_store_s om_store_t;
typedef struct om_store_sub_s om_store_sub_t;

typedef enum {
  OM_STORE_NOCHANGE = 0, /* a renewal with identical fields */
  OM_STORE_CREATED,
  OM_STORE_UPDATED, /* url, weight, zone, metadata or ttl changed */
  OM_STORE_DELETED,
  OM_STORE_EXPIRED
} om_store_change_t;

/* "nochange", "created", "updated", "deleted", "expired" ("?" else). */
const char *om_store_change_name(om_store_change_t change);

/*
 * A configuration document (JSON or policy source), immutable, refcounted.
 * Strings live in the document's single allocation: never free or write
 * them; body is NUL-terminated after len bytes (it may contain NULs).
 */
typedef struct om_config_doc_s {
  char *name;
  char *content_type;
  char *body;
  size_t len;
  uint64_t revision;
  int refs;
} om_config_doc_t;

/*
 * om_config_doc_new: a document with one reference holding copies of
 * name, content_type and the len bytes of body (NULL allowed when len is
 * 0). NULL when an argument is NULL or memory runs out.
 */
om_config_doc_t *om_config_doc_new(const char *name, const char *content_type,
                                   const char *body, size_t len,
                                   uint64_t revision);
/* Another reference (NULL stays NULL); the last unref frees. */
om_config_doc_t *om_config_doc_ref(om_config_doc_t *d);
void om_config_doc_unref(om_config_doc_t *d); /* NULL is fine */

typedef struct om_service_rev_s {
  const char *service;
  uint64_t revision;
  size_t instances;
} om_service_rev_t;

/* status: 0 or a negative OM_E* (OM_ENOTFOUND for an unknown instance). */
typedef void (*om_store_write_cb)(void *ud, int status,
                                  om_store_change_t change, uint64_t revision);
/* snap is NULL when the service has never existed (status OM_ENOTFOUND). */
typedef void (*om_store_snapshot_cb)(void *ud, int status, om_snapshot_t *snap);
typedef void (*om_store_list_cb)(void *ud, int status,
                                 const om_service_rev_t *services, size_t n);
typedef void (*om_store_config_cb)(void *ud, int status, om_config_doc_t *doc);
/* One lease: how long until it expires unless renewed (0: due now). */
typedef struct om_lease_left_s {
  const char *service;
  const char *id;
  uint64_t expires_in_ms;
} om_lease_left_t;
typedef void (*om_store_leases_cb)(void *ud, int status,
                                   const om_lease_left_t *leases, size_t n);
/* A change: the new snapshot of one service. */
typedef void (*om_store_watch_cb)(void *ud, om_snapshot_t *snap);
typedef void (*om_store_config_watch_cb)(void *ud, om_config_doc_t *doc);

typedef struct om_store_status_s {
  int stale; /* serving last known state: backend unreachable */
  /*
   * Inside a watch callback: why instances left in the change being
   * delivered, when the store knows (OM_STORE_DELETED or _EXPIRED; a
   * store shared by several writers learns it with each change);
   * OM_STORE_NOCHANGE when it does not. Read it for logs only.
   */
  om_store_change_t last_removal;
  uint64_t registrations, renewals, deletions, expiries;
  uint64_t collected; /* empty services removed (om_store_collect_empty) */
  size_t services, instances;
  /*
   * How many times the store found itself holding none of the state it
   * had before: 1 for the memory store (it starts empty), and for Redis
   * each session that found the data set's epoch key absent (created
   * then) or changed. A control plane that sees it grow knows leases it
   * does not hold may still be alive (its warm-up window,
   * docs/CONTROL.md).
   */
  uint64_t state_lost;
} om_store_status_t;

/*
 * The subscriber registry every store shares (om_store_subs.c): named
 * subscriptions in one sorted bucket array per kind, the subscriptions to
 * every service or document in one list per kind, and the deferred
 * unsubscribe of a delivery. Only the store layer reads these fields.
 */
typedef struct om__subs_bucket_s om__subs_bucket_t;
typedef om_list_t om__subs_list_t; /* om_store_sub_t, oldest first */
typedef struct om__subs_s {
  om__subs_bucket_t **named[2]; /* [0] services, [1] documents, by name */
  size_t n_named[2], cap_named[2];
  om__subs_list_t every[2];
  uint64_t seq;         /* the last change stamped (om__store_stamp) */
  int delivering;       /* deliveries running (they may nest) */
  om_store_sub_t *dead; /* unsubscribed during a delivery: freed after */
} om__subs_t;

/*
 * The backend half of a store: what om_store_* calls once the arguments
 * are valid and the store is open (the front functions below check both,
 * so a backend never sees a NULL or invalid name, a NULL read callback or
 * a closed store). Subscriptions are not here: the store layer keeps them
 * (om_store_subs.h) and a backend only delivers.
 */
typedef struct om_store_ops_s {
  const char *name; /* "memory", "redis" */
  int (*put_instance)(om_store_t *s, const char *service,
                      const om_instance_t *in, om_store_write_cb cb, void *ud);
  int (*renew)(om_store_t *s, const char *service, const char *id,
               om_store_write_cb cb, void *ud);
  int (*delete_instance)(om_store_t *s, const char *service, const char *id,
                         om_store_write_cb cb, void *ud);
  int (*snapshot)(om_store_t *s, const char *service, om_store_snapshot_cb cb,
                  void *ud);
  int (*list_services)(om_store_t *s, om_store_list_cb cb, void *ud);
  int (*config_put)(om_store_t *s, const char *name, const char *content_type,
                    const char *body, size_t len, om_store_write_cb cb,
                    void *ud);
  int (*config_get)(om_store_t *s, const char *name, om_store_config_cb cb,
                    void *ud);
  void (*status)(om_store_t *s, om_store_status_t *out);
  /* Called once; closing is already set and no subscriber runs again. */
  void (*close)(om_store_t *s, void (*done)(void *ud), void *ud);
  int (*leases)(om_store_t *s, om_store_leases_cb cb, void *ud);
  /* NULL: the backend does not collect (om_store_collect_empty answers
   * OM_ESTATE) */
  int (*collect_empty)(om_store_t *s, uint64_t idle_ms,
                       int (*keep)(void *ud, const char *service),
                       void (*gone)(void *ud, const char *service), void *ud,
                       size_t *n);
} om_store_ops_t;

/*
 * The head of every store (a backend's struct starts with it). Callers
 * use the om_store_* functions, never these fields.
 */
struct om_store_s {
  const om_store_ops_t *ops;
  int closing; /* set by om_store_close */
  om__subs_t subs;
};

/*
 * om__store_grow: for a backend's arrays, reserved before any change so
 * that a change never half-applies: arr itself when it has room for need
 * elements of elem bytes, else a larger copy (capacity doubled from 8,
 * *cap updated), or NULL with arr and *cap untouched.
 */
void *om__store_grow(void *arr, size_t *cap, size_t need, size_t elem);

/* ---- the contract: every caller goes through these ---- */

/* The backend's name: "memory" or "redis" ("?" for NULL). */
const char *om_store_name(const om_store_t *s);

/*
 * om_store_put_instance: register, renew (identical fields: the change is
 * OM_STORE_NOCHANGE and the lease is extended by in->ttl_ms) or update
 * in under service. service must be om_valid_name and in must pass
 * om_instance_validate; the store copies what it keeps. Returns 0 (cb,
 * which may be NULL, runs once with the outcome), OM_ESTATE (s closed),
 * OM_EINVAL (s NULL or an invalid argument) or OM_ENOMEM; on an error
 * nothing changed and cb does not run.
 */
int om_store_put_instance(om_store_t *s, const char *service,
                          const om_instance_t *in, om_store_write_cb cb,
                          void *ud);

/*
 * om_store_renew: extend the existing lease service/id by its own ttl
 * (POST .../heartbeat); an unknown instance is OM_ENOTFOUND to cb. Both
 * names must be om_valid_name. Returns as om_store_put_instance.
 */
int om_store_renew(om_store_t *s, const char *service, const char *id,
                   om_store_write_cb cb, void *ud);

/*
 * om_store_delete_instance: remove service/id (OM_STORE_DELETED, a new
 * revision); an unknown instance is OM_ENOTFOUND to cb. Returns as
 * om_store_renew.
 */
int om_store_delete_instance(om_store_t *s, const char *service, const char *id,
                             om_store_write_cb cb, void *ud);

/*
 * om_store_snapshot: the current snapshot of service to cb (required;
 * OM_ENOTFOUND and a NULL snapshot for a service that never existed).
 * Returns 0, OM_ESTATE (closed), OM_EINVAL (s or cb NULL, an invalid
 * name) or OM_ENOMEM; on an error cb does not run.
 */
int om_store_snapshot(om_store_t *s, const char *service,
                      om_store_snapshot_cb cb, void *ud);

/*
 * om_store_list_services: every service with its revision and instance
 * count to cb (required; the array is the store's until cb returns).
 * Returns as om_store_snapshot.
 */
int om_store_list_services(om_store_t *s, om_store_list_cb cb, void *ud);

/*
 * om_store_leases: every lease with the time left until it expires
 * unless renewed, sorted by service then id, to cb (required; the array
 * and its strings are the store's until cb returns). Renewals move no
 * revision, so snapshots cannot say this; the console's countdown reads
 * it. A store that cannot be reached answers OM_EIO through cb. Returns
 * as om_store_snapshot.
 */
int om_store_leases(om_store_t *s, om_store_leases_cb cb, void *ud);

/*
 * om_store_collect_empty: remove every service that has had no instance
 * for at least idle_ms and that keep(ud, name) does not claim (keep may be
 * NULL: nothing is claimed; the control plane claims the services someone
 * watches). gone(ud, name), when not NULL, is told each removed name in
 * name order, the name valid during the call. Revisions stay monotonic: a
 * service that comes back gets a revision above any it had (the store's
 * revisions are one sequence over every service). Synchronous; *n (may be
 * NULL) counts the removed. Returns 0; OM_ESTATE when s is closed or the
 * backend does not collect; OM_EINVAL for s NULL. The Redis store names
 * here what was collected in Redis since the last call (by any control
 * plane sharing it) and then proposes its own candidates, keep's claims
 * marked so that no plane collects them (docs/STORE.md). Why: a
 * service registered once is otherwise listed forever (50,000 of them
 * made a 3.4 MB list and a 5.6 MB first burst for every watch of all).
 */
int om_store_collect_empty(om_store_t *s, uint64_t idle_ms,
                           int (*keep)(void *ud, const char *service),
                           void (*gone)(void *ud, const char *service),
                           void *ud, size_t *n);

/*
 * om_store_config_put: store a configuration document (name om_valid_name,
 * content_type 1..255 bytes of printable ASCII, body NULL only when len is
 * 0; copied). A put equal to the current document is OM_STORE_NOCHANGE.
 * Returns as om_store_put_instance, and OM_ETOOBIG for a body over the
 * store's limit.
 */
int om_store_config_put(om_store_t *s, const char *name,
                        const char *content_type, const char *body, size_t len,
                        om_store_write_cb cb, void *ud);

/*
 * om_store_config_get: the current document name to cb (required;
 * OM_ENOTFOUND and NULL when there is none). Returns as om_store_snapshot.
 */
int om_store_config_get(om_store_t *s, const char *name, om_store_config_cb cb,
                        void *ud);

/*
 * om_store_subscribe: call cb (required) with each new snapshot of
 * service, or of every service when service is NULL, from the next change
 * on (the first callback is NOT immediate). *out receives the handle for
 * om_store_unsubscribe. Returns 0, OM_ESTATE (closed), OM_EINVAL (s, cb or
 * out NULL, an invalid name) or OM_ENOMEM; on an error nothing is
 * registered. Named subscribers of a change are called before the
 * subscribers to every service, each group in subscription order.
 */
int om_store_subscribe(om_store_t *s, const char *service, om_store_watch_cb cb,
                       void *ud, om_store_sub_t **out);

/* om_store_subscribe_config: om_store_subscribe for documents. */
int om_store_subscribe_config(om_store_t *s, const char *name,
                              om_store_config_watch_cb cb, void *ud,
                              om_store_sub_t **out);

/*
 * om_store_unsubscribe: end sub (NULL and a closed store are ignored;
 * sub is gone afterwards, so do not pass it again). Safe inside any
 * callback, also for the subscription being called: it is not called
 * again, and is freed once the delivery is over.
 */
void om_store_unsubscribe(om_store_t *s, om_store_sub_t *sub);

/* om_store_status: the store's counters into *out (ignored when NULL). */
void om_store_status(om_store_t *s, om_store_status_t *out);

/*
 * om_store_close: stop timers and connections; the store frees itself once
 * closed, then calls done (from the loop, never before close returns; done
 * may be NULL). After close no other callback runs, every subscription is
 * gone and every other call answers OM_ESTATE; a second close (and NULL)
 * is ignored.
 */
void om_store_close(om_store_t *s, void (*done)(void *ud), void *ud);

#endif /* OM_STORE_H */
