/*
 * cmd_egress.c: `openmesh egress`, the model-call gateway (om_egress.h,
 * docs/EGRESS.md).
 */
#include "om_cmds.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "om_cli.h"
#include "om_cli_util.h"
#include "om_egress.h"
#include "om_errno.h"
#include "om_cli_tls.h"
#include "om_log.h"

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: openmesh egress [--listen HOST:PORT] [--policies DIR]\n"
      "                       [--fallback FILE] [--heuristics FILE]\n"
      "                       [--channels FILE] [--errors FILE]\n"
      "                       [--drain-timeout DURATION] [--log-level "
      "LEVEL]\n"
      "                       [--tls-cert FILE --tls-key FILE]\n"
      "                       [--tls-client-ca FILE]\n\n"
      "The model-call gateway: classifies, retries and falls back across "
      "the\nroutes of the fallback policy (Layer A), delivers agent turns "
      "through\nchannel connectors (Layer B), degrades with a holding line "
      "or silence\n(Layer C), and gates replies of opted-in agents "
      "(docs/EGRESS.md).\n\n"
      "  --listen HOST:PORT       default 127.0.0.1:7700 (port 0: a free "
      "one,\n"
      "                           see the start log line)\n"
      "  --policies DIR           fallback.lua and egress_heuristics.lua "
      "(default\n"
      "                           policies/); hot-reloaded, SIGHUP reloads\n"
      "  --fallback FILE          the fallback policy (overrides --policies)\n"
      "  --heuristics FILE        the egress_heuristics policy\n"
      "  --channels FILE          JSON {\"NAME\": {\"kind\": \"webhook\"|"
      "\"file\",\n"
      "                           \"target\": URL|PATH, \"part_limit\": N}}\n"
      "  --errors FILE            append one JSON line per EgressError\n"
      "  --drain-timeout DURATION in-flight responses on SIGTERM (default "
      "10s)\n"
      "  --log-level LEVEL        debug, info (default), warn, "
      "error\n" OM_CLI_TLS_HELP_27 "\n"
      "Endpoints: POST /v1/chat/completions, POST /v1/turns, GET "
      "/v1/pending,\nGET /metrics, GET /status, GET /healthz.\n\n"
      "exit: 0 stopped by a signal, 1 runtime failure (cannot listen), 2 "
      "usage\nor invalid input (a bad policy, channels file or flag)\n");
}

static int fail_usage(const char *fmt, const char *arg) {
  return om_cli_fail_usage("egress", fmt, arg);
}

typedef struct app_s {
  uv_loop_t loop;
  om_cli_signals_t sigs;
  om_egress_t *g;
  om_http_tls_t *tls;
  int stopping;
} app_t;

static void on_closed(void *ud) {
  app_t *app = ud;
  app->g = NULL;
  om_http_tls_close(app->tls);
  app->tls = NULL;
  om_cli_signals_close(&app->sigs);
  om_log(OM_LOG_INFO, "egress_stopped", NULL);
}

