/* om_file_watch.c: see om_file_watch.h. */
#include "om_file_watch.h"

#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_log.h"

#define DEF_DEBOUNCE_MS 200u

/* One watched directory and the names in it that matter. */
typedef struct {
  uv_fs_event_t ev;
  struct om_file_watch_s *owner;
  char *dir;
  const char *base[OM_FILE_WATCH_MAX];
  size_t n_base;
} dir_watch_t;

struct om_file_watch_s {
  uv_loop_t *loop;
  om_file_watch_fn cb;
  void *ud;
  char *path[OM_FILE_WATCH_MAX]; /* copies: base names point into them */
  size_t n_path;
  dir_watch_t d[OM_FILE_WATCH_MAX];
  size_t n_d;
  uv_timer_t debounce;
  uint64_t debounce_ms;
  int handles; /* open handles; freed at 0 once closing */
  int closing;
};

static void watch_free(om_file_watch_t *w) {
  for (size_t i = 0; i < w->n_path; i++)
    free(w->path[i]);
  for (size_t i = 0; i < w->n_d; i++)
    free(w->d[i].dir);
  free(w);
}

static void on_handle_closed(uv_handle_t *h) {
  om_file_watch_t *w = h->data;
  if (--w->handles == 0 && w->closing)
    watch_free(w);
}

static void on_debounce(uv_timer_t *h) {
  om_file_watch_t *w = h->data;
  if (!w->closing)
    w->cb(w->ud);
}

static void on_event(uv_fs_event_t *h, const char *filename, int events,
                     int status) {
  dir_watch_t *d = h->data;
  int match = filename == NULL; /* unknown: maybe ours */
  (void)events;
  if (status < 0 || d->owner->closing)
    return;
  for (size_t i = 0; i < d->n_base && !match; i++)
    match = strcmp(filename, d->base[i]) == 0;
  if (match)
    uv_timer_start(&d->owner->debounce, on_debounce, d->owner->debounce_ms, 0);
}

/* Split path into a malloc'd directory and a pointer to its base name. */
static char *dir_of(const char *path, const char **base) {
  const char *slash = strrchr(path, '/');
  char *dir;
  if (slash == NULL) {
    *base = path;
    return strdup(".");
  }
  *base = slash + 1;
  if (slash == path)
    return strdup("/");
  dir = malloc((size_t)(slash - path) + 1);
  if (dir != NULL) {
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
  }
  return dir;
}

/* Add path's directory (once) and its base name. */
static int watch_path(om_file_watch_t *w, const char *path, char *err,
                      size_t errlen) {
  const char *base;
  char *dir = dir_of(path, &base);
  dir_watch_t *d = NULL;
  int rc;
  if (dir == NULL) {
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  for (size_t k = 0; k < w->n_d; k++)
    if (strcmp(w->d[k].dir, dir) == 0)
      d = &w->d[k];
  if (d != NULL) {
    free(dir);
    d->base[d->n_base++] = base;
    return 0;
  }
  d = &w->d[w->n_d++];
  d->owner = w;
  d->dir = dir;
  d->base[0] = base;
  d->n_base = 1;
  uv_fs_event_init(w->loop, &d->ev);
  d->ev.data = d;
  w->handles++;
  rc = uv_fs_event_start(&d->ev, on_event, dir, 0);
  if (rc != 0) {
    om_errbuf(err, errlen, "%s: cannot watch: %s", dir, uv_strerror(rc));
    return OM_EINVAL;
  }
  return 0;
}

int om_file_watch_start(uv_loop_t *loop, const char *const *paths, size_t n,
                        uint64_t debounce_ms, om_file_watch_fn cb, void *ud,
                        om_file_watch_t **out, char *err, size_t errlen) {
  om_file_watch_t *w;
  int rc = 0;
  if (loop == NULL || paths == NULL || cb == NULL || out == NULL || n == 0 ||
      n > OM_FILE_WATCH_MAX) {
    om_errbuf(err, errlen, "invalid arguments");
    return OM_EINVAL;
  }
  w = calloc(1, sizeof *w);
  if (w == NULL) {
    om_errbuf(err, errlen, "out of memory");
    return OM_ENOMEM;
  }
  w->loop = loop;
  w->cb = cb;
  w->ud = ud;
  w->debounce_ms = debounce_ms ? debounce_ms : DEF_DEBOUNCE_MS;
  uv_timer_init(loop, &w->debounce);
  w->debounce.data = w;
  w->handles++;
  for (size_t i = 0; i < n && rc == 0; i++) {
    if (paths[i] == NULL)
      continue;
    if ((w->path[w->n_path] = strdup(paths[i])) == NULL) {
      om_errbuf(err, errlen, "out of memory");
      rc = OM_ENOMEM;
      break;
    }
    rc = watch_path(w, w->path[w->n_path++], err, errlen);
  }
  if (rc == 0 && w->n_path == 0) {
    om_errbuf(err, errlen, "no file to watch");
    rc = OM_EINVAL;
  }
  if (rc != 0) {
    om_file_watch_close(w);
    return rc;
  }
  *out = w;
  return 0;
}

void om_file_watch_close(om_file_watch_t *w) {
  if (w == NULL || w->closing)
    return;
  w->closing = 1;
  uv_timer_stop(&w->debounce);
  uv_close((uv_handle_t *)&w->debounce, on_handle_closed);
  for (size_t i = 0; i < w->n_d; i++) {
    uv_fs_event_stop(&w->d[i].ev);
    w->d[i].ev.data = w;
    uv_close((uv_handle_t *)&w->d[i].ev, on_handle_closed);
  }
}
