/*
 * om_errno.h: every error OpenMesh's core can return, listed once.
 *
 * Functions in core/ return 0 (OM_OK) or a negative code from this list.
 * Names and messages are generated from the same X-macro, and the Lua module
 * exports them as `openmesh.errors`, so C, Lua and logs share one vocabulary.
 * (The pattern is libuv's UV_ERRNO_MAP.)
 */
#ifndef OM_ERRNO_H
#define OM_ERRNO_H

#include <stddef.h>

/* XX(name, value, message) */
#define OM_ERRNO_MAP(XX)                                                       \
  XX(EINVAL, -1, "invalid argument")                                           \
  XX(ENOMEM, -2, "out of memory")                                              \
  XX(ENOPEERS, -3, "no eligible peers")                                        \
  XX(EOVERLOAD, -4, "overloaded: in-flight limit and queue are full")          \
  XX(EDEADLINE, -5, "deadline exceeded")                                       \
  XX(EDUPLICATE, -6, "duplicate id")                                           \
  XX(ETOOBIG, -7, "input exceeds its size limit")                              \
  XX(EPARSE, -8, "malformed input")                                            \
  XX(ENOTFOUND, -9, "not found")                                               \
  XX(ECIRCUIT, -10, "circuit open")                                            \
  XX(EBUDGET, -11, "retry budget exhausted")                                   \
  XX(ESTATE, -12, "operation not valid in the current state")                  \
  XX(ERANGE, -13, "value out of range")                                        \
  XX(EPOLICY, -14, "policy rejected or failed")                                \
  XX(EIO, -15, "input/output error")                                           \
  XX(EOUTCOME, -16, "outcome unknown: the peer went away after the request")

typedef enum {
  OM_OK = 0,
#define OM__ERRNO_ENUM(name, value, msg) OM_##name = (value),
  OM_ERRNO_MAP(OM__ERRNO_ENUM)
#undef OM__ERRNO_ENUM
} om_errno_t;

/*
 * om_err_name: the symbolic name of an error code without the OM_ prefix
 * ("EINVAL"), "OK" for 0, "EUNKNOWN" for a value not in the map. Never NULL;
 * the string is static.
 */
const char *om_err_name(int err);

/*
 * om_strerror: a short human-readable message for an error code. Never NULL;
 * the string is static.
 */
const char *om_strerror(int err);

/*
 * om_errbuf: format a message into a caller's buffer: the way every
 * function that takes `char *err, size_t errlen` reports why. err may be
 * NULL or errlen 0 (nothing written); otherwise the result is always
 * NUL-terminated, cut to fit.
 */
void om_errbuf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* OM_ERRNO_H */
