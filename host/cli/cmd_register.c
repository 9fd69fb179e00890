/*
 * cmd_register.c: `openmesh register`, the keeper of one instance's lease.
 *
 * It registers the instance with the control plane (PUT
 * {control}/v1/services/{S}/instances/{I}), renews the lease every ttl/3
 * with the same PUT (so a control plane that restarted with an empty
 * memory store gets the instance back at the next renewal, without a 404
 * round trip), and retries with jittered exponential backoff while the
 * control plane is unreachable or failing.
 *
 * With several control planes (on one shared store) it sticks with the
 * one that works; a connect failure, a timeout or a 5xx moves the next
 * request to the next plane at once (round robin), and the backoff runs
 * only after every plane failed in a row. A lease renewed through any
 * plane is the same lease. Each move is logged (control_failover, with
 * the plane it left and the one it moved to).
 *
 * Optionally it runs the service itself (CMD) and ties the lease to it:
 *
 * - CMD exits on its own: DELETE the lease, exit with CMD's status.
 * - SIGTERM/SIGINT: DELETE the lease first (so the proxies stop sending
 *   new requests), wait the drain period (requests already routed to the
 *   instance finish), then SIGTERM CMD, SIGKILL it after a grace period,
 *   and exit with its status. Each further signal skips the current wait.
 *
 * Everything runs on one libuv loop; HTTP goes through om_curl_uv.
 */
#include "om_cmds.h"

#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "om_backoff.h"
#include "om_cli.h"
#include "om_cli_control.h"
#include "om_cli_tls.h"
#include "om_cli_util.h"
#include "om_curl_uv.h"
#include "om_errno.h"
#include "om_log.h"
#include "om_rng.h"
#include "om_snapshot.h"
#include "om_url.h"

#define RETRY_FLOOR_MS 100u    /* never retry more often than this */
#define RETRY_BASE_MS 200u     /* first backoff ceiling */
#define RETRY_CAP_MS 30000u    /* backoff ceiling, also capped by ttl/3 */
#define DELETE_BUDGET_MS 2000u /* how long shutdown waits for the DELETE */
#define KILL_GRACE_MS 10000u   /* SIGTERM -> SIGKILL */
#define DEFAULT_DRAIN_MS 5000u
#define TOKEN_MAX 4096

enum phase { RUN, DELETING, DRAINING, STOPPING, DONE };
enum req_kind { REQ_PUT, REQ_DELETE };

typedef struct reg_s {
  uv_loop_t loop;
  om_curl_uv_t *cu;
  om_rng_t rng;
  /* configuration */
  const char *service, *id, *token_file;
  /* {control}/v1/services/{S}/instances/{I}, one per control plane */
  char *instance_urls[OM_CLI_CONTROL_MAX];
  const char *planes[OM_CLI_CONTROL_MAX]; /* the --control URLs */
  size_t n_planes;
  char *instance_url; /* of the plane in use: instance_urls[plane] */
  char *put_body;
  size_t put_len;
  uint64_t ttl_ms, drain_ms;
  char auth[TOKEN_MAX + 32]; /* "Authorization: Bearer ..." or "" */
  om_curl_tls_t tls;         /* --control-ca, --control-cert/-key */
  /* runtime */
  enum phase phase;
  om_curl_request_t *inflight;
  uint32_t attempt;  /* consecutive failed rounds of this request kind */
  size_t plane;      /* the control plane in use */
  size_t round_left; /* planes still to try before a backoff */
  size_t ok_plane;   /* where the last PUT succeeded */
  int registered;    /* the last PUT succeeded */
  uint64_t delete_deadline;
  uv_timer_t retry_timer; /* next PUT, or DELETE retry */
  uv_timer_t phase_timer; /* DELETE budget, drain, kill grace */
  uv_signal_t sigterm, sigint;
  uv_process_t proc;
  int has_child, child_running, killed;
  int child_status;
  int exit_code;
} reg_t;

static void send_put(reg_t *r);
static void send_delete(reg_t *r);
static void after_delete(reg_t *r);

