/*
 * om_proxy_tunnel.c: upgrades through the proxy (docs/PROXY.md "Upgrades
 * and WebSocket").
 *
 * A request that asks to switch protocols (RFC 9110 7.8) is classified on
 * its head: tokens the service's policy allows (`upgrades`, default
 * {"websocket"}) are forwarded with `Connection: upgrade`; h2c is dropped
 * and the request served over HTTP/1.1 (RFC 9113 3.1 deprecates the h2c
 * upgrade); any other token is refused with 403 upgrade_not_allowed. A
 * 101 from the peer is relayed, and then both connections are tunnels:
 * bytes are copied both ways until either side closes, a half-close is
 * carried to the other side, a side that does not read stops reads on the
 * other (backpressure at the proxy's high-water mark), and no byte either
 * way for stream_idle_timeout_ms, or max_stream_ms in all, cuts both (the
 * stream timeouts of responses, om_proxy_stream.c). The call keeps its
 * admission slot while the tunnel is open: it is a committed stream, never
 * replayed and never bounded by the call deadline.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <lauxlib.h>
#include <lua.h>

#include "om_errno.h"
#include "om_http_chars.h"
#include "om_log.h"
#include "om_proxy_internal.h"

static const char *const UPG_NAMES[OM__PROXY_UPG_COUNT] = {
    "switched", "declined", "not_allowed", "failed"};

enum { DIR_UP, DIR_DOWN }; /* client -> peer, peer -> client */

typedef struct om__proxy_tunnel_s {
  om__proxy_call_t *c;
  om_tunnel_t *down; /* the client's connection */
  om_tunnel_t *up;   /* the peer's connection */
  uv_timer_t idle;
  uint64_t t0_ms;   /* loop time of the switch */
  uint64_t last_ms; /* loop time of the latest byte either way */
  uint64_t bytes[2];
  int err; /* the first side's error; 0 while both are clean */
} om__proxy_tunnel_t;

/* ------------------------------------------------------------------ */
/* classifying the request */

/* Whether tok[0, n) is among the allowed tokens (case-insensitive, as
 * RFC 9110 7.8 protocol names compare in practice: clients send
 * "websocket", "WebSocket" and "Websocket"). */
static int allowed(const om__proxy_upgrades_t *u, const char *tok, size_t n) {
  for (size_t i = 0; i < u->n; i++)
    if (strlen(u->tok[i]) == n && om__http_ci_eq(tok, n, u->tok[i]))
      return 1;
  return 0;
}

int om__proxy_upgrade_classify(const om__proxy_service_t *s,
                               const om_http_request_t *req, char *out,
                               size_t cap, char *why, size_t why_cap) {
  size_t k = 0;
  out[0] = '\0';
  if (!om_http_request_is_upgrade(req))
    return 0; /* no Connection: upgrade: the field is hop-by-hop, dropped */
  for (size_t h = 0; h < req->n_headers; h++) {
    const char *v = req->headers[h].value;
    size_t n = req->headers[h].value_len, i = 0;
    if (req->headers[h].name_len != 7 ||
        memcmp(req->headers[h].name, "upgrade", 7) != 0)
      continue;
    while (i < n) { /* #protocol (RFC 9110 7.8), OWS and empty elements */
      size_t b, e;
      while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
        i++;
      b = i;
      while (i < n && v[i] != ',')
        i++;
      e = i;
      while (e > b && (v[e - 1] == ' ' || v[e - 1] == '\t'))
        e--;
      if (e == b)
        continue;
      if (e - b == 3 && om__http_ci_eq(v + b, 3, "h2c"))
        continue; /* never forwarded: HTTP/1.1 it is */
      if (s->set.http2) {
        /* HTTP/2 has no Upgrade (RFC 9113 8.6) and the proxy does not
         * speak extended CONNECT (RFC 8441) to peers */
        snprintf(why, why_cap,
                 "upgrade to '%.*s' cannot reach this service: its peers "
                 "are spoken to over HTTP/2 (protocol)",
                 (int)(e - b > 64 ? 64 : e - b), v + b);
        return -1;
      }
      if (!allowed(&s->set.upgrades, v + b, e - b)) {
        snprintf(why, why_cap,
                 "upgrade to '%.*s' is not allowed by the service's traffic "
                 "policy (upgrades)",
                 (int)(e - b > 64 ? 64 : e - b), v + b);
        return -1;
      }
      if (k + (k > 0 ? 2 : 0) + (e - b) + 1 > cap) {
        snprintf(why, why_cap, "the Upgrade list is too long");
        return -1;
      }
      if (k > 0) {
        memcpy(out + k, ", ", 2);
        k += 2;
      }
      memcpy(out + k, v + b, e - b);
      k += e - b;
      out[k] = '\0';
    }
  }
  return k > 0 ? 1 : 0;
}

