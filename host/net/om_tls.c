/*
 * om_tls.c: contexts built from PEM files, and connection engines over
 * memory BIOs (see om_tls.h).
 *
 * Files are read here, not by SSL_CTX_use_*_file, so an error can say
 * which file and what is wrong with it in words ("cannot read: Permission
 * denied", "not a PEM certificate") rather than an OpenSSL error stack.
 */
#include "om_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "om_errno.h"

/* The longest file read (a certificate bundle): 8 MiB. */
#define MAX_PEM_BYTES (8u * 1024u * 1024u)
/* Resumable client sessions kept per context (least recently used out). */
#define SESSION_SLOTS 64
#define MAX_NAME 256
#define MAX_KEY 320

typedef struct {
  char key[MAX_KEY];
  SSL_SESSION *sess;
  uint64_t generation;
  uint64_t used; /* LRU clock */
} session_slot_t;

struct om_tls_ctx {
  int refs;
  om_tls_role_t role;
  SSL_CTX *ssl;
  uint64_t generation;
  int no_verify, client_cert_optional;
  char *cert_file, *key_file, *ca_file, *client_ca_file;
  char *cert_label, *key_label, *ca_label, *client_ca_label;
  unsigned char *alpn_wire; /* length-prefixed protocol list */
  size_t alpn_len;
  session_slot_t slots[SESSION_SLOTS];
  uint64_t clock;
};

struct om_tls {
  om_tls_ctx_t *ctx;
  SSL *ssl;
  BIO *rbio, *wbio;    /* owned by ssl */
  uint64_t generation; /* of ctx when the engine was made */
  om_tls_fail_t fail;
  int closed, shut;
  char session_key[MAX_KEY];
  char detail[256];
};

static int ssl_ex_index = -1; /* SSL_CTX ex_data slot for the om_tls_ctx */

/* ------------------------------------------------------------------ */
/* failure names */

static const char *const fail_reasons[] = {
#define OM__TLS_FAIL_REASON(name, reason) reason,
    OM_TLS_FAIL_MAP(OM__TLS_FAIL_REASON)
#undef OM__TLS_FAIL_REASON
};

static const char *const fail_names[] = {
    "none",      "hostname",    "expired", "not_yet_valid",
    "untrusted", "self_signed", "verify",  "no_peer_cert",
    "alert",     "protocol",    "engine",
};

_Static_assert(sizeof fail_names / sizeof fail_names[0] == OM_TLS_FAIL__COUNT,
               "a name per failure class");

const char *om_tls_fail_reason(om_tls_fail_t f) {
  if ((int)f < 0 || f >= OM_TLS_FAIL__COUNT)
    return "unknown";
  return fail_reasons[f];
}

const char *om_tls_fail_name(om_tls_fail_t f) {
  if ((int)f < 0 || f >= OM_TLS_FAIL__COUNT)
    return "unknown";
  return fail_names[f];
}

/* ------------------------------------------------------------------ */
/* reading PEM files */

static char *dup_or_null(const char *s) {
  if (!s)
    return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d)
    memcpy(d, s, n);
  return d;
}

/* Read a whole file into a new BIO; NULL with err set on failure. */
static BIO *read_file(const char *label, const char *path, int *rc, char *err,
                      size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    om_errbuf(err, errlen, "%s %s: cannot read: %s", label, path,
              strerror(errno));
    *rc = OM_EINVAL;
    return NULL;
  }
  BIO *b = BIO_new(BIO_s_mem());
  if (!b) {
    fclose(f);
    *rc = OM_ENOMEM;
    om_errbuf(err, errlen, "%s %s: out of memory", label, path);
    return NULL;
  }
  char buf[16384];
  size_t total = 0, n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
    total += n;
    if (total > MAX_PEM_BYTES) {
      om_errbuf(err, errlen, "%s %s: larger than %u bytes", label, path,
                MAX_PEM_BYTES);
      *rc = OM_EPARSE;
      goto fail;
    }
    if (BIO_write(b, buf, (int)n) != (int)n) {
      *rc = OM_ENOMEM;
      om_errbuf(err, errlen, "%s %s: out of memory", label, path);
      goto fail;
    }
  }
  if (ferror(f)) {
    om_errbuf(err, errlen, "%s %s: cannot read: %s", label, path,
              strerror(errno));
    *rc = OM_EINVAL;
    goto fail;
  }
  fclose(f);
  return b;