/* ---- usage and flags ---- */

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: openmesh register --control URL[,URL...] --service S --id I\n"
      "                         --url U --ttl DURATION [--weight W]\n"
      "                         [--zone Z] [--meta KEY=VALUE ...]\n"
      "                         [--token-file F] [--drain DURATION]\n"
      "                         [--control-ca FILE]\n"
      "                         [--control-cert FILE --control-key FILE]\n"
      "                         [--] [CMD ARGS...]\n\n"
      "Keep the lease of one service instance alive in the control plane:\n"
      "register it (PUT /v1/services/S/instances/I), renew every ttl/3,\n"
      "retry with jittered backoff while the control plane is unreachable.\n"
      "With CMD, run it (stdio inherited) and tie the lease to it: when it\n"
      "exits, remove the lease and exit with its status. On SIGTERM/SIGINT:\n"
      "remove the lease first (waiting at most 2 s), wait the drain period,\n"
      "then SIGTERM CMD (SIGKILL after 10 s) and exit with its status (0\n"
      "without CMD). A second signal skips the current wait. Send the\n"
      "signal to this process only: a signal to the whole process group\n"
      "(Ctrl-C in a terminal) also reaches CMD directly.\n\n"
      "  --control URL      control plane base URL (http:// or https://);\n"
      "                     repeat it or give a comma list for several planes\n"
      "                     on one store: the next is used when one fails\n"
      "  --service S, --id I  [A-Za-z0-9._-]{1,128}\n"
      "  --url U            where the instance serves (absolute http(s))\n"
      "  --ttl DURATION     lease time to live, 1s..1h\n"
      "  --weight W         (0, 10000], default 1\n"
      "  --zone Z           locality label\n"
      "  --meta KEY=VALUE   metadata entry (repeatable)\n"
      "  --token-file F     bearer token: first line of F\n"
      "  --drain DURATION   wait after removing the lease (default 5s)\n"
      "https:// control planes (peer and host always "
      "verified):\n" OM_CLI_CONTROL_TLS_HELP_27 "\n"
      "DURATION: digits and a unit: 500ms, 10s, 2m, 1h (or 0).\n"
      "exit: CMD's status (128+N when killed by signal N); 0 without CMD;\n"
      "1 runtime failure; 2 usage or invalid input; 126/127 CMD could not\n"
      "be run.\n");
}

static int bad(const char *flag, const char *why) {
  fprintf(stderr, "openmesh register: %s: %s (see --help)\n", flag, why);
  return OM_EXIT_USAGE;
}

/* A weight: a plain decimal number, finite. */
static int parse_weight(const char *s, double *out) {
  char *end;
  double v;
  if (s[0] == '\0' || strspn(s, "0123456789.eE+-") != strlen(s))
    return -1;
  v = strtod(s, &end);
  if (*end != '\0' || !isfinite(v))
    return -1;
  *out = v;
  return 0;
}

static const char *flag_of_field(const char *field) {
  if (strcmp(field, "id") == 0)
    return "--id";
  if (strcmp(field, "url") == 0)
    return "--url";
  if (strcmp(field, "ttl_ms") == 0)
    return "--ttl";
  if (strcmp(field, "weight") == 0)
    return "--weight";
  if (strcmp(field, "zone") == 0)
    return "--zone";
  return "--meta";
}

/* The body of every PUT: {"url","ttl_ms","weight","zone","metadata"}. */
static char *registration_json(const om_instance_t *in) {
  json_t *o = json_object(), *meta = json_object();
  char *s = NULL;
  if (o == NULL || meta == NULL)
    goto out;
  for (size_t i = 0; i < in->n_metadata; i++)
    if (json_object_set_new(meta, in->metadata[i].key,
                            json_string(in->metadata[i].value)) != 0)
      goto out;
  if (json_object_set_new(o, "url", json_string(in->url)) != 0 ||
      json_object_set_new(o, "ttl_ms", json_integer((json_int_t)in->ttl_ms)) !=
          0 ||
      json_object_set_new(o, "weight",
                          in->weight == floor(in->weight)
                              ? json_integer((json_int_t)in->weight)
                              : json_real(in->weight)) != 0)
    goto out;
  if (in->zone != NULL &&
      json_object_set_new(o, "zone", json_string(in->zone)) != 0)
    goto out;
  if (json_object_set(o, "metadata", meta) != 0)
    goto out;
  s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
out:
  json_decref(meta);
  json_decref(o);
  return s;
}

/* ---- helpers ---- */

static uint64_t now_ms(reg_t *r) {
  return uv_now(&r->loop);
}

static uint64_t renew_interval_ms(reg_t *r) {
  uint64_t every = r->ttl_ms / 3;
  /* up to 10% early, so instances started together do not renew in step */
  return every - om_rng_below(&r->rng, (uint32_t)(every / 10 + 1));
}

