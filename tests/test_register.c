/*
 * test_register.c: `openmesh register` end to end. A fake control plane
 * (om_http_server on this test's loop, recording every request) and the
 * real `openmesh` binary as a child process, on loopback.
 *
 * The binary is $OPENMESH_BIN, else bin/openmesh next to this test binary
 * (CMake puts tests in the build directory and the command in bin/).
 */
#include "om_test.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "om_http_server.h"

#define MAX_REQS 256

typedef struct rec_s {
  char method[16];
  char path[256];
  char *body;
  char auth[128];
  char ctype[64];
  char host[96]; /* the Host header: which spelling of the plane */
  uint64_t at_ms;
  int status; /* what we answered */
} rec_t;

typedef struct fx_s {
  uv_loop_t loop;
  uv_timer_t ticker;
  om_http_server_t *srv;
  int srv_closed;
  int port;
  rec_t reqs[MAX_REQS];
  size_t n_reqs, n_puts;
  int put_script[16]; /* status for the n-th PUT (0: 200) */
  const char *mark;   /* a file CMD creates when it gets SIGTERM */
  int mark_at_delete; /* -1: no DELETE yet; else did mark exist */
  /* the register process */
  uv_process_t proc;
  uv_pipe_t err_pipe;
  int spawned, exited, pipe_closed, proc_closed;
  int64_t exit_status;
  int term_signal;
  uint64_t exit_at_ms;
  char *err; /* its stderr */
  size_t err_len;
  char tmpdir[64];
} fx_t;

static char openmesh_bin[PATH_MAX];

static uint64_t now_ms(void) {
  return uv_hrtime() / 1000000u;
}

static void handler(om_http_request_t *req, void *ud) {
  fx_t *fx = ud;
  om_http_header_t h[] = {{"Content-Type", "application/json", 0, 0}};
  const char *auth = om_http_request_header(req, "authorization", NULL);
  const char *ct = om_http_request_header(req, "content-type", NULL);
  const char *host = om_http_request_header(req, "host", NULL);
  rec_t *r;
  int status = 200;
  if (fx->n_reqs == MAX_REQS) {
    om_http_respond(req, 500, h, 1, "{}", 2);
    return;
  }
  r = &fx->reqs[fx->n_reqs++];
  snprintf(r->method, sizeof r->method, "%s", req->method);
  snprintf(r->path, sizeof r->path, "%.*s", (int)req->path_len, req->path);
  r->body = strdup(req->body);
  snprintf(r->auth, sizeof r->auth, "%s", auth ? auth : "");
  snprintf(r->ctype, sizeof r->ctype, "%s", ct ? ct : "");
  snprintf(r->host, sizeof r->host, "%s", host ? host : "");
  r->at_ms = now_ms();
  if (strcmp(req->method, "PUT") == 0) {
    if (fx->n_puts < 16 && fx->put_script[fx->n_puts] != 0)
      status = fx->put_script[fx->n_puts];
    fx->n_puts++;
  } else if (strcmp(req->method, "DELETE") == 0 && fx->mark_at_delete < 0) {
    fx->mark_at_delete = fx->mark != NULL && access(fx->mark, F_OK) == 0;
  }
  r->status = status;
  if (status == 503) {
    om_http_respond(req, 503, h, 1, "{\"error\":\"unavailable\"}", 23);
    return;
  }
  if (status == 404) {
    om_http_respond(req, 404, h, 1, "{\"error\":\"not_found\"}", 21);
    return;
  }
  om_http_respond(req, status, h, 1, "{}", 2);
}

static void on_tick(uv_timer_t *t) {
  (void)t; /* wakes uv_run(UV_RUN_ONCE) so deadlines are checked */
}

static int fx_setup(void **state) {
  fx_t *fx = calloc(1, sizeof *fx);
  assert_non_null(fx);
  assert_int_equal(uv_loop_init(&fx->loop), 0);
  uv_timer_init(&fx->loop, &fx->ticker);
  uv_timer_start(&fx->ticker, on_tick, 10, 10);
  assert_int_equal(om_http_server_new(&fx->loop, NULL, handler, fx, &fx->srv),
                   0);
  assert_int_equal(om_http_server_listen(fx->srv, "127.0.0.1", 0), 0);
  fx->port = om_http_server_port(fx->srv);
  fx->mark_at_delete = -1;
  snprintf(fx->tmpdir, sizeof fx->tmpdir, "/tmp/om_register_XXXXXX");
  assert_non_null(mkdtemp(fx->tmpdir));
  *state = fx;
  return 0;
}

