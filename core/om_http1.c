/* om_http1.c: HTTP/1.1 message framing (see om_http1.h). */
#include "om_http1.h"

#include <string.h>

#include "om_http_chars.h"

const char *om_http1_err_desc(om_http1_err_t err) {
  switch (err) {
  case OM_HTTP1_OK:
    return "success";
#define OM__HTTP1_ERR_DESC(name, desc)                                         \
  case OM_HTTP1_E_##name:                                                      \
    return desc;
    OM_HTTP1_ERR_MAP(OM__HTTP1_ERR_DESC)
#undef OM__HTTP1_ERR_DESC
  default:
    return "unknown";
  }
}

/* ------------------------------------------------------------------ */
/* heads (RFC 9112 2-5) */

enum {
  H_START, /* request: before the request-line; empty lines allowed */
  H_START_LF,
  H_METHOD,
  H_TARGET0,
  H_TARGET,
  H_VERSION,
  H_RL_LF,
  H_SVERSION, /* response: "HTTP/1.0 " or "HTTP/1.1 " */
  H_SCODE,
  H_SAFTER,
  H_REASON,
  H_SL_LF,
  H_FIELD_START,
  H_NAME,
  H_OWS,
  H_VALUE,
  H_FIELD_LF,
  H_END_LF,
  H_DONE,
  H_ERROR
};

void om_http1_head_init(om_http1_head_t *h, int kind, om_http1_field_t *fields,
                        size_t fields_cap, size_t max_fields,
                        size_t max_bytes) {
  memset(h, 0, sizeof *h);
  h->kind = kind;
  h->fields = fields;
  h->fields_cap = fields_cap;
  h->max_fields = max_fields;
  h->max_bytes = max_bytes;
  h->st = kind == OM_HTTP1_RESPONSE ? H_SVERSION : H_START;
}

int om_http1_head_past_method(const om_http1_head_t *h) {
  return h->kind == OM_HTTP1_REQUEST && h->st > H_METHOD && h->st <= H_DONE;
}

static int head_fail(om_http1_head_t *h, om_http1_err_t err) {
  h->err = err;
  h->st = H_ERROR;
  return OM_HTTP1_ERROR;
}