static uint64_t backoff_ms(reg_t *r, uint32_t attempt) {
  uint64_t cap = r->ttl_ms / 3 < RETRY_CAP_MS ? r->ttl_ms / 3 : RETRY_CAP_MS;
  cap = cap > RETRY_FLOOR_MS ? cap - RETRY_FLOOR_MS : 0;
  return RETRY_FLOOR_MS + om_backoff_ns(attempt, RETRY_BASE_MS * 1000000ull,
                                        cap * 1000000ull, &r->rng) /
                              1000000u;
}

/* What the server asked for (Retry-After on 429/503), kept within
 * [floor, cap] so a hostile value neither hammers nor parks us. */
static uint64_t retry_delay_ms(reg_t *r, const om_curl_resp_t *resp) {
  uint64_t d = backoff_ms(r, r->attempt), ra;
  const char *h;
  if (resp != NULL && (resp->status == 429 || resp->status == 503) &&
      (h = om_curl_resp_header(resp, "retry-after")) != NULL &&
      om_retry_after_parse(h, strlen(h), (int64_t)time(NULL),
                           r->ttl_ms / 3 > RETRY_FLOOR_MS ? r->ttl_ms / 3
                                                          : RETRY_FLOOR_MS,
                           &ra) == 0)
    d = ra < RETRY_FLOOR_MS ? RETRY_FLOOR_MS : ra;
  return d;
}

static void start_request(reg_t *r, enum req_kind kind, uint64_t timeout_ms,
                          om_curl_resp_cb cb) {
  const char *headers[3];
  size_t nh = 0;
  om_curl_req_t req = {0};
  int rc;
  if (r->auth[0] != '\0')
    headers[nh++] = r->auth;
  if (kind == REQ_PUT)
    headers[nh++] = "Content-Type: application/json";
  req.method = kind == REQ_PUT ? "PUT" : "DELETE";
  req.url = r->instance_url;
  req.headers = headers;
  req.n_headers = nh;
  if (kind == REQ_PUT) {
    req.body = r->put_body;
    req.body_len = r->put_len;
  }
  req.timeout_ms = timeout_ms;
  req.max_body = 64 * 1024;
  req.tls = &r->tls;
  rc = om_curl_uv_request(r->cu, &req, cb, r, &r->inflight);
  if (rc != 0) {
    /* report it like a failed exchange: the caller retries */
    om_curl_resp_t resp = {.result = CURLE_OUT_OF_MEMORY,
                           .error = om_strerror(rc)};
    r->inflight = NULL;
    cb(r, &resp);
    return;
  }
}

static void fmt_u64(char *buf, size_t n, uint64_t v) {
  snprintf(buf, n, "%" PRIu64, v);
}

/* One log line per failed exchange. */
static void log_failure(reg_t *r, const char *event, om_log_level_t lvl,
                        const om_curl_resp_t *resp, uint64_t retry_ms) {
  char status[16], attempt[16], retry[24], body[201];
  snprintf(status, sizeof status, "%ld", resp->status);
  snprintf(attempt, sizeof attempt, "%" PRIu32, r->attempt);
  fmt_u64(retry, sizeof retry, retry_ms);
  body[0] = '\0';
  if (resp->body != NULL)
    snprintf(body, sizeof body, "%s", resp->body);
  om_log(lvl, event, "service", r->service, "id", r->id, "endpoint",
         r->instance_url, "status", resp->status ? status : NULL, "error",
         resp->result != CURLE_OK ? resp->error : NULL, "response",
         body[0] != '\0' ? body : NULL, "attempt", attempt, "retry_in_ms",
         retry, (char *)NULL);
}

/* ---- control planes ---- */

/* What says the plane is down rather than our request wrong: no answer
 * (connect failure, reset, timeout) or a 5xx. */
static int plane_failed(const om_curl_resp_t *resp) {
  return resp->result != CURLE_OK || resp->status >= 500;
}

/* A request kind starts a fresh round on the plane in use. */
static void new_round(reg_t *r) {
  r->round_left = r->n_planes > 0 ? r->n_planes - 1 : 0;
}

/* Whether a plane of this round is still untried after the one that just
 * failed: then the request goes there at once, without a backoff. */
static int round_open(const reg_t *r) {
  return r->n_planes > 1 && r->round_left > 0;
}

/*
 * After a failed exchange that plane_failed: move to the next plane
 * (round robin) when there are several, counting it against the round;
 * a round that is over starts again (the caller backs off first).
 */
