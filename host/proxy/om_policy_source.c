/* om_policy_source.c: see om_policy_source.h. */
#include "om_policy_source.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "om_errno.h"
#include "om_log.h"
#include "om_policy_watch.h"
#include "om_snapshot.h"
#include "om_watch.h"

#define REASON_MAX 1024
#define MAX_FILE_BYTES ((size_t)4 << 20) /* as the control plane's body cap */
#define REPORT_TIMEOUT_MS 5000u

struct om_policy_source_s {
  uv_loop_t *loop;
  om_curl_uv_t *cu;
  char *name, *spec, *dir, *path, *id, *lib_dir;
  char *auth_line; /* "Authorization: Bearer ..." or NULL */
  char address[256];
  char **bases;
  size_t n_planes;
  const om_curl_tls_t *tls;
  om_policy_opts_t policy;
  om_policy_kind_t kind;
  int private_dir;
  om_watch_t *watch;
  void (*on_update)(void *ud);
  void *ud;

  uint64_t applied, refused;
  char reason[REASON_MAX];
  int from_cache;

  /* reports */
  uv_timer_t report_timer;
  int timer_open;
  om_curl_request_t *rq;
  int dirty; /* a verdict changed while a report was out */
  uint64_t interval_ms, sent, failed;
  uint32_t attempt;
  long last_status;
  char report_error[256];

  /* the first fetch */
  int fetch_done;
  long fetch_status;
  char *fetch_body;
  size_t fetch_len;
  uint64_t fetch_rev;
  char fetch_ctype[64];
  char fetch_error[256];

  struct {
    om_metric_t *applied, *refused, *sent, *failed;
  } m;
  uint64_t n_applied, n_refused; /* what the metrics carry */

  int closing, watch_open;
  void (*done)(void *ud);
  void *done_ud;
};

int om_policy_source_is_control(const char *spec, const char **name) {
  if (spec == NULL || strncmp(spec, "control:", 8) != 0)
    return 0;
  *name = spec + 8;
  return 1;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  return d != NULL ? memcpy(d, s, n) : NULL;
}

static char *join(const char *a, const char *b, const char *c) {
  size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
  char *d = malloc(n);
  if (d != NULL)
    snprintf(d, n, "%s%s%s", a, b, c);
  return d;
}

static void source_free(om_policy_source_t *s) {
  if (s == NULL)
    return;
  if (s->private_dir && s->dir != NULL) {
    if (s->path != NULL)
      unlink(s->path);
    rmdir(s->dir);
  }
  for (size_t i = 0; s->bases != NULL && i < s->n_planes; i++)
    free(s->bases[i]);
  free(s->bases);
  free(s->name);
  free(s->spec);
  free(s->dir);
  free(s->path);
  free(s->id);
  free(s->lib_dir);
  free(s->auth_line);
  free(s->fetch_body);
  free(s);
}

/* ------------------------------------------------------------------ */
/* judging and writing a revision */

/* body + the trailer line: what the file holds and what is judged. */
static char *with_trailer(const om_policy_source_t *s, uint64_t rev,
                          const char *body, size_t len, size_t *out_len) {
  char trailer[OM_NAME_MAX + 96];
  int nl = len > 0 && body[len - 1] != '\n';
  int k = snprintf(trailer, sizeof trailer, "%s%s revision %" PRIu64 "\n",
                   OM_POLICY_TRAILER, s->spec, rev);
  char *d = malloc(len + (size_t)nl + (size_t)k + 1);
  if (d == NULL)
    return NULL;
  memcpy(d, body, len);
  if (nl)
    d[len] = '\n';
  memcpy(d + len + (size_t)nl, trailer, (size_t)k + 1);
  *out_len = len + (size_t)nl + (size_t)k;
  return d;
}

/* Load src in this runtime, as a reload of the file would. */
static int judge(om_policy_source_t *s, const char *src, size_t len, char *err,
                 size_t errlen) {
  om_policy_t *p = NULL;
  int rc = om_policy_load(&s->policy, s->spec, src, len, &p, err, errlen);
  if (rc == 0 && s->kind != 0 && om_policy_kind(p) != s->kind) {
    snprintf(err, errlen, "%s: field 'kind': expected '%s', got '%s'", s->spec,
             om_policy_kind_name(s->kind),
             om_policy_kind_name(om_policy_kind(p)));
    rc = OM_EPOLICY;
  }
  om_policy_free(p);
  return rc;
}

