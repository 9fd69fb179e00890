/* om_cli_tls.c: see om_cli_tls.h. */
#include "om_cli_tls.h"

#include "om_cli.h"
#include "om_cli_util.h"
#include "om_tls.h"

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
  o.alpn = t->alpn;
  o.watch = 1;
  if (om_http_tls_new(loop, &o, out, err, sizeof err) != 0) {
    fprintf(stderr, "openmesh %s: %s\n", cmd, err);
    *out = NULL;
    return OM_EXIT_USAGE;
  }
  return OM_EXIT_OK;
}

int om_cli_control_tls_option(om_cli_control_tls_t *t, int c, const char *arg) {
  switch (c) {
  case OM_CLI_OPT_CONTROL_CA:
    t->ca = arg;
    return 1;
  case OM_CLI_OPT_CONTROL_CERT:
    t->cert = arg;
    return 1;
  case OM_CLI_OPT_CONTROL_KEY:
    t->key = arg;
    return 1;
  default:
    return 0;
  }
}

int om_cli_control_tls_check(const char *cmd, const om_cli_control_tls_t *t,
                             om_curl_tls_t *out) {
  om_tls_opts_t o = {0};
  om_tls_ctx_t *ctx = NULL;
  char err[1024];
  if (t->cert != NULL && t->key == NULL)
    return om_cli_fail_usage(cmd, "--control-cert %s needs --control-key",
                             t->cert);
  if (t->key != NULL && t->cert == NULL)
    return om_cli_fail_usage(cmd, "--control-key %s needs --control-cert",
                             t->key);
  if (out != NULL) {
    out->ca_file = t->ca;
    out->cert_file = t->cert;
    out->key_file = t->key;
  }
  if (t->ca == NULL && t->cert == NULL)
    return OM_EXIT_OK;
  /* the engine's loader, as libcurl (OpenSSL too) will read the files */
  o.role = OM_TLS_CLIENT;
  o.ca_file = t->ca;
  o.cert_file = t->cert;
  o.key_file = t->key;
  o.ca_label = "--control-ca";
  o.cert_label = "--control-cert";
  o.key_label = "--control-key";
  if (om_tls_ctx_new(&o, &ctx, err, sizeof err) != 0) {
    fprintf(stderr, "openmesh %s: %s\n", cmd, err);
    return OM_EXIT_USAGE;
  }
  om_tls_ctx_unref(ctx);
  return OM_EXIT_OK;
}

void om_cli_control_tls_args(const om_cli_control_tls_t *t, char **argv,
                             size_t *n) {
  if (t->ca != NULL) {
    argv[(*n)++] = "--control-ca";
    argv[(*n)++] = (char *)t->ca;
  }
  if (t->cert != NULL) {
    argv[(*n)++] = "--control-cert";
    argv[(*n)++] = (char *)t->cert;
    argv[(*n)++] = "--control-key";
    argv[(*n)++] = (char *)t->key;
  }
}
