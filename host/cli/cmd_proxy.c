/*
 * cmd_proxy.c: `openmesh proxy`, the data plane sidecar (om_proxy.h,
 * docs/PROXY.md). For now the topology is static (--static FILE); the
 * control-plane watch will feed the same om_proxy_set_snapshot seam.
 */
#include "om_cmds.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "om_cli.h"
#include "om_cli_control.h"
#include "om_cli_tls.h"
#include "om_cli_util.h"
#include "om_errno.h"
#include "om_log.h"
#include "om_paths.h"
#include "om_curl_uv.h"
#include "om_watch.h"
#include "om_proxy.h"
#include "om_proxy_access_log.h"
#include "om_proxy_workers.h"
#include "om_policy_source.h"

#define MAX_SERVICE_POLICIES 64

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: openmesh proxy (--static FILE | --control URL... --service "
      "S...)\n"
      "                      [--token-file FILE] [--listen HOST:PORT]\n"
      "                      [--admin HOST:PORT] [--policy FILE|control:NAME]\n"
      "                      [--policy-cache DIR] [--id ID]\n"
      "                      [--service-policy SERVICE=FILE ...]\n"
      "                      [--drain-timeout DURATION] [--retry-429]\n"
      "                      [--circuit-failures N] [--circuit-cooldown "
      "DURATION]\n"
      "                      [--max-body-bytes SIZE] [--splice-min SIZE|off]\n"
      "                      [--log-level LEVEL]\n"
      "                      [--workers N] [--access-log FILE]\n"
      "                      [--tls-cert FILE --tls-key FILE]\n"
      "                      [--tls-client-ca FILE]\n"
      "                      [--upstream-ca FILE]\n"
      "                      [--upstream-cert FILE --upstream-key FILE]\n"
      "                      [--control-ca FILE]\n"
      "                      [--control-cert FILE --control-key FILE]\n\n"
      "The data plane: routes each call (service from Host) through the "
      "traffic\npolicy, admission, selection, one deadline, safe retries "
      "and per-peer\ncircuits (docs/PROXY.md).\n\n"
      "  --listen HOST:PORT          calls (default 127.0.0.1:7601; port 0 "
      "picks\n"
      "                              a free port, see the start log line)\n"
      "  --admin HOST:PORT           /metrics, /status, /healthz (default\n"
      "                              127.0.0.1:7602)\n"
      "  --policy FILE               the traffic policy of every service "
      "(default\n"
      "                              policies/traffic.lua); hot-reloaded\n"
      "  --policy control:NAME       or: the policy document NAME of the\n"
      "                              --control plane, watched; each revision "
      "is\n"
      "                              validated here before it applies, a "
      "refused\n"
      "                              one keeps the last good, and every "
      "verdict\n"
      "                              is reported to the plane\n"
      "  --policy-cache DIR          keep the last good control:NAME revision "
      "in\n"
      "                              DIR/NAME.lua; a start while no plane "
      "answers\n"
      "                              starts from it (default: no cache)\n"
      "  --access-log FILE           one JSON line per request answered "
      "(the\n"
      "                              input of openmesh replay); SIGUSR1 "
      "reopens\n"
      "                              it, a rotated file is followed\n"
      "  --id ID                     this proxy in policy reports (default\n"
      "                              HOSTNAME:PID)\n"
      "  --service-policy S=FILE     service S uses FILE instead (repeatable)\n"
      "  --static FILE               the topology: {\"services\": {\"S\": "
      "{\"revision\": 1,\n"
      "                              \"instances\": [{\"id\", \"url\", "
      "\"weight\", \"zone\",\n"
      "                              \"metadata\"}]}}}\n"
      "  --control URL[,URL...]      or: watch the control plane at URL;\n"
      "                              several (repeat it, or a comma list) on "
      "one\n"
      "                              store: the watch moves to the next when "
      "one\n"
      "                              fails and resumes there\n"
      "  --service S                 a service to watch there (repeatable;\n"
      "                              --static with --control and no "
      "--service:\n"
      "                              the plane serves only --policy "
      "control:NAME)\n"
      "  --token-file FILE           bearer token for the control plane\n"
      "  --drain-timeout DURATION    SIGTERM waits this long for in-flight "
      "calls\n"
      "                              (default 10s)\n"
      "  --retry-429                 retry 429 too, honouring Retry-After\n"
      "  --circuit-failures N        consecutive failures that open a "
      "peer's\n"
      "                              circuit (default 5)\n"
      "  --circuit-cooldown DURATION first open period (default 30s)\n"
      "  --max-body-bytes SIZE       largest request body, 413 beyond "
      "(default:\n"
      "                              no limit; bodies are streamed, not "
      "buffered;\n"
      "                              a policy's max_body_bytes overrides "
      "it)\n"
      "  --splice-min SIZE|off       relay a response body this large or "
      "larger\n"
      "                              socket to socket with splice(2) "
      "(plaintext\n"
      "                              HTTP/1.1 both ways; default 1MiB)\n"
      "  --log-level LEVEL           debug, info (default), warn, error\n"
      "  --workers N                 event loops serving calls, one thread "
      "each,\n"
      "                              accepting on one shared socket "
      "(default:\n"
      "                              the number of CPUs, at most 64); "
      "limits\n"
      "                              such as max_inflight are split between "
      "them\n"
      "  --upstream-ca FILE          CA certificates (PEM) trusted for "
      "https://\n"
      "                              peers (default: the system store)\n"
      "  --upstream-cert FILE        a client certificate (PEM) presented to\n"
      "                              https:// peers (mutual TLS), with\n"
      "  --upstream-key FILE         its private key (PEM)\n"
      "TLS on the --listen listener (the admin listener stays "
      "plaintext):\n" OM_CLI_TLS_HELP_30
      "                              (a caller without a certificate is\n"
      "                              refused at the handshake; the verified\n"
      "                              identity is the policy's "
      "req.identity)\n"
      "TLS to https:// --control planes (peer and host always "
      "verified):\n" OM_CLI_CONTROL_TLS_HELP_30 "\n"
      "DURATION: 500ms, 10s, 2m, 1h. SIZE: 1048576, 512KiB, 8MiB, 1GiB.\n"
      "Signals: SIGTERM/SIGINT stop accepting, drain in-flight calls (up to "
      "the\ndrain timeout) and exit 0; SIGHUP reloads the policy files and "
      "the TLS\nfiles (a bad file keeps the previous version).\n\n"
      "exit: 0 stopped by a signal, 1 runtime failure (cannot listen), 2 "
      "usage\nor invalid input (a bad --static file or policy)\n");
}

