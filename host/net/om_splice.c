/*
 * om_splice.c: socket to socket through a pipe with splice(2)
 * (om_splice.h).
 *
 * The pump drains the pipe into the destination first, then refills it
 * from the source, until the destination would block (wait for it to be
 * writable, stop watching the source), the source would block (wait for
 * it to be readable), len bytes went out (done), or the turn's share
 * (OM_SPLICE_TURN_BYTES) was moved (wait for the next readiness report).
 * Each poll handle watches a duplicate of the caller's descriptor: libuv
 * allows one watcher per descriptor number, and epoll keys registrations
 * by number, so the caller's own handles are untouched. The polls are
 * stopped (their epoll registrations removed) before on_done runs, so
 * the caller may take its sockets back inside it.
 */
#define _GNU_SOURCE /* splice, F_SETPIPE_SZ */
#include "om_splice.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "om_errno.h"

/* asked of F_SETPIPE_SZ (the default is 64 KiB), and the least a splice
 * runs with */
#define PIPE_WANT (1u << 20)
#define PIPE_MIN (64u << 10)

struct om_splice_s {
  uv_poll_t pin, pout;
  int sfd, dfd, pr, pw; /* duplicates, and the pipe */
  uint64_t to_read;     /* still to take from the source */
  uint64_t in_pipe;     /* taken, not yet written */
  uint64_t moved;       /* written to the destination */
  uint64_t len;
  size_t pipe_cap;
  int handles;
  unsigned in_on : 1, out_on : 1, ended : 1;
  om_splice_callbacks_t cb;
  void *ud;
};

static void on_closed(uv_handle_t *h) {
  om_splice_t *s = h->data;
  if (--s->handles > 0)
    return;
  close(s->sfd);
  close(s->dfd);
  close(s->pr);
  close(s->pw);
  free(s);
}

/* Stop watching and free from the loop (no callback after). */
static void teardown(om_splice_t *s) {
  s->ended = 1;
  uv_close((uv_handle_t *)&s->pin, on_closed);
  uv_close((uv_handle_t *)&s->pout, on_closed);
}

static void on_ready(uv_poll_t *p, int status, int events);

static void want_in(om_splice_t *s, int on) {
  if (on && !s->in_on)
    uv_poll_start(&s->pin, UV_READABLE | UV_DISCONNECT, on_ready);
  else if (!on && s->in_on)
    uv_poll_stop(&s->pin);
  s->in_on = on ? 1 : 0;
}

static void want_out(om_splice_t *s, int on) {
  if (on && !s->out_on)
    uv_poll_start(&s->pout, UV_WRITABLE | UV_DISCONNECT, on_ready);
  else if (!on && s->out_on)
    uv_poll_stop(&s->pout);
  s->out_on = on ? 1 : 0;
}

static void result(const om_splice_t *s, int err, int src_failed,
                   om_splice_result_t *out) {
  out->err = err;
  out->src_failed = err != 0 && src_failed;
  out->moved = s->moved;
  out->taken = s->len - s->to_read;
}

static void finish(om_splice_t *s, int err, int src_failed) {
  om_splice_result_t res;
  want_in(s, 0);
  want_out(s, 0);
  s->ended = 1;
  result(s, err, src_failed, &res);
  s->cb.on_done(s->ud, &res);
  teardown(s);
}

