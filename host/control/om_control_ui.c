/*
 * om_control_ui.c: GET /ui, the console: one page, its stylesheet and its
 * script, embedded in the binary (om_control_ui.h), that an operator's
 * browser runs against this plane's own read API (docs/CONTROL.md,
 * "Console").
 *
 * The files hold no data, so they are served without auth; the page asks
 * for a token and sends it with its own requests (the read role is
 * enough). Every answer carries a Content-Security-Policy that allows
 * only this origin's script, style and fetches: no inline script, no
 * external resource, no frame. Even if a hostile name or metadata value
 * ever reached the DOM as markup, its script would not run.
 */
#include "om_control_ui.h"
#include "om_control_internal.h"

/* What the page may load and do. 'self' is this plane's origin only. */
#define UI_CSP                                                                 \
  "default-src 'none'; script-src 'self'; style-src 'self'; "                  \
  "connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; "  \
  "frame-ancestors 'none'"

const om__ui_asset_t *om__ui_find(const char *name, size_t name_len) {
  for (size_t i = 0; i < om__ui_n_assets; i++)
    if (strlen(om__ui_assets[i].name) == name_len &&
        memcmp(om__ui_assets[i].name, name, name_len) == 0)
      return &om__ui_assets[i];
  return NULL;
}

static const char *media_type_of(const char *name) {
  const char *dot = strrchr(name, '.');
  if (dot != NULL && strcmp(dot, ".html") == 0)
    return "text/html; charset=utf-8";
  if (dot != NULL && strcmp(dot, ".css") == 0)
    return "text/css; charset=utf-8";
  if (dot != NULL && strcmp(dot, ".js") == 0)
    return "text/javascript; charset=utf-8";
  return "application/octet-stream";
}

/*
 * Serve embedded file name (name_len bytes; NULL: the page itself) with
 * the console's headers, or 404 not_found. The page's URL may carry the
 * token as ?access_token=: no-referrer keeps it out of the Referer of the
 * page's own requests.
 */
void om__h_ui(ctx_t *x, const char *name, size_t name_len) {
  const om__ui_asset_t *a = name != NULL ? om__ui_find(name, name_len)
                                         : om__ui_find("index.html", 10);
  om_http_header_t h[4];
  if (a == NULL) {
    reply_error(x, REJ_NOT_FOUND, NULL, "no console file %.*s",
                (int)(name_len > 128 ? 128 : name_len), name);
    return;
  }
  memset(h, 0, sizeof h);
  h[0].name = "Content-Security-Policy";
  h[0].value = UI_CSP;
  h[1].name = "X-Content-Type-Options";
  h[1].value = "nosniff";
  h[2].name = "Referrer-Policy";
  h[2].value = "no-referrer";
  h[3].name = "X-Frame-Options";
  h[3].value = "DENY";
  om__reply(x, 200, media_type_of(a->name), (const char *)a->data, a->len, h,
            4);
}
