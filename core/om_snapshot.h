/*
 * om_snapshot.h: the topology of one service at one revision.
 *
 * A snapshot is immutable once built and reference-counted: the control
 * plane hands the same snapshot to every GET and every watcher of that
 * revision (and encodes it once), and a proxy keeps its last good snapshot
 * while a newer one is validated. Validation here is the one definition of
 * a well-formed instance and snapshot, used by the registry on writes and
 * by watch clients on what they receive.
 *
 * Instances inside snapshots are shared: om_snapshot_edit builds the next
 * revision from the previous one by reference, so a change to one instance
 * of a 10,000-instance service copies one instance and 10,000 pointers, not
 * 10,000 instances. The pointer om_snapshot_instance/om_snapshot_find return
 * for an instance is therefore the same in every snapshot that shares it,
 * and stays valid while any of them is alive.
 *
 * Threads: reference counts (of snapshots and of the instances they share)
 * are C11 atomics, so one parsed snapshot can be handed by reference to
 * other threads (the proxy's workers) and dropped by whichever is last:
 * what a snapshot holds never changes after it is built, so readers need
 * no lock. Cache slots are the exception: only one thread (the one that
 * built the snapshot) sets or reads them.
 */
#ifndef OM_SNAPSHOT_H
#define OM_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#define OM_NAME_MAX 128 /* service and instance ids */
#define OM_URL_MAX 2048 /* = OM_URL_MAX_LEN (om_url.h) */
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
 * om_valid_name: service and instance ids are [A-Za-z0-9._-]{1,128}, except
 * "." and "..": those are dot-segments that URL normalization (RFC 3986
 * section 5.2.4) removes from a path, so such a name could never be
 * addressed as /v1/services/{s}. len is the length of s (s need not be
 * NUL-terminated). Returns 1 or 0; NULL is 0.
 */
int om_valid_name(const char *s, size_t len);

/*
 * om_instance_validate: check one instance as the registry accepts it.
 * Returns 0, or OM_EINVAL with *field set to the offending field's name
 * ("id", "url", "ttl_ms", "weight", "zone", "metadata") and *why to a static
 * reason (field and why may be NULL when not wanted).
 * - id: om_valid_name.
 * - url: the one URL rule of om_url.h (om_url_parse), the rule the proxy
 *   applies too: http or https, an IPv4 or IPv6 literal or a DNS name, a
 *   port, a path prefix; no userinfo, query or fragment. *why is
 *   om_url_parse's reason.
 * - weight: finite, in (0, OM_WEIGHT_MAX]. ttl_ms: [OM_TTL_MIN_MS,
 *   OM_TTL_MAX_MS].
 * - zone: NULL, or 1..OM_ZONE_MAX bytes of printable ASCII (0x20-0x7e).
 * - metadata: at most OM_META_MAX_ENTRIES entries (metadata may be NULL
 *   only when n_metadata is 0); keys 1..OM_META_KEY_MAX bytes, values
 *   0..OM_META_VALUE_MAX bytes, both valid UTF-8 (RFC 3629 section 4:
 *   no overlong forms, surrogates or code points above U+10FFFF); keys
 *   unique. Entries may come in any order.
 */
int om_instance_validate(const om_instance_t *in, const char **field,
                         const char **why);

/*
 * om_instance_copy: deep copy of in into *out, every string in its own
 * allocation (what om_instance_clear frees), metadata sorted by key. No
 * validation: NULL strings are copied as NULL. Returns 0, OM_EINVAL (a NULL
 * argument, or metadata NULL with n_metadata > 0) or OM_ENOMEM; on error
 * *out is untouched and nothing leaks.
 */
int om_instance_copy(om_instance_t *out, const om_instance_t *in);

/*
 * om_instance_clear: free the fields of an instance built by
 * om_instance_copy (or field by field with malloc) and zero it. NULL is
 * fine. Never call it on an instance borrowed from a snapshot.
 */
void om_instance_clear(om_instance_t *in);

/*
 * om_instance_equal: 1 when a and b carry the same id, url, zone, weight
 * (compared exactly), ttl_ms and metadata (as sets: order does not matter),
 * else 0. Both must have unique metadata keys (valid instances do). This is
 * how the registry tells a renewal from an update; it is fastest when both
 * are sorted (instances from snapshots and from the JSON decoder are).
 */
int om_instance_equal(const om_instance_t *a, const om_instance_t *b);

