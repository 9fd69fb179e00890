/* test_heap_list.c: the intrusive heap and list of core/ (om_heap.h,
 * om_list.h), against a model: random inserts and removals from the middle,
 * checked after every step. */
#include "om_test.h"

#include <string.h>

#include "om_heap.h"
#include "om_list.h"
#include "om_rng.h"

#define N 512

typedef struct {
  uint64_t key, seq;
  int in;
  om_heap_node_t node;
  om_list_t link;
} item_t;

static int item_less(const om_heap_node_t *a, const om_heap_node_t *b) {
  const item_t *x = OM_HEAP_ENTRY(a, item_t, node);
  const item_t *y = OM_HEAP_ENTRY(b, item_t, node);
  return x->key != y->key ? x->key < y->key : x->seq < y->seq;
}

/* The smallest (key, seq) among the items in the heap, by brute force. */
static item_t *model_min(item_t *it, size_t n) {
  item_t *m = NULL;
  for (size_t i = 0; i < n; i++)
    if (it[i].in && (m == NULL || item_less(&it[i].node, &m->node)))
      m = &it[i];
  return m;
}

/* Every node's parent link matches, and no child comes before its parent. */
static size_t check_tree(const om_heap_node_t *x, const om_heap_node_t *parent,
                         om_heap_less_fn less) {
  if (x == NULL)
    return 0;
  assert_ptr_equal(x->parent, parent);
  if (parent != NULL)
    assert_false(less(x, parent));
  return 1 + check_tree(x->left, x, less) + check_tree(x->right, x, less);
}

static void heap_matches_a_model_under_random_churn(void **state) {
  static item_t it[N];
  om_heap_t h;
  om_rng_t rng;
  size_t in = 0;
  uint64_t seq = 0;
  om_rng_seed(&rng, 7);
  memset(it, 0, sizeof it);
  om_heap_init(&h, item_less);
  assert_null(om_heap_min(&h));
  for (int step = 0; step < 20000; step++) {
    item_t *x = &it[om_rng_below(&rng, N)];
    uint32_t op = om_rng_below(&rng, 3);
    if (!x->in) {
      x->key = om_rng_below(&rng, 64); /* many equal keys: the tie-break */
      x->seq = seq++;
      om_heap_insert(&h, &x->node);
      x->in = 1;
      in++;
    } else if (op == 0) {
      om_heap_remove(&h, &x->node);
      assert_null(x->node.parent);
      x->in = 0;
      in--;
    } else if (op == 1 && in > 0) {
      item_t *m = OM_HEAP_ENTRY(om_heap_min(&h), item_t, node);
      om_heap_remove(&h, &m->node);
      m->in = 0;
      in--;
    }
    assert_int_equal(h.n, in);
    assert_int_equal(check_tree(h.root, NULL, item_less), in);
    item_t *want = model_min(it, N);
    if (want == NULL)
      assert_null(om_heap_min(&h));
    else
      assert_ptr_equal(OM_HEAP_ENTRY(om_heap_min(&h), item_t, node), want);
  }
}

static int int_less(const int *a, const int *b) {
  return *a < *b;
}
OM_HEAP_ARRAY_SIFT_DOWN(int_sift, int, int_less)

static void array_heap_pops_in_order(void **state) {
  int a[257];
  size_t n = sizeof a / sizeof a[0];
  om_rng_t rng;
  int last = -1;
  om_rng_seed(&rng, 11);
  for (size_t i = 0; i < n; i++)
    a[i] = (int)om_rng_below(&rng, 100);
  for (size_t i = n / 2; i-- > 0;)
    int_sift(a, n, i);
  while (n > 0) {
    OM_ASSERT_CMP(a[0], >=, last);
    last = a[0];
    a[0] = a[--n];
    int_sift(a, n, 0);
  }
}

static void list_keeps_order_and_unlinks(void **state) {
  static item_t it[N];
  om_list_t head;
  om_rng_t rng;
  int order[N], n = 0;
  om_rng_seed(&rng, 3);
  om_list_init(&head);
  assert_true(om_list_empty(&head));
  assert_null(om_list_first(&head));
  for (int i = 0; i < N; i++)
    om_list_init(&it[i].link);
  for (int step = 0; step < 5000; step++) {
    int i = (int)om_rng_below(&rng, N);
    if (om_list_linked(&it[i].link)) {
      om_list_remove(&it[i].link);
      assert_false(om_list_linked(&it[i].link));
      om_list_remove(&it[i].link); /* unlinked: a no-op */
      for (int k = 0; k < n; k++)
        if (order[k] == i) {
          memmove(&order[k], &order[k + 1],
                  (size_t)(n - k - 1) * sizeof *order);
          n--;
          break;
        }
    } else if (om_rng_below(&rng, 2) == 0) {
      om_list_push_back(&head, &it[i].link);
      order[n++] = i;
    } else {
      om_list_push_front(&head, &it[i].link);
      memmove(&order[1], &order[0], (size_t)n * sizeof *order);
      order[0] = i;
      n++;
    }
    int k = 0;
    OM_LIST_FOREACH(node, &head) {
      OM_ASSERT_CMP(k, <, n);
      assert_ptr_equal(OM_LIST_ENTRY(node, item_t, link), &it[order[k]]);
      k++;
    }
    assert_int_equal(k, n);
    if (n > 0) {
      assert_ptr_equal(om_list_first(&head), &it[order[0]].link);
      assert_ptr_equal(om_list_last(&head), &it[order[n - 1]].link);
    }
  }
  /* the safe walk may remove as it goes */
  OM_LIST_FOREACH_SAFE(node, &head) {
    om_list_remove(node);
  }
  assert_true(om_list_empty(&head));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(heap_matches_a_model_under_random_churn),
      cmocka_unit_test(array_heap_pops_in_order),
      cmocka_unit_test(list_keeps_order_and_unlinks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
