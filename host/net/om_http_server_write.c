/*
 * om_http_server_write.c: the HTTP server's write side: corked output and
 * its flush, response heads built from the caller's fields, and the
 * connection's teardown (close, FIN, lingering).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "om_errno.h"
#include "om_http1.h"
#include "om_http_chars.h"
#include "om_http_server_internal.h"
#include "om_log.h"
#include "om_tunnel_internal.h"

/* ------------------------------------------------------------------ */
/* writing */

/* The active response's producer asked to hear when output drains. */
static void conn_check_drain(conn_t *c) {
  req_t *r = c->active;
  om_http_drain_fn cb;
  if (c->phase >= PH_FAILED || r == NULL || r->on_drain == NULL ||
      r->rstate != RS_STREAMING)
    return;
  if (c->ob_len + uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) >
      r->drain_low)
    return;
  cb = r->on_drain;
  r->on_drain = NULL;
  cb(&r->pub);
}

/*
 * A queued write: the bytes the kernel did not take at once, copied after
 * the header, except a lent buffer's, which the write points into and
 * hands back (release) once libuv is done with it, sent or cancelled.
 */
typedef struct {
  uv_write_t req;
  conn_t *c;
  om_http_release_fn release;
  void *ud;
  char data[];
} wreq_t;

static void on_write(uv_write_t *wr, int status) {
  wreq_t *w = (wreq_t *)wr;
  conn_t *c = w->c;
  if (w->release != NULL)
    w->release(w->ud);
  free(w);
  if (c->phase == PH_CLOSING || c->phase == PH_TUNNEL || status == UV_ECANCELED)
    return; /* a tunnel sees a broken connection itself */
  if (status < 0) {
    om__http_conn_close(c, 0);
    return;
  }
  c->t_write = om__http_now_ms(c);
  om__http_conn_update(c);
  conn_check_drain(c);
  if (c->h2 != NULL)
    om__http2_pump(c); /* room for more frames */
}

/*
 * Write bufs in order after everything queued before: straight to the
 * socket when nothing is queued, the rest queued. bufs[lent] (lent < nb)
 * is not copied: the queue points into it and release(ud) is called once
 * it is no longer needed, before return when it is not queued (written
 * at once, or an error); every other buffer's rest is copied. Returns 0,
 * or OM_ESTATE / OM_ENOMEM with the connection marked failed.
 */
static int send_raw_lent(conn_t *c, const uv_buf_t *bufs, unsigned nb,
                         unsigned lent, om_http_release_fn release, void *ud) {
  uv_stream_t *st = (uv_stream_t *)&c->tcp;
  size_t total = 0, done = 0, copied = 0, off = 0;
  unsigned i, nv = 0;
  wreq_t *w;
  uv_buf_t v[16]; /* one per buffer at most */
  int idle_before, lent_queued = 0, rc = OM_ESTATE;
  if (nb > 16) {
    om__http_conn_fail(c);
    goto out;
  }
  for (i = 0; i < nb; i++)
    total += bufs[i].len;
  if (c->phase >= PH_FAILED)
    goto out;
  rc = 0;
  if (total == 0)
    goto out;
  idle_before = uv_stream_get_write_queue_size(st) == 0;
  if (idle_before) {
    int n = uv_try_write(st, bufs, nb);
    if (n >= 0)
      done = (size_t)n;
    else if (n != UV_EAGAIN && n != UV_ENOSYS) {
      om__http_conn_fail(c);
      rc = OM_ESTATE;
      goto out;
    }
  }
  if (done == total)
    goto out;
  for (i = 0, off = done; i < nb; i++) { /* what the copy needs */
    size_t len = bufs[i].len, skip = off < len ? off : len;
    off -= skip;
    if (i != lent)
      copied += len - skip;
  }
  w = malloc(sizeof *w + copied);
  if (w == NULL) {
    om__http_conn_fail(c);
    rc = OM_ENOMEM;
    goto out;
  }
  w->c = c;
  w->release = NULL;
  w->ud = NULL;
  /* runs of copied bytes become one buffer each, the lent rest another */
  for (i = 0, off = 0; i < nb; i++) {
    size_t len = bufs[i].len, skip = 0;
    if (done >= len) {
      done -= len;
      continue;
    }
    skip = done;
    done = 0;
    if (i == lent) {
      v[nv++] = uv_buf_init(bufs[i].base + skip, (unsigned)(len - skip));
      lent_queued = 1;
      continue;
    }
    if (nv == 0 || v[nv - 1].base + v[nv - 1].len != w->data + off)
      v[nv++] = uv_buf_init(w->data + off, 0);
    memcpy(w->data + off, bufs[i].base + skip, len - skip);
    off += len - skip;
    v[nv - 1].len += (unsigned)(len - skip);
  }
  if (lent_queued) {
    w->release = release;
    w->ud = ud;
  }
  if (uv_write(&w->req, st, v, nv, on_write) != 0) {
    free(w);
    om__http_conn_fail(c);
    lent_queued = 0;
    rc = OM_ESTATE;
    goto out;
  }
  if (idle_before)
    c->t_write = om__http_now_ms(c);
  om__http_conn_update(c);
out:
  /* not queued (written, copied, or an error): handed back now */
  if (!lent_queued && release != NULL)
    release(ud);
  return rc;
}

