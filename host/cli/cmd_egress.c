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
#include "om_cli_control.h"
#include "om_cli_util.h"
#include "om_curl_uv.h"
#include "om_paths.h"
#include "om_policy_source.h"
#include "om_snapshot.h"
#include "om_egress.h"
#include "om_errno.h"
#include "om_cli_tls.h"
#include "om_log.h"

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: openmesh egress [--listen HOST:PORT] [--policies DIR]\n"
      "                       [--fallback FILE|control:NAME]\n"
      "                       [--heuristics FILE|control:NAME]\n"
      "                       [--control URL... [--token-file FILE]\n"
      "                        [--policy-cache DIR] [--id ID]]\n"
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
      "  --fallback control:NAME, --heuristics control:NAME\n"
      "                           or: the policy document NAME of the "
      "--control\n"
      "                           plane, watched, validated here, each "
      "verdict\n"
      "                           reported (docs/PROXY.md, \"Policy from "
      "the\n"
      "                           control plane\")\n"
      "  --control URL[,URL...]   the control plane(s) of control:NAME\n"
      "  --token-file FILE        bearer token for the control plane\n"
      "  --policy-cache DIR       keep the last good revisions in "
      "DIR/NAME.lua;\n"
      "                           a start while no plane answers uses them\n"
      "  --id ID                  this gateway in reports (default "
      "HOSTNAME:PID)\n"
      "  --channels FILE          JSON {\"NAME\": {\"kind\": \"webhook\"|"
      "\"file\",\n"
      "                           \"target\": URL|PATH, \"part_limit\": N}}\n"
      "  --errors FILE            append one JSON line per EgressError\n"
      "  --drain-timeout DURATION in-flight responses on SIGTERM (default "
      "10s)\n"
      "  --log-level LEVEL        debug, info (default), warn, "
      "error\n" OM_CLI_TLS_HELP_27
      "TLS to https:// --control planes:\n" OM_CLI_CONTROL_TLS_HELP_27 "\n"
      "Endpoints: POST /v1/chat/completions, POST /v1/turns, GET "
      "/v1/pending,\nGET /metrics, GET /status, GET /healthz.\n\n"
      "exit: 0 stopped by a signal, 1 runtime failure (cannot listen), 2 "
      "usage\nor invalid input (a bad policy, channels file or flag)\n");
}

/* --id: 1..128 visible ASCII bytes, as the control plane's reports
 * take it (docs/CONTROL.md "Policy verdicts"). */
static int visible_id(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 128)
    return 0;
  for (; *s != '\0'; s++)
    if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f)
      return 0;
  return 1;
}

static int fail_usage(const char *fmt, const char *arg) {
  return om_cli_fail_usage("egress", fmt, arg);
}

typedef struct app_s {
  uv_loop_t loop;
  om_cli_signals_t sigs;
  om_egress_t *g;
  om_http_tls_t *tls;
  om_curl_uv_t *curl;         /* control:NAME: the sources' transport */
  om_policy_source_t *src[2]; /* fallback, heuristics */
  int src_open;
  int stopping;
} app_t;

static void on_curl_closed(void *ud) {
  (void)ud;
}

static void on_src_closed(void *ud) {
  app_t *app = ud;
  if (--app->src_open == 0 && app->curl != NULL) {
    om_curl_uv_close(app->curl, on_curl_closed, app);
    app->curl = NULL;
  }
}

/* The policy sources, then their curl glue (after the gateway: their
 * files stay until it is gone). */
static void close_sources(app_t *app) {
  for (int i = 0; i < 2; i++)
    if (app->src[i] != NULL) {
      om_policy_source_close(app->src[i], on_src_closed, app);
      app->src[i] = NULL;
    }
  if (app->src_open == 0 && app->curl != NULL) {
    om_curl_uv_close(app->curl, on_curl_closed, app);
    app->curl = NULL;
  }
}

/* A validated revision is in a policy file: reload (SIGHUP's path). */
static void on_policy_update(void *ud) {
  app_t *app = ud;
  if (app->g != NULL && !app->stopping)
    (void)om_egress_reload_policies(app->g);
}

