/*
 * om_policy_check.c: the checks on a policy's answers and the vary view of
 * a request (om_policy_check.h). The hot path (a subset answer in the
 * proxy) is a quick pass that never allocates; only a failing answer pays
 * for the explanation, which walks the answer again in the order the
 * rules are stated, so the first broken rule is the one reported.
 */
#include "om_policy_check.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>

#include "om_errno.h"
#include "om_http_chars.h"

/* ------------------------------------------------------------------ */
/* showing values in messages                                         */

/* A string in single quotes, control characters, quote and backslash as
 * \ddd, cut to 57 bytes + "..." past 60. */
static void quote(const char *s, size_t n, char *buf, size_t len) {
  size_t k = 0, take = n > 60 ? 57 : n;
  char tmp[64];
  if (n > 60) {
    memcpy(tmp, s, 57);
    memcpy(tmp + 57, "...", 3);
    s = tmp;
    take = 60;
  }
  if (len < 2) {
    if (len > 0)
      buf[0] = '\0';
    return;
  }
  buf[k++] = '\'';
  for (size_t i = 0; i < take && k + 6 < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\')
      k += (size_t)snprintf(buf + k, len - k, "\\%u", c);
    else
      buf[k++] = (char)c;
  }
  buf[k++] = '\'';
  buf[k] = '\0';
}

const char *om__policy_show(lua_State *L, int idx, char *buf, size_t len) {
  int t = lua_type(L, idx);
  if (len == 0)
    return buf;
  if (t == LUA_TSTRING) {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n); /* a string: no conversion */
    quote(s, n, buf, len);
  } else if (t == LUA_TNUMBER && lua_isinteger(L, idx)) {
    snprintf(buf, len, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, idx));
  } else if (t == LUA_TNUMBER) {
    lua_Number v = lua_tonumber(L, idx);
    if (v != v)
      snprintf(buf, len, "nan");
    else if (isinf(v))
      snprintf(buf, len, v > 0 ? "inf" : "-inf");
    else {
      /* as tostring: a float that looks like an integer gets ".0" */
      int n = snprintf(buf, len, LUA_NUMBER_FMT, (LUAI_UACNUMBER)v);
      if (n > 0 && (size_t)n + 2 < len &&
          buf[strspn(buf, "-0123456789")] == '\0')
        memcpy(buf + n, ".0", 3);
    }
  } else if (t == LUA_TBOOLEAN) {
    snprintf(buf, len, "%s", lua_toboolean(L, idx) ? "true" : "false");
  } else {
    snprintf(buf, len, "%s", lua_typename(L, t));
  }
  return buf;
}

/* show(rawget(t, "id")) for the table at idx, without allocating (the
 * string "id" is not pushed: the table's keys are compared instead). */
static const char *show_id(lua_State *L, int idx, char *buf, size_t len) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) { /* [key, value] */
    size_t n;
    if (lua_type(L, -2) == LUA_TSTRING &&
        strcmp(lua_tolstring(L, -2, &n), "id") == 0 && n == 2) {
      om__policy_show(L, -1, buf, len);
      lua_pop(L, 2);
      return buf;
    }
    lua_pop(L, 1);
  }
  snprintf(buf, len, "nil");
  return buf;
}

/* ------------------------------------------------------------------ */
/* arrays                                                             */

/*
 * Are the keys of the table at t exactly 1..n? 0 with *n, or -1 with the
 * reason in why: "non-array key 'first'" (the smallest non-array key as
 * shown, so the message is stable whatever the traversal order) or "a hole
 * at [2]". Never allocates.
 */
static int sequence_length(lua_State *L, int t, lua_Integer *n, char *why,
                           size_t whylen) {
  lua_Integer count = 0, max = 0;
  char best[256] = "", cur[256];
  int bad = 0;
  t = lua_absindex(L, t);
  lua_pushnil(L);
  while (lua_next(L, t) != 0) { /* [key, value] */
    lua_pop(L, 1);
    if (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 1) {
      lua_Integer k = lua_tointeger(L, -1);
      count++;
      if (k > max)
        max = k;
    } else {
      om__policy_show(L, -1, cur, sizeof cur);
      if (!bad || strcmp(cur, best) < 0)
        memcpy(best, cur, sizeof best);
      bad = 1;
    }
  }
  if (bad) {
    snprintf(why, whylen, "non-array key %s", best);
    return -1;
  }
  if (max != count) {
    for (lua_Integer i = 1; i <= max; i++) {
      int missing = lua_rawgeti(L, t, i) == LUA_TNIL;
      lua_pop(L, 1);
      if (missing) {
        snprintf(why, whylen, "a hole at [" LUA_INTEGER_FMT "]",
                 (LUAI_UACINT)i);
        return -1;
      }
    }
  }
  *n = count;
  return 0;
}

