/*
 * om_heap.h: the tree's binary min-heaps, in two shapes.
 *
 * The intrusive heap (after libuv src/heap-inl.h): an element embeds an
 * om_heap_node_t and is found from it with OM_HEAP_ENTRY; nodes are linked
 * by pointers, so insert and remove of any element are O(log n), allocate
 * nothing and cannot fail. It is what a timer or deadline queue needs, where
 * elements leave from the middle (a cancelled waiter, a renewed lease).
 *
 * The array heap (OM_HEAP_ARRAY_SIFT_DOWN): a sift-down over a plain array
 * of values, for a heap that is built once and popped (a top-k merge).
 *
 * Order: `less` decides; a less that breaks ties by insertion order (a
 * sequence number) makes the heap deterministic and FIFO among equals.
 */
#ifndef OM_HEAP_H
#define OM_HEAP_H

#include <stddef.h>

typedef struct om_heap_node_s {
  struct om_heap_node_s *left, *right, *parent;
} om_heap_node_t;

/* Strict order on two nodes: nonzero when a comes before b. */
typedef int (*om_heap_less_fn)(const om_heap_node_t *a,
                               const om_heap_node_t *b);

typedef struct om_heap_s {
  om_heap_node_t *root;
  size_t n;
  om_heap_less_fn less;
} om_heap_t;

/* The element of type `type` whose member `field` is the node `node`. */
#define OM_HEAP_ENTRY(node, type, field)                                       \
  ((type *)(void *)((char *)(node)-offsetof(type, field)))

/* An empty heap ordered by `less`. */
void om_heap_init(om_heap_t *h, om_heap_less_fn less);

/* The first node in `less` order, or NULL when the heap is empty. */
static inline om_heap_node_t *om_heap_min(const om_heap_t *h) {
  return h->root;
}

/* Add `n`, which must not be in any heap (its links are overwritten). */
void om_heap_insert(om_heap_t *h, om_heap_node_t *n);

/* Take `n`, which must be in `h`, out of it; its links are cleared. */
void om_heap_remove(om_heap_t *h, om_heap_node_t *n);

/*
 * Define `static void name(type *a, size_t n, size_t i)`: restore the heap
 * order of the array a[0..n) below index i, with `less(const type *, const
 * type *)` as the order (children of i at 2i+1 and 2i+2).
 */
#define OM_HEAP_ARRAY_SIFT_DOWN(name, type, less)                              \
  static void name(type *a, size_t n, size_t i) {                              \
    for (;;) {                                                                 \
      size_t c = 2 * i + 1, m = i;                                             \
      type t;                                                                  \
      if (c < n && less(&a[c], &a[m]))                                         \
        m = c;                                                                 \
      if (c + 1 < n && less(&a[c + 1], &a[m]))                                 \
        m = c + 1;                                                             \
      if (m == i)                                                              \
        return;                                                                \
      t = a[i];                                                                \
      a[i] = a[m];                                                             \
      a[m] = t;                                                                \
      i = m;                                                                   \
    }                                                                          \
  }

#endif /* OM_HEAP_H */
