/*
 * l_sse.c: the Lua face of core/om_sse (module `openmesh`, table `sse`).
 *
 *   local sp = om.sse.parser([{max_event_bytes = n}])
 *   sp:feed(bytes) -> {{type = "message", data = "...", id = "..."}, ...}
 *                     | nil, "ETOOBIG: ...", "ETOOBIG"
 *   sp:last_event_id() -> string
 *   sp:retry() -> ms | nil
 *   sp:reset()           -- a new stream (reconnect); clears a failure
 *   sp:close()           -- also __gc and __close
 *   om.sse.encode{type = t, data = d, id = i, retry = ms} -> string
 */
#include "om_lua.h"

#include <string.h>

#include "om_errno.h"
#include "om_lua_util.h"
#include "om_sse.h"

#define PARSER_TYPE "openmesh.SseParser"

typedef struct {
  om_sse_parser_t *p; /* NULL once closed */
} l_parser_t;

static l_parser_t *check_parser(lua_State *L, int idx) {
  return luaL_checkudata(L, idx, PARSER_TYPE);
}

static om_sse_parser_t *check_open_parser(lua_State *L, int idx) {
  l_parser_t *u = check_parser(L, idx);
  if (u->p == NULL)
    luaL_error(L, "attempt to use a closed SSE parser");
  return u->p;
}

static int l_parser_new(lua_State *L) {
  static const char *const known[] = {"max_event_bytes", NULL};
  om_sse_parser_opts_t opts = {0};
  l_parser_t *u;
  int rc;
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    om__lua_check_fields(L, 1, known);
    opts.max_event_bytes = (size_t)om__lua_field_int(
        L, 1, "max_event_bytes", (lua_Integer)OM_SSE_DEFAULT_MAX_EVENT_BYTES, 1,
        OM_SSE_MAX_EVENT_BYTES_LIMIT > (size_t)LUA_MAXINTEGER
            ? LUA_MAXINTEGER
            : (lua_Integer)OM_SSE_MAX_EVENT_BYTES_LIMIT);
  }
  /* Closed first, then acquired: a failed allocation leaves nothing. */
  u = lua_newuserdatauv(L, sizeof *u, 0);
  u->p = NULL;
  luaL_setmetatable(L, PARSER_TYPE);
  rc = om_sse_parser_new(&opts, &u->p);
  if (rc != 0)
    return om__lua_fail(L, rc, NULL);
  return 1;
}

static int l_parser_close(lua_State *L) {
  l_parser_t *u = check_parser(L, 1);
  om_sse_parser_free(u->p);
  u->p = NULL;
  return 0;
}

typedef struct {
  lua_State *L;
  int events; /* stack index of the result table */
  lua_Integer n;
  int lua_err; /* the Lua side failed (out of memory); message on top */
} feed_ctx_t;

/* Protected: build one event table and append it. [events, ev*] */
static int push_event(lua_State *L) {
  const om_sse_event_t *ev = lua_touserdata(L, 2);
  lua_Integer n = lua_tointeger(L, 3);
  lua_createtable(L, 0, 3);
  lua_pushlstring(L, ev->type, ev->type_len);
  lua_setfield(L, -2, "type");
  lua_pushlstring(L, ev->data, ev->data_len);
  lua_setfield(L, -2, "data");
  lua_pushlstring(L, ev->id, ev->id_len);
  lua_setfield(L, -2, "id");
  lua_rawseti(L, 1, n);
  return 0;
}

/*
 * Called from core: never raise through it (the parser would be left
 * mid-update). Table building runs in protected mode; a failure stops the
 * parse and is raised after om_sse_parser_feed has returned.
 */
static int on_event(void *ud, const om_sse_event_t *ev) {
  feed_ctx_t *c = ud;
  lua_State *L = c->L;
  lua_pushcfunction(L, push_event);
  lua_pushvalue(L, c->events);
  lua_pushlightuserdata(L, (void *)ev);
  lua_pushinteger(L, c->n + 1);
  if (lua_pcall(L, 3, 0, 0) != LUA_OK) {
    c->lua_err = 1;
    return 1;
  }
  c->n++;
  return 0;
}

/*
 * sp:feed(bytes): the events completed by this chunk, in order.
 * When the parser fails part-way (ETOOBIG, ENOMEM), the events completed
 * before the failure are still returned, and the failure is then reported
 * by the next call (the parser stays failed until reset): dropping them
 * would lose events whose id already moved last_event_id() past them.
 */
static int l_parser_feed(lua_State *L) {
  om_sse_parser_t *p = check_open_parser(L, 1);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  feed_ctx_t c;
  int rc;
  lua_settop(L, 2);
  luaL_checkstack(L, 8, NULL);
  lua_newtable(L); /* [sp, bytes, events] */
  c.L = L;
  c.events = 3;
  c.n = 0;
  c.lua_err = 0;
  rc = om_sse_parser_feed(p, s, len, on_event, &c);
  if (c.lua_err)
    return lua_error(L); /* the pcall's message is on top */
  if (rc != 0 && c.n == 0) {
    if (rc == OM_ETOOBIG) {
      lua_pushfstring(L, "an event needs more than max_event_bytes; the "
                         "parser must be reset (reconnect)");
      return om__lua_fail(L, rc, lua_tostring(L, -1));
    }
    return om__lua_fail(L, rc, NULL);
  }
  lua_settop(L, 3);
  return 1;
}

