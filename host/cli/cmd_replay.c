/*
 * cmd_replay.c: `openmesh replay`, what a policy change would move
 * (docs/POLICIES.md "Replay").
 *
 * Every request of a proxy's access log runs through the NEW traffic
 * policy (and OLD with --against), loaded and called as the proxy does
 * (om_policy_load_file, om_policy_route_view under the policy's budget,
 * one policy state per service with that service's peers). A decision is
 * what the proxy would do with it before any attempt: fail (the policy
 * raised or overran its budget, authorize refused, the subset is empty),
 * or a peer: the rendezvous pick inside the subset for a keyed request
 * (the policy's key, else the logged x-openmesh-key), exactly the proxy's
 * first pick with every circuit closed, or the subset itself for an
 * unkeyed one (P2C picks inside it by load, which a log cannot replay).
 * Without --against, OLD is what the log recorded: its peer and outcome.
 *
 * compare() is the one place two decisions meet; what it says is counted
 * per service and kind, with a few request ids as examples.
 */
#include "om_cmds.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <uv.h>

#include "om_cli.h"
#include "om_cli_util.h"
#include "om_errno.h"
#include "om_paths.h"
#include "om_policy.h"
#include "om_rendezvous.h"
#include "om_snapshot.h"
#include "om_snapshot_json.h"

#define MAX_SERVICES 256
#define MAX_LOG_PEERS 4096 /* per service, when peers come from the log */
#define MAX_BUCKETS 256    /* distinct moves or failures per service */
#define EXAMPLES 3
#define LABEL_MAX 192

/* A decision about one request. */
typedef struct {
  int fails;             /* 1: the request would fail */
  char reason[32];       /* policy_error, forbidden, no_peers, ... */
  char label[LABEL_MAX]; /* the peer (keyed) or the subset (unkeyed) */
  int32_t peer;          /* keyed: the index picked; -1: none */
  const uint32_t *subset;
  size_t n_subset; /* into the caller's scratch */
  int all;
  /* what decide(req) said, as text ("" when the log is OLD: it keeps
   * none): "deadline_ms=2000 retries=0 set:x-tenant", or "-" */
  char settings[LABEL_MAX];
} decision_t;

typedef struct {
  char what[2 * LABEL_MAX + 8]; /* "A -> B" or the failure's reason */
  uint64_t count;
  char examples[EXAMPLES][64];
  int n_examples;
} bucket_t;

typedef struct {
  bucket_t *b;
  size_t n;
  uint64_t other; /* past MAX_BUCKETS */
} buckets_t;

typedef struct {
  char *name;
  om_snapshot_t *snap;
  om_policy_peer_t *pp;
  om_policy_kv_t *kv;
  om_rendezvous_t *rdv;
  om_policy_t *pol_new, *pol_old;
  uint32_t *scratch_new, *scratch_old;
  uint64_t requests, unchanged, moved, now_fail, now_ok, still_fail;
  uint64_t decided_other; /* requests whose decide answer changed */
  buckets_t moves, fails, decisions;
  /* peers seen in the log (without --peers) */
  om_instance_t *seen;
  size_t n_seen;
} svc_t;

typedef struct {
  svc_t *s[MAX_SERVICES];
  size_t n;
  const char *new_path, *old_path;
  om_policy_opts_t popts;
  int threads; /* 1: one pass whatever the size; else two halves */
} replay_t;

static int usage(FILE *f) {
  fprintf(
      f,
      "usage: openmesh replay --log FILE --policy NEW.lua [--against OLD.lua]\n"
      "                       [--peers SNAPSHOT.json] [--json]\n\n"
      "Runs every request of a proxy's access log (openmesh proxy "
      "--access-log)\nthrough the traffic policy NEW, and OLD (default: what "
      "the log recorded),\nand prints per service how many requests would "
      "move from which peer or\nsubset to which, and which would now fail "
      "(docs/POLICIES.md \"Replay\").\n\n"
      "  --log FILE             the access log (JSON lines)\n"
      "  --policy NEW.lua       the changed policy\n"
      "  --against OLD.lua      compare with this policy instead of the log\n"
      "  --peers FILE           the peers: a discovery answer (GET "
      "/v1/services/S)\n"
      "                         or an object of service -> that; default: "
      "the\n"
      "                         peers the log saw (id and address only)\n"
      "  --json                 one JSON document instead of text\n"
      "  --threads 1|2          cores a log over 4 MiB may use (default 2)\n"
      "  --lib DIR              the Lua library (default: the shipped one)\n\n"
      "Exit 0: nothing fails under NEW that did not before; 1: some would; "
      "2: usage\nor an unreadable or malformed file (file:line).\n");
  return f == stdout ? OM_EXIT_OK : OM_EXIT_USAGE;
}

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  size_t cap = 0, n = 0, r;
  if (f == NULL)
    return NULL;
  for (;;) {
    if (n + 65536 + 1 > cap) {
      char *nb = realloc(buf, cap = (n + 65536 + 1) * 2);
      if (nb == NULL) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = nb;
    }
    r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0)
      break;
  }
  fclose(f);
  buf[n] = '\0';
  *len = n;
  return buf;
}