static void on_srv_closed(om_http_server_t *srv, void *ud) {
  fx_t *fx = ud;
  (void)srv;
  fx->srv_closed = 1;
}

static void on_pipe_closed(uv_handle_t *h);

static int fx_teardown(void **state) {
  fx_t *fx = *state;
  char cmd[128];
  if (fx->spawned && !fx->exited) { /* a test failed half-way */
    uv_process_kill(&fx->proc, SIGKILL);
    while (!fx->proc_closed)
      uv_run(&fx->loop, UV_RUN_ONCE);
    /* its CMD may live on and hold the pipe: do not wait for EOF */
    if (!fx->pipe_closed && !uv_is_closing((uv_handle_t *)&fx->err_pipe))
      uv_close((uv_handle_t *)&fx->err_pipe, on_pipe_closed);
    while (!fx->pipe_closed)
      uv_run(&fx->loop, UV_RUN_ONCE);
  }
  om_http_server_close(fx->srv, on_srv_closed);
  while (!fx->srv_closed)
    uv_run(&fx->loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&fx->ticker, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&fx->loop), 0);
  for (size_t i = 0; i < fx->n_reqs; i++)
    free(fx->reqs[i].body);
  free(fx->err);
  snprintf(cmd, sizeof cmd, "rm -rf %s", fx->tmpdir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", fx->tmpdir);
  free(fx);
  return 0;
}

/* ---- the register process ---- */

static void on_err_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  static char chunk[65536];
  (void)h;
  (void)hint;
  buf->base = chunk;
  buf->len = sizeof chunk;
}

static void on_pipe_closed(uv_handle_t *h) {
  fx_t *fx = h->data;
  fx->pipe_closed = 1;
}

static void on_err_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  fx_t *fx = s->data;
  if (n > 0) {
    char *ne = realloc(fx->err, fx->err_len + (size_t)n + 1);
    assert_non_null(ne);
    fx->err = ne;
    memcpy(fx->err + fx->err_len, buf->base, (size_t)n);
    fx->err_len += (size_t)n;
    fx->err[fx->err_len] = '\0';
    /* show it in the test output too, for whoever debugs a failure */
    fwrite(buf->base, 1, (size_t)n, stderr);
  } else if (n < 0) {
    uv_close((uv_handle_t *)s, on_pipe_closed);
  }
}

static void on_proc_closed(uv_handle_t *h) {
  fx_t *fx = h->data;
  fx->proc_closed = 1;
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig) {
  fx_t *fx = p->data;
  fx->exited = 1;
  fx->exit_status = status;
  fx->term_signal = sig;
  fx->exit_at_ms = now_ms();
  uv_close((uv_handle_t *)p, on_proc_closed);
}

/* Start `openmesh register ARGS...` (NULL-terminated). */
static void spawn(fx_t *fx, const char *const *args) {
  char *argv[64];
  size_t n = 0;
  uv_process_options_t o;
  uv_stdio_container_t stdio[3];
  memset(&o, 0, sizeof o);
  argv[n++] = openmesh_bin;
  argv[n++] = "register";
  for (size_t i = 0; args[i] != NULL; i++) {
    OM_ASSERT_CMP(n, <, 63);
    argv[n++] = (char *)args[i];
  }
  argv[n] = NULL;
  assert_int_equal(uv_pipe_init(&fx->loop, &fx->err_pipe, 0), 0);
  fx->err_pipe.data = fx;
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_IGNORE; /* --help; CMD's output */
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&fx->err_pipe;
  o.file = openmesh_bin;
  o.args = argv;
  o.exit_cb = on_exit_cb;
  o.stdio = stdio;
  o.stdio_count = 3;
  fx->proc.data = fx;
  assert_int_equal(uv_spawn(&fx->loop, &fx->proc, &o), 0);
  fx->spawned = 1;
  assert_int_equal(
      uv_read_start((uv_stream_t *)&fx->err_pipe, on_err_alloc, on_err_read),
      0);
}

