/* om_policy_watch.c: see om_policy_watch.h. */
#include "om_policy_watch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <xxhash.h>

#include "om_errno.h"
#include "om_log.h"

#define ERRLEN 2048

struct om_policy_watch_s {
  uv_fs_event_t event;
  uv_timer_t debounce;
  om_policy_watch_opts_t opts;
  char *path, *dir, *base, *lib_dir;
  om_policy_t *current;
  uint64_t version, failures, content_hash;
  int open_handles;
  char last_error[ERRLEN];
  char source[320]; /* of the active version */
  uint64_t revision;
  uint64_t loaded_at_ms; /* wall clock when the active version swapped in */
  /* the latest rejection, and the one before a good reload cleared it */
  om_policy_watch_error_t err_last, err_prev;
  char prev_error[ERRLEN];
};

static uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int om_policy_trailer_parse(const char *buf, size_t len, char *source,
                            size_t cap, uint64_t *revision) {
  static const char tag[] = OM_POLICY_TRAILER;
  size_t end = len, start, k = sizeof tag - 1, sp;
  uint64_t r = 0;
  while (end > 0 && (buf[end - 1] == '\n' || buf[end - 1] == '\r'))
    end--;
  start = end;
  while (start > 0 && buf[start - 1] != '\n')
    start--;
  if (end - start <= k || memcmp(buf + start, tag, k) != 0)
    return -1;
  start += k;
  /* SOURCE " revision " DIGITS */
  sp = start;
  while (sp < end && buf[sp] != ' ')
    sp++;
  if (sp == start || end - sp <= 10 || memcmp(buf + sp, " revision ", 10) != 0)
    return -1;
  for (size_t i = sp + 10; i < end; i++) {
    if (buf[i] < '0' || buf[i] > '9' || r > (UINT64_MAX - 9) / 10)
      return -1;
    r = r * 10 + (uint64_t)(buf[i] - '0');
  }
  snprintf(source, cap, "%.*s", (int)(sp - start), buf + start);
  *revision = r;
  return 0;
}

/* The trailer of path's last bytes, else "file:PATH", revision 0. */
static void trailer_of(const char *path, char *source, size_t cap,
                       uint64_t *revision) {
  char buf[512];
  size_t n = 0;
  FILE *f = fopen(path, "rb");
  snprintf(source, cap, "file:%s", path);
  *revision = 0;
  if (f == NULL)
    return;
  if (fseek(f, 0, SEEK_END) == 0) {
    long size = ftell(f);
    if (size > (long)sizeof buf)
      fseek(f, size - (long)sizeof buf, SEEK_SET);
    else
      fseek(f, 0, SEEK_SET);
    n = fread(buf, 1, sizeof buf, f);
  }
  fclose(f);
  if (om_policy_trailer_parse(buf, n, source, cap, revision) != 0) {
    snprintf(source, cap, "file:%s", path);
    *revision = 0;
  }
}

static void read_source(om_policy_watch_t *w) {
  trailer_of(w->path, w->source, sizeof w->source, &w->revision);
}

