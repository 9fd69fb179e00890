/*
 * om_snapshot_json.h: snapshots and registrations as JSON (RFC 8259).
 *
 * What the control plane sends (GET, watch events) and what a watch client
 * and the registry accept. Encoding is a single pass into one buffer (no
 * JSON tree: a 10,000-instance snapshot is one allocation, not 100,000),
 * with numbers in their shortest round-trip form so a weight reads back as
 * the same double. Decoding goes through jansson (strict UTF-8, duplicate
 * keys rejected, nesting capped) and then through the core validation
 * (om_snapshot_new, om_instance_validate), so nothing malformed gets past
 * it; errors name the field: "field 'instances[3].url': ...".
 *
 * The encodings of a snapshot are cached on it (om_snapshot_set_cache), so
 * every GET and every watcher of one revision share one buffer.
 *
 * Snapshot document:
 *   {"service": s, "revision": R, "warming": true (only while the plane
 *    warms up), "instances": [
 *     {"id", "url", "weight", "zone" (omitted when none), "ttl_ms",
 *      "metadata": {k: v, ...}}, ...]}
 * in id order; a page adds "next_page_token": string or null.
 */
#ifndef OM_SNAPSHOT_JSON_H
#define OM_SNAPSHOT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "om_snapshot.h"

/* Cache slots on a snapshot (om_snapshot_cache). */
#define OM_SNAPSHOT_SLOT_JSON 0         /* the full snapshot document */
#define OM_SNAPSHOT_SLOT_SSE 1          /* its SSE event block */
#define OM_SNAPSHOT_SLOT_JSON_WARMING 2 /* the document with "warming" */
#define OM_SNAPSHOT_SLOT_SSE_WARMING 3  /* its SSE event block */
#define OM_SNAPSHOT_SLOT_GZIP 4         /* the GET answer, gzip */
#define OM_SNAPSHOT_SLOT_GZIP_WARMING 5 /* the same with "warming" */

/*
 * What a snapshot document says besides the topology (the _flags
 * variants below). OM_SNAPSHOT_JSON_WARMING: the member "warming": true,
 * after "revision": the control plane that served it lost its store's
 * state recently and may not know every live instance yet (its warm-up
 * window, docs/CONTROL.md); a client keeps instances it knew that the
 * document does not mention. A plane that is warm omits the member.
 */
#define OM_SNAPSHOT_JSON_WARMING 1u

/* Largest instance registration body om_instance_from_json accepts. */
#define OM_INSTANCE_JSON_MAX ((size_t)256 * 1024)

/* A page token's length (base64url of 24 bytes, no padding). */
#define OM_PAGE_TOKEN_LEN 32

/*
 * Why a decode failed. field is the JSON path of the culprit
 * ("instances[3].url", "metadata.env", "ttl_ms"), or "" when the error is
 * about the document as a whole (syntax, size). why is the reason alone;
 * text is the whole message for logs and 400 bodies:
 *   "field 'instances[3].url': must be an absolute http:// or https:// URL"
 *   "invalid JSON at line 1, column 9: duplicate object key"
 */
typedef struct om_json_error_s {
  char field[96];
  char why[224];
  char text[384];
} om_json_error_t;

/*
 * om_snapshot_to_json: encode the full snapshot document into a new
 * malloc'd, NUL-terminated buffer (*out owned by the caller, *len without
 * the NUL). Returns 0 or OM_ENOMEM / OM_EINVAL (NULL argument); on error
 * *out and *len are untouched.
 */
int om_snapshot_to_json(const om_snapshot_t *s, char **out, size_t *len);

/*
 * om_snapshot_json_cached: the full snapshot document, encoded on first
 * use and cached in slot OM_SNAPSHOT_SLOT_JSON. *data is borrowed: valid
 * while the snapshot is (take a reference for as long as a write is in
 * flight). Returns 0, OM_ENOMEM (nothing cached), OM_EINVAL.
 */
int om_snapshot_json_cached(om_snapshot_t *s, const char **data, size_t *len);

/*
 * om_snapshot_sse_cached: the watch event for the snapshot,
 *   "event: snapshot\nid: R\ndata: <document>\n\n"
 * (om_sse_encode, WHATWG HTML 9.2), cached in slot OM_SNAPSHOT_SLOT_SSE
 * (and the document in OM_SNAPSHOT_SLOT_JSON). Borrowed as above.
 */
int om_snapshot_sse_cached(om_snapshot_t *s, const char **data, size_t *len);

/*
 * The same with flags (OM_SNAPSHOT_JSON_WARMING or 0; anything else is
 * OM_EINVAL): each variant has its own cache slots, so a plane that
 * serves both while it warms up encodes each once.
 */
int om_snapshot_json_cached_flags(om_snapshot_t *s, unsigned flags,
                                  const char **data, size_t *len);
int om_snapshot_sse_cached_flags(om_snapshot_t *s, unsigned flags,
                                 const char **data, size_t *len);

/*
 * om_snapshot_get_gzip_cached_flags: the document a GET of the service
 * answers (the cached JSON closed with "next_page_token": null, as the
 * control plane serves it unpaged) compressed with gzip (RFC 1952, zlib
 * level 1), once per revision and flags, cached in OM_SNAPSHOT_SLOT_GZIP
 * (or _WARMING). About 10x smaller for a typical service. Returns as
 * om_snapshot_json_cached_flags; *data is binary (not NUL-terminated).
 */
