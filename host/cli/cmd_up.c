/*
 * cmd_up.c: `openmesh up [DIR]`, the embedded default. One process, one
 * loop: a control plane with the memory store, a proxy fed by the same
 * store (every change reaches it as a new snapshot, as a watch would
 * deliver it), and the example services described in DIR/up.json (default
 * examples/), each keeping a real lease. Prints the URLs and a short tour;
 * Ctrl-C deregisters the services, drains the proxy, ends the watch
 * streams and exits 0.
 *
 * With --control URL[,URL...] it joins control planes that already run
 * instead of starting its own: the proxy watches the services of up.json
 * there (failing over between the planes as `openmesh proxy` does), and
 * each example service's lease is kept there by an `openmesh register`
 * child (the same keeper, with its failover), started once the service
 * listens and stopped (lease deleted first) before the service stops.
 */
#include "om_cmds.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <uv.h>

#include "om_cli.h"
#include "om_cli_control.h"
#include "om_cli_tls.h"
#include "om_cli_util.h"
#include "om_control.h"
#include "om_curl_uv.h"
#include "om_errno.h"
#include "om_example_service.h"
#include "om_log.h"
#include "om_paths.h"
#include "om_policy_source.h"
#include "om_proxy.h"
#include "om_store_memory.h"
#include "om_store_redis.h"
#include "om_proxy_access_log.h"
#include "om_watch.h"

#define MAX_SERVICES 64

typedef struct {
  uv_loop_t loop;
  uv_signal_t sig_int, sig_term, sig_hup; /* hup: --tls-* reload */
  om_store_t *store;
  om_control_t *ctl;
  om_proxy_t *proxy;
  om_store_sub_t *sub;
  om_example_t *examples[MAX_SERVICES];
  size_t n_examples, stopped;
  om_http_tls_t *tls; /* --tls-cert: the proxy listener's */
  int stopping;
  /* --control: the planes joined, the proxy's watches on them, and one
   * `openmesh register` per example */
  om_cli_controls_t control;
  char control_list[2048];
  om_cli_control_tls_t ctls; /* --control-*: passed on to the keepers */
  om_curl_tls_t control_tls; /* the same, for the watches */
  om_curl_uv_t *curl;
  om_watch_t *watches[MAX_SERVICES];
  size_t n_watches, watches_open;
  uv_process_t keepers[MAX_SERVICES];
  size_t n_keepers, keepers_running;
  const char *policy; /* the proxy's traffic policy file */
  int policy_given;   /* from --policy or up.json, not the default */
  /* policy control:NAME: the document followed, and the seeding of it */
  om_policy_source_t *psrc;
  const char *policy_spec; /* "control:NAME" as given */
  int seeded;              /* 0 while the seed is in flight */
  int seed_rc;
  /* proxy.access_log: the log and the registry the proxy and it share */
  om_access_log_t *alog;
  om_metrics_t *metrics;
} up_t;

/* Flags that stand in for fields of up.json (-1, NULL: use the file's). */
typedef struct {
  const char *policy, *host;
  int control_port, proxy_port, admin_port;
} up_flags_t;

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: openmesh up [--policy FILE] [--listen ADDR:PORT]\n"
      "                   [--proxy-port N] [--admin-port N]\n"
      "                   [--store memory|redis://HOST:PORT/DB]\n"
      "                   [--control URL[,URL...]]\n"
      "                   [--tls-cert FILE --tls-key FILE]\n"
      "                   [--tls-client-ca FILE]\n"
      "                   [--control-ca FILE]\n"
      "                   [--control-cert FILE --control-key FILE] [DIR]\n\n"
      "Run the mesh on its embedded default: a control plane (memory\n"
      "store, or Redis with --store) and the example services described\n"
      "in DIR/up.json (default: examples/), each registered with a lease\n"
      "it renews. Ctrl-C deregisters them, ends the watch streams and\n"
      "exits 0. With Redis, start-up waits up to 10 s for it. SIGHUP\n"
      "reloads the policy (and the --tls-* files), as for openmesh proxy.\n\n"
      "  --policy FILE      the proxy's traffic policy (default: up.json's\n"
      "                     proxy.policy, else policies/traffic.lua);\n"
      "                     control:NAME follows the plane's document NAME\n"
      "                     (seeded with the default policy when absent);\n"
      "                     hot-reloaded on save and on SIGHUP\n"
      "  --listen ADDR:PORT the control plane's address (up.json's\n"
      "                     control.host and port); the proxy and the\n"
      "                     examples listen on the same ADDR. PORT 0: any\n"
      "                     free port (the banner prints the one taken)\n"
      "  --proxy-port N     the proxy's port (up.json's proxy.port; 0: any)\n"
      "  --admin-port N     the proxy's admin port (proxy.admin_port; 0: "
      "any)\n\n"
      "  --control URL[,URL...]  join these control planes (on one\n"
      "                     store) instead of running one: the proxy\n"
      "                     watches them and each example's lease is\n"
      "                     kept there by an `openmesh register` child;\n"
      "                     repeat it or give a comma list; the next\n"
      "                     plane is used when one fails. Not with\n"
      "                     --store.\n\n"
      "The --tls-* flags serve the proxy's listener (what callers reach)\n"
      "over HTTPS; the control plane and the examples stay plaintext on\n"
      "loopback, inside the one process:\n" OM_CLI_TLS_HELP_27 "\n"
      "With --control https://..., the proxy's watches and the keepers\n"
      "use (peer and host always verified):\n" OM_CLI_CONTROL_TLS_HELP_27 "\n"
      "exit: 0 stopped by Ctrl-C or SIGTERM, 1 runtime failure (a port\n"
      "in use, Redis unreachable), 2 usage, a malformed --store URL or\n"
      "an invalid up.json\n");
}

