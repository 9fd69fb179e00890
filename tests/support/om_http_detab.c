/* om_http_detab: http-parser fed each HTAB as a SP (om_http_detab.h). */
#include "om_http_detab.h"
#include <string.h>

#define SLICE 4096

size_t om_http_detab_execute(http_parser *hp, const http_parser_settings *st,
                             const char *p, size_t n,
                             om_http_detab_slice_fn on_slice, void *arg) {
  char sp[SLICE];
  const char *tab = n > 0 ? memchr(p, '\t', n) : NULL;
  size_t done, len, i, k;
  if (tab == NULL)
    return n > 0 ? http_parser_execute(hp, st, p, n) : 0;
  done = (size_t)(tab - p);
  if (done > 0) {
    k = http_parser_execute(hp, st, p, done);
    if (k != done || HTTP_PARSER_ERRNO(hp) != HPE_OK)
      return k;
  }
  while (done < n) {
    len = n - done < sizeof sp ? n - done : sizeof sp;
    for (i = 0; i < len; i++)
      sp[i] = p[done + i] == '\t' ? ' ' : p[done + i];
    if (on_slice != NULL)
      on_slice(arg, sp, p + done, len);
    k = http_parser_execute(hp, st, sp, len);
    done += k;
    if (k != len || HTTP_PARSER_ERRNO(hp) != HPE_OK)
      break;
  }
  return done;
}