/* Atomically replace the file: a temporary file beside it, fsync, rename. */
static int write_file(om_policy_source_t *s, const char *data, size_t len,
                      char *err, size_t errlen) {
  char tmp[4096];
  size_t off = 0;
  int fd;
  snprintf(tmp, sizeof tmp, "%s/.%s.lua.%ld.tmp", s->dir, s->name,
           (long)getpid());
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    snprintf(err, errlen, "%.900s: %s", tmp, strerror(errno));
    return OM_EIO;
  }
  while (off < len) {
    ssize_t n = write(fd, data + off, len - off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      snprintf(err, errlen, "%.900s: %s", tmp, strerror(errno));
      close(fd);
      unlink(tmp);
      return OM_EIO;
    }
    off += (size_t)n;
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    snprintf(err, errlen, "%.900s: %s", tmp, strerror(errno));
    unlink(tmp);
    return OM_EIO;
  }
  if (rename(tmp, s->path) != 0) {
    snprintf(err, errlen, "%.900s: %s", s->path, strerror(errno));
    unlink(tmp);
    return OM_EIO;
  }
  return 0;
}

static void schedule_report(om_policy_source_t *s, uint64_t delay_ms);

static void count(om_metric_t *m) {
  om_metric_inc(m);
}

/*
 * One revision from the plane: judged, then written or refused. 0 when it
 * is now the file's; else the code, with the reason kept for reports.
 */
static int take(om_policy_source_t *s, uint64_t rev, const char *body,
                size_t len) {
  char err[REASON_MAX], r[24], kept[24];
  size_t clen = 0;
  char *content = with_trailer(s, rev, body, len, &clen);
  int rc;
  snprintf(r, sizeof r, "%" PRIu64, rev);
  if (content == NULL)
    return OM_ENOMEM;
  err[0] = '\0';
  rc = judge(s, content, clen, err, sizeof err);
  if (rc == 0)
    rc = write_file(s, content, clen, err, sizeof err);
  free(content);
  if (rc == OM_ENOMEM)
    return rc;
  if (rc != 0) {
    s->refused = rev;
    snprintf(s->reason, sizeof s->reason, "%s", err);
    s->n_refused++;
    count(s->m.refused);
    om_log(OM_LOG_ERROR, "policy_refused", "source", s->spec, "revision", r,
           "error", err, "kept_revision",
           s->applied != 0
               ? (snprintf(kept, sizeof kept, "%" PRIu64, s->applied), kept)
               : NULL,
           NULL);
    return rc;
  }
  s->applied = rev;
  s->from_cache = 0;
  if (s->refused != 0 && s->refused <= rev) {
    s->refused = 0;
    s->reason[0] = '\0';
  }
  s->n_applied++;
  count(s->m.applied);
  om_log(OM_LOG_INFO, "policy_applied", "source", s->spec, "revision", r,
         "path", s->path, NULL);
  return 0;
}

/* ------------------------------------------------------------------ */
/* reports */

static void on_report_timer(uv_timer_t *t);

static void schedule_report(om_policy_source_t *s, uint64_t delay_ms) {
  if (s->closing || !s->timer_open)
    return;
  uv_timer_start(&s->report_timer, on_report_timer, delay_ms, 0);
}

static const char *plane_in_use(const om_policy_source_t *s) {
  const char *u = s->watch != NULL ? om_watch_control_url(s->watch) : NULL;
  return u != NULL ? u : s->bases[0];
}