/* XXH3 of the file's bytes; 0 when unreadable (treated as changed). */
static uint64_t hash_file(const char *path) {
  FILE *f = fopen(path, "rb");
  XXH3_state_t *st;
  char buf[16384];
  size_t n;
  uint64_t h;
  if (f == NULL)
    return 0;
  st = XXH3_createState();
  if (st == NULL) {
    fclose(f);
    return 0;
  }
  XXH3_64bits_reset(st);
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    XXH3_64bits_update(st, buf, n);
  fclose(f);
  h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

static int load(om_policy_watch_t *w, om_policy_t **out, char *err,
                size_t errlen) {
  int rc = om_policy_load_file(&w->opts.policy, w->path, out, err, errlen);
  if (rc == 0 && w->opts.kind != 0 && om_policy_kind(*out) != w->opts.kind) {
    snprintf(err, errlen, "%s: field 'kind': expected '%s', got '%s'", w->path,
             om_policy_kind_name(w->opts.kind),
             om_policy_kind_name(om_policy_kind(*out)));
    om_policy_free(*out);
    *out = NULL;
    rc = OM_EPOLICY;
  }
  return rc;
}

int om_policy_watch_reload(om_policy_watch_t *w) {
  char err[ERRLEN], version[32];
  om_policy_t *next = NULL;
  uint64_t h = hash_file(w->path);
  int rc;
  if (h != 0 && h == w->content_hash)
    return 1;
  rc = load(w, &next, err, sizeof err);
  if (rc == 0 && w->opts.on_swap != NULL &&
      w->opts.on_swap(w->opts.ud, next, w->current) != 0) {
    snprintf(err, sizeof err, "%s: the new version could not be applied",
             w->path);
    om_policy_free(next);
    rc = OM_EPOLICY;
  }
  if (rc != 0) {
    char src[sizeof w->source];
    w->failures++;
    snprintf(w->last_error, sizeof w->last_error, "%s", err);
    w->err_last.message = w->last_error;
    w->err_last.at_ms = wall_ms();
    trailer_of(w->path, src, sizeof src, &w->err_last.revision);
    char rev[24];
    snprintf(rev, sizeof rev, "%llu", (unsigned long long)w->err_last.revision);
    om_log(OM_LOG_ERROR, "policy_reload_failed", "path", w->path, "source", src,
           "revision", rev, "error", err, "kept_version",
           (snprintf(version, sizeof version, "%llu",
                     (unsigned long long)w->version),
            version),
           NULL);
    return rc;
  }
  om_policy_free(w->current);
  w->current = next;
  w->version++;
  w->content_hash = h;
  w->loaded_at_ms = wall_ms();
  read_source(w);
  if (w->err_last.message != NULL) { /* fixed: history, not the state */
    snprintf(w->prev_error, sizeof w->prev_error, "%s", w->last_error);
    w->err_prev = w->err_last;
    w->err_prev.message = w->prev_error;
    w->err_last = (om_policy_watch_error_t){0};
    w->last_error[0] = '\0';
  }
  snprintf(version, sizeof version, "%llu", (unsigned long long)w->version);
  om_log(OM_LOG_INFO, "policy_reloaded", "path", w->path, "name",
         om_policy_name(next), "version", version, NULL);
  return 0;
}

static void on_debounce(uv_timer_t *t) {
  om_policy_watch_reload(t->data);
}

static void on_event(uv_fs_event_t *h, const char *filename, int events,
                     int status) {
  om_policy_watch_t *w = h->data;
  (void)events;
  if (status < 0 || (filename != NULL && strcmp(filename, w->base) != 0))
    return;
  uv_timer_start(&w->debounce, on_debounce, w->opts.debounce_ms, 0);
}

static void free_watch(om_policy_watch_t *w) {
  om_policy_free(w->current);
  free(w->path);
  free(w->dir);
  free(w->lib_dir);
  free(w);
}

static void on_closed(uv_handle_t *h) {
  om_policy_watch_t *w = h->data;
  if (--w->open_handles == 0)
    free_watch(w);
}

int om_policy_watch_start(uv_loop_t *loop, const om_policy_watch_opts_t *opts,
                          om_policy_watch_t **out, char *err, size_t errlen) {
  om_policy_watch_t *w;
  char *slash;
  int rc;
  if (loop == NULL || opts == NULL || opts->path == NULL || out == NULL ||
      opts->policy.lib_dir == NULL) {
    snprintf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  w = calloc(1, sizeof *w);
  if (w == NULL || (w->path = strdup(opts->path)) == NULL ||
      (w->dir = strdup(opts->path)) == NULL ||
      (w->lib_dir = strdup(opts->policy.lib_dir)) == NULL) {
    if (w != NULL) {
      free(w->path);
      free(w->dir);
      free(w);
    }
    snprintf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  w->opts = *opts;
  w->opts.path = w->path;
  w->opts.policy.lib_dir = w->lib_dir;
  if (w->opts.debounce_ms == 0)
    w->opts.debounce_ms = 100;
  slash = strrchr(w->dir, '/');
  if (slash == NULL) {
    w->base = w->path;
    strcpy(w->dir, ".");
  } else {
    *slash = '\0';
    w->base = w->path + (slash - w->dir) + 1;
    if (w->dir[0] == '\0')
      strcpy(w->dir, "/");
  }
  w->content_hash = hash_file(w->path);
  rc = load(w, &w->current, err, errlen);
  if (rc == 0 && opts->on_swap != NULL &&
      opts->on_swap(opts->ud, w->current, NULL) != 0) {
    snprintf(err, errlen, "%s: the policy could not be applied", w->path);
    rc = OM_EPOLICY;
  }
  if (rc != 0) {
    free_watch(w);
    return rc;
  }
  w->version = 1;
  w->loaded_at_ms = wall_ms();
  read_source(w);
  uv_timer_init(loop, &w->debounce);
  w->debounce.data = w;
  uv_fs_event_init(loop, &w->event);
  w->event.data = w;
  w->open_handles = 2;
  rc = uv_fs_event_start(&w->event, on_event, w->dir, 0);
  if (rc != 0) {
    snprintf(err, errlen, "%s: cannot watch: %s", w->dir, uv_strerror(rc));
    om_policy_watch_stop(w);
    return OM_EINVAL;
  }
  *out = w;
  return 0;
}

void om_policy_watch_stop(om_policy_watch_t *w) {
  if (w == NULL)
    return;
  uv_fs_event_stop(&w->event);
  uv_timer_stop(&w->debounce);
  uv_close((uv_handle_t *)&w->event, on_closed);
  uv_close((uv_handle_t *)&w->debounce, on_closed);
}

om_policy_t *om_policy_watch_current(const om_policy_watch_t *w) {
  return w->current;
}

uint64_t om_policy_watch_version(const om_policy_watch_t *w) {
  return w->version;
}

uint64_t om_policy_watch_failures(const om_policy_watch_t *w) {
  return w->failures;
}

const char *om_policy_watch_last_error(const om_policy_watch_t *w) {
  return w->last_error;
}

const char *om_policy_watch_path(const om_policy_watch_t *w) {
  return w->path;
}

const char *om_policy_watch_source(const om_policy_watch_t *w) {
  return w->source;
}

uint64_t om_policy_watch_loaded_at_ms(const om_policy_watch_t *w) {
  return w->loaded_at_ms;
}

const om_policy_watch_error_t *om_policy_watch_error(const om_policy_watch_t *w,
                                                     int previous) {
  const om_policy_watch_error_t *e = previous ? &w->err_prev : &w->err_last;
  return e->message != NULL ? e : NULL;
}

/* ms since the epoch -> "2026-01-02T03:04:05.678Z"; null for 0. */
static json_t *rfc3339(uint64_t ms) {
  char buf[40];
  struct tm tm;
  time_t t = (time_t)(ms / 1000u);
  if (ms == 0 || gmtime_r(&t, &tm) == NULL)
    return json_null();
  size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + n, sizeof buf - n, ".%03uZ", (unsigned)(ms % 1000u));
  return json_string(buf);
}

static int set_error(json_t *o, const char *key,
                     const om_policy_watch_error_t *e) {
  char k[48];
  int rc = json_object_set_new(o, key, json_string(e ? e->message : ""));
  snprintf(k, sizeof k, "%s_at", key);
  rc |= json_object_set_new(o, k, e ? rfc3339(e->at_ms) : json_null());
  snprintf(k, sizeof k, "%s_revision", key);
  rc |= json_object_set_new(
      o, k, e ? json_integer((json_int_t)e->revision) : json_null());
  return rc;
}

int om_policy_watch_status(const om_policy_watch_t *w, json_t *o) {
  int rc = json_object_set_new(o, "source", json_string(w->source));
  rc |=
      json_object_set_new(o, "revision", json_integer((json_int_t)w->revision));
  rc |= json_object_set_new(o, "loaded_at", rfc3339(w->loaded_at_ms));
  rc |= set_error(o, "last_error", om_policy_watch_error(w, 0));
  rc |= set_error(o, "previous_error", om_policy_watch_error(w, 1));
  return rc != 0 ? -1 : 0;
}

uint64_t om_policy_watch_revision(const om_policy_watch_t *w) {
  return w->revision;
}