void om__proxy_upgrade_count(om__proxy_service_t *s, int outcome) {
  if (outcome < 0 || outcome >= OM__PROXY_UPG_COUNT)
    return;
  s->upgrades[outcome]++;
  om_metric_inc(s->m_upgrades[outcome]);
}

/* ------------------------------------------------------------------ */
/* the relay */

static void on_idle_closed(uv_handle_t *h) {
  om__proxy_tunnel_t *t = h->data;
  om__proxy_call_t *c = t->c;
  om__proxy_service_t *s = c->s;
  s->tunnels_open--;
  om_metric_set(s->m_tunnels, (double)s->tunnels_open);
  c->tun = NULL;
  om__proxy_call_end(c, t->err == 0 ? OM__PROXY_OK : OM__PROXY_ABORTED);
  free(t);
}

/* Both sides are gone: the call ends. */
static void maybe_end(om__proxy_tunnel_t *t) {
  if (t->down != NULL || t->up != NULL)
    return;
  uv_timer_stop(&t->idle);
  uv_close((uv_handle_t *)&t->idle, on_idle_closed);
}

/* Cut both sides now (an error on one, or the idle timeout). */
static void cut(om__proxy_tunnel_t *t, int err) {
  if (t->err == 0)
    t->err = err;
  if (t->down != NULL) {
    om_tunnel_close(t->down, 1);
    t->down = NULL;
  }
  if (t->up != NULL) {
    om_tunnel_close(t->up, 1);
    t->up = NULL;
  }
  maybe_end(t);
}

/* A tunnel is a committed stream: the stream timeouts of its service
 * apply (om_proxy_stream.c has them for responses), idle and max_stream. */
static uint64_t idle_limit_ms(const om__proxy_call_t *c) {
  return c->set.stream_idle_ns / NS_PER_MS;
}

static uint64_t max_limit_ms(const om__proxy_call_t *c) {
  return c->set.max_stream_ns == OM_DEADLINE_NEVER
             ? 0
             : c->set.max_stream_ns / NS_PER_MS;
}

/* The loop ms when the tunnel is due to be cut as things stand; 0: never. */
static uint64_t tunnel_due(const om__proxy_tunnel_t *t) {
  uint64_t idle = idle_limit_ms(t->c), max = max_limit_ms(t->c), d = 0;
  if (idle != 0)
    d = t->last_ms + idle;
  if (max != 0 && (d == 0 || t->t0_ms + max < d))
    d = t->t0_ms + max;
  return d;
}

static void on_idle(uv_timer_t *h) {
  om__proxy_tunnel_t *t = h->data;
  om__proxy_call_t *c = t->c;
  uint64_t now = uv_now(h->loop), d = tunnel_due(t);
  int max_stream;
  if (d == 0)
    return;
  if (now < d) { /* bytes moved since it was armed: the due is later */
    uv_timer_start(&t->idle, on_idle, d - now, 0);
    return;
  }
  max_stream = max_limit_ms(c) != 0 && now >= t->t0_ms + max_limit_ms(c);
  om_metric_inc(max_stream ? c->s->m_cut_max : c->s->m_cut_idle);
  om_log(OM_LOG_INFO, "proxy_tunnel_cut", "service", c->s->name, "peer",
         c->last_peer, "reason", max_stream ? "max_stream" : "idle", NULL);
  cut(t, OM_EDEADLINE);
}

/* Bytes from one side to the other; a full other side pauses this one. */
static void relay(om__proxy_tunnel_t *t, int dir, const char *d, size_t n) {
  om_tunnel_t *from = dir == DIR_UP ? t->down : t->up;
  om_tunnel_t *to = dir == DIR_UP ? t->up : t->down;
  size_t hw = t->c->p->opts.high_water;
  t->last_ms = uv_now(t->c->p->loop);
  t->bytes[dir] += n;
  om_metric_add(t->c->s->m_tunnel_bytes[dir], (double)n);
  if (to == NULL || om_tunnel_write(to, d, n) != 0)
    return; /* that side is ending: its on_close follows */
  if (om_tunnel_pending(to) > hw && om_tunnel_on_drain(to, hw / 4) == 0)
    om_tunnel_pause(from);
}