/* ------------------------------------------------------------------ */
/* services and their peers */

static svc_t *find_svc(replay_t *r, const char *name) {
  for (size_t i = 0; i < r->n; i++)
    if (strcmp(r->s[i]->name, name) == 0)
      return r->s[i];
  return NULL;
}

static svc_t *add_svc(replay_t *r, const char *name) {
  svc_t *s;
  if (r->n == MAX_SERVICES || (s = calloc(1, sizeof *s)) == NULL)
    return NULL;
  if ((s->name = strdup(name)) == NULL) {
    free(s);
    return NULL;
  }
  r->s[r->n++] = s;
  return s;
}

/* A discovery answer (or a map of them) into the services' snapshots. */
static int load_peers(replay_t *r, const char *path) {
  size_t len;
  char *buf = read_all(path, &len);
  json_t *doc;
  json_error_t je;
  const char *k;
  json_t *v;
  if (buf == NULL) {
    fprintf(stderr, "openmesh replay: --peers %s: cannot read\n", path);
    return OM_EXIT_USAGE;
  }
  doc = json_loadb(buf, len, 0, &je);
  free(buf);
  if (doc == NULL || !json_is_object(doc)) {
    fprintf(stderr, "openmesh replay: %s:%d: %s\n", path,
            doc == NULL ? je.line : 1,
            doc == NULL ? je.text : "not a JSON object");
    json_decref(doc);
    return OM_EXIT_USAGE;
  }
  if (json_object_get(doc, "instances") != NULL) {
    json_t *m = json_object();
    json_object_set(m,
                    json_string_value(json_object_get(doc, "service"))
                        ? json_string_value(json_object_get(doc, "service"))
                        : "",
                    doc);
    json_decref(doc);
    doc = m;
  }
  json_object_foreach(doc, k, v) {
    char *one = json_dumps(v, JSON_COMPACT);
    om_json_error_t err;
    om_snapshot_t *snap = NULL;
    svc_t *s;
    int rc;
    memset(&err, 0, sizeof err);
    rc = one != NULL ? om_snapshot_from_json(one, strlen(one), &snap, &err)
                     : OM_ENOMEM;
    free(one);
    if (rc != 0) {
      fprintf(stderr, "openmesh replay: %s: service '%s': %s\n", path, k,
              err.text[0] ? err.text : om_strerror(rc));
      json_decref(doc);
      return OM_EXIT_USAGE;
    }
    if (strcmp(k, om_snapshot_service(snap)) != 0) {
      fprintf(stderr,
              "openmesh replay: %s: key '%s' holds service '%s' (they must "
              "be the same)\n",
              path, k, om_snapshot_service(snap));
      om_snapshot_unref(snap);
      json_decref(doc);
      return OM_EXIT_USAGE;
    }
    s = find_svc(r, om_snapshot_service(snap));
    if (s == NULL)
      s = add_svc(r, om_snapshot_service(snap));
    if (s == NULL || s->snap != NULL) {
      fprintf(stderr, "openmesh replay: %s: service '%s' %s\n", path,
              om_snapshot_service(snap),
              s == NULL ? "is one too many" : "appears twice");
      om_snapshot_unref(snap);
      json_decref(doc);
      return OM_EXIT_USAGE;
    }
    s->snap = snap;
  }
  json_decref(doc);
  return OM_EXIT_OK;
}

/* A peer the log saw (id, address) for a service without --peers. */
static void saw_peer(svc_t *s, const char *id, const char *url) {
  om_instance_t *n;
  if (id == NULL || url == NULL || !om_valid_name(id, strlen(id)))
    return;
  for (size_t i = 0; i < s->n_seen; i++)
    if (strcmp(s->seen[i].id, id) == 0)
      return;
  if (s->n_seen == MAX_LOG_PEERS ||
      (n = realloc(s->seen, (s->n_seen + 1) * sizeof *n)) == NULL)
    return;
  s->seen = n;
  memset(&n[s->n_seen], 0, sizeof *n);
  n[s->n_seen].id = strdup(id);
  n[s->n_seen].url = strdup(url);
  n[s->n_seen].weight = 1.0;
  n[s->n_seen].ttl_ms = 10000;
  s->n_seen++;
}

/* The service's peers as the policy and the rendezvous see them (as
 * om__proxy_topo_new builds them), and both policies loaded for it. */