typedef int (*cond_fn)(fx_t *fx, size_t arg);

static int run_until(fx_t *fx, cond_fn cond, size_t arg, uint64_t timeout_ms) {
  uint64_t t0 = now_ms();
  while (!cond(fx, arg) && now_ms() - t0 < timeout_ms)
    uv_run(&fx->loop, UV_RUN_ONCE);
  return cond(fx, arg);
}

static int has_puts(fx_t *fx, size_t n) {
  return fx->n_puts >= n;
}

static int has_exited(fx_t *fx, size_t unused) {
  (void)unused;
  return fx->exited && fx->pipe_closed && fx->proc_closed;
}

static int has_delete(fx_t *fx, size_t unused);

static int never(fx_t *fx, size_t unused) {
  (void)fx;
  (void)unused;
  return 0;
}

/* Exit status as a shell reports it. */
static int status_of(const fx_t *fx) {
  return fx->term_signal ? 128 + fx->term_signal : (int)fx->exit_status;
}

static size_t count(const fx_t *fx, const char *method) {
  size_t n = 0;
  for (size_t i = 0; i < fx->n_reqs; i++)
    n += strcmp(fx->reqs[i].method, method) == 0;
  return n;
}

static int has_delete(fx_t *fx, size_t unused) {
  (void)unused;
  return count(fx, "DELETE") > 0;
}

static size_t count_substr(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = hay ? strstr(hay, needle) : NULL; p != NULL;
       p = strstr(p + 1, needle))
    n++;
  return n;
}

static void control_url(fx_t *fx, char *buf, size_t n) {
  snprintf(buf, n, "http://127.0.0.1:%d", fx->port);
}

/* ---- tests ---- */

static void registers_renews_and_deletes(void **state) {
  fx_t *fx = *state;
  char ctl[64], tok[128], body_want[256];
  const char *args[32];
  FILE *f;
  json_t *j, *meta;
  json_error_t je;
  uint64_t t_first;
  size_t i = 0, renewals;
  snprintf(tok, sizeof tok, "%s/token", fx->tmpdir);
  f = fopen(tok, "w");
  assert_non_null(f);
  fputs("  s3cr3t-T0ken==  \nignored\n", f);
  fclose(f);
  control_url(fx, ctl, sizeof ctl);
  strcat(ctl, "/"); /* a trailing slash is tolerated */
  args[i++] = "--control";
  args[i++] = ctl;
  args[i++] = "--service";
  args[i++] = "web";
  args[i++] = "--id";
  args[i++] = "web-1";
  args[i++] = "--url";
  args[i++] = "http://127.0.0.1:9/base";
  args[i++] = "--ttl";
  args[i++] = "1s";
  args[i++] = "--weight";
  args[i++] = "2.5";
  args[i++] = "--zone";
  args[i++] = "eu-west-1a";
  args[i++] = "--meta";
  args[i++] = "env=prod";
  args[i++] = "--meta";
  args[i++] = "team=a=b"; /* the first '=' splits */
  args[i++] = "--token-file";
  args[i++] = tok;
  args[i++] = "--drain";
  args[i++] = "0";
  args[i++] = "--";
  args[i++] = "sleep";
  args[i++] = "30";
  args[i] = NULL;
  spawn(fx, args);
  assert_true(run_until(fx, has_puts, 1, 5000));
  t_first = fx->reqs[0].at_ms;
  assert_string_equal(fx->reqs[0].method, "PUT");
  assert_string_equal(fx->reqs[0].path, "/v1/services/web/instances/web-1");
  assert_string_equal(fx->reqs[0].auth, "Bearer s3cr3t-T0ken==");
  assert_string_equal(fx->reqs[0].ctype, "application/json");
  j = json_loads(fx->reqs[0].body, JSON_REJECT_DUPLICATES, &je);
  assert_non_null(j);
  assert_int_equal(json_object_size(j), 5);
  assert_string_equal(json_string_value(json_object_get(j, "url")),
                      "http://127.0.0.1:9/base");
  assert_true(json_is_integer(json_object_get(j, "ttl_ms")));
  assert_int_equal(json_integer_value(json_object_get(j, "ttl_ms")), 1000);
  OM_ASSERT_NEAR(json_number_value(json_object_get(j, "weight")), 2.5, 0);
  assert_string_equal(json_string_value(json_object_get(j, "zone")),
                      "eu-west-1a");
  meta = json_object_get(j, "metadata");
  assert_int_equal(json_object_size(meta), 2);
  assert_string_equal(json_string_value(json_object_get(meta, "env")), "prod");
  assert_string_equal(json_string_value(json_object_get(meta, "team")), "a=b");
  json_decref(j);
  /* renewals every ttl/3 (~333 ms): at least 3 within 2 s, and not a
   * flood either */
  run_until(fx, never, 0, 2000 - (now_ms() - t_first));
  renewals = 0;
  for (size_t k = 1; k < fx->n_reqs; k++)
    if (fx->reqs[k].at_ms - t_first <= 2000) {
      assert_string_equal(fx->reqs[k].method, "PUT");
      assert_string_equal(fx->reqs[k].body, fx->reqs[0].body);
      assert_string_equal(fx->reqs[k].auth, "Bearer s3cr3t-T0ken==");
      renewals++;
    }
  OM_TEST_NOTE("renewals in 2 s with ttl 1s: %zu", renewals);
  OM_ASSERT_CMP(renewals, >=, 3);
  OM_ASSERT_CMP(renewals, <=, 12);
  snprintf(body_want, sizeof body_want, "%s", fx->reqs[0].body);
  /* SIGTERM: DELETE, no drain, CMD terminated: its status, 128+15 */
  assert_int_equal(uv_process_kill(&fx->proc, SIGTERM), 0);
  assert_true(run_until(fx, has_exited, 0, 5000));
  assert_int_equal(status_of(fx), 128 + SIGTERM);
  assert_int_equal(count(fx, "DELETE"), 1);
  assert_string_equal(fx->reqs[fx->n_reqs - 1].method, "DELETE");
  assert_string_equal(fx->reqs[fx->n_reqs - 1].path,
                      "/v1/services/web/instances/web-1");
  assert_string_equal(fx->reqs[fx->n_reqs - 1].auth, "Bearer s3cr3t-T0ken==");
  OM_ASSERT_CMP(count_substr(fx->err, "\"event\":\"deregistered\""), ==, 1);
}

