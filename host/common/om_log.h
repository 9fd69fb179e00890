/*
 * om_log.h: one JSON object per line on stderr, for events worth an
 * operator's time. Fields are key/value string pairs; values are escaped.
 */
#ifndef OM_LOG_H
#define OM_LOG_H

typedef enum {
  OM_LOG_DEBUG,
  OM_LOG_INFO,
  OM_LOG_WARN,
  OM_LOG_ERROR
} om_log_level_t;

/* Lines below this level are dropped (default OM_LOG_INFO). */
void om_log_set_level(om_log_level_t level);

/* The same by name ("debug", "info", "warn", "error"), as --log-level
 * takes it. Returns 0, or -1 for another name (the level is unchanged). */
int om_log_set_level_name(const char *name);

/* 1 when a line at level would be written (skip building one that is
 * not). */
int om_log_enabled(om_log_level_t level);

/*
 * om_log: write {"ts":..., "level":..., "event": event, k1: v1, ...} for a
 * NULL-terminated list of const char * key/value pairs.
 */
void om_log(om_log_level_t level, const char *event, ...);

#endif /* OM_LOG_H */
