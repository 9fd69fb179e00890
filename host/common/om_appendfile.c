/* om_appendfile.c: see om_appendfile.h. */
#include "om_appendfile.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define APPEND_FLAGS (O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK)

int om_appendfile_open(om_appendfile_t *f, const char *path) {
  struct stat st;
  int fd = open(path, APPEND_FLAGS, 0600);
  f->fd = -1;
  if (fd < 0)
    return -errno;
  if (fstat(fd, &st) != 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  f->fd = fd;
  f->dev = st.st_dev;
  f->ino = st.st_ino;
  return 0;
}

int om_appendfile_follow(om_appendfile_t *f, const char *path) {
  struct stat st;
  om_appendfile_t next;
  int rc;
  if (f->fd >= 0 && stat(path, &st) == 0 && st.st_dev == f->dev &&
      st.st_ino == f->ino)
    return 0;
  rc = om_appendfile_open(&next, path);
  if (rc != 0)
    return rc;
  om_appendfile_close(f);
  *f = next;
  return 0;
}

int om_appendfile_write(om_appendfile_t *f, const char *buf, size_t len) {
  size_t off = 0;
  if (f->fd < 0)
    return -EBADF;
  while (off < len) {
    ssize_t n = write(f->fd, buf + off, len - off);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    off += (size_t)n; /* a short write (a full disk, a signal): the rest */
  }
  return 0;
}

void om_appendfile_close(om_appendfile_t *f) {
  if (f->fd >= 0)
    close(f->fd);
  f->fd = -1;
}