fail:
  fclose(f);
  BIO_free(b);
  return NULL;
}

/* Every certificate of a PEM file, in order; NULL with err on failure. */
static STACK_OF(X509) * read_certs(const char *label, const char *path, int *rc,
                                   char *err, size_t errlen) {
  BIO *b = read_file(label, path, rc, err, errlen);
  if (!b)
    return NULL;
  STACK_OF(X509) *certs = sk_X509_new_null();
  if (!certs) {
    BIO_free(b);
    *rc = OM_ENOMEM;
    om_errbuf(err, errlen, "%s %s: out of memory", label, path);
    return NULL;
  }
  X509 *x;
  while ((x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL) {
    if (!sk_X509_push(certs, x)) {
      X509_free(x);
      sk_X509_pop_free(certs, X509_free);
      BIO_free(b);
      *rc = OM_ENOMEM;
      om_errbuf(err, errlen, "%s %s: out of memory", label, path);
      return NULL;
    }
  }
  /* the loop ends on "no start line" at the end of the file, or on a
   * damaged block: only the first is the end of a good file */
  unsigned long e = ERR_peek_last_error();
  int clean_end =
      ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
  ERR_clear_error();
  BIO_free(b);
  if (sk_X509_num(certs) == 0 || !clean_end) {
    sk_X509_pop_free(certs, X509_free);
    *rc = OM_EPARSE;
    om_errbuf(err, errlen, "%s %s: not a PEM certificate", label, path);
    return NULL;
  }
  return certs;
}

static EVP_PKEY *read_key(const char *label, const char *path, int *rc,
                          char *err, size_t errlen) {
  BIO *b = read_file(label, path, rc, err, errlen);
  if (!b)
    return NULL;
  EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
  ERR_clear_error();
  BIO_free(b);
  if (!k) {
    *rc = OM_EPARSE;
    om_errbuf(err, errlen, "%s %s: not a PEM private key", label, path);
  }
  return k;
}

/* ------------------------------------------------------------------ */
/* contexts */

/* Comma list -> ALPN wire format (RFC 7301 3.1). */
static int alpn_wire(const char *list, unsigned char **out, size_t *outlen) {
  size_t n = strlen(list);
  unsigned char *w = malloc(n + 1);
  if (!w)
    return OM_ENOMEM;
  size_t len = 0;
  const char *p = list;
  while (*p) {
    const char *c = strchr(p, ',');
    size_t l = c ? (size_t)(c - p) : strlen(p);
    if (l == 0 || l > 255) {
      free(w);
      return OM_EINVAL;
    }
    w[len++] = (unsigned char)l;
    memcpy(w + len, p, l);
    len += l;
    p += l;
    if (*p == ',')
      p++;
  }
  if (len == 0) {
    free(w);
    return OM_EINVAL;
  }
  *out = w;
  *outlen = len;
  return 0;
}

static int alpn_select(SSL *ssl, const unsigned char **out,
                       unsigned char *outlen, const unsigned char *in,
                       unsigned int inlen, void *arg) {
  om_tls_ctx_t *c = arg;
  unsigned char *sel = NULL;
  unsigned char sel_len = 0;
  /* server preference: the first of ours the client offered */
  if (SSL_select_next_proto(&sel, &sel_len, c->alpn_wire,
                            (unsigned int)c->alpn_len, in,
                            inlen) != OPENSSL_NPN_NEGOTIATED)
    return SSL_TLSEXT_ERR_NOACK;
  *out = sel;
  *outlen = sel_len;
  return SSL_TLSEXT_ERR_OK;
}

static void slot_clear(session_slot_t *s) {
  if (s->sess)
    SSL_SESSION_free(s->sess);
  memset(s, 0, sizeof *s);
}

/* A client's new session (TLS 1.3 tickets arrive after the handshake):
 * keep it under the engine's key. Returns 1: the reference is ours. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess) {
  om_tls_t *t = SSL_get_app_data(ssl);
  if (!t || !t->session_key[0] || !SSL_SESSION_is_resumable(sess))
    return 0;
  om_tls_ctx_t *c = t->ctx;
  if (t->generation != c->generation)
    return 0; /* made before a reload: its trust is not current */
  session_slot_t *slot = NULL, *lru = &c->slots[0];
  for (int i = 0; i < SESSION_SLOTS; i++) {
    session_slot_t *s = &c->slots[i];
    if (s->sess && strcmp(s->key, t->session_key) == 0) {
      slot = s;
      break;
    }
    if (!s->sess) {
      if (lru->sess)
        lru = s;
    } else if (lru->sess && s->used < lru->used) {
      lru = s;
    }
  }
  if (!slot)
    slot = lru;
  slot_clear(slot);
  memcpy(slot->key, t->session_key, sizeof slot->key);
  slot->sess = sess;
  slot->generation = c->generation;
  slot->used = ++c->clock;
  return 1;
}

