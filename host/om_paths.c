/* om_paths.c: see om_paths.h. */
#include "om_paths.h"

#include <stdlib.h>

const char *om_lib_dir(void) {
  const char *env = getenv("OPENMESH_LIB_DIR");
  return env != NULL && *env != '\0' ? env : OM_SOURCE_DIR "/lua";
}
