/*
 * bench_watch_encode.c: what one change of a 10,000-instance service costs
 * the control plane before any watcher is written to: the watch event of
 * the new snapshot, encoded once (om_snapshot_sse_cached: the JSON
 * document and its SSE framing) and then shared by every watcher.
 * bench/watch_bench.py measures the fan-out of the same service over the
 * real binary (docs/BENCHMARKS.md "Watch fan-out and coalescing").
 *
 * watch_encode_10k_instances_ms   median of 21 fresh snapshots (each one
 *                                 instance changed, as a registration
 *                                 makes it), after one warm-up: the
 *                                 changed chunk of 256 is encoded, the
 *                                 other chunks' cached bytes copied
 * watch_encode_10k_instances_cold_ms that warm-up: the first encoding,
 *                                 every chunk encoded
 * watch_encode_10k_instances_bytes the size of the event
 *
 * The instances have the shape watch_bench.py registers: a URL, a zone,
 * a ttl and two metadata entries.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_bench.h"
#include "om_snapshot.h"
#include "om_snapshot_json.h"

#define N_INSTANCES 10000
#define ROUNDS 21

static void fill(om_instance_t *in, om_kv_t *kv, char *id, char *url, char *n,
                 size_t i, unsigned change) {
  snprintf(id, 24, "inst-%05zu", i);
  snprintf(url, 48, "http://127.1.%zu.%zu:8080", i / 250, i % 250 + 1);
  snprintf(n, 16, "%u", change);
  kv[0].key = "version";
  kv[0].value = "v1";
  kv[1].key = "n";
  kv[1].value = n;
  memset(in, 0, sizeof *in);
  in->id = id;
  in->url = url;
  in->zone = "eu-1";
  in->weight = 1;
  in->ttl_ms = 60000;
  in->metadata = kv;
  in->n_metadata = 2;
}

int main(void) {
  om_instance_t *ins = calloc(N_INSTANCES, sizeof *ins);
  om_kv_t *kvs = calloc(N_INSTANCES, 2 * sizeof *kvs);
  char(*ids)[24] = calloc(N_INSTANCES, sizeof *ids);
  char(*urls)[48] = calloc(N_INSTANCES, sizeof *urls);
  char(*ns)[16] = calloc(N_INSTANCES, sizeof *ns);
  om_snapshot_t *snap = NULL;
  double ms[ROUNDS], cold = 0;
  size_t len = 0;
  if (ins == NULL || kvs == NULL || ids == NULL || urls == NULL || ns == NULL)
    return 1;
  for (size_t i = 0; i < N_INSTANCES; i++)
    fill(&ins[i], &kvs[2 * i], ids[i], urls[i], ns[i], i, 0);
  if (om_snapshot_new("big", 1, ins, N_INSTANCES, &snap, NULL, NULL, NULL) !=
      0) {
    fprintf(stderr, "bench_watch_encode: om_snapshot_new failed\n");
    return 1;
  }
  for (int r = -1; r < ROUNDS; r++) {
    om_instance_t put;
    om_kv_t kv[2];
    char id[24], url[48], n[16];
    om_snapshot_t *next = NULL;
    const char *data;
    uint64_t t0;
    size_t k = (size_t)(r + 1) * 37 % N_INSTANCES;
    fill(&put, kv, id, url, n, k, (unsigned)r + 2);
    if (om_snapshot_edit(snap, (uint64_t)r + 3, &put, 1, NULL, 0, &next, NULL,
                         NULL, NULL) != 0) {
      fprintf(stderr, "bench_watch_encode: om_snapshot_edit failed\n");
      return 1;
    }
    om_snapshot_unref(snap);
    snap = next;
    t0 = om_bench_now_ns();
    if (om_snapshot_sse_cached(snap, &data, &len) != 0) {
      fprintf(stderr, "bench_watch_encode: encode failed\n");
      return 1;
    }
    OM_BENCH_SINK(data);
    if (r >= 0)
      ms[r] = (double)(om_bench_now_ns() - t0) / 1e6;
    else
      cold = (double)(om_bench_now_ns() - t0) / 1e6;
  }
  om_bench_report("watch_encode_10k_instances_ms", om_bench_median(ms, ROUNDS),
                  "ms");
  om_bench_report("watch_encode_10k_instances_cold_ms", cold, "ms");
  om_bench_report("watch_encode_10k_instances_bytes", (double)len, "B");
  om_snapshot_unref(snap);
  free(ins);
  free(kvs);
  free(ids);
  free(urls);
  free(ns);
  return 0;
}