static void retries_503_and_reregisters_after_404(void **state) {
  fx_t *fx = *state;
  char ctl[64];
  const char *args[] = {
      "--control", ctl,     "--service", "api",
      "--id",      "api-7", "--url",     "https://10.0.0.7:8443",
      "--ttl",     "3s",    NULL};
  uint64_t gap12, gap23, gap34;
  control_url(fx, ctl, sizeof ctl);
  fx->put_script[0] = 503; /* control plane overloaded */
  fx->put_script[1] = 503;
  fx->put_script[2] = 200;
  fx->put_script[3] = 404; /* it lost the lease (restart, expiry) */
  spawn(fx, args);
  assert_true(run_until(fx, has_puts, 5, 8000));
  for (size_t i = 0; i < 5; i++)
    assert_string_equal(fx->reqs[i].method, "PUT");
  gap12 = fx->reqs[1].at_ms - fx->reqs[0].at_ms;
  gap23 = fx->reqs[2].at_ms - fx->reqs[1].at_ms;
  gap34 = fx->reqs[3].at_ms - fx->reqs[2].at_ms;
  OM_TEST_NOTE("retry gaps %llu %llu ms, renewal %llu ms, after 404 %llu ms",
               (unsigned long long)gap12, (unsigned long long)gap23,
               (unsigned long long)gap34,
               (unsigned long long)(fx->reqs[4].at_ms - fx->reqs[3].at_ms));
  /* never more often than every 100 ms */
  OM_ASSERT_CMP(gap12, >=, 99);
  OM_ASSERT_CMP(gap23, >=, 99);
  /* after the 404, registered again without waiting a renewal period */
  OM_ASSERT_CMP(fx->reqs[4].at_ms - fx->reqs[3].at_ms, >=, 99);
  OM_ASSERT_CMP(fx->reqs[4].at_ms - fx->reqs[3].at_ms, <, gap34);
  assert_string_equal(fx->reqs[4].body, fx->reqs[0].body);
  assert_int_equal(count_substr(fx->err, "\"event\":\"register_failed\""), 2);
  OM_ASSERT_CMP(count_substr(fx->err, "\"status\":\"503\""), ==, 2);
  assert_int_equal(count_substr(fx->err, "\"event\":\"lease_lost\""), 1);
  OM_ASSERT_CMP(count_substr(fx->err, "\"status\":\"404\""), ==, 1);
  /* without CMD, SIGTERM removes the lease and exits 0 */
  assert_int_equal(uv_process_kill(&fx->proc, SIGTERM), 0);
  assert_true(run_until(fx, has_exited, 0, 5000));
  assert_int_equal(status_of(fx), 0);
  assert_string_equal(fx->reqs[fx->n_reqs - 1].method, "DELETE");
}