static int prepare_svc(replay_t *r, svc_t *s, char *err, size_t errlen) {
  size_t n, nkv = 0, k = 0;
  om_rendezvous_peer_t *rp;
  int rc;
  if (s->snap == NULL) {
    const char *field = NULL, *why = NULL;
    rc = om_snapshot_new(s->name, 1, s->seen, s->n_seen, &s->snap, NULL, &field,
                         &why);
    if (rc != 0) {
      snprintf(err, errlen, "service '%s': the log's peers: %s %s", s->name,
               field ? field : "", why ? why : om_strerror(rc));
      return rc;
    }
  }
  n = om_snapshot_count(s->snap);
  for (size_t i = 0; i < n; i++)
    nkv += om_snapshot_instance(s->snap, i)->n_metadata;
  s->pp = calloc(n ? n : 1, sizeof *s->pp);
  s->kv = calloc(nkv ? nkv : 1, sizeof *s->kv);
  rp = calloc(n ? n : 1, sizeof *rp);
  s->scratch_new = calloc(n ? n : 1, sizeof(uint32_t));
  s->scratch_old = calloc(n ? n : 1, sizeof(uint32_t));
  if (s->pp == NULL || s->kv == NULL || rp == NULL || s->scratch_new == NULL ||
      s->scratch_old == NULL) {
    free(rp);
    snprintf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    const om_instance_t *in = om_snapshot_instance(s->snap, i);
    s->pp[i] = (om_policy_peer_t){in->id,     in->url,   in->zone,
                                  in->weight, s->kv + k, in->n_metadata};
    for (size_t m = 0; m < in->n_metadata; m++, k++)
      s->kv[k] = (om_policy_kv_t){
          in->metadata[m].key, strlen(in->metadata[m].key),
          in->metadata[m].value, strlen(in->metadata[m].value)};
    rp[i] = (om_rendezvous_peer_t){in->id, 0, in->weight};
  }
  rc =
      n > 0 ? om_rendezvous_new(&(om_rendezvous_opts_t){rp, n, 0}, &s->rdv) : 0;
  free(rp);
  if (rc != 0) {
    snprintf(err, errlen, "service '%s': %s", s->name, om_strerror(rc));
    return rc;
  }
  for (int w = 0; w < 2; w++) {
    const char *path = w == 0 ? r->new_path : r->old_path;
    om_policy_t **pol = w == 0 ? &s->pol_new : &s->pol_old;
    if (path == NULL)
      continue;
    rc = om_policy_load_file(&r->popts, path, pol, err, errlen);
    if (rc != 0)
      return rc;
    if (om_policy_kind(*pol) != OM_POLICY_TRAFFIC) {
      snprintf(err, errlen, "%s: not a traffic policy", path);
      return OM_EINVAL;
    }
    rc = om_policy_set_peers(*pol, s->pp, n);
    if (rc != 0) {
      snprintf(err, errlen, "%s: service '%s': the peers: %s", path, s->name,
               om_strerror(rc));
      return rc;
    }
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* decisions */

static int by_index(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* "a,b,c" or "a,b,c +5" for a subset; "(every peer)" for all. */
static void subset_label(const svc_t *s, const decision_t *d, char *out,
                         size_t cap) {
  size_t k = 0, n = d->all ? om_snapshot_count(s->snap) : d->n_subset;
  if (d->all) {
    snprintf(out, cap, "{every peer}");
    return;
  }
  k += (size_t)snprintf(out + k, cap - k, "{");
  for (size_t i = 0; i < n && i < 4 && k < cap; i++)
    k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? "," : "",
                          s->pp[d->subset[i]].id);
  if (n > 4 && k < cap)
    k += (size_t)snprintf(out + k, cap - k, " +%zu", n - 4);
  if (k < cap)
    snprintf(out + k, cap - k, "}");
}

/*
 * What pol decides for preq (fields: the logged ones, for the
 * x-openmesh-key fallback): the proxy's on_request up to its first pick.
 */
/* A decision as the report shows it: the fields it set with their
 * values, the headers it sets or removes by name (their values may be
 * per request: by name they group); "-" for none. */
static void describe_decision(const om_policy_decision_t *d, char *out,
                              size_t cap) {
  static const struct {
    unsigned bit;
    const char *name;
  } fields[] = {{OM_DECIDE_DEADLINE, "deadline_ms"},
                {OM_DECIDE_PER_TRY, "per_try_timeout_ms"},
                {OM_DECIDE_RETRIES, "retries"},
                {OM_DECIDE_RETRY_UNSAFE, "retry_non_idempotent"},
                {OM_DECIDE_STREAM_IDLE, "stream_idle_timeout_ms"},
                {OM_DECIDE_MAX_STREAM, "max_stream_ms"},
                {OM_DECIDE_MAX_BODY, "max_body_bytes"}};
  size_t k = 0;
  out[0] = '\0';
  if (d == NULL || (d->fields == 0 && d->n_headers == 0)) {
    snprintf(out, cap, "-");
    return;
  }
  for (size_t i = 0; i < sizeof fields / sizeof fields[0] && k < cap; i++) {
    unsigned long long v;
    if (!(d->fields & fields[i].bit))
      continue;
    switch (fields[i].bit) {
    case OM_DECIDE_DEADLINE:
      v = d->deadline_ms;
      break;
    case OM_DECIDE_PER_TRY:
      v = d->per_try_ms;
      break;
    case OM_DECIDE_RETRIES:
      v = d->retries;
      break;
    case OM_DECIDE_RETRY_UNSAFE:
      v = (unsigned)d->retry_non_idempotent;
      break;
    case OM_DECIDE_STREAM_IDLE:
      v = d->stream_idle_ms;
      break;
    case OM_DECIDE_MAX_STREAM:
      v = d->max_stream_ms;
      break;
    default:
      v = d->max_body_bytes;
      break;
    }
    k += (size_t)snprintf(out + k, cap - k, "%s%s=%llu", k ? " " : "",
                          fields[i].name, v);
  }
  for (uint32_t i = 0; i < d->n_headers && k < cap; i++) {
    const om_policy_header_edit_t *e = &d->headers[i];
    k += (size_t)snprintf(out + k, cap - k, "%s%s:%.*s", k ? " " : "",
                          e->value_len == OM_DECIDE_REMOVE ? "remove" : "set",
                          (int)e->name_len, d->bytes + e->name);
  }
}

static void decide(const svc_t *s, om_policy_t *pol, uint32_t *scratch,
                   const om_policy_req_t *preq, decision_t *d) {
  char err[512];
  const char *key = NULL;
  size_t key_len = 0, n = 0;
  int all = 0, rc;
  memset(d, 0, sizeof *d);
  d->peer = -1;
  om_policy_decision_t dec; /* on the stack: each half has a thread */
  int decided = 0;
  rc = om_policy_route_decide(pol, preq, scratch, &n, &all, &key, &key_len,
                              &dec, &decided, err, sizeof err);
  if (rc == 0)
    describe_decision(decided ? &dec : NULL, d->settings, sizeof d->settings);
  if (rc == OM_POLICY_DENIED || rc != 0) {
    d->fails = 1;
    snprintf(d->reason, sizeof d->reason, "%s",
             rc == OM_POLICY_DENIED ? "forbidden" : "policy_error");
    return;
  }
  if (n == 0) {
    d->fails = 1;
    snprintf(d->reason, sizeof d->reason, "no_peers");
    return;
  }
  d->all = all;
  d->subset = all ? NULL : scratch;
  d->n_subset = n;
  if (!all)
    qsort(scratch, n, sizeof *scratch, by_index);
  if (key == NULL || key_len == 0) {
    const om_policy_kv_t *f = om_policy_req_header(preq, "x-openmesh-key");
    if (f != NULL && f->value_len > 0)
      key = f->value, key_len = f->value_len;
  }
  if (key != NULL && key_len > 0 && s->rdv != NULL) {
    uint64_t h = om_rendezvous_key_hash(s->rdv, key, key_len);
    uint32_t i =
        om_rendezvous_best_hash(s->rdv, h, all ? NULL : scratch, n, NULL, NULL);
    if (i < om_snapshot_count(s->snap)) {
      d->peer = (int32_t)i;
      snprintf(d->label, sizeof d->label, "%s", s->pp[i].id);
      return;
    }
  }
  subset_label(s, d, d->label, sizeof d->label);
}

/* The decision the log recorded: its outcome and peer. */
static void recorded(const svc_t *s, const char *outcome, const char *peer,
                     decision_t *d) {
  memset(d, 0, sizeof *d);
  d->peer = -1;
  /* the refusals a policy change can cause or cure; an upstream failure
   * or a client that left says nothing about the policy */
  if (strncmp(outcome, "policy_", 7) == 0 || /* runtime, budget, answer */
      strcmp(outcome, "forbidden") == 0 || strcmp(outcome, "no_peers") == 0) {
    d->fails = 1;
    snprintf(d->reason, sizeof d->reason, "%s", outcome);
    return;
  }
  if (peer != NULL) {
    snprintf(d->label, sizeof d->label, "%s", peer);
    for (size_t i = 0; i < om_snapshot_count(s->snap); i++)
      if (strcmp(s->pp[i].id, peer) == 0)
        d->peer = (int32_t)i;
  }
}

static int subset_has(const decision_t *d, int32_t i) {
  if (d->all)
    return 1;
  for (size_t k = 0; k < d->n_subset; k++)
    if ((int32_t)d->subset[k] == i)
      return 1;
  return 0;
}

static int same_subset(const decision_t *a, const decision_t *b) {
  if (a->all || b->all)
    return a->all == b->all;
  return a->n_subset == b->n_subset &&
         memcmp(a->subset, b->subset, a->n_subset * sizeof *a->subset) == 0;
}

enum { SAME, MOVED, NOW_FAILS, NOW_OK, STILL_FAILS };

/*
 * The one comparison of an OLD and a NEW decision (from_log: OLD is the
 * log's record, which names a peer and never a subset). MOVED fills what
 * with "from -> to"; NOW_FAILS with NEW's reason.
 */
static int compare(const decision_t *old, const decision_t *neu, int from_log,
                   char *what, size_t cap) {
  if (old->fails && neu->fails)
    return STILL_FAILS;
  if (neu->fails) {
    snprintf(what, cap, "%s", neu->reason);
    return NOW_FAILS;
  }
  if (old->fails) {
    snprintf(what, cap, "%s -> %s", old->reason, neu->label);
    return NOW_OK;
  }
  if (neu->peer >= 0 || old->peer >= 0 || from_log) {
    int same;
    if (neu->peer >= 0 && (old->peer >= 0 || from_log))
      same = from_log ? strcmp(old->label, neu->label) == 0
                      : old->peer == neu->peer;
    else if (from_log) /* unkeyed now: the logged peer is still allowed */
      same = old->peer >= 0 && subset_has(neu, old->peer);
    else
      same = 0; /* keyed on one side only */
    if (same)
      return SAME;
  } else if (same_subset(old, neu)) {
    return SAME;
  }
  snprintf(what, cap, "%s -> %s", old->label[0] ? old->label : "(none)",
           neu->label);
  return MOVED;
}

static void count(buckets_t *bs, const char *what, const char *rid) {
  bucket_t *b = NULL;
  for (size_t i = 0; i < bs->n; i++)
    if (strcmp(bs->b[i].what, what) == 0) {
      b = &bs->b[i];
      break;
    }
  if (b == NULL) {
    bucket_t *nb;
    if (bs->n == MAX_BUCKETS ||
        (nb = realloc(bs->b, (bs->n + 1) * sizeof *nb)) == NULL) {
      bs->other++;
      return;
    }
    bs->b = nb;
    b = &bs->b[bs->n++];
    memset(b, 0, sizeof *b);
    snprintf(b->what, sizeof b->what, "%s", what);
  }
  b->count++;
  if (b->n_examples < EXAMPLES && rid != NULL && rid[0] != '\0')
    snprintf(b->examples[b->n_examples++], sizeof b->examples[0], "%s", rid);
}

/* ------------------------------------------------------------------ */
/* the log */

typedef struct {
  json_t *line;
  const char *service, *method, *rid, *outcome, *peer, *addr, *first;
  char path[4096];
  om_policy_kv_t kv[64];
  size_t n_kv;
} entry_t;

/* Line no of file into e; 0, or -1 with a message naming file:line. */
static int parse_line(const char *file, size_t no, const char *buf, size_t len,
                      entry_t *e) {
  json_error_t je;
  json_t *f, *p;
  const char *k, *path;
  json_t *v;
  memset(e, 0, offsetof(entry_t, path));
  e->n_kv = 0;
  e->line = json_loadb(buf, len, 0, &je);
  if (e->line == NULL || !json_is_object(e->line)) {
    fprintf(stderr, "openmesh replay: %s:%zu: %s\n", file, no,
            e->line == NULL ? je.text : "not a JSON object");
    json_decref(e->line);
    return -1;
  }
  e->service = json_string_value(json_object_get(e->line, "service"));
  e->method = json_string_value(json_object_get(e->line, "method"));
  path = json_string_value(json_object_get(e->line, "path"));
  e->outcome = json_string_value(json_object_get(e->line, "outcome"));
  if (e->service == NULL || e->method == NULL || path == NULL ||
      e->outcome == NULL) {
    fprintf(stderr,
            "openmesh replay: %s:%zu: not an access log line (needs "
            "\"service\", \"method\", \"path\" and \"outcome\" strings)\n",
            file, no);
    json_decref(e->line);
    return -1;
  }
  /* the policy sees the path without its query, as the proxy gives it */
  snprintf(e->path, sizeof e->path, "%.*s", (int)strcspn(path, "?"), path);
  e->rid = json_string_value(json_object_get(e->line, "request_id"));
  p = json_object_get(e->line, "peer");
  e->peer = json_string_value(json_object_get(p, "id"));
  /* the policy's pick is the first attempt's peer */
  e->first = json_string_value(json_object_get(e->line, "first_peer"));
  if (e->first == NULL)
    e->first = e->peer;
  e->addr = json_string_value(json_object_get(p, "address"));
  f = json_object_get(e->line, "fields");
  json_object_foreach(f, k, v) {
    if (!json_is_string(v) || e->n_kv == 64)
      continue;
    e->kv[e->n_kv++] = (om_policy_kv_t){k, strlen(k), json_string_value(v),
                                        json_string_length(v)};
  }
  return 0;
}

/* Call fn on each line of buf (no: after first_no, 1-based for the
 * file's first line); stops at fn's nonzero. */
static int each_line(const char *buf, size_t len, size_t first_no,
                     int (*fn)(void *, size_t, const char *, size_t),
                     void *ud) {
  size_t no = first_no;
  for (const char *at = buf, *end = buf + len; at < end;) {
    const char *nl = memchr(at, '\n', (size_t)(end - at));
    size_t l = nl ? (size_t)(nl - at) : (size_t)(end - at);
    int rc;
    no++;
    if (l > 0 && (rc = fn(ud, no, at, l)) != 0)
      return rc;
    at += l + 1;
  }
  return 0;
}

typedef struct {
  replay_t *r;
  const char *file;
  int need_peers;
  uint64_t skipped; /* lines of no service with peers */
} pass_t;

/* First pass: the services, and their peers as the log saw them. */
static int scan_line(void *ud, size_t no, const char *buf, size_t len) {
  pass_t *ps = ud;
  entry_t e;
  svc_t *s;
  if (parse_line(ps->file, no, buf, len, &e) != 0)
    return OM_EXIT_USAGE;
  s = find_svc(ps->r, e.service);
  if (s == NULL && om_valid_name(e.service, strlen(e.service)))
    s = add_svc(ps->r, e.service);
  if (s != NULL && s->snap == NULL)
    saw_peer(s, e.peer, e.addr);
  json_decref(e.line);
  return 0;
}

static int replay_line(void *ud, size_t no, const char *buf, size_t len) {
  pass_t *ps = ud;
  entry_t e;
  svc_t *s;
  om_policy_req_t preq;
  decision_t old, neu;
  char what[2 * LABEL_MAX + 8];
  if (parse_line(ps->file, no, buf, len, &e) != 0)
    return OM_EXIT_USAGE;
  s = find_svc(ps->r, e.service);
  if (s == NULL || s->pol_new == NULL) {
    /* a Host the proxy did not know (no policy ran), or a service that
     * --peers does not list: counted as skipped */
    ps->skipped++;
    json_decref(e.line);
    return 0;
  }
  memset(&preq, 0, sizeof preq);
  preq.service = s->name;
  preq.method = e.method;
  preq.path = e.path;
  preq.headers = e.kv;
  preq.n_headers = e.n_kv;
  s->requests++;
  decide(s, s->pol_new, s->scratch_new, &preq, &neu);
  if (s->pol_old != NULL)
    decide(s, s->pol_old, s->scratch_old, &preq, &old);
  else
    recorded(s, e.outcome, e.first, &old);
  /* decide's answers, when both sides ran a policy and neither failed */
  if (s->pol_old != NULL && !old.fails && !neu.fails &&
      strcmp(old.settings, neu.settings) != 0) {
    snprintf(what, sizeof what, "%.*s -> %.*s", LABEL_MAX - 1, old.settings,
             LABEL_MAX - 1, neu.settings);
    s->decided_other++;
    count(&s->decisions, what, e.rid);
  }
  switch (compare(&old, &neu, s->pol_old == NULL, what, sizeof what)) {
  case SAME:
    s->unchanged++;
    break;
  case MOVED:
    s->moved++;
    count(&s->moves, what, e.rid);
    break;
  case NOW_FAILS:
    s->now_fail++;
    count(&s->fails, what, e.rid);
    break;
  case NOW_OK:
    s->now_ok++;
    count(&s->moves, what, e.rid);
    break;
  default:
    s->still_fail++;
    break;
  }
  json_decref(e.line);
  return 0;
}

/* ------------------------------------------------------------------ */
/* the report */

static int by_count(const void *a, const void *b) {
  const bucket_t *x = a, *y = b;
  return x->count < y->count ? 1 : x->count > y->count ? -1 : 0;
}

static json_t *buckets_json(buckets_t *bs, const char *name) {
  json_t *a = json_array();
  if (bs->n > 1) /* b is NULL while empty */
    qsort(bs->b, bs->n, sizeof *bs->b, by_count);
  for (size_t i = 0; i < bs->n; i++) {
    json_t *ex = json_array();
    for (int k = 0; k < bs->b[i].n_examples; k++)
      json_array_append_new(ex, json_string(bs->b[i].examples[k]));
    json_array_append_new(a, json_pack("{s:s,s:I,s:o}", name, bs->b[i].what,
                                       "count", (json_int_t)bs->b[i].count,
                                       "examples", ex));
  }
  return a;
}

static void print_buckets(buckets_t *bs, const char *title) {
  if (bs->n > 1) /* b is NULL while empty */
    qsort(bs->b, bs->n, sizeof *bs->b, by_count);
  for (size_t i = 0; i < bs->n; i++) {
    printf("    %s %-40s %8llu  e.g.", title, bs->b[i].what,
           (unsigned long long)bs->b[i].count);
    for (int k = 0; k < bs->b[i].n_examples; k++)
      printf(" %s", bs->b[i].examples[k]);
    printf("\n");
  }
  if (bs->other > 0)
    printf("    %s (other)  %llu\n", title, (unsigned long long)bs->other);
}

static void report(replay_t *r, int as_json) {
  json_t *doc = as_json ? json_object() : NULL, *svcs = json_object();
  for (size_t i = 0; i < r->n; i++) {
    svc_t *s = r->s[i];
    if (s->requests == 0)
      continue;
    if (as_json) {
      json_object_set_new(
          svcs, s->name,
          json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:o}", "requests",
                    (json_int_t)s->requests, "unchanged",
                    (json_int_t)s->unchanged, "moved", (json_int_t)s->moved,
                    "now_fail", (json_int_t)s->now_fail, "now_ok",
                    (json_int_t)s->now_ok, "still_fail",
                    (json_int_t)s->still_fail, "decision_changed",
                    (json_int_t)s->decided_other, "moves",
                    buckets_json(&s->moves, "move"), "failures",
                    buckets_json(&s->fails, "reason"), "decisions",
                    buckets_json(&s->decisions, "change")));
      continue;
    }
    printf("service %s: %llu requests, %llu unchanged, %llu moved, %llu now "
           "fail, %llu now succeed, %llu still fail\n",
           s->name, (unsigned long long)s->requests,
           (unsigned long long)s->unchanged, (unsigned long long)s->moved,
           (unsigned long long)s->now_fail, (unsigned long long)s->now_ok,
           (unsigned long long)s->still_fail);
    print_buckets(&s->moves, "move");
    print_buckets(&s->fails, "fail");
    if (s->decided_other > 0) {
      printf("  %llu requests would get another decision (decide):\n",
             (unsigned long long)s->decided_other);
      print_buckets(&s->decisions, "decide");
    }
  }
  if (as_json) {
    char *out;
    json_object_set_new(doc, "services", svcs);
    out = json_dumps(doc, JSON_INDENT(2));
    if (out != NULL)
      printf("%s\n", out);
    free(out);
    json_decref(doc);
  } else {
    json_decref(svcs);
  }
}

