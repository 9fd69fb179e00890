/*
 * om_store.h: the storage contract of the control plane.
 *
 * The HTTP layer and the watches talk to this interface only; the memory
 * store implements it now, the Redis store later. Every operation is
 * asynchronous (the Redis store answers from its event loop): it returns 0
 * when the operation was started (the callback will run exactly once, maybe
 * before the call returns) or a negative code when it was not (no callback).
 *
 * Argument errors (an invalid name or instance, NULL where a value is
 * required, a closed store) and OM_ENOMEM are returned and nothing
 * changes; outcomes (OM_ENOTFOUND, a backend failure) go to the callback.
 * A write callback may be NULL (nothing to report back).
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
  size_t services, instances;
} om_store_status_t;

typedef struct om_store_ops_s {
  const char *name; /* "memory", "redis" */
  /*
   * Register, renew (identical fields: OM_STORE_NOCHANGE, the lease is
   * extended by in->ttl_ms) or update. The store copies what it keeps.
   */
  int (*put_instance)(om_store_t *s, const char *service,
                      const om_instance_t *in, om_store_write_cb cb, void *ud);
  /* Renew an existing lease only (POST .../heartbeat). */
  int (*renew)(om_store_t *s, const char *service, const char *id,
               om_store_write_cb cb, void *ud);
  int (*delete_instance)(om_store_t *s, const char *service, const char *id,
                         om_store_write_cb cb, void *ud);
  int (*snapshot)(om_store_t *s, const char *service, om_store_snapshot_cb cb,
                  void *ud);
  int (*list_services)(om_store_t *s, om_store_list_cb cb, void *ud);
  /* service NULL: every service. The first callback is NOT immediate. */
  int (*subscribe)(om_store_t *s, const char *service, om_store_watch_cb cb,
                   void *ud, om_store_sub_t **out);
  int (*config_put)(om_store_t *s, const char *name, const char *content_type,
                    const char *body, size_t len, om_store_write_cb cb,
                    void *ud);
  int (*config_get)(om_store_t *s, const char *name, om_store_config_cb cb,
                    void *ud);
  /* name NULL: every document. The first callback is NOT immediate. */
  int (*subscribe_config)(om_store_t *s, const char *name,
                          om_store_config_watch_cb cb, void *ud,
                          om_store_sub_t **out);
  /* Safe inside any callback, also for the subscription being called. */
  void (*unsubscribe)(om_store_t *s, om_store_sub_t *sub);
  void (*status)(om_store_t *s, om_store_status_t *out);
  /*
   * Stop timers and connections; free once closed, then call done (from
   * the loop, never before close returns; done may be NULL). After close
   * no other callback runs and every subscription is gone.
   */
  void (*close)(om_store_t *s, void (*done)(void *ud), void *ud);
} om_store_ops_t;

struct om_store_s {
  const om_store_ops_t *ops;
};

#endif /* OM_STORE_H */
