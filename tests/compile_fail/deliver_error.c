/*
 * deliver_error.c: the typed boundary of egress (host/egress/om_connector.h)
 * holds.
 *
 * Handing an egress error (its internal cause, never meant for a person) to
 * a connector must be a compile error, not something a review catches.
 * With -DOM_COMPILE_OK this file makes the valid call (an agent message)
 * and compiles; without it, it makes the same call with an
 * om_egress_error_t * and no cast, and the compiler must refuse it.
 * CTest asserts both (CMakeLists.txt, "Compile-failure tests"): the test
 * compile_ok_deliver_error must compile, compile_fail_deliver_error must
 * fail with a diagnostic matching the expect line below.
 */
/* expect: incompatible[ -]pointer[ -]type */
#include "om_connector.h"
#include "om_message.h"

void on_done(void *ud, int status, size_t parts_sent);
void on_done(void *ud, int status, size_t parts_sent) {
  (void)ud;
  (void)status;
  (void)parts_sent;
}

int send_reply(om_connector_t *c, const om_agent_message_t *msg,
               om_egress_error_t *error);
int send_reply(om_connector_t *c, const om_agent_message_t *msg,
               om_egress_error_t *error) {
  (void)error;
  (void)msg;
#ifdef OM_COMPILE_OK
  return om_connector_deliver(c, msg, on_done, NULL);
#else
  return om_connector_deliver(c, error, on_done, NULL);
#endif
}
