/* om_example_service.c: see om_example_service.h. */
#include "om_example_service.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_http_server.h"
#include "om_log.h"

struct om_example_s {
  uv_loop_t *loop;
  om_store_t *store;
  om_http_server_t *http;
  uv_timer_t renew;
  om_instance_t self;
  char *service;
  om_example_behaviour_t behaviour;
  uint64_t delay_ms, requests;
  uint32_t fail_every, retry_after_s;
  int status;
  int stopping, pending; /* handles and callbacks still to come back */
  void (*done)(void *ud);
  void *done_ud;
};

/* A slow answer waiting for its timer. */
typedef struct {
  uv_timer_t timer;
  om_http_request_t *req;
  om_example_t *e;
} delayed_t;

static void finish_if_idle(om_example_t *e) {
  if (e->stopping && e->pending == 0) {
    void (*done)(void *) = e->done;
    void *ud = e->done_ud;
    om_instance_clear(&e->self);
    free(e->service);
    free(e);
    if (done != NULL)
      done(ud);
  }
}

static void answer(om_example_t *e, om_http_request_t *req, int status) {
  char body[512], retry[16];
  om_http_header_t h[3] = {{"content-type", "application/json", 12, 16},
                           {"x-served-by", e->self.id, 11, strlen(e->self.id)},
                           {"retry-after", retry, 11, 0}};
  size_t nh = 2;
  int n =
      snprintf(body, sizeof body,
               "{\"service\":\"%s\",\"id\":\"%s\",\"status\":%d,"
               "\"request\":%llu}\n",
               e->service, e->self.id, status, (unsigned long long)e->requests);
  if (status == 429) {
    h[2].value_len =
        (size_t)snprintf(retry, sizeof retry, "%u", (unsigned)e->retry_after_s);
    nh = 3;
  }
  om_http_respond(req, status, h, nh, body, (size_t)n);
}

/* dying: the head and a first chunk, then the connection is cut, as an
 * upstream that crashes mid-stream leaves it. */
static void answer_dying(om_example_t *e, om_http_request_t *req) {
  const om_http_header_t h[2] = {
      {"content-type", "text/event-stream", 12, 17},
      {"x-served-by", e->self.id, 11, strlen(e->self.id)}};
  static const char chunk[] = "data: first\n\n";
  if (om_http_response_start(req, 200, h, 2) != 0 ||
      om_http_response_write(req, chunk, sizeof chunk - 1) != 0) {
    om_http_response_abort(req);
    return;
  }
  om_http_response_abort(req);
}

static void on_delay_closed(uv_handle_t *h) {
  delayed_t *d = h->data;
  om_example_t *e = d->e;
  free(d);
  e->pending--;
  finish_if_idle(e);
}

static void on_delay(uv_timer_t *t) {
  delayed_t *d = t->data;
  if (d->req != NULL)
    answer(d->e, d->req, 200);
  uv_close((uv_handle_t *)t, on_delay_closed);
}

static void on_client_gone(om_http_request_t *req) {
  delayed_t *d = req->user;
  if (d != NULL)
    d->req = NULL; /* the timer still fires, and answers no one */
}

static void on_request(om_http_request_t *req, void *ud) {
  om_example_t *e = ud;
  e->requests++;
  if (e->behaviour == OM_EXAMPLE_FLAKY && e->fail_every > 0 &&
      e->requests % e->fail_every == 0) {
    answer(e, req, 503);
    return;
  }
  if (e->behaviour == OM_EXAMPLE_FAILING) {
    answer(e, req, e->status);
    return;
  }
  if (e->behaviour == OM_EXAMPLE_THROTTLED) {
    answer(e, req, 429);
    return;
  }
  if (e->behaviour == OM_EXAMPLE_DYING) {
    answer_dying(e, req);
    return;
  }
  if (e->behaviour == OM_EXAMPLE_SLOW && e->delay_ms > 0) {
    delayed_t *d = calloc(1, sizeof *d);
    if (d == NULL) {
      answer(e, req, 503);
      return;
    }
    d->req = req;
    d->e = e;
    d->timer.data = d;
    req->user = d;
    om_http_request_on_close(req, on_client_gone);
    uv_timer_init(e->loop, &d->timer);
    uv_timer_start(&d->timer, on_delay, e->delay_ms, 0);
    e->pending++;
    return;
  }
  answer(e, req, 200);
}

static void on_registered(void *ud, int status, om_store_change_t change,
                          uint64_t revision) {
  om_example_t *e = ud;
  char rev[32];
  (void)change;
  e->pending--;
  if (status != 0)
    om_log(OM_LOG_WARN, "example_register_failed", "id", e->self.id, "error",
           om_strerror(status), NULL);
  else if (change != OM_STORE_NOCHANGE) {
    snprintf(rev, sizeof rev, "%llu", (unsigned long long)revision);
    om_log(OM_LOG_INFO, "example_registered", "service", e->service, "id",
           e->self.id, "url", e->self.url, "revision", rev, NULL);
  }
  finish_if_idle(e);
}

