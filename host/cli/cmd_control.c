/*
 * cmd_control.c: `openmesh control`, the control plane server
 * (om_control.h, docs/CONTROL.md).
 */
#include "om_cmds.h"

#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "om_auth.h"
#include "om_cli.h"
#include "om_cli_tls.h"
#include "om_cli_util.h"
#include "om_control.h"
#include "om_errno.h"
#include "om_log.h"
#include "om_store_memory.h"
#include "om_store_redis.h"

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: openmesh control [--listen HOST:PORT]\n"
      "                        [--store memory|redis://HOST:PORT/DB]\n"
      "                        [--store-prefix PREFIX] [--store-wait "
      "DURATION]\n"
      "                        [--tokens FILE] [--insecure]\n"
      "                        [--ping-interval DURATION] [--warmup DURATION]\n"
      "                        [--empty-service-ttl DURATION]\n"
      "                        [--max-watch-backlog SIZE] [--min-revision N]\n"
      "                        [--watch-min-interval-ms N]\n"
      "                        [--cors-origin ORIGIN] [--log-level LEVEL]\n"
      "                        [--tls-cert FILE --tls-key FILE]\n"
      "                        [--tls-client-ca FILE]\n\n"
      "The control plane: leased registry, revisioned discovery, SSE "
      "watches,\nvalidated configuration (docs/CONTROL.md).\n\n"
      "  --listen HOST:PORT        IP literal and port (default "
      "127.0.0.1:7600);\n"
      "                            port 0 picks a free port (see the "
      "start log line)\n"
      "  --store memory            the store: memory (default), or\n"
      "  --store redis://HOST:PORT/DB  Redis, shared by every control plane\n"
      "                            pointed at it (docs/STORE.md)\n"
      "  --store-prefix PREFIX     Redis key prefix (default openmesh:)\n"
      "  --store-wait DURATION     at start, retry Redis this long before "
      "giving\n"
      "                            up with exit 1 (default 10s)\n"
      "  --tokens FILE             bearer tokens: 'TOKEN ROLE[,ROLE]' per "
      "line,\n"
      "                            roles read, register, admin; re-read on "
      "SIGHUP\n"
      "  --insecure                allow a non-loopback address without "
      "--tokens\n"
      "  --ping-interval DURATION  ': ping' on idle watch streams "
      "(default 15s)\n"
      "  --max-watch-backlog SIZE  unsent bytes before a watcher is cut "
      "(default 1MiB)\n"
      "  --min-revision N          issue revisions above N (a persisted "
      "high-water mark)\n"
      "  --warmup DURATION         after the store lost its state (memory: "
      "at start;\n"
      "                            Redis: came back empty), snapshots carry\n"
      "                            \"warming\": true and /readyz is 503 for "
      "this long;\n"
      "                            proxies merge instead of dropping peers "
      "(default\n"
      "                            1h, the longest lease TTL; 0: off; at "
      "most 24h)\n"
      "  --empty-service-ttl DURATION  remove a service with no instance and "
      "no watcher\n"
      "                            for this long (default 10m; 0: keep every "
      "service;\n"
      "                            checked with each ping; memory store)\n"
      "  --watch-min-interval-ms N at most one event per N ms on every "
      "watch\n"
      "                            stream, the newest (0..60000, default 0; "
      "a\n"
      "                            larger ?min_interval_ms wins)\n"
      "  --cors-origin ORIGIN      Access-Control-Allow-Origin (default: "
      "none)\n"
      "  --log-level LEVEL         debug, info (default), warn, "
      "error\n" OM_CLI_TLS_HELP_28
      "                            (with --tokens, a client certificate is\n"
      "                            optional and its SANs may hold roles:\n"
      "                            'san:NAME ROLES' lines)\n\n"
      "DURATION: 500ms, 15s, 2m, 1h. SIZE: "
      "bytes, or\nwith K/KiB, M/MiB, G/GiB (powers of 1024).\n"
      "Signals: SIGTERM/SIGINT end watch streams cleanly and exit 0; "
      "SIGHUP\nre-reads --tokens (a bad file keeps the old tokens).\n\n"
      "exit: 0 stopped by a signal, 1 runtime failure (cannot listen, Redis "
      "not\nreachable within --store-wait), 2 usage or invalid input "
      "(a malformed\n--store URL)\n");
}

static int fail_usage(const char *fmt, const char *arg) {
  return om_cli_fail_usage("control", fmt, arg);
}

