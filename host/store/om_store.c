/*
 * om_store.c: what every store shares (om_store.h): the front functions
 * that check the arguments once and dispatch to the backend,
 * configuration documents and change names.
 */
#include "om_store.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_store_subs.h"

#define CONTENT_TYPE_MAX 255

const char *om_store_change_name(om_store_change_t change) {
  switch (change) {
  case OM_STORE_NOCHANGE:
    return "nochange";
  case OM_STORE_CREATED:
    return "created";
  case OM_STORE_UPDATED:
    return "updated";
  case OM_STORE_DELETED:
    return "deleted";
  case OM_STORE_EXPIRED:
    return "expired";
  }
  return "?";
}

om_config_doc_t *om_config_doc_new(const char *name, const char *content_type,
                                   const char *body, size_t len,
                                   uint64_t revision) {
  size_t nl, cl;
  om_config_doc_t *d;
  char *p;
  if (name == NULL || content_type == NULL || (body == NULL && len != 0))
    return NULL;
  nl = strlen(name) + 1;
  cl = strlen(content_type) + 1;
  if (len > SIZE_MAX - sizeof *d - nl - cl - 1)
    return NULL;
  /* One allocation: a document is shared by every watcher as one unit. */
  d = malloc(sizeof *d + nl + cl + len + 1);
  if (d == NULL)
    return NULL;
  p = (char *)(d + 1);
  d->name = memcpy(p, name, nl);
  p += nl;
  d->content_type = memcpy(p, content_type, cl);
  p += cl;
  d->body = p;
  if (len != 0)
    memcpy(p, body, len);
  p[len] = '\0';
  d->len = len;
  d->revision = revision;
  d->refs = 1;
  return d;
}

om_config_doc_t *om_config_doc_ref(om_config_doc_t *d) {
  if (d != NULL)
    d->refs++;
  return d;
}

void om_config_doc_unref(om_config_doc_t *d) {
  if (d != NULL && --d->refs == 0)
    free(d);
}

/* ---- the front functions: check once, then call the backend ---- */

static int valid_name(const char *s) {
  return s != NULL && om_valid_name(s, strnlen(s, OM_NAME_MAX + 1));
}

static int valid_content_type(const char *s) {
  size_t n;
  if (s == NULL)
    return 0;
  n = strnlen(s, CONTENT_TYPE_MAX + 1);
  if (n == 0 || n > CONTENT_TYPE_MAX)
    return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
      return 0;
  return 1;
}

/* OM_EINVAL for no store, OM_ESTATE for a closed one, else 0. */
static int check_open(const om_store_t *s) {
  if (s == NULL)
    return OM_EINVAL;
  return s->closing ? OM_ESTATE : 0;
}

const char *om_store_name(const om_store_t *s) {
  return s != NULL ? s->ops->name : "?";
}

int om_store_put_instance(om_store_t *s, const char *service,
                          const om_instance_t *in, om_store_write_cb cb,
                          void *ud) {
  int rc = check_open(s);
  if (rc != 0)
    return rc;
  if (!valid_name(service) || in == NULL ||
      om_instance_validate(in, NULL, NULL) != 0)
    return OM_EINVAL;
  return s->ops->put_instance(s, service, in, cb, ud);
}

/* The checks of an operation on service/id: 0 or the code to return. */
static int check_instance(const om_store_t *s, const char *service,
                          const char *id) {
  int rc = check_open(s);
  if (rc != 0)
    return rc;
  return valid_name(service) && valid_name(id) ? 0 : OM_EINVAL;
}

int om_store_renew(om_store_t *s, const char *service, const char *id,
                   om_store_write_cb cb, void *ud) {
  int rc = check_instance(s, service, id);
  return rc != 0 ? rc : s->ops->renew(s, service, id, cb, ud);
}

int om_store_delete_instance(om_store_t *s, const char *service, const char *id,
                             om_store_write_cb cb, void *ud) {
  int rc = check_instance(s, service, id);
  return rc != 0 ? rc : s->ops->delete_instance(s, service, id, cb, ud);
}