int om__http_conn_send_raw(conn_t *c, const uv_buf_t *bufs, unsigned nb) {
  return send_raw_lent(c, bufs, nb, nb, NULL, NULL);
}

/* Send the HTTP layer's bytes: encrypted first on a TLS connection. */
static int conn_send(conn_t *c, const uv_buf_t *bufs, unsigned nb) {
  if (c->tls != NULL)
    return om__http_tls_send(c, bufs, nb);
  return om__http_conn_send_raw(c, bufs, nb);
}

int om__http_conn_send(conn_t *c, const uv_buf_t *bufs, unsigned nb) {
  return conn_send(c, bufs, nb);
}

/* Drop what is corked (sent or not) and lend the buffer back. */
static void ob_release(conn_t *c) {
  om_http_server_t *s = c->srv;
  om_list_remove(&c->dlink); /* off the dirty list, if on it */
  if (c->ob != NULL) {
    if (s->n_ob_spare < OB_SPARES)
      s->ob_spare[s->n_ob_spare++] = c->ob;
    else
      free(c->ob);
  }
  c->ob = NULL;
  c->ob_len = 0;
}

/* Send what is corked now (in order before anything written later). */
static void conn_flush(conn_t *c) {
  if (c->ob_len > 0 && c->phase < PH_FAILED) {
    uv_buf_t b = uv_buf_init(c->ob, (unsigned)c->ob_len);
    (void)conn_send(c, &b, 1); /* a failure marks the connection */
  }
  ob_release(c);
}

void om__http_conn_flush(conn_t *c) {
  conn_flush(c);
}

static void on_flush_check(uv_check_t *h);

static void on_flush_idle(uv_idle_t *h) {
  (void)h; /* only keeps the loop's poll from blocking before the check */
}

/* Have the corked output flushed at the end of this loop turn. */
static void flush_soon(om_http_server_t *s) {
  uv_check_start(&s->flush_check, on_flush_check);
  uv_idle_start(&s->flush_idle, on_flush_idle);
}

static void on_flush_check(uv_check_t *h) {
  om_http_server_t *s = h->data;
  om_list_t *it;
  while ((it = om_list_first(&s->dirty)) != NULL) {
    conn_t *c = OM_LIST_ENTRY(it, conn_t, dlink);
    conn_flush(c);
    conn_check_drain(c);
    if (c->h2 != NULL)
      om__http2_pump(c);
  }
  uv_check_stop(h);
  uv_idle_stop(&s->flush_idle);
}