static void fail_over(reg_t *r, const om_curl_resp_t *resp) {
  char status[16];
  const char *from = r->planes[r->plane];
  if (r->n_planes < 2)
    return;
  r->plane = (r->plane + 1) % r->n_planes;
  r->instance_url = r->instance_urls[r->plane];
  snprintf(status, sizeof status, "%ld", resp->status);
  om_log(OM_LOG_WARN, "control_failover", "service", r->service, "id", r->id,
         "from", from, "to", r->planes[r->plane], "status",
         resp->status ? status : NULL, "error",
         resp->result != CURLE_OK ? resp->error : NULL, (char *)NULL);
  if (r->round_left == 0)
    new_round(r);
  else
    r->round_left--;
}

/* ---- the lease ---- */

static void on_retry_timer(uv_timer_t *t) {
  reg_t *r = t->data;
  if (r->phase == RUN)
    send_put(r);
  else if (r->phase == DELETING) {
    /* a PUT that shutdown waited for took too long: cut it and move on */
    if (r->inflight != NULL) {
      om_curl_request_cancel(r->inflight);
      r->inflight = NULL;
    }
    send_delete(r);
  }
}

static void reread_token(reg_t *r) {
  char tok[TOKEN_MAX];
  const char *why;
  if (r->token_file == NULL)
    return;
  if (om_read_token_file(r->token_file, tok, sizeof tok, &why) == 0)
    snprintf(r->auth, sizeof r->auth, "Authorization: Bearer %s", tok);
  else
    om_log(OM_LOG_ERROR, "token_file_unreadable", "path", r->token_file,
           "error", why, (char *)NULL);
}

static void on_put_done(void *ud, om_curl_resp_t *resp) {
  reg_t *r = ud;
  uint64_t delay;
  r->inflight = NULL;
  if (r->phase == DELETING) { /* shutdown waited for this PUT */
    uv_timer_stop(&r->retry_timer);
    send_delete(r);
    return;
  }
  if (r->phase != RUN)
    return;
  if (resp->result == CURLE_OK && resp->status >= 200 && resp->status < 300) {
    if (!r->registered || r->attempt > 0 || r->plane != r->ok_plane) {
      char ttl[24];
      fmt_u64(ttl, sizeof ttl, r->ttl_ms);
      om_log(OM_LOG_INFO, "registered", "service", r->service, "id", r->id,
             "endpoint", r->instance_url, "control", r->planes[r->plane],
             "ttl_ms", ttl, (char *)NULL);
    }
    r->registered = 1;
    r->attempt = 0;
    r->ok_plane = r->plane;
    new_round(r);
    uv_timer_start(&r->retry_timer, on_retry_timer, renew_interval_ms(r), 0);
    return;
  }
  if (!plane_failed(resp)) {
    new_round(r); /* the plane answered: the problem is not the plane */
  } else if (round_open(r)) {
    log_failure(r, "register_failed", OM_LOG_WARN, resp, 0);
    fail_over(r, resp);
    send_put(r);
    return;
  }
  r->attempt++;
  delay = retry_delay_ms(r, resp);
  if (resp->result == CURLE_OK && resp->status == 404) {
    /* the control plane lost the lease (expired, or it restarted): the
     * next PUT registers again */
    r->registered = 0;
    log_failure(r, "lease_lost", OM_LOG_WARN, resp, delay);
  } else if (resp->result == CURLE_OK &&
             (resp->status == 401 || resp->status == 403)) {
    log_failure(r, "register_failed", OM_LOG_ERROR, resp, delay);
    reread_token(r);
  } else if (resp->result == CURLE_OK && resp->status >= 400 &&
             resp->status < 500 && resp->status != 408 && resp->status != 429) {
    /* our registration was refused: keep trying (the operator may fix
     * the control plane), loudly */
    log_failure(r, "register_failed", OM_LOG_ERROR, resp, delay);
  } else {
    log_failure(r, "register_failed", OM_LOG_WARN, resp, delay);
  }
  if (plane_failed(resp))
    fail_over(r, resp); /* the round failed: the next plane, after the wait */
  uv_timer_start(&r->retry_timer, on_retry_timer, delay, 0);
}

static void send_put(reg_t *r) {
  uint64_t timeout = r->ttl_ms / 3;
  if (timeout < 500)
    timeout = 500;
  if (timeout > 10000)
    timeout = 10000;
  start_request(r, REQ_PUT, timeout, on_put_done);
}

