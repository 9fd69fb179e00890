/*
 * om_connector.c: what every connector kind shares (see om_connector.h):
 * the registry of kinds, rendering a message into JSON parts, the FIFO of
 * deliveries, one part in flight at a time, transport retries with
 * backoff, and closing.
 */
#include "om_connector.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "om_errno.h"

/* Every kind the gateway knows: a new channel is one more line here. */
static const om_connector_kind_t *const kinds[] = {
    &om__connector_webhook,
    &om__connector_file,
};

#define MIN_PART_LIMIT 64
#define MAX_PART_LIMIT ((size_t)1 << 20)

typedef struct delivery_s {
  struct delivery_s *next;
  om_connector_done_cb cb;
  void *ud;
  char **json; /* one compact JSON object per part */
  size_t *len;
  size_t n, sent;
  int attempt; /* retries of the part in flight so far */
  int timed_out;
  uint64_t id;
} delivery_t;

struct om_connector_s {
  uv_loop_t *loop;
  const om_connector_kind_t *kind;
  void *state;
  size_t part_limit;
  int max_retries;
  uint64_t timeout_ms, retry_base_ms;
  delivery_t *head, *tail;
  size_t pending;
  int in_flight, waiting, closing;
  uv_timer_t timer; /* kicks the queue and waits the backoff */
  uint64_t seq;
  char nonce[17];
  char key[64];
  char last_error[256];
  om_connector_stats_t stats;
};

static void delivery_free(delivery_t *d) {
  if (d == NULL)
    return;
  for (size_t i = 0; d->json != NULL && i < d->n; i++)
    free(d->json[i]);
  free(d->json);
  free(d->len);
  free(d);
}

/* ------------------------------------------------------------------ */
/* Lifecycle                                                           */

