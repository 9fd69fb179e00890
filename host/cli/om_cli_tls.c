/* om_cli_tls.c: see om_cli_tls.h. */
#include "om_cli_tls.h"

#include "om_cli.h"
#include "om_cli_util.h"

int om_cli_tls_option(om_cli_tls_t *t, int c, const char *arg) {
  switch (c) {
  case OM_CLI_OPT_TLS_CERT:
    t->cert = arg;
    return 1;
  case OM_CLI_OPT_TLS_KEY:
    t->key = arg;
    return 1;
  case OM_CLI_OPT_TLS_CLIENT_CA:
    t->client_ca = arg;
    return 1;
  default:
    return 0;
  }
}

int om_cli_tls_check(const char *cmd, const om_cli_tls_t *t) {
  if (t->cert != NULL && t->key == NULL)
    return om_cli_fail_usage(cmd, "--tls-cert %s needs --tls-key", t->cert);
  if (t->key != NULL && t->cert == NULL)
    return om_cli_fail_usage(cmd, "--tls-key %s needs --tls-cert", t->key);
  if (t->client_ca != NULL && t->cert == NULL)
    return om_cli_fail_usage(cmd,
                             "--tls-client-ca %s needs --tls-cert and "
                             "--tls-key (client certificates are asked for "
                             "over TLS)",
                             t->client_ca);
  return OM_EXIT_OK;
}

int om_cli_tls_load(const char *cmd, uv_loop_t *loop, const om_cli_tls_t *t,
                    int client_optional, om_http_tls_t **out) {
  om_http_tls_opts_t o = {0};
  char err[1024];
  *out = NULL;
  if (t->cert == NULL)
    return OM_EXIT_OK;
  o.cert_file = t->cert;
  o.key_file = t->key;
  o.client_ca_file = t->client_ca;
  o.client_cert_optional = client_optional;
  o.watch = 1;
  if (om_http_tls_new(loop, &o, out, err, sizeof err) != 0) {
    fprintf(stderr, "openmesh %s: %s\n", cmd, err);
    *out = NULL;
    return OM_EXIT_USAGE;
  }
  return OM_EXIT_OK;
}
