/*
 * om_list.h: the one intrusive doubly linked list of the tree (after libuv
 * src/queue.h). A list is a circular ring through a head node; an element
 * embeds an om_list_t and is found from it with OM_LIST_ENTRY. Every
 * operation is O(1), allocates nothing and cannot fail.
 *
 *   typedef struct conn_s { om_list_t link; ... } conn_t;
 *   om_list_t conns;                 om_list_init(&conns);
 *   om_list_push_back(&conns, &c->link);
 *   OM_LIST_FOREACH(it, &conns) { conn_t *c = OM_LIST_ENTRY(it, conn_t, link);
 * } om_list_remove(&c->link);        (c->link is then unlinked, see below)
 *
 * A node that is on no list is "unlinked": its pointers point at itself
 * (om_list_init), so om_list_linked() tells membership and removing an
 * unlinked node is a harmless no-op. A zero-filled node (calloc) is neither:
 * om_list_init it before its first use.
 */
#ifndef OM_LIST_H
#define OM_LIST_H

#include <stddef.h>

typedef struct om_list_s {
  struct om_list_s *prev, *next;
} om_list_t;

/* The element of type `type` whose member `field` is the node `node`. */
#define OM_LIST_ENTRY(node, type, field)                                       \
  ((type *)(void *)((char *)(node)-offsetof(type, field)))

/* Iterate `it` over the nodes of `head` in order. The loop body must not
 * remove `it`; use OM_LIST_FOREACH_SAFE for that. */
#define OM_LIST_FOREACH(it, head)                                              \
  for (om_list_t *it = (head)->next; it != (head); it = it->next)

/* The same, with the next node read before the body runs, so the body may
 * remove (or free) `it`. */
#define OM_LIST_FOREACH_SAFE(it, head)                                         \
  for (om_list_t *it = (head)->next, *om__nx_##it = it->next; it != (head);    \
       it = om__nx_##it, om__nx_##it = it->next)

/* An empty list head, or an unlinked node. */
static inline void om_list_init(om_list_t *n) {
  n->prev = n->next = n;
}

/* Whether the head `h` has no element. */
static inline int om_list_empty(const om_list_t *h) {
  return h->next == h;
}

/* Whether the node `n` is on a list (an unlinked node points at itself). */
static inline int om_list_linked(const om_list_t *n) {
  return n->next != n;
}

/* The first and last nodes of `h`, or NULL when it is empty. */
static inline om_list_t *om_list_first(const om_list_t *h) {
  return h->next == h ? NULL : h->next;
}
static inline om_list_t *om_list_last(const om_list_t *h) {
  return h->prev == h ? NULL : h->prev;
}

/* Append the unlinked node `n` at the tail of `h`. */
static inline void om_list_push_back(om_list_t *h, om_list_t *n) {
  n->prev = h->prev;
  n->next = h;
  h->prev->next = n;
  h->prev = n;
}

/* Insert the unlinked node `n` at the head of `h`. */
static inline void om_list_push_front(om_list_t *h, om_list_t *n) {
  n->next = h->next;
  n->prev = h;
  h->next->prev = n;
  h->next = n;
}

/* Take `n` off its list and leave it unlinked; a no-op on an unlinked
 * node. */
static inline void om_list_remove(om_list_t *n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->prev = n->next = n;
}

#endif /* OM_LIST_H */
