/*
 * om_file_watch.h: a few files, watched for change, one debounced callback.
 *
 * What reloads certificate and key files on change (the HTTPS listeners,
 * the proxy's upstream TLS files). Each file's directory is watched, not
 * the file: a file replaced by a rename, as editors and certificate
 * managers do, is only seen there. Events for other names in the same
 * directories are ignored; a burst of events (a rename, then a chmod)
 * gives one callback, debounce_ms after the last. What the callback does
 * with the files (read, validate, keep the last good) is the owner's.
 * Everything runs on the loop thread.
 */
#ifndef OM_FILE_WATCH_H
#define OM_FILE_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

/* The most files one watch takes. */
#define OM_FILE_WATCH_MAX 8

typedef struct om_file_watch_s om_file_watch_t;

typedef void (*om_file_watch_fn)(void *ud);

/*
 * om_file_watch_start: watch paths[0, n) (n 1..OM_FILE_WATCH_MAX; NULL
 * entries are skipped; the names are copied) and call cb(ud) from the
 * loop debounce_ms (0: 200 ms) after the last change among them. Returns
 * 0 and *out; OM_EINVAL (no path, too many, NULL cb, or a directory that
 * cannot be watched, with the reason in err); OM_ENOMEM. On error nothing
 * is left on the loop to wait for but handles closing by themselves.
 */
int om_file_watch_start(uv_loop_t *loop, const char *const *paths, size_t n,
                        uint64_t debounce_ms, om_file_watch_fn cb, void *ud,
                        om_file_watch_t **out, char *err, size_t errlen);

/*
 * om_file_watch_close: stop; cb never runs after this returns. The handles
 * close on the loop and the watch is freed when they have. NULL is a
 * no-op.
 */
void om_file_watch_close(om_file_watch_t *w);

#endif /* OM_FILE_WATCH_H */