static void down_data(void *ud, const char *d, size_t n) {
  relay(ud, DIR_UP, d, n);
}

static void up_data(void *ud, const char *d, size_t n) {
  relay(ud, DIR_DOWN, d, n);
}

/* The peer's side drained: read the client again, and the reverse. */
static void up_drain(void *ud) {
  om__proxy_tunnel_t *t = ud;
  om_tunnel_resume(t->down);
}

static void down_drain(void *ud) {
  om__proxy_tunnel_t *t = ud;
  om_tunnel_resume(t->up);
}

/* A half-close is carried: the other side gets our FIN after its bytes. */
static void down_eof(void *ud) {
  om__proxy_tunnel_t *t = ud;
  if (t->up != NULL)
    om_tunnel_shutdown(t->up);
}

static void up_eof(void *ud) {
  om__proxy_tunnel_t *t = ud;
  if (t->down != NULL)
    om_tunnel_shutdown(t->down);
}

/* One side ended: cleanly (both directions closed: the other side is
 * closing the same way and reports itself), or with an error (cut the
 * other). */
static void side_closed(om__proxy_tunnel_t *t, om_tunnel_t **side, int err) {
  *side = NULL;
  if (err != 0) {
    cut(t, err);
    return;
  }
  maybe_end(t);
}

static void down_close(void *ud, int err) {
  om__proxy_tunnel_t *t = ud;
  side_closed(t, &t->down, err);
}

static void up_close(void *ud, int err) {
  om__proxy_tunnel_t *t = ud;
  side_closed(t, &t->up, err);
}

static const om_tunnel_callbacks_t DOWN_CB = {down_data, down_eof, down_drain,
                                              down_close};
static const om_tunnel_callbacks_t UP_CB = {up_data, up_eof, up_drain,
                                            up_close};

/* The hand-over failed: the attempt ends aborted and the caller gets 502. */
static int handover_failed(om__proxy_call_t *c, om__proxy_tunnel_t *t,
                           om_http_header_t *h, om_http_header_t *stack) {
  free(t);
  if (h != stack)
    free(h);
  c->last_status = 0;
  c->last_fail = OM_UPSTREAM_FAIL_ABORTED;
  om__proxy_upgrade_count(c->s, OM__PROXY_UPG_FAILED);
  return 1;
}

int om__proxy_tunnel_start(om__proxy_call_t *c,
                           const om_upstream_response_t *r) {
  om__proxy_service_t *s = c->s;
  om_http_header_t stack[64], *h = stack;
  om__proxy_tunnel_t *t;
  size_t n = 0;
  int rc;
  t = calloc(1, sizeof *t);
  if (r->n_headers + 2 > sizeof stack / sizeof stack[0])
    h = malloc((r->n_headers + 2) * sizeof *h);
  if (t == NULL || h == NULL)
    return handover_failed(c, t, h, stack);
  t->c = c;
  if (om_upstream_take_tunnel(c->up, &UP_CB, t, &t->up) != 0)
    return handover_failed(c, t, h, stack);
  /* the peer's protocol, its end-to-end fields (Sec-WebSocket-Accept,
   * ...), never a body's framing */
  h[n++] = (om_http_header_t){"Upgrade", r->upgrade, 7, r->upgrade_len};
  for (size_t i = 0; i < r->n_headers; i++) {
    const om_http_header_t *f = &r->headers[i];
    if ((f->name_len == 14 && om__http_ci_eq(f->name, 14, "content-length")) ||
        (f->name_len == 15 && om__http_ci_eq(f->name, 15, "x-openmesh-peer")))
      continue;
    h[n++] = *f;
  }
  h[n++] = (om_http_header_t){"x-openmesh-peer", c->peer->id, 15, 0};
  rc = om_http_response_upgrade(c->req, h, n, &DOWN_CB, t, &t->down);
  if (rc != 0) {
    om_tunnel_close(t->up, 1);
    return handover_failed(c, t, h, stack);
  }
  if (h != stack)
    free(h);
  /* the request is released: the call is the tunnel's now */
  c->req = NULL;
  c->committed = 1;
  c->tun = t;
  uv_timer_init(c->p->loop, &t->idle);
  t->idle.data = t;
  t->t0_ms = t->last_ms = uv_now(c->p->loop);
  if (tunnel_due(t) != 0)
    uv_timer_start(&t->idle, on_idle, tunnel_due(t) - t->t0_ms, 0);
  s->tunnels_open++;
  om_metric_set(s->m_tunnels, (double)s->tunnels_open);
  om__proxy_upgrade_count(s, OM__PROXY_UPG_SWITCHED);
  return 0;
}