static void free_replay(replay_t *r) {
  for (size_t i = 0; i < r->n; i++) {
    svc_t *s = r->s[i];
    om_policy_free(s->pol_new);
    om_policy_free(s->pol_old);
    om_rendezvous_free(s->rdv);
    om_snapshot_unref(s->snap);
    for (size_t k = 0; k < s->n_seen; k++)
      om_instance_clear(&s->seen[k]);
    free(s->seen);
    free(s->pp);
    free(s->kv);
    free(s->scratch_new);
    free(s->scratch_old);
    free(s->moves.b);
    free(s->fails.b);
    free(s->decisions.b);
    free(s->name);
    free(s);
  }
}

/* ------------------------------------------------------------------ */
/* two halves on two threads */

/* Fold bs (another pass's buckets) into into: counts add up, examples
 * fill up to EXAMPLES. */
static void merge_buckets(buckets_t *into, const buckets_t *bs) {
  into->other += bs->other;
  for (size_t i = 0; i < bs->n; i++) {
    const bucket_t *b = &bs->b[i];
    bucket_t *t;
    count(into, b->what, b->n_examples > 0 ? b->examples[0] : "");
    t = NULL;
    for (size_t k = 0; k < into->n; k++)
      if (strcmp(into->b[k].what, b->what) == 0)
        t = &into->b[k];
    if (t == NULL) { /* past MAX_BUCKETS: counted in other */
      into->other += b->count - 1;
      continue;
    }
    t->count += b->count - 1; /* count() added one */
    for (int e = 1; e < b->n_examples && t->n_examples < EXAMPLES; e++)
      snprintf(t->examples[t->n_examples++], sizeof t->examples[0], "%s",
               b->examples[e]);
  }
}