/* ------------------------------------------------------------------ */
/* peer map                                                           */

size_t om__peer_map_slots(size_t n) {
  size_t slots = 16;
  while (slots < 2 * n) /* at most half full */
    slots *= 2;
  return slots;
}

static size_t map_slot(const om__peer_map_t *m, const void *key) {
  uint64_t h = ((uint64_t)(uintptr_t)key >> 4) * 0x9e3779b97f4a7c15u;
  return (size_t)(h >> 32) & m->mask;
}

void om__peer_map_put(om__peer_map_t *m, const void *key, uint32_t i) {
  size_t slot;
  for (slot = map_slot(m, key); m->keys[slot] != NULL;
       slot = (slot + 1) & m->mask)
    ;
  m->keys[slot] = key;
  m->index[slot] = i;
}

int64_t om__peer_map_find(const om__peer_map_t *m, const void *key) {
  for (size_t i = map_slot(m, key);; i = (i + 1) & m->mask) {
    if (m->keys[i] == key)
      return m->index[i];
    if (m->keys[i] == NULL)
      return -1;
  }
}

/* ------------------------------------------------------------------ */
/* subset                                                             */

/* The first broken rule of a subset answer that failed the quick pass. */
static void explain_subset(lua_State *L, int res, const om__peer_map_t *map,
                           uint32_t *seen, uint32_t stamp, char *err,
                           size_t errlen) {
  char why[300], shown[256];
  lua_Integer n;
  if (lua_type(L, res) != LUA_TTABLE) {
    om_errbuf(err, errlen,
              "subset returned a non-table (%s), expected an array of the "
              "peers it was given",
              om__policy_show(L, res, shown, sizeof shown));
    return;
  }
  if (sequence_length(L, res, &n, why, sizeof why) != 0) {
    om_errbuf(err, errlen, "subset returned a table that is not an array (%s)",
              why);
    return;
  }
  for (lua_Integer i = 1; i <= n; i++) {
    int t = lua_rawgeti(L, res, i);
    int64_t idx =
        t == LUA_TTABLE ? om__peer_map_find(map, lua_topointer(L, -1)) : -1;
    if (idx < 0 && t == LUA_TTABLE) {
      om_errbuf(err, errlen,
                "subset returned a peer that was not offered (id %s)",
                show_id(L, -1, shown, sizeof shown));
    } else if (idx < 0) {
      om_errbuf(err, errlen,
                "subset returned a %s (%s) at [" LUA_INTEGER_FMT
                "], expected one of the peer tables it was given%s",
                lua_typename(L, t), om__policy_show(L, -1, shown, sizeof shown),
                (LUAI_UACINT)i,
                t == LUA_TSTRING
                    ? " (return the peers themselves, not their ids)"
                    : "");
    } else if (seen[idx] == stamp) {
      om_errbuf(err, errlen, "subset returned the peer %s twice",
                show_id(L, -1, shown, sizeof shown));
    } else {
      seen[idx] = stamp;
      lua_pop(L, 1);
      continue;
    }
    lua_pop(L, 1);
    return;
  }
  om_errbuf(err, errlen, "subset returned an invalid answer"); /* unreached */
}

