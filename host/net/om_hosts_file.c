/*
 * om_hosts_file.c: the resolvers' test hook (om_hosts_file.h).
 */
#include "om_hosts_file.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <uv.h>

const char *om_hosts_file_path(void) {
  const char *p = getenv("OPENMESH_RESOLVE_HOSTS");
  return p != NULL && *p != '\0' ? p : NULL;
}

static int same(const struct sockaddr_storage *a,
                const struct sockaddr_storage *b) {
  if (a->ss_family != b->ss_family)
    return 0;
  if (a->ss_family == AF_INET)
    return memcmp(&((const struct sockaddr_in *)a)->sin_addr,
                  &((const struct sockaddr_in *)b)->sin_addr, 4) == 0;
  return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
}

size_t om_hosts_file_lookup(const char *path, const char *host,
                            struct sockaddr_storage *out, size_t max, char *err,
                            size_t errlen) {
  FILE *f = fopen(path, "r");
  char line[1024];
  size_t n = 0;
  if (f == NULL) {
    snprintf(err, errlen, "cannot read the hosts file %s", path);
    return 0;
  }
  while (n < max && fgets(line, sizeof line, f) != NULL) {
    char *save = NULL, *addr, *name;
    char *hash = strchr(line, '#');
    struct sockaddr_storage a;
    int dup = 0;
    if (hash != NULL)
      *hash = '\0';
    addr = strtok_r(line, " \t\r\n", &save);
    if (addr == NULL)
      continue;
    memset(&a, 0, sizeof a);
    if (uv_inet_pton(AF_INET, addr, &((struct sockaddr_in *)&a)->sin_addr) == 0)
      a.ss_family = AF_INET;
    else if (uv_inet_pton(AF_INET6, addr,
                          &((struct sockaddr_in6 *)&a)->sin6_addr) == 0)
      a.ss_family = AF_INET6;
    else
      continue;
    while ((name = strtok_r(NULL, " \t\r\n", &save)) != NULL)
      if (strcasecmp(name, host) == 0)
        break;
    if (name == NULL)
      continue;
    for (size_t i = 0; i < n && !dup; i++)
      dup = same(&out[i], &a);
    if (!dup)
      out[n++] = a;
  }
  fclose(f);
  if (n == 0)
    snprintf(err, errlen, "not found in the hosts file %s", path);
  return n;
}