typedef struct {
  pass_t ps;
  const char *buf;
  size_t len, first_no;
  int rc;
} half_t;

static void run_half(void *arg) {
  half_t *h = arg;
  h->rc = each_line(h->buf, h->len, h->first_no, replay_line, &h->ps);
}

/*
 * The replay pass. A log of more than SPLIT_BYTES is cut at a line in
 * two, and the second half runs on a thread of its own with its own
 * copies of the services (their policies loaded again: a Lua state is
 * one thread's), so a replay uses two cores; the second half's counts
 * and buckets are then folded into r's. Smaller logs take one pass: a
 * second load of every policy would cost more than it saves.
 */
#define SPLIT_BYTES (4u << 20)
static int replay_all(replay_t *r, pass_t *ps, const char *buf, size_t len,
                      const char *peers) {
  replay_t r2;
  half_t h2;
  uv_thread_t t;
  const char *mid;
  size_t first_len, lines = 0;
  int rc = 0;
  mid = len > SPLIT_BYTES && r->threads != 1
            ? memchr(buf + len / 2, '\n', len - len / 2)
            : NULL;
  if (mid == NULL)
    return each_line(buf, len, 0, replay_line, ps);
  first_len = (size_t)(mid - buf) + 1;
  for (const char *at = buf;
       (at = memchr(at, '\n', (size_t)(mid - at))) != NULL; at++)
    lines++;
  memset(&r2, 0, sizeof r2);
  r2.new_path = r->new_path;
  r2.old_path = r->old_path;
  r2.popts = r->popts;
  if (peers != NULL)
    rc = load_peers(&r2, peers);
  for (size_t i = 0; rc == 0 && i < r->n; i++) {
    svc_t *s = r->s[i], *c = find_svc(&r2, s->name);
    if (c == NULL && (c = add_svc(&r2, s->name)) == NULL)
      rc = OM_EXIT_FAILURE;
    for (size_t k = 0; rc == 0 && c->snap == NULL && k < s->n_seen; k++)
      saw_peer(c, s->seen[k].id, s->seen[k].url);
  }
  for (size_t i = 0; rc == 0 && i < r2.n; i++) {
    char err[4096];
    if (prepare_svc(&r2, r2.s[i], err, sizeof err) != 0) {
      fprintf(stderr, "openmesh replay: %s\n", err);
      rc = OM_EXIT_USAGE;
    }
  }
  if (rc != 0) {
    free_replay(&r2);
    return rc;
  }
  h2 = (half_t){{&r2, ps->file, ps->need_peers, 0},
                mid + 1,
                len - first_len,
                lines + 1,
                0};
  if (uv_thread_create(&t, run_half, &h2) != 0) {
    free_replay(&r2);
    return each_line(buf, len, 0, replay_line, ps);
  }
  rc = each_line(buf, first_len, 0, replay_line, ps);
  uv_thread_join(&t);
  if (rc == 0)
    rc = h2.rc;
  ps->skipped += h2.ps.skipped;
  for (size_t i = 0; rc == 0 && i < r2.n; i++) {
    svc_t *c = r2.s[i], *s = find_svc(r, c->name);
    if (s == NULL) /* named by --peers only: nothing of it in r */
      continue;
    s->requests += c->requests;
    s->unchanged += c->unchanged;
    s->moved += c->moved;
    s->now_fail += c->now_fail;
    s->now_ok += c->now_ok;
    s->still_fail += c->still_fail;
    s->decided_other += c->decided_other;
    merge_buckets(&s->moves, &c->moves);
    merge_buckets(&s->fails, &c->fails);
    merge_buckets(&s->decisions, &c->decisions);
  }
  free_replay(&r2);
  return rc;
}

