/*
 * test_splice.c: om_splice between real loopback TCP sockets: exactly
 * len bytes move (the bytes behind them stay in the source for its owner),
 * in order and intact, through a destination that reads slowly; a source
 * that ends early fails with what was moved; cancel stops with no
 * callback; and a descriptor that is not a socket is refused.
 */
#define _GNU_SOURCE /* usleep */
#include "om_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "om_errno.h"
#include "om_splice.h"

/* A connected loopback TCP pair: *a connects, *b is accepted. */
static void tcp_pair(int *a, int *b) {
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  int lis = socket(AF_INET, SOCK_STREAM, 0);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(lis, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(lis, 1), 0);
  assert_int_equal(getsockname(lis, (struct sockaddr *)&sa, &len), 0);
  *a = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(connect(*a, (struct sockaddr *)&sa, sizeof sa), 0);
  *b = accept(lis, NULL, NULL);
  assert_true(*b >= 0);
  close(lis);
  fcntl(*a, F_SETFL, O_NONBLOCK);
  fcntl(*b, F_SETFL, O_NONBLOCK);
}

typedef struct {
  int done, err, progress, src_failed;
  uint64_t moved, taken;
} res_t;

static void on_progress(void *ud, uint64_t moved) {
  res_t *r = ud;
  r->progress++;
  r->moved = moved;
}

static void on_done(void *ud, const om_splice_result_t *res) {
  res_t *r = ud;
  r->done = 1;
  r->err = res->err;
  r->src_failed = res->src_failed;
  r->moved = res->moved;
  r->taken = res->taken;
}

static const om_splice_callbacks_t CB = {on_progress, on_done};

static unsigned char pat(uint64_t i) {
  return (unsigned char)((i * 131u + (i >> 13)) & 0xff);
}

/* Write n pattern bytes from offset off to fd (blocking on EAGAIN by
 * running the loop a little). */
static void write_all(uv_loop_t *loop, int fd, uint64_t off, uint64_t n) {
  static unsigned char buf[65536];
  while (n > 0) {
    size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
    ssize_t w;
    for (size_t i = 0; i < k; i++)
      buf[i] = pat(off + i);
    w = write(fd, buf, k);
    if (w < 0 && errno == EAGAIN) {
      uv_run(loop, UV_RUN_NOWAIT);
      continue;
    }
    assert_true(w > 0);
    off += (uint64_t)w;
    n -= (uint64_t)w;
  }
}

/* Write up to n pattern bytes from offset off, what fd takes now. */
static uint64_t write_some(int fd, uint64_t off, uint64_t n) {
  static unsigned char buf[65536];
  size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
  ssize_t w;
  for (size_t i = 0; i < k; i++)
    buf[i] = pat(off + i);
  w = write(fd, buf, k);
  if (w < 0 && errno == EAGAIN)
    return 0;
  assert_true(w > 0);
  return (uint64_t)w;
}

/* Read what fd has into the check: the pattern from *off on. */
static void read_check(int fd, uint64_t *off, size_t max) {
  unsigned char buf[65536];
  while (max > 0) {
    ssize_t r = read(fd, buf, max < sizeof buf ? max : sizeof buf);
    if (r <= 0)
      return;
    for (ssize_t i = 0; i < r; i++)
      if (buf[i] != pat(*off + (uint64_t)i))
        fail_msg("byte %llu: %u, expected %u",
                 (unsigned long long)(*off + (uint64_t)i), buf[i],
                 pat(*off + (uint64_t)i));
    *off += (uint64_t)r;
    max -= (size_t)r;
  }
}

