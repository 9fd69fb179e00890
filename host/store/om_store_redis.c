/*
 * om_store_redis.c: the Redis store (om_store_redis.h, docs/STORE.md).
 *
 * Two hiredis async connections on the caller's libuv loop: "cmd" runs the
 * scripts and reads, "sub" is SUBSCRIBEd to the change channel. Both are
 * one session: when either fails, both are dropped and reconnected after a
 * backoff, and the session is ready again only once it is subscribed, has
 * checked the epoch and has listed every service (anything published while
 * it was away is then fetched).
 *
 * Keys (P is the prefix):
 *   P rev            the last revision issued (services and documents)
 *   P services       hash service -> its revision
 *   P i:SERVICE      hash id -> "TTL_MS JSON" (the registration body)
 *   P leases         sorted set "service/id" -> deadline (Redis ms clock)
 *   P c:NAME         hash ct, body, rev of a document
 *   P configs        hash name -> revision
 *   P epoch          random id of this Redis's data set
 * Channel P events@DB carries "REV PREV OP SERVICE ARGS": OP p (put: id
 * and value), r (remove: ids, maybe none: a new revision of the same
 * membership) or c (a document changed: fetch it). PREV is the service's
 * revision before the change, so a replica holding PREV applies the change
 * in place (no fetch) and any other replica fetches the whole service.
 *
 * Every script issues revisions with bump() below: the caller passes a
 * floor (max(wall clock us, highest revision seen + 1)), so a Redis that
 * lost P rev still issues revisions above anything a watcher has seen.
 */
#include "om_store_redis.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "om_errno.h"
#include "om_log.h"
#include "om_snapshot_json.h"
#include "om_store_subs.h"

#define DEFAULT_PREFIX "openmesh:"
#define PREFIX_MAX 64
#define DEFAULT_SWEEP_MS 250
#define DEFAULT_BACKOFF_MIN 100
#define DEFAULT_BACKOFF_MAX 5000
#define DEFAULT_CMD_TIMEOUT 5000
#define DEFAULT_MAX_CONFIG ((size_t)1 << 20)
#define SWEEP_BATCH "1000"
/* Instance hashes outlive their last lease by this much (PEXPIRE). */
#define KEY_GRACE_MS "60000"

/* ------------------------------------------------------------------ */
/* SHA-1 (FIPS 180-4 section 6.1), for EVALSHA: Redis names scripts by it */

static uint32_t rol(uint32_t x, int n) {
  return (x << n) | (x >> (32 - n));
}

