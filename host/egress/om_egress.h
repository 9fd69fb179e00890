/*
 * om_egress.h: the egress gateway (`openmesh egress`, docs/EGRESS.md).
 *
 * Layer A (classify, retry, fall back: core/om_egress_rules.h) for every model
 * call; for agent turns the quality gate (opt-in per agent), delivery
 * through the channel's connector (Layer B: host/egress/om_connector.h, only an
 * om_agent_message_t can be delivered) and degradation (Layer C: async
 * turns stay silent and are retried on the next cycle; interactive turns get
 * the policy's holding line, background retries within a commitment, then
 * the real answer or the handoff message). The internal cause of a failure
 * never reaches a user channel or a /v1/turns answer: it goes to the errors
 * file (one JSON line per EgressError) and the log.
 *
 * HTTP:
 *   POST /v1/chat/completions   OpenAI-compatible, JSON and stream:true
 *   POST /v1/messages           Anthropic Messages, JSON and stream:true
 *   POST /v1/responses          OpenAI Responses, JSON and stream:true
 *   GET  /v1/models             the model aliases (or the routes' models)
 *   POST /v1/turns              {agent, conversation, run_id?, context,
 *                                channel, request}
 *   GET  /v1/pending            async turns waiting for the next cycle
 *   GET  /metrics, /status, /healthz
 *
 * Everything runs on the caller's loop thread.
 */
#ifndef OM_EGRESS_HOST_H
#define OM_EGRESS_HOST_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "om_http_server.h"
#include "om_egress_rules.h"

typedef struct om_egress_s om_egress_t;

typedef struct om_egress_opts_s {
  const char *fallback_path;   /* the fallback policy file: required */
  const char *heuristics_path; /* the egress_heuristics policy: required */
  const char *lib_dir;         /* NULL: om_lib_dir() */
  /* channels: JSON {"NAME": {"kind","target","part_limit","max_retries",
   * "timeout_ms"}} (or the same under a "channels" key); NULL: none (a turn
   * naming a channel is then refused) */
  const char *channels_path;
  const char *errors_path; /* NULL: EgressErrors go to the log only */
  om_http_server_opts_t server;
  uint64_t seed; /* jitter; 0: from the clock */
} om_egress_opts_t;

/*
 * om_egress_new: load both policies (they must be valid), open the
 * channels and the errors file, and get ready to listen. Returns 0 and
 * *out; OM_EPOLICY / OM_EINVAL / OM_EIO with a message naming the file or
 * field in err; OM_ENOMEM. On error nothing is left running on the loop
 * except handles that close themselves on the next iteration.
 */
int om_egress_new(uv_loop_t *loop, const om_egress_opts_t *opts,
                  om_egress_t **out, char *err, size_t errlen);

/* Listen on host:port (port 0: a free one). 0, OM_EINVAL, OM_EIO. */
int om_egress_listen(om_egress_t *g, const char *host, int port);
int om_egress_port(const om_egress_t *g);

/* Reload both policy files now (SIGHUP); returns how many were rejected
 * (the previous version of those stays). */
int om_egress_reload_policies(om_egress_t *g);

/*
 * om_egress_close: stop accepting, cancel calls and background retries
 * (pending turns are dropped: they are in the errors file), close
 * connectors and the server, then call cb(ud) from the loop and free g.
 */
void om_egress_close(om_egress_t *g, void (*cb)(void *ud), void *ud);

#endif /* OM_EGRESS_HOST_H */
