/*
 * om_connector_file.c: the "file" connector kind: append each part as one
 * JSON line to a file (local use and tests; see om_connector.h).
 *
 * The file is opened once, with O_APPEND, and each line is one write of
 * the whole line, so lines written by several processes do not interleave
 * inside a line (POSIX write(2) with O_APPEND on a regular file).
 */
#include "om_connector.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"

typedef struct {
  om_connector_t *c;
  uv_loop_t *loop;
  uv_file fd;
  uv_fs_t req;
  char *line; /* the line being written */
  size_t len, off;
  int writing, closing;
  void (*done)(om_connector_t *c);
} file_t;

static int fc_open(om_connector_t *c, uv_loop_t *loop,
                   const om_connector_opts_t *opts, void **state, char *err,
                   size_t errlen) {
  uv_fs_t req;
  file_t *f;
  int fd;
  if (strlen(opts->target) > 4096) {
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "target: path longer than 4096 bytes");
    return OM_EINVAL;
  }
  f = calloc(1, sizeof *f);
  if (f == NULL) {
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  /* Synchronous on purpose: it runs once, at startup, and a path that
   * cannot be opened must fail the configuration, not the first reply. */
  fd = uv_fs_open(loop, &req, opts->target,
                  O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600, NULL);
  uv_fs_req_cleanup(&req);
  if (fd < 0) {
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "target: cannot open '%.200s' for appending: %s",
               opts->target, uv_strerror(fd));
    free(f);
    return OM_EIO;
  }
  f->c = c;
  f->loop = loop;
  f->fd = fd;
  *state = f;
  return 0;
}

static void fc_free(file_t *f) {
  uv_fs_t req;
  uv_fs_close(f->loop, &req, f->fd, NULL);
  uv_fs_req_cleanup(&req);
  free(f->line);
  free(f);
}

static int write_rest(file_t *f);

static void on_write(uv_fs_t *req) {
  file_t *f = req->data;
  ssize_t n = req->result;
  uv_fs_req_cleanup(req);
  f->writing = 0;
  if (f->closing) {
    om_connector_t *c = f->c;
    void (*done)(om_connector_t *) = f->done;
    fc_free(f);
    done(c);
    return;
  }
  if (n >= 0 && (size_t)n < f->len - f->off) {
    int rc;
    f->off += (size_t)n; /* a short write: the rest */
    rc = write_rest(f);
    if (rc == 0)
      return;
    n = rc;
  }
  free(f->line);
  f->line = NULL;
  if (n < 0) {
    char why[160];
    snprintf(why, sizeof why, "write: %s", uv_strerror((int)n));
    om__connector_sent(f->c, OM_CONNECTOR_FAIL, why);
  } else {
    om__connector_sent(f->c, OM_CONNECTOR_OK, NULL);
  }
}

static int write_rest(file_t *f) {
  uv_buf_t buf = uv_buf_init(f->line + f->off, (unsigned)(f->len - f->off));
  int rc;
  f->req.data = f;
  rc = uv_fs_write(f->loop, &f->req, f->fd, &buf, 1, -1, on_write);
  if (rc == 0)
    f->writing = 1;
  return rc;
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
  f->off = 0;
  rc = write_rest(f);
  if (rc != 0) {
    free(f->line);
    f->line = NULL;
    return OM_EIO;
  }
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
