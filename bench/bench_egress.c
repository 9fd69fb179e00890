/*
 * bench_egress.c: what the egress gateway adds to a model call on the happy
 * path (quality gate off): the same chat completion sent to a fake provider
 * directly, and through `om_egress` in front of it, one at a time over kept
 * alive loopback connections. The baseline is measured in the same run.
 * Everything (client, gateway, provider) shares one loop, so the added
 * latency is the gateway's own work: parsing, the fallback policy's
 * order(ctx) in Lua, classification, the outbound call, the response.
 *
 * Bar (docs/BENCHMARKS.md, "Egress"): egress_added_p50 <= 200 us.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "om_bench.h"
#include "om_curl_uv.h"
#include "om_egress.h"
#include "om_http_server.h"
#include "om_log.h"

#define ROUNDS 5
#define PER_ROUND 1500
#define WARMUP 300

static uv_loop_t loop;
static om_curl_uv_t *cu;
static int done_flag;
static uint64_t t_start;

static const char BODY[] =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"You are "
    "a helpful support agent.\"},{\"role\":\"user\",\"content\":\"Where is my "
    "order 12?\"}]}";

static void fake(om_http_request_t *req, void *ud) {
  static const om_http_header_t h[] = {
      {"Content-Type", "application/json", 0, 0}};
  static const char ok[] =
      "{\"id\":\"x\",\"object\":\"chat.completion\",\"created\":1,\"model\":"
      "\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
      "\"content\":\"Your order shipped yesterday and arrives Friday.\"},"
      "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":20,"
      "\"completion_tokens\":11,\"total_tokens\":31}}";
  (void)ud;
  om_http_respond(req, 200, h, 1, ok, sizeof ok - 1);
}

static double elapsed_us;
static long last_status;

static void on_resp(void *ud, om_curl_resp_t *r) {
  (void)ud;
  last_status = r->status;
  elapsed_us = (double)(om_bench_now_ns() - t_start) / 1e3;
  done_flag = 1;
}

static double one(const char *url) {
  const char *h[] = {"Content-Type: application/json"};
  om_curl_req_t req = {.method = "POST",
                       .url = url,
                       .headers = h,
                       .n_headers = 1,
                       .body = BODY,
                       .body_len = sizeof BODY - 1,
                       .timeout_ms = 5000};
  done_flag = 0;
  t_start = om_bench_now_ns();
  if (om_curl_uv_request(cu, &req, on_resp, NULL, NULL) != 0)
    exit(1);
  while (!done_flag)
    uv_run(&loop, UV_RUN_ONCE);
  if (last_status != 200) {
    fprintf(stderr, "bench_egress: status %ld\n", last_status);
    exit(1);
  }
  return elapsed_us;
}

static double p50(const char *url) {
  static double v[PER_ROUND];
  for (int i = 0; i < PER_ROUND; i++)
    v[i] = one(url);
  return om_bench_median(v, PER_ROUND);
}

int main(void) {
  om_http_server_t *srv;
  om_egress_t *g;
  om_egress_opts_t o;
  char dir[] = "/tmp/om-bench-egress-XXXXXX", path[256], policy[1024];
  char direct[128], via[128], err[512];
  double d[ROUNDS], e[ROUNDS], a[ROUNDS];
  FILE *f;
  om_log_set_level(OM_LOG_ERROR);
  uv_loop_init(&loop);
  if (mkdtemp(dir) == NULL ||
      om_http_server_new(&loop, NULL, fake, NULL, &srv) != 0 ||
      om_http_server_listen(srv, "127.0.0.1", 0) != 0)
    return 1;
  snprintf(policy, sizeof policy,
           "return { kind = \"fallback\", routes = {\n"
           "  { name = \"primary\", provider = \"openai\", base_url = "
           "\"http://127.0.0.1:%d/v1\", model = \"m\" },\n"
           "  { name = \"backup\", provider = \"openai\", base_url = "
           "\"http://127.0.0.1:%d/v1\", model = \"m\" } },\n"
           "  order = function(ctx) if ctx.context == \"async\" then return "
           "{ \"backup\", \"primary\" } end return { \"primary\", \"backup\" } "
           "end }\n",
           om_http_server_port(srv), om_http_server_port(srv));
  snprintf(path, sizeof path, "%s/fallback.lua", dir);
  f = fopen(path, "w");
  if (f == NULL)
    return 1;
  fputs(policy, f);
  fclose(f);
  memset(&o, 0, sizeof o);
  o.fallback_path = path;
  o.heuristics_path = OM_SOURCE_DIR "/policies/egress_heuristics.lua";
  o.seed = 1;
  if (om_egress_new(&loop, &o, &g, err, sizeof err) != 0 ||
      om_egress_listen(g, "127.0.0.1", 0) != 0) {
    fprintf(stderr, "bench_egress: %s\n", err);
    return 1;
  }
  if (om_curl_uv_new(&loop, &cu) != 0)
    return 1;
  snprintf(direct, sizeof direct, "http://127.0.0.1:%d/v1/chat/completions",
           om_http_server_port(srv));
  snprintf(via, sizeof via, "http://127.0.0.1:%d/v1/chat/completions",
           om_egress_port(g));
  for (int i = 0; i < WARMUP; i++) {
    one(direct);
    one(via);
  }
  /* interleaved rounds: drift on a busy box hits both sides alike */
  for (int r = 0; r < ROUNDS; r++) {
    d[r] = p50(direct);
    e[r] = p50(via);
    a[r] = e[r] - d[r];
  }
  om_bench_report("egress_direct_p50", om_bench_median(d, ROUNDS), "us");
  om_bench_report("egress_gateway_p50", om_bench_median(e, ROUNDS), "us");
  om_bench_report("egress_added_p50", om_bench_median(a, ROUNDS), "us");
  snprintf(path, sizeof path, "rm -rf %s", dir);
  if (system(path) != 0)
    return 0;
  return 0;
}