static void put(om_example_t *e) {
  e->pending++;
  if (om_store_put_instance(e->store, e->service, &e->self, on_registered, e) !=
      0)
    e->pending--;
}

static void on_renew(uv_timer_t *t) {
  put(t->data);
}

int om_example_behaviour(const char *name) {
  if (strcmp(name, "fast") == 0 || strcmp(name, "ok") == 0)
    return OM_EXAMPLE_FAST;
  if (strcmp(name, "failing") == 0)
    return OM_EXAMPLE_FAILING;
  if (strcmp(name, "throttled") == 0)
    return OM_EXAMPLE_THROTTLED;
  if (strcmp(name, "dying") == 0)
    return OM_EXAMPLE_DYING;
  if (strcmp(name, "slow") == 0)
    return OM_EXAMPLE_SLOW;
  if (strcmp(name, "flaky") == 0)
    return OM_EXAMPLE_FLAKY;
  return -1;
}

int om_example_start(uv_loop_t *loop, om_store_t *store,
                     const om_example_opts_t *o, om_example_t **out) {
  om_example_t *e;
  om_instance_t spec = {0};
  char url[128];
  const char *field, *why;
  int rc, port;
  if (loop == NULL || store == NULL || o == NULL || out == NULL ||
      o->service == NULL || o->id == NULL || o->host == NULL ||
      !om_valid_name(o->service, strlen(o->service)) ||
      !om_valid_name(o->id, strlen(o->id)))
    return OM_EINVAL;
  e = calloc(1, sizeof *e);
  if (e == NULL)
    return OM_ENOMEM;
  e->loop = loop;
  e->store = store;
  e->behaviour = o->behaviour;
  e->delay_ms = o->delay_ms;
  e->fail_every = o->fail_every;
  e->status = o->status ? o->status : 503;
  e->retry_after_s = o->retry_after_s;
  /* Listen first: with port 0 the lease must carry the port we got. */
  rc = om_http_server_new(loop, NULL, on_request, e, &e->http);
  if (rc == 0 && (rc = om_http_server_listen(e->http, o->host, o->port)) != 0)
    om_http_server_close(e->http, NULL);
  if (rc != 0) {
    free(e);
    return rc;
  }
  port = om_http_server_port(e->http);
  snprintf(url, sizeof url,
           strchr(o->host, ':') ? "http://[%s]:%d" : "http://%s:%d", o->host,
           port);
  spec.id = (char *)o->id;
  spec.url = url;
  spec.zone = (char *)o->zone;
  spec.weight = 1;
  spec.ttl_ms = o->ttl_ms ? o->ttl_ms : 10000;
  spec.metadata = (om_kv_t *)o->metadata;
  spec.n_metadata = o->n_metadata;
  rc = om_instance_validate(&spec, &field, &why) != 0 ? OM_EINVAL : 0;
  if (rc == 0 && ((e->service = strdup(o->service)) == NULL ||
                  om_instance_copy(&e->self, &spec) != 0))
    rc = OM_ENOMEM;
  if (rc != 0) {
    om_http_server_close(e->http, NULL); /* frees itself once closed */
    om_instance_clear(&e->self);
    free(e->service);
    free(e);
    return rc;
  }
  uv_timer_init(loop, &e->renew);
  e->renew.data = e;
  uv_timer_start(&e->renew, on_renew, spec.ttl_ms / 3, spec.ttl_ms / 3);
  put(e);
  *out = e;
  return 0;
}

const char *om_example_url(const om_example_t *e) {
  return e->self.url;
}

uint64_t om_example_requests(const om_example_t *e) {
  return e->requests;
}

static void on_renew_closed(uv_handle_t *h) {
  om_example_t *e = h->data;
  e->pending--;
  finish_if_idle(e);
}

static void on_http_closed(om_http_server_t *srv, void *ud) {
  om_example_t *e = ud;
  (void)srv;
  e->pending--;
  finish_if_idle(e);
}

static void on_deleted(void *ud, int status, om_store_change_t change,
                       uint64_t revision) {
  (void)status;
  (void)change;
  (void)revision;
  om_example_t *e = ud;
  e->pending--;
  finish_if_idle(e);
}

void om_example_stop(om_example_t *e, void (*done)(void *ud), void *ud) {
  if (e == NULL || e->stopping)
    return;
  e->stopping = 1;
  e->done = done;
  e->done_ud = ud;
  e->pending += 3; /* renew timer, http server, delete */
  uv_timer_stop(&e->renew);
  uv_close((uv_handle_t *)&e->renew, on_renew_closed);
  if (om_http_server_close(e->http, on_http_closed) != 0)
    e->pending--;
  /* the lease goes first: nothing new is routed here while it drains */
  if (om_store_delete_instance(e->store, e->service, e->self.id, on_deleted,
                               e) != 0)
    e->pending--;
}