static void sha1_block(uint32_t h[5], const unsigned char *p) {
  uint32_t w[80], a, b, c, d, e;
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
           (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
  for (int i = 16; i < 80; i++)
    w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
  a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
  for (int i = 0; i < 80; i++) {
    uint32_t f, k, t;
    if (i < 20)
      f = (b & c) | (~b & d), k = 0x5A827999u;
    else if (i < 40)
      f = b ^ c ^ d, k = 0x6ED9EBA1u;
    else if (i < 60)
      f = (b & c) | (b & d) | (c & d), k = 0x8F1BBCDCu;
    else
      f = b ^ c ^ d, k = 0xCA62C1D6u;
    t = rol(a, 5) + f + e + k + w[i];
    e = d, d = c, c = rol(b, 30), b = a, a = t;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
}

static void sha1_hex(const char *msg, char out[41]) {
  uint32_t h[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u,
                   0xC3D2E1F0u};
  size_t n = strlen(msg), i = 0;
  uint64_t bits = (uint64_t)n * 8;
  unsigned char blk[64];
  for (; i + 64 <= n; i += 64)
    sha1_block(h, (const unsigned char *)msg + i);
  memset(blk, 0, sizeof blk);
  memcpy(blk, msg + i, n - i);
  blk[n - i] = 0x80;
  if (n - i >= 56) {
    sha1_block(h, blk);
    memset(blk, 0, sizeof blk);
  }
  for (int k = 0; k < 8; k++)
    blk[63 - k] = (unsigned char)(bits >> (8 * k));
  sha1_block(h, blk);
  for (int k = 0; k < 5; k++)
    snprintf(out + 8 * k, 9, "%08" PRIx32, h[k]);
}

/* ------------------------------------------------------------------ */
/* the scripts (Lua 5.1 inside Redis; redis.call raises on errors) */

/* KEYS[1] is P rev in every script that issues a revision. */
#define LUA_BUMP                                                               \
  "local function bump(floor, prev)\n"                                         \
  "  local r = tonumber(redis.call('GET', KEYS[1]) or '0') + 1\n"              \
  "  if floor > r then r = floor end\n"                                        \
  "  if prev + 1 > r then r = prev + 1 end\n"                                  \
  "  local s = string.format('%d', r)\n"                                       \
  "  redis.call('SET', KEYS[1], s)\n"                                          \
  "  return s\n"                                                               \
  "end\n"                                                                      \
  "local function now_ms()\n"                                                  \
  "  local t = redis.call('TIME')\n"                                           \
  "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"       \
  "end\n"                                                                      \
  "local function keep(k, ms)\n"                                               \
  "  if redis.call('PTTL', k) < ms then redis.call('PEXPIRE', k, ms) end\n"    \
  "end\n"

enum {
  SC_PUT,
  SC_RENEW,
  SC_DELETE,
  SC_SWEEP,
  SC_TOUCH,
  SC_SNAP,
  SC_LIST,
  SC_CFGPUT,
  SC_EPOCH,
  SC__COUNT
};

/* KEYS rev services ihash leases; ARGV svc id value ttl floor chan grace */
static const char lua_put[] = LUA_BUMP
    "local ttl = tonumber(ARGV[4])\n"
    "local hold = ttl + tonumber(ARGV[7])\n"
    "redis.call('ZADD', KEYS[4], now_ms() + ttl, ARGV[1] .. '/' .. ARGV[2])\n"
    "keep(KEYS[4], hold)\n"
    "local old = redis.call('HGET', KEYS[3], ARGV[2])\n"
    "local prev = redis.call('HGET', KEYS[2], ARGV[1]) or '0'\n"
    "if old == ARGV[3] then keep(KEYS[3], hold) return {0, prev} end\n"
    "local r = bump(tonumber(ARGV[5]), tonumber(prev))\n"
    "redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])\n"
    "keep(KEYS[3], hold)\n"
    "redis.call('HSET', KEYS[2], ARGV[1], r)\n"
    "redis.call('PUBLISH', ARGV[6], r .. ' ' .. prev .. ' p ' .. ARGV[1] .. "
    "' ' .. ARGV[2] .. ' ' .. ARGV[3])\n"
    "if old then return {2, r} end\n"
    "return {1, r}\n";

/* KEYS rev services ihash leases; ARGV svc id grace */
static const char lua_renew[] = LUA_BUMP
    "local old = redis.call('HGET', KEYS[3], ARGV[2])\n"
    "local prev = redis.call('HGET', KEYS[2], ARGV[1]) or '0'\n"
    "if not old then return {-1, prev} end\n"
    "local ttl = tonumber(string.match(old, '^(%d+) '))\n"
    "local hold = ttl + tonumber(ARGV[3])\n"
    "redis.call('ZADD', KEYS[4], now_ms() + ttl, ARGV[1] .. '/' .. ARGV[2])\n"
    "keep(KEYS[4], hold)\n"
    "keep(KEYS[3], hold)\n"
    "return {0, prev}\n";

/* KEYS rev services ihash leases; ARGV svc id floor chan */
static const char lua_delete[] = LUA_BUMP
    "local prev = redis.call('HGET', KEYS[2], ARGV[1]) or '0'\n"
    "redis.call('ZREM', KEYS[4], ARGV[1] .. '/' .. ARGV[2])\n"
    "if redis.call('HDEL', KEYS[3], ARGV[2]) == 0 then return {-1, prev} end\n"
    "local r = bump(tonumber(ARGV[3]), tonumber(prev))\n"
    "redis.call('HSET', KEYS[2], ARGV[1], r)\n"
    "redis.call('PUBLISH', ARGV[4], r .. ' ' .. prev .. ' d ' .. ARGV[1] .. "
    "' ' .. ARGV[2])\n"
    "return {3, r}\n";

/*
 * KEYS rev services leases; ARGV floor chan prefix batch. Atomic: of all
 * the control planes sweeping, the first removes each expired lease and
 * publishes one revision per service; the others find nothing.
 */
static const char lua_sweep[] = LUA_BUMP
    "local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms(), "
    "'LIMIT', 0, tonumber(ARGV[4]))\n"
    "if #due == 0 then return 0 end\n"
    "local by, order, n = {}, {}, 0\n"
    "for _, m in ipairs(due) do\n"
    "  redis.call('ZREM', KEYS[3], m)\n"
    "  local svc, id = string.match(m, '^([^/]+)/(.+)$')\n"
    "  if svc then\n"
    "    redis.call('HDEL', ARGV[3] .. 'i:' .. svc, id)\n"
    "    if not by[svc] then by[svc] = {} order[#order + 1] = svc end\n"
    "    table.insert(by[svc], id)\n"
    "  end\n"
    "end\n"
    "for _, svc in ipairs(order) do\n"
    "  local prev = redis.call('HGET', KEYS[2], svc) or '0'\n"
    "  local r = bump(tonumber(ARGV[1]), tonumber(prev))\n"
    "  redis.call('HSET', KEYS[2], svc, r)\n"
    "  redis.call('PUBLISH', ARGV[2], r .. ' ' .. prev .. ' x ' .. svc .. ' ' "
    ".. table.concat(by[svc], ' '))\n"
    "  n = n + #by[svc]\n"
    "end\n"
    "return n\n";

/*
 * KEYS rev services; ARGV svc need floor chan. After Redis lost its data:
 * make sure the service exists at a revision >= need (a new revision of
 * whatever membership Redis has now), once for all the control planes.
 */
static const char lua_touch[] = LUA_BUMP
    "local prev = redis.call('HGET', KEYS[2], ARGV[1])\n"
    "if prev and tonumber(prev) >= tonumber(ARGV[2]) then return prev end\n"
    "prev = prev or '0'\n"
    "local floor = tonumber(ARGV[3])\n"
    "if tonumber(ARGV[2]) > floor then floor = tonumber(ARGV[2]) end\n"
    "local r = bump(floor, tonumber(prev))\n"
    "redis.call('HSET', KEYS[2], ARGV[1], r)\n"
    "redis.call('PUBLISH', ARGV[4], r .. ' ' .. prev .. ' r ' .. ARGV[1])\n"
    "return r\n";

/* KEYS services ihash; ARGV svc known: {} | {rev} | {rev, {id, v, ...}} */
static const char lua_snap[] =
    "local rev = redis.call('HGET', KEYS[1], ARGV[1])\n"
    "if not rev then return {} end\n"
    "if rev == ARGV[2] then return {rev} end\n"
    "return {rev, redis.call('HGETALL', KEYS[2])}\n";

/* KEYS services configs; ARGV prefix: {svc, rev, n, ...} {name, rev, ...} */
static const char lua_list[] =
    "local all = redis.call('HGETALL', KEYS[1])\n"
    "local out = {}\n"
    "for i = 1, #all, 2 do\n"
    "  out[#out + 1] = all[i]\n"
    "  out[#out + 1] = all[i + 1]\n"
    "  out[#out + 1] = redis.call('HLEN', ARGV[1] .. 'i:' .. all[i])\n"
    "end\n"
    "return {out, redis.call('HGETALL', KEYS[2])}\n";

/* KEYS rev configs chash; ARGV name ct body floor chan */
static const char lua_cfgput[] = LUA_BUMP
    "local cur = redis.call('HMGET', KEYS[3], 'ct', 'body', 'rev')\n"
    "if cur[1] == ARGV[2] and cur[2] == ARGV[3] then return {0, cur[3]} end\n"
    "local r = bump(tonumber(ARGV[4]), tonumber(cur[3] or '0'))\n"
    "redis.call('HSET', KEYS[3], 'ct', ARGV[2], 'body', ARGV[3], 'rev', r)\n"
    "redis.call('HSET', KEYS[2], ARGV[1], r)\n"
    "redis.call('PUBLISH', ARGV[5], r .. ' 0 c ' .. ARGV[1])\n"
    "if cur[3] then return {2, r} end\n"
    "return {1, r}\n";

/* KEYS epoch; ARGV candidate: {epoch, 1 if just created} */
static const char lua_epoch[] = "local e = redis.call('GET', KEYS[1])\n"
                                "if e then return {e, 0} end\n"
                                "redis.call('SET', KEYS[1], ARGV[1])\n"
                                "return {ARGV[1], 1}\n";

static const char *const scripts[SC__COUNT] = {
    lua_put,  lua_renew, lua_delete, lua_sweep, lua_touch,
    lua_snap, lua_list,  lua_cfgput, lua_epoch};

/* ------------------------------------------------------------------ */
/* types */

typedef struct rsvc_s {
  char *name;
  om_snapshot_t *snap; /* NULL: never seen */
  uint64_t rev;        /* of snap: the last revision delivered */
  uint64_t want;       /* announced, not yet in hand */
  int fetching;
} rsvc_t;

typedef struct rcfg_s {
  char *name;
  om_config_doc_t *doc;
  uint64_t want;
  int fetching;
} rcfg_t;

enum { S_DOWN, S_CONNECTING, S_SYNCING, S_UP };

typedef struct rstore_s {
  om_store_t base;
  uv_loop_t *loop;
  om_store_redis_opts_t opts;
  char host[OM_STORE_REDIS_HOST_MAX + 1];
  int port, db;
  /* A host name is resolved on libuv's thread pool before each connect
   * (hiredis would resolve it with a blocking getaddrinfo on the loop);
   * addr is the numeric address hiredis is given: the lookup's answers in
   * turn, one per attempt, so a name with an address nobody listens on
   * (localhost as ::1 with Redis bound to 127.0.0.1) still connects. */
  char addr[OM_STORE_REDIS_HOST_MAX + 1];
  int numeric, resolving;
  uv_getaddrinfo_t gai;
  char prefix[PREFIX_MAX + 1];
  char k_rev[PREFIX_MAX + 8], k_services[PREFIX_MAX + 16];
  char k_leases[PREFIX_MAX + 16], k_configs[PREFIX_MAX + 16];
  char k_epoch[PREFIX_MAX + 8], chan[PREFIX_MAX + 32];
  char sha[SC__COUNT][41];
  redisAsyncContext *cmd, *sub;
  int state, cmd_ok, sub_ok, subscribed, epoch_done, listed, ever_up;
  int need_resync, sweeping;
  char epoch[40];
  uint64_t backoff, attempts;
  uint64_t max_seen;
  size_t inflight;
  uint64_t progress_ms; /* last reply, or when inflight left 0 */
  uint64_t session_ms;  /* when the current connect started */
  uv_timer_t sweep, retry;
  int handles_open;
  rsvc_t **svcs;
  size_t n_svcs, cap_svcs;
  rcfg_t **cfgs;
  size_t n_cfgs, cap_cfgs;
  om_store_status_t st;
  void (*done)(void *);
  void *done_ud;
} rstore_t;

enum {
  RQ_PUT,
  RQ_RENEW,
  RQ_DELETE,
  RQ_SNAP,
  RQ_LIST,
  RQ_CFGPUT,
  RQ_CFGGET,
  RQ_FETCH,    /* internal: a service for the replica */
  RQ_CFGFETCH, /* internal: a document for the cache */
  RQ_RESYNC,   /* internal: every service and document */
  RQ_SWEEP,
  RQ_TOUCH,
  RQ_EPOCH,
  RQ_SELECT
};

typedef struct req_s {
  rstore_t *r;
  int kind, script, retried;
  om_store_write_cb wcb;
  om_store_snapshot_cb scb;
  om_store_list_cb lcb;
  om_store_config_cb ccb;
  void *ud;
  char name[OM_NAME_MAX + 1];
  int argc;
  const char **argv;
  size_t *argvlen;
} req_t;

static const om_store_ops_t redis_ops;

/* ------------------------------------------------------------------ */
/* small helpers */

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  return d != NULL ? memcpy(d, s, n) : NULL;
}

/* Names read back from Redis are checked as the front checks callers'. */
static int valid_name(const char *s) {
  return s != NULL && om_valid_name(s, strnlen(s, OM_NAME_MAX + 1));
}

static uint64_t realtime_us(rstore_t *r) {
  struct timespec ts;
  if (r->opts.realtime_us != NULL)
    return r->opts.realtime_us(r->opts.clock_ud);
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0 || ts.tv_sec < 0)
    return 0;
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void see(rstore_t *r, uint64_t rev) {
  if (rev > r->max_seen)
    r->max_seen = rev;
}

/* The floor of the next revision, as a decimal string. */
static void floor_str(rstore_t *r, char out[24]) {
  uint64_t f = realtime_us(r);
  if (r->max_seen + 1 > f)
    f = r->max_seen + 1;
  snprintf(out, 24, "%" PRIu64, f);
}

/* Parse a decimal revision (a Redis string or integer reply). */
static int parse_rev(const char *s, size_t n, uint64_t *out) {
  uint64_t v = 0;
  if (n == 0 || n > 19)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  *out = v;
  return 0;
}

static int reply_rev(const redisReply *e, uint64_t *out) {
  if (e == NULL)
    return -1;
  if (e->type == REDIS_REPLY_INTEGER && e->integer >= 0) {
    *out = (uint64_t)e->integer;
    return 0;
  }
  if (e->type == REDIS_REPLY_STRING)
    return parse_rev(e->str, e->len, out);
  if (e->type == REDIS_REPLY_NIL) {
    *out = 0;
    return 0;
  }
  return -1;
}

static void *grow(void *arr, size_t *cap, size_t need, size_t elem) {
  size_t c;
  void *p;
  if (need <= *cap)
    return arr;
  c = *cap != 0 ? *cap : 8;
  while (c < need) {
    if (c > SIZE_MAX / 2 / elem)
      return NULL;
    c *= 2;
  }
  p = realloc(arr, c * elem);
  if (p != NULL)
    *cap = c;
  return p;
}

/* ---- the replica: services and documents by name ---- */

/*
 * Services and documents are arrays of pointers sorted by name (each
 * struct's first member): pos (binary search), find, and get (find, or
 * insert an empty entry; NULL when memory runs out), for each, generated
 * from one definition.
 */
#define NAMED_TABLE(pre, type, arr, n, cap)                                    \
  static size_t pre##_pos(rstore_t *r, const char *name, int *found) {         \
    size_t lo = 0, hi = r->n;                                                  \
    *found = 0;                                                                \
    while (lo < hi) {                                                          \
      size_t mid = lo + (hi - lo) / 2;                                         \
      int c = strcmp(r->arr[mid]->name, name);                                 \
      if (c == 0) {                                                            \
        *found = 1;                                                            \
        return mid;                                                            \
      }                                                                        \
      if (c < 0)                                                               \
        lo = mid + 1;                                                          \
      else                                                                     \
        hi = mid;                                                              \
    }                                                                          \
    return lo;                                                                 \
  }                                                                            \
  static type *pre##_find(rstore_t *r, const char *name) {                     \
    int found;                                                                 \
    size_t i = pre##_pos(r, name, &found);                                     \
    return found ? r->arr[i] : NULL;                                           \
  }                                                                            \
  static type *pre##_get(rstore_t *r, const char *name) {                      \
    int found;                                                                 \
    size_t i = pre##_pos(r, name, &found);                                     \
    type *e, **a;                                                              \
    if (found)                                                                 \
      return r->arr[i];                                                        \
    a = grow(r->arr, &r->cap, r->n + 1, sizeof *a);                            \
    if (a == NULL)                                                             \
      return NULL;                                                             \
    r->arr = a;                                                                \
    e = calloc(1, sizeof *e);                                                  \
    if (e == NULL || (e->name = dup_str(name)) == NULL) {                      \
      free(e);                                                                 \
      return NULL;                                                             \
    }                                                                          \
    memmove(a + i + 1, a + i, (r->n - i) * sizeof *a);                         \
    a[i] = e;                                                                  \
    r->n++;                                                                    \
    return e;                                                                  \
  }

