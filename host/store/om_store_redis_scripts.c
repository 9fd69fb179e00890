/*
 * om_store_redis_scripts.c: the Lua scripts every change runs inside
 * Redis, and the SHA-1 that names them for EVALSHA
 * (om_store_redis_internal.h).
 */
#include "om_store_redis_internal.h"

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

void om__sha1_hex(const char *msg, char out[41]) {
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

/* KEYS leases: {"svc/id", ms left, ...}, on Redis's clock as leases are */
static const char lua_leases[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')\n"
    "local out = {}\n"
    "for i = 1, #all, 2 do\n"
    "  local left = tonumber(all[i + 1]) - now\n"
    "  if left < 0 then left = 0 end\n"
    "  out[#out + 1] = all[i]\n"
    "  out[#out + 1] = left\n"
    "end\n"
    "return out\n";

/*
 * KEYS services watched; ARGV chan prefix hold_ms n_held, n_held names,
 * then (name, revision) pairs. Collects empty services for every control
 * plane at once: a held name (one a plane's watcher still uses) is marked
 * in P watched until now + hold_ms; each pair is removed from P services
 * only if it is still at that revision (nothing changed since the plane
 * saw it empty), has no instance hash and no plane holds it, and "REV REV
 * g NAME" tells every replica. P rev is not touched: a service that comes
 * back gets a revision above every one issued. Returns the names removed.
 */
static const char lua_collect[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)\n"
    "local nh = tonumber(ARGV[4])\n"
    "for i = 5, 4 + nh do\n"
    "  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[i])\n"
    "end\n"
    "local out = {}\n"
    "for i = 5 + nh, #ARGV - 1, 2 do\n"
    "  local svc, rev = ARGV[i], ARGV[i + 1]\n"
    "  if redis.call('HGET', KEYS[1], svc) == rev and\n"
    "     redis.call('EXISTS', ARGV[2] .. 'i:' .. svc) == 0 and\n"
    "     not redis.call('ZSCORE', KEYS[2], svc) then\n"
    "    redis.call('HDEL', KEYS[1], svc)\n"
    "    redis.call('PUBLISH', ARGV[1], rev .. ' ' .. rev .. ' g ' .. svc)\n"
    "    out[#out + 1] = svc\n"
    "  end\n"
    "end\n"
    "return out\n";

const char *const om__redis_scripts[SC__COUNT] = {
    lua_put,  lua_renew,  lua_delete, lua_sweep,  lua_touch,  lua_snap,
    lua_list, lua_cfgput, lua_epoch,  lua_leases, lua_collect};