static SSL_SESSION *session_find(om_tls_ctx_t *c, const char *key) {
  for (int i = 0; i < SESSION_SLOTS; i++) {
    session_slot_t *s = &c->slots[i];
    if (s->sess && s->generation == c->generation && strcmp(s->key, key) == 0) {
      if (!SSL_SESSION_is_resumable(s->sess)) {
        slot_clear(s);
        return NULL;
      }
      s->used = ++c->clock;
      return s->sess;
    }
  }
  return NULL;
}

/* Build an SSL_CTX from c's files. */
static int build_ssl_ctx(om_tls_ctx_t *c, SSL_CTX **out, char *err,
                         size_t errlen) {
  int rc = OM_ENOMEM;
  STACK_OF(X509) *certs = NULL, *cas = NULL;
  EVP_PKEY *key = NULL;
  SSL_CTX *s = SSL_CTX_new(c->role == OM_TLS_SERVER ? TLS_server_method()
                                                    : TLS_client_method());
  if (!s) {
    om_errbuf(err, errlen, "TLS: cannot create a context");
    goto fail;
  }
  SSL_CTX_set_min_proto_version(s, TLS1_2_VERSION);
  SSL_CTX_set_ex_data(s, ssl_ex_index, c);

  if (c->cert_file) {
    certs = read_certs(c->cert_label, c->cert_file, &rc, err, errlen);
    if (!certs)
      goto fail;
    key = read_key(c->key_label, c->key_file, &rc, err, errlen);
    if (!key)
      goto fail;
    rc = OM_EPARSE;
    if (SSL_CTX_use_certificate(s, sk_X509_value(certs, 0)) != 1) {
      om_errbuf(err, errlen, "%s %s: the certificate is not usable",
                c->cert_label, c->cert_file);
      goto fail;
    }
    for (int i = 1; i < sk_X509_num(certs); i++) {
      if (SSL_CTX_add1_chain_cert(s, sk_X509_value(certs, i)) != 1) {
        om_errbuf(err, errlen, "%s %s: a chain certificate is not usable",
                  c->cert_label, c->cert_file);
        goto fail;
      }
    }
    if (SSL_CTX_use_PrivateKey(s, key) != 1 ||
        SSL_CTX_check_private_key(s) != 1) {
      om_errbuf(err, errlen, "%s %s: the key does not match the certificate",
                c->key_label, c->key_file);
      goto fail;
    }
  }

  if (c->role == OM_TLS_CLIENT) {
    if (c->ca_file) {
      cas = read_certs(c->ca_label, c->ca_file, &rc, err, errlen);
      if (!cas)
        goto fail;
      X509_STORE *st = SSL_CTX_get_cert_store(s);
      for (int i = 0; i < sk_X509_num(cas); i++)
        X509_STORE_add_cert(st, sk_X509_value(cas, i));
    } else if (SSL_CTX_set_default_verify_paths(s) != 1) {
      rc = OM_EINVAL;
      om_errbuf(err, errlen, "TLS: the system CA store cannot be loaded");
      goto fail;
    }
    SSL_CTX_set_verify(s, c->no_verify ? SSL_VERIFY_NONE : SSL_VERIFY_PEER,
                       NULL);
    SSL_CTX_set_session_cache_mode(s, SSL_SESS_CACHE_CLIENT |
                                          SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(s, on_new_session);
    if (SSL_CTX_set_alpn_protos(s, c->alpn_wire, (unsigned)c->alpn_len) != 0) {
      rc = OM_ENOMEM;
      goto fail;
    }
  } else {
    static const unsigned char sid[] = "openmesh";
    SSL_CTX_set_session_id_context(s, sid, sizeof sid - 1);
    SSL_CTX_set_alpn_select_cb(s, alpn_select, c);
    if (c->client_ca_file) {
      cas = read_certs(c->client_ca_label, c->client_ca_file, &rc, err, errlen);
      if (!cas)
        goto fail;
      X509_STORE *st = SSL_CTX_get_cert_store(s);
      for (int i = 0; i < sk_X509_num(cas); i++) {
        X509 *ca = sk_X509_value(cas, i);
        X509_STORE_add_cert(st, ca);
        SSL_CTX_add_client_CA(s, ca);
      }
      SSL_CTX_set_verify(
          s,
          SSL_VERIFY_PEER |
              (c->client_cert_optional ? 0 : SSL_VERIFY_FAIL_IF_NO_PEER_CERT),
          NULL);
    }
  }
  sk_X509_pop_free(certs, X509_free);
  sk_X509_pop_free(cas, X509_free);
  EVP_PKEY_free(key);
  ERR_clear_error();
  *out = s;
  return 0;
fail:
  sk_X509_pop_free(certs, X509_free);
  sk_X509_pop_free(cas, X509_free);
  EVP_PKEY_free(key);
  SSL_CTX_free(s);
  ERR_clear_error();
  return rc;
}

static void ctx_free(om_tls_ctx_t *c) {
  for (int i = 0; i < SESSION_SLOTS; i++)
    slot_clear(&c->slots[i]);
  SSL_CTX_free(c->ssl);
  free(c->cert_file);
  free(c->key_file);
  free(c->ca_file);
  free(c->client_ca_file);
  free(c->cert_label);
  free(c->key_label);
  free(c->ca_label);
  free(c->client_ca_label);
  free(c->alpn_wire);
  free(c);
}

#define COPY_OR_FAIL(dst, src)                                                 \
  do {                                                                         \
    if ((src) && !((dst) = dup_or_null(src)))                                  \
      goto nomem;                                                              \
  } while (0)

int om_tls_ctx_new(const om_tls_opts_t *opts, om_tls_ctx_t **out, char *err,
                   size_t errlen) {
  if (!opts || !out) {
    om_errbuf(err, errlen, "TLS: no options");
    return OM_EINVAL;
  }
  if (opts->role != OM_TLS_CLIENT && opts->role != OM_TLS_SERVER) {
    om_errbuf(err, errlen, "TLS: unknown role");
    return OM_EINVAL;
  }
  const char *cl = opts->cert_label ? opts->cert_label : "cert_file";
  const char *kl = opts->key_label ? opts->key_label : "key_file";
  if (opts->role == OM_TLS_SERVER && !opts->cert_file) {
    om_errbuf(err, errlen, "%s: required for a TLS listener", cl);
    return OM_EINVAL;
  }
  if (!opts->cert_file != !opts->key_file) {
    if (opts->cert_file)
      om_errbuf(err, errlen, "%s: required with %s", kl, cl);
    else
      om_errbuf(err, errlen, "%s: required with %s", cl, kl);
    return OM_EINVAL;
  }
  if (ssl_ex_index < 0) {
    ssl_ex_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, NULL);
    if (ssl_ex_index < 0) {
      om_errbuf(err, errlen, "TLS: cannot initialise OpenSSL");
      return OM_ENOMEM;
    }
  }
  om_tls_ctx_t *c = calloc(1, sizeof *c);
  if (!c)
    goto nomem;
  c->refs = 1;
  c->role = opts->role;
  c->no_verify = opts->no_verify != 0;
  c->client_cert_optional = opts->client_cert_optional != 0;
  COPY_OR_FAIL(c->cert_file, opts->cert_file);
  COPY_OR_FAIL(c->key_file, opts->key_file);
  if (opts->role == OM_TLS_CLIENT)
    COPY_OR_FAIL(c->ca_file, opts->ca_file);
  else
    COPY_OR_FAIL(c->client_ca_file, opts->client_ca_file);
  COPY_OR_FAIL(c->cert_label, cl);
  COPY_OR_FAIL(c->key_label, kl);
  COPY_OR_FAIL(c->ca_label, opts->ca_label ? opts->ca_label : "ca_file");
  COPY_OR_FAIL(c->client_ca_label, opts->client_ca_label ? opts->client_ca_label
                                                         : "client_ca_file");
  int rc = alpn_wire(opts->alpn ? opts->alpn : "http/1.1", &c->alpn_wire,
                     &c->alpn_len);
  if (rc != 0) {
    if (rc == OM_ENOMEM)
      goto nomem;
    om_errbuf(err, errlen, "TLS: bad ALPN list \"%s\"", opts->alpn);
    ctx_free(c);
    return OM_EINVAL;
  }
  rc = build_ssl_ctx(c, &c->ssl, err, errlen);
  if (rc != 0) {
    ctx_free(c);
    return rc;
  }
  c->generation = 1;
  *out = c;
  return 0;
nomem:
  if (c)
    ctx_free(c);
  om_errbuf(err, errlen, "TLS: out of memory");
  return OM_ENOMEM;
}