NAMED_TABLE(svc, rsvc_t, svcs, n_svcs, cap_svcs)
NAMED_TABLE(cfg, rcfg_t, cfgs, n_cfgs, cap_cfgs)

/* ---- delivery ---- */

/*
 * Make snap (one reference, taken over) the replica's state of svc if it
 * is newer, and deliver it: the one place a service moves forward, so no
 * subscriber ever sees an older revision after a newer one.
 */
static void replica_set(rstore_t *r, rsvc_t *svc, om_snapshot_t *snap) {
  uint64_t rev = om_snapshot_revision(snap);
  see(r, rev);
  if (svc->snap != NULL && rev <= svc->rev) {
    om_snapshot_unref(snap);
    return;
  }
  om_snapshot_unref(svc->snap);
  svc->snap = snap;
  svc->rev = rev;
  om__store_deliver(&r->base, om__store_stamp(&r->base), snap);
}

static void cfg_set(rstore_t *r, rcfg_t *c, om_config_doc_t *doc) {
  see(r, doc->revision);
  if (c->doc != NULL && doc->revision <= c->doc->revision) {
    om_config_doc_unref(doc);
    return;
  }
  om_config_doc_unref(c->doc);
  c->doc = doc;
  om__store_deliver_config(&r->base, om__store_stamp(&r->base), doc);
}

/* ------------------------------------------------------------------ */
/* requests */

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata);
static void session_fail(rstore_t *r, const char *why);

/*
 * A request whose command is argv[0..argc) (copied into the request's one
 * allocation). For a script, argv starts "EVALSHA sha numkeys".
 */
static req_t *req_new(rstore_t *r, int kind, int script, int argc,
                      const char *const *argv, const size_t *lens) {
  size_t total =
      sizeof(req_t) + (size_t)argc * (sizeof(char *) + sizeof(size_t));
  req_t *q;
  char *p;
  for (int i = 0; i < argc; i++)
    total += lens[i] + 1;
  q = malloc(total);
  if (q == NULL)
    return NULL;
  memset(q, 0, sizeof *q);
  q->r = r;
  q->kind = kind;
  q->script = script;
  q->argc = argc;
  q->argv = (const char **)(q + 1);
  q->argvlen = (size_t *)(q->argv + argc);
  p = (char *)(q->argvlen + argc);
  for (int i = 0; i < argc; i++) {
    memcpy(p, argv[i], lens[i]);
    p[lens[i]] = '\0';
    q->argv[i] = p;
    q->argvlen[i] = lens[i];
    p += lens[i] + 1;
  }
  return q;
}

/* A script request: EVALSHA sha nkeys keys... args... */
static req_t *req_script(rstore_t *r, int kind, int script, int nkeys,
                         const char *const *keys, int nargs,
                         const char *const *args, const size_t *arglens) {
  const char *argv[16];
  size_t lens[16];
  char nk[4];
  int n = 0;
  snprintf(nk, sizeof nk, "%d", nkeys);
  argv[n] = "EVALSHA", lens[n++] = 7;
  argv[n] = r->sha[script], lens[n++] = 40;
  argv[n] = nk, lens[n++] = strlen(nk);
  for (int i = 0; i < nkeys; i++)
    argv[n] = keys[i], lens[n++] = strlen(keys[i]);
  for (int i = 0; i < nargs; i++) {
    argv[n] = args[i];
    lens[n++] = arglens != NULL && arglens[i] != SIZE_MAX ? arglens[i]
                                                          : strlen(args[i]);
  }
  return req_new(r, kind, script, n, argv, lens);
}

static int req_send(rstore_t *r, req_t *q) {
  if (r->cmd == NULL || !r->cmd_ok ||
      redisAsyncCommandArgv(r->cmd, on_reply, q, q->argc, q->argv,
                            q->argvlen) != REDIS_OK) {
    free(q);
    return OM_EIO;
  }
  if (r->inflight++ == 0)
    r->progress_ms = uv_now(r->loop);
  return 0;
}

/* ---- snapshots from replies ---- */

/*
 * The snapshot of service at rev from HGETALL pairs e[from..n) (id,
 * "TTL JSON"). Entries that fail to decode are skipped and logged: Redis
 * holds only what a control plane validated, so that means tampering.
 */