static void on_report_done(void *ud, om_curl_resp_t *resp) {
  om_policy_source_t *s = ud;
  uint64_t delay = s->interval_ms;
  s->rq = NULL;
  s->last_status = resp->status;
  if (resp->result == CURLE_OK && resp->status == 200) {
    s->sent++;
    count(s->m.sent);
    s->attempt = 0;
    s->report_error[0] = '\0';
  } else {
    char st[24], msg[sizeof s->report_error];
    s->failed++;
    count(s->m.failed);
    if (resp->result != CURLE_OK)
      snprintf(msg, sizeof msg, "%s", resp->error);
    else
      snprintf(msg, sizeof msg, "HTTP %ld: %.160s", resp->status,
               resp->body != NULL ? resp->body : "");
    /* logged when the problem changes, not at every retry */
    if (strcmp(msg, s->report_error) != 0) {
      snprintf(st, sizeof st, "%ld", resp->status);
      om_log(OM_LOG_WARN, "policy_report_failed", "source", s->spec, "control",
             plane_in_use(s), "status", resp->status ? st : NULL, "error", msg,
             NULL);
    }
    snprintf(s->report_error, sizeof s->report_error, "%s", msg);
    if (s->attempt < 16)
      s->attempt++;
    delay = (uint64_t)500 << (s->attempt > 6 ? 6 : s->attempt);
    if (delay > s->interval_ms)
      delay = s->interval_ms;
  }
  if (s->dirty) {
    s->dirty = 0;
    delay = 0;
  }
  /* never a new request from here: the timer starts it from the loop */
  schedule_report(s, delay);
}

static void send_report(om_policy_source_t *s) {
  om_curl_req_t req;
  const char *headers[2];
  size_t nh = 0;
  json_t *o;
  char *body, *url;
  if (s->closing)
    return;
  if (s->rq != NULL) {
    s->dirty = 1;
    return;
  }
  o = json_pack(
      "{s:s, s:s?, s:o, s:o, s:s?}", "id", s->id, "address",
      s->address[0] != '\0' ? s->address : NULL, "applied",
      s->applied != 0 ? json_integer((json_int_t)s->applied) : json_null(),
      "refused",
      s->refused != 0 ? json_integer((json_int_t)s->refused) : json_null(),
      "reason", s->refused != 0 ? s->reason : NULL);
  body = o != NULL ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  url = join(plane_in_use(s), "/v1/config/", s->name);
  if (body == NULL || url == NULL) {
    free(body);
    free(url);
    schedule_report(s, 1000);
    return;
  }
  {
    char *full = join(url, "/status", "");
    free(url);
    url = full;
  }
  headers[nh++] = "Content-Type: application/json";
  if (s->auth_line != NULL)
    headers[nh++] = s->auth_line;
  memset(&req, 0, sizeof req);
  req.method = "POST";
  req.url = url;
  req.headers = headers;
  req.n_headers = nh;
  req.body = body;
  req.body_len = strlen(body);
  req.timeout_ms = REPORT_TIMEOUT_MS;
  req.max_body = 64 * 1024;
  req.tls = s->tls;
  if (url == NULL ||
      om_curl_uv_request(s->cu, &req, on_report_done, s, &s->rq) != 0) {
    s->rq = NULL;
    schedule_report(s, 1000);
  }
  free(body);
  free(url);
}

static void on_report_timer(uv_timer_t *t) {
  send_report(t->data);
}

/* ------------------------------------------------------------------ */
/* the watch */

static void on_document(void *ud, uint64_t revision, const char *data,
                        size_t len) {
  om_policy_source_t *s = ud;
  if (s->closing || revision == s->applied)
    return;
  if (take(s, revision, data, len) == 0 && s->on_update != NULL)
    s->on_update(s->ud);
  schedule_report(s, 0);
}

/* ------------------------------------------------------------------ */
/* the first fetch */

static void on_fetch(void *ud, om_curl_resp_t *resp) {
  om_policy_source_t *s = ud;
  const char *rev = om_curl_resp_header(resp, "openmesh-revision");
  const char *ct = om_curl_resp_header(resp, "content-type");
  s->fetch_done = 1;
  s->fetch_status = resp->result == CURLE_OK ? resp->status : 0;
  snprintf(s->fetch_error, sizeof s->fetch_error, "%s",
           resp->result != CURLE_OK ? resp->error : "");
  snprintf(s->fetch_ctype, sizeof s->fetch_ctype, "%s", ct != NULL ? ct : "");
  s->fetch_rev = rev != NULL ? strtoull(rev, NULL, 10) : 0;
  free(s->fetch_body);
  s->fetch_body = resp->body;
  s->fetch_len = resp->body_len;
  resp->body = NULL;
}