/* Two planes (the fake, spelled 127.0.0.1 and localhost: two URLs, one
 * server, told apart by Host): a 503 from the first sends the retry to
 * the second at once, without the 100 ms floor of a backoff; renewals
 * then stay there; a 503 from both in a row is one full round, and only
 * then comes the backoff. */
static void fails_over_to_the_next_plane_at_once(void **state) {
  fx_t *fx = *state;
  char ctl[64], ctl2[64];
  const char *args[] = {
      "--control", ctl,    "--control", ctl2,    "--service",
      "api",       "--id", "api-8",     "--url", "http://10.0.0.8:80",
      "--ttl",     "1s",   NULL};
  uint64_t gap01, gap34;
  control_url(fx, ctl, sizeof ctl);
  snprintf(ctl2, sizeof ctl2, "http://localhost:%d", fx->port);
  fx->put_script[0] = 503; /* plane 1 */
  fx->put_script[1] = 200; /* plane 2, at once */
  fx->put_script[2] = 200; /* renewal, still plane 2 */
  fx->put_script[3] = 503; /* plane 2 fails: plane 1 at once */
  fx->put_script[4] = 503; /* plane 1 too: the round failed, back off */
  spawn(fx, args);
  assert_true(run_until(fx, has_puts, 6, 8000));
  gap01 = fx->reqs[1].at_ms - fx->reqs[0].at_ms;
  gap34 = fx->reqs[4].at_ms - fx->reqs[3].at_ms;
  OM_TEST_NOTE("503 -> next plane %llu ms; in the second round %llu ms, "
               "then the backoff %llu ms",
               (unsigned long long)gap01, (unsigned long long)gap34,
               (unsigned long long)(fx->reqs[5].at_ms - fx->reqs[4].at_ms));
  assert_non_null(strstr(fx->reqs[0].host, "127.0.0.1"));
  assert_non_null(strstr(fx->reqs[1].host, "localhost"));
  assert_non_null(strstr(fx->reqs[2].host, "localhost"));
  assert_non_null(strstr(fx->reqs[3].host, "localhost"));
  assert_non_null(strstr(fx->reqs[4].host, "127.0.0.1"));
  assert_non_null(strstr(fx->reqs[5].host, "localhost")); /* round robin */
  OM_ASSERT_CMP(gap01, <, 99);
  OM_ASSERT_CMP(gap34, <, 99);
  OM_ASSERT_CMP(fx->reqs[5].at_ms - fx->reqs[4].at_ms, >=, 99);
  OM_ASSERT_CMP(count_substr(fx->err, "\"event\":\"control_failover\""), ==, 3);
  ;
  OM_ASSERT_CMP(count_substr(fx->err, "\"to\":\"http://localhost:"), ==, 2);
  OM_ASSERT_CMP(
      count_substr(fx->err,
                   "\"event\":\"registered\",\"service\":\"api\",\"id\":"
                   "\"api-8\",\"endpoint\":\"http://localhost:"),
      >=, 1);
  assert_int_equal(uv_process_kill(&fx->proc, SIGTERM), 0);
  assert_true(run_until(fx, has_exited, 0, 5000));
  assert_int_equal(status_of(fx), 0);
  assert_string_equal(fx->reqs[fx->n_reqs - 1].method, "DELETE");
}

