/*
 * test_egress.c: the gateway engine (host/egress/om_egress.h) in-process: a
 * fake provider on an om_http_server on the same loop, the gateway in front of
 * it, requests through om_curl_uv. The end-to-end rules (every fault of the
 * issue, the fault campaign) are in spec/03-integration/egress_spec.lua
 * against the real binary; this file covers construction errors, allocation
 * failure, and one happy and one degraded path of each endpoint.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "om_curl_uv.h"
#include "om_egress.h"
#include "om_errno.h"
#include "om_http_server.h"

static uv_loop_t loop;
static char tmpdir[64];
static int fake_port;
static int script[16], n_script, script_pos, fake_requests;

/* The fake provider: answers script[i] for request i (200 = a reply), then
 * 200. */
static void fake_request(om_http_request_t *req, void *ud) {
  static const om_http_header_t h[] = {
      {"Content-Type", "application/json", 0, 0}};
  int st = script_pos < n_script ? script[script_pos++] : 200;
  const char *ok = "{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":"
                   "[{\"index\":0,\"message\":{\"role\":\"assistant\","
                   "\"content\":\"Fine, thanks.\"},\"finish_reason\":"
                   "\"stop\"}],\"usage\":{\"completion_tokens\":3}}";
  const char *err = "{\"error\":{\"type\":\"server_error\",\"message\":"
                    "\"upstream exploded\",\"code\":null}}";
  (void)ud;
  fake_requests++;
  if (st == 200)
    om_http_respond(req, 200, h, 1, ok, strlen(ok));
  else
    om_http_respond(req, st, h, 1, err, strlen(err));
}