int om__policy_check_subset(lua_State *L, int res, const om__peer_map_t *map,
                            size_t n, uint32_t *seen, uint32_t stamp,
                            uint32_t *out, size_t *n_out, char *err,
                            size_t errlen) {
  lua_Unsigned len, count = 0;
  res = lua_absindex(L, res);
  if (lua_type(L, res) != LUA_TTABLE)
    goto explain;
  len = lua_rawlen(L, res);
  if (len > n) /* a repeat or a stranger: explain which */
    goto explain;
  /*
   * One pass in traversal order: every key an integer in 1..len, every
   * value an offered peer not seen yet. Keys are distinct, so len of them
   * are exactly 1..len: no hole, no other key. A walk with lua_next costs
   * about what rawget per index does, so checking the keys is nearly free.
   */
  lua_pushnil(L);
  while (lua_next(L, res) != 0) { /* [key, value] */
    lua_Integer k;
    int64_t idx;
    if (!lua_isinteger(L, -2) || (k = lua_tointeger(L, -2)) < 1 ||
        (lua_Unsigned)k > len || lua_type(L, -1) != LUA_TTABLE ||
        (idx = om__peer_map_find(map, lua_topointer(L, -1))) < 0 ||
        seen[idx] == stamp) {
      lua_pop(L, 2);
      goto explain;
    }
    lua_pop(L, 1);
    seen[idx] = stamp;
    out[k - 1] = (uint32_t)idx;
    count++;
  }
  if (count != len)
    goto explain;
  *n_out = (size_t)len;
  return 0;
explain:
  /* The quick pass left marks at stamp; the explanation uses stamp + 1. */
  explain_subset(L, res, map, seen, stamp + 1, err, errlen);
  return -1;
}

/* ------------------------------------------------------------------ */
/* key                                                                */

int om__policy_check_key(lua_State *L, int idx, char *err, size_t errlen) {
  char shown[256];
  int t = lua_type(L, idx);
  if (t == LUA_TNIL || t == LUA_TSTRING)
    return 0;
  om_errbuf(err, errlen, "key returned a %s (%s), expected a string or nil",
            lua_typename(L, t), om__policy_show(L, idx, shown, sizeof shown));
  return -1;
}

/* ------------------------------------------------------------------ */
/* authorize                                                          */

int om__policy_check_authorize(lua_State *L, int idx, char *reason, char *err,
                               size_t errlen) {
  char shown[256];
  int t = lua_type(L, idx), rt = lua_type(L, idx + 1);
  reason[0] = '\0';
  if (t != LUA_TBOOLEAN) {
    om_errbuf(err, errlen,
              "authorize returned a %s (%s), expected true, or false and a "
              "reason",
              t == LUA_TNONE ? "nil" : lua_typename(L, t),
              om__policy_show(L, idx, shown, sizeof shown));
    return -1;
  }
  if (lua_toboolean(L, idx)) {
    if (rt == LUA_TNIL || rt == LUA_TNONE)
      return 0;
    om_errbuf(err, errlen,
              "authorize returned true and a %s (%s): a reason goes with "
              "false only",
              lua_typename(L, rt),
              om__policy_show(L, idx + 1, shown, sizeof shown));
    return -1;
  }
  if (rt == LUA_TNIL || rt == LUA_TNONE)
    return 1;
  if (rt == LUA_TSTRING) {
    size_t len;
    const char *s = lua_tolstring(L, idx + 1, &len); /* a string: no alloc */
    int printable = len <= OM_POLICY_REASON_MAX;
    for (size_t i = 0; printable && i < len; i++)
      printable = s[i] >= 0x20 && s[i] <= 0x7e;
    if (printable) {
      memcpy(reason, s, len);
      reason[len] = '\0';
      return 1;
    }
    om_errbuf(err, errlen,
              "authorize returned false and the reason %s, expected at most "
              "%d bytes of printable ASCII",
              om__policy_show(L, idx + 1, shown, sizeof shown),
              OM_POLICY_REASON_MAX);
    return -1;
  }
  om_errbuf(err, errlen,
            "authorize returned false and a %s (%s), expected a string "
            "reason or nothing",
            lua_typename(L, rt),
            om__policy_show(L, idx + 1, shown, sizeof shown));
  return -1;
}

/* ------------------------------------------------------------------ */
/* order                                                              */

/* "{a, b}": the route names as the message lists them; pushes it. */
static void push_list(lua_State *L, int routes) {
  luaL_Buffer b;
  lua_Unsigned n = lua_rawlen(L, routes);
  luaL_buffinit(L, &b);
  luaL_addchar(&b, '{');
  for (lua_Unsigned i = 1; i <= n; i++) {
    if (i > 1)
      luaL_addstring(&b, ", ");
    lua_rawgeti(L, routes, (lua_Integer)i);
    luaL_tolstring(L, -1, NULL);
    lua_remove(L, -2);
    luaL_addvalue(&b);
  }
  luaL_addchar(&b, '}');
  luaL_pushresult(&b);
}