static void on_stop(uv_signal_t *h, int signum) {
  app_t *app = h->data;
  if (app->stopping || app->g == NULL)
    return;
  app->stopping = 1;
  om_log(OM_LOG_INFO, "egress_draining", "signal",
         signum == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
  om_egress_close(app->g, on_closed, app);
}

static void on_hup(uv_signal_t *h, int signum) {
  app_t *app = h->data;
  char n[16];
  (void)signum;
  if (app->g == NULL || app->stopping)
    return;
  if (app->tls != NULL)
    (void)om_http_tls_reload(app->tls, NULL, 0); /* logged and counted */
  snprintf(n, sizeof n, "%d", om_egress_reload_policies(app->g));
  om_log(OM_LOG_INFO, "egress_policies_reloaded", "rejected", n, NULL);
}

static const char *policy_path(const char *dir, const char *file, char *buf,
                               size_t cap) {
  if (dir != NULL) {
    snprintf(buf, cap, "%s/%s", dir, file);
    return buf;
  }
  snprintf(buf, cap, "policies/%s", file);
  if (access(buf, R_OK) == 0)
    return buf;
  snprintf(buf, cap, "%s/policies/%s", OM_SOURCE_DIR, file);
  return buf;
}

int om_cmd_egress(int argc, char **argv) {
  static const struct option longopts[] = {
      {"listen", required_argument, NULL, 'l'},
      {"policies", required_argument, NULL, 'P'},
      {"fallback", required_argument, NULL, 'f'},
      {"heuristics", required_argument, NULL, 'H'},
      {"channels", required_argument, NULL, 'c'},
      {"errors", required_argument, NULL, 'e'},
      {"drain-timeout", required_argument, NULL, 'd'},
      {"log-level", required_argument, NULL, 'L'},
      {"help", no_argument, NULL, 'h'},
      OM_CLI_TLS_LONGOPTS,
      {NULL, 0, NULL, 0}};
  om_cli_tls_t tls = {0};
  const char *listen = "127.0.0.1:7700", *dir = NULL, *fallback = NULL;
  const char *heuristics = NULL;
  char fbuf[4096], hbuf[4096], host[64], url[96], err[2048];
  int port = 0, c, rc;
  uint64_t drain_ms = 10000;
  om_egress_opts_t o;
  app_t *app;
  memset(&o, 0, sizeof o);
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'l':
      listen = optarg;
      break;
    case 'P':
      dir = optarg;
      break;
    case 'f':
      fallback = optarg;
      break;
    case 'H':
      heuristics = optarg;
      break;
    case 'c':
      o.channels_path = optarg;
      break;
    case 'e':
      o.errors_path = optarg;
      break;
    case 'd':
      if (om_parse_duration_ms(optarg, &drain_ms) != 0 || drain_ms > UINT32_MAX)
        return fail_usage("--drain-timeout: '%s' is not a duration like 10s",
                          optarg);
      if (drain_ms == 0)
        drain_ms = 1;
      break;
    default:
      if (om_cli_tls_option(&tls, c, optarg))
        break;
      if ((rc = om_cli_common_option("egress", c, optarg, usage)) >= 0)
        return rc;
    }
  }
  if ((rc = om_cli_no_operands("egress", argc, argv)) != OM_EXIT_OK)
    return rc;
  if ((rc = om_cli_tls_check("egress", &tls)) != OM_EXIT_OK)
    return rc;
  if (om_parse_listen(listen, host, sizeof host, &port) != 0)
    return fail_usage("--listen: '%s' is not IP:PORT (IPv6 as [ADDR]:PORT)",
                      listen);
  o.fallback_path =
      fallback ? fallback : policy_path(dir, "fallback.lua", fbuf, sizeof fbuf);
  o.heuristics_path =
      heuristics ? heuristics
                 : policy_path(dir, "egress_heuristics.lua", hbuf, sizeof hbuf);
  o.server.drain_timeout_ms = drain_ms;
  app = calloc(1, sizeof *app);
  if (app == NULL || uv_loop_init(&app->loop) != 0) {
    free(app);
    return OM_EXIT_FAILURE;
  }
  if (om_cli_tls_load("egress", &app->loop, &tls, 0, &app->tls) != OM_EXIT_OK) {
    uv_run(&app->loop, UV_RUN_DEFAULT);
    uv_loop_close(&app->loop);
    free(app);
    return OM_EXIT_USAGE;
  }
  o.server.tls = app->tls;
  rc = om_egress_new(&app->loop, &o, &app->g, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "openmesh egress: %s\n", err);
    om_http_tls_close(app->tls);
    uv_run(&app->loop, UV_RUN_DEFAULT);
    uv_loop_close(&app->loop);
    free(app);
    return rc == OM_ENOMEM || rc == OM_EIO ? OM_EXIT_FAILURE : OM_EXIT_USAGE;
  }
  if ((rc = om_egress_listen(app->g, host, port)) != 0) {
    fprintf(stderr, "openmesh egress: cannot listen on %s: %s\n", listen,
            om_strerror(rc));
    om_egress_close(app->g, on_closed, app);
    uv_run(&app->loop, UV_RUN_DEFAULT);
    uv_loop_close(&app->loop);
    free(app);
    return OM_EXIT_FAILURE;
  }
  snprintf(url, sizeof url,
           strchr(host, ':') != NULL ? "%s://[%s]:%d" : "%s://%s:%d",
           app->tls != NULL ? "https" : "http", host, om_egress_port(app->g));
  om_log(OM_LOG_INFO, "egress_listening", "url", url, "fallback",
         o.fallback_path, "heuristics", o.heuristics_path, "channels",
         o.channels_path ? o.channels_path : "", "errors",
         o.errors_path ? o.errors_path : "", NULL);
  om_cli_signals_start(&app->loop, &app->sigs, on_stop, on_hup, app);
  uv_run(&app->loop, UV_RUN_DEFAULT);
  uv_loop_close(&app->loop);
  free(app);
  return OM_EXIT_OK;
}
