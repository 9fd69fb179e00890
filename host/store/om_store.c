/*
 * om_store.c: what every store shares (om_store.h): configuration
 * documents and change names.
 */
#include "om_store.h"

#include <stdlib.h>
#include <string.h>

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
