/*
 * om_heap.c: the intrusive binary min-heap (see om_heap.h). The tree is
 * complete: node k (1-based, in level order) has children 2k and 2k+1, so
 * the last node's position is the element count and its path from the root
 * is spelled by the bits of that count.
 */
#include "om_heap.h"

void om_heap_init(om_heap_t *h, om_heap_less_fn less) {
  h->root = NULL;
  h->n = 0;
  h->less = less;
}

/* The node at 1-based position pos (1 <= pos <= n): the bits of pos below
 * its leading 1, read from the top, are the path (0 left, 1 right). */
static om_heap_node_t *node_at(const om_heap_t *h, size_t pos) {
  om_heap_node_t *x = h->root;
  int shift = 0;
  while ((pos >> shift) > 1)
    shift++;
  while (shift-- > 0)
    x = ((pos >> shift) & 1) ? x->right : x->left;
  return x;
}

/* Point whatever pointed at `old` (its parent, or the root) at `new`. */
static void replace_child(om_heap_t *h, om_heap_node_t *parent,
                          om_heap_node_t *old, om_heap_node_t *new) {
  if (parent == NULL)
    h->root = new;
  else if (parent->left == old)
    parent->left = new;
  else
    parent->right = new;
}

/* Exchange parent p with its child c: c moves up one level, p down. */
static void swap_down(om_heap_t *h, om_heap_node_t *p, om_heap_node_t *c) {
  om_heap_node_t *cl = c->left, *cr = c->right, *sib;

  if (p->left == c) {
    sib = p->right;
    c->left = p;
    c->right = sib;
  } else {
    sib = p->left;
    c->left = sib;
    c->right = p;
  }
  if (sib != NULL)
    sib->parent = c;
  c->parent = p->parent;
  replace_child(h, p->parent, p, c);
  p->parent = c;
  p->left = cl;
  p->right = cr;
  if (cl != NULL)
    cl->parent = p;
  if (cr != NULL)
    cr->parent = p;
}

static void sift_up(om_heap_t *h, om_heap_node_t *x) {
  while (x->parent != NULL && h->less(x, x->parent))
    swap_down(h, x->parent, x);
}

static void sift_down(om_heap_t *h, om_heap_node_t *x) {
  for (;;) {
    om_heap_node_t *m = x;
    if (x->left != NULL && h->less(x->left, m))
      m = x->left;
    if (x->right != NULL && h->less(x->right, m))
      m = x->right;
    if (m == x)
      return;
    swap_down(h, x, m);
  }
}

void om_heap_insert(om_heap_t *h, om_heap_node_t *n) {
  size_t pos = h->n + 1;
  n->left = n->right = NULL;
  if (pos == 1) {
    n->parent = NULL;
    h->root = n;
  } else {
    om_heap_node_t *p = node_at(h, pos / 2);
    if (pos & 1)
      p->right = n;
    else
      p->left = n;
    n->parent = p;
  }
  h->n++;
  sift_up(h, n);
}

void om_heap_remove(om_heap_t *h, om_heap_node_t *n) {
  /* Move the last node of the bottom row into n's place, then restore the
   * order around it (down, and up: the last node is not necessarily the
   * largest). */
  om_heap_node_t *last = node_at(h, h->n);

  replace_child(h, last->parent, last, NULL);
  h->n--;
  if (last != n) {
    last->left = n->left;
    last->right = n->right;
    last->parent = n->parent;
    if (last->left != NULL)
      last->left->parent = last;
    if (last->right != NULL)
      last->right->parent = last;
    replace_child(h, n->parent, n, last);
    sift_down(h, last);
    sift_up(h, last);
  }
  n->left = n->right = n->parent = NULL;
}
