/*
 * watch_reader: N Server-Sent Events watchers of one path, read from one
 * epoll loop, for bench/watch_bench.py: the readers of a 1.3 MB snapshot
 * stream must cost the machine little next to the plane that writes it,
 * or a two-core bench measures its own client.
 *
 *   watch_reader PORT PATH N
 *
 * Opens N connections to 127.0.0.1:PORT, sends `GET PATH HTTP/1.1` on
 * each, and reads every byte. An event's `id:` line (a line that starts
 * with "id: ", RFC-free: the control plane writes exactly that form) is
 * found with memchr over line ends, so the 1.3 MB data line is skipped at
 * memory speed; the reader never parses JSON. For each id it prints
 *
 *   ev WATCHER ID SECONDS
 *
 * (SECONDS: CLOCK_MONOTONIC at the read that completed the line, the
 * clock of Python's time.monotonic), `eof WATCHER` when a stream ends,
 * and `ready` once every connection is open. Output is flushed after each
 * loop turn. Exits 0 when stdin reaches end of file (the driver closed
 * it), 1 on a connection failure, 2 on bad arguments.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ID_MAX 32 /* "id: " and 20 digits fit */

typedef struct {
  int fd;
  int eof;
  /* the bytes after a line end not yet known to be (or not be) an id
   * line: a read may end inside "id: 123" */
  char carry[ID_MAX];
  size_t n_carry;
  int in_line; /* 0: the next byte starts a line */
} reader_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * Look at the start of a line, p[0..n): 1 when it is complete enough to
 * decide (an id printed, or not an id line), 0 when more bytes are needed.
 */
static int line_start(int k, const char *p, size_t n, double t) {
  static const char pre[] = "id: ";
  size_t i;
  for (i = 0; i < 4; i++) {
    if (i == n)
      return 0;
    if (p[i] != pre[i])
      return 1;
  }
  for (; i < n; i++)
    if (p[i] == '\n') {
      printf("ev %d %.*s %.9f\n", k, (int)(i - 4), p + 4, t);
      return 1;
    }
  return n >= ID_MAX; /* an id too long to be ours: not counted */
}

static void feed(reader_t *r, int k, const char *p, size_t n, double t) {
  const char *end = p + n;
  if (r->n_carry > 0 || !r->in_line) {
    /* finish the line start begun in the last read */
    size_t take = ID_MAX - r->n_carry;
    if (take > n)
      take = n;
    memcpy(r->carry + r->n_carry, p, take);
    if (!line_start(k, r->carry, r->n_carry + take, t)) {
      r->n_carry += take;
      r->in_line = 0;
      return;
    }
    r->n_carry = 0;
    r->in_line = 1;
  }
  for (;;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t left;
    if (nl == NULL)
      return;
    p = nl + 1;
    left = (size_t)(end - p);
    if (!line_start(k, p, left, t)) {
      memcpy(r->carry, p, left); /* left < ID_MAX here */
      r->n_carry = left;
      r->in_line = 0;
      return;
    }
  }
}

int main(int argc, char **argv) {
  static char buf[1 << 20];
  struct sockaddr_in sa;
  struct epoll_event ev, evs[64];
  char req[1024];
  reader_t *rs;
  int port, n, ep, req_len, open_n;
  if (argc != 4 || (port = atoi(argv[1])) <= 0 || port > 65535 ||
      (n = atoi(argv[3])) <= 0 || n > 100000 || argv[2][0] != '/') {
    fprintf(stderr, "usage: watch_reader PORT PATH N\n");
    return 2;
  }
  req_len = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: bench\r\n\r\n",
                     argv[2]);
  if (req_len <= 0 || (size_t)req_len >= sizeof req) {
    fprintf(stderr, "watch_reader: PATH too long\n");
    return 2;
  }
  rs = calloc((size_t)n, sizeof *rs);
  ep = epoll_create1(0);
  if (rs == NULL || ep < 0) {
    perror("watch_reader");
    return 1;
  }
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((unsigned short)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int k = 0; k < n; k++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        write(fd, req, (size_t)req_len) != req_len) {
      fprintf(stderr, "watch_reader: watcher %d: %s\n", k, strerror(errno));
      return 1;
    }
    rs[k].fd = fd;
    rs[k].in_line = 1; /* the status line is not an id line */
    ev.events = EPOLLIN;
    ev.data.u32 = (unsigned)k;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
      perror("watch_reader: epoll_ctl");
      return 1;
    }
  }
  ev.events = EPOLLIN;
  ev.data.u32 = (unsigned)n; /* stdin: the driver is done at its EOF */
  if (epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev) != 0) {
    perror("watch_reader: epoll_ctl stdin");
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  open_n = n;
  for (;;) {
    int m = epoll_wait(ep, evs, 64, -1);
    if (m < 0) {
      if (errno == EINTR)
        continue;
      perror("watch_reader: epoll_wait");
      return 1;
    }
    for (int i = 0; i < m; i++) {
      int k = (int)evs[i].data.u32;
      ssize_t got;
      if (k == n) {
        got = read(0, buf, sizeof buf);
        if (got <= 0)
          return 0;
        continue;
      }
      got = read(rs[k].fd, buf, sizeof buf);
      if (got > 0) {
        feed(&rs[k], k, buf, (size_t)got, now_s());
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        printf("eof %d\n", k);
        epoll_ctl(ep, EPOLL_CTL_DEL, rs[k].fd, NULL);
        close(rs[k].fd);
        open_n--;
      }
    }
    fflush(stdout);
    (void)open_n;
  }
}