static void on_store_closed(void *ud) {
  (void)ud;
}

static void on_control_closed(void *ud) {
  up_t *up = ud;
  om_http_tls_close(up->tls);
  up->tls = NULL;
  om_store_close(up->store, on_store_closed, up);
  uv_close((uv_handle_t *)&up->sig_int, NULL);
  uv_close((uv_handle_t *)&up->sig_term, NULL);
  uv_close((uv_handle_t *)&up->sig_hup, NULL);
}

/* The embedded control plane, or (--control) nothing to close. */
static void close_control(up_t *up) {
  if (up->ctl != NULL)
    om_control_close(up->ctl, on_control_closed, up);
  else
    on_control_closed(up);
}

static void on_proxy_closed(void *ud) {
  up_t *up = ud;
  up->proxy = NULL;
  close_control(up);
}

static void on_curl_closed(void *ud) {
  (void)ud;
}

static void on_watch_closed(void *ud) {
  up_t *up = ud;
  if (--up->watches_open == 0 && up->curl != NULL) {
    om_curl_uv_close(up->curl, on_curl_closed, up);
    up->curl = NULL;
  }
}

/* --control: the watches first (they hold the curl glue), then the glue. */
static void close_watches(up_t *up) {
  size_t n = up->n_watches;
  up->n_watches = 0;
  for (size_t i = 0; i < n; i++)
    om_watch_close(up->watches[i], on_watch_closed, up);
  if (n == 0 && up->curl != NULL) {
    om_curl_uv_close(up->curl, on_curl_closed, up);
    up->curl = NULL;
  }
}

/* Examples gone (deregistered first), then the proxy drains, then the
 * control plane ends its watch streams, then the store. */
static void after_examples(up_t *up);

static void on_psrc_closed(void *ud) {
  up_t *up = ud;
  up->psrc = NULL;
  after_examples(up);
}

static void after_examples(up_t *up) {
  if (up->psrc != NULL) { /* it holds the curl glue: it goes first */
    om_policy_source_close(up->psrc, on_psrc_closed, up);
    return;
  }
  if (up->sub != NULL) {
    om_store_unsubscribe(up->store, up->sub);
    up->sub = NULL;
  }
  close_watches(up);
  if (up->proxy != NULL)
    om_proxy_close(up->proxy, on_proxy_closed, up);
  else
    close_control(up);
}

static void on_example_stopped(void *ud) {
  up_t *up = ud;
  if (++up->stopped == up->n_examples)
    after_examples(up);
}

static void stop_examples(up_t *up) {
  if (up->n_examples == 0) {
    after_examples(up);
    return;
  }
  for (size_t i = 0; i < up->n_examples; i++)
    om_example_stop(up->examples[i], on_example_stopped, up);
}

/* --control: the keepers delete their leases and exit first, so nothing
 * new is routed to an example before it stops. */
static void stop(up_t *up) {
  if (up->stopping)
    return;
  up->stopping = 1;
  if (up->keepers_running == 0) {
    stop_examples(up);
    return;
  }
  for (size_t i = 0; i < up->n_keepers; i++)
    if (up->keepers[i].data != NULL)
      uv_process_kill(&up->keepers[i], SIGTERM);
}

static void on_keeper_closed(uv_handle_t *h) {
  h->data = NULL;
}

static void on_keeper_exit(uv_process_t *p, int64_t status, int term_signal) {
  up_t *up = p->data;
  char st[24], pid[24];
  snprintf(st, sizeof st, "%d",
           term_signal != 0 ? 128 + term_signal : (int)status);
  snprintf(pid, sizeof pid, "%d", p->pid);
  if (!up->stopping) /* its own log lines say why */
    om_log(OM_LOG_WARN, "up_keeper_exited", "pid", pid, "status", st, NULL);
  uv_close((uv_handle_t *)p, on_keeper_closed);
  if (--up->keepers_running == 0 && up->stopping)
    stop_examples(up);
}