/* GET the document from one plane, running the loop until the answer. */
static int fetch_one(om_policy_source_t *s, const char *base,
                     uint64_t timeout_ms) {
  om_curl_req_t req;
  const char *headers[1];
  char *url = join(base, "/v1/config/", s->name);
  int rc;
  if (url == NULL)
    return OM_ENOMEM;
  memset(&req, 0, sizeof req);
  req.url = url;
  if (s->auth_line != NULL) {
    headers[0] = s->auth_line;
    req.headers = headers;
    req.n_headers = 1;
  }
  req.timeout_ms = timeout_ms;
  req.max_body = MAX_FILE_BYTES;
  req.tls = s->tls;
  s->fetch_done = 0;
  rc = om_curl_uv_request(s->cu, &req, on_fetch, s, NULL);
  free(url);
  if (rc != 0)
    return rc;
  while (!s->fetch_done)
    uv_run(s->loop, UV_RUN_ONCE);
  return 0;
}

/* Read the cached file; 0 with its revision when valid. */
static int from_cache(om_policy_source_t *s, char *err, size_t errlen) {
  FILE *f = fopen(s->path, "rb");
  char *buf = NULL, src[OM_NAME_MAX + 16];
  size_t n = 0;
  uint64_t rev = 0;
  int rc;
  if (f == NULL) {
    snprintf(err, errlen, "no cached copy at %s", s->path);
    return OM_ENOTFOUND;
  }
  buf = malloc(MAX_FILE_BYTES + 1);
  if (buf != NULL)
    n = fread(buf, 1, MAX_FILE_BYTES + 1, f);
  fclose(f);
  if (buf == NULL)
    return OM_ENOMEM;
  if (n > MAX_FILE_BYTES ||
      om_policy_trailer_parse(buf, n, src, sizeof src, &rev) != 0 ||
      strcmp(src, s->spec) != 0) {
    snprintf(err, errlen, "%s: not a cached copy of %s (no trailer line)",
             s->path, s->spec);
    free(buf);
    return OM_EPOLICY;
  }
  rc = judge(s, buf, n, err, errlen);
  free(buf);
  if (rc != 0)
    return rc;
  s->applied = rev;
  s->from_cache = 1;
  return 0;
}

static int make_dir(om_policy_source_t *s, const char *cache_dir, char *err,
                    size_t errlen) {
  if (cache_dir != NULL) {
    if (mkdir(cache_dir, 0755) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "--policy-cache %s: %s", cache_dir,
               strerror(errno));
      return OM_EIO;
    }
    s->dir = dup_str(cache_dir);
  } else {
    const char *tmp = getenv("TMPDIR");
    char *t = join(tmp != NULL && *tmp != '\0' ? tmp : "/tmp",
                   "/openmesh-policy-", "XXXXXX");
    if (t == NULL)
      return OM_ENOMEM;
    if (mkdtemp(t) == NULL) {
      snprintf(err, errlen, "%s: %s", t, strerror(errno));
      free(t);
      return OM_EIO;
    }
    s->dir = t;
    s->private_dir = 1;
  }
  if (s->dir == NULL)
    return OM_ENOMEM;
  s->path = join(s->dir, "/", s->name);
  if (s->path != NULL) {
    char *p = join(s->path, ".lua", "");
    free(s->path);
    s->path = p;
  }
  return s->path != NULL ? 0 : OM_ENOMEM;
}

static void register_metrics(om_policy_source_t *s, om_metrics_t *r) {
  if (r == NULL)
    return;
  s->m.applied = om_metrics_counter(
      r, "openmesh_proxy_policy_updates_total",
      "Policy revisions from a source, applied or refused by this proxy",
      "source=\"control\",result=\"applied\"");
  s->m.refused = om_metrics_counter(
      r, "openmesh_proxy_policy_updates_total",
      "Policy revisions from a source, applied or refused by this proxy",
      "source=\"control\",result=\"refused\"");
  s->m.sent = om_metrics_counter(
      r, "openmesh_proxy_policy_reports_total",
      "Policy verdicts reported to the control plane, sent or failed",
      "result=\"sent\"");
  s->m.failed = om_metrics_counter(
      r, "openmesh_proxy_policy_reports_total",
      "Policy verdicts reported to the control plane, sent or failed",
      "result=\"failed\"");
}

