/*
 * om_deadline.c: the one out-of-line part of the deadline, input checking.
 * Everything on the hot path is inline in om_deadline.h.
 */
#include "om_deadline.h"

#include <stddef.h>

#include "om_errno.h"

int om_deadline_from_signed(uint64_t now_ns, int64_t budget_ns,
                            om_deadline_t *out) {
  if (out == NULL || budget_ns < 0)
    return OM_EINVAL;
  *out = om_deadline_after(now_ns, (uint64_t)budget_ns);
  return 0;
}