static int l_parser_reset(lua_State *L) {
  om_sse_parser_reset(check_open_parser(L, 1));
  return 0;
}

static int l_parser_last_event_id(lua_State *L) {
  size_t len;
  const char *id = om_sse_parser_last_event_id(check_open_parser(L, 1), &len);
  lua_pushlstring(L, id, len);
  return 1;
}

static int l_parser_retry(lua_State *L) {
  int64_t ms = om_sse_parser_retry_ms(check_open_parser(L, 1));
  if (ms < 0)
    lua_pushnil(L);
  else
    lua_pushinteger(L, (lua_Integer)ms);
  return 1;
}

static int l_parser_tostring(lua_State *L) {
  l_parser_t *u = check_parser(L, 1);
  lua_pushfstring(L, PARSER_TYPE " (%s)", u->p != NULL ? "open" : "closed");
  return 1;
}

/* An optional string field; raises naming it when of the wrong type. */
static const char *opt_string_field(lua_State *L, int idx, const char *name,
                                    size_t *len) {
  const char *s = NULL;
  *len = 0;
  switch (lua_getfield(L, idx, name)) {
  case LUA_TNIL:
    break;
  case LUA_TSTRING:
    s = lua_tolstring(L, -1, len); /* stays alive: the table holds it */
    break;
  default:
    lua_pushfstring(L, "field '%s': string expected, got %s", name,
                    luaL_typename(L, -1));
    luaL_argerror(L, idx, lua_tostring(L, -1));
  }
  lua_pop(L, 1);
  return s;
}

static int utf8_ok(const char *s, size_t len) {
  om_sse_event_t probe = {NULL, 0, s != NULL ? s : "", len, NULL, 0, -1};
  return om_sse_encode(&probe, NULL, 0, NULL) != OM_EINVAL;
}

/* Whether s[0..len) holds any of the n bytes of set. */
static int has_any(const char *s, size_t len, const char *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (len != 0 && memchr(s, set[i], len) != NULL)
      return 1;
  return 0;
}

/* om.sse.encode{type =, data =, id =, retry =}: one event block. */
static int l_encode(lua_State *L) {
  static const char *const known[] = {"type", "data", "id", "retry", NULL};
  om_sse_event_t ev;
  luaL_Buffer b;
  size_t need = 0;
  char *out;
  int rc;
  luaL_checktype(L, 1, LUA_TTABLE);
  om__lua_check_fields(L, 1, known);
  ev.type = opt_string_field(L, 1, "type", &ev.type_len);
  ev.data = opt_string_field(L, 1, "data", &ev.data_len);
  ev.id = opt_string_field(L, 1, "id", &ev.id_len);
  ev.retry_ms =
      (int64_t)om__lua_field_int(L, 1, "retry", -1, 0, LUA_MAXINTEGER);
  rc = om_sse_encode(&ev, NULL, 0, &need);
  if (rc == OM_EINVAL) {
    /* Say which field would have broken the stream. */
    const char *why = "invalid event";
    if (has_any(ev.type, ev.type_len, "\r\n", 2))
      why = "field 'type': must not contain CR or LF";
    else if (!utf8_ok(ev.type, ev.type_len))
      why = "field 'type': invalid UTF-8";
    else if (ev.type_len != 0 && ev.data == NULL)
      why = "field 'type': an event without data is never dispatched";
    else if (has_any(ev.id, ev.id_len, "\r\n", 3)) /* NUL included */
      why = "field 'id': must not contain CR, LF or NUL";
    else if (!utf8_ok(ev.id, ev.id_len))
      why = "field 'id': invalid UTF-8";
    else if (!utf8_ok(ev.data, ev.data_len))
      why = "field 'data': invalid UTF-8";
    return luaL_argerror(L, 1, why);
  }
  if (rc != OM_ETOOBIG && rc != 0)
    return om__lua_fail(L, rc, NULL);
  out = luaL_buffinitsize(L, &b, need);
  rc = om_sse_encode(&ev, out, need, &need);
  if (rc != 0)
    return om__lua_fail(L, rc, NULL); /* unreachable: sized above */
  luaL_pushresultsize(&b, need);
  return 1;
}

void om__lua_open_sse(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"feed", l_parser_feed},   {"last_event_id", l_parser_last_event_id},
      {"retry", l_parser_retry}, {"reset", l_parser_reset},
      {"close", l_parser_close}, {NULL, NULL}};
  static const luaL_Reg metamethods[] = {{"__gc", l_parser_close},
                                         {"__close", l_parser_close},
                                         {"__tostring", l_parser_tostring},
                                         {NULL, NULL}};
  static const luaL_Reg funcs[] = {
      {"parser", l_parser_new}, {"encode", l_encode}, {NULL, NULL}};
  om__lua_newclass(L, PARSER_TYPE, methods, metamethods);
  /* [om] */
  luaL_newlib(L, funcs);      /* [om, sse] */
  lua_setfield(L, -2, "sse"); /* [om] */
}