void om__http_conn_mark_dirty(conn_t *c) {
  om_http_server_t *s = c->srv;
  if (c->phase >= PH_FAILED || om_list_linked(&c->dlink))
    return;
  if (om_list_empty(&s->dirty))
    flush_soon(s);
  om_list_push_front(&s->dirty, &c->dlink);
}

/*
 * Write bufs (at most 3) in order after everything written before:
 * gathered when small (see OB_CAP), else sent now behind the gathered
 * bytes. With release, bufs[lent] is lent (send_raw_lent) on a plaintext
 * connection, copied elsewhere (TLS encrypts it into its own buffers);
 * release(ud) is called once either way. Returns 0, or OM_ESTATE /
 * OM_ENOMEM with the connection marked failed.
 */
int om__http_conn_write_lent(conn_t *c, const uv_buf_t *bufs, unsigned nb,
                             unsigned lent, om_http_release_fn release,
                             void *ud) {
  om_http_server_t *s = c->srv;
  size_t total = 0;
  uv_buf_t v[4];
  unsigned i;
  int rc;
  if (c->phase >= PH_FAILED) {
    rc = OM_ESTATE;
    goto done;
  }
  for (i = 0; i < nb; i++)
    total += bufs[i].len;
  rc = 0;
  if (total == 0)
    goto done;
  if (c->ob_len + total <= OB_CAP) {
    if (c->ob == NULL)
      c->ob = s->n_ob_spare > 0 ? s->ob_spare[--s->n_ob_spare] : malloc(OB_CAP);
    if (c->ob != NULL) {
      for (i = 0; i < nb; i++) {
        memcpy(c->ob + c->ob_len, bufs[i].base, bufs[i].len);
        c->ob_len += bufs[i].len;
      }
      if (!om_list_linked(&c->dlink)) {
        if (om_list_empty(&s->dirty))
          flush_soon(s);
        om_list_push_front(&s->dirty, &c->dlink);
      }
      goto done;
    }
    /* no buffer: send directly, it is only slower */
  }
  i = 0;
  if (c->ob_len > 0)
    v[i++] = uv_buf_init(c->ob, (unsigned)c->ob_len);
  for (unsigned k = 0; k < nb && i < 4; k++)
    v[i++] = bufs[k];
  if (c->tls == NULL && release != NULL) {
    rc = send_raw_lent(c, v, i, lent + (c->ob_len > 0), release, ud);
    ob_release(c);
    return rc;
  }
  rc = conn_send(c, v, i);
  ob_release(c);
done:
  if (release != NULL)
    release(ud);
  return rc;
}

int om__http_conn_write(conn_t *c, const uv_buf_t *bufs, unsigned nb) {
  return om__http_conn_write_lent(c, bufs, nb, nb, NULL, NULL);
}

/* Bounded string builder; the caller reserves the capacity up front. */
typedef struct {
  char *p;
  size_t len;
} sb_t;

