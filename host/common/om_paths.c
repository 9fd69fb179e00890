/* om_paths.c: see om_paths.h. */
#include "om_paths.h"

#include <stdlib.h>
#include <unistd.h>

const char *om_lib_dir(void) {
  const char *env = getenv("OPENMESH_LIB_DIR");
  return env != NULL && *env != '\0' ? env : OM_SOURCE_DIR "/lua";
}

const char *om_default_policy(void) {
  static const char rel[] = "policies/traffic.lua";
  return access(rel, R_OK) == 0 ? rel : OM_SOURCE_DIR "/policies/traffic.lua";
}