static int build_snapshot(const char *service, uint64_t rev, redisReply **e,
                          size_t n, size_t from, om_snapshot_t **out) {
  size_t cnt = (n - from) / 2, k = 0;
  om_instance_t *ins = calloc(cnt != 0 ? cnt : 1, sizeof *ins);
  int rc = 0;
  if (ins == NULL)
    return OM_ENOMEM;
  for (size_t i = from; i + 1 < n; i += 2) {
    const redisReply *id = e[i], *v = e[i + 1];
    const char *json;
    om_json_error_t err;
    if (id->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
      continue;
    json = memchr(v->str, ' ', v->len);
    if (json == NULL) {
      om_log(OM_LOG_WARN, "store_bad_entry", "service", service, "id", id->str,
             NULL);
      continue;
    }
    json++;
    memset(&err, 0, sizeof err);
    rc = om_instance_from_json(json, v->len - (size_t)(json - v->str), id->str,
                               &ins[k], &err);
    if (rc == OM_ENOMEM)
      break;
    if (rc != 0) {
      om_log(OM_LOG_WARN, "store_bad_entry", "service", service, "id", id->str,
             "error", err.text, NULL);
      rc = 0;
      continue;
    }
    k++;
  }
  if (rc == 0)
    rc = om_snapshot_new(service, rev, ins, k, out, NULL, NULL, NULL);
  for (size_t i = 0; i < k; i++)
    om_instance_clear(&ins[i]);
  free(ins);
  return rc;
}

/* ---- fetching into the replica ---- */

static void fetch_service(rstore_t *r, rsvc_t *svc) {
  const char *keys[2];
  char ihash[PREFIX_MAX + OM_NAME_MAX + 4], known[24];
  const char *args[2];
  req_t *q;
  if (svc->fetching || r->cmd == NULL || !r->cmd_ok)
    return;
  snprintf(ihash, sizeof ihash, "%si:%s", r->prefix, svc->name);
  snprintf(known, sizeof known, "%" PRIu64, svc->rev);
  keys[0] = r->k_services, keys[1] = ihash;
  args[0] = svc->name, args[1] = svc->snap != NULL ? known : "";
  q = req_script(r, RQ_FETCH, SC_SNAP, 2, keys, 2, args, NULL);
  if (q == NULL) {
    r->need_resync = 1;
    return;
  }
  snprintf(q->name, sizeof q->name, "%s", svc->name);
  if (req_send(r, q) != 0)
    return;
  svc->fetching = 1;
}

static void fetch_config(rstore_t *r, rcfg_t *c) {
  char key[PREFIX_MAX + OM_NAME_MAX + 4];
  const char *argv[5];
  size_t lens[5];
  req_t *q;
  if (c->fetching || r->cmd == NULL || !r->cmd_ok)
    return;
  snprintf(key, sizeof key, "%sc:%s", r->prefix, c->name);
  argv[0] = "HMGET", argv[1] = key, argv[2] = "rev", argv[3] = "ct",
  argv[4] = "body";
  for (int i = 0; i < 5; i++)
    lens[i] = strlen(argv[i]);
  q = req_new(r, RQ_CFGFETCH, -1, 5, argv, lens);
  if (q == NULL) {
    r->need_resync = 1;
    return;
  }
  snprintf(q->name, sizeof q->name, "%s", c->name);
  if (req_send(r, q) != 0)
    return;
  c->fetching = 1;
}

static void start_resync(rstore_t *r) {
  const char *keys[2] = {r->k_services, r->k_configs};
  const char *args[1] = {r->prefix};
  req_t *q = req_script(r, RQ_RESYNC, SC_LIST, 2, keys, 1, args, NULL);
  if (q == NULL) {
    r->need_resync = 1;
    return;
  }
  r->need_resync = 0;
  (void)req_send(r, q);
}

/* ---- change messages ---- */

/* Apply "REV PREV OP NAME ARGS" from the channel. */
static void on_change_msg(rstore_t *r, const char *msg, size_t len) {
  char buf[OM_NAME_MAX + 1];
  const char *p = msg, *end = msg + len, *sp;
  uint64_t rev, prev;
  char op;
  rsvc_t *svc;
  om_snapshot_t *snap = NULL;
  int rc;
  /* REV */
  sp = memchr(p, ' ', (size_t)(end - p));
  if (sp == NULL || parse_rev(p, (size_t)(sp - p), &rev) != 0)
    goto bad;
  p = sp + 1;
  sp = memchr(p, ' ', (size_t)(end - p));
  if (sp == NULL || parse_rev(p, (size_t)(sp - p), &prev) != 0)
    goto bad;
  p = sp + 1;
  if (end - p < 3 || p[1] != ' ')
    goto bad;
  op = p[0];
  p += 2;
  sp = memchr(p, ' ', (size_t)(end - p));
  if (sp == NULL)
    sp = end;
  if ((size_t)(sp - p) > OM_NAME_MAX || !om_valid_name(p, (size_t)(sp - p)))
    goto bad;
  memcpy(buf, p, (size_t)(sp - p));
  buf[sp - p] = '\0';
  p = sp < end ? sp + 1 : end;
  see(r, rev);
  if (op == 'c') {
    rcfg_t *c = cfg_get(r, buf);
    if (c == NULL) {
      r->need_resync = 1;
      return;
    }
    if (c->doc != NULL && rev <= c->doc->revision)
      return;
    if (rev > c->want)
      c->want = rev;
    fetch_config(r, c);
    return;
  }
  /* p: put; d: deleted; x: expired; r: removed (a resync's touch) */
  if (op != 'p' && op != 'd' && op != 'x' && op != 'r')
    goto bad;
  svc = svc_get(r, buf);
  if (svc == NULL) {
    r->need_resync = 1;
    return;
  }
  if (svc->snap != NULL && rev <= svc->rev)
    return; /* already in hand (a read fetched it) */
  if (svc->fetching || (svc->snap != NULL ? svc->rev != prev : prev != 0)) {
    /* We missed something: the whole service from Redis. */
    if (rev > svc->want)
      svc->want = rev;
    fetch_service(r, svc);
    return;
  }
  if (op == 'p') {
    om_instance_t in;
    om_json_error_t err;
    const char *id = p, *json;
    sp = memchr(p, ' ', (size_t)(end - p));
    json = sp != NULL ? memchr(sp + 1, ' ', (size_t)(end - sp - 1)) : NULL;
    if (sp == NULL || json == NULL || (size_t)(sp - id) > OM_NAME_MAX)
      goto bad;
    {
      char idb[OM_NAME_MAX + 1];
      memcpy(idb, id, (size_t)(sp - id));
      idb[sp - id] = '\0';
      json++;
      memset(&err, 0, sizeof err);
      rc = om_instance_from_json(json, (size_t)(end - json), idb, &in, &err);
    }
    if (rc != 0)
      goto refetch;
    if (svc->snap != NULL)
      rc = om_snapshot_edit(svc->snap, rev, &in, 1, NULL, 0, &snap, NULL, NULL,
                            NULL);
    else
      rc = om_snapshot_new(svc->name, rev, &in, 1, &snap, NULL, NULL, NULL);
    om_instance_clear(&in);
  } else {
    /* ids separated by single spaces; at most a batch of them */
    const char *ids[1024];
    char *copy = NULL;
    size_t n = 0, rl = (size_t)(end - p);
    if (rl > 0) {
      copy = malloc(rl + 1);
      if (copy == NULL)
        goto refetch;
      memcpy(copy, p, rl);
      copy[rl] = '\0';
      for (char *t = copy; t != NULL && n < 1024;) {
        char *nx = strchr(t, ' ');
        if (nx != NULL)
          *nx++ = '\0';
        if (*t != '\0')
          ids[n++] = t;
        t = nx;
      }
    }
    if (svc->snap != NULL)
      rc = om_snapshot_edit(svc->snap, rev, NULL, 0, ids, n, &snap, NULL, NULL,
                            NULL);
    else
      rc = om_snapshot_new(svc->name, rev, NULL, 0, &snap, NULL, NULL, NULL);
    free(copy);
  }
  if (rc != 0)
    goto refetch;
  r->st.last_removal = op == 'd'   ? OM_STORE_DELETED
                       : op == 'x' ? OM_STORE_EXPIRED
                                   : OM_STORE_NOCHANGE;
  replica_set(r, svc, snap);
  r->st.last_removal = OM_STORE_NOCHANGE;
  return;
refetch:
  if (rev > svc->want)
    svc->want = rev;
  fetch_service(r, svc);
  return;
bad:
  om_log(OM_LOG_WARN, "store_bad_message", "store", "redis", NULL);
  r->need_resync = 1;
}

/* ------------------------------------------------------------------ */
/* the session: connect, subscribe, check the epoch, resync */

static void maybe_up(rstore_t *r) {
  if (r->state != S_SYNCING || !r->subscribed || !r->listed)
    return;
  r->state = S_UP;
  r->backoff = 0;
  r->attempts = 0;
  r->ever_up = 1;
  om_log(OM_LOG_INFO, "store_connected", "store", "redis", "host", r->host,
         NULL);
  if (r->opts.on_state != NULL)
    r->opts.on_state(r->opts.state_ud, 0);
}

static void on_epoch(rstore_t *r, redisReply *rep) {
  char fl[24], need[24];
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
      rep->element[0]->type != REDIS_REPLY_STRING) {
    session_fail(r, "unexpected reply to the epoch script");
    return;
  }
  if (r->epoch[0] != '\0' && strcmp(r->epoch, rep->element[0]->str) != 0) {
    /*
     * Redis lost its data (a restart without persistence, a flush, a
     * failover to an empty replica). Re-announce every service we
     * delivered at a revision above it, so watchers move to what Redis
     * holds now instead of keeping instances nobody renews.
     */
    om_log(OM_LOG_WARN, "store_data_lost", "store", "redis", "old_epoch",
           r->epoch, "new_epoch", rep->element[0]->str, NULL);
    for (size_t i = 0; i < r->n_svcs; i++) {
      rsvc_t *svc = r->svcs[i];
      const char *keys[2] = {r->k_rev, r->k_services};
      const char *args[4];
      req_t *q;
      if (svc->snap == NULL)
        continue;
      floor_str(r, fl);
      snprintf(need, sizeof need, "%" PRIu64, svc->rev + 1);
      args[0] = svc->name, args[1] = need, args[2] = fl, args[3] = r->chan;
      q = req_script(r, RQ_TOUCH, SC_TOUCH, 2, keys, 4, args, NULL);
      if (q == NULL || req_send(r, q) != 0) {
        session_fail(r, "out of memory during resync");
        return;
      }
    }
  }
  snprintf(r->epoch, sizeof r->epoch, "%.*s", (int)rep->element[0]->len,
           rep->element[0]->str);
  r->epoch_done = 1;
  if (r->subscribed)
    start_resync(r);
}

static void on_resync(rstore_t *r, redisReply *rep) {
  redisReply *svcs, *cfgs;
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
      rep->element[0]->type != REDIS_REPLY_ARRAY ||
      rep->element[1]->type != REDIS_REPLY_ARRAY) {
    session_fail(r, "unexpected reply to the list script");
    return;
  }
  svcs = rep->element[0];
  cfgs = rep->element[1];
  for (size_t i = 0; i + 2 < svcs->elements; i += 3) {
    uint64_t rev;
    rsvc_t *svc;
    if (svcs->element[i]->type != REDIS_REPLY_STRING ||
        !valid_name(svcs->element[i]->str) ||
        reply_rev(svcs->element[i + 1], &rev) != 0)
      continue;
    see(r, rev);
    svc = svc_get(r, svcs->element[i]->str);
    if (svc == NULL) {
      r->need_resync = 1;
      continue;
    }
    if (svc->snap == NULL || rev > svc->rev) {
      if (rev > svc->want)
        svc->want = rev;
      fetch_service(r, svc);
    }
  }
  for (size_t i = 0; i + 1 < cfgs->elements; i += 2) {
    uint64_t rev;
    rcfg_t *c;
    if (cfgs->element[i]->type != REDIS_REPLY_STRING ||
        !valid_name(cfgs->element[i]->str) ||
        reply_rev(cfgs->element[i + 1], &rev) != 0)
      continue;
    see(r, rev);
    c = cfg_get(r, cfgs->element[i]->str);
    if (c == NULL) {
      r->need_resync = 1;
      continue;
    }
    if (c->doc == NULL || rev > c->doc->revision) {
      if (rev > c->want)
        c->want = rev;
      fetch_config(r, c);
    }
  }
  r->listed = 1;
  maybe_up(r);
}

static void on_sub_message(redisAsyncContext *ac, void *reply, void *pd) {
  rstore_t *r = pd;
  redisReply *rep = reply;
  if (rep == NULL || r->base.closing || ac != r->sub)
    return;
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
      rep->element[0]->type != REDIS_REPLY_STRING)
    return;
  if (strcmp(rep->element[0]->str, "subscribe") == 0) {
    r->subscribed = 1;
    if (r->epoch_done)
      start_resync(r);
    return;
  }
  if (strcmp(rep->element[0]->str, "message") == 0 &&
      rep->element[2]->type == REDIS_REPLY_STRING)
    on_change_msg(r, rep->element[2]->str, rep->element[2]->len);
}

static void on_select(rstore_t *r, redisReply *rep) {
  if (rep->type == REDIS_REPLY_ERROR)
    session_fail(r, "SELECT failed: no such database");
}

static void on_connected(const redisAsyncContext *ac, int status);
static void on_disconnected(const redisAsyncContext *ac, int status);
static void on_retry(uv_timer_t *t);

static void send_select(rstore_t *r, redisAsyncContext *ac) {
  char db[16];
  snprintf(db, sizeof db, "%d", r->db);
  if (ac == r->cmd) {
    const char *argv[2] = {"SELECT", db};
    size_t lens[2] = {6, strlen(db)};
    req_t *q = req_new(r, RQ_SELECT, -1, 2, argv, lens);
    if (q == NULL || req_send(r, q) != 0)
      session_fail(r, "out of memory");
  } else {
    redisAsyncCommand(ac, NULL, NULL, "SELECT %s", db);
  }
}

/* Both connections are up: subscribe, check the epoch, then resync. */
static void session_start(rstore_t *r) {
  char cand[40];
  unsigned char rnd[16];
  const char *keys[1] = {r->k_epoch};
  const char *args[1] = {cand};
  req_t *q;
  r->state = S_SYNCING;
  if (r->db != 0) {
    send_select(r, r->cmd);
    send_select(r, r->sub);
    if (r->state != S_SYNCING)
      return;
  }
  if (redisAsyncCommand(r->sub, on_sub_message, r, "SUBSCRIBE %s", r->chan) !=
      REDIS_OK) {
    session_fail(r, "cannot subscribe");
    return;
  }
  if (uv_random(NULL, NULL, rnd, sizeof rnd, 0, NULL) != 0) {
    uint64_t x = realtime_us(r) ^ (uint64_t)(uintptr_t)r;
    memcpy(rnd, &x, sizeof x);
    memcpy(rnd + 8, &x, sizeof x);
  }
  for (int i = 0; i < 16; i++)
    snprintf(cand + 2 * i, 3, "%02x", rnd[i]);
  q = req_script(r, RQ_EPOCH, SC_EPOCH, 1, keys, 1, args, NULL);
  if (q == NULL || req_send(r, q) != 0)
    session_fail(r, "out of memory");
}

