/*
 * om_tunnel_internal.h: how the HTTP server and the upstream client hand
 * a connection to a tunnel (om_tunnel_t, declared in om_http_server.h)
 * once it leaves HTTP after a 101. Not a public header: only
 * om_http_server_tunnel.c, om_http_server.c and om_upstream*.c include it.
 *
 * The owner keeps its connection struct (the libuv handles are embedded
 * in it and cannot move): the tunnel reads and writes the owner's TCP
 * handle, and gives it back through release() when it is done, for the
 * owner to close the handles its own way.
 */
#ifndef OM_TUNNEL_INTERNAL_H
#define OM_TUNNEL_INTERNAL_H

#include <stddef.h>

#include <uv.h>

#include "om_http_server.h"

/* The tunnel is done with the owner's TCP handle: close it (reset: RST
 * instead of FIN) and free the owner's struct. Runs from loop callbacks
 * or from om_tunnel_close; never again for this tunnel. */
typedef void (*om__tunnel_release_fn)(void *owner, int reset);

/*
 * om__tunnel_new: a tunnel on tcp (reading stopped by the owner, its
 * timers stopped). pre[0, pre_len) are bytes already read past the HTTP
 * head: copied, and delivered to on_data before anything read later.
 * tcp->data is the tunnel's until release. Returns 0 and *out; OM_ENOMEM
 * with nothing changed (the owner still holds the handle).
 */
int om__tunnel_new(uv_tcp_t *tcp, const char *pre, size_t pre_len,
                   om__tunnel_release_fn release, void *owner,
                   const om_tunnel_callbacks_t *cb, void *ud,
                   om_tunnel_t **out);

/*
 * om__tunnel_use_tls: the owner's connection is TLS: the tunnel decrypts
 * what it reads and encrypts what it writes with tls (the owner's engine,
 * which outlives the tunnel's use of the handle), and its shutdown sends
 * close_notify first. pending: plaintext may already wait inside the
 * engine (delivered after the pre-read bytes). Call right after
 * om__tunnel_new.
 */
struct om_tls;
void om__tunnel_use_tls(om_tunnel_t *t, struct om_tls *tls, int pending);

/*
 * om__tunnel_owner_gone: the owner is closing the handle itself (server
 * or pool shutdown). tcp->data is restored to owner at once; the holder's
 * on_close(ud, OM_ESTATE) runs from the loop afterwards, and release is
 * never called.
 */
void om__tunnel_owner_gone(om_tunnel_t *t);

#endif /* OM_TUNNEL_INTERNAL_H */