int om__policy_check_order(lua_State *L, int names, int routes) {
  char why[300], shown[256];
  lua_Integer n;
  int top = lua_gettop(L), known, seen;
  names = lua_absindex(L, names);
  routes = lua_absindex(L, routes);
  if (lua_type(L, names) != LUA_TTABLE) {
    lua_pushfstring(L,
                    "order returned a non-table (%s), expected an array of "
                    "route names",
                    om__policy_show(L, names, shown, sizeof shown));
    return -1;
  }
  if (sequence_length(L, names, &n, why, sizeof why) != 0) {
    lua_pushfstring(L, "order returned a table that is not an array (%s)", why);
    return -1;
  }
  if (n == 0) {
    lua_pushliteral(L, "order returned no routes");
    return -1;
  }
  lua_newtable(L); /* [known] */
  known = lua_gettop(L);
  for (lua_Unsigned i = 1, m = lua_rawlen(L, routes); i <= m; i++) {
    if (lua_rawgeti(L, routes, (lua_Integer)i) == LUA_TNIL) {
      lua_pop(L, 1);
      continue;
    }
    lua_pushboolean(L, 1);
    lua_rawset(L, known);
  }
  lua_newtable(L); /* [known, seen] */
  seen = lua_gettop(L);
  for (lua_Integer i = 1; i <= n; i++) {
    int t = lua_rawgeti(L, names, i); /* [known, seen, name] */
    int is_known = 0, is_seen = 0;
    if (t == LUA_TSTRING) {
      lua_pushvalue(L, -1);
      is_known = lua_rawget(L, known) != LUA_TNIL;
      lua_pushvalue(L, -2);
      is_seen = lua_rawget(L, seen) != LUA_TNIL;
      lua_pop(L, 2); /* [known, seen, name] */
    }
    om__policy_show(L, -1, shown, sizeof shown);
    if (t != LUA_TSTRING) {
      lua_pushfstring(L,
                      "order returned a %s (%s) at [%I], expected a route "
                      "name",
                      lua_typename(L, t), shown, i);
    } else if (!is_known) {
      push_list(L, routes);
      lua_pushfstring(L, "order returned an unknown route %s (routes: %s)",
                      shown, lua_tostring(L, -1));
    } else if (is_seen) {
      lua_pushfstring(L, "order returned the route %s twice", shown);
    } else {
      lua_pushboolean(L, 1);
      lua_rawset(L, seen); /* [known, seen] */
      continue;
    }
    lua_replace(L, top + 1); /* the message, below the scratch */
    lua_settop(L, top + 1);
    return -1;
  }
  lua_settop(L, top);
  return 0;
}

/* ------------------------------------------------------------------ */
/* the vary view                                                      */

/*
 * Reading a field a vary policy did not declare raises, since a decision
 * that depended on it would be reused for requests that differ in it. A
 * declared header the request lacks reads as nil. The message comes alone
 * (no position): it names the field, where a position would point into
 * openmesh.policy's helpers.
 */
static int vary_error(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  return lua_error(L);
}

static int vary_header_index(lua_State *L) { /* (headers, k); up: declared */
  char lower[256];
  size_t n = 0;
  const char *k =
      lua_type(L, 2) == LUA_TSTRING ? lua_tolstring(L, 2, &n) : NULL;
  if (k != NULL && n < sizeof lower) {
    for (size_t i = 0; i < n; i++)
      lower[i] = (char)((unsigned)(k[i] - 'A') < 26u ? k[i] | 0x20 : k[i]);
    if (lua_getfield(L, lua_upvalueindex(1), (lower[n] = 0, lower)) != LUA_TNIL)
      return 0; /* declared, not in the request: nil */
    return vary_error(L,
                      "reads header '%s', which its vary does not name "
                      "(add \"%s\" to vary)",
                      k, lower);
  }
  return vary_error(L, "reads header '%s', which its vary does not name",
                    luaL_tolstring(L, 2, NULL));
}

static int vary_req_index(lua_State *L) { /* (req, k); up: method, path */
  const char *k = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "";
  if (strcmp(k, "method") == 0 && !lua_toboolean(L, lua_upvalueindex(1)))
    return vary_error(L, "reads req.method, which its vary does not name "
                         "(add \":method\" to vary)");
  if (strcmp(k, "path") == 0 && !lua_toboolean(L, lua_upvalueindex(2)))
    return vary_error(L, "reads req.path, which its vary does not name "
                         "(add \":path\" to vary)");
  if (strcmp(k, "grpc") == 0 && !lua_toboolean(L, lua_upvalueindex(2)))
    return vary_error(L, "reads req.grpc, which comes from the path its "
                         "vary does not name (add \":path\" to vary)");
  return 0;
}