static void on_connected(const redisAsyncContext *ac, int status) {
  rstore_t *r = ac->data;
  if (r == NULL || r->base.closing)
    return;
  if (ac != r->cmd && ac != r->sub)
    return;
  if (status != REDIS_OK) {
    /* hiredis frees a context that failed to connect */
    if (ac == r->cmd)
      r->cmd = NULL;
    else
      r->sub = NULL;
    session_fail(r, ac->errstr[0] != '\0' ? ac->errstr : "connect failed");
    return;
  }
  if (ac == r->cmd)
    r->cmd_ok = 1;
  else
    r->sub_ok = 1;
  if (r->cmd_ok && r->sub_ok && r->state == S_CONNECTING)
    session_start(r);
}

static void on_disconnected(const redisAsyncContext *ac, int status) {
  rstore_t *r = ac->data;
  if (r == NULL || r->base.closing)
    return;
  if (ac == r->cmd) {
    r->cmd = NULL;
    r->cmd_ok = 0;
  } else if (ac == r->sub) {
    r->sub = NULL;
    r->sub_ok = 0;
  } else {
    return; /* one we dropped ourselves */
  }
  session_fail(r, ac->errstr[0] != '\0' ? ac->errstr : "connection closed");
}

/*
 * The poll callback of hiredis 0.14's libuv adapter returns on a nonzero
 * status, and libuv reports a refused connect (POLLERR) exactly that way
 * after stopping the handle: the context would wait forever. These hooks
 * are the adapter's own, with a callback that hands the error to hiredis
 * (which then reports the failed connect or the lost connection).
 */
static void poll_cb(uv_poll_t *h, int status, int events) {
  redisLibuvEvents *p = h->data;
  if (p->context == NULL)
    return;
  if (status != 0) {
    if (!(p->context->c.flags & REDIS_CONNECTED))
      redisAsyncHandleWrite(p->context);
    else
      redisAsyncHandleRead(p->context);
    return;
  }
  if (events & UV_READABLE)
    redisAsyncHandleRead(p->context);
  if (p->context != NULL && (events & UV_WRITABLE))
    redisAsyncHandleWrite(p->context);
}

static void poll_update(redisLibuvEvents *p) {
  if (p->events != 0)
    uv_poll_start(&p->handle, p->events, poll_cb);
  else
    uv_poll_stop(&p->handle);
}

static void ev_add_read(void *d) {
  ((redisLibuvEvents *)d)->events |= UV_READABLE;
  poll_update(d);
}

static void ev_del_read(void *d) {
  ((redisLibuvEvents *)d)->events &= ~UV_READABLE;
  poll_update(d);
}

static void ev_add_write(void *d) {
  ((redisLibuvEvents *)d)->events |= UV_WRITABLE;
  poll_update(d);
}

static void ev_del_write(void *d) {
  ((redisLibuvEvents *)d)->events &= ~UV_WRITABLE;
  poll_update(d);
}

static redisAsyncContext *connect_one(rstore_t *r) {
  redisAsyncContext *ac = redisAsyncConnect(r->addr, r->port);
  if (ac == NULL)
    return NULL;
  if (ac->err != 0 || redisLibuvAttach(ac, r->loop) != REDIS_OK) {
    /* A failed attach leaves its hooks set with no data behind them. */
    memset(&ac->ev, 0, sizeof ac->ev);
    redisAsyncFree(ac);
    return NULL;
  }
  ac->ev.addRead = ev_add_read;
  ac->ev.delRead = ev_del_read;
  ac->ev.addWrite = ev_add_write;
  ac->ev.delWrite = ev_del_write;
  ac->data = r;
  redisAsyncSetConnectCallback(ac, on_connected);
  redisAsyncSetDisconnectCallback(ac, on_disconnected);
  return ac;
}

static void connect_pair(rstore_t *r);
static void release(rstore_t *r);

static void resolve_failed(rstore_t *r, int rc) {
  char why[OM_STORE_REDIS_HOST_MAX + 128];
  snprintf(why, sizeof why, "cannot resolve '%s': %s", r->host,
           uv_strerror(rc));
  session_fail(r, why);
}

static void on_resolved(uv_getaddrinfo_t *g, int status, struct addrinfo *res) {
  rstore_t *r = g->data;
  int rc = status, closing = r->base.closing;
  r->resolving = 0;
  if (rc == 0) {
    const struct addrinfo *a, *pick = NULL;
    uint64_t n = 0;
    for (a = res; a != NULL; a = a->ai_next)
      if (a->ai_family == AF_INET || a->ai_family == AF_INET6)
        n++;
    if (n > 0) {
      uint64_t k = (r->attempts - 1) % n;
      for (a = res; pick == NULL; a = a->ai_next)
        if ((a->ai_family == AF_INET || a->ai_family == AF_INET6) && k-- == 0)
          pick = a;
    }
    if (pick == NULL)
      rc = UV_EAI_NONAME;
    else if (pick->ai_family == AF_INET6)
      rc = uv_ip6_name((const struct sockaddr_in6 *)pick->ai_addr, r->addr,
                       sizeof r->addr);
    else
      rc = uv_ip4_name((const struct sockaddr_in *)pick->ai_addr, r->addr,
                       sizeof r->addr);
  }
  uv_freeaddrinfo(res);
  release(r); /* frees r when it was the last thing a close waited for */
  if (closing || r->state != S_CONNECTING)
    return; /* timed out meanwhile: the retry timer owns what comes next */
  if (rc != 0)
    resolve_failed(r, rc);
  else
    connect_pair(r);
}

static void session_connect(rstore_t *r) {
  r->state = S_CONNECTING;
  r->session_ms = uv_now(r->loop);
  r->cmd_ok = r->sub_ok = r->subscribed = r->epoch_done = r->listed = 0;
  r->sweeping = 0;
  r->attempts++;
  if (r->numeric) {
    connect_pair(r);
    return;
  }
  if (!r->resolving) { /* else the pending answer connects this session */
    struct addrinfo hints;
    int rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    r->gai.data = r;
    rc = uv_getaddrinfo(r->loop, &r->gai, on_resolved, r->host, NULL, &hints);
    if (rc != 0) {
      resolve_failed(r, rc);
      return;
    }
    r->resolving = 1;
    r->handles_open++; /* close waits for the answer */
  }
}

static void connect_pair(rstore_t *r) {
  r->cmd = connect_one(r);
  if (r->cmd == NULL) {
    session_fail(r, "cannot create a connection");
    return;
  }
  r->sub = connect_one(r);
  if (r->sub == NULL)
    session_fail(r, "cannot create a connection");
}

/* Drop both connections (their pending callbacks see NULL replies). */
static void drop_connections(rstore_t *r) {
  redisAsyncContext *c = r->cmd, *s = r->sub;
  r->cmd = r->sub = NULL;
  r->cmd_ok = r->sub_ok = 0;
  if (c != NULL)
    redisAsyncFree(c);
  if (s != NULL)
    redisAsyncFree(s);
}

static void session_fail(rstore_t *r, const char *why) {
  int was_up = r->state == S_UP;
  char delay[24], tries[24];
  if (r->base.closing || r->state == S_DOWN)
    return;
  r->state = S_DOWN;
  drop_connections(r);
  r->inflight = 0;
  r->sweeping = 0;
  for (size_t i = 0; i < r->n_svcs; i++)
    r->svcs[i]->fetching = 0;
  for (size_t i = 0; i < r->n_cfgs; i++)
    r->cfgs[i]->fetching = 0;
  if (r->backoff == 0)
    r->backoff = r->opts.backoff_min_ms;
  else if (r->backoff < r->opts.backoff_max_ms / 2)
    r->backoff *= 2;
  else
    r->backoff = r->opts.backoff_max_ms;
  snprintf(delay, sizeof delay, "%" PRIu64, r->backoff);
  snprintf(tries, sizeof tries, "%" PRIu64, r->attempts);
  om_log(OM_LOG_WARN, "store_unavailable", "store", "redis", "host", r->host,
         "reason", why, "retry_ms", delay, "attempt", tries, NULL);
  uv_timer_start(&r->retry, on_retry, r->backoff, 0);
  if (was_up && r->opts.on_state != NULL)
    r->opts.on_state(r->opts.state_ud, OM_EIO);
}

static void on_retry(uv_timer_t *t) {
  rstore_t *r = t->data;
  if (!r->base.closing && r->state == S_DOWN)
    session_connect(r);
}

/* ------------------------------------------------------------------ */
/* replies */

static om_store_change_t change_of(long long code) {
  switch (code) {
  case 1:
    return OM_STORE_CREATED;
  case 2:
    return OM_STORE_UPDATED;
  case 3:
    return OM_STORE_DELETED;
  default:
    return OM_STORE_NOCHANGE;
  }
}

/* {code, rev} from a write script: code < 0 is "not found". */
static int write_result(redisReply *rep, long long *code, uint64_t *rev) {
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
      rep->element[0]->type != REDIS_REPLY_INTEGER ||
      reply_rev(rep->element[1], rev) != 0)
    return -1;
  *code = rep->element[0]->integer;
  return 0;
}