int om_http1_head_parse(om_http1_head_t *h, const char *buf, size_t len) {
  const unsigned char *b = (const unsigned char *)buf;
  size_t max = h->max_bytes;
  if (h->st == H_DONE)
    return OM_HTTP1_DONE;
  if (h->st == H_ERROR)
    return OM_HTTP1_ERROR;
  for (; h->pos < len; h->pos++) {
    unsigned ch = b[h->pos];
    if (h->pos >= max)
      return head_fail(h, h->st == H_TARGET ? OM_HTTP1_E_TARGET_TOO_LONG
                                            : OM_HTTP1_E_HEAD_TOO_LARGE);
    switch (h->st) {
    case H_START:
      /* RFC 9112 2.2: a server SHOULD ignore at least one empty line
       * (CRLF) before the request-line; a bare LF is not a line end. */
      if (ch == '\r') {
        h->st = H_START_LF;
      } else if (om__http_is_tchar(ch)) {
        h->line_start = h->pos;
        h->st = H_METHOD;
      } else {
        return head_fail(h, OM_HTTP1_E_REQUEST_LINE);
      }
      break;
    case H_START_LF:
      if (ch != '\n')
        return head_fail(h, OM_HTTP1_E_REQUEST_LINE);
      h->st = H_START;
      break;
    case H_METHOD: /* method = token (RFC 9112 3.1) */
      if (ch == ' ') {
        h->method_len = h->pos - h->line_start;
        h->st = H_TARGET0;
      } else if (!om__http_is_tchar(ch)) {
        return head_fail(h, OM_HTTP1_E_REQUEST_LINE);
      } else if (h->pos - h->line_start >= OM_HTTP1_METHOD_MAX) {
        return head_fail(h, OM_HTTP1_E_METHOD_TOO_LONG);
      }
      break;
    case H_TARGET0: /* exactly one SP between the parts (RFC 9112 3) */
      if (ch == ' ' || ch == '\r' || ch == '\n')
        return head_fail(h, OM_HTTP1_E_REQUEST_LINE);
      if (ch < 0x21 || ch > 0x7e)
        return head_fail(h, OM_HTTP1_E_TARGET_BYTE);
      h->target_off = h->pos;
      h->st = H_TARGET;
      break;
    case H_TARGET:
      if (ch == ' ') {
        h->target_len = h->pos - h->target_off;
        h->st = H_VERSION;
      } else if (ch == '\r' || ch == '\n') {
        /* HTTP/0.9 simple request or a missing version */
        return head_fail(h, OM_HTTP1_E_REQUEST_LINE);
      } else if (ch < 0x21 || ch > 0x7e) {
        return head_fail(h, OM_HTTP1_E_TARGET_BYTE);
      }
      break;
    case H_VERSION: { /* HTTP-version = "HTTP/" DIGIT "." DIGIT (2.3) */
      size_t vs = h->target_off + h->target_len + 1, k = h->pos - vs;
      if (ch == '\r') {
        const unsigned char *v = b + vs;
        if (k != 8 || memcmp(v, "HTTP/", 5) != 0 || !om__http_is_digit(v[5]) ||
            v[6] != '.' || !om__http_is_digit(v[7]))
          return head_fail(h, OM_HTTP1_E_REQUEST_LINE);
        h->major = v[5] - '0';
        h->minor = v[7] - '0';
        h->st = H_RL_LF;
      } else if (k >= 8 || ch < 0x21 || ch > 0x7e) {
        return head_fail(h, OM_HTTP1_E_REQUEST_LINE);
      }
      break;
    }
    case H_RL_LF: /* a bare CR is invalid (RFC 9112 2.2) */
      if (ch != '\n')
        return head_fail(h, OM_HTTP1_E_REQUEST_LINE);
      h->st = H_FIELD_START;
      break;
    case H_SVERSION: { /* status-line = HTTP-version SP status-code SP
                          [ reason-phrase ] (RFC 9112 4) */
      static const char v[] = "HTTP/1.";
      size_t k = h->pos;
      if (ch == '\n')
        return head_fail(h, OM_HTTP1_E_BARE_LF);
      if (k < 7    ? ch != (unsigned char)v[k]
          : k == 7 ? (ch != '0' && ch != '1')
                   : ch != ' ')
        return head_fail(h, OM_HTTP1_E_STATUS_VERSION);
      if (k == 7)
        h->minor = (int)(ch - '0');
      if (k == 8) {
        h->major = 1;
        h->st = H_SCODE;
      }
      break;
    }
    case H_SCODE:
      if (ch == '\n')
        return head_fail(h, OM_HTTP1_E_BARE_LF);
      if (!om__http_is_digit(ch))
        return head_fail(h, OM_HTTP1_E_STATUS_CODE);
      h->status = h->status * 10 + (int)(ch - '0');
      if (h->pos == 11) {
        if (h->status < 100 || h->status > 599)
          return head_fail(h, OM_HTTP1_E_STATUS_RANGE);
        h->st = H_SAFTER;
      }
      break;
    case H_SAFTER:
      if (ch == ' ') {
        h->reason_off = h->pos + 1;
        h->st = H_REASON;
      } else if (ch == '\r') {
        h->reason_off = h->pos;
        h->st = H_SL_LF;
      } else {
        return head_fail(h, ch == '\n' ? OM_HTTP1_E_BARE_LF
                                       : OM_HTTP1_E_STATUS_AFTER_CODE);
      }
      break;
    case H_REASON: /* reason-phrase = 1*( HTAB / SP / VCHAR / obs-text ) */
      while (om__http_is_fvchar(ch) || om__http_is_ows(ch)) {
        if (++h->pos >= len || h->pos >= max)
          goto next;
        ch = b[h->pos];
      }
      if (ch == '\r') {
        h->reason_len = h->pos - h->reason_off;
        h->st = H_SL_LF;
      } else {
        return head_fail(h, ch == '\n' ? OM_HTTP1_E_BARE_LF
                                       : OM_HTTP1_E_REASON_CTL);
      }
      break;
    case H_SL_LF:
      if (ch != '\n')
        return head_fail(h, OM_HTTP1_E_STATUS_BARE_CR);
      h->st = H_FIELD_START;
      break;
    case H_FIELD_START:
      if (ch == '\r') {
        h->st = H_END_LF;
      } else if (om__http_is_tchar(ch)) {
        h->name_start = h->pos;
        h->st = H_NAME;
      } else if (om__http_is_ows(ch)) {
        /* RFC 9112 5.2: obs-fold MUST be rejected by a server (and a
         * client may refuse it); RFC 9112 2.2: whitespace before the
         * first field line too. */
        return head_fail(h, h->n_fields > 0 ? OM_HTTP1_E_OBS_FOLD
                                            : OM_HTTP1_E_WS_BEFORE_FIRST_FIELD);
      } else {
        return head_fail(h, ch == '\n' ? OM_HTTP1_E_BARE_LF
                                       : OM_HTTP1_E_NAME_NOT_TOKEN);
      }
      break;
    case H_NAME:
      while (om__http_is_tchar(ch)) {
        if (++h->pos >= len || h->pos >= max)
          goto next;
        ch = b[h->pos];
      }
      if (ch == ':') {
        h->name_end = h->pos;
        h->st = H_OWS;
      } else {
        /* RFC 9112 5.1: no whitespace between name and colon */
        return head_fail(h, om__http_is_ows(ch) ? OM_HTTP1_E_WS_BEFORE_COLON
                            : ch == '\n'        ? OM_HTTP1_E_BARE_LF
                                                : OM_HTTP1_E_NAME_NOT_TOKEN);
      }
      break;
    case H_OWS:
      if (ch == '\r') {
        h->value_start = h->value_end = h->pos;
        h->st = H_FIELD_LF;
      } else if (om__http_is_fvchar(ch)) {
        h->value_start = h->pos;
        h->value_end = h->pos + 1;
        h->st = H_VALUE;
      } else if (!om__http_is_ows(ch)) {
        return head_fail(h, ch == '\n' ? OM_HTTP1_E_BARE_LF
                                       : OM_HTTP1_E_VALUE_CTL);
      }
      break;
    case H_VALUE: /* RFC 9110 5.5: no CTL (but HTAB), NUL, DEL, bare CR/LF */
      for (;;) {
        if (om__http_is_fvchar(ch))
          h->value_end = h->pos + 1;
        else if (!om__http_is_ows(ch))
          break;
        if (++h->pos >= len || h->pos >= max)
          goto next;
        ch = b[h->pos];
      }
      if (ch == '\r')
        h->st = H_FIELD_LF;
      else
        return head_fail(h, ch == '\n' ? OM_HTTP1_E_BARE_LF
                                       : OM_HTTP1_E_VALUE_CTL);
      break;
    case H_FIELD_LF: {
      om_http1_field_t *f;
      if (ch != '\n')
        return head_fail(h, OM_HTTP1_E_VALUE_BARE_CR);
      if (h->n_fields >= h->max_fields)
        return head_fail(h, OM_HTTP1_E_TOO_MANY_FIELDS);
      if (h->n_fields >= h->fields_cap)
        return OM_HTTP1_GROW; /* pos stays on this LF */
      f = &h->fields[h->n_fields++];
      f->name_off = (uint32_t)h->name_start;
      f->name_len = (uint32_t)(h->name_end - h->name_start);
      f->value_off = (uint32_t)h->value_start;
      f->value_len = (uint32_t)(h->value_end - h->value_start);
      h->st = H_FIELD_START;
      break;
    }
    case H_END_LF:
      if (ch != '\n')
        return head_fail(h, OM_HTTP1_E_END_BARE_CR);
      h->pos++;
      h->st = H_DONE;
      return OM_HTTP1_DONE;
    default:
      return head_fail(h, OM_HTTP1_E_REQUEST_LINE);
    }
    continue;
  next:
    /* a fast loop ran to the end of the input or to the limit: go round
     * once more at the same position, where the limit check applies */
    h->pos--;
  }
  return OM_HTTP1_MORE;
}

