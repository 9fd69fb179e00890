/*
 * om_cli_control.h: the --control flag of the client commands (register,
 * proxy): one or more control-plane base URLs, given by repeating the
 * flag, as a comma list, or both. Clients fail over between them in the
 * order given (docs/CONTROL.md "High availability").
 */
#ifndef OM_CLI_CONTROL_H
#define OM_CLI_CONTROL_H

#include <stddef.h>

/* More planes than this is a configuration mistake, not high availability. */
#define OM_CLI_CONTROL_MAX 16

typedef struct om_cli_controls_s {
  const char *urls[OM_CLI_CONTROL_MAX]; /* into the flag values, in order */
  size_t n;
} om_cli_controls_t;

/*
 * om_cli_controls_add: append the URLs of one --control value to c. value
 * is a URL or a comma list of URLs ("http://a:7600,http://b:7600"); it is
 * cut in place at the commas (argv is the command's to edit), and c keeps
 * pointers into it. Each item must be an absolute http:// or https:// URL
 * with a host and without query or fragment (the API paths are appended
 * to it), as the watch client requires of its base URL. Refused, with a
 * message on stderr naming the item and an OM_EXIT_USAGE return: an empty
 * item ("a,,b", a leading or trailing comma, ""), a bad URL, a URL given
 * twice (compared without trailing '/', scheme and host case-insensitive),
 * more than OM_CLI_CONTROL_MAX in all. Returns OM_EXIT_OK otherwise. On
 * error c may hold the items before the bad one: the command exits.
 */
int om_cli_controls_add(const char *cmd, om_cli_controls_t *c, char *value);

/*
 * om_cli_controls_join: the URLs as one comma list into out (cap bytes,
 * NUL-terminated, truncated if needed), for log lines. Returns out.
 */
char *om_cli_controls_join(const om_cli_controls_t *c, char *out, size_t cap);

#endif /* OM_CLI_CONTROL_H */
