/* om_cli_util.c: see om_cli_util.h. */
#include "om_cli_util.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "om_cli.h"
#include "om_errno.h"
#include "om_log.h"
#include "om_store_redis.h"

int om_parse_duration_ms(const char *s, uint64_t *out_ms) {
  uint64_t v = 0, mul;
  const char *p = s;
  int over = 0;
  if (s == NULL || out_ms == NULL)
    return OM_EINVAL;
  if (strcmp(s, "0") == 0) {
    *out_ms = 0;
    return 0;
  }
  if (*p < '0' || *p > '9')
    return OM_EPARSE;
  /* a malformed tail is a parse error even after too many digits */
  for (; *p >= '0' && *p <= '9'; p++) {
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10)
      over = 1;
    else
      v = v * 10 + d;
  }
  if (strcmp(p, "ms") == 0)
    mul = 1;
  else if (strcmp(p, "s") == 0)
    mul = 1000;
  else if (strcmp(p, "m") == 0)
    mul = 60000;
  else if (strcmp(p, "h") == 0)
    mul = 3600000;
  else
    return OM_EPARSE;
  if (over || v > UINT64_MAX / mul)
    return OM_ERANGE;
  *out_ms = v * mul;
  return 0;
}

static int b64token_char(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
         c == '~' || c == '+' || c == '/';
}

/* RFC 6750 section 2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" /
 * "~" / "+" / "/" ) *"=" */
static int valid_b64token(const char *s, size_t n) {
  size_t i = 0;
  while (i < n && b64token_char((unsigned char)s[i]))
    i++;
  if (i == 0)
    return 0;
  while (i < n && s[i] == '=')
    i++;
  return i == n;
}

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' ||
         c == '\f';
}

int om_read_token_file(const char *path, char *out, size_t cap,
                       const char **why) {
  char line[8192];
  const char *dummy;
  size_t start = 0, end;
  FILE *f;
  if (why == NULL)
    why = &dummy;
  *why = "";
  if (out == NULL || cap == 0 || path == NULL) {
    *why = "invalid argument";
    return OM_EINVAL;
  }
  out[0] = '\0';
  f = fopen(path, "rb");
  if (f == NULL) {
    *why = "cannot be opened";
    return OM_ENOTFOUND;
  }
  if (fgets(line, sizeof line, f) == NULL) {
    int err = ferror(f);
    fclose(f);
    *why = err ? "cannot be read" : "is empty";
    return err ? OM_ENOTFOUND : OM_EPARSE;
  }
  fclose(f);
  end = strlen(line);
  if (end == sizeof line - 1 && line[end - 1] != '\n') {
    *why = "has a first line longer than 8 KiB";
    return OM_ETOOBIG;
  }
  while (start < end && is_space(line[start]))
    start++;
  while (end > start && is_space(line[end - 1]))
    end--;
  if (end == start) {
    *why = "has an empty first line";
    return OM_EPARSE;
  }
  if (!valid_b64token(line + start, end - start)) {
    *why = "does not hold a bearer token (RFC 6750 b64token: letters, "
           "digits, -._~+/ then optional =)";
    return OM_EPARSE;
  }
  if (end - start >= cap) {
    *why = "holds a token that is too long";
    return OM_ETOOBIG;
  }
  memcpy(out, line + start, end - start);
  out[end - start] = '\0';
  return 0;
}

int om_parse_listen(const char *s, char *host, size_t cap, int *port) {
  const char *colon;
  char *end;
  unsigned long p;
  size_t hl;
  unsigned char tmp[16];
  if (s[0] == '[') {
    const char *rb = strchr(s, ']');
    if (rb == NULL || rb[1] != ':')
      return -1;
    hl = (size_t)(rb - s - 1);
    if (hl == 0 || hl >= cap)
      return -1;
    memcpy(host, s + 1, hl);
    host[hl] = '\0';
    colon = rb + 1;
  } else {
    colon = strrchr(s, ':');
    if (colon == NULL)
      return -1;
    hl = (size_t)(colon - s);
    if (hl == 0 || hl >= cap)
      return -1;
    memcpy(host, s, hl);
    host[hl] = '\0';
    if (strchr(host, ':') != NULL)
      return -1; /* IPv6 needs brackets */
  }
  if (strcmp(host, "localhost") == 0)
    snprintf(host, cap, "127.0.0.1");
  if (uv_inet_pton(AF_INET, host, tmp) != 0 &&
      uv_inet_pton(AF_INET6, host, tmp) != 0)
    return -1;
  if (colon[1] < '0' || colon[1] > '9')
    return -1;
  p = strtoul(colon + 1, &end, 10);
  if (*end != '\0' || p > 65535)
    return -1;
  *port = (int)p;
  return 0;
}

void om_cli_signals_start(uv_loop_t *loop, om_cli_signals_t *s,
                          uv_signal_cb on_stop, uv_signal_cb on_hup,
                          void *data) {
  uv_signal_init(loop, &s->term);
  uv_signal_init(loop, &s->intr);
  uv_signal_init(loop, &s->hup);
  s->term.data = s->intr.data = s->hup.data = data;
  s->open = 1;
  uv_signal_start(&s->term, on_stop, SIGTERM);
  uv_signal_start(&s->intr, on_stop, SIGINT);
  uv_signal_start(&s->hup, on_hup, SIGHUP);
}

void om_cli_signals_close(om_cli_signals_t *s) {
  if (!s->open)
    return;
  s->open = 0;
  uv_close((uv_handle_t *)&s->term, NULL);
  uv_close((uv_handle_t *)&s->intr, NULL);
  uv_close((uv_handle_t *)&s->hup, NULL);
}

int om_cli_fail_usage(const char *cmd, const char *fmt, const char *arg) {
  fprintf(stderr, "openmesh %s: ", cmd);
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(see openmesh %s --help)\n", cmd);
  return OM_EXIT_USAGE;
}

int om_cli_common_option(const char *cmd, int c, const char *arg,
                         void (*usage)(FILE *out)) {
  switch (c) {
  case 'L':
    if (om_log_set_level_name(arg) != 0)
      return om_cli_fail_usage(
          cmd, "--log-level: '%s' is not debug, info, warn or error", arg);
    return -1;
  case 'h':
    usage(stdout);
    return OM_EXIT_OK;
  default:
    usage(stderr);
    return OM_EXIT_USAGE;
  }
}

int om_cli_no_operands(const char *cmd, int argc, char **argv) {
  if (optind != argc)
    return om_cli_fail_usage(cmd, "unexpected argument '%s'", argv[optind]);
  return OM_EXIT_OK;
}

int om_cli_store_arg(const char *cmd, const char *store, int *is_redis) {
  char rh[OM_STORE_REDIS_HOST_MAX + 1];
  int rp, rdb;
  const char *why = "malformed";
  *is_redis = 0;
  if (strcmp(store, "memory") == 0)
    return OM_EXIT_OK;
  if (strncmp(store, "redis", 5) != 0)
    return om_cli_fail_usage(
        cmd, "--store: unknown store '%s' (memory or redis://HOST:PORT/DB)",
        store);
  if (strlen(store) > 1024 ||
      om_store_redis_parse_url(store, rh, sizeof rh, &rp, &rdb, &why) != 0) {
    fprintf(stderr,
            "openmesh %s: --store: '%.200s' is not a Redis URL like "
            "redis://127.0.0.1:6379/0: %s\n(see openmesh %s --help)\n",
            cmd, store, why, cmd);
    return OM_EXIT_USAGE;
  }
  *is_redis = 1;
  return OM_EXIT_OK;
}