/*
 * om_snapshot_new: a snapshot of `service` at `revision` holding deep copies
 * of the n instances (instances may be NULL when n is 0), sorted by id.
 * Fails with OM_EDUPLICATE (two instances with one id: *index is the later
 * one's position in the input, *field "id"), OM_EINVAL (an invalid service
 * name: *field "service" and *index SIZE_MAX; or an invalid instance: field
 * and why as om_instance_validate, its position in *index; or out NULL) or
 * OM_ENOMEM; nothing is allocated on failure and *out is untouched. index,
 * field and why may be NULL. The new snapshot has one reference, owned by
 * the caller. Any revision is accepted (the store decides the scheme).
 */
int om_snapshot_new(const char *service, uint64_t revision,
                    const om_instance_t *instances, size_t n,
                    om_snapshot_t **out, size_t *index, const char **field,
                    const char **why);

/*
 * om_snapshot_edit: the next snapshot of base's service, at `revision`:
 * base's instances, minus those whose id is in remove[] (ids not present
 * are ignored), with put[] inserted or replacing the instance of the same
 * id (an id both removed and put ends up put). Unchanged instances are
 * shared with base, not copied (see the top of this file); put[] is
 * validated and deep-copied as in om_snapshot_new. base is not changed and
 * keeps its reference. Errors as om_snapshot_new (*index indexes put[]);
 * OM_EINVAL also for a NULL base or out, or a NULL remove entry. Nothing
 * is allocated on failure. O(n / 256 + (256 + k) log k) for n instances in
 * base and k edits falling in few of its chunks of 256 (O(n + k log k) at
 * worst): a registration never copies the service.
 */
int om_snapshot_edit(const om_snapshot_t *base, uint64_t revision,
                     const om_instance_t *put, size_t n_put,
                     const char *const *remove, size_t n_remove,
                     om_snapshot_t **out, size_t *index, const char **field,
                     const char **why);

/* Take another reference; returns s (NULL stays NULL). */
om_snapshot_t *om_snapshot_ref(om_snapshot_t *s);
/*
 * Drop a reference; the last one frees the snapshot, its cache slots (by
 * their free functions) and the instances no other snapshot shares.
 * NULL is fine.
 */
void om_snapshot_unref(om_snapshot_t *s);

const char *om_snapshot_service(const om_snapshot_t *s);
uint64_t om_snapshot_revision(const om_snapshot_t *s);
size_t om_snapshot_count(const om_snapshot_t *s);
/* The i-th instance in id order (NULL when i >= count); borrowed. */
const om_instance_t *om_snapshot_instance(const om_snapshot_t *s, size_t i);
/* Binary search by id; NULL when absent. Borrowed. */
const om_instance_t *om_snapshot_find(const om_snapshot_t *s, const char *id);

/*
 * A slot for encodings the host caches on the snapshot (JSON, SSE event):
 * set once, freed with the snapshot by the given function (free_fn may be
 * NULL: data is then not freed). om_snapshot_cache returns the slot's data
 * or NULL (also for a slot out of range). om_snapshot_set_cache returns 0
 * (the snapshot now owns data), OM_EINVAL (s or data NULL, slot out of
 * [0, OM_SNAPSHOT_CACHE_SLOTS)) or OM_ESTATE (the slot is already set); on
 * error the caller still owns data. Setting a slot does not change what the
 * snapshot describes, hence the const-free pointer on an immutable object.
 */
void *om_snapshot_cache(const om_snapshot_t *s, int slot);
int om_snapshot_set_cache(om_snapshot_t *s, int slot, void *data,
                          void (*free_fn)(void *));
#define OM_SNAPSHOT_CACHE_SLOTS 6

/*
 * Chunks: a snapshot's instances are held in runs of up to 256 (in id
 * order) that successive revisions share when an edit does not touch
 * them. om_snapshot_chunk_count is how many (0 for an empty snapshot or
 * NULL); om_snapshot_chunk_range sets [*from, *to), the instance indexes
 * of chunk k (0, or OM_EINVAL for k out of range or a NULL argument).
 * Each chunk has one cache slot, with the rules of the snapshot's slots
 * above: set once, freed with the chunk by free_fn, and what it caches
 * must depend on the chunk's instances only, since every snapshot that
 * shares the chunk sees it (an encoding of those instances: a 10,000-
 * instance snapshot after one change is encoded by re-encoding one chunk
 * and copying the others'). Same thread rule as the snapshot's slots.
 */
size_t om_snapshot_chunk_count(const om_snapshot_t *s);
int om_snapshot_chunk_range(const om_snapshot_t *s, size_t k, size_t *from,
                            size_t *to);
void *om_snapshot_chunk_cache(const om_snapshot_t *s, size_t k);
int om_snapshot_set_chunk_cache(om_snapshot_t *s, size_t k, void *data,
                                void (*free_fn)(void *));

#endif /* OM_SNAPSHOT_H */
