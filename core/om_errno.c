/* om_errno.c: names and messages generated from OM_ERRNO_MAP. */
#include "om_errno.h"

#include <stdarg.h>
#include <stdio.h>

const char *om_err_name(int err) {
  switch (err) {
  case OM_OK:
    return "OK";
#define OM__ERRNO_NAME(name, value, msg)                                       \
  case OM_##name:                                                              \
    return #name;
    OM_ERRNO_MAP(OM__ERRNO_NAME)
#undef OM__ERRNO_NAME
  default:
    return "EUNKNOWN";
  }
}

const char *om_strerror(int err) {
  switch (err) {
  case OM_OK:
    return "success";
#define OM__ERRNO_MSG(name, value, msg)                                        \
  case OM_##name:                                                              \
    return msg;
    OM_ERRNO_MAP(OM__ERRNO_MSG)
#undef OM__ERRNO_MSG
  default:
    return "unknown error";
  }
}

void om_errbuf(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  if (err == NULL || errlen == 0)
    return;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}