static void pump(om_splice_t *s) {
  uint64_t turn = 0, before = s->moved;
  int err = 0, end = 0, src = 0; /* end: finish with err (src: its side) */
  while (!end) {
    ssize_t n;
    if (s->in_pipe > 0) {
      n = splice(s->pr, NULL, s->dfd, NULL, (size_t)s->in_pipe,
                 SPLICE_F_NONBLOCK | SPLICE_F_MOVE |
                     (s->to_read > 0 ? SPLICE_F_MORE : 0));
      if (n > 0) {
        s->in_pipe -= (uint64_t)n;
        s->moved += (uint64_t)n;
        turn += (uint64_t)n;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        want_in(s, 0); /* the pipe is full until the destination drains */
        want_out(s, 1);
        break;
      } else {
        err = OM_EIO, end = 1; /* the destination closed or failed */
      }
      continue;
    }
    if (s->to_read == 0) {
      end = 1; /* every byte went out */
      continue;
    }
    if (turn >= OM_SPLICE_TURN_BYTES) {
      want_out(s, 0);
      want_in(s, 1); /* the next readiness report goes on */
      break;
    }
    n = splice(s->sfd, NULL, s->pw, NULL,
               (size_t)(s->to_read < s->pipe_cap ? s->to_read : s->pipe_cap),
               SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
    if (n > 0) {
      s->to_read -= (uint64_t)n;
      s->in_pipe += (uint64_t)n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      want_out(s, 0);
      want_in(s, 1);
      break;
    } else {
      err = OM_EIO, end = 1, src = 1; /* EOF before len, or it failed */
    }
  }
  if (end) {
    finish(s, err, src);
    return;
  }
  if (s->moved > before && s->cb.on_progress != NULL)
    s->cb.on_progress(s->ud, s->moved);
}

/* Either side is ready (or failed): pump. */
static void on_ready(uv_poll_t *p, int status, int events) {
  om_splice_t *s = p->data;
  (void)events;
  if (s->ended)
    return;
  if (status < 0) {
    finish(s, OM_EIO, p == &s->pin);
    return;
  }
  pump(s);
}

static int is_socket(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

int om_splice_start(uv_loop_t *loop, int src, int dst, uint64_t len,
                    const om_splice_callbacks_t *cb, void *ud,
                    om_splice_t **out) {
  om_splice_t *s;
  int fds[2];
  if (loop == NULL || src < 0 || dst < 0 || len == 0 || cb == NULL ||
      cb->on_done == NULL || out == NULL || !is_socket(src) || !is_socket(dst))
    return OM_EINVAL;
  s = calloc(1, sizeof *s);
  if (s == NULL)
    return OM_ENOMEM;
  s->sfd = s->dfd = s->pr = s->pw = -1;
  if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    free(s);
    return OM_EIO;
  }
  s->pr = fds[0];
  s->pw = fds[1];
  {
    /* past the user's pipe-user-pages-soft (pipe(7)) the kernel makes
     * pipes of a page or two and refuses to grow them: splicing through
     * that is slower than copying, so the caller copies instead */
    int cap = fcntl(s->pw, F_SETPIPE_SZ, (int)PIPE_WANT);
    if (cap <= 0)
      cap = fcntl(s->pw, F_GETPIPE_SZ);
    if (cap < (int)PIPE_MIN) {
      close(s->pr);
      close(s->pw);
      free(s);
      return OM_EIO;
    }
    s->pipe_cap = (size_t)cap;
  }
  s->sfd = fcntl(src, F_DUPFD_CLOEXEC, 0);
  s->dfd = fcntl(dst, F_DUPFD_CLOEXEC, 0);
  if (s->sfd < 0 || s->dfd < 0 ||
      uv_poll_init_socket(loop, &s->pin, s->sfd) != 0) {
    if (s->sfd >= 0)
      close(s->sfd);
    if (s->dfd >= 0)
      close(s->dfd);
    close(s->pr);
    close(s->pw);
    free(s);
    return OM_EIO;
  }
  if (uv_poll_init_socket(loop, &s->pout, s->dfd) != 0) {
    /* the first handle is initialised: it closes through the loop */
    s->pin.data = s;
    s->handles = 1;
    s->ended = 1;
    uv_close((uv_handle_t *)&s->pin, on_closed);
    return OM_EIO;
  }
  s->pin.data = s->pout.data = s;
  s->handles = 2;
  s->to_read = s->len = len;
  s->cb = *cb;
  s->ud = ud;
  want_in(s, 1); /* nothing runs before the loop reports readiness */
  *out = s;
  return 0;
}

int om_splice_waits_for_dst(const om_splice_t *s) {
  return s != NULL && !s->ended && s->out_on;
}

uint64_t om_splice_cancel(om_splice_t *s, om_splice_result_t *res) {
  uint64_t moved;
  if (res != NULL)
    memset(res, 0, sizeof *res);
  if (s == NULL || s->ended)
    return s != NULL ? s->moved : 0;
  if (res != NULL)
    result(s, 0, 0, res);
  moved = s->moved;
  want_in(s, 0);
  want_out(s, 0);
  teardown(s);
  return moved;
}
