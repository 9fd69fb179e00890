/*
 * om_control_ui.h: the console's files (host/control/ui/), embedded in the
 * binary by cmake/embed_ui.cmake, and the handler that serves them as
 * GET /ui (docs/CONTROL.md, "Console").
 */
#ifndef OM_CONTROL_UI_H
#define OM_CONTROL_UI_H

#include <stddef.h>

/* One embedded file: its base name, bytes (NUL after the last) and size. */
typedef struct om__ui_asset_s {
  const char *name;
  const unsigned char *data;
  size_t len;
} om__ui_asset_t;

/* Generated: every file of host/control/ui/, in glob order. */
extern const om__ui_asset_t om__ui_assets[];
extern const size_t om__ui_n_assets;

/*
 * The embedded file called name (name_len bytes, not NUL-terminated), or
 * NULL. Names are compared byte for byte: no decoding, no directories.
 */
const om__ui_asset_t *om__ui_find(const char *name, size_t name_len);

#endif /* OM_CONTROL_UI_H */
