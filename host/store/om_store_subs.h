/*
 * om_store_subs.h: the subscriber registry every store shares, for the
 * backends (om_store_memory.c, om_store_redis.c). om_store_subscribe and
 * om_store_unsubscribe (om_store.h) add and remove subscriptions; a
 * backend stamps each change it commits and delivers it through here, so
 * the lists, the order of delivery and the unsubscribe deferred while a
 * delivery runs are written once.
 */
#ifndef OM_STORE_SUBS_H
#define OM_STORE_SUBS_H

#include <stdint.h>

#include "om_store.h"

enum { OM__SUB_SERVICE = 0, OM__SUB_CONFIG = 1 };

/*
 * om__subs_add: a subscription of kind to name (NULL: every service or
 * document) that sees changes stamped after this call only. Arguments are
 * valid (the front function checked them). 0 with *out set, or OM_ENOMEM
 * with nothing registered.
 */
int om__subs_add(om__subs_t *r, int kind, const char *name,
                 om_store_watch_cb cb, om_store_config_watch_cb ccb, void *ud,
                 om_store_sub_t **out);

/*
 * om__subs_remove: end sub. During a delivery it is only marked (a
 * second call then is ignored): it is not called again and is freed when the
 * last delivery returns.
 */
void om__subs_remove(om__subs_t *r, om_store_sub_t *sub);

/*
 * om__store_stamp: the sequence number of a change the backend commits
 * now: subscriptions made from here on do not see it, those made before
 * do, however late it is delivered.
 */
uint64_t om__store_stamp(om_store_t *s);

/*
 * om__store_deliver: call the subscribers of snap's service, then those
 * of every service, that are older than seq (a om__store_stamp value) and
 * not unsubscribed, with snap (borrowed). Callbacks may subscribe,
 * unsubscribe (any subscription) and close the store: after a close
 * nobody else is called. Deliveries may nest.
 */
void om__store_deliver(om_store_t *s, uint64_t seq, om_snapshot_t *snap);

/* om__store_deliver_config: om__store_deliver for a document. */
void om__store_deliver_config(om_store_t *s, uint64_t seq,
                              om_config_doc_t *doc);

/* om__subs_init: an empty registry (a backend's constructor calls it
 * before anything can subscribe). */
void om__subs_init(om__subs_t *r);

/* om__subs_free: free every subscription (the store is going away). */
void om__subs_free(om__subs_t *r);

#endif /* OM_STORE_SUBS_H */