static void on_delete_done(void *ud, om_curl_resp_t *resp) {
  reg_t *r = ud;
  uint64_t delay, left;
  r->inflight = NULL;
  if (r->phase != DELETING)
    return;
  if (resp->result == CURLE_OK &&
      ((resp->status >= 200 && resp->status < 300) || resp->status == 404)) {
    om_log(OM_LOG_INFO, "deregistered", "service", r->service, "id", r->id,
           "endpoint", r->instance_url, (char *)NULL);
    after_delete(r);
    return;
  }
  if (plane_failed(resp) && round_open(r)) {
    log_failure(r, "deregister_failed", OM_LOG_WARN, resp, 0);
    fail_over(r, resp);
    send_delete(r);
    return;
  }
  r->attempt++;
  delay = retry_delay_ms(r, resp);
  left = r->delete_deadline > now_ms(r) ? r->delete_deadline - now_ms(r) : 0;
  log_failure(r, "deregister_failed", OM_LOG_WARN, resp,
              delay < left ? delay : 0);
  if (delay >= left) {
    after_delete(r);
    return;
  }
  if (plane_failed(resp))
    fail_over(r, resp);
  uv_timer_start(&r->retry_timer, on_retry_timer, delay, 0);
}

/* The budget is shared by the planes left in the round, so one plane that
 * hangs cannot take all of it from the others. */
static void send_delete(reg_t *r) {
  uint64_t now = now_ms(r);
  uint64_t left = r->delete_deadline > now ? r->delete_deadline - now : 1;
  if (r->n_planes > 1 && left / (r->round_left + 1) >= 100)
    left /= r->round_left + 1;
  start_request(r, REQ_DELETE, left, on_delete_done);
}

/* ---- shutdown ---- */

static void handle_closed(uv_handle_t *h) {
  (void)h;
}

static void finish(reg_t *r) {
  if (r->phase == DONE)
    return;
  r->phase = DONE;
  if (r->inflight != NULL) {
    om_curl_request_cancel(r->inflight);
    r->inflight = NULL;
  }
  if (r->has_child)
    r->exit_code = r->child_status;
  uv_close((uv_handle_t *)&r->retry_timer, handle_closed);
  uv_close((uv_handle_t *)&r->phase_timer, handle_closed);
  uv_close((uv_handle_t *)&r->sigterm, handle_closed);
  uv_close((uv_handle_t *)&r->sigint, handle_closed);
  om_curl_uv_close(r->cu, NULL, NULL);
  r->cu = NULL;
}

static void on_kill_timer(uv_timer_t *t) {
  reg_t *r = t->data;
  if (!r->child_running || r->killed)
    return;
  om_log(OM_LOG_WARN, "cmd_killed", "service", r->service, "id", r->id,
         "reason", "did not exit after SIGTERM", (char *)NULL);
  r->killed = 1;
  uv_process_kill(&r->proc, SIGKILL);
}

static void stop_child(reg_t *r) {
  r->phase = STOPPING;
  uv_timer_stop(&r->phase_timer);
  if (!r->child_running) {
    finish(r);
    return;
  }
  uv_process_kill(&r->proc, SIGTERM);
  uv_timer_start(&r->phase_timer, on_kill_timer, KILL_GRACE_MS, 0);
}

static void on_drain_timer(uv_timer_t *t) {
  stop_child(t->data);
}

static void after_delete(reg_t *r) {
  uv_timer_stop(&r->phase_timer);
  uv_timer_stop(&r->retry_timer);
  if (r->inflight != NULL) {
    om_curl_request_cancel(r->inflight);
    r->inflight = NULL;
  }
  if (!r->child_running) { /* nothing to drain or to stop */
    finish(r);
    return;
  }
  r->phase = DRAINING;
  if (r->drain_ms == 0) {
    stop_child(r);
    return;
  }
  uv_timer_start(&r->phase_timer, on_drain_timer, r->drain_ms, 0);
}

static void on_delete_budget(uv_timer_t *t) {
  reg_t *r = t->data;
  om_log(OM_LOG_WARN, "deregister_gave_up", "service", r->service, "id", r->id,
         "endpoint", r->instance_url, "reason",
         "no answer within 2 s; continuing the shutdown", (char *)NULL);
  after_delete(r);
}

static void begin_shutdown(reg_t *r) {
  r->phase = DELETING;
  r->attempt = 0;
  new_round(r);
  r->delete_deadline = now_ms(r) + DELETE_BUDGET_MS;
  uv_timer_stop(&r->retry_timer);
  uv_timer_start(&r->phase_timer, on_delete_budget, DELETE_BUDGET_MS, 0);
  /* A PUT in flight is let finish (for half the budget at most), so it
   * cannot reach the control plane after our DELETE and revive the lease. */
  if (r->inflight == NULL)
    send_delete(r);
  else
    uv_timer_start(&r->retry_timer, on_retry_timer, DELETE_BUDGET_MS / 2, 0);
}