static void write_file(const char *name, const char *text) {
  char path[256];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void path_of(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", tmpdir, name);
}

static int setup(void **state) {
  om_http_server_t *srv;
  char policy[2048];
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/om-test-egress-XXXXXX");
  assert_non_null(mkdtemp(tmpdir));
  uv_loop_init(&loop);
  assert_int_equal(om_http_server_new(&loop, NULL, fake_request, NULL, &srv),
                   0);
  assert_int_equal(om_http_server_listen(srv, "127.0.0.1", 0), 0);
  fake_port = om_http_server_port(srv);
  snprintf(policy, sizeof policy,
           "return { kind = \"fallback\", routes = {\n"
           "  { name = \"a\", provider = \"openai\", base_url = "
           "\"http://127.0.0.1:%d/a/v1\", model = \"m\", attempt_timeout_ms "
           "= 2000, first_byte_timeout_ms = 1000 } },\n"
           "  max_attempts = 3, deadline_ms = 3000, per_wait_ceiling_ms = "
           "50, backoff_base_ms = 5, backoff_cap_ms = 20,\n"
           "  pending_retry_interval_ms = 100000, commitment_ms = 100 }\n",
           fake_port);
  write_file("fallback.lua", policy);
  write_file("heuristics.lua",
             "return { kind = \"egress_heuristics\", checks = {},\n"
             "  holding_lines = { default = \"One moment.\" } }\n");
  {
    char chans[512], out[256];
    path_of(out, sizeof out, "user.jsonl");
    snprintf(chans, sizeof chans,
             "{\"user\": {\"kind\": \"file\", \"target\": \"%s\"}}", out);
    write_file("channels.json", chans);
  }
  write_file("bad_kind.json", "{\"user\": {\"kind\": \"pigeon\", "
                              "\"target\": \"x\"}}");
  write_file("bad_json.json", "{\"user\": ");
  write_file("bad_shape.json", "{\"user\": {\"kind\": \"file\", \"target\": "
                               "\"/tmp/x\", \"part_limit\": -4}}");
  *state = srv;
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  om_http_server_close(*state, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0)
    return 0;
  return 0;
}

static void opts_for(om_egress_opts_t *o, char *fb, char *he, char *ch,
                     const char *channels) {
  memset(o, 0, sizeof *o);
  path_of(fb, 256, "fallback.lua");
  path_of(he, 256, "heuristics.lua");
  path_of(ch, 256, channels);
  o->fallback_path = fb;
  o->heuristics_path = he;
  o->channels_path = ch;
  o->seed = 1;
}

static int closed_flag;
static void on_closed(void *ud) {
  (void)ud;
  closed_flag = 1;
}

static void close_gateway(om_egress_t *g) {
  closed_flag = 0;
  om_egress_close(g, on_closed, NULL);
  while (!closed_flag)
    uv_run(&loop, UV_RUN_ONCE);
}

static void new_rejects_bad_configuration(void **state) {
  om_egress_opts_t o;
  om_egress_t *g = NULL;
  char fb[256], he[256], ch[256], err[512];
  (void)state;
  opts_for(&o, fb, he, ch, "bad_kind.json");
  assert_int_equal(om_egress_new(&loop, &o, &g, err, sizeof err), OM_EINVAL);
  assert_non_null(strstr(err, "channel 'user'"));
  assert_null(g);
  opts_for(&o, fb, he, ch, "bad_json.json");
  assert_int_equal(om_egress_new(&loop, &o, &g, err, sizeof err), OM_EINVAL);
  assert_non_null(strstr(err, "--channels"));
  opts_for(&o, fb, he, ch, "bad_shape.json");
  assert_int_equal(om_egress_new(&loop, &o, &g, err, sizeof err), OM_EINVAL);
  assert_non_null(strstr(err, "part_limit"));
  opts_for(&o, fb, he, ch, "channels.json");
  o.fallback_path = "/nonexistent/fallback.lua";
  OM_ASSERT_CMP(om_egress_new(&loop, &o, &g, err, sizeof err), <, 0);
  opts_for(&o, fb, he, ch, "channels.json");
  o.heuristics_path = fb; /* a fallback policy where heuristics belong */
  OM_ASSERT_CMP(om_egress_new(&loop, &o, &g, err, sizeof err), <, 0);
  assert_int_equal(om_egress_new(&loop, NULL, &g, err, sizeof err), OM_EINVAL);
  /* an errors file that cannot be appended to: invalid input naming the
   * flag (the command exits 2) */
  opts_for(&o, fb, he, ch, "channels.json");
  o.errors_path = "/nonexistent-dir-om/errors.jsonl";
  assert_int_equal(om_egress_new(&loop, &o, &g, err, sizeof err), OM_EINVAL);
  assert_non_null(strstr(err, "--errors /nonexistent-dir-om/errors.jsonl"));
  assert_non_null(strstr(err, "No such file or directory"));
  o.errors_path = tmpdir; /* a directory */
  assert_int_equal(om_egress_new(&loop, &o, &g, err, sizeof err), OM_EINVAL);
  assert_non_null(strstr(err, "--errors"));
  assert_null(g);
  uv_run(&loop, UV_RUN_NOWAIT);
}

static void new_survives_allocation_failure(void **state) {
  om_egress_opts_t o;
  om_egress_t *g = NULL;
  char fb[256], he[256], ch[256], err[512];
  long failures = 0;
  (void)state;
  opts_for(&o, fb, he, ch, "channels.json");
  /* every allocation up to 300, then every 97th: bounded time under ASan */
  for (long n = 0;; n += n < 300 ? 1 : 97) {
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_egress_new(&loop, &o, &g, err, sizeof err);
    om_test_alloc_reset();
    if (rc == 0) {
      close_gateway(g);
      break;
    }
    failures++;
    /* out of memory surfaces as ENOMEM, or as a policy that could not load */
    {
      static const LargestIntegralType oom_codes[] = {OM_ENOMEM, OM_EPOLICY,
                                                      OM_EIO, OM_EINVAL};
      assert_in_set(rc, oom_codes, 4);
    }
    uv_run(&loop, UV_RUN_NOWAIT); /* handles of the failed try close */
    OM_ASSERT_CMP(n, <, 1000000);
  }
  OM_TEST_NOTE("om_egress_new failed cleanly under %ld allocation failures",
               failures);
  OM_ASSERT_CMP(failures, >, 0);
}

/* ---- a client on the same loop
 * ----------------------------------------------- */

typedef struct {
  int done;
  long status;
  char body[65536];
} resp_t;

static void on_resp(void *ud, om_curl_resp_t *r) {
  resp_t *out = ud;
  out->done = 1;
  out->status = r->status;
  /* a body cut short would hide a line the test looks for: refuse it */
  if (r->body != NULL) /* prints the length and the range it missed */
    assert_in_range(strlen(r->body), 0, sizeof out->body - 1);
  snprintf(out->body, sizeof out->body, "%s", r->body ? r->body : "");
}

static void post(om_curl_uv_t *cu, int port, const char *path, const char *body,
                 resp_t *out) {
  char url[128];
  const char *h[] = {"Content-Type: application/json"};
  om_curl_req_t req = {.method = "POST",
                       .url = url,
                       .headers = h,
                       .n_headers = 1,
                       .body = body,
                       .body_len = strlen(body),
                       .timeout_ms = 10000};
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
  memset(out, 0, sizeof *out);
  assert_int_equal(om_curl_uv_request(cu, &req, on_resp, out, NULL), 0);
  while (!out->done)
    uv_run(&loop, UV_RUN_ONCE);
}

static void curl_closed(void *ud) {
  *(int *)ud = 1;
}

static void chat_and_turns_end_to_end(void **state) {
  om_egress_opts_t o;
  om_egress_t *g = NULL;
  om_curl_uv_t *cu;
  char fb[256], he[256], ch[256], err[512], user[256];
  resp_t r;
  json_t *j;
  int port, cdone = 0;
  FILE *f;
  char line[1024];
  (void)state;
  opts_for(&o, fb, he, ch, "channels.json");
  assert_int_equal(om_egress_new(&loop, &o, &g, err, sizeof err), 0);
  assert_int_equal(om_egress_listen(g, "127.0.0.1", 0), 0);
  port = om_egress_port(g);
  assert_int_equal(om_curl_uv_new(&loop, &cu), 0);

  /* 503 then a reply: retried on the same (only) route */
  script[0] = 503;
  n_script = 1;
  script_pos = fake_requests = 0;
  post(cu, port, "/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "Fine, thanks."));
  assert_int_equal(fake_requests, 2);

  /* every attempt fails: a structured error, never the provider's text */
  script[0] = script[1] = script[2] = 500;
  n_script = 3;
  script_pos = fake_requests = 0;
  post(cu, port, "/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
  assert_int_equal(r.status, 502);
  j = json_loads(r.body, 0, NULL);
  assert_non_null(j);
  assert_string_equal(
      json_string_value(json_object_get(json_object_get(j, "error"), "type")),
      "all_routes_failed");
  json_decref(j);
  assert_null(strstr(r.body, "upstream exploded"));
  assert_int_equal(fake_requests, 3);

  /* a malformed body */
  post(cu, port, "/v1/chat/completions", "{\"messages\": 5}", &r);
  assert_int_equal(r.status, 400);

  /* a turn delivered to the file channel */
  n_script = 0;
  post(cu, port, "/v1/turns",
       "{\"agent\":\"a\",\"conversation\":\"c1\",\"run_id\":\"r1\","
       "\"context\":\"interactive\",\"channel\":\"user\",\"request\":"
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}",
       &r);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "\"outcome\":\"delivered\""));

  /* an async turn that fails: silent, pending, nothing sent */
  script[0] = script[1] = script[2] = 500;
  n_script = 3;
  script_pos = 0;
  post(cu, port, "/v1/turns",
       "{\"agent\":\"a\",\"conversation\":\"c2\",\"context\":\"async\","
       "\"channel\":\"user\",\"request\":{\"messages\":[{\"role\":\"user\","
       "\"content\":\"hi\"}]}}",
       &r);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "\"outcome\":\"silent\""));
  assert_non_null(strstr(r.body, "\"error_id\":\"err-"));
  memset(&r, 0, sizeof r);
  {
    char url[128];
    om_curl_req_t req = {.url = url, .timeout_ms = 5000};
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/pending", port);
    assert_int_equal(om_curl_uv_request(cu, &req, on_resp, &r, NULL), 0);
    while (!r.done)
      uv_run(&loop, UV_RUN_ONCE);
    assert_non_null(strstr(r.body, "\"conversation\":\"c2\""));
  }
  /* the file channel got exactly the one reply */
  for (int i = 0; i < 50; i++)
    uv_run(&loop, UV_RUN_NOWAIT);
  path_of(user, sizeof user, "user.jsonl");
  f = fopen(user, "r");
  assert_non_null(f);
  int lines = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    lines++;
    assert_non_null(strstr(line, "Fine, thanks."));
    assert_null(strstr(line, "exploded"));
  }
  fclose(f);
  assert_int_equal(lines, 1);
  om_curl_uv_close(cu, curl_closed, &cdone);
  close_gateway(g);
  while (!cdone)
    uv_run(&loop, UV_RUN_ONCE);
}