int om_snapshot_get_gzip_cached_flags(om_snapshot_t *s, unsigned flags,
                                      const char **data, size_t *len);

/*
 * om_page_token_encode: the opaque token for "the page of revision R that
 * starts at offset": base64url (RFC 4648 section 5, no padding) of
 * revision, offset (64-bit big-endian each) and an XXH3 checksum of both,
 * so a mangled or hand-made token is refused instead of silently paging
 * from somewhere else. It carries no secret: any control plane serving
 * the same revision accepts it. Writes OM_PAGE_TOKEN_LEN characters and a
 * NUL to out.
 */
void om_page_token_encode(uint64_t revision, uint64_t offset,
                          char out[OM_PAGE_TOKEN_LEN + 1]);

/*
 * om_page_token_decode: the inverse. Returns 0 with *revision and *offset
 * set, or OM_EPARSE (wrong length, alphabet or checksum; outputs
 * untouched).
 */
int om_page_token_decode(const char *token, size_t len, uint64_t *revision,
                         uint64_t *offset);

/*
 * om_snapshot_page_json: one page: instances [offset, offset + limit) of
 * the snapshot where offset is 0 when token is NULL, else decoded from the
 * token, and "next_page_token" the token of the next page or null on the
 * last page. limit must be >= 1 (the caller clamps page_size). A new
 * malloc'd buffer in *out as om_snapshot_to_json. Errors, with err filled
 * (field "page_token") when err is not NULL:
 * - OM_EPARSE: the token is malformed or forged.
 * - OM_ESTATE: the token was minted at another revision; the client must
 *   restart (409 revision_changed).
 * - OM_ERANGE: the token's offset is beyond the snapshot.
 * - OM_EINVAL (limit 0, NULL argument), OM_ENOMEM.
 */
int om_snapshot_page_json(const om_snapshot_t *s, const char *token,
                          size_t token_len, size_t limit, char **out,
                          size_t *len, om_json_error_t *err);

/* om_snapshot_page_json with flags, as om_snapshot_json_cached_flags. */
int om_snapshot_page_json_flags(const om_snapshot_t *s, unsigned flags,
                                const char *token, size_t token_len,
                                size_t limit, char **out, size_t *len,
                                om_json_error_t *err);

/*
 * om_snapshot_from_json: decode and validate a snapshot document (what a
 * watch client receives) into a new snapshot with one reference (*out).
 * "service" (a valid name), "revision" (an integer >= 1) and "instances"
 * (an array of instance objects: "id", "url", "weight" number, "ttl_ms"
 * integer required; "zone" string or null and "metadata" flat string map
 * or null optional) are required; other fields are ignored, so a newer
 * control plane may add some. Every instance is validated as the registry
 * does, ids must be unique. Errors: OM_EPARSE (not JSON, not an object,
 * invalid UTF-8, nesting deeper than 2048, a number out of range), OM_EINVAL
 * (a missing field, a wrong type, a value failing validation),
 * OM_EDUPLICATE (two instances with one id), OM_ENOMEM; err (may be NULL)
 * says which field and why, and *out is untouched.
 */
int om_snapshot_from_json(const char *buf, size_t len, om_snapshot_t **out,
                          om_json_error_t *err);

/*
 * om_snapshot_from_json_flags: the same, and on success *flags (may be
 * NULL) holds what the document says besides the topology:
 * OM_SNAPSHOT_JSON_WARMING for "warming": true. "warming" must be a
 * boolean when present (OM_EINVAL, field "warming"); false and absent
 * mean the same.
 */
int om_snapshot_from_json_flags(const char *buf, size_t len,
                                om_snapshot_t **out, unsigned *flags,
                                om_json_error_t *err);

/*
 * om_instance_from_json: decode a registration body
 *   {"url": s, "ttl_ms": int, "weight": number = 1, "zone": s | null,
 *    "metadata": {k: s} | null}
 * for instance `id` (from the request path) into *out (fields malloc'd,
 * release with om_instance_clear; metadata sorted by key) and validate it.
 * Types are strict: ttl_ms must be a JSON integer, weight a number,
 * metadata values strings. Unknown fields are rejected by name (a typo
 * like "ttl" must not silently register with a default); "id" is accepted
 * when equal to id. Errors: OM_ETOOBIG (len > OM_INSTANCE_JSON_MAX),
 * OM_EPARSE, OM_EINVAL (field named in err), OM_ENOMEM; *out is untouched
 * on error.
 */
int om_instance_from_json(const char *buf, size_t len, const char *id,
                          om_instance_t *out, om_json_error_t *err);

/*
 * om_instance_to_json: the registration body for in (what `openmesh
 * register` sends): {"url", "ttl_ms", "weight", "zone", "metadata"}, no
 * id. A new malloc'd buffer as om_snapshot_to_json.
 */
int om_instance_to_json(const om_instance_t *in, char **out, size_t *len);

#endif /* OM_SNAPSHOT_JSON_H */
