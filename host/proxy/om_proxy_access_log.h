/*
 * om_proxy_access_log.h: the proxy's access log (docs/PROXY.md "Access
 * log"), one JSON line per request answered, the input of `openmesh
 * replay`.
 *
 * The workers never touch the disk: each appends its lines to its own
 * producer, two bounded buffers (OM_ACCESS_LOG_BUF bytes each) of which
 * one takes lines while a writer thread writes the other out (one
 * write(2) on an O_APPEND descriptor per buffer, at least every
 * OM_ACCESS_LOG_FLUSH_MS). A line that does not fit the buffer taking
 * lines is dropped and counted; nothing waits for the disk. The writer
 * follows its path: a rotated or deleted file (stat(path) no longer the
 * open inode) is reopened within about a second, and
 * om_access_log_reopen (SIGUSR1) reopens at once.
 */
#ifndef OM_PROXY_ACCESS_LOG_H
#define OM_PROXY_ACCESS_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "om_metrics.h"
#include "om_policy.h"

#define OM_ACCESS_LOG_BUF (256 * 1024)
#define OM_ACCESS_LOG_FLUSH_MS 100
/* A line is at most this long: a longer path or field value is cut (the
 * cut is marked in the line by "truncated": true). */
#define OM_ACCESS_LOG_LINE_MAX 8192

typedef struct om_access_log_s om_access_log_t;
typedef struct om_access_log_producer_s om_access_log_producer_t;

/*
 * om_access_log_open: open path for appending (created 0600) and start
 * the writer thread. 0 and *out; -errno with err naming the file;
 * OM_ENOMEM.
 */
int om_access_log_open(const char *path, om_access_log_t **out, char *err,
                       size_t errlen);

/* Count lines in metrics (borrowed; it must outlive l) as
 * openmesh_proxy_access_log_lines_total{result="written|dropped"}. Call
 * before the first line. */
void om_access_log_set_metrics(om_access_log_t *l, om_metrics_t *metrics);

/* Reopen the path at the writer's next turn (SIGUSR1). Any thread. */
void om_access_log_reopen(om_access_log_t *l);

/* Write out what is buffered, stop the writer, close the file, free
 * every producer. Only after every producer's user is gone. NULL ok. */
void om_access_log_close(om_access_log_t *l);

/* A producer for one worker (owned by l). NULL without memory. Any
 * thread. */
om_access_log_producer_t *om_access_log_producer(om_access_log_t *l);

/* Append one line (with its '\n'): 0, or -1 when it was dropped (the
 * buffer is full), counted either way. One producer per thread. */
int om_access_log_append(om_access_log_producer_t *pr, const char *line,
                         size_t len);

/* Lines written and dropped so far (for tests and /status). */
uint64_t om_access_log_written(const om_access_log_t *l);
uint64_t om_access_log_dropped(const om_access_log_t *l);

/* One request answered, as the line says it. Strings may be NULL (then
 * logged as ""), and need not be NUL-terminated where a length is given. */
typedef struct om_access_log_entry_s {
  uint64_t wall_ms; /* Unix time of the answer, ms */
  const char *request_id;
  const char *service;
  const char *method;
  const char *path; /* with ?query */
  size_t path_len;
  const om_policy_kv_t *fields; /* the request fields the policy varies on */
  size_t n_fields;
  int status;          /* sent to the caller; 0: none (client gone) */
  const char *peer_id; /* the peer of the last attempt; NULL: none */
  const char *peer_url;
  /* the peer of the first attempt when a retry went elsewhere (the pick
   * a replay of the policy compares with); NULL: the same */
  const char *first_peer_id;
  unsigned attempts;
  double duration_ms;
  const char *policy; /* the policy's name */
  uint64_t policy_version, policy_revision;
  const char *outcome; /* ok, no_peers, overloaded, ... */
} om_access_log_entry_t;

/*
 * om_access_log_format: e as one JSON line with its '\n' into out (cap at
 * least OM_ACCESS_LOG_LINE_MAX); returns its length. Every string is
 * escaped: '"', '\\' and control bytes as JSON escapes, bytes that are not
 * UTF-8 as U+FFFD, so no input can end the line or forge a field. A value
 * that does not fit is cut at a character boundary.
 */
size_t om_access_log_format(const om_access_log_entry_t *e, char *out,
                            size_t cap);

/* The JSON string body of s[0, len) into out (at most cap - 1 bytes,
 * NUL-terminated, whole characters only); *cut set when s did not fit.
 * Returns the bytes written. */
size_t om_access_log_escape(char *out, size_t cap, const char *s, size_t len,
                            int *cut);

#endif /* OM_PROXY_ACCESS_LOG_H */
