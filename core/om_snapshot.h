/*
 * om_snapshot.h: the topology of one service at one revision.
 *
 * A snapshot is immutable once built and reference-counted: the control
 * plane hands the same snapshot to every GET and every watcher of that
 * revision (and encodes it once), and a proxy keeps its last good snapshot
 * while a newer one is validated. Validation here is the one definition of
 * a well-formed instance and snapshot, used by the registry on writes and
 * by watch clients on what they receive.
 */
#ifndef OM_SNAPSHOT_H
#define OM_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#define OM_NAME_MAX 128 /* service and instance ids */
#define OM_URL_MAX 2048
#define OM_ZONE_MAX 128
#define OM_META_MAX_ENTRIES 64
#define OM_META_KEY_MAX 128
#define OM_META_VALUE_MAX 1024
#define OM_TTL_MIN_MS 1000u /* [1 s, 1 h] */
#define OM_TTL_MAX_MS 3600000u
#define OM_WEIGHT_MAX 10000.0 /* (0, 10000] */

typedef struct om_kv_s {
  char *key;
  char *value;
} om_kv_t;

/* One registered instance. Strings are NUL-terminated and owned. */
typedef struct om_instance_s {
  char *id;
  char *url;
  char *zone; /* NULL when none */
  double weight;
  uint64_t ttl_ms;
  om_kv_t *metadata;
  size_t n_metadata; /* sorted by key, keys unique */
} om_instance_t;

typedef struct om_snapshot_s om_snapshot_t;

/*
 * om_valid_name: service and instance ids are [A-Za-z0-9._-]{1,128}.
 * Returns 1 or 0.
 */
int om_valid_name(const char *s, size_t len);

/*
 * om_instance_validate: check one instance as the registry accepts it.
 * Returns 0, or OM_EINVAL with *field set to the offending field's name
 * ("id", "url", "ttl_ms", "weight", "zone", "metadata") and *why to a static
 * reason. url: absolute http or https with a non-empty host, optional port
 * 1..65535, no whitespace or control characters.
 */
int om_instance_validate(const om_instance_t *in, const char **field,
                         const char **why);

/* Deep copy (out is overwritten) and release of an instance's fields. */
int om_instance_copy(om_instance_t *out, const om_instance_t *in);
void om_instance_clear(om_instance_t *in);

/*
 * om_snapshot_new: a snapshot of `service` at `revision` holding deep copies
 * of the n instances, sorted by id. Fails with OM_EDUPLICATE (two instances
 * with one id), OM_EINVAL (an invalid service name or instance: field and
 * why as above, naming the index in *index) or OM_ENOMEM; nothing is
 * allocated on failure. The new snapshot has one reference.
 */
int om_snapshot_new(const char *service, uint64_t revision,
                    const om_instance_t *instances, size_t n,
                    om_snapshot_t **out, size_t *index, const char **field,
                    const char **why);

om_snapshot_t *om_snapshot_ref(om_snapshot_t *s);
void om_snapshot_unref(om_snapshot_t *s); /* NULL is fine */

const char *om_snapshot_service(const om_snapshot_t *s);
uint64_t om_snapshot_revision(const om_snapshot_t *s);
size_t om_snapshot_count(const om_snapshot_t *s);
const om_instance_t *om_snapshot_instance(const om_snapshot_t *s, size_t i);
/* Binary search by id; NULL when absent. */
const om_instance_t *om_snapshot_find(const om_snapshot_t *s, const char *id);

/*
 * A slot for encodings the host caches on the snapshot (JSON, SSE event):
 * set once, freed with the snapshot by the given function.
 */
void *om_snapshot_cache(const om_snapshot_t *s, int slot);
int om_snapshot_set_cache(om_snapshot_t *s, int slot, void *data,
                          void (*free_fn)(void *));
#define OM_SNAPSHOT_CACHE_SLOTS 4

#endif /* OM_SNAPSHOT_H */