static void answer_write(rstore_t *r, req_t *q, redisReply *rep) {
  long long code = 0;
  uint64_t rev = 0;
  if (rep == NULL || write_result(rep, &code, &rev) != 0) {
    if (rep != NULL)
      om_log(OM_LOG_ERROR, "store_error", "store", "redis", "error",
             rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply",
             NULL);
    if (q->wcb != NULL)
      q->wcb(q->ud, OM_EIO, OM_STORE_NOCHANGE, 0);
    return;
  }
  see(r, rev);
  if (code < 0) {
    if (q->wcb != NULL)
      q->wcb(q->ud, OM_ENOTFOUND, OM_STORE_NOCHANGE, rev);
    return;
  }
  switch (q->kind) {
  case RQ_PUT:
    if (code == 0)
      r->st.renewals++;
    else
      r->st.registrations++;
    break;
  case RQ_RENEW:
    r->st.renewals++;
    break;
  case RQ_DELETE:
    r->st.deletions++;
    break;
  default:
    break;
  }
  if (q->wcb != NULL)
    q->wcb(q->ud, 0, change_of(code), rev);
}

/* Serve a read from the replica (Redis away, or it has nothing newer). */
static void serve_snapshot(rstore_t *r, const char *name,
                           om_store_snapshot_cb cb, void *ud) {
  rsvc_t *svc = svc_find(r, name);
  if (svc != NULL && svc->snap != NULL)
    cb(ud, 0, svc->snap);
  else
    cb(ud, r->ever_up ? OM_ENOTFOUND : OM_EIO, NULL);
}

/* A snapshot reply: {} | {rev} | {rev, {id, value, ...}}. */
static void answer_snapshot(rstore_t *r, req_t *q, redisReply *rep) {
  rsvc_t *svc;
  uint64_t rev;
  om_snapshot_t *snap = NULL;
  int rc;
  int internal = q->kind == RQ_FETCH;
  if (internal) {
    svc = svc_find(r, q->name);
    if (svc != NULL)
      svc->fetching = 0;
  }
  if (rep == NULL || rep->type != REDIS_REPLY_ARRAY) {
    if (rep != NULL)
      om_log(OM_LOG_ERROR, "store_error", "store", "redis", "error",
             rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply",
             NULL);
    if (!internal)
      serve_snapshot(r, q->name, q->scb, q->ud);
    else
      r->need_resync = 1;
    return;
  }
  if (rep->elements == 0) {
    if (!internal)
      q->scb(q->ud, OM_ENOTFOUND, NULL);
    return;
  }
  if (reply_rev(rep->element[0], &rev) != 0) {
    if (!internal)
      q->scb(q->ud, OM_EIO, NULL);
    return;
  }
  see(r, rev);
  svc = svc_find(r, q->name);
  if (rep->elements == 1) {
    /* the replica was current when the script ran */
    if (!internal && svc != NULL && svc->snap != NULL && svc->rev >= rev)
      q->scb(q->ud, 0, svc->snap);
    else if (!internal)
      q->scb(q->ud, OM_EIO, NULL);
    return;
  }
  if (rep->element[1]->type != REDIS_REPLY_ARRAY) {
    if (!internal)
      q->scb(q->ud, OM_EIO, NULL);
    return;
  }
  rc = build_snapshot(q->name, rev, rep->element[1]->element,
                      rep->element[1]->elements, 0, &snap);
  if (rc != 0) {
    if (!internal)
      q->scb(q->ud, rc, NULL);
    else
      r->need_resync = 1;
    return;
  }
  if (svc == NULL)
    svc = svc_get(r, q->name);
  if (!internal)
    q->scb(q->ud, 0, snap);
  if (svc != NULL) {
    replica_set(r, svc, snap); /* takes our reference */
    if (!r->base.closing && svc->want > svc->rev)
      fetch_service(r, svc); /* something newer was announced meanwhile */
  } else {
    om_snapshot_unref(snap);
  }
}

static void answer_list(rstore_t *r, req_t *q, redisReply *rep) {
  redisReply *svcs;
  om_service_rev_t *list;
  size_t n = 0;
  if (rep == NULL || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
      rep->element[0]->type != REDIS_REPLY_ARRAY) {
    q->lcb(q->ud, OM_EIO, NULL, 0);
    return;
  }
  svcs = rep->element[0];
  list = malloc((svcs->elements / 3 + 1) * sizeof *list);
  if (list == NULL) {
    q->lcb(q->ud, OM_ENOMEM, NULL, 0);
    return;
  }
  for (size_t i = 0; i + 2 < svcs->elements; i += 3) {
    uint64_t rev;
    if (svcs->element[i]->type != REDIS_REPLY_STRING ||
        !valid_name(svcs->element[i]->str) ||
        reply_rev(svcs->element[i + 1], &rev) != 0 ||
        svcs->element[i + 2]->type != REDIS_REPLY_INTEGER)
      continue;
    see(r, rev);
    list[n].service = svcs->element[i]->str;
    list[n].revision = rev;
    list[n].instances = (size_t)svcs->element[i + 2]->integer;
    n++;
  }
  q->lcb(q->ud, 0, list, n);
  free(list);
}

/* HMGET rev ct body */
static void answer_config(rstore_t *r, req_t *q, redisReply *rep) {
  int internal = q->kind == RQ_CFGFETCH;
  rcfg_t *c = cfg_find(r, q->name);
  uint64_t rev;
  om_config_doc_t *doc;
  if (internal && c != NULL)
    c->fetching = 0;
  if (rep == NULL || rep->type != REDIS_REPLY_ARRAY || rep->elements != 3) {
    if (!internal) {
      if (c != NULL && c->doc != NULL)
        q->ccb(q->ud, 0, c->doc);
      else
        q->ccb(q->ud, r->ever_up ? OM_ENOTFOUND : OM_EIO, NULL);
    }
    return;
  }
  if (rep->element[0]->type == REDIS_REPLY_NIL) {
    if (!internal)
      q->ccb(q->ud, OM_ENOTFOUND, NULL);
    return;
  }
  if (reply_rev(rep->element[0], &rev) != 0 ||
      rep->element[1]->type != REDIS_REPLY_STRING ||
      rep->element[2]->type != REDIS_REPLY_STRING) {
    if (!internal)
      q->ccb(q->ud, OM_EIO, NULL);
    return;
  }
  doc = om_config_doc_new(q->name, rep->element[1]->str, rep->element[2]->str,
                          rep->element[2]->len, rev);
  if (doc == NULL) {
    if (!internal)
      q->ccb(q->ud, OM_ENOMEM, NULL);
    return;
  }
  if (!internal)
    q->ccb(q->ud, 0, doc);
  if (c == NULL)
    c = cfg_get(r, q->name);
  if (c != NULL) {
    cfg_set(r, c, doc);
    if (!r->base.closing && c->want > (c->doc != NULL ? c->doc->revision : 0))
      fetch_config(r, c);
  } else {
    om_config_doc_unref(doc);
  }
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata) {
  req_t *q = privdata;
  rstore_t *r = q->r;
  redisReply *rep = reply;
  if (rep != NULL && ac == r->cmd) {
    if (r->inflight > 0)
      r->inflight--;
    r->progress_ms = uv_now(r->loop);
  }
  if (r->base.closing) {
    free(q);
    return;
  }
  /* Scripts vanish when Redis restarts or SCRIPT FLUSH runs: EVAL once. */
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR && q->script >= 0 &&
      !q->retried && strncmp(rep->str, "NOSCRIPT", 8) == 0) {
    q->retried = 1;
    q->argv[0] = "EVAL";
    q->argvlen[0] = 4;
    q->argv[1] = scripts[q->script];
    q->argvlen[1] = strlen(scripts[q->script]);
    if (r->cmd != NULL &&
        redisAsyncCommandArgv(r->cmd, on_reply, q, q->argc, q->argv,
                              q->argvlen) == REDIS_OK) {
      r->inflight++;
      return;
    }
    rep = NULL;
  }
  switch (q->kind) {
  case RQ_PUT:
  case RQ_RENEW:
  case RQ_DELETE:
  case RQ_CFGPUT:
    answer_write(r, q, rep);
    break;
  case RQ_SNAP:
  case RQ_FETCH:
    answer_snapshot(r, q, rep);
    break;
  case RQ_LIST:
    answer_list(r, q, rep);
    break;
  case RQ_CFGGET:
  case RQ_CFGFETCH:
    answer_config(r, q, rep);
    break;
  case RQ_RESYNC:
    if (rep != NULL)
      on_resync(r, rep);
    break;
  case RQ_EPOCH:
    if (rep != NULL)
      on_epoch(r, rep);
    break;
  case RQ_SELECT:
    if (rep != NULL)
      on_select(r, rep);
    break;
  case RQ_SWEEP:
    r->sweeping = 0;
    if (rep != NULL && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0)
      r->st.expiries += (uint64_t)rep->integer;
    else if (rep != NULL && rep->type == REDIS_REPLY_ERROR)
      om_log(OM_LOG_ERROR, "store_error", "store", "redis", "error", rep->str,
             NULL);
    break;
  case RQ_TOUCH:
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR)
      om_log(OM_LOG_ERROR, "store_error", "store", "redis", "error", rep->str,
             NULL);
    break;
  default:
    break;
  }
  free(q);
}

/* ---- the sweep timer: leases, the watchdog, deferred resyncs ---- */

static void on_sweep(uv_timer_t *t) {
  rstore_t *r = t->data;
  char fl[24];
  if (r->base.closing)
    return;
  if (r->state != S_DOWN && r->inflight > 0 &&
      uv_now(r->loop) - r->progress_ms > r->opts.command_timeout_ms) {
    session_fail(r, "redis stopped answering");
    return;
  }
  /* a connect that neither completes nor fails (a silent network) */
  if ((r->state == S_CONNECTING || r->state == S_SYNCING) &&
      uv_now(r->loop) - r->session_ms > r->opts.command_timeout_ms) {
    session_fail(r, "connect timed out");
    return;
  }
  if (r->state != S_UP)
    return;
  if (r->need_resync)
    start_resync(r);
  if (!r->sweeping) {
    const char *keys[3] = {r->k_rev, r->k_services, r->k_leases};
    const char *args[4];
    req_t *q;
    floor_str(r, fl);
    args[0] = fl, args[1] = r->chan, args[2] = r->prefix, args[3] = SWEEP_BATCH;
    q = req_script(r, RQ_SWEEP, SC_SWEEP, 3, keys, 4, args, NULL);
    if (q != NULL && req_send(r, q) == 0)
      r->sweeping = 1;
  }
}