/* "1MiB", "512K", "65536" -> bytes; -1 if malformed. */
static int parse_size(const char *s, size_t *out) {
  static const struct {
    const char *suffix;
    unsigned shift;
  } units[] = {{"", 0},   {"B", 0},    {"K", 10}, {"KiB", 10},
               {"M", 20}, {"MiB", 20}, {"G", 30}, {"GiB", 30}};
  char *end;
  unsigned long long v;
  if (*s < '0' || *s > '9')
    return -1;
  v = strtoull(s, &end, 10);
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcmp(end, units[i].suffix) == 0) {
      if (v == 0 || v > (SIZE_MAX >> 1 >> units[i].shift))
        return -1;
      *out = (size_t)v << units[i].shift;
      return 0;
    }
  return -1;
}

/* 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104. */
static int is_loopback(const char *host) {
  unsigned char a[16];
  static const unsigned char v6lo[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                         0, 0, 0, 0, 0, 0, 0, 1};
  static const unsigned char mapped[12] = {0, 0, 0, 0, 0,    0,
                                           0, 0, 0, 0, 0xff, 0xff};
  if (uv_inet_pton(AF_INET, host, a) == 0)
    return a[0] == 127;
  if (uv_inet_pton(AF_INET6, host, a) == 0)
    return memcmp(a, v6lo, 16) == 0 ||
           (memcmp(a, mapped, 12) == 0 && a[12] == 127);
  return 0;
}

typedef struct app_s {
  uv_loop_t loop;
  om_cli_signals_t sigs;
  om_store_t *store;
  om_control_t *ctl;
  const char *tokens;
  om_http_tls_t *tls;
  int stopping;
} app_t;

static void on_store_closed(void *ud) {
  (void)ud;
}

static void on_control_closed(void *ud) {
  app_t *app = ud;
  app->ctl = NULL;
  om_http_tls_close(app->tls);
  app->tls = NULL;
  om_store_close(app->store, on_store_closed, app);
  om_cli_signals_close(&app->sigs);
}