int om_cmd_replay(int argc, char **argv) {
  static const struct option longopts[] = {
      {"log", required_argument, NULL, 'l'},
      {"policy", required_argument, NULL, 'p'},
      {"against", required_argument, NULL, 'a'},
      {"peers", required_argument, NULL, 'P'},
      {"json", no_argument, NULL, 'j'},
      {"threads", required_argument, NULL, 'T'},
      {"lib", required_argument, NULL, 'L'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  replay_t r;
  const char *log_path = NULL, *peers = NULL;
  int as_json = 0, c, rc = OM_EXIT_OK;
  char *buf;
  size_t len;
  uint64_t now_fail = 0;
  pass_t ps;
  memset(&r, 0, sizeof r);
  r.popts.lib_dir = om_lib_dir();
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'l':
      log_path = optarg;
      break;
    case 'p':
      r.new_path = optarg;
      break;
    case 'a':
      r.old_path = optarg;
      break;
    case 'P':
      peers = optarg;
      break;
    case 'j':
      as_json = 1;
      break;
    case 'T':
      if (strcmp(optarg, "1") != 0 && strcmp(optarg, "2") != 0) {
        fprintf(stderr, "openmesh replay: --threads: 1 or 2, got '%s'\n",
                optarg);
        return usage(stderr);
      }
      r.threads = optarg[0] - '0';
      break;
    case 'L':
      r.popts.lib_dir = optarg;
      break;
    case 'h':
      return usage(stdout);
    default:
      return usage(stderr);
    }
  }
  if (optind < argc || log_path == NULL || r.new_path == NULL) {
    fprintf(stderr, "openmesh replay: %s\n",
            optind < argc ? "unexpected argument"
                          : "--log and --policy are required");
    return usage(stderr);
  }
  if (peers != NULL && (rc = load_peers(&r, peers)) != OM_EXIT_OK) {
    free_replay(&r);
    return rc;
  }
  if ((buf = read_all(log_path, &len)) == NULL) {
    fprintf(stderr, "openmesh replay: --log %s: cannot read\n", log_path);
    free_replay(&r);
    return OM_EXIT_USAGE;
  }
  ps = (pass_t){&r, log_path, peers == NULL, 0};
  /* the peers from the log need a first pass; --peers names them all */
  if (peers == NULL)
    rc = each_line(buf, len, 0, scan_line, &ps);
  for (size_t i = 0; rc == 0 && i < r.n; i++) {
    char err[4096];
    if (prepare_svc(&r, r.s[i], err, sizeof err) != 0) {
      fprintf(stderr, "openmesh replay: %s\n", err);
      rc = OM_EXIT_USAGE;
    }
  }
  if (rc == 0)
    rc = replay_all(&r, &ps, buf, len, peers);
  free(buf);
  if (rc == 0) {
    if (ps.skipped > 0)
      fprintf(stderr,
              "openmesh replay: %llu requests skipped: no service with peers "
              "(unknown Host, or not in --peers)\n",
              (unsigned long long)ps.skipped);
    report(&r, as_json);
    for (size_t i = 0; i < r.n; i++)
      now_fail += r.s[i]->now_fail;
    rc = now_fail > 0 ? OM_EXIT_FAILURE : OM_EXIT_OK;
  }
  free_replay(&r);
  return rc;
}
