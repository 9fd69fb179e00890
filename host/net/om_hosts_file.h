/*
 * om_hosts_file.h: the resolvers' test hook, one reader for the proxy's
 * peers by name and the gateway's routes by name (docs/PROXY.md "Peers by
 * name", docs/EGRESS.md "Provider connections").
 *
 * With OPENMESH_RESOLVE_HOSTS=FILE in the environment, a name is looked
 * up in FILE (the /etc/hosts format: an address, then names, `#` starts a
 * comment) instead of the system resolver, so a test can give a name the
 * addresses it needs (two, the first refusing) without touching the
 * machine's own configuration. The file is read on every lookup, off the
 * loop (the callers run this on libuv's thread pool).
 */
#ifndef OM_HOSTS_FILE_H
#define OM_HOSTS_FILE_H

#include <stddef.h>
#include <sys/socket.h>

/* The hook's file, or NULL when the system resolver answers. */
const char *om_hosts_file_path(void);

/*
 * om_hosts_file_lookup: the addresses of host (case-insensitive) in the
 * file at path, in file order, each at most once, into out[0..max) (port
 * 0). Returns how many; 0 with err set (a sentence) when the file cannot
 * be read or has none.
 */
size_t om_hosts_file_lookup(const char *path, const char *host,
                            struct sockaddr_storage *out, size_t max, char *err,
                            size_t errlen);

#endif /* OM_HOSTS_FILE_H */