static void sb_put(sb_t *b, const char *s, size_t n) {
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static void sb_puts(sb_t *b, const char *s) {
  sb_put(b, s, strlen(s));
}

static void sb_u64(sb_t *b, uint64_t v) {
  char t[24];
  sb_put(b, t, om__http_u64_dec(t, v));
}

const char *om__http_reason_phrase(int status) {
  return om_http1_reason_phrase(status);
}

/* ------------------------------------------------------------------ */
/* response headers from the caller */

static size_t hdr_len(const char *s, size_t n) {
  return n != 0 ? n : (s != NULL ? strlen(s) : 0);
}

/* Names are tokens, values field-content (no CTL but HTAB) so a caller
 * cannot split the response (RFC 9110 5.5); framing is ours. checked: the
 * caller has already held every byte to those rules (fields relayed from
 * om_upstream, which refuses a head that breaks them), so only the
 * fields that decide framing are examined. */
int om__http_check_resp_headers(const om_http_header_t *h, size_t n,
                                int allow_cl, int checked, rh_t *out) {
  size_t i, j;
  memset(out, 0, sizeof *out);
  if (n > 0 && h == NULL)
    return OM_EINVAL;
  for (i = 0; i < n; i++) {
    const char *name = h[i].name, *value = h[i].value;
    size_t nl, vl;
    if (name == NULL || value == NULL)
      return OM_EINVAL;
    nl = hdr_len(name, h[i].name_len);
    vl = hdr_len(value, h[i].value_len);
    if (nl == 0)
      return OM_EINVAL;
    for (j = 0; j < nl && !checked; j++)
      if (!om__http_is_tchar((unsigned char)name[j]))
        return OM_EINVAL;
    for (j = 0; j < vl && !checked; j++) {
      unsigned ch = (unsigned char)value[j];
      if (!om__http_is_fvchar(ch) && !om__http_is_ows(ch))
        return OM_EINVAL;
    }
    if (om__http_ci_eq(name, nl, "content-length")) {
      uint64_t v = 0;
      if (!allow_cl || out->has_cl || vl == 0 || vl > 19)
        return OM_EINVAL;
      for (j = 0; j < vl; j++) {
        if (!om__http_is_digit((unsigned char)value[j]))
          return OM_EINVAL;
        v = v * 10 + (uint64_t)(value[j] - '0');
      }
      out->has_cl = 1;
      out->cl = v;
    } else if (om__http_ci_eq(name, nl, "transfer-encoding")) {
      return OM_EINVAL;
    } else if (om__http_ci_eq(name, nl, "connection")) {
      if (!om__http_ci_eq(value, vl, "close"))
        return OM_EINVAL;
      out->close = 1;
    } else if (om__http_ci_eq(name, nl, "date")) {
      out->has_date = 1;
    }
    out->bytes += nl + vl + 4;
  }
  return 0;
}

/*
 * The status line and header section; returned in stackbuf when it fits,
 * else malloc'ed (the caller frees it when it differs from stackbuf).
 * NULL on ENOMEM.
 */
char *om__http_build_head(om_http_server_t *s, char *stackbuf, size_t stackcap,
                          int status, const om_http_header_t *h, size_t n,
                          const rh_t *rh, int add_cl, uint64_t cl, int chunked,
                          int conn_hdr, size_t *len) {
  size_t cap = 256 + rh->bytes, i;
  sb_t b;
  char *p = cap <= stackcap ? stackbuf : malloc(cap);
  if (p == NULL)
    return NULL;
  b.p = p;
  b.len = 0;
  sb_puts(&b, "HTTP/1.1 ");
  sb_u64(&b, (uint64_t)status);
  sb_puts(&b, " ");
  /* reason phrases are at most 31 bytes in om_http1_reason_phrase */
  {
    const char *r = om__http_reason_phrase(status);
    size_t rl = strlen(r);
    sb_put(&b, r, rl > 40 ? 40 : rl);
  }
  sb_puts(&b, "\r\n");
  for (i = 0; i < n; i++) {
    sb_put(&b, h[i].name, hdr_len(h[i].name, h[i].name_len));
    sb_puts(&b, ": ");
    sb_put(&b, h[i].value, hdr_len(h[i].value, h[i].value_len));
    sb_puts(&b, "\r\n");
  }
  if (!rh->has_date) {
    sb_puts(&b, "Date: ");
    sb_puts(&b, om__http_date(s));
    sb_puts(&b, "\r\n");
  }
  if (add_cl) {
    sb_puts(&b, "Content-Length: ");
    sb_u64(&b, cl);
    sb_puts(&b, "\r\n");
  }
  if (chunked)
    sb_puts(&b, "Transfer-Encoding: chunked\r\n");
  if (conn_hdr == CH_CLOSE)
    sb_puts(&b, "Connection: close\r\n");
  else if (conn_hdr == CH_KEEP_ALIVE)
    sb_puts(&b, "Connection: keep-alive\r\n");
  else if (conn_hdr == CH_UPGRADE)
    sb_puts(&b, "Connection: upgrade\r\n");
  sb_puts(&b, "\r\n");
  *len = b.len;
  return p;
}

/* ------------------------------------------------------------------ */
/* connection teardown */

static void on_conn_handle_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  om_http_server_t *s = c->srv;
  if (--c->handles > 0)
    return;
  om_list_remove(&c->link);
  om__http_unreserve(c);
  s->m.connections_active--;
  om__http_publish_open(s);
  ob_release(c);
  if (c->tls != NULL)
    om__http_tls_free(c);
  om__http_in_release(c);
  free(c->fields);
  free(c);
  om__http_srv_maybe_finish(s);
}