/* The first revision: from a plane, else the cache. */
static int first_revision(om_policy_source_t *s, uint64_t timeout_ms, char *err,
                          size_t errlen) {
  char why[REASON_MAX], cerr[REASON_MAX], r[24];
  int rc = OM_EIO;
  snprintf(why, sizeof why, "no control plane answered");
  for (size_t i = 0; i < s->n_planes; i++) {
    if ((rc = fetch_one(s, s->bases[i], timeout_ms)) != 0)
      return rc;
    if (s->fetch_status == 200 && s->fetch_rev != 0) {
      if (strncmp(s->fetch_ctype, "text/x-lua", 10) != 0) {
        s->refused = s->fetch_rev;
        snprintf(s->reason, sizeof s->reason,
                 "%s: the document is '%s', not a policy (text/x-lua)", s->spec,
                 s->fetch_ctype);
        s->n_refused++;
        count(s->m.refused);
        snprintf(why, sizeof why, "%s", s->reason);
        rc = OM_EPOLICY;
        break;
      }
      rc = take(s, s->fetch_rev, s->fetch_body != NULL ? s->fetch_body : "",
                s->fetch_len);
      if (rc == 0 || rc == OM_ENOMEM)
        return rc;
      snprintf(why, sizeof why, "%s", s->reason);
      rc = OM_EPOLICY;
      break;
    }
    if (s->fetch_status == 404) {
      snprintf(why, sizeof why, "%s has no document '%s'", s->bases[i],
               s->name);
      rc = OM_ENOTFOUND;
      break;
    }
    if (s->fetch_status != 0)
      snprintf(why, sizeof why, "%s answered %ld", s->bases[i],
               s->fetch_status);
    else
      snprintf(why, sizeof why, "%s: %s", s->bases[i], s->fetch_error);
    rc = OM_EIO;
  }
  free(s->fetch_body);
  s->fetch_body = NULL;
  if (from_cache(s, cerr, sizeof cerr) == 0) {
    snprintf(r, sizeof r, "%" PRIu64, s->applied);
    om_log(OM_LOG_WARN, "policy_from_cache", "source", s->spec, "path", s->path,
           "revision", r, "because", why, NULL);
    return 0;
  }
  snprintf(err, errlen, "--policy %s: %s, and %s", s->spec, why, cerr);
  return rc;
}