/*
 * --control: `openmesh register` (this binary) keeps example e's lease on
 * the planes, with what up.json gave it (zone, metadata) and the URL it
 * listens on. Its stdio is ours: its log lines join ours.
 */
static int start_keeper(up_t *up, const om_example_opts_t *o,
                        const om_example_t *e) {
  char exe[4096], *argv[24 + 2 * (OM_CLI_CONTROL_MAX + 16)], meta[16][512];
  size_t exe_len = sizeof exe, n = 0;
  uv_process_options_t po;
  uv_stdio_container_t stdio[3];
  uv_process_t *p = &up->keepers[up->n_keepers];
  int rc;
  if (uv_exepath(exe, &exe_len) != 0)
    return OM_EIO;
  argv[n++] = exe;
  argv[n++] = "register";
  for (size_t i = 0; i < up->control.n; i++) { /* each whole, never cut */
    argv[n++] = "--control";
    argv[n++] = (char *)up->control.urls[i];
  }
  om_cli_control_tls_args(&up->ctls, argv, &n);
  argv[n++] = "--service";
  argv[n++] = (char *)o->service;
  argv[n++] = "--id";
  argv[n++] = (char *)o->id;
  argv[n++] = "--url";
  argv[n++] = (char *)om_example_url(e);
  argv[n++] = "--ttl";
  argv[n++] = "10s";
  argv[n++] = "--drain";
  argv[n++] = "0";
  if (o->zone != NULL) {
    argv[n++] = "--zone";
    argv[n++] = (char *)o->zone;
  }
  for (size_t i = 0; i < o->n_metadata && i < 16; i++) {
    snprintf(meta[i], sizeof meta[i], "%s=%s", o->metadata[i].key,
             o->metadata[i].value);
    argv[n++] = "--meta";
    argv[n++] = meta[i];
  }
  argv[n] = NULL;
  memset(&po, 0, sizeof po);
  for (int i = 0; i < 3; i++) {
    stdio[i].flags = UV_INHERIT_FD;
    stdio[i].data.fd = i;
  }
  po.file = exe;
  po.args = argv;
  po.exit_cb = on_keeper_exit;
  po.stdio = stdio;
  po.stdio_count = 3;
  rc = uv_spawn(&up->loop, p, &po);
  if (rc != 0) {
    uv_close((uv_handle_t *)p, NULL);
    return OM_EIO;
  }
  p->data = up;
  up->n_keepers++;
  up->keepers_running++;
  return 0;
}

static const char *str(json_t *o, const char *k, const char *def, int *bad);
static long integer(json_t *o, const char *k, long def, long lo, long hi,
                    int *bad);

/* Each change in the store reaches the proxy as a new snapshot. */
static void on_change(void *ud, om_snapshot_t *snap) {
  up_t *up = ud;
  char err[512];
  if (up->proxy != NULL &&
      om_proxy_set_snapshot(up->proxy, snap, err, sizeof err) != 0)
    om_log(OM_LOG_WARN, "snapshot_rejected", "service",
           om_snapshot_service(snap), "error", err, NULL);
}

