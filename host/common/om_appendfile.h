/*
 * om_appendfile.h: a file appended to by lines that follows its path, not
 * its inode: the shape of every log-like file OpenMesh writes (the file
 * connector's channel file, the egress gateway's error-tracking file).
 *
 * Each write is one write(2) on an O_APPEND descriptor, so lines from
 * several writers do not interleave inside a line (POSIX write(2), regular
 * files). Before a write, om_appendfile_follow compares the path with the
 * open file (st_dev, st_ino): when it was renamed away (rotation) or
 * deleted, the path is opened again (created 0600 if missing), so lines
 * land where a reader of the path looks instead of in an unlinked inode.
 * O_NONBLOCK: a FIFO without a reader fails at once instead of blocking
 * (no effect on regular files).
 *
 * Blocking calls (stat, open, write): run them where blocking is fine (the
 * libuv threadpool, or a rare path of the loop thread). Not thread-safe.
 */
#ifndef OM_APPENDFILE_H
#define OM_APPENDFILE_H

#include <stddef.h>
#include <sys/types.h>

typedef struct om_appendfile_s {
  int fd; /* -1 when not open */
  dev_t dev;
  ino_t ino;
} om_appendfile_t;

/* Open path for appending. 0, or -errno with f->fd = -1. */
int om_appendfile_open(om_appendfile_t *f, const char *path);

/*
 * When path no longer names the open file (or nothing is open), open it
 * again. 0 (the open file is the path's), or -errno: the reopen failed and
 * the previous descriptor, if any, stays (a renamed file still takes
 * lines).
 */
int om_appendfile_follow(om_appendfile_t *f, const char *path);

/* Write all len bytes (short writes and EINTR continued). 0 or -errno
 * (-EBADF when nothing is open). */
int om_appendfile_write(om_appendfile_t *f, const char *buf, size_t len);

/* Close (idempotent; fd becomes -1). */
void om_appendfile_close(om_appendfile_t *f);

#endif /* OM_APPENDFILE_H */
