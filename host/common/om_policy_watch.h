/*
 * om_policy_watch.h: one policy file, hot-reloaded.
 *
 * The watcher owns the active policy. It watches the file's directory (so
 * editors that write a temporary file and rename it over the original are
 * seen), debounces bursts of events, and reloads through om_policy_load_file:
 * compile, validate, run examples in a fresh sandbox. Only a policy that
 * passes replaces the active one, and each replacement bumps the version; a
 * failure keeps the last good policy, is counted, logged, and kept as
 * last_error for /status. Everything runs on the caller's loop thread.
 */
#ifndef OM_POLICY_WATCH_H
#define OM_POLICY_WATCH_H

#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "om_policy.h"

typedef struct om_policy_watch_s om_policy_watch_t;

/*
 * A policy file written from another source (the control plane's config
 * watch, om_policy_source.h) ends with one comment line naming it:
 *   -- openmesh-policy: control:NAME revision R
 * A trailing comment moves no line number of the policy, and the source
 * and revision travel with the bytes in one atomic rename. A file without
 * it is "file:PATH", revision 0.
 */
#define OM_POLICY_TRAILER "-- openmesh-policy: "

/*
 * om_policy_trailer_parse: the source and revision of the trailer line at
 * the end of buf[0..len). 0 with source (NUL-terminated, cut to cap) and
 * *revision set; -1 when buf has no such line.
 */
int om_policy_trailer_parse(const char *buf, size_t len, char *source,
                            size_t cap, uint64_t *revision);

/*
 * Called when a new version passed validation, before it replaces prev
 * (NULL on the first load): the owner moves state onto it (peer views,
 * pools). Return 0 to accept; non-zero rejects this version (counted as a
 * failure) and prev stays. prev is freed after the callback returns 0.
 */
typedef int (*om_policy_swap_cb)(void *ud, om_policy_t *next,
                                 om_policy_t *prev);

typedef struct om_policy_watch_opts_s {
  const char *path;          /* the policy file: required */
  om_policy_opts_t policy;   /* lib_dir and budgets */
  uint64_t debounce_ms;      /* quiet time before a reload; 0: 100 ms */
  om_policy_kind_t kind;     /* 0: any; else a file of another kind fails */
  om_policy_swap_cb on_swap; /* optional */
  void *ud;
} om_policy_watch_opts_t;

/*
 * om_policy_watch_start: load the file once (it must be valid: a service
 * does not start on a bad policy) and start watching. Returns 0 with *out
 * set; or OM_EPOLICY / OM_ENOTFOUND with the reason in err, OM_ENOMEM, or
 * OM_EINVAL, with nothing started.
 */
int om_policy_watch_start(uv_loop_t *loop, const om_policy_watch_opts_t *opts,
                          om_policy_watch_t **out, char *err, size_t errlen);

/*
 * om_policy_watch_reload: reload now (SIGHUP, tests). Returns 0 when a new
 * version became active, 1 when the file is unchanged since the active
 * version, or a negative code when it was rejected (the old one stays).
 */
int om_policy_watch_reload(om_policy_watch_t *w);

/* The active policy: valid until the next swap on this loop. */
om_policy_t *om_policy_watch_current(const om_policy_watch_t *w);
/* 1 for the first load, +1 for each swap. */
uint64_t om_policy_watch_version(const om_policy_watch_t *w);
/* Rejected reloads so far. */
uint64_t om_policy_watch_failures(const om_policy_watch_t *w);
/* The last rejection's message since the active version loaded, "" if
 * none (a good reload clears it into the previous error). */
const char *om_policy_watch_last_error(const om_policy_watch_t *w);

/* A rejected reload: its message, when (wall clock, ms since the epoch),
 * and the revision of the version it refused (its trailer's; 0 for a
 * plain file). */
typedef struct om_policy_watch_error_s {
  const char *message;
  uint64_t at_ms;
  uint64_t revision;
} om_policy_watch_error_t;

/*
 * om_policy_watch_error: the latest rejection since the active version
 * loaded (previous 0), or the one a good reload moved aside (previous 1);
 * NULL when there is none. Valid until the next reload. /status shows
 * both: an operator sees what broke, and that a later push fixed it.
 */
const om_policy_watch_error_t *om_policy_watch_error(const om_policy_watch_t *w,
                                                     int previous);

/* When the active version swapped in: wall clock, ms since the epoch. */
uint64_t om_policy_watch_loaded_at_ms(const om_policy_watch_t *w);

/*
 * om_policy_watch_status: set the /status fields of the watch on object
 * o, the same for every process that shows a policy: source ("file:PATH"
 * or "control:NAME"), revision, loaded_at (RFC 3339, UTC), last_error
 * with last_error_at and last_error_revision, and the same three for
 * previous_error ("" and nulls when there is none). 0, or -1 when out of
 * memory (o may then hold some of them).
 */
int om_policy_watch_status(const om_policy_watch_t *w, json_t *o);
const char *om_policy_watch_path(const om_policy_watch_t *w);
/* Where the active version came from: "file:PATH", or the trailer's
 * source ("control:NAME"); and its revision there (0 for a plain file). */
const char *om_policy_watch_source(const om_policy_watch_t *w);
uint64_t om_policy_watch_revision(const om_policy_watch_t *w);

/*
 * om_policy_watch_stop: stop watching and free the watcher and its policy
 * once its handles have closed (on the next loop iteration). NULL is fine.
 */
void om_policy_watch_stop(om_policy_watch_t *w);

#endif /* OM_POLICY_WATCH_H */
