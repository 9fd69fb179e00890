/* om_cli_util.h: what the `openmesh` subcommands share: flag parsing and
 * the signals of a long-running server. */
#ifndef OM_CLI_UTIL_H
#define OM_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <uv.h>

/*
 * om_parse_duration_ms: a duration flag ("500ms", "10s", "2m", "1h") to
 * milliseconds.
 *
 * Grammar, strict: 1*DIGIT unit, unit one of "ms", "s", "m", "h"
 * (lower-case), nothing before or after. The bare "0" is also accepted
 * (zero is zero in every unit; `--drain 0`). Refused, so that a typo never
 * becomes a surprising value: a number without a unit ("10": seconds or
 * milliseconds?), signs, whitespace, fractions ("1.5s": write "1500ms"),
 * compound forms ("1m30s": write "90s"), other units, and values whose
 * milliseconds do not fit in 64 bits.
 *
 * Returns 0 and sets *out_ms; OM_EPARSE when malformed; OM_ERANGE on
 * overflow; OM_EINVAL for a NULL argument. *out_ms is untouched on error.
 */
int om_parse_duration_ms(const char *s, uint64_t *out_ms);

/*
 * om_read_token_file: the bearer token in path: its first line with
 * surrounding whitespace trimmed, which must be a b64token (RFC 6750
 * section 2.1: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" )
 * *"="), so it can be sent in an Authorization header as is. The token is
 * copied NUL-terminated into out (cap bytes). Returns 0; OM_ENOTFOUND
 * when the file cannot be opened or read; OM_EPARSE when the first line
 * is empty or not a b64token; OM_ETOOBIG when the token does not fit;
 * OM_EINVAL for NULL arguments. On error out holds "" (cap > 0) and why
 * (may be NULL) points to a static reason.
 */
int om_read_token_file(const char *path, char *out, size_t cap,
                       const char **why);

/*
 * om_parse_listen: "127.0.0.1:7600", "[::1]:7600" (an IPv6 literal needs
 * brackets) or "localhost:7600" (127.0.0.1) -> the address literal
 * (NUL-terminated, at most cap - 1 bytes) and the port (0-65535; 0: pick
 * one). Returns 0, or -1 when s is not ADDRESS:PORT with a numeric
 * address.
 */
int om_parse_listen(const char *s, char *host, size_t cap, int *port);

/*
 * The signals of a server command (control, proxy, egress): SIGTERM and
 * SIGINT drain and stop (on_stop), SIGHUP reloads (on_hup). Each handle's
 * data is `data`. om_cli_signals_close closes the three handles (their
 * closes complete on the loop); it is idempotent and a no-op before start.
 */
typedef struct om_cli_signals_s {
  uv_signal_t term, intr, hup;
  int open;
} om_cli_signals_t;

void om_cli_signals_start(uv_loop_t *loop, om_cli_signals_t *s,
                          uv_signal_cb on_stop, uv_signal_cb on_hup,
                          void *data);
void om_cli_signals_close(om_cli_signals_t *s);

/*
 * The usage errors of `openmesh CMD`: print "openmesh CMD: " and fmt (one
 * %s, filled with arg), then "(see openmesh CMD --help)", to stderr.
 * Returns OM_EXIT_USAGE, so a flag loop can `return om_cli_fail_usage(...)`.
 */
int om_cli_fail_usage(const char *cmd, const char *fmt, const char *arg);

/*
 * The end of a server command's option switch, the same for every one:
 * 'L' is --log-level (an unknown level is a usage error), 'h' prints usage
 * to stdout (exit 0), anything else (getopt already named it) prints usage
 * to stderr (exit 2). Returns -1 after a handled --log-level (go on
 * parsing), else the exit code to return.
 */
int om_cli_common_option(const char *cmd, int c, const char *arg,
                         void (*usage)(FILE *out));

/* After getopt_long: a server command takes no operands. Returns
 * OM_EXIT_OK, or a usage error naming the first one. */
int om_cli_no_operands(const char *cmd, int argc, char **argv);

/*
 * --store: "memory", or a Redis URL redis://HOST:PORT/DB (as
 * om_store_redis_parse_url reads it). Sets *is_redis and returns
 * OM_EXIT_OK; a usage error that names the flag and why otherwise.
 */
int om_cli_store_arg(const char *cmd, const char *store, int *is_redis);

#endif /* OM_CLI_UTIL_H */
