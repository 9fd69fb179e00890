/*
 * bench/upload_sink.c PORT: the upload peer of bench/stream_bench.sh. It
 * accepts on 127.0.0.1:PORT, a child process per connection, reads each request
 * head, then reads and drops exactly its Content-Length (or its chunked
 * body) before it answers `200` with `ok`, so an upload is timed to its
 * last byte, whoever sends it (nginx's `return 200` answers before the body
 * and lets a client stop sending). Keep-alive; 256 KiB reads. Only what the
 * bench sends is understood: Content-Length or chunked without trailers.
 * Not a server for anything else.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF (256u << 10)

static char buf[BUF];
static size_t have, pos;

/* More bytes into buf (after what is unread); 0 on EOF or error. */
static int fill(int fd) {
  ssize_t n;
  if (pos == have)
    pos = have = 0;
  else if (have == BUF) {
    memmove(buf, buf + pos, have - pos);
    have -= pos;
    pos = 0;
  }
  n = read(fd, buf + have, BUF - have);
  if (n <= 0)
    return 0;
  have += (size_t)n;
  return 1;
}

/* A line ending in CRLF, NUL-terminated in place; NULL on EOF. */
static char *line(int fd) {
  for (;;) {
    char *e = memchr(buf + pos, '\n', have - pos);
    if (e != NULL) {
      char *l = buf + pos;
      *e = '\0';
      if (e > l && e[-1] == '\r')
        e[-1] = '\0';
      pos = (size_t)(e - buf) + 1;
      return l;
    }
    if (have - pos == BUF || !fill(fd))
      return NULL;
  }
}

/* Drop n body bytes; 0 on EOF. */
static int skip(int fd, unsigned long long n) {
  while (n > 0) {
    size_t k;
    if (pos == have && !fill(fd))
      return 0;
    k = have - pos < n ? have - pos : (size_t)n;
    pos += k;
    n -= k;
  }
  return 1;
}

static void serve(int fd) {
  static const char ok[] =
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n"
      "\r\nok";
  have = pos = 0;
  for (;;) {
    unsigned long long cl = 0;
    int chunked = 0;
    char *l = line(fd);
    if (l == NULL)
      return;
    while ((l = line(fd)) != NULL && l[0] != '\0') {
      if (strncasecmp(l, "content-length:", 15) == 0)
        cl = strtoull(l + 15, NULL, 10);
      else if (strncasecmp(l, "transfer-encoding:", 18) == 0 &&
               strstr(l, "chunked") != NULL)
        chunked = 1;
      else if (strncasecmp(l, "expect:", 7) == 0 &&
               write(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25) != 25)
        return;
    }
    if (l == NULL)
      return;
    if (chunked) {
      for (;;) {
        unsigned long long n;
        if ((l = line(fd)) == NULL)
          return;
        n = strtoull(l, NULL, 16);
        if (n == 0) {
          if (line(fd) == NULL) /* the empty line after the last chunk */
            return;
          break;
        }
        if (!skip(fd, n) || line(fd) == NULL)
          return;
      }
    } else if (!skip(fd, cl)) {
      return;
    }
    if (write(fd, ok, sizeof ok - 1) != (ssize_t)(sizeof ok - 1))
      return;
  }
}

int main(int argc, char **argv) {
  struct sockaddr_in a;
  int ls, one = 1;
  if (argc != 2) {
    fprintf(stderr, "usage: upload_sink PORT\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)atoi(argv[1]));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 64) != 0) {
    perror("upload_sink");
    return 1;
  }
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0)
      continue;
    if (fork() == 0) {
      close(ls);
      serve(fd);
      _exit(0);
    }
    close(fd);
  }
}