static void on_signal(uv_signal_t *s, int signum) {
  reg_t *r = s->data;
  om_log(OM_LOG_INFO, "shutdown_signal", "service", r->service, "id", r->id,
         "signal", signum == SIGTERM ? "SIGTERM" : "SIGINT", (char *)NULL);
  switch (r->phase) {
  case RUN:
    begin_shutdown(r);
    break;
  case DELETING:
    after_delete(r);
    break;
  case DRAINING:
    stop_child(r);
    break;
  case STOPPING:
    if (r->child_running && !r->killed) {
      r->killed = 1;
      uv_process_kill(&r->proc, SIGKILL);
    }
    break;
  case DONE:
    break;
  }
}

static void on_child_exit(uv_process_t *p, int64_t status, int term_signal) {
  reg_t *r = p->data;
  char st[24];
  r->child_running = 0;
  r->child_status = term_signal != 0 ? 128 + term_signal : (int)status;
  snprintf(st, sizeof st, "%d", r->child_status);
  om_log(OM_LOG_INFO, "cmd_exited", "service", r->service, "id", r->id,
         "status", st, (char *)NULL);
  uv_close((uv_handle_t *)p, handle_closed);
  switch (r->phase) {
  case RUN:
    begin_shutdown(r);
    break;
  case DRAINING:
  case STOPPING:
    uv_timer_stop(&r->phase_timer);
    finish(r);
    break;
  case DELETING: /* after_delete sees the child gone and skips the drain */
  case DONE:
    break;
  }
}

static int spawn_child(reg_t *r, char **cmd) {
  uv_process_options_t o;
  uv_stdio_container_t stdio[3];
  int rc;
  memset(&o, 0, sizeof o);
  for (int i = 0; i < 3; i++) {
    stdio[i].flags = UV_INHERIT_FD;
    stdio[i].data.fd = i;
  }
  o.file = cmd[0];
  o.args = cmd;
  o.exit_cb = on_child_exit;
  o.stdio = stdio;
  o.stdio_count = 3;
  rc = uv_spawn(&r->loop, &r->proc, &o);
  if (rc != 0) {
    uv_close((uv_handle_t *)&r->proc, handle_closed);
    fprintf(stderr, "openmesh register: cannot run '%s': %s\n", cmd[0],
            uv_strerror(rc));
    return rc == UV_ENOENT ? 127 : rc == UV_EACCES ? 126 : OM_EXIT_FAILURE;
  }
  r->proc.data = r;
  r->has_child = 1;
  r->child_running = 1;
  return 0;
}

/* ---- entry ---- */

typedef struct flags_s {
  om_cli_controls_t control;
  const char *service, *id, *url, *ttl, *weight, *zone;
  const char *token_file, *drain;
  om_cli_control_tls_t tls;
  char **meta;
  size_t n_meta;
} flags_t;

/* Check every flag, build the instance and the URLs. Returns 0 or an exit
 * code (2) after printing a message naming the flag. */