/* A byte count: digits, then nothing, B, KiB, MiB or GiB (K, M, G and
 * KB, MB, GB read as the binary units too). 0, or -1 for anything else
 * or an overflow. */
static int parse_size(const char *s, uint64_t *out) {
  static const struct {
    const char *unit;
    unsigned shift;
  } units[] = {{"", 0},     {"B", 0},   {"K", 10},  {"KB", 10},
               {"KiB", 10}, {"M", 20},  {"MB", 20}, {"MiB", 20},
               {"G", 30},   {"GB", 30}, {"GiB", 30}};
  uint64_t v = 0;
  const char *p = s;
  if (*p < '0' || *p > '9')
    return -1;
  while (*p >= '0' && *p <= '9') {
    if (v > (UINT64_MAX - 9) / 10)
      return -1;
    v = v * 10 + (uint64_t)(*p++ - '0');
  }
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcmp(p, units[i].unit) == 0) {
      if (v > (UINT64_MAX >> units[i].shift))
        return -1;
      *out = v << units[i].shift;
      return 0;
    }
  return -1;
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
  return om_cli_fail_usage("proxy", fmt, arg);
}

#define MAX_WATCHES 64

typedef struct app_s {
  uv_loop_t loop;
  om_cli_signals_t sigs;
  uv_signal_t usr1; /* --access-log: reopen */
  int usr1_open;
  om_access_log_t *alog;    /* --access-log; NULL: off */
  om_proxy_group_t *proxy;  /* the workers */
  om_cli_tls_t *tls_flags;  /* --tls-*: each worker loads its own */
  om_curl_uv_t *curl;       /* --control: the watches' transport */
  om_policy_source_t *psrc; /* --policy control:NAME */
  om_watch_t *watches[MAX_WATCHES];
  size_t n_watches, watches_open;
  int tls_failed; /* a worker's listener TLS did not load */
  int stopping;
} app_t;