/* ------------------------------------------------------------------ */
/* request-target and authority (RFC 9112 3.2, RFC 9110 4.2, RFC 3986) */

/* pchar-or-more at t[*i]: one byte, or a whole pct-encoded triplet. */
static int take_uri_char(const char *t, size_t n, size_t *i, int query) {
  unsigned ch = (unsigned char)t[*i];
  if (ch == '%') {
    if (*i + 2 >= n || om__http_hex_val((unsigned char)t[*i + 1]) < 0 ||
        om__http_hex_val((unsigned char)t[*i + 2]) < 0)
      return 0;
    *i += 3;
    return 1;
  }
  if (om__http_is_unreserved(ch) || om__http_is_subdelim(ch) || ch == ':' ||
      ch == '@' || ch == '/' || (query && ch == '?')) {
    (*i)++;
    return 1;
  }
  return 0;
}

int om_http1_authority_valid(const char *a, size_t n, int require_host) {
  size_t i = 0, host_len;
  if (n > 0 && a[0] == '[') { /* IP-literal */
    int future = n > 1 && (a[1] == 'v' || a[1] == 'V');
    for (i = 1; i < n && a[i] != ']'; i++) {
      unsigned ch = (unsigned char)a[i];
      if (future ? !(om__http_is_unreserved(ch) || om__http_is_subdelim(ch) ||
                     ch == ':')
                 : !(om__http_hex_val(ch) >= 0 || ch == ':' || ch == '.'))
        return 0;
    }
    if (i >= n || i == 1)
      return 0;
    i++;
    host_len = i;
  } else { /* reg-name / IPv4address */
    while (i < n && a[i] != ':') {
      if (a[i] == '%') {
        if (i + 2 >= n || om__http_hex_val((unsigned char)a[i + 1]) < 0 ||
            om__http_hex_val((unsigned char)a[i + 2]) < 0)
          return 0;
        i += 3;
        continue;
      }
      if (!om__http_is_unreserved((unsigned char)a[i]) &&
          !om__http_is_subdelim((unsigned char)a[i]))
        return 0;
      i++;
    }
    host_len = i;
  }
  if (require_host && host_len == 0)
    return 0;
  if (i < n) { /* ":" port, port = *DIGIT */
    size_t digits = 0;
    if (a[i] != ':')
      return 0;
    for (i++; i < n; i++, digits++)
      if (!om__http_is_digit((unsigned char)a[i]) || digits >= 5)
        return 0;
  }
  return 1;
}

