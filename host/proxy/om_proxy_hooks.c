/*
 * om_proxy_hooks.c: what the proxy lends to the parts that feed it: its
 * metrics registry and a member of /status (om_proxy.h).
 */
#include <string.h>

#include "om_errno.h"
#include "om_proxy_internal.h"

struct om_metrics_s *om_proxy_metrics(om_proxy_t *p) {
  return p != NULL ? p->metrics : NULL;
}

int om_proxy_set_status_extra(om_proxy_t *p, const char *key,
                              om_proxy_status_fn fn, void *ud) {
  size_t n;
  if (p == NULL || key == NULL || (n = strlen(key)) >= sizeof p->status_key ||
      n == 0)
    return OM_EINVAL;
  memcpy(p->status_key, key, n + 1);
  p->status_fn = fn;
  p->status_ud = ud;
  return 0;
}