/* /status "watches": each service's watch, with the plane it uses. */
static json_t *watches_status(void *ud) {
  app_t *app = ud;
  json_t *o = json_object();
  for (size_t i = 0; o != NULL && i < app->n_watches; i++) {
    json_t *w = om_watch_status(app->watches[i]);
    if (w == NULL ||
        json_object_set_new(o, om_watch_service(app->watches[i]), w) != 0) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

/*
 * A snapshot the watch validated (shape, ids, URLs, newer revision) goes to
 * the proxy, which checks what only it can (peer URLs it can reach) and
 * keeps routing on the last good one if it refuses.
 */
static void on_watch_snapshot(void *ud, om_snapshot_t *snap) {
  app_t *app = ud;
  char err[512], rev[32];
  if (app->proxy == NULL || app->stopping)
    return;
  snprintf(rev, sizeof rev, "%llu",
           (unsigned long long)om_snapshot_revision(snap));
  if (om_proxy_group_set_snapshot(app->proxy, snap, err, sizeof err) != 0)
    om_log(OM_LOG_WARN, "snapshot_rejected", "service",
           om_snapshot_service(snap), "revision", rev, "error", err, NULL);
}

/* The proxy's rules, before a watch takes a snapshot as its current one:
 * a snapshot the proxy would refuse is refused by the watch too. */
static int on_watch_check(void *ud, const om_snapshot_t *snap, char *err,
                          size_t errlen) {
  app_t *app = ud;
  return app->proxy != NULL
             ? om_proxy_group_check_snapshot(app->proxy, snap, err, errlen)
             : 0;
}

/* /status "policy_source": the control plane's policy, as this proxy
 * judged it. */
static json_t *psrc_status(void *ud) {
  app_t *app = ud;
  return app->psrc != NULL ? om_policy_source_status(app->psrc) : json_null();
}

/* A validated revision is in the policy file: every worker reloads it. */
static void on_policy_update(void *ud) {
  app_t *app = ud;
  if (app->proxy != NULL && !app->stopping)
    om_proxy_group_reload(app->proxy);
}

static void on_curl_closed(void *ud) {
  (void)ud;
}

static void on_watch_closed(void *ud) {
  app_t *app = ud;
  if (--app->watches_open == 0 && app->curl != NULL) {
    om_curl_uv_close(app->curl, on_curl_closed, app);
    app->curl = NULL;
  }
}

/* The watches first (they hold the curl glue), then the glue. */
static void close_watches(app_t *app) {
  size_t n = app->n_watches;
  app->n_watches = 0;
  for (size_t i = 0; i < n; i++)
    om_watch_close(app->watches[i], on_watch_closed, app);
  if (app->watches_open == 0 && app->curl != NULL) {
    om_curl_uv_close(app->curl, on_curl_closed, app);
    app->curl = NULL;
  }
}

/* The policy source last: its file stays until every worker is gone. */
static void close_psrc(app_t *app) {
  om_policy_source_t *s = app->psrc;
  app->psrc = NULL;
  if (s != NULL)
    om_policy_source_close(s, on_watch_closed, app);
}

static void on_proxy_closed(void *ud) {
  app_t *app = ud;
  app->proxy = NULL;
  close_psrc(app);
  om_cli_signals_close(&app->sigs);
  if (app->usr1_open) {
    app->usr1_open = 0;
    uv_close((uv_handle_t *)&app->usr1, NULL);
  }
  om_log(OM_LOG_INFO, "proxy_stopped", NULL);
}

static void on_stop(uv_signal_t *h, int signum) {
  app_t *app = h->data;
  if (app->stopping || app->proxy == NULL)
    return;
  app->stopping = 1;
  om_log(OM_LOG_INFO, "proxy_draining", "signal",
         signum == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
  close_watches(app);
  om_proxy_group_close(app->proxy, on_proxy_closed, app);
}

static void on_hup(uv_signal_t *h, int signum) {
  app_t *app = h->data;
  (void)signum;
  if (app->proxy == NULL || app->stopping)
    return;
  /* each worker reloads its listener TLS, policies and upstream TLS on its
   * own loop; the first logs the outcome */
  om_proxy_group_reload(app->proxy);
}

static void on_usr1(uv_signal_t *h, int signum) {
  app_t *app = h->data;
  (void)signum;
  om_access_log_reopen(app->alog);
}

/* One worker's listener TLS (--tls-*), on its loop. */
static int worker_tls(void *ud, uv_loop_t *loop, om_http_tls_t **out) {
  app_t *app = ud;
  *out = NULL;
  if (om_cli_tls_load("proxy", loop, app->tls_flags, 0, out) != OM_EXIT_OK) {
    app->tls_failed = 1;
    return -1;
  }
  return 0;
}

static void shutdown_loop(app_t *app) {
  close_watches(app);
  if (app->proxy != NULL)
    om_proxy_group_close(app->proxy, on_proxy_closed, app);
  else
    close_psrc(app);
  uv_run(&app->loop, UV_RUN_DEFAULT);
  uv_loop_close(&app->loop);
  om_access_log_close(app->alog);
  app->alog = NULL;
}

int om_cmd_proxy(int argc, char **argv) {
  static const struct option longopts[] = {
      {"listen", required_argument, NULL, 'l'},
      {"admin", required_argument, NULL, 'a'},
      {"policy", required_argument, NULL, 'p'},
      {"service-policy", required_argument, NULL, 'S'},
      {"static", required_argument, NULL, 's'},
      {"control", required_argument, NULL, 'C'},
      {"service", required_argument, NULL, 'V'},
      {"token-file", required_argument, NULL, 'T'},
      {"drain-timeout", required_argument, NULL, 'd'},
      {"retry-429", no_argument, NULL, 'r'},
      {"circuit-failures", required_argument, NULL, 'f'},
      {"circuit-cooldown", required_argument, NULL, 'c'},
      {"log-level", required_argument, NULL, 'L'},
      {"max-body-bytes", required_argument, NULL, 'B'},
      {"upstream-ca", required_argument, NULL, 1001},
      {"upstream-cert", required_argument, NULL, 1002},
      {"upstream-key", required_argument, NULL, 1003},
      {"workers", required_argument, NULL, 1004},
      {"policy-cache", required_argument, NULL, 1005},
      {"id", required_argument, NULL, 1006},
      {"access-log", required_argument, NULL, 1007},
      {"splice-min", required_argument, NULL, 1008},
      {"help", no_argument, NULL, 'h'},
      OM_CLI_TLS_LONGOPTS,
      OM_CLI_CONTROL_TLS_LONGOPTS,
      {NULL, 0, NULL, 0}};
  const char *listen = "127.0.0.1:7601", *admin = "127.0.0.1:7602";
  om_cli_tls_t tls = {0};
  om_cli_control_tls_t ctls = {0};
  om_curl_tls_t control_tls = {0};
  const char *policy = NULL, *static_file = NULL;
  const char *policy_cache = NULL, *proxy_id = NULL, *policy_doc = NULL;
  const char *access_log = NULL;
  char default_id[320];
  int policy_only;
  om_cli_controls_t control = {.n = 0};
  char control_list[2048];
  const char *token_file = NULL, *services[MAX_WATCHES];
  size_t n_services = 0;
  char token[4096];
  om_proxy_service_policy_t sp[MAX_SERVICE_POLICIES];
  char *sp_names[MAX_SERVICE_POLICIES];
  size_t n_sp = 0, n_snaps = 0;
  char host[64], ahost[64], url[96], aurl[96], err[2048];
  int port = 0, aport = 0, c, rc, exit_code = OM_EXIT_OK;
  unsigned workers = 0;
  char nworkers[16];
  om_proxy_group_opts_t go;
  uint64_t drain_ms = 10000, cooldown_ms = 0, failures = 0;
  om_circuit_opts_t circuit;
  om_proxy_opts_t o;
  om_snapshot_t **snaps = NULL;
  app_t *app;
  memset(&o, 0, sizeof o);
  om_circuit_opts_default(&circuit);
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'l':
      listen = optarg;
      break;
    case 'a':
      admin = optarg;
      break;
    case 'p':
      policy = optarg;
      break;
    case 's':
      static_file = optarg;
      break;
    case 'C':
      if ((rc = om_cli_controls_add("proxy", &control, optarg)) != OM_EXIT_OK)
        return rc;
      break;
    case 'V':
      if (n_services == MAX_WATCHES)
        return fail_usage("--service: more than %s", "64");
      services[n_services++] = optarg;
      break;
    case 'T':
      token_file = optarg;
      break;
    case 'S': {
      const char *eq = strchr(optarg, '=');
      if (eq == NULL || eq == optarg || eq[1] == '\0')
        return fail_usage("--service-policy: '%s' is not SERVICE=FILE", optarg);
      if (strncmp(eq + 1, "control:", 8) == 0)
        return fail_usage("--service-policy %s: control:NAME is for --policy; "
                          "a service policy is a file",
                          optarg);
      if (n_sp == MAX_SERVICE_POLICIES)
        return fail_usage("--service-policy: more than %s", "64");
      sp_names[n_sp] = optarg;
      sp[n_sp].path = eq + 1;
      n_sp++;
      break;
    }
    case 'd':
      if (om_parse_duration_ms(optarg, &drain_ms) != 0 || drain_ms > UINT32_MAX)
        return fail_usage("--drain-timeout: '%s' is not a duration like 10s",
                          optarg);
      if (drain_ms == 0)
        drain_ms = 1; /* the server's 0 means its default */
      break;
    case 'r':
      o.retry_429 = 1;
      break;
    case 'B':
      if (parse_size(optarg, &o.max_body_bytes) != 0)
        return fail_usage("--max-body-bytes: '%s' is not a size like 8MiB",
                          optarg);
      break;
    case 'f': {
      char *end;
      if (optarg[0] < '1' || optarg[0] > '9')
        return fail_usage("--circuit-failures: '%s' is not a number >= 1",
                          optarg);
      failures = strtoull(optarg, &end, 10);
      if (*end != '\0' || failures > 1000000)
        return fail_usage("--circuit-failures: '%s' is not a number >= 1",
                          optarg);
      break;
    }
    case 'c':
      if (om_parse_duration_ms(optarg, &cooldown_ms) != 0 || cooldown_ms == 0 ||
          cooldown_ms > UINT32_MAX)
        return fail_usage("--circuit-cooldown: '%s' is not a duration like "
                          "30s",
                          optarg);
      break;
    case 1001:
      o.upstream_ca = optarg;
      break;
    case 1002:
      o.upstream_cert = optarg;
      break;
    case 1003:
      o.upstream_key = optarg;
      break;
    case 1004: {
      char *end;
      unsigned long v;
      if (optarg[0] < '1' || optarg[0] > '9')
        return fail_usage("--workers: '%s' is not a number in [1, 64]", optarg);
      v = strtoul(optarg, &end, 10);
      if (*end != '\0' || v > OM_PROXY_MAX_WORKERS)
        return fail_usage("--workers: '%s' is not a number in [1, 64]", optarg);
      workers = (unsigned)v;
      break;
    }
    case 1005:
      policy_cache = optarg;
      break;
    case 1008:
      if (strcmp(optarg, "off") == 0)
        o.splice_min_bytes = UINT64_MAX;
      else if (parse_size(optarg, &o.splice_min_bytes) != 0 ||
               o.splice_min_bytes == 0)
        return fail_usage("--splice-min: '%s' is not 'off' or a size like "
                          "1MiB",
                          optarg);
      break;
    case 1007:
      access_log = optarg;
      break;
    case 1006:
      if (!visible_id(optarg))
        return fail_usage("--id: '%s' is not 1 to 128 visible characters",
                          optarg);
      proxy_id = optarg;
      break;
    default:
      if (om_cli_tls_option(&tls, c, optarg) ||
          om_cli_control_tls_option(&ctls, c, optarg))
        break;
      if ((rc = om_cli_common_option("proxy", c, optarg, usage)) >= 0)
        return rc;
    }
  }
  if ((rc = om_cli_no_operands("proxy", argc, argv)) != OM_EXIT_OK)
    return rc;
  om_cli_controls_join(&control, control_list, sizeof control_list);
  if ((rc = om_cli_tls_check("proxy", &tls)) != OM_EXIT_OK)
    return rc;
  /* --static with --control: the plane serves only the policy */
  policy_only = static_file != NULL && control.n > 0 && n_services == 0 &&
                om_policy_source_is_control(policy, &policy_doc);
  if (!policy_only && (static_file == NULL) == (control.n == 0)) {
    fprintf(stderr, "openmesh proxy: give the topology with exactly one of "
                    "--static FILE or --control URL\n"
                    "(see openmesh proxy --help)\n");
    return OM_EXIT_USAGE;
  }
  if (control.n > 0 && n_services == 0 && !policy_only)
    return fail_usage("--control %s: name the services to route with "
                      "--service S (repeatable)",
                      control_list);
  if (control.n == 0 && (n_services > 0 || token_file != NULL))
    return fail_usage("%s: --service and --token-file go with --control",
                      n_services > 0 ? "--service" : "--token-file");
  if (control.n == 0 &&
      (ctls.ca != NULL || ctls.cert != NULL || ctls.key != NULL))
    return fail_usage("%s: the --control-* TLS flags go with --control",
                      ctls.ca     ? "--control-ca"
                      : ctls.cert ? "--control-cert"
                                  : "--control-key");
  if ((rc = om_cli_control_tls_check("proxy", &ctls, &control_tls)) !=
      OM_EXIT_OK)
    return rc;
  if (om_policy_source_is_control(policy, &policy_doc)) {
    if (control.n == 0)
      return fail_usage("--policy %s: a policy from the control plane needs "
                        "--control URL",
                        policy);
    if (!om_valid_name(policy_doc, strlen(policy_doc)))
      return fail_usage("--policy %s: NAME must be 1 to 128 characters of "
                        "[A-Za-z0-9._-]",
                        policy);
  } else if (policy_cache != NULL) {
    return fail_usage("--policy-cache %s: goes with --policy control:NAME",
                      policy_cache);
  }
  if (proxy_id == NULL) {
    char hn[256];
    if (gethostname(hn, sizeof hn) != 0)
      snprintf(hn, sizeof hn, "localhost");
    hn[sizeof hn - 1] = '\0';
    snprintf(default_id, sizeof default_id, "%s:%ld", hn, (long)getpid());
    proxy_id = default_id;
  }
  if (token_file != NULL) {
    const char *why;
    if (om_read_token_file(token_file, token, sizeof token, &why) != 0)
      return fail_usage("--token-file: %s", why);
  }
  if (om_parse_listen(listen, host, sizeof host, &port) != 0)
    return fail_usage("--listen: '%s' is not IP:PORT (IPv6 as [ADDR]:PORT)",
                      listen);
  if (om_parse_listen(admin, ahost, sizeof ahost, &aport) != 0)
    return fail_usage("--admin: '%s' is not IP:PORT (IPv6 as [ADDR]:PORT)",
                      admin);
  if (failures > 0)
    circuit.failures = (uint32_t)failures;
  if (cooldown_ms > 0) {
    circuit.cooldown_ns = cooldown_ms * UINT64_C(1000000);
    if (circuit.max_cooldown_ns < circuit.cooldown_ns)
      circuit.max_cooldown_ns = circuit.cooldown_ns;
  }
  circuit.probe_timeout_ns = UINT64_C(10000000000);
  rc = static_file != NULL ? om_proxy_static_load(static_file, &snaps, &n_snaps,
                                                  err, sizeof err)
                           : 0;
  if (rc != 0) {
    fprintf(stderr, "openmesh proxy: --static %s\n", err);
    return rc == OM_ENOMEM ? OM_EXIT_FAILURE : OM_EXIT_USAGE;
  }
  /* SERVICE=FILE: cut the names in place (argv is ours to edit) */
  for (size_t i = 0; i < n_sp; i++) {
    int known = 0;
    *strchr(sp_names[i], '=') = '\0';
    sp[i].service = sp_names[i];
    for (size_t k = 0; k < n_snaps; k++)
      known |= strcmp(om_snapshot_service(snaps[k]), sp[i].service) == 0;
    for (size_t k = 0; k < n_services; k++)
      known |= strcmp(services[k], sp[i].service) == 0;
    if (!known) {
      fprintf(stderr,
              "openmesh proxy: --service-policy: no service '%s' in %s\n",
              sp[i].service, static_file ? static_file : "--service");
      om_proxy_static_free(snaps, n_snaps);
      return OM_EXIT_USAGE;
    }
  }
  o.policy_path = policy != NULL ? policy : om_default_policy();
  o.service_policies = sp;
  o.n_service_policies = n_sp;
  o.circuit = &circuit;
  o.server.drain_timeout_ms = drain_ms;
  if (workers == 0) {
    workers = uv_available_parallelism();
    if (workers > OM_PROXY_MAX_WORKERS)
      workers = OM_PROXY_MAX_WORKERS;
    if (workers < 1)
      workers = 1;
  }
  app = calloc(1, sizeof *app);
  if (app == NULL || uv_loop_init(&app->loop) != 0) {
    free(app);
    om_proxy_static_free(snaps, n_snaps);
    return OM_EXIT_FAILURE;
  }
  tls.alpn = "h2,http/1.1"; /* the listener serves HTTP/2 (docs/PROXY.md) */
  app->tls_flags = &tls;
  if (access_log != NULL &&
      om_access_log_open(access_log, &app->alog, err, sizeof err) != 0) {
    fprintf(stderr, "openmesh proxy: %s\n", err);
    om_proxy_static_free(snaps, n_snaps);
    uv_loop_close(&app->loop);
    free(app);
    return OM_EXIT_FAILURE;
  }
  o.access_log = app->alog;
  if (policy_doc != NULL) {
    /* the first revision (or the cache) before anything loads it */
    om_policy_source_opts_t so;
    memset(&so, 0, sizeof so);
    so.name = policy_doc;
    so.control_urls = control.urls;
    so.n_control_urls = control.n;
    so.token = token_file != NULL ? token : NULL;
    so.tls = &control_tls;
    so.cache_dir = policy_cache;
    so.policy.lib_dir = om_lib_dir();
    so.kind = OM_POLICY_TRAFFIC;
    so.id = proxy_id;
    so.on_update = on_policy_update;
    so.ud = app;
    if (om_curl_uv_new(&app->loop, &app->curl) != 0)
      rc = OM_ENOMEM;
    else
      rc = om_policy_source_start(&app->loop, app->curl, &so, &app->psrc, err,
                                  sizeof err);
    if (rc != 0) {
      fprintf(stderr, "openmesh proxy: %s\n",
              rc == OM_ENOMEM ? "out of memory" : err);
      om_proxy_static_free(snaps, n_snaps);
      shutdown_loop(app);
      free(app);
      return rc == OM_EPOLICY || rc == OM_EINVAL ? OM_EXIT_USAGE
                                                 : OM_EXIT_FAILURE;
    }
    app->watches_open++; /* the curl glue waits for it too */
    o.policy_path = om_policy_source_path(app->psrc);
  }
  memset(&go, 0, sizeof go);
  go.proxy = o;
  go.workers = workers;
  go.tls_new = tls.cert != NULL ? worker_tls : NULL;
  go.tls_ud = app;
  rc = om_proxy_group_new(&app->loop, &go, &app->proxy, err, sizeof err);
  if (rc != 0) {
    int tls_failed = app->tls_failed;
    if (!tls_failed) /* else om_cli_tls_load said why */
      fprintf(stderr, "openmesh proxy: %s\n", err);
    om_proxy_static_free(snaps, n_snaps);
    app->proxy = NULL;
    shutdown_loop(app);
    free(app);
    return rc == OM_ENOMEM && !tls_failed ? OM_EXIT_FAILURE : OM_EXIT_USAGE;
  }
  om_access_log_set_metrics(app->alog, om_proxy_group_metrics(app->proxy));
  for (size_t i = 0; i < n_snaps && exit_code == OM_EXIT_OK; i++) {
    rc = om_proxy_group_set_snapshot(app->proxy, snaps[i], err, sizeof err);
    if (rc != 0) {
      fprintf(stderr, "openmesh proxy: %s\n", err);
      exit_code = rc == OM_ENOMEM ? OM_EXIT_FAILURE : OM_EXIT_USAGE;
    }
  }
  om_proxy_static_free(snaps, n_snaps);
  if (exit_code == OM_EXIT_OK &&
      om_proxy_group_listen(app->proxy, host, port, err, sizeof err) != 0) {
    fprintf(stderr, "openmesh proxy: cannot listen on %s: %s\n", listen, err);
    exit_code = OM_EXIT_FAILURE;
  }
  if (exit_code == OM_EXIT_OK &&
      om_proxy_group_listen_admin(app->proxy, ahost, aport, err, sizeof err) !=
          0) {
    fprintf(stderr, "openmesh proxy: cannot listen on %s (--admin): %s\n",
            admin, err);
    exit_code = OM_EXIT_FAILURE;
  }
  if (exit_code == OM_EXIT_OK && control.n > 0) {
    if (app->curl == NULL && om_curl_uv_new(&app->loop, &app->curl) != 0) {
      fprintf(stderr, "openmesh proxy: out of memory\n");
      exit_code = OM_EXIT_FAILURE;
    }
    for (size_t i = 0; i < n_services && exit_code == OM_EXIT_OK; i++) {
      om_watch_opts_t wo = {.control_urls = control.urls,
                            .n_control_urls = control.n,
                            .service = services[i],
                            .metrics = om_proxy_group_metrics(app->proxy),
                            .token = token_file != NULL ? token : NULL,
                            .tls = &control_tls,
                            .on_snapshot = on_watch_snapshot,
                            .check = on_watch_check,
                            .ud = app};
      rc = om_watch_new(&app->loop, app->curl, &wo,
                        &app->watches[app->n_watches]);
      if (rc != 0) {
        fprintf(stderr, "openmesh proxy: --control %s --service %s: %s\n",
                control_list, services[i],
                rc == OM_EINVAL ? "not an http(s) URL and a valid service name"
                                : om_strerror(rc));
        exit_code = rc == OM_EINVAL ? OM_EXIT_USAGE : OM_EXIT_FAILURE;
      } else {
        app->n_watches++;
        app->watches_open++;
      }
    }
  }
  if (exit_code == OM_EXIT_OK && om_proxy_group_start(app->proxy) != 0) {
    fprintf(stderr, "openmesh proxy: cannot start the worker threads\n");
    exit_code = OM_EXIT_FAILURE;
  }
  if (exit_code != OM_EXIT_OK) {
    shutdown_loop(app);
    free(app);
    return exit_code;
  }
  snprintf(url, sizeof url,
           strchr(host, ':') != NULL ? "%s://[%s]:%d" : "%s://%s:%d",
           tls.cert != NULL ? "https" : "http", host,
           om_proxy_group_port(app->proxy));
  snprintf(aurl, sizeof aurl,
           strchr(ahost, ':') != NULL ? "http://[%s]:%d" : "http://%s:%d",
           ahost, om_proxy_group_admin_port(app->proxy));
  if (app->n_watches > 0)
    om_proxy_group_set_status_extra(app->proxy, "watches", watches_status, app);
  if (app->psrc != NULL) {
    om_proxy_group_set_status_extra(app->proxy, "policy_source", psrc_status,
                                    app);
    om_policy_source_metrics(app->psrc, om_proxy_group_metrics(app->proxy));
    om_policy_source_set_address(app->psrc, url);
  }
  snprintf(nworkers, sizeof nworkers, "%u", workers);
  om_log(OM_LOG_INFO, "proxy_listening", "url", url, "admin", aurl, "policy",
         app->psrc != NULL ? om_policy_source_spec(app->psrc) : o.policy_path,
         "policy_file", app->psrc != NULL ? o.policy_path : NULL, "topology",
         static_file ? static_file : control_list, "workers", nworkers, NULL);
  om_cli_signals_start(&app->loop, &app->sigs, on_stop, on_hup, app);
  if (app->alog != NULL && uv_signal_init(&app->loop, &app->usr1) == 0) {
    app->usr1.data = app;
    app->usr1_open = 1;
    uv_signal_start(&app->usr1, on_usr1, SIGUSR1);
  }
  uv_run(&app->loop, UV_RUN_DEFAULT);
  uv_loop_close(&app->loop);
  om_access_log_close(app->alog);
  free(app);
  return OM_EXIT_OK;
}