int om_connector_new(uv_loop_t *loop, const om_connector_opts_t *opts,
                     om_connector_t **out, char *err, size_t errlen) {
  const om_connector_kind_t *kind = NULL;
  om_connector_t *c;
  unsigned char rnd[8];
  int rc;
  om_errbuf(err, errlen, "%s", "");
  if (loop == NULL || opts == NULL || out == NULL) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  for (size_t i = 0; opts->kind != NULL && i < sizeof kinds / sizeof *kinds;
       i++)
    if (strcmp(opts->kind, kinds[i]->name) == 0)
      kind = kinds[i];
  if (kind == NULL) {
    om_errbuf(err, errlen,
              "kind: unknown connector kind '%.64s' (webhook, file)",
              opts->kind ? opts->kind : "(null)");
    return OM_EINVAL;
  }
  if (opts->target == NULL || opts->target[0] == '\0') {
    om_errbuf(err, errlen, "target: required");
    return OM_EINVAL;
  }
  if (opts->part_limit != 0 && (opts->part_limit < MIN_PART_LIMIT ||
                                opts->part_limit > MAX_PART_LIMIT)) {
    om_errbuf(err, errlen, "part_limit: %zu out of range %d..%zu",
              opts->part_limit, MIN_PART_LIMIT, MAX_PART_LIMIT);
    return OM_EINVAL;
  }
  if (opts->max_retries < 0 || opts->max_retries > OM_CONNECTOR_MAX_RETRIES) {
    om_errbuf(err, errlen, "max_retries: %d out of range 0..%d",
              opts->max_retries, OM_CONNECTOR_MAX_RETRIES);
    return OM_EINVAL;
  }
  if (opts->timeout_ms > 3600000u || opts->retry_base_ms > 60000u) {
    om_errbuf(err, errlen, "%s: too large",
              opts->timeout_ms > 3600000u ? "timeout_ms" : "retry_base_ms");
    return OM_EINVAL;
  }
  c = calloc(1, sizeof *c);
  if (c == NULL) {
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  c->loop = loop;
  c->kind = kind;
  c->part_limit =
      opts->part_limit ? opts->part_limit : kind->default_part_limit;
  c->max_retries = opts->max_retries;
  c->timeout_ms =
      opts->timeout_ms ? opts->timeout_ms : OM_CONNECTOR_DEFAULT_TIMEOUT_MS;
  c->retry_base_ms = opts->retry_base_ms ? opts->retry_base_ms
                                         : OM_CONNECTOR_DEFAULT_RETRY_BASE_MS;
  /* Delivery ids must not repeat across restarts (a receiver deduplicates
   * on them): a random nonce per connector, then a counter. */
  if (uv_random(NULL, NULL, rnd, sizeof rnd, 0, NULL) != 0) {
    uint64_t t = uv_hrtime() ^ ((uint64_t)uv_os_getpid() << 32);
    memcpy(rnd, &t, sizeof rnd);
  }
  for (size_t i = 0; i < sizeof rnd; i++)
    snprintf(c->nonce + 2 * i, 3, "%02x", rnd[i]);
  rc = kind->open(c, loop, opts, &c->state, err, errlen);
  if (rc != 0) {
    free(c);
    return rc;
  }
  uv_timer_init(loop, &c->timer); /* cannot fail on a valid loop */
  c->timer.data = c;
  *out = c;
  return 0;
}

static void free_connector(uv_handle_t *h) {
  free(h->data);
}

static void kind_closed(om_connector_t *c) {
  uv_close((uv_handle_t *)&c->timer, free_connector);
}

void om_connector_close(om_connector_t *c) {
  if (c == NULL || c->closing)
    return;
  c->closing = 1;
  uv_timer_stop(&c->timer);
  while (c->head != NULL) {
    delivery_t *d = c->head;
    om_connector_done_cb cb = d->cb;
    void *ud = d->ud;
    size_t sent = d->sent;
    c->head = d->next;
    c->pending--;
    delivery_free(d);
    cb(ud, OM_ESTATE, sent);
  }
  c->tail = NULL;
  c->in_flight = 0;
  c->kind->close(c->state, c, kind_closed);
}

size_t om_connector_pending(const om_connector_t *c) {
  return c->pending;
}

const char *om_connector_kind(const om_connector_t *c) {
  return c->kind->name;
}

size_t om_connector_part_limit(const om_connector_t *c) {
  return c->part_limit;
}

const char *om_connector_last_error(const om_connector_t *c) {
  return c->last_error;
}

void om_connector_stats(const om_connector_t *c, om_connector_stats_t *out) {
  *out = c->stats;
}

const char *om__connector_part_key(const om_connector_t *c) {
  return c->key;
}

/* ------------------------------------------------------------------ */
/* The queue                                                           */

static void start_part(om_connector_t *c);

static void on_timer(uv_timer_t *t) {
  om_connector_t *c = t->data;
  c->waiting = 0;
  if (!c->closing && !c->in_flight && c->head != NULL)
    start_part(c);
}

static void arm(om_connector_t *c, uint64_t ms) {
  uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* The head delivery ended: dequeue it and tell its caller. */
static void finish(om_connector_t *c, int status) {
  delivery_t *d = c->head;
  om_connector_done_cb cb = d->cb;
  void *ud = d->ud;
  size_t sent = d->sent;
  c->head = d->next;
  if (c->head == NULL)
    c->tail = NULL;
  c->pending--;
  if (status == 0)
    c->stats.delivered++;
  else
    c->stats.failed++;
  delivery_free(d);
  cb(ud, status, sent);
  if (!c->closing && c->head != NULL && !c->in_flight && !c->waiting) {
    c->waiting = 1;
    arm(c, 0);
  }
}

static void start_part(om_connector_t *c) {
  delivery_t *d = c->head;
  int rc;
  snprintf(c->key, sizeof c->key, "%s%llu-%zu", c->nonce,
           (unsigned long long)d->id, d->sent + 1);
  c->in_flight = 1;
  rc = c->kind->send(c->state, c, d->json[d->sent], d->len[d->sent]);
  if (rc != 0) {
    c->in_flight = 0;
    snprintf(c->last_error, sizeof c->last_error, "%s: cannot send: %s",
             c->kind->name, om_strerror(rc));
    finish(c, OM_EIO);
  }
}

void om__connector_sent(om_connector_t *c, om_connector_outcome_t outcome,
                        const char *why) {
  delivery_t *d = c->head;
  if (c->closing || !c->in_flight || d == NULL)
    return;
  c->in_flight = 0;
  if (outcome == OM_CONNECTOR_OK) {
    d->sent++;
    d->attempt = 0;
    c->stats.parts++;
    if (d->sent == d->n)
      finish(c, 0);
    else
      start_part(c);
    return;
  }
  snprintf(c->last_error, sizeof c->last_error, "%s: part %zu of %zu: %s",
           c->kind->name, d->sent + 1, d->n, why ? why : "failed");
  if (outcome == OM_CONNECTOR_FAIL) {
    finish(c, OM_EIO);
    return;
  }
  d->timed_out = outcome == OM_CONNECTOR_TIMEOUT;
  if (d->attempt >= c->max_retries) {
    finish(c, d->timed_out ? OM_EDEADLINE : OM_EIO);
    return;
  }
  /* Exponential backoff, capped at 30 times the base. */
  {
    uint64_t wait = c->retry_base_ms << (d->attempt < 5 ? d->attempt : 5);
    if (wait > 30 * c->retry_base_ms)
      wait = 30 * c->retry_base_ms;
    d->attempt++;
    c->stats.retries++;
    c->waiting = 1;
    arm(c, wait);
  }
}

/* ------------------------------------------------------------------ */
/* Deliver                                                             */

static int render(om_connector_t *c, const om_agent_message_t *msg,
                  delivery_t *d) {
  om_message_part_t *parts = NULL;
  size_t n = 0, len;
  const char *body = om_agent_message_body(msg, &len);
  char id[48];
  int rc = om_message_split(body, len, c->part_limit, &parts, &n);
  if (rc != 0)
    return rc;
  d->json = calloc(n, sizeof *d->json);
  d->len = calloc(n, sizeof *d->len);
  if (d->json == NULL || d->len == NULL) {
    om_message_parts_free(parts);
    return OM_ENOMEM;
  }
  d->n = n;
  snprintf(id, sizeof id, "%s%llu", c->nonce, (unsigned long long)d->id);
  for (size_t i = 0; i < n; i++) {
    const char *run = om_agent_message_run(msg);
    json_t *o = json_pack("{s:s, s:s, s:s?, s:s, s:I, s:I, s:s%}", "agent",
                          om_agent_message_agent(msg), "conversation",
                          om_agent_message_conversation(msg), "run_id", run,
                          "delivery", id, "part", (json_int_t)(i + 1), "parts",
                          (json_int_t)n, "text", parts[i].text, parts[i].len);
    if (o == NULL) {
      om_message_parts_free(parts);
      return OM_ENOMEM; /* the inputs are valid UTF-8: only memory fails */
    }
    d->json[i] = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (d->json[i] == NULL) {
      om_message_parts_free(parts);
      return OM_ENOMEM;
    }
    d->len[i] = strlen(d->json[i]);
  }
  om_message_parts_free(parts);
  return 0;
}

int om_connector_deliver(om_connector_t *c, const om_agent_message_t *msg,
                         om_connector_done_cb cb, void *ud) {
  delivery_t *d;
  size_t len;
  int rc;
  if (c == NULL || msg == NULL || cb == NULL)
    return OM_EINVAL;
  if (c->closing)
    return OM_ESTATE;
  om_agent_message_body(msg, &len);
  if (len == 0)
    return OM_EINVAL;
  if (c->pending >= OM_CONNECTOR_MAX_QUEUE)
    return OM_EOVERLOAD;
  d = calloc(1, sizeof *d);
  if (d == NULL)
    return OM_ENOMEM;
  d->id = c->seq + 1;
  rc = render(c, msg, d);
  if (rc != 0) {
    delivery_free(d);
    return rc;
  }
  c->seq++;
  d->cb = cb;
  d->ud = ud;
  if (c->tail != NULL)
    c->tail->next = d;
  else
    c->head = d;
  c->tail = d;
  c->pending++;
  if (!c->in_flight && !c->waiting) {
    c->waiting = 1;
    arm(c, 0); /* never call back from inside deliver */
  }
  return 0;
}
