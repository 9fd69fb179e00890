/* om_paths.h: where the host finds the Lua library shipped with it. */
#ifndef OM_PATHS_H
#define OM_PATHS_H

/*
 * The directory holding the openmesh Lua modules (openmesh.contract, .policy,
 * .testing): $OPENMESH_LIB_DIR if set, else the source tree's lua/ (the
 * binary runs from its build tree). The string is static or from getenv.
 */
const char *om_lib_dir(void);

/*
 * The default traffic policy: policies/traffic.lua from the working
 * directory when it is there (a checkout), else the source tree's.
 */
const char *om_default_policy(void);

#endif /* OM_PATHS_H */