static void get(om_curl_uv_t *cu, int port, const char *path, resp_t *out) {
  char url[128];
  om_curl_req_t req = {.url = url, .timeout_ms = 5000};
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
  memset(out, 0, sizeof *out);
  assert_int_equal(om_curl_uv_request(cu, &req, on_resp, out, NULL), 0);
  while (!out->done)
    uv_run(&loop, UV_RUN_ONCE);
}

/* One chat call whose every attempt fails: one EgressError line. */
static void failing_chat(om_curl_uv_t *cu, int port) {
  resp_t r;
  script[0] = script[1] = script[2] = 500;
  n_script = 3;
  script_pos = 0;
  post(cu, port, "/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
  assert_int_equal(r.status, 502);
  assert_null(strstr(r.body, "upstream exploded"));
}

static int file_lines(const char *path, const char *must) {
  char line[8192];
  int n = 0;
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof line, f) != NULL) {
    n++;
    assert_non_null(strstr(line, "\"error_id\":\"err-"));
    assert_non_null(strstr(line, must));
  }
  fclose(f);
  return n;
}

/* The errors file follows its path: renamed away (logrotate) or deleted,
 * the next line goes to a new file at the path; the gateway never writes
 * into an inode nobody can find. */
static void errors_file_follows_rotation(void **state) {
  om_egress_opts_t o;
  om_egress_t *g = NULL;
  om_curl_uv_t *cu;
  char fb[256], he[256], ch[256], err[512], errors[256], rotated[256];
  int port, cdone = 0;
  (void)state;
  opts_for(&o, fb, he, ch, "channels.json");
  path_of(errors, sizeof errors, "errors.jsonl");
  path_of(rotated, sizeof rotated, "errors.jsonl.1");
  o.errors_path = errors;
  assert_int_equal(om_egress_new(&loop, &o, &g, err, sizeof err), 0);
  assert_int_equal(om_egress_listen(g, "127.0.0.1", 0), 0);
  port = om_egress_port(g);
  assert_int_equal(om_curl_uv_new(&loop, &cu), 0);
  failing_chat(cu, port);
  assert_int_equal(file_lines(errors, "upstream exploded"), 1);
  assert_int_equal(rename(errors, rotated), 0);
  failing_chat(cu, port);
  assert_int_equal(file_lines(rotated, "upstream exploded"), 1);
  assert_int_equal(file_lines(errors, "upstream exploded"), 1);
  assert_int_equal(unlink(errors), 0);
  failing_chat(cu, port);
  failing_chat(cu, port);
  assert_int_equal(file_lines(errors, "upstream exploded"), 2);
  assert_int_equal(file_lines(rotated, "upstream exploded"), 1);
  unlink(errors);
  unlink(rotated);
  om_curl_uv_close(cu, curl_closed, &cdone);
  close_gateway(g);
  while (!cdone)
    uv_run(&loop, UV_RUN_ONCE);
}