om_tls_ctx_t *om_tls_ctx_ref(om_tls_ctx_t *ctx) {
  ctx->refs++;
  return ctx;
}

void om_tls_ctx_unref(om_tls_ctx_t *ctx) {
  if (ctx && --ctx->refs == 0)
    ctx_free(ctx);
}

int om_tls_ctx_reload(om_tls_ctx_t *ctx, char *err, size_t errlen) {
  SSL_CTX *s = NULL;
  int rc = build_ssl_ctx(ctx, &s, err, errlen);
  if (rc != 0)
    return rc;
  SSL_CTX_free(ctx->ssl); /* engines hold their own reference */
  ctx->ssl = s;
  ctx->generation++;
  for (int i = 0; i < SESSION_SLOTS; i++)
    slot_clear(&ctx->slots[i]);
  return 0;
}

uint64_t om_tls_ctx_generation(const om_tls_ctx_t *ctx) {
  return ctx->generation;
}

om_tls_role_t om_tls_ctx_role(const om_tls_ctx_t *ctx) {
  return ctx->role;
}

/* ------------------------------------------------------------------ */
/* engines */

static int is_ip_literal(const char *s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

int om_tls_new(om_tls_ctx_t *ctx, const om_tls_conn_opts_t *o, om_tls_t **out,
               char *err, size_t errlen) {
  char name[MAX_NAME] = "";
  if (!ctx || !out) {
    om_errbuf(err, errlen, "TLS: no context");
    return OM_EINVAL;
  }
  if (ctx->role == OM_TLS_CLIENT) {
    const char *n =
        o ? (o->server_name && o->server_name[0] ? o->server_name : o->host)
          : NULL;
    if (n && n[0]) {
      size_t len = strlen(n);
      if (n[0] == '[' && len > 2 && n[len - 1] == ']') {
        n++;
        len -= 2;
      }
      if (len >= sizeof name) {
        om_errbuf(err, errlen, "TLS: server name too long");
        return OM_EINVAL;
      }
      memcpy(name, n, len);
      name[len] = 0;
    }
    if (!name[0] && !ctx->no_verify) {
      om_errbuf(err, errlen, "TLS: a verifying client needs a server name");
      return OM_EINVAL;
    }
    if (o && o->session_key && strlen(o->session_key) >= MAX_KEY) {
      om_errbuf(err, errlen, "TLS: session key too long");
      return OM_EINVAL;
    }
  }
  om_tls_t *t = calloc(1, sizeof *t);
  if (!t)
    goto nomem;
  t->ssl = SSL_new(ctx->ssl);
  if (!t->ssl)
    goto nomem;
  t->rbio = BIO_new(BIO_s_mem());
  t->wbio = BIO_new(BIO_s_mem());
  if (!t->rbio || !t->wbio) {
    BIO_free(t->rbio);
    BIO_free(t->wbio);
    goto nomem;
  }
  /* an empty input BIO means "retry later", not EOF */
  BIO_set_mem_eof_return(t->rbio, -1);
  SSL_set_bio(t->ssl, t->rbio, t->wbio);
  SSL_set_app_data(t->ssl, t);
  t->ctx = om_tls_ctx_ref(ctx);
  t->generation = ctx->generation;
  if (ctx->role == OM_TLS_SERVER) {
    SSL_set_accept_state(t->ssl);
  } else {
    SSL_set_connect_state(t->ssl);
    if (name[0]) {
      int ip = is_ip_literal(name);
      if (!ip && SSL_set_tlsext_host_name(t->ssl, name) != 1)
        goto nomem;
      if (!ctx->no_verify) {
        int ok =
            ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), name)
               : SSL_set1_host(t->ssl, name);
        if (ok != 1)
          goto nomem;
      }
    }
    if (o && o->alpn) {
      unsigned char *w;
      size_t wl;
      int rc = alpn_wire(o->alpn, &w, &wl);
      if (rc != 0) {
        om_tls_free(t);
        om_errbuf(err, errlen, "TLS: the ALPN list is not 1..255-byte names");
        return rc;
      }
      /* 0 is success for this one (OpenSSL's convention) */
      rc = SSL_set_alpn_protos(t->ssl, w, (unsigned)wl);
      free(w);
      if (rc != 0)
        goto nomem;
    }
    if (o && o->session_key && o->session_key[0]) {
      memcpy(t->session_key, o->session_key, strlen(o->session_key) + 1);
      SSL_SESSION *s = session_find(ctx, t->session_key);
      if (s)
        SSL_set_session(t->ssl, s);
    }
  }
  ERR_clear_error();
  *out = t;
  return 0;
