/*
 * test_connector.c: Layer B connectors against real receivers: a loopback
 * om_http_server recording what a webhook receives (and misbehaving on
 * script), and real files.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "om_connector.h"
#include "om_errno.h"
#include "om_http_server.h"
#include "om_message.h"

/* What the receiver does with the Nth request (beyond the script: 200). */
enum { R_STATUS = 0, R_STALL = -1, R_CUT = -2 };

#define MAX_SEEN 256

typedef struct {
  char *body;
  char key[128];
  char ctype[64];
} seen_t;

typedef struct {
  uv_loop_t loop;
  om_http_server_t *srv;
  int port, srv_closed;
  int script[32];
  size_t n_script;
  seen_t seen[MAX_SEEN];
  size_t n_seen;
  om_http_request_t *held[16];
  size_t n_held;
  /* done callbacks */
  int done;
  int status[16];
  size_t sent[16];
  size_t n_done;
  om_connector_t *conn;
} fx_t;

static void held_gone(om_http_request_t *req) {
  fx_t *fx = req->user;
  for (size_t i = 0; i < fx->n_held; i++)
    if (fx->held[i] == req)
      fx->held[i] = NULL;
}

static void handler(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  size_t i = fx->n_seen;
  int action = i < fx->n_script ? fx->script[i] : 200;
  const char *v;
  if (i < MAX_SEEN) {
    seen_t *s = &fx->seen[fx->n_seen++];
    s->body = strdup(req->body);
    v = om_http_request_header(req, "idempotency-key", NULL);
    snprintf(s->key, sizeof s->key, "%s", v ? v : "");
    v = om_http_request_header(req, "content-type", NULL);
    snprintf(s->ctype, sizeof s->ctype, "%s", v ? v : "");
  }
  if (action == R_STALL) {
    req->user = fx;
    fx->held[fx->n_held++] = req;
    om_http_request_on_close(req, held_gone);
    return;
  }
  if (action == R_CUT) {
    om_http_response_abort(req);
    return;
  }
  om_http_respond(req, action, NULL, 0, "{}", 2);
}

static void on_srv_closed(om_http_server_t *srv, void *ud) {
  fx_t *fx = ud;
  (void)srv;
  fx->srv_closed = 1;
}

static fx_t *fx_new(void) {
  om_http_server_opts_t o = {0};
  fx_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  o.drain_timeout_ms = 50;
  assert_int_equal(om_http_server_new(&fx->loop, &o, handler, fx, &fx->srv), 0);
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), 0);
  fx->port = om_http_server_port(fx->srv);
  return fx;
}

static void run_until_done(fx_t *fx, int want) {
  uint64_t t0 = uv_hrtime();
  while (fx->n_done < (size_t)want && uv_hrtime() - t0 < 5000000000ull)
    uv_run(&fx->loop, UV_RUN_ONCE);
  assert_int_equal(fx->n_done, want);
}

static void fx_free(fx_t *fx) {
  for (size_t i = 0; i < fx->n_held; i++)
    if (fx->held[i] != NULL)
      om_http_response_abort(fx->held[i]);
  om_connector_close(fx->conn);
  assert_int_equal(om_http_server_close(fx->srv, on_srv_closed), 0);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_true(fx->srv_closed);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  for (size_t i = 0; i < fx->n_seen; i++)
    free(fx->seen[i].body);
  free(fx);
}

static void on_done(void *ud, int status, size_t sent) {
  fx_t *fx = ud;
  fx->status[fx->n_done] = status;
  fx->sent[fx->n_done] = sent;
  fx->n_done++;
}

static om_connector_t *webhook(fx_t *fx, size_t limit, int retries,
                               uint64_t timeout_ms) {
  char url[64], err[256];
  om_connector_opts_t o = {0};
  snprintf(url, sizeof url, "http://127.0.0.1:%d/hook", fx->port);
  o.kind = "webhook";
  o.target = url;
  o.part_limit = limit;
  o.max_retries = retries;
  o.timeout_ms = timeout_ms;
  o.retry_base_ms = 1;
  assert_int_equal(om_connector_new(&fx->loop, &o, &fx->conn, err, sizeof err),
                   0);
  return fx->conn;
}