/* ------------------------------------------------------------------ */
/* the contract */

static int r_put_instance(om_store_t *s, const char *service,
                          const om_instance_t *in, om_store_write_cb cb,
                          void *ud) {
  rstore_t *r = (rstore_t *)s;
  om_instance_t sorted;
  char *json = NULL, *value, ttl[24], fl[24];
  char ihash[PREFIX_MAX + OM_NAME_MAX + 4];
  size_t jl = 0, tl, vl;
  const char *keys[4], *args[7];
  size_t lens[7];
  req_t *q;
  int rc;
  if (r->state != S_UP) {
    if (cb != NULL)
      cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
    return 0;
  }
  /* The stored value is canonical (metadata sorted) so that an identical
   * renewal compares equal byte for byte inside the script. */
  rc = om_instance_copy(&sorted, in);
  if (rc != 0)
    return rc;
  rc = om_instance_to_json(&sorted, &json, &jl);
  om_instance_clear(&sorted);
  if (rc != 0)
    return rc;
  tl = (size_t)snprintf(ttl, sizeof ttl, "%" PRIu64, in->ttl_ms);
  vl = tl + 1 + jl;
  value = malloc(vl + 1);
  if (value == NULL) {
    free(json);
    return OM_ENOMEM;
  }
  memcpy(value, ttl, tl);
  value[tl] = ' ';
  memcpy(value + tl + 1, json, jl);
  value[vl] = '\0';
  free(json);
  snprintf(ihash, sizeof ihash, "%si:%s", r->prefix, service);
  floor_str(r, fl);
  keys[0] = r->k_rev, keys[1] = r->k_services, keys[2] = ihash,
  keys[3] = r->k_leases;
  args[0] = service, args[1] = in->id, args[2] = value, args[3] = ttl,
  args[4] = fl, args[5] = r->chan, args[6] = KEY_GRACE_MS;
  for (int i = 0; i < 7; i++)
    lens[i] = SIZE_MAX;
  lens[2] = vl;
  q = req_script(r, RQ_PUT, SC_PUT, 4, keys, 7, args, lens);
  free(value);
  if (q == NULL)
    return OM_ENOMEM;
  q->wcb = cb;
  q->ud = ud;
  if (req_send(r, q) != 0 && cb != NULL)
    cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
  return 0;
}

static int instance_op(rstore_t *r, int kind, const char *service,
                       const char *id, om_store_write_cb cb, void *ud) {
  char ihash[PREFIX_MAX + OM_NAME_MAX + 4], fl[24];
  const char *keys[4], *args[4];
  req_t *q;
  if (r->state != S_UP) {
    if (cb != NULL)
      cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
    return 0;
  }
  snprintf(ihash, sizeof ihash, "%si:%s", r->prefix, service);
  keys[0] = r->k_rev, keys[1] = r->k_services, keys[2] = ihash,
  keys[3] = r->k_leases;
  if (kind == RQ_RENEW) {
    args[0] = service, args[1] = id, args[2] = KEY_GRACE_MS;
    q = req_script(r, kind, SC_RENEW, 4, keys, 3, args, NULL);
  } else {
    floor_str(r, fl);
    args[0] = service, args[1] = id, args[2] = fl, args[3] = r->chan;
    q = req_script(r, kind, SC_DELETE, 4, keys, 4, args, NULL);
  }
  if (q == NULL)
    return OM_ENOMEM;
  q->wcb = cb;
  q->ud = ud;
  if (req_send(r, q) != 0 && cb != NULL)
    cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
  return 0;
}

static int r_renew(om_store_t *s, const char *service, const char *id,
                   om_store_write_cb cb, void *ud) {
  return instance_op((rstore_t *)s, RQ_RENEW, service, id, cb, ud);
}

static int r_delete_instance(om_store_t *s, const char *service, const char *id,
                             om_store_write_cb cb, void *ud) {
  return instance_op((rstore_t *)s, RQ_DELETE, service, id, cb, ud);
}

static int r_snapshot(om_store_t *s, const char *service,
                      om_store_snapshot_cb cb, void *ud) {
  rstore_t *r = (rstore_t *)s;
  char ihash[PREFIX_MAX + OM_NAME_MAX + 4], known[24];
  const char *keys[2], *args[2];
  rsvc_t *svc;
  req_t *q;
  if (r->state != S_UP) {
    serve_snapshot(r, service, cb, ud);
    return 0;
  }
  svc = svc_find(r, service);
  snprintf(ihash, sizeof ihash, "%si:%s", r->prefix, service);
  snprintf(known, sizeof known, "%" PRIu64, svc != NULL ? svc->rev : 0);
  keys[0] = r->k_services, keys[1] = ihash;
  args[0] = service, args[1] = svc != NULL && svc->snap != NULL ? known : "";
  q = req_script(r, RQ_SNAP, SC_SNAP, 2, keys, 2, args, NULL);
  if (q == NULL)
    return OM_ENOMEM;
  q->scb = cb;
  q->ud = ud;
  snprintf(q->name, sizeof q->name, "%s", service);
  if (req_send(r, q) != 0)
    serve_snapshot(r, service, cb, ud);
  return 0;
}

static void serve_list(rstore_t *r, om_store_list_cb cb, void *ud) {
  om_service_rev_t *list =
      malloc((r->n_svcs != 0 ? r->n_svcs : 1) * sizeof *list);
  size_t n = 0;
  if (list == NULL) {
    cb(ud, OM_ENOMEM, NULL, 0);
    return;
  }
  for (size_t i = 0; i < r->n_svcs; i++) {
    if (r->svcs[i]->snap == NULL)
      continue;
    list[n].service = r->svcs[i]->name;
    list[n].revision = r->svcs[i]->rev;
    list[n].instances = om_snapshot_count(r->svcs[i]->snap);
    n++;
  }
  if (!r->ever_up)
    cb(ud, OM_EIO, NULL, 0);
  else
    cb(ud, 0, list, n);
  free(list);
}

static int r_list_services(om_store_t *s, om_store_list_cb cb, void *ud) {
  rstore_t *r = (rstore_t *)s;
  const char *keys[2] = {r->k_services, r->k_configs};
  const char *args[1] = {r->prefix};
  req_t *q;
  if (r->state != S_UP) {
    serve_list(r, cb, ud);
    return 0;
  }
  q = req_script(r, RQ_LIST, SC_LIST, 2, keys, 1, args, NULL);
  if (q == NULL)
    return OM_ENOMEM;
  q->lcb = cb;
  q->ud = ud;
  if (req_send(r, q) != 0)
    serve_list(r, cb, ud);
  return 0;
}

static int r_config_put(om_store_t *s, const char *name,
                        const char *content_type, const char *body, size_t len,
                        om_store_write_cb cb, void *ud) {
  rstore_t *r = (rstore_t *)s;
  char key[PREFIX_MAX + OM_NAME_MAX + 4], fl[24];
  const char *keys[3], *args[5];
  size_t lens[5];
  req_t *q;
  if (len > r->opts.max_config_bytes)
    return OM_ETOOBIG;
  if (r->state != S_UP) {
    if (cb != NULL)
      cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
    return 0;
  }
  snprintf(key, sizeof key, "%sc:%s", r->prefix, name);
  floor_str(r, fl);
  keys[0] = r->k_rev, keys[1] = r->k_configs, keys[2] = key;
  args[0] = name, args[1] = content_type, args[2] = body != NULL ? body : "",
  args[3] = fl, args[4] = r->chan;
  for (int i = 0; i < 5; i++)
    lens[i] = SIZE_MAX;
  lens[2] = len;
  q = req_script(r, RQ_CFGPUT, SC_CFGPUT, 3, keys, 5, args, lens);
  if (q == NULL)
    return OM_ENOMEM;
  q->wcb = cb;
  q->ud = ud;
  if (req_send(r, q) != 0 && cb != NULL)
    cb(ud, OM_EIO, OM_STORE_NOCHANGE, 0);
  return 0;
}

static int r_config_get(om_store_t *s, const char *name, om_store_config_cb cb,
                        void *ud) {
  rstore_t *r = (rstore_t *)s;
  char key[PREFIX_MAX + OM_NAME_MAX + 4];
  const char *argv[5];
  size_t lens[5];
  rcfg_t *c;
  req_t *q;
  if (r->state != S_UP) {
    c = cfg_find(r, name);
    if (c != NULL && c->doc != NULL)
      cb(ud, 0, c->doc);
    else
      cb(ud, r->ever_up ? OM_ENOTFOUND : OM_EIO, NULL);
    return 0;
  }
  snprintf(key, sizeof key, "%sc:%s", r->prefix, name);
  argv[0] = "HMGET", argv[1] = key, argv[2] = "rev", argv[3] = "ct",
  argv[4] = "body";
  for (int i = 0; i < 5; i++)
    lens[i] = strlen(argv[i]);
  q = req_new(r, RQ_CFGGET, -1, 5, argv, lens);
  if (q == NULL)
    return OM_ENOMEM;
  q->ccb = cb;
  q->ud = ud;
  snprintf(q->name, sizeof q->name, "%s", name);
  if (req_send(r, q) != 0) {
    c = cfg_find(r, name);
    if (c != NULL && c->doc != NULL)
      cb(ud, 0, c->doc);
    else
      cb(ud, OM_EIO, NULL);
  }
  return 0;
}