nomem:
  ERR_clear_error();
  om_tls_free(t);
  om_errbuf(err, errlen, "TLS: out of memory");
  return OM_ENOMEM;
}

void om_tls_free(om_tls_t *t) {
  if (!t)
    return;
  if (t->ssl) {
    SSL_set_app_data(t->ssl, NULL);
    /* SSL_free forgets (marks not resumable) the session of a connection
     * that was not shut down; a healthy one closed without close_notify
     * (keep-alive pools do that) keeps it resumable */
    if (t->fail == OM_TLS_FAIL_NONE && SSL_is_init_finished(t->ssl))
      SSL_set_shutdown(t->ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
    SSL_free(t->ssl);
  }
  om_tls_ctx_unref(t->ctx);
  free(t);
}

int om_tls_feed(om_tls_t *t, const void *data, size_t len) {
  while (len > 0) {
    int chunk = len > (1u << 30) ? (1 << 30) : (int)len;
    int n = BIO_write(t->rbio, data, chunk);
    if (n <= 0)
      return OM_ENOMEM;
    data = (const char *)data + n;
    len -= (size_t)n;
  }
  return 0;
}

/* Classify a failed SSL call; returns the result for the caller. */
static int failed(om_tls_t *t, int ret) {
  int e = SSL_get_error(t->ssl, ret);
  if (e == SSL_ERROR_WANT_READ) {
    ERR_clear_error();
    return OM_TLS_WANT_READ;
  }
  if (e == SSL_ERROR_ZERO_RETURN) {
    ERR_clear_error();
    t->closed = 1;
    return OM_TLS_CLOSED;
  }
  unsigned long code = ERR_peek_last_error();
  long vr = SSL_get_verify_result(t->ssl);
  char ossl[160] = "";
  if (code)
    ERR_error_string_n(code, ossl, sizeof ossl);
  ERR_clear_error();
  om_tls_fail_t f = OM_TLS_FAIL_PROTOCOL;
  int lib = ERR_GET_LIB(code), reason = ERR_GET_REASON(code);
  if (lib == ERR_LIB_SSL && reason == SSL_R_CERTIFICATE_VERIFY_FAILED &&
      vr != X509_V_OK) {
    switch (vr) {
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      f = OM_TLS_FAIL_HOSTNAME;
      break;
    case X509_V_ERR_CERT_HAS_EXPIRED:
      f = OM_TLS_FAIL_EXPIRED;
      break;
    case X509_V_ERR_CERT_NOT_YET_VALID:
      f = OM_TLS_FAIL_NOT_YET_VALID;
      break;
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_CERT_UNTRUSTED:
      f = OM_TLS_FAIL_UNTRUSTED;
      break;
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      f = OM_TLS_FAIL_SELF_SIGNED;
      break;
    default:
      f = OM_TLS_FAIL_VERIFY;
    }
    snprintf(t->detail, sizeof t->detail, "%s (verify: %s)", ossl,
             X509_verify_cert_error_string(vr));
  } else {
    if (lib == ERR_LIB_SSL &&
        (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE))
      f = OM_TLS_FAIL_NO_PEER_CERT;
    else if (lib == ERR_LIB_SSL && reason >= SSL_AD_REASON_OFFSET)
      f = OM_TLS_FAIL_ALERT; /* SSL_R_SSLV3_ALERT_* and TLSV1_ALERT_* */
    else if (e != SSL_ERROR_SSL && e != SSL_ERROR_SYSCALL)
      f = OM_TLS_FAIL_ENGINE;
    snprintf(t->detail, sizeof t->detail, "%s",
             ossl[0] ? ossl : "no OpenSSL error recorded");
  }
  t->fail = f;
  return OM_EIO;
}

int om_tls_handshake(om_tls_t *t) {
  if (t->fail != OM_TLS_FAIL_NONE)
    return OM_EIO;
  if (SSL_is_init_finished(t->ssl))
    return 0;
  ERR_clear_error(); /* SSL_get_error reads the thread's queue */
  int r = SSL_do_handshake(t->ssl);
  if (r == 1)
    return 0;
  return failed(t, r);
}

int om_tls_handshake_done(const om_tls_t *t) {
  return SSL_is_init_finished(t->ssl) ? 1 : 0;
}

int om_tls_read(om_tls_t *t, void *buf, size_t cap, size_t *n) {
  *n = 0;
  if (t->fail != OM_TLS_FAIL_NONE)
    return OM_EIO;
  if (t->closed)
    return OM_TLS_CLOSED;
  if (cap == 0)
    return OM_EINVAL;
  size_t got = 0;
  ERR_clear_error();
  int r = SSL_read_ex(t->ssl, buf, cap, &got);
  if (r == 1) {
    *n = got;
    return 0;
  }
  return failed(t, r);
}

int om_tls_write(om_tls_t *t, const void *data, size_t len) {
  if (t->fail != OM_TLS_FAIL_NONE)
    return OM_EIO;
  if (len == 0)
    return 0;
  if (!SSL_is_init_finished(t->ssl)) {
    int h = om_tls_handshake(t);
    if (h != 0)
      return h;
  }
  size_t done = 0;
  ERR_clear_error();
  int r = SSL_write_ex(t->ssl, data, len, &done);
  if (r == 1 && done == len)
    return 0;
  if (r == 1)
    return OM_ENOMEM; /* partial writes are off: the BIO refused */
  return failed(t, r);
}

int om_tls_shutdown(om_tls_t *t) {
  if (t->shut)
    return 0;
  t->shut = 1;
  if (t->fail != OM_TLS_FAIL_NONE || !SSL_is_init_finished(t->ssl))
    return 0;
  int r = SSL_shutdown(t->ssl);
  ERR_clear_error();
  return r < 0 ? OM_EIO : 0;
}

int om_tls_in_pending(const om_tls_t *t) {
  return SSL_pending(t->ssl) > 0 || BIO_ctrl_pending(t->rbio) > 0;
}

size_t om_tls_out_pending(const om_tls_t *t) {
  return BIO_ctrl_pending(t->wbio);
}

size_t om_tls_out_take(om_tls_t *t, void *buf, size_t cap) {
  size_t got = 0;
  if (cap == 0 || BIO_read_ex(t->wbio, buf, cap, &got) != 1)
    return 0;
  return got;
}

om_tls_fail_t om_tls_fail(const om_tls_t *t) {
  return t->fail;
}

const char *om_tls_reason(const om_tls_t *t) {
  return om_tls_fail_reason(t->fail);
}

const char *om_tls_detail(const om_tls_t *t) {
  return t->detail;
}

long om_tls_verify_result(const om_tls_t *t) {
  return SSL_get_verify_result(t->ssl);
}

int om_tls_session_reused(const om_tls_t *t) {
  return SSL_session_reused(t->ssl) ? 1 : 0;
}

const char *om_tls_version(const om_tls_t *t) {
  return SSL_get_version(t->ssl);
}

size_t om_tls_alpn(const om_tls_t *t, char *buf, size_t cap) {
  const unsigned char *p = NULL;
  unsigned int len = 0;
  SSL_get0_alpn_selected(t->ssl, &p, &len);
  if (cap == 0)
    return 0;
  size_t n = len < cap - 1 ? len : cap - 1;
  if (n)
    memcpy(buf, p, n);
  buf[n] = 0;
  return len ? n : 0;
}

/* ------------------------------------------------------------------ */
/* peer identity */

static int push_name(char ***list, size_t *n, const ASN1_STRING *s) {
  int len = ASN1_STRING_length(s);
  const unsigned char *d = ASN1_STRING_get0_data(s);
  if (len < 0 || memchr(d, 0, (size_t)len))
    return 0; /* an embedded NUL is not a name: skip it */
  char **grown = realloc(*list, (*n + 1) * sizeof **list);
  if (!grown)
    return OM_ENOMEM;
  *list = grown;
  char *c = malloc((size_t)len + 1);
  if (!c)
    return OM_ENOMEM;
  memcpy(c, d, (size_t)len);
  c[len] = 0;
  grown[(*n)++] = c;
  return 0;
}

void om_tls_identity_free(om_tls_identity_t *id) {
  if (!id)
    return;
  free(id->subject);
  for (size_t i = 0; i < id->n_uris; i++)
    free(id->uris[i]);
  for (size_t i = 0; i < id->n_dns; i++)
    free(id->dns[i]);
  free(id->uris);
  free(id->dns);
  free(id);
}

int om_tls_peer_identity(const om_tls_t *t, om_tls_identity_t **out) {
  if (!SSL_is_init_finished(t->ssl))
    return OM_ESTATE;
  X509 *peer = SSL_get0_peer_certificate(t->ssl);
  if (!peer || SSL_get_verify_result(t->ssl) != X509_V_OK)
    return OM_ENOTFOUND;
  /* a server that does not ask for certificates verifies nothing */
  if (t->ctx->role == OM_TLS_SERVER && !t->ctx->client_ca_file)
    return OM_ENOTFOUND;
  if (t->ctx->role == OM_TLS_CLIENT && t->ctx->no_verify)
    return OM_ENOTFOUND;
  om_tls_identity_t *id = calloc(1, sizeof *id);
  if (!id)
    return OM_ENOMEM;
  int rc = OM_ENOMEM;
  BIO *b = BIO_new(BIO_s_mem());
  if (!b)
    goto fail;
  X509_NAME_print_ex(b, X509_get_subject_name(peer), 0,
                     XN_FLAG_RFC2253 & ~ASN1_STRFLGS_ESC_MSB);
  char *data = NULL;
  long len = BIO_get_mem_data(b, &data);
  id->subject = malloc((size_t)len + 1);
  if (!id->subject) {
    BIO_free(b);
    goto fail;
  }
  if (len > 0)
    memcpy(id->subject, data, (size_t)len);
  id->subject[len] = 0;
  BIO_free(b);
  GENERAL_NAMES *sans =
      X509_get_ext_d2i(peer, NID_subject_alt_name, NULL, NULL);
  for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans); i++) {
    const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
    int r = 0;
    if (g->type == GEN_URI)
      r = push_name(&id->uris, &id->n_uris, g->d.uniformResourceIdentifier);
    else if (g->type == GEN_DNS)
      r = push_name(&id->dns, &id->n_dns, g->d.dNSName);
    if (r != 0) {
      GENERAL_NAMES_free(sans);
      goto fail;
    }
  }
  GENERAL_NAMES_free(sans);
  ERR_clear_error();
  *out = id;
  return 0;
fail:
  ERR_clear_error();
  om_tls_identity_free(id);
  return rc;
}