static void sigterm_deletes_before_cmd_is_signalled(void **state) {
  fx_t *fx = *state;
  char ctl[64], mark[128], script[512];
  const char *args[] = {"--control", ctl,     "--service",  "web",   "--id",
                        "w2",        "--url", "http://h:1", "--ttl", "1s",
                        "--drain",   "200ms", "--",         "sh",    "-c",
                        script,      NULL};
  uint64_t t_delete = 0;
  control_url(fx, ctl, sizeof ctl);
  snprintf(mark, sizeof mark, "%s/got-sigterm", fx->tmpdir);
  fx->mark = mark;
  snprintf(script, sizeof script,
           "trap 'touch %s; kill $p; exit 7' TERM; sleep 30 & p=$!; wait $p",
           mark);
  spawn(fx, args);
  assert_true(run_until(fx, has_puts, 1, 5000));
  run_until(fx, never, 0, 100); /* let sh install its trap */
  assert_int_equal(uv_process_kill(&fx->proc, SIGTERM), 0);
  assert_true(run_until(fx, has_exited, 0, 5000));
  for (size_t i = 0; i < fx->n_reqs; i++)
    if (strcmp(fx->reqs[i].method, "DELETE") == 0)
      t_delete = fx->reqs[i].at_ms;
  OM_ASSERT_CMP(t_delete, >, 0);
  /* the lease was gone while CMD still ran untouched ... */
  assert_int_equal(fx->mark_at_delete, 0);
  /* ... then CMD got SIGTERM, after the drain, and its status is ours */
  assert_int_equal(access(mark, F_OK), 0);
  assert_int_equal(status_of(fx), 7);
  OM_TEST_NOTE("DELETE to exit: %llu ms (drain 200 ms)",
               (unsigned long long)(fx->exit_at_ms - t_delete));
  OM_ASSERT_CMP(fx->exit_at_ms - t_delete, >=, 150);
}

static void second_signal_skips_the_drain(void **state) {
  fx_t *fx = *state;
  char ctl[64];
  const char *args[] = {"--control", ctl,     "--service", "web",
                        "--id",      "w3",    "--url",     "http://h:1",
                        "--ttl",     "1s",    "--drain",   "1h",
                        "--",        "sleep", "30",        NULL};
  uint64_t t0;
  control_url(fx, ctl, sizeof ctl);
  spawn(fx, args);
  assert_true(run_until(fx, has_puts, 1, 5000));
  assert_int_equal(uv_process_kill(&fx->proc, SIGTERM), 0);
  assert_true(run_until(fx, has_delete, 0, 5000));
  run_until(fx, never, 0, 100);
  assert_false(fx->exited); /* draining for an hour */
  t0 = now_ms();
  assert_int_equal(uv_process_kill(&fx->proc, SIGINT), 0);
  assert_true(run_until(fx, has_exited, 0, 5000));
  assert_int_equal(status_of(fx), 128 + SIGTERM);
  OM_ASSERT_CMP(now_ms() - t0, <, 5000);
}

static void cmd_exit_deletes_and_propagates(void **state) {
  fx_t *fx = *state;
  char ctl[64];
  const char *args[] = {"--control", ctl,
                        "--service", "job",
                        "--id",      "j1",
                        "--url",     "http://h:1",
                        "--ttl",     "1s",
                        "--",        "sh",
                        "-c",        "sleep 0.4; exit 3",
                        NULL};
  control_url(fx, ctl, sizeof ctl);
  spawn(fx, args);
  assert_true(run_until(fx, has_exited, 0, 5000));
  assert_int_equal(status_of(fx), 3);
  OM_ASSERT_CMP(count(fx, "PUT"), >=, 1);
  assert_int_equal(count(fx, "DELETE"), 1);
  assert_string_equal(fx->reqs[fx->n_reqs - 1].method, "DELETE");
  assert_string_equal(fx->reqs[fx->n_reqs - 1].path,
                      "/v1/services/job/instances/j1");
}

static void cmd_killed_by_signal(void **state) {
  fx_t *fx = *state;
  char ctl[64];
  const char *args[] = {"--control", ctl,
                        "--service", "job",
                        "--id",      "j2",
                        "--url",     "http://h:1",
                        "--ttl",     "1s",
                        "--",        "sh",
                        "-c",        "sleep 0.2; kill -9 $$",
                        NULL};
  control_url(fx, ctl, sizeof ctl);
  spawn(fx, args);
  assert_true(run_until(fx, has_exited, 0, 5000));
  assert_int_equal(status_of(fx), 128 + 9);
  assert_int_equal(count(fx, "DELETE"), 1);
}