static int configure(reg_t *r, const flags_t *f, om_kv_t *kv) {
  om_instance_t in;
  const char *field, *why;
  uint64_t ttl_ms;
  double weight = 1.0;
  size_t clen;
  int rc;
  if (f->control.n == 0)
    return bad("--control", "is required");
  if (f->service == NULL)
    return bad("--service", "is required");
  if (f->id == NULL)
    return bad("--id", "is required");
  if (f->url == NULL)
    return bad("--url", "is required");
  if (f->ttl == NULL)
    return bad("--ttl", "is required");
  /* each control URL was checked as it was read (om_cli_controls_add) */
  if (!om_valid_name(f->service, strlen(f->service)))
    return bad("--service", "must be 1 to 128 characters of "
                            "[A-Za-z0-9._-] (not \".\" or \"..\")");
  if (!om_valid_name(f->id, strlen(f->id)))
    return bad("--id", "must be 1 to 128 characters of [A-Za-z0-9._-] "
                       "(not \".\" or \"..\")");
  rc = om_parse_duration_ms(f->ttl, &ttl_ms);
  if (rc != 0)
    return bad("--ttl", rc == OM_ERANGE
                            ? "is out of range"
                            : "must be digits and a unit: 500ms, 10s, 2m, 1h");
  if (ttl_ms < OM_TTL_MIN_MS || ttl_ms > OM_TTL_MAX_MS)
    return bad("--ttl", "must be between 1s and 1h");
  r->drain_ms = DEFAULT_DRAIN_MS;
  if (f->drain != NULL && om_parse_duration_ms(f->drain, &r->drain_ms) != 0)
    return bad("--drain", "must be 0 or digits and a unit: 500ms, 5s, 1m");
  if (f->weight != NULL && (parse_weight(f->weight, &weight) != 0 ||
                            !(weight > 0) || weight > OM_WEIGHT_MAX))
    return bad("--weight", "must be a number in (0, 10000]");
  for (size_t i = 0; i < f->n_meta; i++) {
    char *eq = strchr(f->meta[i], '=');
    if (eq == NULL || eq == f->meta[i])
      return bad("--meta", "must be KEY=VALUE with a non-empty KEY");
    *eq = '\0'; /* argv is ours to split */
    kv[i].key = f->meta[i];
    kv[i].value = eq + 1;
    for (size_t j = 0; j < i; j++)
      if (strcmp(kv[j].key, kv[i].key) == 0) {
        fprintf(stderr,
                "openmesh register: --meta: key '%s' given twice (see "
                "--help)\n",
                kv[i].key);
        return OM_EXIT_USAGE;
      }
  }
  memset(&in, 0, sizeof in);
  in.id = (char *)f->id;
  in.url = (char *)f->url;
  in.zone = (char *)f->zone;
  in.weight = weight;
  in.ttl_ms = ttl_ms;
  in.metadata = kv;
  in.n_metadata = f->n_meta;
  if (om_instance_validate(&in, &field, &why) != 0)
    return bad(flag_of_field(field), why);
  r->ttl_ms = ttl_ms;
  r->service = f->service;
  r->id = f->id;
  rc = om_cli_control_tls_check("register", &f->tls, &r->tls);
  if (rc != OM_EXIT_OK)
    return rc;
  if (f->token_file != NULL) {
    char tok[TOKEN_MAX];
    if (om_read_token_file(f->token_file, tok, sizeof tok, &why) != 0) {
      fprintf(stderr, "openmesh register: --token-file: '%s' %s\n",
              f->token_file, why);
      return OM_EXIT_USAGE;
    }
    snprintf(r->auth, sizeof r->auth, "Authorization: Bearer %s", tok);
    r->token_file = f->token_file;
  }
  for (size_t i = 0; i < f->control.n; i++) {
    const char *control = f->control.urls[i];
    clen = strlen(control);
    while (clen > 0 && control[clen - 1] == '/')
      clen--;
    r->instance_urls[i] =
        malloc(clen + strlen(f->service) + strlen(f->id) + 32);
    if (r->instance_urls[i] == NULL)
      break;
    r->planes[i] = control;
    r->n_planes = i + 1;
    sprintf(r->instance_urls[i], "%.*s/v1/services/%s/instances/%s", (int)clen,
            control, f->service, f->id);
  }
  r->put_body = registration_json(&in);
  if (r->n_planes < f->control.n || r->put_body == NULL) {
    fprintf(stderr, "openmesh register: out of memory\n");
    return OM_EXIT_FAILURE;
  }
  r->instance_url = r->instance_urls[0];
  new_round(r);
  r->put_len = strlen(r->put_body);
  return 0;
}

static int run(reg_t *r, char **cmd) {
  int rc;
  if (uv_loop_init(&r->loop) != 0) {
    fprintf(stderr, "openmesh register: cannot create the event loop\n");
    return OM_EXIT_FAILURE;
  }
  if (om_curl_uv_new(&r->loop, &r->cu) != 0) {
    fprintf(stderr, "openmesh register: cannot initialise libcurl\n");
    uv_loop_close(&r->loop);
    return OM_EXIT_FAILURE;
  }
  om_rng_seed(&r->rng, uv_hrtime() ^ ((uint64_t)getpid() << 32));
  uv_timer_init(&r->loop, &r->retry_timer);
  uv_timer_init(&r->loop, &r->phase_timer);
  uv_signal_init(&r->loop, &r->sigterm);
  uv_signal_init(&r->loop, &r->sigint);
  r->retry_timer.data = r->phase_timer.data = r;
  r->sigterm.data = r->sigint.data = r;
  uv_signal_start(&r->sigterm, on_signal, SIGTERM);
  uv_signal_start(&r->sigint, on_signal, SIGINT);
  r->phase = RUN;
  rc = cmd != NULL ? spawn_child(r, cmd) : 0;
  if (rc != 0) {
    r->exit_code = rc;
    r->phase = DONE;
    uv_close((uv_handle_t *)&r->retry_timer, handle_closed);
    uv_close((uv_handle_t *)&r->phase_timer, handle_closed);
    uv_close((uv_handle_t *)&r->sigterm, handle_closed);
    uv_close((uv_handle_t *)&r->sigint, handle_closed);
    om_curl_uv_close(r->cu, NULL, NULL);
  } else {
    send_put(r);
  }
  uv_run(&r->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&r->loop) != 0)
    fprintf(stderr, "openmesh register: event loop closed with handles\n");
  return r->exit_code;
}