/* A write that fails (a full disk: /dev/full answers ENOSPC) is counted in
 * a metric and never fails or stalls the call it tracks. */
static void errors_file_write_failure_is_counted(void **state) {
  om_egress_opts_t o;
  om_egress_t *g = NULL;
  om_curl_uv_t *cu;
  char fb[256], he[256], ch[256], err[512];
  resp_t r;
  int port, cdone = 0;
  (void)state;
  if (access("/dev/full", W_OK) != 0)
    skip();
  opts_for(&o, fb, he, ch, "channels.json");
  o.errors_path = "/dev/full";
  assert_int_equal(om_egress_new(&loop, &o, &g, err, sizeof err), 0);
  assert_int_equal(om_egress_listen(g, "127.0.0.1", 0), 0);
  port = om_egress_port(g);
  assert_int_equal(om_curl_uv_new(&loop, &cu), 0);
  failing_chat(cu, port);
  failing_chat(cu, port);
  get(cu, port, "/metrics", &r);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(
      r.body, "openmesh_egress_errors_file_failures_total{op=\"write\"} 2"));
  assert_non_null(strstr(
      r.body, "openmesh_egress_errors_file_failures_total{op=\"reopen\"} 0"));
  /* and the gateway still answers */
  n_script = 0;
  post(cu, port, "/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
  assert_int_equal(r.status, 200);
  om_curl_uv_close(cu, curl_closed, &cdone);
  close_gateway(g);
  while (!cdone)
    uv_run(&loop, UV_RUN_ONCE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_rejects_bad_configuration),
      cmocka_unit_test(chat_and_turns_end_to_end),
      cmocka_unit_test(errors_file_follows_rotation),
      cmocka_unit_test(errors_file_write_failure_is_counted),
      cmocka_unit_test(new_survives_allocation_failure),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