/*
 * Close now. Runs on_close of the active request, so only from loop
 * callbacks (or when no request is active). reset: RST instead of FIN.
 */
void om__http_conn_close(conn_t *c, int reset) {
  enum phase was = c->phase;
  req_t *r;
  if (c->phase == PH_CLOSING)
    return;
  if (!reset && c->phase != PH_FAILED && c->tls != NULL) {
    om__http_tls_goodbye(c);
  } else if (!reset && c->phase != PH_FAILED && c->ob_len > 0) {
    /* what a write before the close would have sent at once */
    uv_buf_t b = uv_buf_init(c->ob, (unsigned)c->ob_len);
    (void)uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
  }
  ob_release(c);
  c->phase = PH_CLOSING;
  if (c->tunnel != NULL) {
    om__tunnel_owner_gone(c->tunnel);
    c->tunnel = NULL;
  }
  c->sbody = NULL;
  om__http2_close(c);
  om__http_conn_drop_requests(c);
  r = c->active;
  c->active = NULL;
  if (r != NULL) {
    r->conn = NULL;
    c->srv->m.responses_aborted++;
    if (r->on_close != NULL) {
      r->in_close_cb = 1;
      r->on_close(&r->pub);
      om__http_req_free(r);
    }
  }
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
  }
  /* after our FIN, a reset would only destroy what the client has yet
   * to read */
  if (!reset || was == PH_SHUTTING || was == PH_LINGERING ||
      uv_tcp_close_reset(&c->tcp, on_conn_handle_closed) != 0)
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_shutdown(uv_shutdown_t *sr, int status) {
  conn_t *c = sr->handle->data;
  if (c->phase >= PH_FAILED || status == UV_ECANCELED)
    return; /* closing, or to be closed from the timer */
  if (status < 0 || c->no_linger || c->eof || c->srv->closing) {
    om__http_conn_close(c, 0);
    return;
  }
  /* RFC 9112 9.6: keep reading (and dropping) until the client closes,
   * so unread bytes do not turn our FIN into a reset that could destroy
   * the answer before the client reads it. */
  c->phase = PH_LINGERING;
  c->t_linger = om__http_now_ms(c);
  om__http_conn_update(c);
}

/*
 * Finish the connection gracefully: nothing more is parsed or dispatched,
 * queued bytes are flushed, then FIN (and a lingering read unless
 * no_linger). Safe inside API calls (no request is active).
 */
void om__http_conn_finish(conn_t *c, int no_linger) {
  if (c->phase >= PH_SHUTTING)
    return;
  om__http_conn_drop_requests(c);
  conn_flush(c); /* uv_shutdown waits for queued writes, not corked ones */
  if (c->phase == PH_FAILED)
    return;
  c->phase = PH_SHUTTING;
  c->discarded = 0; /* what lingering may drop before the cut */
  c->no_linger = no_linger ? 1 : 0;
  c->shut.data = c;
  if (c->tls != NULL)
    om__http_tls_notify(c); /* close_notify, before our FIN */
  if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
    om__http_conn_fail(c);
    return;
  }
  om__http_conn_update(c);
}
