/*
 * om_proxy_stream.c: the timeouts of a committed stream (docs/PROXY.md
 * "Timeouts").
 *
 * Up to the commit (a non-5xx head handed to the caller) the call's
 * deadline bounds everything. After it the deadline no longer applies: an
 * SSE feed, an LLM token stream or a download lives as long as it flows.
 * Two limits take over, both per service in the traffic policy:
 * stream_idle_timeout_ms (no byte in either direction for that long) and
 * max_stream_ms (the whole stream, flowing or not; none by default).
 *
 * One timer per call, the call's own (c->timer: the backoffs that used it
 * are over once a response is committed). A byte only stores the loop's
 * cached time in c->stream_last_ms; the timer is armed for the earliest
 * moment the stream could be due and, when it fires early because bytes
 * moved meanwhile, re-armed from the timestamp (nginx's way with its read
 * and send timeouts). So a stream of a million chunks costs one timer
 * update per idle period, not one per chunk. While the upstream is paused
 * because the caller reads slowly, bytes wait for the caller: the stream
 * is not idle, and the listener's write-progress timeout judges the
 * caller.
 */
#include <stdio.h>

#include "om_log.h"
#include "om_proxy_internal.h"
#include "om_splice.h"

/* ns -> ms rounded up, so a timeout never fires early; 0 for "none". */
static uint64_t ms_of(uint64_t ns) {
  if (ns == OM_DEADLINE_NEVER)
    return 0;
  return ns / NS_PER_MS + (ns % NS_PER_MS != 0);
}

/* The loop ms when the stream is due to be cut as things stand; 0: never. */
static uint64_t due_ms(const om__proxy_call_t *c) {
  uint64_t idle = ms_of(c->set.stream_idle_ns);
  uint64_t max = ms_of(c->set.max_stream_ns), d = 0;
  if (idle != 0)
    d = c->stream_last_ms + idle;
  if (max != 0 && (d == 0 || c->stream_t0_ms + max < d))
    d = c->stream_t0_ms + max;
  return d;
}

static void on_stream_timer(uv_timer_t *t);

static void arm(om__proxy_call_t *c, uint64_t now) {
  uint64_t d = due_ms(c);
  c->stream_due_ms = d;
  if (d != 0)
    uv_timer_start(&c->timer, on_stream_timer, d > now ? d - now : 0, 0);
}

/* Count, log once, then cut (c is freed by om__proxy_call_cut). */
static void cut(om__proxy_call_t *c, int max_stream, uint64_t now) {
  char after[24], limit[24];
  snprintf(after, sizeof after, "%llu",
           (unsigned long long)(now - (max_stream ? c->stream_t0_ms
                                                  : c->stream_last_ms)));
  snprintf(limit, sizeof limit, "%llu",
           (unsigned long long)ms_of(max_stream ? c->set.max_stream_ns
                                                : c->set.stream_idle_ns));
  om_metric_inc(max_stream ? c->s->m_cut_max : c->s->m_cut_idle);
  om_log(OM_LOG_WARN, "proxy_stream_cut", "service", c->s->name, "peer",
         c->last_peer, "reason", max_stream ? "max_stream" : "idle",
         max_stream ? "stream_ms" : "idle_ms", after, "limit_ms", limit, NULL);
  om__proxy_call_cut(c);
}

static void on_stream_timer(uv_timer_t *t) {
  om__proxy_call_t *c = t->data;
  uint64_t now = uv_now(c->p->loop);
  uint64_t idle = ms_of(c->set.stream_idle_ns);
  uint64_t max = ms_of(c->set.max_stream_ns);
  if (!c->streaming)
    return;
  if (max != 0 && now >= c->stream_t0_ms + max) {
    cut(c, 1, now);
    return;
  }
  /* The upstream is paused because the caller reads slower than it
   * sends: bytes are waiting for the caller, so the stream is not idle.
   * Whether the caller still reads at all is the listener's write-progress
   * timeout to judge (the kernel's buffers hide it from here). A splice
   * pauses the upstream too: it is the same case while the splice waits
   * for the caller to take bytes, and an idle stream while it waits for
   * the upstream. */
  if (c->paused && (c->splice == NULL || om_splice_waits_for_dst(c->splice)))
    c->stream_last_ms = now;
  if (idle != 0 && now >= c->stream_last_ms + idle) {
    cut(c, 0, now);
    return;
  }
  arm(c, now); /* bytes moved since it was armed: the new due is later */
}

void om__proxy_stream_start(om__proxy_call_t *c) {
  uint64_t now = uv_now(c->p->loop);
  if (!c->timer_init) {
    uv_timer_init(c->p->loop, &c->timer);
    c->timer.data = c;
    c->timer_init = 1;
  }
  c->streaming = 1;
  c->stream_t0_ms = c->stream_last_ms = now;
  arm(c, now);
}

void om__proxy_stream_activity(om__proxy_call_t *c) {
  if (c->streaming)
    c->stream_last_ms = uv_now(c->p->loop);
}
