/*
 * om_http_detab: http-parser fed each HTAB as a SP.
 *
 * http-parser 2.9, the second opinion on every request (om_http_server.c)
 * and on chunked responses (om_upstream.c), refuses HTAB in three places
 * where RFC 9110 allows it and it allows SP: trailing OWS after a
 * Content-Length or Transfer-Encoding value (RFC 9110 5.6.3, 8.6; RFC 9112
 * 6.1) and BWS before a chunk-ext (RFC 9112 7.1.1). Fed each HTAB as a SP,
 * it reads those as the RFC does. Where the grammar allows no whitespace
 * (a request-target, a field name, a chunk-size, before a chunk's CRLF)
 * our own scanners have already refused the HTAB, and a SP there is
 * refused by http-parser too; in field values and chunk data it changes
 * nothing the cross-checks look at (lengths, offsets, framing).
 */
#ifndef OM_HTTP_DETAB_H
#define OM_HTTP_DETAB_H

#include <stddef.h>
#include <http_parser.h>

/* Called before each slice of the copy is fed: copy holds len bytes that
 * stand for orig[0..len), so a data callback's pointer into copy can be
 * mapped back to the original. */
typedef void (*om_http_detab_slice_fn)(void *arg, const char *copy,
                                       const char *orig, size_t len);

/*
 * http_parser_execute over p[0..n) with each HTAB fed as a SP. Up to the
 * first HTAB the bytes go in as they are; from there through a 4 KiB copy
 * on the stack, a slice at a time, so a call costs a few executes however
 * many HTABs there are. Returns the bytes taken, as http_parser_execute
 * does (fewer on an error or a pause). Never feeds 0 bytes (http-parser
 * reads that as EOF), so n == 0 feeds nothing and returns 0. on_slice may
 * be NULL.
 */
size_t om_http_detab_execute(http_parser *hp, const http_parser_settings *st,
                             const char *p, size_t n,
                             om_http_detab_slice_fn on_slice, void *arg);

#endif