static void unreachable_control_plane(void **state) {
  fx_t *fx = *state;
  char ctl[64];
  const char *args[] = {"--control", ctl,  "--service", "web",
                        "--id",      "w4", "--url",     "http://h:1",
                        "--ttl",     "1s", NULL};
  const char *p;
  size_t failures;
  uint64_t t0;
  /* a port nobody listens on: our own server's, after closing it */
  control_url(fx, ctl, sizeof ctl);
  om_http_server_close(fx->srv, on_srv_closed);
  while (!fx->srv_closed)
    uv_run(&fx->loop, UV_RUN_ONCE);
  assert_int_equal(om_http_server_new(&fx->loop, NULL, handler, fx, &fx->srv),
                   0); /* for the teardown; never listens */
  fx->srv_closed = 0;
  spawn(fx, args);
  run_until(fx, never, 0, 1200);
  failures = count_substr(fx->err, "\"event\":\"register_failed\"");
  OM_TEST_NOTE("failures logged in 1.2 s: %zu", failures);
  OM_ASSERT_CMP(failures, >=, 2);
  OM_ASSERT_CMP(failures, <=, 12); /* >= 100 ms apart */
  /* every retry is announced, and none sooner than 100 ms */
  for (p = strstr(fx->err, "\"event\":\"register_failed\""); p != NULL;
       p = strstr(p + 1, "\"event\":\"register_failed\"")) {
    const char *r = strstr(p, "\"retry_in_ms\":\"");
    const char *eol = strchr(p, '\n');
    assert_non_null(r);
    if (eol != NULL) /* the retry field is on this event's line */
      OM_ASSERT_CMP(r - p, <, eol - p);
    OM_ASSERT_CMP(strtol(r + 15, NULL, 10), >=, 100);
  }
  assert_non_null(strstr(fx->err, "onnect")); /* the cause is logged */
  /* shutdown does not wait for an unreachable control plane forever */
  t0 = now_ms();
  assert_int_equal(uv_process_kill(&fx->proc, SIGTERM), 0);
  assert_true(run_until(fx, has_exited, 0, 6000));
  assert_int_equal(status_of(fx), 0);
  OM_TEST_NOTE("shutdown with the control plane down: %llu ms",
               (unsigned long long)(now_ms() - t0));
  OM_ASSERT_CMP(now_ms() - t0, <, 4000);
  OM_ASSERT_CMP(count_substr(fx->err, "\"event\":\"deregister_failed\""), >=,
                1);
}

/* Run the binary to completion with args; returns its status. */
static int run_flags(fx_t *fx, const char *const *args) {
  free(fx->err);
  fx->err = NULL;
  fx->err_len = 0;
  fx->exited = fx->pipe_closed = fx->proc_closed = 0;
  spawn(fx, args);
  assert_true(run_until(fx, has_exited, 0, 5000));
  fx->spawned = 0;
  return status_of(fx);
}

