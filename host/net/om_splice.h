/*
 * om_splice.h: move a known number of bytes from one socket to another
 * through the kernel, without copying them through this process: splice(2)
 * from the source into a pipe, and from the pipe into the destination, on
 * the libuv loop.
 *
 * What it is for: a proxy relaying a large body whose length is known
 * (a Content-Length download or upload over plaintext HTTP/1.1) once the
 * head went through the ordinary path. Reading a socket into a buffer and
 * writing it out again costs two copies per byte in the kernel; splicing
 * moves page references instead (loopback TCP: tcp_splice_read into the
 * pipe, the pipe's pages attached to the destination's segments).
 *
 * Ownership: the sockets stay the caller's. While a splice runs the caller
 * must neither read the source nor write the destination (stop its reads;
 * have nothing queued for the destination), since bytes would interleave.
 * The splice works on its own duplicates of the two descriptors (dup(2)),
 * so it registers its own watchers with the loop and never disturbs the
 * caller's libuv handles; the duplicates and the pipe are closed when it
 * ends. Once on_done ran (or om_splice_cancel returned) the sockets are
 * the caller's again: the source is positioned right after the bytes
 * moved, and may be read (or pooled) as before.
 *
 * Fairness: one loop turn moves at most OM_SPLICE_TURN_BYTES, then the
 * splice waits for the next readiness report, so a fast stream does not
 * starve the loop's other work.
 *
 * Threading: the loop's thread only.
 */
#ifndef OM_SPLICE_H
#define OM_SPLICE_H

#include <stdint.h>

#include <uv.h>

/* the most one loop turn moves */
#define OM_SPLICE_TURN_BYTES (4u << 20)

typedef struct om_splice_s om_splice_t;

/* How a splice ended (on_done), or stood when it was cancelled. */
typedef struct om_splice_result_s {
  int err;        /* 0: all len bytes reached the destination; OM_EIO */
  int src_failed; /* with err: the source ended early (EOF) or failed;
                     0: the destination failed (reset, closed) */
  uint64_t moved; /* bytes the destination took */
  uint64_t taken; /* bytes read from the source: moved plus what was in
                     the pipe, lost when the splice did not finish */
} om_splice_result_t;

typedef struct om_splice_callbacks_s {
  /* (may be NULL) bytes reached the destination: moved is the total so
   * far. At most once per loop turn: what a stream idle timer needs. */
  void (*on_progress)(void *ud, uint64_t moved);
  /* (required) the splice ended (om_splice_result_t says how; bytes
   * taken but not moved are lost: the stream is cut either way). The
   * splice is freed when this returns; never called from inside an
   * om_splice_* call. */
  void (*on_done)(void *ud, const om_splice_result_t *res);
} om_splice_callbacks_t;

/*
 * om_splice_start: move len bytes (at least 1) from the socket src to
 * the socket dst, through a pipe of 1 MiB where the kernel allows it.
 * Returns 0 and *out; OM_EINVAL (a negative descriptor, len 0, no
 * on_done, a descriptor that is not a socket); OM_ENOMEM, or OM_EIO when
 * a pipe or a duplicate could not be made (EMFILE), or the pipe is under
 * 64 KiB (the user's pipe-user-pages-soft is spent): the caller relays
 * the ordinary way then. On error nothing was started.
 */
int om_splice_start(uv_loop_t *loop, int src, int dst, uint64_t len,
                    const om_splice_callbacks_t *cb, void *ud,
                    om_splice_t **out);

/*
 * om_splice_waits_for_dst: nonzero while the splice waits for the
 * destination to take bytes (its reader is slower than the source), zero
 * while it waits for the source. What tells a slow reader from a silent
 * writer: only the second is an idle stream.
 */
int om_splice_waits_for_dst(const om_splice_t *s);

/*
 * om_splice_cancel: stop now. No callback runs after this returns; bytes
 * in the pipe are dropped (the caller treats the stream as cut). The
 * splice is freed from the loop. Returns how many bytes the destination
 * took, and fills *res (may be NULL; err 0) with that and what was taken
 * from the source. NULL: 0. Not after on_done ran (the splice is gone).
 */
uint64_t om_splice_cancel(om_splice_t *s, om_splice_result_t *res);

#endif /* OM_SPLICE_H */
