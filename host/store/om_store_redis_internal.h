/*
 * om_store_redis_internal.h: what the Redis store's files share
 * (om_store_redis.c: helpers, requests, the contract, construction;
 * om_store_redis_session.c: the connection and the replies;
 * om_store_redis_scripts.c: the scripts). Only host/store includes it.
 */
#ifndef OM_STORE_REDIS_INTERNAL_H
#define OM_STORE_REDIS_INTERNAL_H

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

/* The scripts, by index (om__redis_scripts). */
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
  SC_LEASES,
  SC_COLLECT,
  SC__COUNT
};

/* ------------------------------------------------------------------ */
/* types */

typedef struct rsvc_s {
  char *name;
  om_snapshot_t *snap; /* NULL: never seen */
  uint64_t rev;        /* of snap: the last revision delivered */
  uint64_t want;       /* announced, not yet in hand */
  int fetching;
  /* uv_now + 1 when the replica first held it empty (0: it has
   * instances); gone: collected in Redis, to be named to the caller of
   * om_store_collect_empty and dropped; unlisted: absent from the last
   * resync's list */
  uint64_t empty_ms;
  int gone, unlisted;
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
  char k_watched[PREFIX_MAX + 16];
  char sha[SC__COUNT][41];
  redisAsyncContext *cmd, *sub;
  int state, cmd_ok, sub_ok, subscribed, epoch_done, listed, ever_up;
  int need_resync, sweeping, collecting;
  uint64_t collect_ms; /* the last om_store_collect_empty call */
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
  RQ_SELECT,
  RQ_LEASES,
  RQ_COLLECT
};

typedef struct req_s {
  rstore_t *r;
  int kind, script, retried;
  om_store_write_cb wcb;
  om_store_snapshot_cb scb;
  om_store_list_cb lcb;
  om_store_config_cb ccb;
  om_store_leases_cb lscb;
  void *ud;
  char name[OM_NAME_MAX + 1];
  int argc;
  const char **argv;
  size_t *argvlen;
} req_t;

static const om_store_ops_t redis_ops;

/* ---- shared by the files of the Redis store ---- */

/* Each script's source, indexed by SC_*. */
extern const char *const om__redis_scripts[SC__COUNT];

/* out: the 40 hex digits of SHA-1(msg) and a NUL (EVALSHA's name). */
void om__sha1_hex(const char *msg, char out[41]);

/* The replica's tables by name: find, or get (find or insert). */
rsvc_t *om__svc_find(rstore_t *r, const char *name);
rsvc_t *om__svc_get(rstore_t *r, const char *name);
rcfg_t *om__cfg_find(rstore_t *r, const char *name);
rcfg_t *om__cfg_get(rstore_t *r, const char *name);

/*
 * The functions below are defined in one file and called from another;
 * each one's contract comment is above its definition.
 */
/* @@PROTOS@@ */
int om__valid_name(const char *s);
uint64_t om__realtime_us(rstore_t *r);
void om__see(rstore_t *r, uint64_t rev);
void om__floor_str(rstore_t *r, char out[24]);
int om__reply_rev(const redisReply *e, uint64_t *out);
void om__replica_set(rstore_t *r, rsvc_t *svc, om_snapshot_t *snap);
void om__cfg_set(rstore_t *r, rcfg_t *c, om_config_doc_t *doc);
req_t *om__req_new(rstore_t *r, int kind, int script, int argc,
                   const char *const *argv, const size_t *lens);
req_t *om__req_script(rstore_t *r, int kind, int script, int nkeys,
                      const char *const *keys, int nargs,
                      const char *const *args, const size_t *arglens);
int om__req_send(rstore_t *r, req_t *q);
int om__build_snapshot(const char *service, uint64_t rev, redisReply **e,
                       size_t n, size_t from, om_snapshot_t **out);
void om__fetch_service(rstore_t *r, rsvc_t *svc);
void om__fetch_config(rstore_t *r, rcfg_t *c);
void om__start_resync(rstore_t *r);
void om__on_change_msg(rstore_t *r, const char *msg, size_t len);
void om__release(rstore_t *r);
void om__session_connect(rstore_t *r);
void om__drop_connections(rstore_t *r);
void om__session_fail(rstore_t *r, const char *why);
void om__serve_snapshot(rstore_t *r, const char *name, om_store_snapshot_cb cb,
                        void *ud);
void om__on_reply(redisAsyncContext *ac, void *reply, void *privdata);
void om__on_sweep(uv_timer_t *t);

#endif /* OM_STORE_REDIS_INTERNAL_H */