static void bad_flags_exit_2_naming_the_flag(void **state) {
  fx_t *fx = *state;
  char ctl[64];
  static const struct {
    const char *flag, *value, *want;
  } cases[] = {
      {"--ttl", "10", "--ttl"},
      {"--ttl", "1.5s", "--ttl"},
      {"--ttl", "500ms", "--ttl"},
      {"--ttl", "2h", "--ttl"},
      {"--weight", "0", "--weight"},
      {"--weight", "10001", "--weight"},
      {"--weight", "nan", "--weight"},
      {"--meta", "novalue", "--meta"},
      {"--meta", "=v", "--meta"},
      {"--zone", "", "--zone"},
      {"--drain", "-1s", "--drain"},
      {"--token-file", "/nonexistent", "--token-file"},
      {"--bogus", "x", "--bogus"},
  };
  const char *args[24];
  control_url(fx, ctl, sizeof ctl);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t i = 0;
    args[i++] = "--control";
    args[i++] = ctl;
    args[i++] = "--service";
    args[i++] = "web";
    args[i++] = "--id";
    args[i++] = "w";
    args[i++] = "--url";
    args[i++] = "http://h:1";
    if (strcmp(cases[c].flag, "--ttl") != 0) {
      args[i++] = "--ttl";
      args[i++] = "1s";
    }
    args[i++] = cases[c].flag;
    args[i++] = cases[c].value;
    args[i++] = "--";
    args[i++] = "sleep";
    args[i++] = "30";
    args[i] = NULL;
    if (run_flags(fx, args) != 2 || strstr(fx->err, cases[c].want) == NULL)
      fail_msg("%s %s: status %d, stderr '%s'", cases[c].flag, cases[c].value,
               status_of(fx), fx->err ? fx->err : "");
  }
  {
    const char *a1[] = {"--control", ctl,  "--service", "a/b",
                        "--id",      "w",  "--url",     "http://h:1",
                        "--ttl",     "1s", NULL};
    const char *a2[] = {"--control", "ftp://x", "--service", "s",
                        "--id",      "w",       "--url",     "http://h:1",
                        "--ttl",     "1s",      NULL};
    const char *a3[] = {"--control", ctl,  "--service", "s",
                        "--id",      "..", "--url",     "http://h:1",
                        "--ttl",     "1s", NULL};
    const char *a4[] = {"--control", ctl,  "--service", "s",
                        "--id",      "w",  "--url",     "mailto:x@y",
                        "--ttl",     "1s", NULL};
    const char *a5[] = {"--control", ctl,     "--service", "s", "--id",
                        "w",         "--ttl", "1s",        NULL};
    const char *a6[] = {"--control", ctl,     "--service",  "s",     "--id",
                        "w",         "--url", "http://h:1", "--ttl", NULL};
    assert_int_equal(run_flags(fx, a1), 2);
    assert_non_null(strstr(fx->err, "--service"));
    assert_int_equal(run_flags(fx, a2), 2);
    assert_non_null(strstr(fx->err, "--control"));
    assert_int_equal(run_flags(fx, a3), 2);
    assert_non_null(strstr(fx->err, "--id"));
    assert_int_equal(run_flags(fx, a4), 2);
    assert_non_null(strstr(fx->err, "--url"));
    assert_int_equal(run_flags(fx, a5), 2);
    assert_non_null(strstr(fx->err, "--url: is required"));
    assert_int_equal(run_flags(fx, a6), 2);
    assert_non_null(strstr(fx->err, "--ttl: needs a value"));
  }
  {
    const char *help[] = {"--help", NULL};
    const char *missing[] = {"--control", ctl,  "--service", "s",
                             "--id",      "w",  "--url",     "http://h:1",
                             "--ttl",     "1s", "--",        "/nonexistent/cmd",
                             NULL};
    assert_int_equal(run_flags(fx, help), 0);
    assert_int_equal(run_flags(fx, missing), 127);
    assert_non_null(strstr(fx->err, "/nonexistent/cmd"));
  }
  /* nothing ever reached the control plane */
  assert_int_equal(fx->n_reqs, 0);
}

static int find_binary(void) {
  const char *env = getenv("OPENMESH_BIN");
  char self[PATH_MAX];
  ssize_t n;
  char *slash;
  if (env != NULL && env[0] != '\0') {
    snprintf(openmesh_bin, sizeof openmesh_bin, "%s", env);
    return access(openmesh_bin, X_OK);
  }
  n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    return -1;
  self[n] = '\0';
  slash = strrchr(self, '/');
  if (slash == NULL)
    return -1;
  *slash = '\0';
  snprintf(openmesh_bin, sizeof openmesh_bin, "%.*s/bin/openmesh",
           (int)(sizeof openmesh_bin - 16), self);
  return access(openmesh_bin, X_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(registers_renews_and_deletes, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(retries_503_and_reregisters_after_404,
                                      fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(fails_over_to_the_next_plane_at_once,
                                      fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(sigterm_deletes_before_cmd_is_signalled,
                                      fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(second_signal_skips_the_drain, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(cmd_exit_deletes_and_propagates, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(cmd_killed_by_signal, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(unreachable_control_plane, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(bad_flags_exit_2_naming_the_flag,
                                      fx_setup, fx_teardown),
  };
  signal(SIGPIPE, SIG_IGN); /* the server writes with writev */
  if (find_binary() != 0) {
    fprintf(stderr,
            "test_register: no executable openmesh at %s (set "
            "OPENMESH_BIN)\n",
            openmesh_bin);
    return 1;
  }
  return cmocka_run_group_tests(tests, NULL, NULL);
}
