/* om_cli_control.c: several --control URLs (see om_cli_control.h). */
#include "om_cli_control.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "om_cli.h"
#include "om_cli_util.h"
#include "om_url.h"

/* Why url cannot be a control-plane base URL, or NULL: the one URL rule
 * of instance URLs (om_url.h), which also refuses a query and a fragment
 * (the API paths are appended to it). */
static const char *url_problem(const char *url) {
  om_url_t u;
  const char *why = "is invalid";
  return om_url_parse(url, &u, &why) == 0 ? NULL : why;
}

/* Length without trailing '/'. */
static size_t trimmed_len(const char *url) {
  size_t n = strlen(url);
  while (n > 0 && url[n - 1] == '/')
    n--;
  return n;
}

/* Where the path starts (or the end): past "scheme://authority". */
static size_t path_start(const char *url, size_t len) {
  const char *p = strstr(url, "://");
  size_t i = p != NULL ? (size_t)(p - url) + 3 : 0;
  while (i < len && url[i] != '/')
    i++;
  return i;
}

/* One plane, however it is spelled: RFC 3986 section 6.2.2.1, scheme and
 * host compare case-insensitively, the path exactly; a trailing '/' is
 * what every client strips before appending /v1/... */
static int same_plane(const char *a, const char *b) {
  size_t la = trimmed_len(a), lb = trimmed_len(b);
  size_t pa = path_start(a, la), pb = path_start(b, lb);
  return pa == pb && la == lb && strncasecmp(a, b, pa) == 0 &&
         memcmp(a + pa, b + pb, la - pa) == 0;
}

int om_cli_controls_add(const char *cmd, om_cli_controls_t *c, char *value) {
  char *item = value;
  size_t n = strlen(value);
  if (n == 0 || value[0] == ',' || value[n - 1] == ',' ||
      strstr(value, ",,") != NULL)
    return om_cli_fail_usage(cmd,
                             "--control: '%s' has an empty item (a comma "
                             "too many?)",
                             value);
  for (;;) {
    char *comma = strchr(item, ',');
    if (comma != NULL)
      *comma = '\0';
    const char *why = url_problem(item);
    if (why != NULL) {
      char msg[OM_URL_MAX_LEN + 128];
      snprintf(msg, sizeof msg, "--control: '%s': url %s", item, why);
      return om_cli_fail_usage(cmd, "%s", msg);
    }
    for (size_t i = 0; i < c->n; i++)
      if (same_plane(c->urls[i], item))
        return om_cli_fail_usage(cmd, "--control: '%s' is given twice", item);
    if (c->n == OM_CLI_CONTROL_MAX)
      return om_cli_fail_usage(cmd, "--control: more than %s control planes",
                               "16");
    c->urls[c->n++] = item;
    if (comma == NULL)
      return OM_EXIT_OK;
    item = comma + 1;
  }
}

char *om_cli_controls_join(const om_cli_controls_t *c, char *out, size_t cap) {
  size_t used = 0;
  if (cap == 0)
    return out;
  out[0] = '\0';
  for (size_t i = 0; i < c->n && used + 1 < cap; i++) {
    int n =
        snprintf(out + used, cap - used, "%s%s", i > 0 ? "," : "", c->urls[i]);
    if (n < 0)
      break;
    used += (size_t)n < cap - used ? (size_t)n : cap - used - 1;
  }
  return out;
}