int om_http1_target_parse(const char *m, size_t ml, const char *t, size_t n,
                          om_http1_target_t *out) {
  size_t i = 0;
  memset(out, 0, sizeof *out);
  if (n == 1 && t[0] == '*') { /* asterisk-form: OPTIONS only (3.2.4) */
    if (!(ml == 7 && memcmp(m, "OPTIONS", 7) == 0))
      return -1;
    out->path_len = 1;
    return 0;
  }
  if (t[0] != '/') { /* absolute-form (3.2.2): http or https only */
    size_t a;
    if (!om__http_is_alpha((unsigned char)t[0]))
      return -1;
    while (i < n && (om__http_is_alpha((unsigned char)t[i]) ||
                     om__http_is_digit((unsigned char)t[i]) || t[i] == '+' ||
                     t[i] == '-' || t[i] == '.'))
      i++;
    if (i >= n || t[i] != ':')
      return -1;
    if (!om__http_ci_eq(t, i, "http") && !om__http_ci_eq(t, i, "https"))
      return -1;
    if (i + 3 > n || t[i + 1] != '/' || t[i + 2] != '/')
      return -1;
    i += 3;
    a = i;
    while (i < n && t[i] != '/' && t[i] != '?')
      i++;
    if (!om_http1_authority_valid(t + a, i - a, 1))
      return -1;
    out->absolute = 1;
    out->auth_off = a;
    out->auth_len = i - a;
  }
  out->path_off = i;
  while (i < n && t[i] != '?')
    if (!take_uri_char(t, n, &i, 0))
      return -1;
  out->path_len = i - out->path_off;
  if (out->path_len == 0)
    out->root = 1;
  if (i < n) {
    i++;
    out->has_query = 1;
    out->query_off = i;
    while (i < n)
      if (!take_uri_char(t, n, &i, 1))
        return -1;
    out->query_len = i - out->query_off;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* reason phrases */

const char *om_http1_reason_phrase(int status) {
  switch (status) {
  case 100:
    return "Continue";
  case 101:
    return "Switching Protocols";
  case 102:
    return "Processing";
  case 200:
    return "OK";
  case 201:
    return "Created";
  case 202:
    return "Accepted";
  case 203:
    return "Non-Authoritative Information";
  case 204:
    return "No Content";
  case 205:
    return "Reset Content";
  case 206:
    return "Partial Content";
  case 207:
    return "Multi-Status";
  case 208:
    return "Already Reported";
  case 226:
    return "IM Used";
  case 300:
    return "Multiple Choices";
  case 301:
    return "Moved Permanently";
  case 302:
    return "Found";
  case 303:
    return "See Other";
  case 304:
    return "Not Modified";
  case 305:
    return "Use Proxy";
  case 307:
    return "Temporary Redirect";
  case 308:
    return "Permanent Redirect";
  case 400:
    return "Bad Request";
  case 401:
    return "Unauthorized";
  case 402:
    return "Payment Required";
  case 403:
    return "Forbidden";
  case 404:
    return "Not Found";
  case 405:
    return "Method Not Allowed";
  case 406:
    return "Not Acceptable";
  case 407:
    return "Proxy Authentication Required";
  case 408:
    return "Request Timeout";
  case 409:
    return "Conflict";
  case 410:
    return "Gone";
  case 411:
    return "Length Required";
  case 412:
    return "Precondition Failed";
  case 413:
    return "Payload Too Large";
  case 414:
    return "URI Too Long";
  case 415:
    return "Unsupported Media Type";
  case 416:
    return "Range Not Satisfiable";
  case 417:
    return "Expectation Failed";
  case 421:
    return "Misdirected Request";
  case 422:
    return "Unprocessable Entity";
  case 423:
    return "Locked";
  case 424:
    return "Failed Dependency";
  case 426:
    return "Upgrade Required";
  case 428:
    return "Precondition Required";
  case 429:
    return "Too Many Requests";
  case 431:
    return "Request Header Fields Too Large";
  case 451:
    return "Unavailable For Legal Reasons";
  case 500:
    return "Internal Server Error";
  case 501:
    return "Not Implemented";
  case 502:
    return "Bad Gateway";
  case 503:
    return "Service Unavailable";
  case 504:
    return "Gateway Timeout";
  case 505:
    return "HTTP Version Not Supported";
  case 506:
    return "Variant Also Negotiates";
  case 507:
    return "Insufficient Storage";
  case 508:
    return "Loop Detected";
  case 510:
    return "Not Extended";
  case 511:
    return "Network Authentication Required";
  default:
    return "";
  }
}

/* ------------------------------------------------------------------ */
/* methods */

int om_http1_method_known(const char *m, size_t n) {
  /* the method registry of RFC 9110 9, WebDAV (RFC 4918, 3253, 5323,
   * 5842, 4791), UPnP (M-SEARCH, NOTIFY, SUBSCRIBE, UNSUBSCRIBE), PATCH,
   * PURGE, LINK, UNLINK, SOURCE */
  static const char *const known[] = {
      "DELETE",     "GET",        "HEAD",        "POST",      "PUT",
      "CONNECT",    "OPTIONS",    "TRACE",       "COPY",      "LOCK",
      "MKCOL",      "MOVE",       "PROPFIND",    "PROPPATCH", "SEARCH",
      "UNLOCK",     "BIND",       "REBIND",      "UNBIND",    "ACL",
      "REPORT",     "MKACTIVITY", "CHECKOUT",    "MERGE",     "M-SEARCH",
      "NOTIFY",     "SUBSCRIBE",  "UNSUBSCRIBE", "PATCH",     "PURGE",
      "MKCALENDAR", "LINK",       "UNLINK",      "SOURCE"};
  size_t i;
  for (i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strlen(known[i]) == n && memcmp(known[i], m, n) == 0)
      return 1;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Content-Length and Transfer-Encoding (RFC 9112 6) */

static size_t skip_ows(const char *v, size_t n, size_t i) {
  while (i < n && om__http_is_ows((unsigned char)v[i]))
    i++;
  return i;
}

static size_t skip_token(const char *v, size_t n, size_t i) {
  while (i < n && om__http_is_tchar((unsigned char)v[i]))
    i++;
  return i;
}

/* transfer-coding = token *( OWS ";" OWS transfer-parameter )
 * transfer-parameter = token BWS "=" BWS ( token / quoted-string ) */
static void te_parse(om_http1_framing_t *f, const char *v, size_t n) {
  size_t i = 0;
  for (;;) {
    size_t ts, te_end;
    int params = 0;
    i = skip_ows(v, n, i);
    ts = i;
    i = skip_token(v, n, i);
    te_end = i;
    if (te_end == ts) { /* an empty element or junk */
      f->te_bad = 1;
      return;
    }
    for (;;) {
      i = skip_ows(v, n, i);
      if (i >= n || v[i] != ';')
        break;
      i = skip_ows(v, n, i + 1);
      if (skip_token(v, n, i) == i) {
        f->te_bad = 1;
        return;
      }
      i = skip_ows(v, n, skip_token(v, n, i));
      if (i >= n || v[i] != '=') {
        f->te_bad = 1;
        return;
      }
      i = skip_ows(v, n, i + 1);
      if (i < n && v[i] == '"') {
        for (i++; i < n && v[i] != '"'; i++)
          if (v[i] == '\\')
            i++;
        if (i >= n) {
          f->te_bad = 1;
          return;
        }
        i++;
      } else if (skip_token(v, n, i) == i) {
        f->te_bad = 1;
        return;
      } else {
        i = skip_token(v, n, i);
      }
      params = 1;
    }
    f->te_codings++;
    if (om__http_ci_eq(v + ts, te_end - ts, "chunked")) {
      /* RFC 9112 7: chunked takes no parameters and is applied once */
      if (params || f->te_chunked) {
        f->te_bad = 1;
        return;
      }
      f->te_chunked = 1;
      f->te_last_chunked = 1;
    } else {
      f->te_unknown = 1;
      f->te_last_chunked = 0;
    }
    if (i >= n)
      return;
    if (v[i] != ',') {
      f->te_bad = 1;
      return;
    }
    i++;
  }
}

void om_http1_framing_init(om_http1_framing_t *f, int kind) {
  memset(f, 0, sizeof *f);
  f->kind = kind;
}

om_http1_err_t om_http1_framing_field(om_http1_framing_t *f, const char *name,
                                      size_t nl, const char *v, size_t vl) {
  if (nl == 14 && om__http_ci_eq(name, nl, "content-length")) {
    /* RFC 9112 6.3 item 5 / RFC 9110 8.6: Content-Length = 1*DIGIT; a
     * repeated field, even with equal values, is refused. */
    uint64_t cl = 0;
    int big = 0;
    size_t j;
    if (++f->n_cl > 1)
      return OM_HTTP1_E_CL_REPEATED;
    if (vl == 0 || (f->kind == OM_HTTP1_RESPONSE && vl > 19))
      return OM_HTTP1_E_CL_INVALID;
    for (j = 0; j < vl; j++) {
      unsigned d = (unsigned char)v[j];
      if (!om__http_is_digit(d))
        return OM_HTTP1_E_CL_INVALID;
      if (cl > (UINT64_MAX - 9) / 10)
        big = 1;
      else
        cl = cl * 10 + (d - '0');
    }
    f->cl = big ? UINT64_MAX : cl;
    if (f->kind == OM_HTTP1_RESPONSE && (big || cl > (uint64_t)INT64_MAX))
      return OM_HTTP1_E_CL_INVALID;
  } else if (nl == 17 && om__http_ci_eq(name, nl, "transfer-encoding")) {
    if (++f->n_te > 1 && f->kind == OM_HTTP1_RESPONSE)
      return OM_HTTP1_E_TE_REPEATED;
    f->te_lookalike_last = 0;
    te_parse(f, v, vl);
  } else if (nl > 17 && om__http_ci_eq(name, 17, "transfer-encoding")) {
    f->te_lookalike = f->te_lookalike_last = 1;
  }
  return OM_HTTP1_OK;
}

om_http1_err_t om_http1_framing_end(const om_http1_framing_t *f, int minor,
                                    int status, int request_is_head,
                                    int *body) {
  int te_ok = !f->te_bad && f->te_codings > 0 && f->te_last_chunked;
  *body = OM_HTTP1_BODY_NONE;
  if (f->kind == OM_HTTP1_REQUEST) {
    if (f->n_te > 0) {
      /* RFC 9112 6.1: both -> reject (or ignore CL) and close: we
       * reject */
      if (f->n_cl > 0)
        return OM_HTTP1_E_CL_AND_TE;
      /* RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has
       * faulty framing */
      if (minor == 0)
        return OM_HTTP1_E_TE_HTTP10;
      if (f->te_bad)
        return OM_HTTP1_E_TE_BAD;
      /* RFC 9112 6.3 item 4: chunked not final -> 400 and close */
      if (!te_ok)
        return OM_HTTP1_E_TE_NOT_CHUNKED;
      if (f->te_unknown) /* RFC 9112 6.1: a coding we do not know: 501 */
        return OM_HTTP1_E_TE_UNSUPPORTED;
      *body = OM_HTTP1_BODY_CHUNKED;
    } else if (f->n_cl > 0 && f->cl > 0) {
      *body = OM_HTTP1_BODY_LENGTH;
    }
    return OM_HTTP1_OK;
  }
  /* a response: the client decodes chunked alone */
  if (f->n_te > 0) {
    if (minor == 0)
      return OM_HTTP1_E_TE_HTTP10;
    if (f->te_bad)
      return OM_HTTP1_E_TE_BAD;
    if (!te_ok)
      return OM_HTTP1_E_TE_NOT_CHUNKED;
    if (f->te_unknown)
      return OM_HTTP1_E_TE_UNSUPPORTED;
    if (f->n_cl > 0)
      return OM_HTTP1_E_CL_AND_TE;
  }
  /* RFC 9112 6.3 items 1-2, then 3-7 */
  if (request_is_head || status < 200 || status == 204 || status == 304)
    *body = OM_HTTP1_BODY_NONE;
  else if (f->n_te > 0)
    *body = OM_HTTP1_BODY_CHUNKED;
  else if (f->n_cl > 0)
    *body = f->cl == 0 ? OM_HTTP1_BODY_NONE : OM_HTTP1_BODY_LENGTH;
  else
    *body = OM_HTTP1_BODY_CLOSE;
  return OM_HTTP1_OK;
}

/* ------------------------------------------------------------------ */
/* the chunked coding (RFC 9112 7.1) */

/* Decoder states. The ranges matter: D_SIZE0..D_SIZE_LF are the chunk
 * line (its length is bounded), D_TR_START..D_TR_LF the trailer section
 * (its size is bounded). */
enum {
  D_SIZE0,
  D_SIZE,
  D_SIZE_WS,
  D_EXT_NAME0,
  D_EXT_NAME,
  D_EXT_NAME_WS,
  D_EXT_VAL0,
  D_EXT_TOKEN,
  D_EXT_QS,
  D_EXT_QP,
  D_EXT_AFTER_QS,
  D_EXT_VAL_WS,
  D_SIZE_LF,
  D_DATA,
  D_DATA_CR,
  D_DATA_LF,
  D_TR_START,
  D_TR_NAME,
  D_TR_VALUE,
  D_TR_LF,
  D_END_LF,
  D_DONE,
  D_ERROR
};

/* A trailer Content-Length, checked as a header one would be: TCL_NAME
 * while the name so far matches, then the value's shape. */
enum {
  TCL_OFF,    /* not a Content-Length (or not in a trailer field yet) */
  TCL_NAME,   /* the name matches "content-length" so far (tcl_val: how
                 many bytes) */
  TCL_LEAD,   /* value: before the first digit */
  TCL_DIGITS, /* value: in the digits */
  TCL_TAIL    /* value: OWS after the digits */
};

void om_http1_chunked_init(om_http1_chunked_t *d, uint64_t max_body,
                           size_t max_trailer_bytes) {
  memset(d, 0, sizeof *d);
  d->st = D_SIZE0;
  d->max_body = max_body;
  d->max_line = 4096;
  d->max_trailer_bytes = max_trailer_bytes;
}

/* One byte of a trailer field name or value, for the Content-Length
 * check. Returns 0, or -1 when the field is a Content-Length that
 * http-parser (and any reader that frames on it) would refuse. */
static int tcl_byte(om_http1_chunked_t *d, unsigned ch) {
  static const char name[] = "content-length";
  switch (d->tcl) {
  case TCL_NAME:
    if (ch == ':') {
      d->tcl = d->tcl_val == 14 ? TCL_LEAD : TCL_OFF;
      d->tcl_val = 0;
    } else if (d->tcl_val < 14 && ((ch - 'A' < 26u) ? (ch | 0x20) : ch) ==
                                      (unsigned char)name[d->tcl_val]) {
      d->tcl_val++;
    } else {
      d->tcl = TCL_OFF;
    }
    return 0;
  case TCL_LEAD:
    if (om__http_is_ows(ch) || ch == '\r')
      return 0;
    if (!om__http_is_digit(ch) || d->tcl_seen)
      return -1;
    d->tcl_seen = 1;
    d->tcl_val = ch - '0';
    d->tcl = TCL_DIGITS;
    return 0;
  case TCL_DIGITS:
    if (om__http_is_digit(ch)) {
      uint64_t t = d->tcl_val * 10 + (ch - '0');
      if (d->tcl_val > (UINT64_MAX - 9) / 10 || t == UINT64_MAX)
        return -1;
      d->tcl_val = t;
      return 0;
    }
    if (om__http_is_ows(ch)) {
      d->tcl = TCL_TAIL;
      return 0;
    }
    return ch == '\r' ? 0 : -1;
  case TCL_TAIL:
    return om__http_is_ows(ch) || ch == '\r' ? 0 : -1;
  default:
    return 0;
  }
}

static int dec_fail(om_http1_chunked_t *d, om_http1_err_t err, size_t at,
                    size_t *used) {
  d->err = err;
  d->st = D_ERROR;
  *used = at;
  return OM_HTTP1_ERROR;
}

int om_http1_chunked_decode(om_http1_chunked_t *d, const char *p, size_t n,
                            size_t *used, const char **data, size_t *data_len) {
  size_t i = 0;
  *data = NULL;
  *data_len = 0;
  if (d->st == D_DONE) {
    *used = 0;
    return OM_HTTP1_DONE;
  }
  if (d->st == D_ERROR) {
    *used = 0;
    return OM_HTTP1_ERROR;
  }
  while (i < n) {
    unsigned ch;
    size_t at = i;
    if (d->st == D_DATA) {
      size_t k = n - i;
      if ((uint64_t)k > d->left)
        k = (size_t)d->left;
      d->left -= k;
      d->body += k;
      if (d->left == 0)
        d->st = D_DATA_CR;
      *data = p + i;
      *data_len = k;
      *used = i + k;
      return OM_HTTP1_DATA;
    }
    ch = (unsigned char)p[i++];
    /* many tiny chunks with long extensions must not stretch a body
     * limit into gigabytes on the wire */
    if (d->max_overhead != 0 && ++d->overhead > d->max_overhead)
      return dec_fail(d, OM_HTTP1_E_CHUNK_OVERHEAD, at, used);
    if (d->st <= D_SIZE_LF && ++d->line > d->max_line)
      return dec_fail(d, OM_HTTP1_E_CHUNK_LINE_TOO_LONG, at, used);
    if (d->st >= D_TR_START && d->st <= D_TR_LF &&
        ++d->tr_bytes > d->max_trailer_bytes)
      return dec_fail(d, OM_HTTP1_E_TRAILER_TOO_LARGE, at, used);
    if (ch == '\n' && d->st < D_SIZE_LF)
      return dec_fail(d, OM_HTTP1_E_CHUNK_BARE_LF, at, used);
    switch (d->st) {
    case D_SIZE0: /* chunk-size = 1*HEXDIG */
      if (om__http_hex_val(ch) < 0)
        return dec_fail(d, OM_HTTP1_E_CHUNK_SIZE, at, used);
      d->size = (uint64_t)om__http_hex_val(ch);
      d->st = D_SIZE;
      if (d->size > d->max_body - d->body)
        return dec_fail(d, OM_HTTP1_E_CHUNK_TOO_LARGE, at, used);
      break;
    case D_SIZE:
      if (om__http_hex_val(ch) >= 0) {
        /* more digits only make it bigger: past the body limit (or past
         * 64 bits) it is refused at this digit, wherever the line was
         * split */
        if (d->size > (UINT64_MAX >> 4))
          return dec_fail(d, OM_HTTP1_E_CHUNK_TOO_LARGE, at, used);
        d->size = (d->size << 4) | (uint64_t)om__http_hex_val(ch);
        if (d->size > d->max_body - d->body)
          return dec_fail(d, OM_HTTP1_E_CHUNK_TOO_LARGE, at, used);
        break;
      }
      if (ch == ';')
        d->st = D_EXT_NAME0;
      else if (om__http_is_ows(ch)) /* BWS before ";" only */
        d->st = D_SIZE_WS;
      else if (ch == '\r')
        d->st = D_SIZE_LF;
      else
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      break;
    /* chunk-ext = *( BWS ";" BWS chunk-ext-name
     *                [ BWS "=" BWS chunk-ext-val ] ) (RFC 9112 7.1.1) */
    case D_SIZE_WS:
    case D_EXT_VAL_WS:
      if (ch == ';')
        d->st = D_EXT_NAME0;
      else if (!om__http_is_ows(ch))
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      break;
    case D_EXT_NAME0:
      if (om__http_is_tchar(ch))
        d->st = D_EXT_NAME;
      else if (!om__http_is_ows(ch))
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      break;
    case D_EXT_NAME:
      if (ch == '=')
        d->st = D_EXT_VAL0;
      else if (ch == ';')
        d->st = D_EXT_NAME0;
      else if (om__http_is_ows(ch))
        d->st = D_EXT_NAME_WS;
      else if (ch == '\r')
        d->st = D_SIZE_LF;
      else if (!om__http_is_tchar(ch))
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      break;
    case D_EXT_NAME_WS:
      if (ch == '=')
        d->st = D_EXT_VAL0;
      else if (ch == ';')
        d->st = D_EXT_NAME0;
      else if (!om__http_is_ows(ch))
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      break;
    case D_EXT_VAL0: /* chunk-ext-val = token / quoted-string */
      if (om__http_is_tchar(ch))
        d->st = D_EXT_TOKEN;
      else if (ch == '"')
        d->st = D_EXT_QS;
      else if (!om__http_is_ows(ch))
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      break;
    case D_EXT_TOKEN:
      if (ch == ';')
        d->st = D_EXT_NAME0;
      else if (om__http_is_ows(ch))
        d->st = D_EXT_VAL_WS;
      else if (ch == '\r')
        d->st = D_SIZE_LF;
      else if (!om__http_is_tchar(ch))
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      break;
    case D_EXT_QS: /* qdtext = HTAB / SP / %x21 / %x23-5B / %x5D-7E /
                      obs-text (RFC 9110 5.6.4) */
      if (ch == '"')
        d->st = D_EXT_AFTER_QS;
      else if (ch == '\\')
        d->st = D_EXT_QP;
      else if (!(om__http_is_ows(ch) || ch == 0x21 ||
                 (ch >= 0x23 && ch <= 0x7e) || ch >= 0x80))
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      break;
    case D_EXT_QP: /* quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text ) */
      if (!(om__http_is_ows(ch) || om__http_is_fvchar(ch)))
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      d->st = D_EXT_QS;
      break;
    case D_EXT_AFTER_QS:
      if (ch == ';')
        d->st = D_EXT_NAME0;
      else if (om__http_is_ows(ch))
        d->st = D_EXT_VAL_WS;
      else if (ch == '\r')
        d->st = D_SIZE_LF;
      else
        return dec_fail(d, OM_HTTP1_E_CHUNK_EXT, at, used);
      break;
    case D_SIZE_LF:
      if (ch != '\n')
        return dec_fail(d, OM_HTTP1_E_CHUNK_BARE_CR, at, used);
      d->line = 0;
      if (d->size == 0) { /* last-chunk: the trailer section follows */
        d->st = D_TR_START;
      } else {
        d->left = d->size;
        d->st = D_DATA;
      }
      break;
    case D_DATA_CR: /* chunk = chunk-size [ chunk-ext ] CRLF data CRLF */
      if (ch != '\r')
        return dec_fail(d, OM_HTTP1_E_CHUNK_DATA_CRLF, at, used);
      d->st = D_DATA_LF;
      break;
    case D_DATA_LF:
      if (ch != '\n')
        return dec_fail(d, OM_HTTP1_E_CHUNK_DATA_CRLF, at, used);
      d->st = D_SIZE0;
      break;
    case D_TR_START: /* trailer-section = *( field-line CRLF ) (7.1.2) */
      /* an empty Content-Length on the line before is refused here, at
       * the next line's first byte, as http-parser refuses it */
      if (d->tcl_empty && (ch == '\r' || om__http_is_tchar(ch)))
        return dec_fail(d, OM_HTTP1_E_TRAILER_CONTENT_LENGTH, at, used);
      if (ch == '\r') {
        d->st = D_END_LF;
      } else if (om__http_is_tchar(ch)) {
        if (d->max_trailer_fields != 0 &&
            ++d->tr_fields > d->max_trailer_fields)
          return dec_fail(d, OM_HTTP1_E_TRAILER_TOO_MANY, at, used);
        if (d->max_trailer_fields == 0)
          d->tr_fields++;
        d->tcl = TCL_NAME;
        d->tcl_val = 0;
        tcl_byte(d, ch);
        d->st = D_TR_NAME;
      } else {
        return dec_fail(d,
                        ch == '\n' ? OM_HTTP1_E_TRAILER_BARE_LF
                        : om__http_is_ows(ch) && d->tr_fields > 0
                            ? OM_HTTP1_E_TRAILER_OBS_FOLD
                            : OM_HTTP1_E_TRAILER_FIELD,
                        at, used);
      }
      break;
    case D_TR_NAME:
      /* Every trailer field is dropped (RFC 9112 7.1.2 allows it), so one
       * that cannot be a trailer (Content-Length, Transfer-Encoding, Host:
       * RFC 9110 6.5.1) is never applied, and the message it ends is
       * valid as sent. */
      if (ch == ':')
        d->st = D_TR_VALUE;
      else if (!om__http_is_tchar(ch))
        return dec_fail(d,
                        ch == '\n' ? OM_HTTP1_E_TRAILER_BARE_LF
                                   : OM_HTTP1_E_TRAILER_FIELD,
                        at, used);
      tcl_byte(d, ch);
      break;
    case D_TR_VALUE:
      if (ch == '\r')
        d->st = D_TR_LF;
      else if (!om__http_is_fvchar(ch) && !om__http_is_ows(ch))
        return dec_fail(d,
                        ch == '\n' ? OM_HTTP1_E_TRAILER_BARE_LF
                                   : OM_HTTP1_E_TRAILER_FIELD,
                        at, used);
      if (tcl_byte(d, ch) != 0)
        return dec_fail(d, OM_HTTP1_E_TRAILER_CONTENT_LENGTH, at, used);
      break;
    case D_TR_LF:
      if (ch != '\n')
        return dec_fail(d, OM_HTTP1_E_TRAILER_FIELD, at, used);
      d->tcl_empty = d->tcl == TCL_LEAD;
      d->tcl = TCL_OFF;
      d->st = D_TR_START;
      break;
    case D_END_LF:
      if (ch != '\n')
        return dec_fail(d, OM_HTTP1_E_CHUNK_END, at, used);
      d->st = D_DONE;
      *used = i;
      return OM_HTTP1_DONE;
    default:
      return dec_fail(d, OM_HTTP1_E_CHUNK_END, at, used);
    }
  }
  *used = i;
  return OM_HTTP1_MORE;
}