static void on_stop(uv_signal_t *h, int signum) {
  app_t *app = h->data;
  if (app->stopping)
    return;
  app->stopping = 1;
  om_log(OM_LOG_INFO, "control_stopping", "signal",
         signum == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
  om_control_close(app->ctl, on_control_closed, app);
}

static void on_hup(uv_signal_t *h, int signum) {
  app_t *app = h->data;
  (void)signum;
  if (app->ctl == NULL)
    return;
  if (app->tls != NULL)
    (void)om_http_tls_reload(app->tls, NULL, 0); /* logged and counted */
  if (app->tokens == NULL) {
    om_log(OM_LOG_INFO, "auth_reload_skipped", "reason",
           "started without --tokens", NULL);
    return;
  }
  om_control_reload_auth(app->ctl, app->tokens, NULL, 0);
}

int om_cmd_control(int argc, char **argv) {
  static const struct option longopts[] = {
      {"listen", required_argument, NULL, 'l'},
      {"store", required_argument, NULL, 's'},
      {"store-prefix", required_argument, NULL, 'P'},
      {"store-wait", required_argument, NULL, 'W'},
      {"tokens", required_argument, NULL, 't'},
      {"insecure", no_argument, NULL, 'I'},
      {"ping-interval", required_argument, NULL, 'p'},
      {"max-watch-backlog", required_argument, NULL, 'b'},
      {"min-revision", required_argument, NULL, 'r'},
      {"warmup", required_argument, NULL, 'w'},
      {"empty-service-ttl", required_argument, NULL, 'E'},
      {"watch-min-interval-ms", required_argument, NULL, 'm'},
      {"cors-origin", required_argument, NULL, 'c'},
      {"log-level", required_argument, NULL, 'L'},
      {"help", no_argument, NULL, 'h'},
      OM_CLI_TLS_LONGOPTS,
      {NULL, 0, NULL, 0}};
  const char *listen = "127.0.0.1:7600", *store = "memory", *tokens = NULL;
  om_cli_tls_t tls = {0};
  const char *prefix = NULL;
  uint64_t store_wait_ms = 10000;
  om_store_redis_opts_t ro;
  int use_redis = 0;
  char host[64], url[96], err[512];
  int port = 0, insecure = 0, c, rc;
  om_control_opts_t co;
  om_store_memory_opts_t so;
  om_auth_t *auth = NULL;
  app_t *app;
  memset(&co, 0, sizeof co);
  memset(&so, 0, sizeof so);
  memset(&ro, 0, sizeof ro);
  co.warmup_ms = OM_CONTROL_DEFAULT_WARMUP_MS;
  co.empty_service_ttl_ms = OM_CONTROL_DEFAULT_EMPTY_TTL_MS;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'l':
      listen = optarg;
      break;
    case 's':
      store = optarg;
      break;
    case 'P':
      prefix = optarg;
      break;
    case 'W':
      if (om_parse_duration_ms(optarg, &store_wait_ms) != 0)
        return fail_usage("--store-wait: '%s' is not a duration like 10s",
                          optarg);
      break;
    case 't':
      tokens = optarg;
      break;
    case 'I':
      insecure = 1;
      break;
    case 'p':
      if (om_parse_duration_ms(optarg, &co.ping_interval_ms) != 0 ||
          co.ping_interval_ms == 0 || co.ping_interval_ms > UINT32_MAX)
        return fail_usage("--ping-interval: '%s' is not a duration like 15s "
                          "or 500ms",
                          optarg);
      break;
    case 'b':
      if (parse_size(optarg, &co.max_watch_backlog) != 0)
        return fail_usage("--max-watch-backlog: '%s' is not a size like 1MiB",
                          optarg);
      break;
    case 'r': {
      char *end;
      if (optarg[0] < '0' || optarg[0] > '9')
        return fail_usage("--min-revision: '%s' is not a number", optarg);
      so.min_revision = strtoull(optarg, &end, 10);
      if (*end != '\0')
        return fail_usage("--min-revision: '%s' is not a number", optarg);
      break;
    }
    case 'w':
      if (om_parse_duration_ms(optarg, &co.warmup_ms) != 0 ||
          co.warmup_ms > OM_CONTROL_MAX_WARMUP_MS)
        return fail_usage("--warmup: '%s' is not a duration from 0 to 24h "
                          "like 15s or 1h",
                          optarg);
      break;
    case 'E':
      if (om_parse_duration_ms(optarg, &co.empty_service_ttl_ms) != 0 ||
          co.empty_service_ttl_ms > OM_CONTROL_MAX_EMPTY_TTL_MS)
        return fail_usage("--empty-service-ttl: '%s' is not a duration from "
                          "0 to 30 days like 10m or 1h",
                          optarg);
      break;
    case 'm': {
      char *end;
      unsigned long long v;
      if (optarg[0] < '0' || optarg[0] > '9' || strlen(optarg) > 5)
        return fail_usage("--watch-min-interval-ms: '%s' is not an integer "
                          "in [0, 60000]",
                          optarg);
      v = strtoull(optarg, &end, 10);
      if (*end != '\0' || v > OM_CONTROL_MAX_WATCH_INTERVAL_MS)
        return fail_usage("--watch-min-interval-ms: '%s' is not an integer "
                          "in [0, 60000]",
                          optarg);
      co.watch_min_interval_ms = v;
      break;
    }
    case 'c':
      co.cors_origin = optarg;
      break;
    default:
      if (om_cli_tls_option(&tls, c, optarg))
        break;
      if ((rc = om_cli_common_option("control", c, optarg, usage)) >= 0)
        return rc;
    }
  }
  if ((rc = om_cli_no_operands("control", argc, argv)) != OM_EXIT_OK)
    return rc;
  if ((rc = om_cli_tls_check("control", &tls)) != OM_EXIT_OK)
    return rc;
  if ((rc = om_cli_store_arg("control", store, &use_redis)) != OM_EXIT_OK)
    return rc;
  if (prefix != NULL && !use_redis)
    return fail_usage("--store-prefix: '%s' needs --store redis://...", prefix);
  if (om_parse_listen(listen, host, sizeof host, &port) != 0)
    return fail_usage("--listen: '%s' is not IP:PORT (IPv6 as [ADDR]:PORT)",
                      listen);
  /* a required client certificate is authentication too */
  if (tokens == NULL && !insecure && tls.client_ca == NULL &&
      !is_loopback(host)) {
    fprintf(stderr,
            "openmesh control: refusing to listen on %s without "
            "authentication: give --tokens FILE (or --tls-client-ca FILE), "
            "or --insecure to accept anyone who can reach the port\n",
            host);
    return OM_EXIT_USAGE;
  }
  if (tokens != NULL) {
    rc = om_auth_load(tokens, &auth, err, sizeof err);
    if (rc != 0) {
      fprintf(stderr, "openmesh control: --tokens: %s\n", err);
      return OM_EXIT_USAGE;
    }
  }
  app = calloc(1, sizeof *app);
  if (app == NULL) {
    om_auth_free(auth);
    return OM_EXIT_FAILURE;
  }
  app->tokens = tokens;
  if (uv_loop_init(&app->loop) != 0) {
    om_auth_free(auth);
    free(app);
    return OM_EXIT_FAILURE;
  }
  /* with tokens, a certificate is one way in among others */
  if (om_cli_tls_load("control", &app->loop, &tls, tokens != NULL, &app->tls) !=
      OM_EXIT_OK) {
    om_auth_free(auth);
    uv_run(&app->loop, UV_RUN_DEFAULT);
    uv_loop_close(&app->loop);
    free(app);
    return OM_EXIT_USAGE;
  }
  co.http.tls = app->tls;
  if (use_redis) {
    ro.url = store;
    ro.prefix = prefix;
    ro.min_revision = so.min_revision;
    rc = om_store_redis_new(&app->loop, &ro, &app->store);
    if (rc == OM_EINVAL) {
      fprintf(stderr,
              "openmesh control: --store-prefix: '%s' must be at most 64 "
              "characters of [A-Za-z0-9:._{}-]\n",
              prefix != NULL ? prefix : "");
      om_auth_free(auth);
      om_http_tls_close(app->tls);
      uv_run(&app->loop, UV_RUN_DEFAULT);
      uv_loop_close(&app->loop);
      free(app);
      return OM_EXIT_USAGE;
    }
    /* An operator starting a fleet expects the control plane to wait for
     * Redis a while (the store logs each retry) rather than die on the
     * first refusal, and to fail clearly, not hang, when it never comes. */
    if (rc == 0 &&
        om_store_redis_wait_ready(&app->loop, app->store, store_wait_ms) != 0) {
      fprintf(stderr,
              "openmesh control: --store: cannot reach Redis at %s within "
              "%" PRIu64 " ms\n",
              store, store_wait_ms);
      om_auth_free(auth);
      om_http_tls_close(app->tls);
      om_store_close(app->store, NULL, NULL);
      uv_run(&app->loop, UV_RUN_DEFAULT);
      uv_loop_close(&app->loop);
      free(app);
      return OM_EXIT_FAILURE;
    }
  } else {
    rc = om_store_memory_new(&app->loop, &so, &app->store);
  }
  if (rc == 0) {
    co.store = app->store;
    co.auth = auth;
    rc = om_control_new(&app->loop, &co, &app->ctl);
    if (rc == OM_EINVAL) {
      fprintf(stderr,
              "openmesh control: --cors-origin: '%s' cannot be a "
              "header value\n",
              co.cors_origin != NULL ? co.cors_origin : "");
      om_auth_free(auth);
      om_http_tls_close(app->tls);
      om_store_close(app->store, NULL, NULL);
      uv_run(&app->loop, UV_RUN_DEFAULT);
      uv_loop_close(&app->loop);
      free(app);
      return OM_EXIT_USAGE;
    }
  }
  if (rc != 0) {
    fprintf(stderr, "openmesh control: cannot start: %s\n", om_strerror(rc));
    om_auth_free(auth);
    om_http_tls_close(app->tls);
    if (app->store != NULL)
      om_store_close(app->store, NULL, NULL);
    uv_run(&app->loop, UV_RUN_DEFAULT);
    uv_loop_close(&app->loop);
    free(app);
    return OM_EXIT_FAILURE;
  }
  rc = om_control_listen(app->ctl, host, port);
  if (rc == 0) {
    port = om_control_port(app->ctl);
    snprintf(url, sizeof url,
             strchr(host, ':') != NULL ? "%s://[%s]:%d" : "%s://%s:%d",
             app->tls != NULL ? "https" : "http", host, port);
    om_log(OM_LOG_INFO, "control_listening", "url", url, "store",
           om_store_name(app->store), "auth", auth != NULL ? "bearer" : "off",
           NULL);
    om_cli_signals_start(&app->loop, &app->sigs, on_stop, on_hup, app);
  } else {
    fprintf(stderr, "openmesh control: cannot listen on %s: %s\n", listen,
            om_strerror(rc));
    om_control_close(app->ctl, NULL, NULL);
    om_http_tls_close(app->tls);
    uv_run(&app->loop, UV_RUN_DEFAULT);
    om_store_close(app->store, NULL, NULL);
  }
  uv_run(&app->loop, UV_RUN_DEFAULT);
  uv_loop_close(&app->loop);
  free(app);
  return rc == 0 ? OM_EXIT_OK : OM_EXIT_FAILURE;
}