/* /status "watches" (--control): each service's watch and its plane. */
static json_t *watches_status(void *ud) {
  up_t *up = ud;
  json_t *o = json_object();
  for (size_t i = 0; o != NULL && i < up->n_watches; i++) {
    json_t *w = om_watch_status(up->watches[i]);
    if (w == NULL ||
        json_object_set_new(o, om_watch_service(up->watches[i]), w) != 0) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

static void on_watch_snapshot(void *ud, om_snapshot_t *snap) {
  up_t *up = ud;
  if (!up->stopping)
    on_change(ud, snap);
}

static int on_watch_check(void *ud, const om_snapshot_t *snap, char *err,
                          size_t errlen) {
  up_t *up = ud;
  return up->proxy != NULL
             ? om_proxy_check_snapshot(up->proxy, snap, err, errlen)
             : 0;
}

/* --control: one watch per service named in up.json, on every plane. */
static int start_watches(up_t *up, json_t *services) {
  size_t i;
  json_t *svc;
  if (om_curl_uv_new(&up->loop, &up->curl) != 0) {
    fprintf(stderr, "openmesh up: out of memory\n");
    return OM_EXIT_FAILURE;
  }
  json_array_foreach(services, i, svc) {
    const char *name = json_string_value(json_object_get(svc, "service"));
    om_watch_opts_t wo = {.control_urls = up->control.urls,
                          .n_control_urls = up->control.n,
                          .tls = &up->control_tls,
                          .service = name,
                          .metrics = om_proxy_metrics(up->proxy),
                          .on_snapshot = on_watch_snapshot,
                          .check = on_watch_check,
                          .ud = up};
    int seen = name == NULL; /* start_example reports a bad entry */
    for (size_t k = 0; k < up->n_watches && !seen; k++)
      seen = strcmp(om_watch_service(up->watches[k]), name) == 0;
    if (seen)
      continue;
    if (om_watch_new(&up->loop, up->curl, &wo, &up->watches[up->n_watches]) !=
        0) {
      fprintf(stderr, "openmesh up: cannot watch '%s' at %s\n", name,
              up->control_list);
      return OM_EXIT_USAGE;
    }
    up->n_watches++;
    up->watches_open++;
  }
  om_proxy_set_status_extra(up->proxy, "watches", watches_status, up);
  return OM_EXIT_OK;
}

static void on_policy_update(void *ud) {
  up_t *up = ud;
  if (up->proxy != NULL && !up->stopping)
    (void)om_proxy_reload_policies(up->proxy); /* logged, counted, shown */
}

static void on_seed_put(void *ud, int status, om_store_change_t change,
                        uint64_t revision) {
  up_t *up = ud;
  (void)change;
  (void)revision;
  up->seed_rc = status;
  up->seeded = 1;
}

static void on_seed_get(void *ud, int status, om_config_doc_t *doc) {
  up_t *up = ud;
  const char *name = up->policy_spec + 8;
  char *buf = NULL;
  size_t len = 0;
  FILE *f;
  if (status == 0 || status != OM_ENOTFOUND) { /* there, or cannot tell */
    up->seed_rc = status;
    up->seeded = 1;
    return;
  }
  (void)doc;
  f = fopen(om_default_policy(), "rb");
  if (f != NULL && fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf != NULL && fseek(f, 0, SEEK_SET) == 0)
      len = fread(buf, 1, (size_t)n, f);
  }
  if (f != NULL)
    fclose(f);
  if (buf == NULL || len == 0 ||
      om_store_config_put(up->store, name, "text/x-lua", buf, len, on_seed_put,
                          up) != 0) {
    up->seed_rc = OM_EIO;
    up->seeded = 1;
  }
  free(buf);
}

/*
 * policy control:NAME with up's own plane: a fresh store has no document
 * NAME, so it is seeded with the default policy (never over one that is
 * there: a Redis store may hold it), then the proxy follows it as
 * `openmesh proxy --policy control:NAME` does. Joined planes (--control)
 * must hold it already.
 */
static int start_policy_source(up_t *up, const char *host, char *err,
                               size_t errlen) {
  char url[300];
  const char *urls[1], *name = up->policy_spec + 8;
  om_policy_source_opts_t so;
  static char id[64];
  if (up->ctl != NULL) {
    if (om_store_config_get(up->store, name, on_seed_get, up) != 0) {
      snprintf(err, errlen, "cannot read the document '%s'", name);
      return OM_EIO;
    }
    while (!up->seeded && uv_run(&up->loop, UV_RUN_ONCE) != 0)
      ;
    if (up->seed_rc != 0) {
      snprintf(err, errlen, "cannot seed the document '%s' with %s: %s", name,
               om_default_policy(), om_strerror(up->seed_rc));
      return up->seed_rc;
    }
    snprintf(url, sizeof url, "http://%s:%d", host, om_control_port(up->ctl));
    urls[0] = url;
  }
  if (up->curl == NULL && om_curl_uv_new(&up->loop, &up->curl) != 0)
    return OM_ENOMEM;
  memset(&so, 0, sizeof so);
  so.name = name;
  so.control_urls = up->ctl != NULL ? urls : up->control.urls;
  so.n_control_urls = up->ctl != NULL ? 1 : up->control.n;
  so.tls = up->ctl != NULL ? NULL : &up->control_tls;
  so.policy.lib_dir = om_lib_dir();
  so.kind = OM_POLICY_TRAFFIC;
  snprintf(id, sizeof id, "up:%d", (int)uv_os_getpid());
  so.id = id;
  so.on_update = on_policy_update;
  so.ud = up;
  return om_policy_source_start(&up->loop, up->curl, &so, &up->psrc, err,
                                errlen);
}

static int start_proxy(up_t *up, json_t *conf, const char *host,
                       const char *file, const up_flags_t *fl) {
  json_t *px = json_object_get(conf, "proxy");
  om_proxy_opts_t o = {0};
  char err[2048];
  int bad = 0, port, admin;
  port = (int)integer(px, "port", 7601, 0, 65535, &bad);
  admin = (int)integer(px, "admin_port", 7602, 0, 65535, &bad);
  o.policy_path = str(px, "policy", NULL, &bad);
  if (fl->policy != NULL)
    o.policy_path = fl->policy;
  up->policy_given = o.policy_path != NULL;
  if (o.policy_path == NULL)
    o.policy_path = om_default_policy();
  up->policy = o.policy_path;
  if (om_policy_source_is_control(o.policy_path, &(const char *){NULL})) {
    int rc;
    up->policy_spec = o.policy_path;
    rc = start_policy_source(up, host, err, sizeof err);
    if (rc != 0) {
      fprintf(stderr, "openmesh up: policy %s: %s\n", up->policy_spec,
              rc == OM_ENOMEM ? "out of memory" : err);
      return rc == OM_EPOLICY || rc == OM_EINVAL || rc == OM_ENOTFOUND
                 ? OM_EXIT_USAGE
                 : OM_EXIT_FAILURE;
    }
    o.policy_path = om_policy_source_path(up->psrc);
  }
  if (fl->proxy_port >= 0)
    port = fl->proxy_port;
  if (fl->admin_port >= 0)
    admin = fl->admin_port;
  o.server.tls = up->tls;
  {
    const char *alog = str(px, "access_log", NULL, &bad);
    if (!bad && alog != NULL) {
      if ((up->metrics = om_metrics_new()) == NULL ||
          om_access_log_open(alog, &up->alog, err, sizeof err) != 0) {
        fprintf(stderr, "openmesh up: %s: proxy.access_log: %s\n", file,
                up->metrics == NULL ? "out of memory" : err);
        return OM_EXIT_FAILURE;
      }
      om_access_log_set_metrics(up->alog, up->metrics);
      o.metrics = up->metrics;
      o.access_log = up->alog;
    }
  }
  if (bad) {
    fprintf(stderr,
            "openmesh up: %s: proxy needs port, admin_port and a "
            "policy path\n",
            file);
    return OM_EXIT_USAGE;
  }
  if (om_proxy_new(&up->loop, &o, &up->proxy, err, sizeof err) != 0) {
    fprintf(stderr, "openmesh up: proxy: %s\n", err);
    return OM_EXIT_USAGE;
  }
  if (om_proxy_listen(up->proxy, host, port) != 0 ||
      om_proxy_listen_admin(up->proxy, host, admin) != 0) {
    fprintf(stderr,
            "openmesh up: the proxy cannot listen on %s:%d / %d "
            "(port in use?)\n",
            host, port, admin);
    return OM_EXIT_FAILURE;
  }
  if (up->control.n > 0)
    return start_watches(up, json_object_get(conf, "services"));
  if (om_store_subscribe(up->store, NULL, on_change, up, &up->sub)) {
    fprintf(stderr, "openmesh up: out of memory\n");
    return OM_EXIT_FAILURE;
  }
  return OM_EXIT_OK;
}

/* SIGHUP: reload the policy files, as `openmesh proxy` does, and the
 * listener's TLS files (--tls-cert); never a reason to stop. */
static void on_hup(uv_signal_t *h, int signum) {
  up_t *up = h->data;
  (void)signum;
  if (up->stopping)
    return;
  om_log(OM_LOG_INFO, "up_reload", "signal", "SIGHUP", NULL);
  if (up->proxy != NULL)
    (void)om_proxy_reload_policies(up->proxy); /* logged, counted, shown */
  if (up->tls != NULL)
    (void)om_http_tls_reload(up->tls, NULL, 0); /* logged and counted */
}

static void on_signal(uv_signal_t *h, int signum) {
  om_log(OM_LOG_INFO, "up_stopping", "signal",
         signum == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
  stop(h->data);
}

/* A string field, or def; sets *bad when present but not a string. */
static const char *str(json_t *o, const char *k, const char *def, int *bad) {
  json_t *v = json_object_get(o, k);
  if (v == NULL)
    return def;
  if (!json_is_string(v)) {
    *bad = 1;
    return def;
  }
  return json_string_value(v);
}

static long integer(json_t *o, const char *k, long def, long lo, long hi,
                    int *bad) {
  json_t *v = json_object_get(o, k);
  if (v == NULL)
    return def;
  if (!json_is_integer(v) || json_integer_value(v) < lo ||
      json_integer_value(v) > hi) {
    *bad = 1;
    return def;
  }
  return (long)json_integer_value(v);
}

static int start_example(up_t *up, json_t *svc, size_t i, const char *host,
                         const char *file) {
  om_example_opts_t o = {0};
  om_kv_t md[16];
  json_t *meta = json_object_get(svc, "metadata");
  int bad = !json_is_object(svc), rc, b;
  const char *key;
  json_t *val;
  o.service = str(svc, "service", NULL, &bad);
  o.id = str(svc, "id", NULL, &bad);
  o.zone = str(svc, "zone", NULL, &bad);
  o.host = host;
  o.port = (int)integer(svc, "port", -1, 0, 65535, &bad);
  b = om_example_behaviour(str(svc, "behaviour", "fast", &bad));
  o.delay_ms = (uint64_t)integer(svc, "delay_ms", 200, 0, 60000, &bad);
  o.fail_every = (uint32_t)integer(svc, "fail_every", 3, 1, 1000000, &bad);
  o.status = (int)integer(svc, "status", 503, 400, 599, &bad);
  o.retry_after_s = (uint32_t)integer(svc, "retry_after", 1, 0, 3600, &bad);
  if (meta != NULL && !json_is_object(meta))
    bad = 1;
  json_object_foreach(meta, key, val) {
    if (o.n_metadata == 16 || !json_is_string(val)) {
      bad = 1;
      break;
    }
    md[o.n_metadata].key = (char *)key;
    md[o.n_metadata].value = (char *)json_string_value(val);
    o.n_metadata++;
  }
  o.metadata = md;
  if (bad || b < 0 || o.service == NULL || o.id == NULL || o.port < 0) {
    fprintf(stderr,
            "openmesh up: %s: services[%zu]: needs service, id, port "
            "(0-65535, 0: any), behaviour "
            "fast|ok|slow|flaky|failing|throttled|dying, status 400-599, "
            "retry_after 0-3600, string metadata\n",
            file, i);
    return OM_EXIT_USAGE;
  }
  o.behaviour = (om_example_behaviour_t)b;
  rc =
      om_example_start(&up->loop, up->store, &o, &up->examples[up->n_examples]);
  if (rc != 0) {
    fprintf(stderr, "openmesh up: services[%zu] (%s): %s on %s:%d\n", i, o.id,
            rc == OM_EIO ? "cannot listen (port in use?)" : om_strerror(rc),
            host, o.port);
    return rc == OM_EINVAL ? OM_EXIT_USAGE : OM_EXIT_FAILURE;
  }
  up->n_examples++;
  if (up->control.n > 0 &&
      start_keeper(up, &o, up->examples[up->n_examples - 1]) != 0) {
    fprintf(stderr,
            "openmesh up: services[%zu] (%s): cannot start its "
            "`openmesh register`\n",
            i, o.id);
    return OM_EXIT_FAILURE;
  }
  return OM_EXIT_OK;
}

static void tour(up_t *up, const char *host, int port) {
  int pp = om_proxy_port(up->proxy), ap = om_proxy_admin_port(up->proxy);
  char cp[2100], exe[4096];
  size_t n, exe_len = sizeof exe;
  if (uv_exepath(exe, &exe_len) != 0) /* the commands must run as printed */
    snprintf(exe, sizeof exe, "openmesh");
  if (up->control.n > 0) { /* the first plane joined, without a '/' */
    snprintf(cp, sizeof cp, "%s", up->control.urls[0]);
    for (n = strlen(cp); n > 0 && cp[n - 1] == '/'; n--)
      cp[n - 1] = '\0';
    printf("\nOpenMesh is up.\n\n"
           "  control planes  %s   (joined)\n",
           up->control_list);
  } else {
    snprintf(cp, sizeof cp, "http://%s:%d", host, port);
    printf("\nOpenMesh is up.\n\n"
           "  control plane   %s   (%s store)\n",
           cp, om_store_name(up->store));
  }
  printf("  proxy           %s://%s:%d   (admin: http://%s:%d/status)\n",
         up->tls ? "https" : "http", host, pp, host, ap);
  for (size_t i = 0; i < up->n_examples; i++)
    printf("  example         %s\n", om_example_url(up->examples[i]));
  printf("\nTry:\n"
         "  curl -s -H 'Host: orders' http://%s:%d/                 # "
         "unkeyed: P2C picks by load\n"
         "  curl -s -H 'Host: orders' -H 'x-openmesh-key: user-7' "
         "http://%s:%d/   # keyed: always the same peer\n"
         "  curl -s %s/v1/services/orders               # the "
         "registry\n"
         "  curl -sN %s/v1/watch/services/orders        # live "
         "snapshots (Ctrl-C to stop)\n"
         "  curl -s http://%s:%d/metrics                           # the "
         "proxy's metrics\n\n",
         host, pp, host, pp, cp, cp, host, ap);
  printf("  traffic policy  %s\n\n", up->policy);
  if (up->psrc != NULL) { /* control:NAME: a PUT is the edit */
    printf("The proxy follows the document %s on the control plane. To\n"
           "change it, copy the default policy to a scratch file, edit the\n"
           "copy and push it (a refused one is answered 422 with the reason):\n"
           "  cp %s /tmp/traffic.lua\n"
           "  curl -s -X PUT -H 'Content-Type: text/x-lua' "
           "--data-binary @/tmp/traffic.lua %s/v1/config/%s\n"
           "Check a policy first with\n"
           "  %s check /tmp/traffic.lua\n\n"
           "Ctrl-C stops everything.\n\n",
           up->policy_spec + 8, om_default_policy(), cp, up->policy_spec + 8,
           exe);
    fflush(stdout);
    return;
  }
  if (!up->policy_given)
    printf("To write a policy of your own, copy this one to a scratch file\n"
           "and run up on the copy (the tracked file stays as the specs "
           "expect it):\n"
           "  cp %s /tmp/traffic.lua\n"
           "  %s up --policy /tmp/traffic.lua\n\n",
           up->policy, exe);
  printf("Edit %s (for example: return only peers whose\n"
         "metadata.version is \"v1\") and the proxy reloads it on save or on\n"
         "SIGHUP (kill -HUP %d); a broken edit is refused and the last good\n"
         "version keeps routing (see /status). Check a policy first with\n"
         "  %s check %s\n\n"
         "Ctrl-C stops everything.\n\n",
         up->policy_given ? up->policy : "the copy", (int)uv_os_getpid(), exe,
         up->policy_given ? up->policy : "/tmp/traffic.lua");
  fflush(stdout);
}

int om_cmd_up(int argc, char **argv) {
  const char *dir = "examples";
  char file[4096];
  json_error_t jerr;
  json_t *conf, *services, *svc;
  om_control_opts_t co = {0};
  const char *host;
  int port, bad = 0, rc = OM_EXIT_OK, use_redis;
  size_t i;
  up_t *up;
  const char *store = "memory";
  int have_dir = 0, have_store = 0;
  om_cli_controls_t control = {.n = 0};
  om_cli_tls_t tls = {0};
  om_cli_control_tls_t ctls = {0};
  om_curl_tls_t control_tls = {0};
  up_flags_t fl = {NULL, NULL, -1, -1, -1};
  char listen_host[256];
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
      usage(stdout);
      return OM_EXIT_OK;
    }
    if (strcmp(argv[a], "--store") == 0 && a + 1 < argc) {
      store = argv[++a];
      have_store = 1;
    } else if (strncmp(argv[a], "--store=", 8) == 0) {
      store = argv[a] + 8;
      have_store = 1;
    } else if ((strcmp(argv[a], "--control") == 0 && a + 1 < argc) ||
               strncmp(argv[a], "--control=", 10) == 0) {
      char *v = argv[a][9] == '=' ? argv[a] + 10 : argv[++a];
      if ((rc = om_cli_controls_add("up", &control, v)) != OM_EXIT_OK)
        return rc;
    } else if (strcmp(argv[a], "--policy") == 0 && a + 1 < argc) {
      fl.policy = argv[++a];
    } else if (strcmp(argv[a], "--listen") == 0 && a + 1 < argc) {
      if (om_parse_listen(argv[++a], listen_host, sizeof listen_host,
                          &fl.control_port) != 0)
        return om_cli_fail_usage("up",
                                 "--listen %s: expected ADDR:PORT "
                                 "(127.0.0.1:7600, [::1]:7600)",
                                 argv[a]);
      fl.host = listen_host;
    } else if ((strcmp(argv[a], "--proxy-port") == 0 ||
                strcmp(argv[a], "--admin-port") == 0) &&
               a + 1 < argc) {
      char *end;
      long v = strtol(argv[a + 1], &end, 10);
      if (*argv[a + 1] == '\0' || *end != '\0' || v < 0 || v > 65535)
        return om_cli_fail_usage("up", "%s: a port 0-65535 expected", argv[a]);
      *(argv[a][2] == 'p' ? &fl.proxy_port : &fl.admin_port) = (int)v;
      a++;
    } else if (strcmp(argv[a], "--tls-cert") == 0 && a + 1 < argc) {
      tls.cert = argv[++a];
    } else if (strcmp(argv[a], "--tls-key") == 0 && a + 1 < argc) {
      tls.key = argv[++a];
    } else if (strcmp(argv[a], "--tls-client-ca") == 0 && a + 1 < argc) {
      tls.client_ca = argv[++a];
    } else if (strcmp(argv[a], "--control-ca") == 0 && a + 1 < argc) {
      ctls.ca = argv[++a];
    } else if (strcmp(argv[a], "--control-cert") == 0 && a + 1 < argc) {
      ctls.cert = argv[++a];
    } else if (strcmp(argv[a], "--control-key") == 0 && a + 1 < argc) {
      ctls.key = argv[++a];
    } else if (argv[a][0] == '-' || have_dir) {
      usage(stderr);
      return OM_EXIT_USAGE;
    } else {
      dir = argv[a];
      have_dir = 1;
    }
  }
  if (control.n > 0 && have_store)
    return om_cli_fail_usage("up",
                             "--store %s: not with --control (the planes "
                             "joined have their store)",
                             store);
  if ((rc = om_cli_store_arg("up", store, &use_redis)) != OM_EXIT_OK)
    return rc;
  if ((rc = om_cli_tls_check("up", &tls)) != OM_EXIT_OK)
    return rc;
  if (control.n == 0 &&
      (ctls.ca != NULL || ctls.cert != NULL || ctls.key != NULL))
    return om_cli_fail_usage("up",
                             "%s: the --control-* TLS flags go with "
                             "--control",
                             ctls.ca     ? "--control-ca"
                             : ctls.cert ? "--control-cert"
                                         : "--control-key");
  if ((rc = om_cli_control_tls_check("up", &ctls, &control_tls)) != OM_EXIT_OK)
    return rc;
  snprintf(file, sizeof file, "%s/up.json", dir);
  conf = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
  if (conf == NULL) {
    fprintf(stderr, "openmesh up: %s:%d: %s\n", file, jerr.line, jerr.text);
    return OM_EXIT_USAGE;
  }
  host = str(json_object_get(conf, "control"), "host", "127.0.0.1", &bad);
  port = (int)integer(json_object_get(conf, "control"), "port", 7600, 0, 65535,
                      &bad);
  if (fl.host != NULL) {
    host = fl.host;
    port = fl.control_port;
  }
  services = json_object_get(conf, "services");
  if (bad || (services != NULL && !json_is_array(services)) ||
      json_array_size(services) > MAX_SERVICES) {
    fprintf(stderr,
            "openmesh up: %s: control needs host and port; services "
            "an array of at most 64\n",
            file);
    json_decref(conf);
    return OM_EXIT_USAGE;
  }
  up = calloc(1, sizeof *up);
  if (up == NULL || uv_loop_init(&up->loop) != 0) {
    free(up);
    json_decref(conf);
    return OM_EXIT_FAILURE;
  }
  up->control = control;
  up->ctls = ctls;
  up->control_tls = control_tls;
  om_cli_controls_join(&control, up->control_list, sizeof up->control_list);
  if (use_redis) {
    om_store_redis_opts_t ro = {0};
    ro.url = store;
    if (om_store_redis_new(&up->loop, &ro, &up->store) != 0) {
      rc = OM_EXIT_FAILURE;
      goto done;
    }
    /* start-up waits for Redis (it logs each retry), then gives up */
    if (om_store_redis_wait_ready(&up->loop, up->store, 10000) != 0) {
      fprintf(stderr, "openmesh up: --store: cannot reach Redis at %s\n",
              store);
      om_store_close(up->store, NULL, NULL);
      uv_run(&up->loop, UV_RUN_DEFAULT);
      rc = OM_EXIT_FAILURE;
      goto done;
    }
  } else if (om_store_memory_new(&up->loop, NULL, &up->store) != 0) {
    rc = OM_EXIT_FAILURE;
    goto done;
  }
  if (om_cli_tls_load("up", &up->loop, &tls, 0, &up->tls) != OM_EXIT_OK) {
    om_store_close(up->store, on_store_closed, up);
    uv_run(&up->loop, UV_RUN_DEFAULT);
    rc = OM_EXIT_USAGE;
    goto done;
  }
  co.store = up->store;
  /* --control: the examples' own leases go to this local store, which
   * nothing else reads; their leases on the planes are the keepers' */
  if (control.n == 0 && (om_control_new(&up->loop, &co, &up->ctl) != 0 ||
                         om_control_listen(up->ctl, host, port) != 0)) {
    fprintf(stderr,
            "openmesh up: the control plane cannot listen on %s:%d "
            "(port in use?)\n",
            host, port);
    rc = OM_EXIT_FAILURE;
  }
  if (rc == OM_EXIT_OK)
    rc = start_proxy(up, conf, host, file, &fl);
  json_array_foreach(services, i, svc) {
    if (rc != OM_EXIT_OK)
      break;
    rc = start_example(up, svc, i, host, file);
  }
  uv_signal_init(&up->loop, &up->sig_int);
  uv_signal_init(&up->loop, &up->sig_term);
  uv_signal_init(&up->loop, &up->sig_hup);
  up->sig_int.data = up->sig_term.data = up->sig_hup.data = up;
  if (rc == OM_EXIT_OK) {
    uv_signal_start(&up->sig_int, on_signal, SIGINT);
    uv_signal_start(&up->sig_term, on_signal, SIGTERM);
    uv_signal_start(&up->sig_hup, on_hup, SIGHUP);
    tour(up, host, up->ctl != NULL ? om_control_port(up->ctl) : 0);
  } else if (up->ctl != NULL || up->proxy != NULL) {
    stop(up);
  } else {
    om_http_tls_close(up->tls);
    up->tls = NULL;
    om_store_close(up->store, on_store_closed, up);
    uv_close((uv_handle_t *)&up->sig_int, NULL);
    uv_close((uv_handle_t *)&up->sig_term, NULL);
    uv_close((uv_handle_t *)&up->sig_hup, NULL);
  }
  uv_run(&up->loop, UV_RUN_DEFAULT);
done:
  uv_loop_close(&up->loop);
  om_access_log_close(up->alog); /* the proxy is gone */
  om_metrics_free(up->metrics);
  free(up);
  json_decref(conf);
  return rc;
}
