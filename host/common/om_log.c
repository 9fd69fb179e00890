/* om_log.c: JSON log lines (see om_log.h). */
#include "om_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

static om_log_level_t min_level = OM_LOG_INFO; /* host-global, set once */

void om_log_set_level(om_log_level_t level) {
  min_level = level;
}

static const char *const level_names[] = {"debug", "info", "warn", "error"};

int om_log_set_level_name(const char *name) {
  for (int l = OM_LOG_DEBUG; l <= OM_LOG_ERROR; l++)
    if (strcmp(name, level_names[l]) == 0) {
      min_level = (om_log_level_t)l;
      return 0;
    }
  return -1;
}

int om_log_enabled(om_log_level_t level) {
  return level >= min_level;
}

void om_log(om_log_level_t level, const char *event, ...) {
  struct timespec ts;
  char stamp[64];
  struct tm tm;
  va_list ap;
  json_t *o;
  char *line;
  if (level < min_level)
    return;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
           tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
           tm.tm_sec, ts.tv_nsec / 1000000);
  o = json_object();
  if (o == NULL)
    return;
  json_object_set_new(o, "ts", json_string(stamp));
  json_object_set_new(o, "level", json_string(level_names[level]));
  json_object_set_new(o, "event", json_string(event));
  va_start(ap, event);
  for (;;) {
    const char *k = va_arg(ap, const char *), *v;
    if (k == NULL)
      break;
    v = va_arg(ap, const char *);
    json_object_set_new(o, k, v ? json_string(v) : json_null());
  }
  va_end(ap);
  line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (line != NULL) {
    fprintf(stderr, "%s\n", line);
    free(line);
  }
  json_decref(o);
}