int om_policy_source_start(uv_loop_t *loop, om_curl_uv_t *cu,
                           const om_policy_source_opts_t *opts,
                           om_policy_source_t **out, char *err, size_t errlen) {
  om_policy_source_t *s;
  om_watch_opts_t wo;
  int rc;
  if (loop == NULL || cu == NULL || opts == NULL || out == NULL ||
      opts->name == NULL || !om_valid_name(opts->name, strlen(opts->name)) ||
      opts->n_control_urls == 0 || opts->control_urls == NULL ||
      opts->id == NULL || opts->policy.lib_dir == NULL) {
    snprintf(err, errlen,
             "--policy control:NAME: needs a valid NAME "
             "([A-Za-z0-9._-]{1,128}) and --control URL");
    return OM_EINVAL;
  }
  s = calloc(1, sizeof *s);
  if (s == NULL)
    return OM_ENOMEM;
  s->loop = loop;
  s->cu = cu;
  s->tls = opts->tls;
  s->kind = opts->kind;
  s->on_update = opts->on_update;
  s->ud = opts->ud;
  s->interval_ms = opts->report_interval_ms ? opts->report_interval_ms : 60000;
  s->policy = opts->policy;
  s->name = dup_str(opts->name);
  s->spec = join("control:", opts->name, "");
  s->id = dup_str(opts->id);
  s->lib_dir = dup_str(opts->policy.lib_dir);
  s->policy.lib_dir = s->lib_dir;
  s->bases = calloc(opts->n_control_urls, sizeof *s->bases);
  if (s->bases != NULL) {
    s->n_planes = opts->n_control_urls;
    for (size_t i = 0; i < s->n_planes; i++) {
      size_t n = strlen(opts->control_urls[i]);
      s->bases[i] = dup_str(opts->control_urls[i]);
      while (s->bases[i] != NULL && n > 0 && s->bases[i][n - 1] == '/')
        s->bases[i][--n] = '\0';
      if (s->bases[i] == NULL)
        s->n_planes = i; /* frees what was made */
    }
  }
  if (opts->token != NULL)
    s->auth_line = join("Authorization: Bearer ", opts->token, "");
  if (s->name == NULL || s->spec == NULL || s->id == NULL ||
      s->lib_dir == NULL || s->bases == NULL ||
      s->n_planes != opts->n_control_urls ||
      (opts->token != NULL && s->auth_line == NULL)) {
    source_free(s);
    snprintf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  register_metrics(s, opts->metrics);
  if ((rc = make_dir(s, opts->cache_dir, err, errlen)) != 0 ||
      (rc = first_revision(
           s, opts->fetch_timeout_ms ? opts->fetch_timeout_ms : 3000, err,
           errlen)) != 0) {
    if (rc == OM_ENOMEM)
      snprintf(err, errlen, "out of memory");
    source_free(s);
    return rc;
  }
  memset(&wo, 0, sizeof wo);
  wo.control_urls = (const char *const *)s->bases;
  wo.n_control_urls = s->n_planes;
  wo.config = s->name;
  wo.last_event_id = s->refused > s->applied ? s->refused : s->applied;
  wo.token = opts->token;
  wo.tls = s->tls;
  wo.on_document = on_document;
  wo.ud = s;
  rc = om_watch_new(loop, cu, &wo, &s->watch);
  if (rc != 0) {
    snprintf(err, errlen, "--policy %s: cannot watch: %s", s->spec,
             om_strerror(rc));
    source_free(s);
    return rc;
  }
  s->watch_open = 1;
  uv_timer_init(loop, &s->report_timer);
  s->report_timer.data = s;
  s->timer_open = 1;
  schedule_report(s, 0);
  *out = s;
  return 0;
}

void om_policy_source_metrics(om_policy_source_t *s, om_metrics_t *r) {
  if (s == NULL || r == NULL || s->m.applied != NULL)
    return;
  register_metrics(s, r);
  om_metric_add(s->m.applied, (double)s->n_applied);
  om_metric_add(s->m.refused, (double)s->n_refused);
  om_metric_add(s->m.sent, (double)s->sent);
  om_metric_add(s->m.failed, (double)s->failed);
}

const char *om_policy_source_path(const om_policy_source_t *s) {
  return s->path;
}

const char *om_policy_source_spec(const om_policy_source_t *s) {
  return s->spec;
}

void om_policy_source_set_address(om_policy_source_t *s, const char *address) {
  snprintf(s->address, sizeof s->address, "%s", address);
}

json_t *om_policy_source_status(const om_policy_source_t *s) {
  json_t *w = s->watch != NULL ? om_watch_status(s->watch) : NULL;
  return json_pack(
      "{s:s, s:s, s:s, s:I, s:I, s:s, s:b, s:o?, s:{s:I, s:I, s:i, s:s}}",
      "source", s->spec, "path", s->path, "cache_dir",
      s->private_dir ? "" : s->dir, "applied", (json_int_t)s->applied,
      "refused", (json_int_t)s->refused, "reason", s->reason, "from_cache",
      s->from_cache, "watch", w, "reports", "sent", (json_int_t)s->sent,
      "failed", (json_int_t)s->failed, "last_status", (int)s->last_status,
      "last_error", s->report_error);
}

static void maybe_done(om_policy_source_t *s) {
  void (*done)(void *) = s->done;
  void *ud = s->done_ud;
  if (s->watch_open || s->timer_open)
    return;
  source_free(s);
  if (done != NULL)
    done(ud);
}

static void on_watch_closed(void *ud) {
  om_policy_source_t *s = ud;
  s->watch_open = 0;
  s->watch = NULL;
  maybe_done(s);
}

static void on_timer_closed(uv_handle_t *h) {
  om_policy_source_t *s = h->data;
  s->timer_open = 0;
  maybe_done(s);
}

void om_policy_source_close(om_policy_source_t *s, void (*done)(void *ud),
                            void *ud) {
  if (s == NULL || s->closing)
    return;
  s->closing = 1;
  s->done = done;
  s->done_ud = ud;
  if (s->rq != NULL) {
    om_curl_request_cancel(s->rq);
    s->rq = NULL;
  }
  uv_timer_stop(&s->report_timer);
  uv_close((uv_handle_t *)&s->report_timer, on_timer_closed);
  if (om_watch_close(s->watch, on_watch_closed, s) != 0) {
    s->watch_open = 0;
    maybe_done(s);
  }
}