static void on_closed(void *ud) {
  app_t *app = ud;
  app->g = NULL;
  close_sources(app);
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
      {"control", required_argument, NULL, 1001},
      {"token-file", required_argument, NULL, 1002},
      {"policy-cache", required_argument, NULL, 1003},
      {"id", required_argument, NULL, 1004},
      {"help", no_argument, NULL, 'h'},
      OM_CLI_TLS_LONGOPTS,
      OM_CLI_CONTROL_TLS_LONGOPTS,
      {NULL, 0, NULL, 0}};
  om_cli_tls_t tls = {0};
  om_cli_control_tls_t ctls = {0};
  om_curl_tls_t control_tls = {0};
  om_cli_controls_t control = {.n = 0};
  const char *token_file = NULL, *policy_cache = NULL, *gw_id = NULL;
  const char *doc[2] = {NULL, NULL};
  char token[4096], default_id[320];
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
    case 1001:
      if ((rc = om_cli_controls_add("egress", &control, optarg)) != OM_EXIT_OK)
        return rc;
      break;
    case 1002:
      token_file = optarg;
      break;
    case 1003:
      policy_cache = optarg;
      break;
    case 1004:
      if (!visible_id(optarg))
        return fail_usage("--id: '%s' is not 1 to 128 visible characters",
                          optarg);
      gw_id = optarg;
      break;
    case 'd':
      if (om_parse_duration_ms(optarg, &drain_ms) != 0 || drain_ms > UINT32_MAX)
        return fail_usage("--drain-timeout: '%s' is not a duration like 10s",
                          optarg);
      if (drain_ms == 0)
        drain_ms = 1;
      break;
    default:
      if (om_cli_tls_option(&tls, c, optarg) ||
          om_cli_control_tls_option(&ctls, c, optarg))
        break;
      if ((rc = om_cli_common_option("egress", c, optarg, usage)) >= 0)
        return rc;
    }
  }
  if ((rc = om_cli_no_operands("egress", argc, argv)) != OM_EXIT_OK)
    return rc;
  if ((rc = om_cli_tls_check("egress", &tls)) != OM_EXIT_OK)
    return rc;
  om_policy_source_is_control(fallback, &doc[0]);
  om_policy_source_is_control(heuristics, &doc[1]);
  for (int i = 0; i < 2; i++)
    if (doc[i] != NULL && !om_valid_name(doc[i], strlen(doc[i])))
      return fail_usage("%s: NAME must be 1 to 128 characters of "
                        "[A-Za-z0-9._-]",
                        i == 0 ? fallback : heuristics);
  if ((doc[0] != NULL || doc[1] != NULL) && control.n == 0)
    return fail_usage("%s: a policy from the control plane needs --control "
                      "URL",
                      doc[0] != NULL ? fallback : heuristics);
  if (doc[0] != NULL && doc[1] != NULL && strcmp(doc[0], doc[1]) == 0)
    return fail_usage("%s: the fallback and heuristics policies are two "
                      "documents",
                      fallback);
  if (doc[0] == NULL && doc[1] == NULL &&
      (control.n > 0 || token_file != NULL || policy_cache != NULL))
    return fail_usage("%s: goes with --fallback or --heuristics control:NAME",
                      control.n > 0        ? "--control"
                      : token_file != NULL ? "--token-file"
                                           : "--policy-cache");
  if ((rc = om_cli_control_tls_check("egress", &ctls, &control_tls)) !=
      OM_EXIT_OK)
    return rc;
  if (token_file != NULL) {
    const char *why;
    if (om_read_token_file(token_file, token, sizeof token, &why) != 0)
      return fail_usage("--token-file: %s", why);
  }
  if (gw_id == NULL) {
    char hn[256];
    if (gethostname(hn, sizeof hn) != 0)
      snprintf(hn, sizeof hn, "localhost");
    hn[sizeof hn - 1] = '\0';
    snprintf(default_id, sizeof default_id, "%s:%ld", hn, (long)getpid());
    gw_id = default_id;
  }
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
  rc = 0;
  for (int i = 0; i < 2 && rc == 0; i++) {
    om_policy_source_opts_t so;
    if (doc[i] == NULL)
      continue;
    if (app->curl == NULL && om_curl_uv_new(&app->loop, &app->curl) != 0) {
      rc = OM_ENOMEM;
      snprintf(err, sizeof err, "out of memory");
      break;
    }
    memset(&so, 0, sizeof so);
    so.name = doc[i];
    so.control_urls = control.urls;
    so.n_control_urls = control.n;
    so.token = token_file != NULL ? token : NULL;
    so.tls = &control_tls;
    so.cache_dir = policy_cache;
    so.policy.lib_dir = om_lib_dir();
    so.kind = i == 0 ? OM_POLICY_FALLBACK : OM_POLICY_EGRESS_HEURISTICS;
    so.id = gw_id;
    so.on_update = on_policy_update;
    so.ud = app;
    rc = om_policy_source_start(&app->loop, app->curl, &so, &app->src[i], err,
                                sizeof err);
    if (rc == 0) {
      app->src_open++;
      if (i == 0)
        o.fallback_path = om_policy_source_path(app->src[i]);
      else
        o.heuristics_path = om_policy_source_path(app->src[i]);
    } else {
      rc = rc == OM_EPOLICY || rc == OM_EINVAL ? OM_EPOLICY : OM_EIO;
    }
  }
  if (rc == 0)
    rc = om_egress_new(&app->loop, &o, &app->g, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "openmesh egress: %s\n", err);
    close_sources(app);
    om_http_tls_close(app->tls);
    uv_run(&app->loop, UV_RUN_DEFAULT);
    uv_loop_close(&app->loop);
    free(app);
    return rc == OM_ENOMEM || rc == OM_EIO ? OM_EXIT_FAILURE : OM_EXIT_USAGE;
  }
  if ((rc = om_egress_listen(app->g, host, port)) != 0) {
    fprintf(stderr, "openmesh egress: cannot listen on %s: %s\n", listen,
            om_strerror(rc));
    app->stopping = 1;
    om_egress_close(app->g, on_closed, app);
    uv_run(&app->loop, UV_RUN_DEFAULT);
    uv_loop_close(&app->loop);
    free(app);
    return OM_EXIT_FAILURE;
  }
  snprintf(url, sizeof url,
           strchr(host, ':') != NULL ? "%s://[%s]:%d" : "%s://%s:%d",
           app->tls != NULL ? "https" : "http", host, om_egress_port(app->g));
  for (int i = 0; i < 2; i++)
    if (app->src[i] != NULL)
      om_policy_source_set_address(app->src[i], url);
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