/* ------------------------------------------------------------------ */
/* settings, metrics, status */

void om__proxy_read_upgrades_l(lua_State *L, int t, om__proxy_upgrades_t *u) {
  memset(u, 0, sizeof *u);
  lua_pushstring(L, "upgrades");
  if (lua_rawget(L, t) != LUA_TTABLE) { /* the default */
    lua_pop(L, 1);
    memcpy(u->tok[0], "websocket", 10);
    u->n = 1;
    return;
  }
  for (lua_Integer i = 1; u->n < OM__PROXY_MAX_UPGRADES; i++) {
    size_t len;
    const char *v;
    if (lua_rawgeti(L, -1, i) != LUA_TSTRING) {
      lua_pop(L, 1);
      break;
    }
    v = lua_tolstring(L, -1, &len);
    if (len > 0 && len < OM__PROXY_UPGRADE_LEN) { /* the contract's bound */
      for (size_t k = 0; k < len; k++) {
        unsigned ch = (unsigned char)v[k];
        u->tok[u->n][k] = (char)(ch - 'A' < 26u ? ch | 0x20 : ch);
      }
      u->n++;
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

void om__proxy_tunnel_metrics(om_proxy_t *p, om__proxy_service_t *s,
                              const char *esc) {
  char labels[512];
  for (int o = 0; o < OM__PROXY_UPG_COUNT; o++) {
    snprintf(labels, sizeof labels, "service=\"%s\",outcome=\"%s\"", esc,
             UPG_NAMES[o]);
    s->m_upgrades[o] = om_metrics_counter(
        p->metrics, "openmesh_proxy_upgrades_total",
        "Upgrade requests by outcome (switched: 101 and a tunnel; declined: "
        "the peer answered otherwise; not_allowed: 403; failed: the "
        "hand-over failed).",
        labels);
  }
  snprintf(labels, sizeof labels, "service=\"%s\"", esc);
  s->m_tunnels = om_metrics_gauge(p->metrics, "openmesh_proxy_tunnels_active",
                                  "Upgraded connections open now.", labels);
  snprintf(labels, sizeof labels, "service=\"%s\",direction=\"upstream\"", esc);
  s->m_tunnel_bytes[DIR_UP] = om_metrics_counter(
      p->metrics, "openmesh_proxy_tunnel_bytes_total",
      "Bytes relayed through tunnels (upstream: client to peer; downstream: "
      "peer to client).",
      labels);
  snprintf(labels, sizeof labels, "service=\"%s\",direction=\"downstream\"",
           esc);
  s->m_tunnel_bytes[DIR_DOWN] = om_metrics_counter(
      p->metrics, "openmesh_proxy_tunnel_bytes_total",
      "Bytes relayed through tunnels (upstream: client to peer; downstream: "
      "peer to client).",
      labels);
}

json_t *om__proxy_tunnel_status(const om__proxy_service_t *s) {
  json_t *o = json_object(), *allowed_list = json_array();
  if (o == NULL || allowed_list == NULL) {
    json_decref(o);
    json_decref(allowed_list);
    return NULL;
  }
  for (size_t i = 0; i < s->set.upgrades.n; i++)
    json_array_append_new(allowed_list, json_string(s->set.upgrades.tok[i]));
  json_object_set_new(o, "allowed", allowed_list);
  json_object_set_new(
      o, "stream_idle_timeout_ms",
      json_integer((json_int_t)(s->set.stream_idle_ns / NS_PER_MS)));
  json_object_set_new(o, "tunnels_active",
                      json_integer((json_int_t)s->tunnels_open));
  for (int k = 0; k < OM__PROXY_UPG_COUNT; k++)
    json_object_set_new(o, UPG_NAMES[k],
                        json_integer((json_int_t)s->upgrades[k]));
  return o;
}
