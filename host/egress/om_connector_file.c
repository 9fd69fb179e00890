/*
 * om_connector_file.c: the "file" connector kind: append each part as one
 * JSON line to a file (local use and tests; see om_connector.h).
 *
 * Each line is one write(2) of the whole line on an O_APPEND descriptor,
 * so lines written by several processes do not interleave inside a line
 * (POSIX write(2) with O_APPEND on a regular file).
 *
 * Rotation: the descriptor follows the path, not the inode. Before every
 * line the path is stat'ed and compared with the open file (st_dev,
 * st_ino); when the file was renamed away or deleted, the path is opened
 * again (created if missing), so the next lines land where a reader of
 * the path looks instead of vanishing into an unlinked inode. One stat per
 * line is far cheaper than the delivery around it. When the path cannot be
 * opened again the part fails (the channel did not receive it) and the
 * next delivery tries again.
 *
 * The stat, the reopen and the write run on the libuv threadpool
 * (uv_queue_work), so a slow disk never stalls the loop; the loop thread
 * touches the descriptor only when no write is in flight.
 */
#include "om_appendfile.h"
#include "om_connector.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "om_errno.h"

typedef struct {
  om_connector_t *c;
  uv_loop_t *loop;
  char *path;
  om_appendfile_t file; /* follows path (om_appendfile.h) */
  uv_work_t work;
  char *line; /* the line being written */
  size_t len;
  int writing, closing;
  /* set by the worker, read in after_write */
  int write_err;  /* 0 or a negative errno */
  int reopen_err; /* 0 or a negative errno: the path could not be opened */
  void (*done)(om_connector_t *c);
} file_t;

static int fc_open(om_connector_t *c, uv_loop_t *loop,
                   const om_connector_opts_t *opts, void **state, char *err,
                   size_t errlen) {
  file_t *f;
  int fd;
  if (strlen(opts->target) > 4096) {
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "target: path longer than 4096 bytes");
    return OM_EINVAL;
  }
  f = calloc(1, sizeof *f);
  if (f == NULL || (f->path = strdup(opts->target)) == NULL) {
    free(f);
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  /* Synchronous on purpose: it runs once, at startup, and a path that
   * cannot be opened must fail the configuration, not the first reply. */
  fd = om_appendfile_open(&f->file, opts->target);
  if (fd < 0) {
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "target: cannot open '%.200s' for appending: %s",
               opts->target, strerror(-fd));
    free(f->path);
    free(f);
    return OM_EIO;
  }
  f->c = c;
  f->loop = loop;
  *state = f;
  return 0;
}

static void fc_free(file_t *f) {
  om_appendfile_close(&f->file);
  free(f->line);
  free(f->path);
  free(f);
}

/* Threadpool: follow the path, then write the whole line. */
static void write_work(uv_work_t *w) {
  file_t *f = w->data;
  f->write_err = 0;
  f->reopen_err = om_appendfile_follow(&f->file, f->path);
  if (f->reopen_err != 0)
    return; /* the part fails: the channel file is not where it was */
  f->write_err = om_appendfile_write(&f->file, f->line, f->len);
}

static void after_write(uv_work_t *w, int status) {
  file_t *f = w->data;
  f->writing = 0;
  if (f->closing) {
    om_connector_t *c = f->c;
    void (*done)(om_connector_t *) = f->done;
    fc_free(f);
    done(c);
    return;
  }
  free(f->line);
  f->line = NULL;
  if (status < 0 || f->reopen_err < 0 || f->write_err < 0) {
    char why[160];
    if (status < 0)
      snprintf(why, sizeof why, "write: %s", uv_strerror(status));
    else if (f->reopen_err < 0)
      snprintf(why, sizeof why, "reopen after rotation: %s",
               strerror(-f->reopen_err));
    else
      snprintf(why, sizeof why, "write: %s", strerror(-f->write_err));
    om__connector_sent(f->c, OM_CONNECTOR_FAIL, why);
  } else {
    om__connector_sent(f->c, OM_CONNECTOR_OK, NULL);
  }
}

static int fc_send(void *state, om_connector_t *c, const char *json,
                   size_t len) {
  file_t *f = state;
  int rc;
  (void)c;
  if (len >= (size_t)1 << 30)
    return OM_ETOOBIG;
  f->line = malloc(len + 1);
  if (f->line == NULL)
    return OM_ENOMEM;
  memcpy(f->line, json, len);
  f->line[len] = '\n';
  f->len = len + 1;
  f->work.data = f;
  rc = uv_queue_work(f->loop, &f->work, write_work, after_write);
  if (rc != 0) {
    free(f->line);
    f->line = NULL;
    return OM_EIO;
  }
  f->writing = 1;
  return 0;
}

static void fc_close(void *state, om_connector_t *c,
                     void (*done)(om_connector_t *c)) {
  file_t *f = state;
  if (f->writing) {
    /* A file write cannot be taken back: finish it, then free. */
    f->closing = 1;
    f->done = done;
    return;
  }
  fc_free(f);
  done(c);
}

const om_connector_kind_t om__connector_file = {
    .name = "file",
    .default_part_limit = 65536,
    .open = fc_open,
    .send = fc_send,
    .close = fc_close,
};