static int vary_metadata_index(lua_State *L) {
  return vary_error(L,
                    "reads req.metadata.%s, which its vary does not name (a "
                    "policy that declares vary sees no metadata)",
                    luaL_tolstring(L, 2, NULL));
}

/* __newindex of req.metadata: requests are read-only. */
static int readonly_metadata(lua_State *L) {
  return luaL_error(L, "req.metadata is read-only");
}

void om__policy_push_metadata(lua_State *L, lua_CFunction index) {
  lua_newtable(L);
  lua_createtable(L, 0, 3);
  if (index != NULL) {
    lua_pushcfunction(L, index);
    lua_setfield(L, -2, "__index");
  }
  lua_pushcfunction(L, readonly_metadata);
  lua_setfield(L, -2, "__newindex");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
}

void om__policy_push_vary_meta(lua_State *L, int method, int path) {
  /* [declared] */
  lua_createtable(L, 0, 2); /* [declared, headers_mt] */
  lua_insert(L, -2);        /* [headers_mt, declared] */
  lua_pushcclosure(L, vary_header_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_createtable(L, 0, 2); /* [headers_mt, req_mt] */
  lua_pushboolean(L, method);
  lua_pushboolean(L, path);
  lua_pushcclosure(L, vary_req_index, 2);
  lua_setfield(L, -2, "__index");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  om__policy_push_metadata(L, vary_metadata_index); /* nothing to read */
}

/* ------------------------------------------------------------------ */
/* decide                                                             */

/*
 * The fields a caller cannot set or remove through a decision: framing
 * and hop-by-hop fields (RFC 9110 7.6.1, RFC 9112 6), Host (the peer's
 * own), and what the proxy owns (docs/PROXY.md "Forwarded headers"):
 * the retry rules read Idempotency-Key, so a decision cannot make a
 * request look safe to retry.
 */
static const char *const decide_refused[] = {"connection",
                                             "keep-alive",
                                             "proxy-connection",
                                             "te",
                                             "trailer",
                                             "transfer-encoding",
                                             "upgrade",
                                             "content-length",
                                             "host",
                                             "expect",
                                             "proxy-authorization",
                                             "via",
                                             "x-forwarded-for",
                                             "x-request-id",
                                             "traceparent",
                                             "tracestate",
                                             "idempotency-key",
                                             "x-openmesh-deadline-ms",
                                             "x-openmesh-attempt",
                                             "x-openmesh-key"};

static int decide_fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  if (errlen > 0) {
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* A time field: a number in (0, OM_DECIDE_MS_MAX] ms, rounded up. */
static int decide_ms(lua_State *L, int idx, const char *name, uint64_t *out,
                     char *err, size_t errlen) {
  char shown[64];
  lua_Number v;
  if (lua_type(L, idx) != LUA_TNUMBER || !((v = lua_tonumber(L, idx)) > 0) ||
      v > (lua_Number)OM_DECIDE_MS_MAX)
    return decide_fail(err, errlen,
                       "decide returned %s = %s, expected a number of ms in "
                       "(0, %u]",
                       name, om__policy_show(L, idx, shown, sizeof shown),
                       OM_DECIDE_MS_MAX);
  *out = (uint64_t)ceil(v);
  return 0;
}

/* One header edit: the name at -2, the value (a string, or false) at -1. */
static int decide_header(lua_State *L, om_policy_decision_t *d, char *err,
                         size_t errlen) {
  char shown[128];
  size_t nl, vl = 0;
  const char *name, *value = NULL;
  om_policy_header_edit_t *e;
  int vt = lua_type(L, -1);
  if (lua_type(L, -2) != LUA_TSTRING)
    return decide_fail(err, errlen,
                       "decide returned headers[%s]: a header name is a "
                       "string",
                       om__policy_show(L, -2, shown, sizeof shown));
  name = lua_tolstring(L, -2, &nl);
  if (nl == 0 || nl > 64)
    return decide_fail(err, errlen,
                       "decide returned headers[%s]: a header name is 1..64 "
                       "bytes",
                       om__policy_show(L, -2, shown, sizeof shown));
  for (size_t i = 0; i < nl; i++)
    if (!om__http_is_tchar((unsigned char)name[i]))
      return decide_fail(err, errlen,
                         "decide returned headers[%s]: not a field name "
                         "(RFC 9110 5.1)",
                         om__policy_show(L, -2, shown, sizeof shown));
  for (size_t i = 0; i < sizeof decide_refused / sizeof decide_refused[0]; i++)
    if (om__http_ci_eq(name, nl, decide_refused[i]))
      return decide_fail(err, errlen,
                         "decide returned headers[%s]: the proxy owns this "
                         "field, a decision cannot set or remove it",
                         om__policy_show(L, -2, shown, sizeof shown));
  if (vt == LUA_TSTRING) {
    value = lua_tolstring(L, -1, &vl);
    if (vl > OM_DECIDE_VALUE_MAX)
      return decide_fail(err, errlen,
                         "decide returned headers[%s]: a value of %zu bytes, "
                         "at most %d",
                         om__policy_show(L, -2, shown, sizeof shown), vl,
                         OM_DECIDE_VALUE_MAX);
    for (size_t i = 0; i < vl; i++) {
      unsigned char c = (unsigned char)value[i];
      /* field-value (RFC 9110 5.5): no CR, LF or NUL, no edge space */
      if (!om__http_is_fvchar(c) && c != ' ' && c != '\t')
        return decide_fail(err, errlen,
                           "decide returned headers[%s] = %s: a field value "
                           "holds no control characters (RFC 9110 5.5)",
                           om__policy_show(L, -2, shown, sizeof shown),
                           om__policy_show(L, -1, shown + 64, 64));
    }
    if (vl > 0 && (om__http_is_ows((unsigned char)value[0]) ||
                   om__http_is_ows((unsigned char)value[vl - 1])))
      return decide_fail(err, errlen,
                         "decide returned headers[%s]: a field value has no "
                         "leading or trailing space (RFC 9110 5.5)",
                         om__policy_show(L, -2, shown, sizeof shown));
  } else if (!(vt == LUA_TBOOLEAN && !lua_toboolean(L, -1))) {
    return decide_fail(err, errlen,
                       "decide returned headers[%s] = %s, expected a string "
                       "(set it) or false (remove it)",
                       om__policy_show(L, -2, shown, sizeof shown),
                       om__policy_show(L, -1, shown + 64, 64));
  }
  if (d->n_headers >= OM_DECIDE_HEADERS_MAX ||
      d->n_bytes + nl + vl > OM_DECIDE_BYTES)
    return decide_fail(err, errlen,
                       "decide returned more headers than a decision holds "
                       "(%d fields, %d bytes)",
                       OM_DECIDE_HEADERS_MAX, OM_DECIDE_BYTES);
  e = &d->headers[d->n_headers++];
  e->name = (uint16_t)d->n_bytes;
  e->name_len = (uint16_t)nl;
  for (size_t i = 0; i < nl; i++) {
    unsigned char c = (unsigned char)name[i];
    d->bytes[d->n_bytes++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
  }
  e->value = (uint16_t)d->n_bytes;
  e->value_len = value != NULL ? (uint16_t)vl : OM_DECIDE_REMOVE;
  if (value != NULL) {
    memcpy(d->bytes + d->n_bytes, value, vl);
    d->n_bytes += (uint32_t)vl;
  }
  return 0;
}

/* A header name edited twice reads as two answers for one field. */
static int decide_header_twice(const om_policy_decision_t *d, char *err,
                               size_t errlen) {
  for (uint32_t i = 0; i < d->n_headers; i++)
    for (uint32_t j = i + 1; j < d->n_headers; j++)
      if (d->headers[i].name_len == d->headers[j].name_len &&
          memcmp(d->bytes + d->headers[i].name, d->bytes + d->headers[j].name,
                 d->headers[i].name_len) == 0)
        return decide_fail(err, errlen,
                           "decide returned the header '%.*s' twice (names "
                           "are case-insensitive)",
                           (int)d->headers[i].name_len,
                           d->bytes + d->headers[i].name);
  return 0;
}

static int decide_headers(lua_State *L, int idx, om_policy_decision_t *d,
                          char *err, size_t errlen) {
  char shown[64];
  if (lua_type(L, idx) != LUA_TTABLE)
    return decide_fail(err, errlen,
                       "decide returned headers = %s, expected a table of "
                       "name = value (or false to remove)",
                       om__policy_show(L, idx, shown, sizeof shown));
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    if (decide_header(L, d, err, errlen) != 0) {
      lua_pop(L, 2);
      return -1;
    }
    lua_pop(L, 1);
  }
  return decide_header_twice(d, err, errlen);
}

/* One field of the answer: its name at -2, its value at -1. */
static int decide_field(lua_State *L, om_policy_decision_t *d, char *err,
                        size_t errlen) {
  char shown[64];
  const char *name =
      lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
  int v = lua_absindex(L, -1);
  if (name == NULL)
    return decide_fail(err, errlen,
                       "decide returned a table with the key %s: its fields "
                       "are named",
                       om__policy_show(L, -2, shown, sizeof shown));
  if (strcmp(name, "deadline_ms") == 0) {
    d->fields |= OM_DECIDE_DEADLINE;
    return decide_ms(L, v, name, &d->deadline_ms, err, errlen);
  }
  if (strcmp(name, "per_try_timeout_ms") == 0) {
    d->fields |= OM_DECIDE_PER_TRY;
    return decide_ms(L, v, name, &d->per_try_ms, err, errlen);
  }
  if (strcmp(name, "stream_idle_timeout_ms") == 0) {
    d->fields |= OM_DECIDE_STREAM_IDLE;
    return decide_ms(L, v, name, &d->stream_idle_ms, err, errlen);
  }
  if (strcmp(name, "max_stream_ms") == 0) {
    d->fields |= OM_DECIDE_MAX_STREAM;
    return decide_ms(L, v, name, &d->max_stream_ms, err, errlen);
  }
  if (strcmp(name, "retries") == 0) {
    lua_Integer n;
    if (!lua_isinteger(L, v) || (n = lua_tointeger(L, v)) < 0 ||
        n > OM_DECIDE_RETRIES_MAX)
      return decide_fail(err, errlen,
                         "decide returned retries = %s, expected an integer "
                         "in 0..%d",
                         om__policy_show(L, v, shown, sizeof shown),
                         OM_DECIDE_RETRIES_MAX);
    d->fields |= OM_DECIDE_RETRIES;
    d->retries = (uint32_t)n;
    return 0;
  }
  if (strcmp(name, "retry_non_idempotent") == 0) {
    if (lua_type(L, v) != LUA_TBOOLEAN)
      return decide_fail(err, errlen,
                         "decide returned retry_non_idempotent = %s, expected "
                         "a boolean",
                         om__policy_show(L, v, shown, sizeof shown));
    d->fields |= OM_DECIDE_RETRY_UNSAFE;
    d->retry_non_idempotent = lua_toboolean(L, v);
    return 0;
  }
  if (strcmp(name, "max_body_bytes") == 0) {
    lua_Integer n;
    if (!lua_isinteger(L, v) || (n = lua_tointeger(L, v)) < 0)
      return decide_fail(err, errlen,
                         "decide returned max_body_bytes = %s, expected an "
                         "integer >= 0",
                         om__policy_show(L, v, shown, sizeof shown));
    d->fields |= OM_DECIDE_MAX_BODY;
    d->max_body_bytes = (uint64_t)n;
    return 0;
  }
  if (strcmp(name, "headers") == 0)
    return decide_headers(L, v, d, err, errlen);
  return decide_fail(err, errlen,
                     "decide returned an unknown field %s (known: "
                     "deadline_ms, per_try_timeout_ms, retries, "
                     "retry_non_idempotent, stream_idle_timeout_ms, "
                     "max_stream_ms, max_body_bytes, headers)",
                     om__policy_show(L, -2, shown, sizeof shown));
}

int om__policy_check_decision(lua_State *L, int idx, om_policy_decision_t *d,
                              char *err, size_t errlen) {
  char shown[64];
  int t = lua_type(L, idx);
  idx = lua_absindex(L, idx);
  d->fields = 0;
  d->n_headers = 0;
  d->n_bytes = 0;
  if (t == LUA_TNIL || t == LUA_TNONE)
    return 0;
  if (t != LUA_TTABLE)
    return decide_fail(
        err, errlen, "decide returned a %s (%s), expected a table or nil",
        lua_typename(L, t), om__policy_show(L, idx, shown, sizeof shown));
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    if (decide_field(L, d, err, errlen) != 0) {
      lua_pop(L, 2);
      return -1;
    }
    lua_pop(L, 1);
  }
  return 1;
}

size_t om_policy_decision_size(const om_policy_decision_t *d) {
  return offsetof(om_policy_decision_t, bytes) + d->n_bytes;
}