int om_cmd_register(int argc, char **argv) {
  static const struct option longopts[] = {
      {"control", required_argument, NULL, 'c'},
      {"service", required_argument, NULL, 's'},
      {"id", required_argument, NULL, 'i'},
      {"url", required_argument, NULL, 'u'},
      {"ttl", required_argument, NULL, 't'},
      {"weight", required_argument, NULL, 'w'},
      {"zone", required_argument, NULL, 'z'},
      {"meta", required_argument, NULL, 'm'},
      {"token-file", required_argument, NULL, 'T'},
      {"drain", required_argument, NULL, 'd'},
      {"help", no_argument, NULL, 'h'},
      OM_CLI_CONTROL_TLS_LONGOPTS,
      {NULL, 0, NULL, 0}};
  flags_t f;
  reg_t *r;
  om_kv_t *kv;
  char **cmd = NULL;
  int c, rc, li;
  memset(&f, 0, sizeof f);
  f.meta = calloc((size_t)argc + 1, sizeof *f.meta);
  kv = calloc((size_t)argc + 1, sizeof *kv);
  r = calloc(1, sizeof *r);
  if (f.meta == NULL || kv == NULL || r == NULL) {
    free(f.meta);
    free(kv);
    free(r);
    fprintf(stderr, "openmesh register: out of memory\n");
    return OM_EXIT_FAILURE;
  }
  optind = 1;
  opterr = 0;
  /* '+': stop at the first non-flag, which starts CMD; ':': report a
   * missing value apart from an unknown flag */
  while ((li = -1, c = getopt_long(argc, argv, "+:h", longopts, &li)) != -1) {
    const char **slot = NULL;
    switch (c) {
    case 'c':
      rc = om_cli_controls_add("register", &f.control, optarg);
      if (rc != OM_EXIT_OK)
        goto out;
      break;
    case 's':
      slot = &f.service;
      break;
    case 'i':
      slot = &f.id;
      break;
    case 'u':
      slot = &f.url;
      break;
    case 't':
      slot = &f.ttl;
      break;
    case 'w':
      slot = &f.weight;
      break;
    case 'z':
      slot = &f.zone;
      break;
    case 'T':
      slot = &f.token_file;
      break;
    case 'd':
      slot = &f.drain;
      break;
    case 'm':
      f.meta[f.n_meta++] = optarg;
      break;
    case OM_CLI_OPT_CONTROL_CA:
      slot = &f.tls.ca;
      break;
    case OM_CLI_OPT_CONTROL_CERT:
      slot = &f.tls.cert;
      break;
    case OM_CLI_OPT_CONTROL_KEY:
      slot = &f.tls.key;
      break;
    case 'h':
      usage(stdout);
      rc = OM_EXIT_OK;
      goto out;
    case ':':
      fprintf(stderr, "openmesh register: %s: needs a value (see --help)\n",
              argv[optind - 1]);
      rc = OM_EXIT_USAGE;
      goto out;
    default:
      fprintf(stderr, "openmesh register: %s: unknown flag (see --help)\n",
              argv[optind - 1]);
      rc = OM_EXIT_USAGE;
      goto out;
    }
    if (slot != NULL) {
      if (*slot != NULL) {
        fprintf(stderr, "openmesh register: --%s: given twice (see --help)\n",
                longopts[li].name);
        rc = OM_EXIT_USAGE;
        goto out;
      }
      *slot = optarg;
    }
  }
  if (optind < argc)
    cmd = argv + optind; /* argv[argc] is NULL, as execvp wants */
  rc = configure(r, &f, kv);
  if (rc != 0)
    goto out;
  /* a peer reset must not kill us; CMD gets default dispositions back
   * (libuv resets them in the child) */
  signal(SIGPIPE, SIG_IGN);
  rc = run(r, cmd);
out:
  for (size_t i = 0; i < r->n_planes; i++)
    free(r->instance_urls[i]);
  free(r->put_body);
  free(r);
  free(kv);
  free(f.meta);
  return rc;
}