static void r_status(om_store_t *s, om_store_status_t *out) {
  rstore_t *r = (rstore_t *)s;
  *out = r->st;
  out->stale = r->state != S_UP;
  out->services = 0;
  out->instances = 0;
  for (size_t i = 0; i < r->n_svcs; i++)
    if (r->svcs[i]->snap != NULL) {
      out->services++;
      out->instances += om_snapshot_count(r->svcs[i]->snap);
    }
}

static void free_all(rstore_t *r) {
  for (size_t i = 0; i < r->n_svcs; i++) {
    om_snapshot_unref(r->svcs[i]->snap);
    free(r->svcs[i]->name);
    free(r->svcs[i]);
  }
  for (size_t i = 0; i < r->n_cfgs; i++) {
    om_config_doc_unref(r->cfgs[i]->doc);
    free(r->cfgs[i]->name);
    free(r->cfgs[i]);
  }
  om__subs_free(&r->base.subs);
  free(r->svcs);
  free(r->cfgs);
  free(r);
}

/* One of the handles (or the pending name lookup) is done with r; the last
 * one frees it once the store is closing. */
static void release(rstore_t *r) {
  void (*done)(void *);
  void *ud;
  if (--r->handles_open > 0 || !r->base.closing)
    return;
  done = r->done;
  ud = r->done_ud;
  free_all(r);
  if (done != NULL)
    done(ud);
}

static void on_handle_closed(uv_handle_t *h) {
  release(h->data);
}

static void r_close(om_store_t *s, void (*done)(void *ud), void *ud) {
  rstore_t *r = (rstore_t *)s;
  r->done = done;
  r->done_ud = ud;
  drop_connections(r);
  if (r->resolving) /* its callback still runs (UV_ECANCELED or done) */
    uv_cancel((uv_req_t *)&r->gai);
  uv_timer_stop(&r->sweep);
  uv_timer_stop(&r->retry);
  uv_close((uv_handle_t *)&r->sweep, on_handle_closed);
  uv_close((uv_handle_t *)&r->retry, on_handle_closed);
}

int om_store_redis_ready(const om_store_t *s) {
  return s != NULL && s->ops == &redis_ops &&
         ((const rstore_t *)s)->state == S_UP;
}

static void on_wait_expired(uv_timer_t *t) {
  *(int *)t->data = 1;
}

int om_store_redis_wait_ready(uv_loop_t *loop, const om_store_t *s,
                              uint64_t wait_ms) {
  uv_timer_t t;
  int expired = 0;
  uv_timer_init(loop, &t);
  t.data = &expired;
  uv_timer_start(&t, on_wait_expired, wait_ms, 0);
  while (!om_store_redis_ready(s) && !expired)
    uv_run(loop, UV_RUN_ONCE);
  uv_timer_stop(&t);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT); /* the timer's close, before t goes away */
  return om_store_redis_ready(s) ? 0 : OM_EDEADLINE;
}

static const om_store_ops_t redis_ops = {
    .name = "redis",
    .put_instance = r_put_instance,
    .renew = r_renew,
    .delete_instance = r_delete_instance,
    .snapshot = r_snapshot,
    .list_services = r_list_services,
    .config_put = r_config_put,
    .config_get = r_config_get,
    .status = r_status,
    .close = r_close,
};

/* ------------------------------------------------------------------ */
/* the URL and construction */

static int is_reg_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_';
}

#define URL_FAIL(msg)                                                          \
  do {                                                                         \
    if (why != NULL)                                                           \
      *why = (msg);                                                            \
    return OM_EINVAL;                                                          \
  } while (0)

int om_store_redis_parse_url(const char *url, char *host, size_t host_cap,
                             int *port, int *db, const char **why) {
  const char *p, *h, *he;
  long v;
  if (url == NULL || host == NULL || host_cap == 0 || port == NULL ||
      db == NULL)
    URL_FAIL("missing argument");
  if (strncmp(url, "rediss://", 9) == 0)
    URL_FAIL("TLS (rediss://) is not supported");
  if (strncmp(url, "redis://", 8) != 0)
    URL_FAIL("must start with redis://");
  p = url + 8;
  if (*p == '[') {
    h = p + 1;
    he = strchr(h, ']');
    if (he == NULL || he == h)
      URL_FAIL("an IPv6 host must be [ADDRESS]");
    for (const char *q = h; q < he; q++)
      if (!((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f') ||
            (*q >= 'A' && *q <= 'F') || *q == ':' || *q == '.'))
        URL_FAIL("an IPv6 host must be [ADDRESS]");
    p = he + 1;
  } else {
    h = p;
    while (is_reg_char(*p))
      p++;
    he = p;
    if (he == h)
      URL_FAIL("the host is missing");
    if (*p == '@')
      URL_FAIL("credentials in the URL are not supported");
  }
  if ((size_t)(he - h) >= host_cap ||
      (size_t)(he - h) > OM_STORE_REDIS_HOST_MAX)
    URL_FAIL("the host is too long");
  memcpy(host, h, (size_t)(he - h));
  host[he - h] = '\0';
  *port = 6379;
  *db = 0;
  if (*p == ':') {
    p++;
    v = 0;
    if (*p < '0' || *p > '9')
      URL_FAIL("the port must be a number in [1, 65535]");
    while (*p >= '0' && *p <= '9') {
      v = v * 10 + (*p++ - '0');
      if (v > 65535)
        URL_FAIL("the port must be a number in [1, 65535]");
    }
    if (v < 1)
      URL_FAIL("the port must be a number in [1, 65535]");
    *port = (int)v;
  }
  if (*p == '/') {
    p++;
    if (*p != '\0') {
      v = 0;
      while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v > 9999)
          URL_FAIL("the database must be a number in [0, 9999]");
      }
      if (*p != '\0')
        URL_FAIL("the database must be a number in [0, 9999]");
      *db = (int)v;
    }
  }
  if (*p != '\0')
    URL_FAIL("unexpected characters after the host (query, fragment or "
             "path are not supported)");
  return 0;
}

static int valid_prefix(const char *s) {
  size_t n = strnlen(s, PREFIX_MAX + 1);
  if (n > PREFIX_MAX)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!is_reg_char(s[i]) && s[i] != ':' && s[i] != '{' && s[i] != '}')
      return 0;
  return 1;
}

int om_store_redis_new(uv_loop_t *loop, const om_store_redis_opts_t *opts,
                       om_store_t **out) {
  rstore_t *r;
  const char *url, *prefix;
  if (loop == NULL || out == NULL)
    return OM_EINVAL;
  url = opts != NULL && opts->url != NULL ? opts->url
                                          : "redis://127.0.0.1:6379/0";
  prefix = opts != NULL && opts->prefix != NULL ? opts->prefix : DEFAULT_PREFIX;
  if (!valid_prefix(prefix))
    return OM_EINVAL;
  r = calloc(1, sizeof *r);
  if (r == NULL)
    return OM_ENOMEM;
  if (om_store_redis_parse_url(url, r->host, sizeof r->host, &r->port, &r->db,
                               NULL) != 0) {
    free(r);
    return OM_EINVAL;
  }
  {
    unsigned char buf[sizeof(struct in6_addr)];
    r->numeric = inet_pton(AF_INET, r->host, buf) == 1 ||
                 inet_pton(AF_INET6, r->host, buf) == 1;
    if (r->numeric)
      snprintf(r->addr, sizeof r->addr, "%s", r->host);
  }
  if (opts != NULL)
    r->opts = *opts;
  r->opts.url = NULL; /* not kept: the caller owns it */
  r->opts.prefix = NULL;
  if (r->opts.sweep_ms == 0)
    r->opts.sweep_ms = DEFAULT_SWEEP_MS;
  if (r->opts.backoff_min_ms == 0)
    r->opts.backoff_min_ms = DEFAULT_BACKOFF_MIN;
  if (r->opts.backoff_max_ms == 0)
    r->opts.backoff_max_ms = DEFAULT_BACKOFF_MAX;
  if (r->opts.backoff_max_ms < r->opts.backoff_min_ms)
    r->opts.backoff_max_ms = r->opts.backoff_min_ms;
  if (r->opts.command_timeout_ms == 0)
    r->opts.command_timeout_ms = DEFAULT_CMD_TIMEOUT;
  if (r->opts.max_config_bytes == 0)
    r->opts.max_config_bytes = DEFAULT_MAX_CONFIG;
  r->max_seen = r->opts.min_revision;
  snprintf(r->prefix, sizeof r->prefix, "%s", prefix);
  snprintf(r->k_rev, sizeof r->k_rev, "%srev", prefix);
  snprintf(r->k_services, sizeof r->k_services, "%sservices", prefix);
  snprintf(r->k_leases, sizeof r->k_leases, "%sleases", prefix);
  snprintf(r->k_configs, sizeof r->k_configs, "%sconfigs", prefix);
  snprintf(r->k_epoch, sizeof r->k_epoch, "%sepoch", prefix);
  snprintf(r->chan, sizeof r->chan, "%sevents@%d", prefix, r->db);
  for (int i = 0; i < SC__COUNT; i++)
    sha1_hex(scripts[i], r->sha[i]);
  r->loop = loop;
  r->base.ops = &redis_ops;
  if (uv_timer_init(loop, &r->sweep) != 0) {
    free(r);
    return OM_ENOMEM;
  }
  if (uv_timer_init(loop, &r->retry) != 0) {
    /* an initialised handle must be closed before its memory goes */
    r->handles_open = 1;
    r->base.closing = 1;
    r->sweep.data = r;
    uv_close((uv_handle_t *)&r->sweep, on_handle_closed);
    return OM_ENOMEM;
  }
  r->sweep.data = r;
  r->retry.data = r;
  r->handles_open = 2;
  uv_timer_start(&r->sweep, on_sweep, r->opts.sweep_ms, r->opts.sweep_ms);
  session_connect(r);
  *out = &r->base;
  return 0;
}
