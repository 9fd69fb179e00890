/*
 * om_cli_tls.h: the listener TLS flags every server command shares
 * (--tls-cert FILE --tls-key FILE: HTTPS; --tls-client-ca FILE: ask for
 * and verify client certificates), their usage rules and the start-up
 * load that turns a bad file into exit 2.
 */
#ifndef OM_CLI_TLS_H
#define OM_CLI_TLS_H

#include <getopt.h>
#include <stdio.h>

#include <uv.h>

#include "om_curl_uv.h"
#include "om_http_tls.h"

/* getopt_long values, out of the range of the commands' own letters */
enum {
  OM_CLI_OPT_TLS_CERT = 0x7401,
  OM_CLI_OPT_TLS_KEY,
  OM_CLI_OPT_TLS_CLIENT_CA,
  OM_CLI_OPT_CONTROL_CA,
  OM_CLI_OPT_CONTROL_CERT,
  OM_CLI_OPT_CONTROL_KEY,
};

/* The rows of a command's option table. */
#define OM_CLI_TLS_LONGOPTS                                                    \
  {"tls-cert", required_argument, NULL, OM_CLI_OPT_TLS_CERT},                  \
      {"tls-key", required_argument, NULL, OM_CLI_OPT_TLS_KEY}, {              \
    "tls-client-ca", required_argument, NULL, OM_CLI_OPT_TLS_CLIENT_CA         \
  }

/* The lines of a command's help text, the descriptions at column 27 plus
 * the spaces in P (a string literal: "" for 27, " " for 28...); the
 * commands use the _27, _28 and _30 forms below. */
#define OM__CLI_TLS_IND "                           "
#define OM__CLI_TLS_HELP(P)                                                    \
  "  --tls-cert FILE          " P                                              \
  "serve HTTPS with this certificate (PEM,\n" OM__CLI_TLS_IND P                \
  "the chain after the leaf); needs --tls-key\n"                               \
  "  --tls-key FILE           " P "the certificate's private key (PEM)\n"      \
  "  --tls-client-ca FILE     " P                                              \
  "ask for client certificates and verify\n" OM__CLI_TLS_IND P                 \
  "them against these CAs (PEM); needs\n" OM__CLI_TLS_IND P                    \
  "--tls-cert. The files are reloaded on\n" OM__CLI_TLS_IND P                  \
  "SIGHUP and when they change; a bad file\n" OM__CLI_TLS_IND P                \
  "keeps the last good\n"

#define OM_CLI_TLS_HELP_27 OM__CLI_TLS_HELP("")
#define OM_CLI_TLS_HELP_28 OM__CLI_TLS_HELP(" ")
#define OM_CLI_TLS_HELP_30 OM__CLI_TLS_HELP("   ")

typedef struct om_cli_tls_s {
  const char *cert, *key, *client_ca;
  /* the ALPN protocols the listener offers (om_http_tls_opts_t.alpn):
   * set by the command, not a flag; NULL: http/1.1 */
  const char *alpn;
} om_cli_tls_t;

/* c is one of the TLS options: store arg and return 1; else 0. */
int om_cli_tls_option(om_cli_tls_t *t, int c, const char *arg);

/*
 * After parsing: the usage rules (a certificate without its key or the
 * reverse, a client CA without a certificate: exit 2 with a message).
 * OM_EXIT_OK otherwise.
 */
int om_cli_tls_check(const char *cmd, const om_cli_tls_t *t);

/*
 * Load the files (NULL *out when no --tls-cert was given): a file that is
 * missing, unreadable, not PEM of its kind, or a key that does not match
 * the certificate prints "openmesh CMD: --tls-key FILE: why" and returns
 * OM_EXIT_USAGE. client_optional: with --tls-client-ca, a client without a
 * certificate is still served (anonymous; see om_http_tls_opts_t). The
 * files are watched for changes. OM_EXIT_OK with *out (the caller closes
 * it with om_http_tls_close once the servers that use it are closed).
 */
int om_cli_tls_load(const char *cmd, uv_loop_t *loop, const om_cli_tls_t *t,
                    int client_optional, om_http_tls_t **out);

/* ---- clients of an HTTPS control plane ---- */

/*
 * --control-ca FILE (trust for the planes' certificates; default the
 * system store), --control-cert FILE --control-key FILE (a client
 * certificate for the planes: with a `san:` entry in a plane's --tokens it
 * stands in for the bearer token). Used by register, proxy and up for
 * every request to the planes (heartbeats, the DELETE on exit, watches).
 */
#define OM_CLI_CONTROL_TLS_LONGOPTS                                            \
  {"control-ca", required_argument, NULL, OM_CLI_OPT_CONTROL_CA},              \
      {"control-cert", required_argument, NULL, OM_CLI_OPT_CONTROL_CERT}, {    \
    "control-key", required_argument, NULL, OM_CLI_OPT_CONTROL_KEY             \
  }

/* The help lines, descriptions at column 27 plus P (as OM__CLI_TLS_HELP). */
#define OM__CLI_CONTROL_TLS_HELP(P)                                            \
  "  --control-ca FILE        " P                                              \
  "CA certificates (PEM) trusted for https://\n" OM__CLI_TLS_IND P             \
  "control planes (default: the system store)\n"                               \
  "  --control-cert FILE      " P                                              \
  "a client certificate (PEM) presented to the\n" OM__CLI_TLS_IND P            \
  "control planes (a `san:` line of their\n" OM__CLI_TLS_IND P                 \
  "--tokens gives it roles); needs --control-key\n"                            \
  "  --control-key FILE       " P "its private key (PEM)\n"

#define OM_CLI_CONTROL_TLS_HELP_27 OM__CLI_CONTROL_TLS_HELP("")
#define OM_CLI_CONTROL_TLS_HELP_28 OM__CLI_CONTROL_TLS_HELP(" ")
#define OM_CLI_CONTROL_TLS_HELP_30 OM__CLI_CONTROL_TLS_HELP("   ")

typedef struct om_cli_control_tls_s {
  const char *ca, *cert, *key;
} om_cli_control_tls_t;

/* c is one of the --control-* TLS options: store arg and return 1; else 0.
 */
int om_cli_control_tls_option(om_cli_control_tls_t *t, int c, const char *arg);

/*
 * After parsing: --control-cert without --control-key or the reverse is
 * "openmesh CMD: --control-cert FILE needs --control-key" and
 * OM_EXIT_USAGE. Then every file given is loaded once with the TLS engine
 * (om_tls_ctx_new, client role) and dropped, so a missing, unreadable or
 * malformed file, or a key that does not match the certificate, is
 * "openmesh CMD: --control-key FILE: why" and OM_EXIT_USAGE now rather
 * than a failed handshake later. OM_EXIT_OK otherwise, and *out (may be
 * NULL) is the libcurl form of t, pointing into t's strings.
 */
int om_cli_control_tls_check(const char *cmd, const om_cli_control_tls_t *t,
                             om_curl_tls_t *out);

/*
 * The flags again as arguments for a child `openmesh register` (up's
 * keepers): appends "--control-ca", FILE, ... for each flag set to argv at
 * *n (room for 6 more is the caller's). The strings are t's.
 */
void om_cli_control_tls_args(const om_cli_control_tls_t *t, char **argv,
                             size_t *n);

#endif /* OM_CLI_TLS_H */