static om_agent_message_t *msg(const char *body) {
  om_agent_message_t *m = NULL;
  assert_int_equal(om_agent_message_new("support", "conv-1", "run-7", body,
                                        strlen(body), &m),
                   0);
  return m;
}

static int deliver(fx_t *fx, const char *body) {
  om_agent_message_t *m = msg(body);
  int rc = om_connector_deliver(fx->conn, m, on_done, fx);
  om_agent_message_free(m); /* the connector copied what it needs */
  return rc;
}

static const char *jstr(json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

static json_int_t jint(json_t *o, const char *k) {
  return json_integer_value(json_object_get(o, k));
}

/* ------------------------------------------------------------------ */

static void webhook_parts_in_order(void **state) {
  fx_t *fx = fx_new();
  char body[2048] = "", joined[2048] = "";
  size_t parts;
  (void)state;
  for (int i = 0; i < 12; i++)
    snprintf(body + strlen(body), sizeof body - strlen(body),
             "Paragraph %d says something \"quoted\" and \\ more.\n\n", i);
  strcat(body, "Fin \xc3\xa9.");
  webhook(fx, 120, 0, 2000);
  assert_int_equal(deliver(fx, body), 0);
  assert_int_equal(fx->n_done, 0); /* never from inside deliver */
  assert_int_equal(om_connector_pending(fx->conn), 1);
  run_until_done(fx, 1);
  assert_int_equal(fx->status[0], 0);
  parts = fx->sent[0];
  OM_ASSERT_CMP(parts, >, 3);
  assert_int_equal(fx->n_seen, parts);
  for (size_t i = 0; i < parts; i++) {
    json_error_t je;
    json_t *o = json_loads(fx->seen[i].body, 0, &je);
    assert_non_null(o);
    assert_string_equal(jstr(o, "agent"), "support");
    assert_string_equal(jstr(o, "conversation"), "conv-1");
    assert_string_equal(jstr(o, "run_id"), "run-7");
    assert_int_equal(jint(o, "part"), i + 1);
    assert_int_equal(jint(o, "parts"), parts);
    OM_ASSERT_CMP(strlen(jstr(o, "text")), <=, 120);
    strcat(joined, jstr(o, "text"));
    assert_string_equal(fx->seen[i].ctype, "application/json");
    OM_ASSERT_CMP(strlen(fx->seen[i].key), >, 0);
    if (i > 0)
      assert_string_not_equal(fx->seen[i].key, fx->seen[i - 1].key);
    json_decref(o);
  }
  assert_string_equal(joined, body);
  {
    om_connector_stats_t st;
    om_connector_stats(fx->conn, &st);
    assert_int_equal(st.delivered, 1);
    assert_int_equal(st.parts, parts);
    assert_int_equal(st.retries, 0);
  }
  fx_free(fx);
}

static void webhook_queue_never_interleaves(void **state) {
  fx_t *fx = fx_new();
  const char *bodies[3] = {"first one.\n\nfirst two.\n\nfirst three.",
                           "second one.\n\nsecond two.", "third."};
  size_t k = 0;
  (void)state;
  webhook(fx, 64, 0, 2000);
  for (int i = 0; i < 3; i++) {
    char b[256];
    snprintf(b, sizeof b, "%s %s", bodies[i],
             "padding padding padding padding padding padding padding");
    assert_int_equal(deliver(fx, b), 0);
  }
  run_until_done(fx, 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(fx->status[i], 0);
    for (size_t p = 0; p < fx->sent[i]; p++, k++) {
      json_t *o = json_loads(fx->seen[k].body, 0, NULL);
      assert_non_null(o);
      assert_int_equal(jint(o, "part"), p + 1);
      assert_int_equal(jint(o, "parts"), fx->sent[i]);
      json_decref(o);
    }
  }
  assert_int_equal(k, fx->n_seen);
  fx_free(fx);
}

static void webhook_retries_transport_only(void **state) {
  fx_t *fx = fx_new();
  om_connector_stats_t st;
  (void)state;
  /* the cut comes first, on a fresh connection: libcurl itself re-sends
   * a request whose reused connection died, which would hide a retry */
  fx->script[0] = R_CUT;
  fx->script[1] = 503;
  fx->script[2] = 502;
  fx->script[3] = 504;
  fx->n_script = 4;
  webhook(fx, 0, 5, 2000);
  assert_int_equal(deliver(fx, "hello"), 0);
  run_until_done(fx, 1);
  assert_int_equal(fx->status[0], 0);
  assert_int_equal(fx->sent[0], 1);
  assert_int_equal(fx->n_seen, 5);
  for (size_t i = 1; i < fx->n_seen; i++) /* the same part every time */
    assert_string_equal(fx->seen[i].key, fx->seen[0].key);
  om_connector_stats(fx->conn, &st);
  assert_int_equal(st.retries, 4);
  fx_free(fx);
}

static void webhook_refusal_is_not_retried(void **state) {
  const int refusals[] = {400, 401, 404, 409, 413, 429, 500, 301};
  (void)state;
  for (size_t r = 0; r < sizeof refusals / sizeof *refusals; r++) {
    fx_t *fx = fx_new();
    char want[32];
    fx->script[0] = 200;
    fx->script[1] = refusals[r];
    fx->n_script = 2;
    webhook(fx, 64, 5, 2000);
    assert_int_equal(
        deliver(fx, "part one is here and long enough to need a second "
                    "part.\n\npart two."),
        0);
    run_until_done(fx, 1);
    assert_int_equal(fx->status[0], OM_EIO);
    assert_int_equal(fx->sent[0], 1); /* the first part did arrive */
    assert_int_equal(fx->n_seen, 2);
    snprintf(want, sizeof want, "status %d", refusals[r]);
    assert_non_null(strstr(om_connector_last_error(fx->conn), want));
    fx_free(fx);
  }
}

static void webhook_retries_are_bounded(void **state) {
  fx_t *fx = fx_new();
  (void)state;
  for (int i = 0; i < 10; i++)
    fx->script[i] = 503;
  fx->n_script = 10;
  webhook(fx, 0, 2, 2000);
  assert_int_equal(deliver(fx, "x"), 0);
  run_until_done(fx, 1);
  assert_int_equal(fx->status[0], OM_EIO);
  assert_int_equal(fx->sent[0], 0);
  assert_int_equal(fx->n_seen, 3);
  fx_free(fx);
}

static void webhook_timeout(void **state) {
  fx_t *fx = fx_new();
  (void)state;
  fx->script[0] = R_STALL;
  fx->script[1] = R_STALL;
  fx->n_script = 2;
  webhook(fx, 0, 1, 100);
  assert_int_equal(deliver(fx, "hello"), 0);
  run_until_done(fx, 1);
  assert_int_equal(fx->status[0], OM_EDEADLINE);
  assert_int_equal(fx->n_seen, 2);
  assert_non_null(strstr(om_connector_last_error(fx->conn), "imeout"));
  fx_free(fx);
}

static void webhook_connection_refused(void **state) {
  fx_t *fx = fx_new();
  uv_loop_t loop;
  om_http_server_t *tmp;
  om_connector_opts_t o = {0};
  char url[64], err[128];
  int dead_port, closed = 0;
  (void)state;
  /* a port that was just free: bind, read, close */
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(om_http_server_new(&loop, NULL, handler, fx, &tmp), 0);
  assert_int_equal(om_http_server_listen(tmp, "127.0.0.1", 0), 0);
  dead_port = om_http_server_port(tmp);
  om_http_server_close(tmp, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  (void)closed;
  snprintf(url, sizeof url, "http://127.0.0.1:%d/", dead_port);
  o.kind = "webhook";
  o.target = url;
  o.max_retries = 2;
  o.retry_base_ms = 1;
  assert_int_equal(om_connector_new(&fx->loop, &o, &fx->conn, err, sizeof err),
                   0);
  assert_int_equal(deliver(fx, "hello"), 0);
  run_until_done(fx, 1);
  assert_int_equal(fx->status[0], OM_EIO);
  {
    om_connector_stats_t st;
    om_connector_stats(fx->conn, &st);
    assert_int_equal(st.retries, 2);
    assert_int_equal(st.failed, 1);
  }
  fx_free(fx);
}

static void close_cancels_pending(void **state) {
  fx_t *fx = fx_new();
  (void)state;
  fx->script[0] = R_STALL;
  fx->n_script = 1;
  webhook(fx, 0, 0, 5000);
  assert_int_equal(deliver(fx, "one"), 0);
  assert_int_equal(deliver(fx, "two"), 0);
  /* let the first part reach the receiver and stall there */
  while (fx->n_seen < 1)
    uv_run(&fx->loop, UV_RUN_ONCE);
  om_connector_close(fx->conn);
  fx->conn = NULL;
  assert_int_equal(fx->n_done, 2); /* synchronously, both */
  assert_int_equal(fx->status[0], OM_ESTATE);
  assert_int_equal(fx->status[1], OM_ESTATE);
  assert_int_equal(fx->sent[0], 0);
  fx_free(fx);
}

static void deliver_misuse(void **state) {
  fx_t *fx = fx_new();
  om_agent_message_t *m = msg("x"), *empty = NULL;
  (void)state;
  webhook(fx, 0, 0, 1000);
  assert_int_equal(om_connector_deliver(NULL, m, on_done, fx), OM_EINVAL);
  assert_int_equal(om_connector_deliver(fx->conn, NULL, on_done, fx),
                   OM_EINVAL);
  assert_int_equal(om_connector_deliver(fx->conn, m, NULL, fx), OM_EINVAL);
  assert_int_equal(om_agent_message_new("a", "c", NULL, "", 0, &empty), 0);
  assert_int_equal(om_connector_deliver(fx->conn, empty, on_done, fx),
                   OM_EINVAL);
  assert_string_equal(om_connector_kind(fx->conn), "webhook");
  assert_int_equal(om_connector_part_limit(fx->conn), 4000);
  om_agent_message_free(m);
  om_agent_message_free(empty);
  om_connector_close(NULL);
  fx_free(fx);
}

static void hostile_targets(void **state) {
  uv_loop_t loop;
  static const char *const urls[] = {
      "ftp://example.com/",  "http://",          "http:///path",
      "https://?q",          "http://exa mple/", "http://host:99999/",
      "javascript:alert(1)", "http://a\r\nb/",   "/relative/path",
      "HTTP//nope",          "http://[::1/",     "",
  };
  om_connector_t *c = (om_connector_t *)0x1;
  char err[256];
  om_connector_opts_t o = {0};
  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  o.kind = "webhook";
  for (size_t i = 0; i < sizeof urls / sizeof *urls; i++) {
    o.target = urls[i];
    err[0] = '\0';
    assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err),
                     OM_EINVAL);
    assert_non_null(strstr(err, "target"));
  }
  o.target = NULL;
  assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err), OM_EINVAL);
  o.target = "http://127.0.0.1:1/";
  o.kind = "carrier-pigeon";
  assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err), OM_EINVAL);
  assert_non_null(strstr(err, "kind"));
  o.kind = NULL;
  assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err), OM_EINVAL);
  o.kind = "webhook";
  o.part_limit = 10;
  assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err), OM_EINVAL);
  assert_non_null(strstr(err, "part_limit"));
  o.part_limit = 0;
  o.max_retries = -1;
  assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err), OM_EINVAL);
  assert_non_null(strstr(err, "max_retries"));
  o.max_retries = 11;
  assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err), OM_EINVAL);
  o.max_retries = 0;
  /* files that cannot be appended to */
  o.kind = "file";
  o.target = "/nonexistent-dir-om/x.jsonl";
  assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err), OM_EIO);
  assert_non_null(strstr(err, "target: cannot open"));
  o.target = "/tmp";
  assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err), OM_EIO);
  o.target = "";
  assert_int_equal(om_connector_new(&loop, &o, &c, err, sizeof err), OM_EINVAL);
  assert_ptr_equal(c, (om_connector_t *)0x1);
  assert_int_equal(om_connector_new(NULL, &o, &c, err, sizeof err), OM_EINVAL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void file_appends_json_lines(void **state) {
  fx_t *fx = fx_new();
  char path[] = "/tmp/om_connector_XXXXXX";
  int fd = mkstemp(path);
  om_connector_opts_t o = {0};
  char err[256], line[4096];
  FILE *f;
  size_t n = 0;
  (void)state;
  OM_ASSERT_CMP(fd, >=, 0);
  assert_int_equal(write(fd, "existing\n", 9), 9);
  close(fd);
  o.kind = "file";
  o.target = path;
  o.part_limit = 64;
  assert_int_equal(om_connector_new(&fx->loop, &o, &fx->conn, err, sizeof err),
                   0);
  assert_int_equal(deliver(fx, "A first paragraph of the reply.\n\nAnd a "
                               "second one, long enough to split off."),
                   0);
  assert_int_equal(deliver(fx, "Short \"one\"."), 0);
  run_until_done(fx, 2);
  assert_int_equal(fx->status[0], 0);
  assert_int_equal(fx->sent[0], 2);
  assert_int_equal(fx->status[1], 0);
  f = fopen(path, "r");
  assert_non_null(f);
  assert_non_null(fgets(line, sizeof line, f));
  assert_string_equal(line, "existing\n"); /* appended, not truncated */
  while (fgets(line, sizeof line, f) != NULL) {
    json_t *o2 = json_loads(line, JSON_DISABLE_EOF_CHECK, NULL);
    assert_non_null(o2);
    assert_string_equal(jstr(o2, "agent"), "support");
    if (n == 2)
      assert_string_equal(jstr(o2, "text"), "Short \"one\".");
    json_decref(o2);
    n++;
  }
  fclose(f);
  assert_int_equal(n, 3);
  fx_free(fx);
  unlink(path);
}

static size_t count_lines(const char *path, const char *want_text) {
  char line[4096];
  size_t n = 0;
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  while (fgets(line, sizeof line, f) != NULL) {
    json_t *o = json_loads(line, JSON_DISABLE_EOF_CHECK, NULL);
    assert_non_null(o);
    if (want_text == NULL || strcmp(jstr(o, "text"), want_text) == 0)
      n++;
    json_decref(o);
  }
  fclose(f);
  return n;
}

/*
 * Rotation: the file renamed away, then deleted, between deliveries. Each
 * next delivery lands at the path (a new file), never in the moved or
 * unlinked inode; when the path cannot be opened again the delivery fails
 * (it did not reach the channel) and a later one recovers.
 */
static void file_follows_rotation(void **state) {
  fx_t *fx = fx_new();
  char dir[] = "/tmp/om_connector_rot_XXXXXX";
  char path[128], rotated[128];
  om_connector_opts_t o = {0};
  char err[256];
  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/channel.jsonl", dir);
  snprintf(rotated, sizeof rotated, "%s/channel.jsonl.1", dir);
  o.kind = "file";
  o.target = path;
  assert_int_equal(om_connector_new(&fx->loop, &o, &fx->conn, err, sizeof err),
                   0);
  assert_int_equal(deliver(fx, "one"), 0);
  run_until_done(fx, 1);
  assert_int_equal(fx->status[0], 0);
  /* logrotate's move: the next line goes to a new file at the path */
  assert_int_equal(rename(path, rotated), 0);
  assert_int_equal(deliver(fx, "two"), 0);
  run_until_done(fx, 2);
  assert_int_equal(fx->status[1], 0);
  assert_int_equal(count_lines(rotated, NULL), 1);
  assert_int_equal(count_lines(rotated, "one"), 1);
  assert_int_equal(count_lines(path, NULL), 1);
  assert_int_equal(count_lines(path, "two"), 1);
  /* deleted: recreated */
  assert_int_equal(unlink(path), 0);
  assert_int_equal(deliver(fx, "three"), 0);
  run_until_done(fx, 3);
  assert_int_equal(fx->status[2], 0);
  assert_int_equal(count_lines(path, NULL), 1);
  assert_int_equal(count_lines(path, "three"), 1);
  /* the directory gone: the path cannot be opened, the part fails */
  assert_int_equal(unlink(path), 0);
  assert_int_equal(unlink(rotated), 0);
  assert_int_equal(rmdir(dir), 0);
  assert_int_equal(deliver(fx, "four"), 0);
  run_until_done(fx, 4);
  assert_int_equal(fx->status[3], OM_EIO);
  assert_int_equal(fx->sent[3], 0);
  assert_non_null(strstr(om_connector_last_error(fx->conn), "reopen"));
  /* and it comes back with the directory */
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_int_equal(deliver(fx, "five"), 0);
  run_until_done(fx, 5);
  assert_int_equal(fx->status[4], 0);
  assert_int_equal(count_lines(path, "five"), 1);
  fx_free(fx);
  unlink(path);
  rmdir(dir);
}

/* A full disk (/dev/full: every write is ENOSPC) fails the delivery with
 * the cause for the log; nothing crashes and the connector stays usable. */
static void file_write_failure_is_reported(void **state) {
  fx_t *fx = fx_new();
  om_connector_opts_t o = {0};
  char err[256];
  (void)state;
  if (access("/dev/full", W_OK) != 0) {
    fx_free(fx);
    skip();
  }
  o.kind = "file";
  o.target = "/dev/full";
  assert_int_equal(om_connector_new(&fx->loop, &o, &fx->conn, err, sizeof err),
                   0);
  assert_int_equal(deliver(fx, "lost"), 0);
  assert_int_equal(deliver(fx, "lost too"), 0);
  run_until_done(fx, 2);
  assert_int_equal(fx->status[0], OM_EIO);
  assert_int_equal(fx->status[1], OM_EIO);
  assert_non_null(strstr(om_connector_last_error(fx->conn), "write:"));
  fx_free(fx);
}

static void fault_injection(void **state) {
  char path[] = "/tmp/om_connector_fi_XXXXXX";
  int fd = mkstemp(path);
  (void)state;
  OM_ASSERT_CMP(fd, >=, 0);
  close(fd);
  for (int kind = 0; kind < 2; kind++) {
    for (long k = 0;; k++) {
      fx_t *fx = fx_new();
      om_connector_opts_t o = {0};
      char url[64], err[128];
      int rc;
      snprintf(url, sizeof url, "http://127.0.0.1:%d/", fx->port);
      o.kind = kind ? "file" : "webhook";
      o.target = kind ? path : url;
      o.part_limit = 64;
      om_test_fail_alloc_after(k);
      rc = om_connector_new(&fx->loop, &o, &fx->conn, err, sizeof err);
      if (rc == 0) {
        om_agent_message_t *m = NULL;
        const char *b = "para one is here.\n\npara two is here too, and "
                        "long.\n\nthree.";
        /* the message is built before the failures start counting */
        om_test_alloc_reset();
        assert_int_equal(om_agent_message_new("a", "c", NULL, b, strlen(b), &m),
                         0);
        om_test_fail_alloc_after(k);
        rc = om_connector_deliver(fx->conn, m, on_done, fx);
        om_test_alloc_reset();
        om_agent_message_free(m);
        if (rc == 0) {
          run_until_done(fx, 1);
          assert_int_equal(fx->status[0], 0);
          fx_free(fx);
          break;
        }
        assert_int_equal(om_connector_pending(fx->conn), 0);
      } else {
        fx->conn = NULL;
      }
      om_test_alloc_reset();
      assert_int_equal(rc, OM_ENOMEM);
      fx_free(fx);
    }
  }
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(webhook_parts_in_order),
      cmocka_unit_test(webhook_queue_never_interleaves),
      cmocka_unit_test(webhook_retries_transport_only),
      cmocka_unit_test(webhook_refusal_is_not_retried),
      cmocka_unit_test(webhook_retries_are_bounded),
      cmocka_unit_test(webhook_timeout),
      cmocka_unit_test(webhook_connection_refused),
      cmocka_unit_test(close_cancels_pending),
      cmocka_unit_test(deliver_misuse),
      cmocka_unit_test(hostile_targets),
      cmocka_unit_test(file_appends_json_lines),
      cmocka_unit_test(file_follows_rotation),
      cmocka_unit_test(file_write_failure_is_reported),
      cmocka_unit_test(fault_injection),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