int om_store_snapshot(om_store_t *s, const char *service,
                      om_store_snapshot_cb cb, void *ud) {
  int rc = check_open(s);
  if (rc != 0)
    return rc;
  if (!valid_name(service) || cb == NULL)
    return OM_EINVAL;
  return s->ops->snapshot(s, service, cb, ud);
}

int om_store_list_services(om_store_t *s, om_store_list_cb cb, void *ud) {
  int rc = check_open(s);
  if (rc != 0)
    return rc;
  if (cb == NULL)
    return OM_EINVAL;
  return s->ops->list_services(s, cb, ud);
}

int om_store_collect_empty(om_store_t *s, uint64_t idle_ms,
                           int (*keep)(void *ud, const char *service),
                           void (*gone)(void *ud, const char *service),
                           void *ud, size_t *n) {
  int rc = check_open(s);
  if (n != NULL)
    *n = 0;
  if (rc != 0)
    return rc;
  if (s->ops->collect_empty == NULL)
    return OM_ESTATE;
  return s->ops->collect_empty(s, idle_ms, keep, gone, ud, n);
}

int om_store_leases(om_store_t *s, om_store_leases_cb cb, void *ud) {
  int rc = check_open(s);
  if (rc != 0)
    return rc;
  if (cb == NULL)
    return OM_EINVAL;
  return s->ops->leases(s, cb, ud);
}

int om_store_config_put(om_store_t *s, const char *name,
                        const char *content_type, const char *body, size_t len,
                        om_store_write_cb cb, void *ud) {
  int rc = check_open(s);
  if (rc != 0)
    return rc;
  if (!valid_name(name) || !valid_content_type(content_type) ||
      (body == NULL && len != 0))
    return OM_EINVAL;
  return s->ops->config_put(s, name, content_type, body, len, cb, ud);
}

int om_store_config_get(om_store_t *s, const char *name, om_store_config_cb cb,
                        void *ud) {
  int rc = check_open(s);
  if (rc != 0)
    return rc;
  if (!valid_name(name) || cb == NULL)
    return OM_EINVAL;
  return s->ops->config_get(s, name, cb, ud);
}

static int subscribe(om_store_t *s, int kind, const char *name,
                     om_store_watch_cb cb, om_store_config_watch_cb ccb,
                     void *ud, om_store_sub_t **out) {
  int rc = check_open(s);
  if (rc != 0)
    return rc;
  if (out == NULL || (kind == OM__SUB_SERVICE ? cb == NULL : ccb == NULL) ||
      (name != NULL && !valid_name(name)))
    return OM_EINVAL;
  return om__subs_add(&s->subs, kind, name, cb, ccb, ud, out);
}

int om_store_subscribe(om_store_t *s, const char *service, om_store_watch_cb cb,
                       void *ud, om_store_sub_t **out) {
  return subscribe(s, OM__SUB_SERVICE, service, cb, NULL, ud, out);
}

int om_store_subscribe_config(om_store_t *s, const char *name,
                              om_store_config_watch_cb cb, void *ud,
                              om_store_sub_t **out) {
  return subscribe(s, OM__SUB_CONFIG, name, NULL, cb, ud, out);
}

void om_store_unsubscribe(om_store_t *s, om_store_sub_t *sub) {
  if (s == NULL || sub == NULL || s->closing)
    return;
  om__subs_remove(&s->subs, sub);
}

void om_store_status(om_store_t *s, om_store_status_t *out) {
  if (s == NULL || out == NULL)
    return;
  s->ops->status(s, out);
}

void om_store_close(om_store_t *s, void (*done)(void *ud), void *ud) {
  if (s == NULL || s->closing)
    return;
  s->closing = 1;
  s->ops->close(s, done, ud);
}

void *om__store_grow(void *arr, size_t *cap, size_t need, size_t elem) {
  size_t c;
  void *p;
  if (need <= *cap)
    return arr;
  c = *cap != 0 ? *cap : 8;
  while (c < need) {
    if (c > SIZE_MAX / 2 / elem)
      return NULL;
    c *= 2;
  }
  p = realloc(arr, c * elem);
  if (p != NULL)
    *cap = c;
  return p;
}