static void moves_exactly_len_through_a_slow_reader(void **state) {
  uv_loop_t loop;
  int w, src, dst, rd;
  uint64_t len = 5u << 20, got = 0, total = len + 4096;
  res_t r = {0};
  om_splice_t *s;
  (void)state;
  uv_loop_init(&loop);
  tcp_pair(&w, &src);
  tcp_pair(&dst, &rd);
  assert_int_equal(om_splice_start(&loop, src, dst, len, &CB, &r, &s), 0);
  assert_int_equal(r.done, 0); /* nothing from inside the call */
  {
    uint64_t sent = 0;
    uint64_t t0 = uv_hrtime();
    while (!r.done && uv_hrtime() - t0 < UINT64_C(20000000000)) {
      if (sent < total)
        sent += write_some(w, sent, total - sent);
      read_check(rd, &got, 16384); /* a reader slower than the writer */
      uv_run(&loop, UV_RUN_NOWAIT);
    }
    assert_int_equal(r.done, 1);
    while (sent < total) /* the bytes behind len, if not all out yet */
      sent += write_some(w, sent, total - sent);
  }
  assert_int_equal(r.err, 0);
  OM_ASSERT_CMP(r.moved, ==, len);
  OM_ASSERT_CMP(r.progress, >, 0);
  for (int i = 0; i < 200 && got < len; i++) {
    read_check(rd, &got, 1u << 20);
    usleep(1000);
  }
  OM_ASSERT_CMP(got, ==, len);
  /* the source is the caller's again, right after the bytes moved */
  {
    uint64_t rest = len;
    for (int i = 0; i < 200 && rest < total; i++) {
      read_check(src, &rest, 65536);
      usleep(1000);
    }
    OM_ASSERT_CMP(rest, ==, total);
  }
  uv_run(&loop, UV_RUN_NOWAIT); /* the splice's handles close */
  close(w);
  close(src);
  close(dst);
  close(rd);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void early_eof_fails_with_what_moved(void **state) {
  uv_loop_t loop;
  int w, src, dst, rd;
  res_t r = {0};
  om_splice_t *s;
  uint64_t got = 0;
  (void)state;
  uv_loop_init(&loop);
  tcp_pair(&w, &src);
  tcp_pair(&dst, &rd);
  assert_int_equal(om_splice_start(&loop, src, dst, 1u << 20, &CB, &r, &s), 0);
  write_all(&loop, w, 0, 1000);
  close(w); /* EOF at 1,000 of 1 MiB */
  for (int i = 0; i < 2000 && !r.done; i++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    read_check(rd, &got, 65536);
    usleep(500);
  }
  assert_int_equal(r.done, 1);
  assert_int_equal(r.err, OM_EIO);
  assert_int_equal(r.src_failed, 1);
  OM_ASSERT_CMP(r.moved, ==, 1000);
  OM_ASSERT_CMP(r.taken, ==, 1000);
  uv_run(&loop, UV_RUN_NOWAIT);
  close(src);
  close(dst);
  close(rd);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* The reader goes away: the destination's side failed, and what was
 * taken from the source but never delivered is told apart from what
 * moved. */
static void a_closed_destination_fails_on_its_side(void **state) {
  uv_loop_t loop;
  int w, src, dst, rd;
  res_t r = {0};
  om_splice_t *s;
  uint64_t sent = 0;
  const uint64_t len = 64u << 20;
  (void)state;
  uv_loop_init(&loop);
  tcp_pair(&w, &src);
  tcp_pair(&dst, &rd);
  assert_int_equal(om_splice_start(&loop, src, dst, len, &CB, &r, &s), 0);
  for (int i = 0; i < 200 && r.moved < 65536; i++) {
    sent += write_some(w, sent, 1u << 20);
    uv_run(&loop, UV_RUN_NOWAIT);
    usleep(500);
  }
  OM_ASSERT_CMP(r.moved, >=, 65536);
  {
    struct linger lg = {1, 0}; /* a reset, not a FIN */
    setsockopt(rd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  }
  close(rd);
  for (int i = 0; i < 4000 && !r.done; i++) {
    sent += write_some(w, sent, 1u << 20);
    uv_run(&loop, UV_RUN_NOWAIT);
    usleep(500);
  }
  OM_TEST_NOTE("reader reset: moved %llu, taken %llu, written %llu",
               (unsigned long long)r.moved, (unsigned long long)r.taken,
               (unsigned long long)sent);
  assert_int_equal(r.done, 1);
  assert_int_equal(r.err, OM_EIO);
  assert_int_equal(r.src_failed, 0);
  OM_ASSERT_CMP(r.taken, >=, r.moved);
  OM_ASSERT_CMP(r.taken, <=, sent);
  uv_run(&loop, UV_RUN_NOWAIT);
  close(w);
  close(src);
  close(dst);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void cancel_stops_without_a_callback(void **state) {
  uv_loop_t loop;
  int w, src, dst, rd;
  res_t r = {0};
  om_splice_t *s;
  (void)state;
  uv_loop_init(&loop);
  tcp_pair(&w, &src);
  tcp_pair(&dst, &rd);
  assert_int_equal(om_splice_start(&loop, src, dst, 1u << 20, &CB, &r, &s), 0);
  write_all(&loop, w, 0, 3000);
  for (int i = 0; i < 50 && r.moved < 3000; i++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  {
    om_splice_result_t cr;
    OM_ASSERT_CMP(om_splice_cancel(s, &cr), ==, 3000);
    assert_int_equal(cr.err, 0);
    OM_ASSERT_CMP(cr.moved, ==, 3000);
    OM_ASSERT_CMP(cr.taken, ==, 3000);
  }
  write_all(&loop, w, 3000, 3000);
  for (int i = 0; i < 20; i++)
    uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(r.done, 0);
  assert_int_equal(uv_loop_close(&loop), 0); /* every handle closed */
  close(w);
  close(src);
  close(dst);
  close(rd);
}

static void refuses_what_it_cannot_splice(void **state) {
  uv_loop_t loop;
  int p[2], w, src;
  om_splice_t *s = NULL;
  (void)state;
  uv_loop_init(&loop);
  assert_int_equal(pipe(p), 0);
  tcp_pair(&w, &src);
  assert_int_equal(om_splice_start(&loop, p[0], src, 10, &CB, NULL, &s),
                   OM_EINVAL);
  assert_int_equal(om_splice_start(&loop, src, w, 0, &CB, NULL, &s), OM_EINVAL);
  assert_int_equal(om_splice_start(&loop, -1, w, 10, &CB, NULL, &s), OM_EINVAL);
  assert_null(s);
  close(p[0]);
  close(p[1]);
  close(w);
  close(src);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(moves_exactly_len_through_a_slow_reader),
      cmocka_unit_test(early_eof_fails_with_what_moved),
      cmocka_unit_test(a_closed_destination_fails_on_its_side),
      cmocka_unit_test(cancel_stops_without_a_callback),
      cmocka_unit_test(refuses_what_it_cannot_splice),
  };
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
