/*
 * test_snapshot_json.c: snapshot and registration JSON. Exact encodings,
 * round trips through jansson and our decoder, cached encodings shared by
 * every caller (and the SSE block read back by the SSE parser), pages and
 * forged tokens, and decoding malformed, oversized and hostile input:
 * deep nesting, huge numbers, NaN, duplicate keys, invalid UTF-8. Jansson
 * allocates through the test's wrapped malloc, so fault injection reaches
 * its allocations too.
 */
#include "om_test.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <zlib.h>

#include "om_errno.h"
#include "om_rng.h"
#include "om_snapshot.h"
#include "om_snapshot_json.h"
#include "om_sse.h"

static om_instance_t inst(const char *id, const char *url) {
  om_instance_t in;
  memset(&in, 0, sizeof in);
  in.id = (char *)id;
  in.url = (char *)url;
  in.weight = 1.0;
  in.ttl_ms = 10000;
  return in;
}

static om_snapshot_t *snap_of(const char *svc, uint64_t rev,
                              const om_instance_t *in, size_t n) {
  om_snapshot_t *s = NULL;
  assert_int_equal(om_snapshot_new(svc, rev, in, n, &s, NULL, NULL, NULL), 0);
  return s;
}

/* jansson's allocations go through __wrap_malloc like ours. */
static void *wrapped_malloc(size_t n) {
  return malloc(n);
}
static void wrapped_free(void *p) {
  free(p);
}
static int setup(void **state) {
  (void)state;
  json_set_alloc_funcs(wrapped_malloc, wrapped_free);
  return 0;
}

/* ---- encoding ---- */

static void encode_exact(void **state) {
  om_kv_t kv[2] = {{"z", "last"}, {"a", "first"}};
  om_instance_t in[2] = {inst("b", "http://b:81"), inst("a", "https://a")};
  om_snapshot_t *s;
  char *out;
  size_t len;
  (void)state;
  in[0].zone = "eu-1";
  in[0].weight = 0.1;
  in[0].metadata = kv;
  in[0].n_metadata = 2;
  in[1].weight = 2500;
  in[1].ttl_ms = 1000;
  s = snap_of("api", 1700000000000001ull, in, 2);
  assert_int_equal(om_snapshot_to_json(s, &out, &len), 0);
  assert_string_equal(
      out, "{\"service\":\"api\",\"revision\":1700000000000001,\"instances\":["
           "{\"id\":\"a\",\"url\":\"https://a\",\"weight\":2500,\"ttl_ms\":"
           "1000,\"metadata\":{}},"
           "{\"id\":\"b\",\"url\":\"http://b:81\",\"weight\":0.1,\"zone\":"
           "\"eu-1\",\"ttl_ms\":10000,\"metadata\":{\"a\":\"first\",\"z\":"
           "\"last\"}}]}");
  assert_int_equal(len, strlen(out));
  free(out);
  om_snapshot_unref(s);

  s = snap_of("empty", 5, NULL, 0);
  assert_int_equal(om_snapshot_to_json(s, &out, &len), 0);
  assert_string_equal(
      out, "{\"service\":\"empty\",\"revision\":5,\"instances\":[]}");
  free(out);
  assert_int_equal(om_snapshot_to_json(s, NULL, &len), OM_EINVAL);
  om_snapshot_unref(s);
}

/* Hostile-but-valid strings survive: escapes, controls, UTF-8, numbers. */
static void encode_round_trip(void **state) {
  static const double weights[] = {1.0 / 3.0, 0.1,    1e-300, 9999.999999,
                                   10000,     0.3e-7, 123.456};
  om_kv_t kv[4] = {{"quote\"back\\slash", "line\nbreak\r\ttab\b\f"},
                   {"ctl", "\x01\x1f\x7f"},
                   {"\xc3\xa9t\xc3\xa9", "\xf0\x9f\x98\x80 \xe2\x80\xa8"},
                   {"empty", ""}};
  om_instance_t in[8];
  char ids[8][8];
  om_snapshot_t *s, *back = NULL;
  om_json_error_t err;
  char *out;
  size_t len;
  (void)state;
  for (int i = 0; i < 7; i++) {
    snprintf(ids[i], sizeof ids[i], "i%d", i);
    in[i] = inst(ids[i], "http://[::1]:8080/p;q='x'&y=$");
    in[i].weight = weights[i];
    in[i].zone = i % 2 ? "zone \"q\" \\" : NULL;
    in[i].metadata = kv;
    in[i].n_metadata = (size_t)(i % 5);
  }
  s = snap_of("svc.x_y-z", 42, in, 7);
  assert_int_equal(om_snapshot_to_json(s, &out, &len), 0);
  assert_non_null(strstr(out, "\"weight\":0.1,"));
  assert_non_null(strstr(out, "\\u0001\\u001f\x7f"));
  assert_non_null(strstr(out, "line\\nbreak\\r\\ttab\\b\\f"));
  {
    json_error_t je;
    json_t *j = json_loadb(out, len, JSON_REJECT_DUPLICATES, &je);
    if (j == NULL)
      fail_msg("jansson rejects our output: %s", je.text);
    json_decref(j);
  }
  if (om_snapshot_from_json(out, len, &back, &err) != 0)
    fail_msg("decode: %s", err.text);
  assert_string_equal(om_snapshot_service(back), "svc.x_y-z");
  assert_int_equal(om_snapshot_revision(back), 42);
  assert_int_equal(om_snapshot_count(back), 7);
  for (size_t i = 0; i < 7; i++)
    assert_true(om_instance_equal(om_snapshot_instance(back, i),
                                  om_snapshot_instance(s, i)));
  free(out);
  om_snapshot_unref(back);
  om_snapshot_unref(s);
}

static void encode_fault_injection(void **state) {
  om_instance_t in[30];
  char ids[30][8];
  om_snapshot_t *s;
  (void)state;
  for (int i = 0; i < 30; i++) {
    snprintf(ids[i], sizeof ids[i], "n%02d", i);
    in[i] = inst(ids[i], "http://host.example:8080/a/long/path");
  }
  s = snap_of("svc", 9, in, 30);
  for (long n = 0;; n++) {
    char *out = NULL;
    size_t len = 0;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_snapshot_to_json(s, &out, &len);
    om_test_alloc_reset();
    if (rc == 0) {
      free(out);
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(out);
  }
  for (long n = 0;; n++) {
    const char *d = NULL;
    size_t len = 0;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_snapshot_sse_cached(s, &d, &len);
    om_test_alloc_reset();
    if (rc == 0)
      break;
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(d);
  }
  om_snapshot_unref(s);
}

/* ---- cached encodings ---- */

typedef struct {
  int events;
  char type[32];
  char id[32];
  char *data;
  size_t data_len;
} sse_seen_t;

static int on_sse(void *ud, const om_sse_event_t *ev) {
  sse_seen_t *x = ud;
  x->events++;
  snprintf(x->type, sizeof x->type, "%s", ev->type);
  snprintf(x->id, sizeof x->id, "%s", ev->id);
  x->data = malloc(ev->data_len + 1);
  memcpy(x->data, ev->data, ev->data_len + 1);
  x->data_len = ev->data_len;
  return 0;
}

static void cached_encodings_are_shared(void **state) {
  om_instance_t in[2] = {inst("a", "http://a"), inst("b", "http://b")};
  om_snapshot_t *s = snap_of("api", 77, in, 2);
  const char *j1, *j2, *e1, *e2;
  size_t l1, l2, el1, el2;
  char *fresh, *want;
  size_t flen;
  om_sse_parser_t *p;
  sse_seen_t seen = {0};
  (void)state;
  assert_int_equal(om_snapshot_json_cached(s, &j1, &l1), 0);
  assert_ptr_equal(om_snapshot_cache(s, OM_SNAPSHOT_SLOT_JSON) != NULL, 1);
  /* a thousand watchers: no allocation, one buffer */
  om_test_fail_alloc_after(0);
  for (int i = 0; i < 1000; i++) {
    assert_int_equal(om_snapshot_json_cached(s, &j2, &l2), 0);
    assert_ptr_equal(j2, j1);
  }
  om_test_alloc_reset();
  assert_int_equal(om_snapshot_to_json(s, &fresh, &flen), 0);
  assert_int_equal(l1, flen);
  assert_string_equal(j1, fresh);

  assert_int_equal(om_snapshot_sse_cached(s, &e1, &el1), 0);
  om_test_fail_alloc_after(0);
  assert_int_equal(om_snapshot_sse_cached(s, &e2, &el2), 0);
  om_test_alloc_reset();
  assert_ptr_equal(e1, e2);
  want = malloc(flen + 64);
  snprintf(want, flen + 64, "event: snapshot\nid: 77\ndata: %s\n\n", fresh);
  assert_string_equal(e1, want);
  assert_int_equal(el1, strlen(want));

  /* what a watch client's SSE parser reads back */
  assert_int_equal(om_sse_parser_new(NULL, &p), 0);
  assert_int_equal(om_sse_parser_feed(p, e1, el1, on_sse, &seen), 0);
  assert_int_equal(seen.events, 1);
  assert_string_equal(seen.type, "snapshot");
  assert_string_equal(seen.id, "77");
  assert_string_equal(seen.data, fresh);
  om_sse_parser_free(p);
  free(seen.data);
  free(want);
  free(fresh);
  assert_int_equal(om_snapshot_json_cached(NULL, &j1, &l1), OM_EINVAL);
  om_snapshot_unref(s); /* frees both slots: ASan would report a leak */
}

/*
 * A big snapshot's encodings are assembled from per-chunk fragments that
 * later revisions share: after one put and one removal, the chunks the
 * edit did not touch keep their fragment (the same bytes, not encoded
 * again), and the whole encoding is byte for byte what the uncached
 * encoder and om_sse_encode make of the snapshot, escapes included.
 */
static void chunk_fragments_follow_edits(void **state) {
  enum { N = 1000 };
  static om_instance_t in[N];
  static char ids[N][8];
  om_kv_t kv[2] = {{"note", "line one\nline \"two\" \xc3\xa9\t"}, {"v", "1"}};
  om_snapshot_t *s1, *s2;
  om_instance_t put = inst("n0500", "http://changed:81");
  const char *rm[] = {"n0999"};
  size_t nc, same = 0;
  (void)state;
  for (int i = 0; i < N; i++) {
    snprintf(ids[i], sizeof ids[i], "n%04d", i);
    in[i] = inst(ids[i], "http://10.0.0.1:8080/p");
    in[i].metadata = kv;
    in[i].n_metadata = 2;
  }
  s1 = snap_of("big", 5, in, N);
  nc = om_snapshot_chunk_count(s1);
  OM_ASSERT_CMP(nc, >=, 4);
  assert_int_equal(
      om_snapshot_edit(s1, 6, &put, 1, rm, 1, &s2, NULL, NULL, NULL), 0);
  for (int round = 0; round < 2; round++) {
    om_snapshot_t *s = round == 0 ? s1 : s2;
    const char *ev, *js;
    size_t le, lj, need = 0;
    char *fresh, *want, id[24];
    size_t flen;
    om_sse_event_t e;
    assert_int_equal(om_snapshot_sse_cached(s, &ev, &le), 0);
    assert_int_equal(om_snapshot_json_cached(s, &js, &lj), 0);
    assert_int_equal(om_snapshot_to_json(s, &fresh, &flen), 0);
    assert_int_equal(lj, flen);
    assert_string_equal(js, fresh);
    snprintf(id, sizeof id, "%d", 5 + round);
    memset(&e, 0, sizeof e);
    e.type = "snapshot";
    e.type_len = 8;
    e.id = id;
    e.id_len = strlen(id);
    e.data = fresh;
    e.data_len = flen;
    e.retry_ms = -1;
    assert_int_equal(om_sse_encode_alloc(&e, &want, &need), 0);
    assert_int_equal(le, need);
    assert_memory_equal(ev, want, need);
    free(want);
    free(fresh);
  }
  /* the edit touched the chunks of n0500 and n0999 only */
  for (size_t k = 0; k < om_snapshot_chunk_count(s2); k++)
    for (size_t j = 0; j < nc; j++)
      if (om_snapshot_chunk_cache(s2, k) == om_snapshot_chunk_cache(s1, j))
        same++;
  OM_ASSERT_CMP(same, ==, nc - 2);
  assert_null(om_snapshot_chunk_cache(s1, nc));
  assert_int_equal(om_snapshot_set_chunk_cache(s1, 0, (void *)ids, NULL),
                   OM_ESTATE);
  om_snapshot_unref(s1); /* s2 still holds the shared chunks and fragments */
  om_snapshot_unref(s2);
}

/*
 * The GET answer compressed: gzip that inflates to exactly the cached
 * document closed with "next_page_token": null, far smaller for a big
 * service, cached (the same bytes, no allocation, on the next call), in
 * a slot of its own per flags, and no leak or crash when memory runs out.
 */
static void get_gzip_is_the_document_compressed(void **state) {
  enum { N = 600 };
  static om_instance_t in[N];
  static char ids[N][8];
  static char out[1 << 18];
  om_snapshot_t *s;
  const char *gz, *gz2, *js;
  size_t lg, lg2, lj;
  z_stream z;
  char *want;
  (void)state;
  for (int i = 0; i < N; i++) {
    snprintf(ids[i], sizeof ids[i], "n%04d", i);
    in[i] = inst(ids[i], "http://10.0.0.1:8080/p");
  }
  s = snap_of("big", 5, in, N);
  for (long n = 0;; n++) { /* out of memory at each allocation in turn */
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_snapshot_get_gzip_cached_flags(s, 0, &gz, &lg);
    om_test_alloc_reset();
    if (rc == 0)
      break;
    assert_int_equal(rc, OM_ENOMEM);
  }
  assert_int_equal(om_snapshot_json_cached(s, &js, &lj), 0);
  OM_ASSERT_CMP(lg * 5, <, lj);
  memset(&z, 0, sizeof z);
  assert_int_equal(inflateInit2(&z, 15 + 16), Z_OK);
  z.next_in = (Bytef *)(uintptr_t)gz;
  z.avail_in = (uInt)lg;
  z.next_out = (Bytef *)out;
  z.avail_out = sizeof out;
  assert_int_equal(inflate(&z, Z_FINISH), Z_STREAM_END);
  want = malloc(lj + 32);
  snprintf(want, lj + 32, "%.*s,\"next_page_token\":null}", (int)(lj - 1), js);
  assert_int_equal(sizeof out - z.avail_out, strlen(want));
  assert_memory_equal(out, want, strlen(want));
  inflateEnd(&z);
  free(want);
  om_test_fail_alloc_after(0);
  assert_int_equal(om_snapshot_get_gzip_cached_flags(s, 0, &gz2, &lg2), 0);
  om_test_alloc_reset();
  assert_ptr_equal(gz2, gz);
  assert_int_equal(om_snapshot_get_gzip_cached_flags(
                       s, OM_SNAPSHOT_JSON_WARMING, &gz2, &lg2),
                   0);
  assert_ptr_not_equal(gz2, gz);
  assert_int_equal(om_snapshot_get_gzip_cached_flags(s, 8, &gz2, &lg2),
                   OM_EINVAL);
  om_snapshot_unref(s);
}

/* ---- the warming member ---- */

/*
 * A warming plane's encodings carry "warming": true after "revision" and
 * live in their own slots beside the plain ones (both served from one
 * snapshot while a plane warms up); the decoder reports the member, and
 * refuses one that is not a boolean, naming it.
 */
static void warming_member(void **state) {
  om_instance_t in[1] = {inst("a", "http://a:80")};
  om_snapshot_t *s = snap_of("api", 9, in, 1), *back = NULL;
  const char *plain, *warm, *ev;
  size_t lp, lw, le;
  char *page = NULL;
  size_t plen;
  unsigned flags = 99;
  om_json_error_t err;
  (void)state;
  assert_int_equal(
      om_snapshot_json_cached_flags(s, OM_SNAPSHOT_JSON_WARMING, &warm, &lw),
      0);
  assert_string_equal(warm, "{\"service\":\"api\",\"revision\":9,"
                            "\"warming\":true,\"instances\":[{\"id\":"
                            "\"a\",\"url\":\"http://a:80\",\"weight\":1,"
                            "\"ttl_ms\":10000,\"metadata\":{}}]}");
  assert_int_equal(om_snapshot_json_cached(s, &plain, &lp), 0);
  assert_null(strstr(plain, "warming"));
  OM_ASSERT_CMP(lw, ==, lp + strlen(",\"warming\":true"));
  assert_non_null(om_snapshot_cache(s, OM_SNAPSHOT_SLOT_JSON_WARMING));
  assert_ptr_not_equal(om_snapshot_cache(s, OM_SNAPSHOT_SLOT_JSON_WARMING),
                       om_snapshot_cache(s, OM_SNAPSHOT_SLOT_JSON));
  /* cached: the same bytes again, no allocation */
  om_test_fail_alloc_after(0);
  assert_int_equal(
      om_snapshot_json_cached_flags(s, OM_SNAPSHOT_JSON_WARMING, &ev, &le), 0);
  om_test_alloc_reset();
  assert_ptr_equal(ev, warm);
  assert_int_equal(
      om_snapshot_sse_cached_flags(s, OM_SNAPSHOT_JSON_WARMING, &ev, &le), 0);
  assert_non_null(strstr(ev, "\"warming\":true"));
  assert_non_null(strstr(ev, "id: 9\n"));
  assert_int_equal(om_snapshot_sse_cached_flags(s, 2, &ev, &le), OM_EINVAL);
  assert_int_equal(om_snapshot_json_cached_flags(s, 4, &ev, &le), OM_EINVAL);
  assert_int_equal(om_snapshot_page_json_flags(s, OM_SNAPSHOT_JSON_WARMING,
                                               NULL, 0, 1, &page, &plen, &err),
                   0);
  assert_non_null(strstr(page, "\"warming\":true"));
  assert_non_null(strstr(page, "\"next_page_token\":null"));
  free(page);
  /* decoding: the flag, its absence, false, and a wrong type */
  assert_int_equal(om_snapshot_from_json_flags(warm, lw, &back, &flags, &err),
                   0);
  assert_int_equal(flags, OM_SNAPSHOT_JSON_WARMING);
  assert_int_equal(om_snapshot_count(back), 1);
  om_snapshot_unref(back);
  assert_int_equal(om_snapshot_from_json_flags(plain, lp, &back, &flags, &err),
                   0);
  assert_int_equal(flags, 0);
  om_snapshot_unref(back);
  {
    static const char *const bad[] = {
        "{\"service\":\"a\",\"revision\":1,\"warming\":1,"
        "\"instances\":[]}",
        "{\"service\":\"a\",\"revision\":1,\"warming\":\"true\","
        "\"instances\":[]}",
        "{\"service\":\"a\",\"revision\":1,\"warming\":null,"
        "\"instances\":[]}",
    };
    const char *f = "{\"service\":\"a\",\"revision\":1,\"warming\":false,"
                    "\"instances\":[]}";
    flags = 99;
    assert_int_equal(
        om_snapshot_from_json_flags(f, strlen(f), &back, &flags, &err), 0);
    assert_int_equal(flags, 0);
    om_snapshot_unref(back);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      back = NULL;
      assert_int_equal(om_snapshot_from_json_flags(bad[i], strlen(bad[i]),
                                                   &back, &flags, &err),
                       OM_EINVAL);
      assert_null(back);
      assert_string_equal(err.field, "warming");
      /* the plain decoder applies the same rule */
      assert_int_equal(
          om_snapshot_from_json(bad[i], strlen(bad[i]), &back, &err),
          OM_EINVAL);
    }
  }
  om_snapshot_unref(s); /* frees all four slots: ASan would see a leak */
}

/* ---- pages ---- */

static void collect_page(const char *json, char *ids, uint64_t rev, char *token,
                         size_t *count) {
  json_error_t je;
  json_t *j = json_loads(json, 0, &je), *arr, *tok, *x;
  size_t i;
  assert_non_null(j);
  assert_int_equal(json_integer_value(json_object_get(j, "revision")), rev);
  arr = json_object_get(j, "instances");
  json_array_foreach(arr, i, x) {
    strcat(ids, json_string_value(json_object_get(x, "id")));
    strcat(ids, ",");
    (*count)++;
  }
  tok = json_object_get(j, "next_page_token");
  assert_non_null(tok); /* present, string or null */
  if (json_is_null(tok))
    token[0] = '\0';
  else {
    assert_int_equal(json_string_length(tok), OM_PAGE_TOKEN_LEN);
    strcpy(token, json_string_value(tok));
  }
  json_decref(j);
}

static void pages(void **state) {
  om_instance_t in[10];
  char idb[10][4], ids[128] = "", token[64] = "", want[128] = "";
  om_snapshot_t *s, *s2;
  om_json_error_t err;
  char *out;
  size_t len, count = 0, npages = 0;
  (void)state;
  for (int i = 0; i < 10; i++) {
    snprintf(idb[i], sizeof idb[i], "i%d", 9 - i);
    in[i] = inst(idb[i], "http://h");
  }
  s = snap_of("svc", 1000, in, 10);
  for (int i = 0; i < 10; i++) {
    char one[8];
    snprintf(one, sizeof one, "i%d,", i);
    strcat(want, one);
  }
  do {
    const char *t = token[0] != '\0' ? token : NULL;
    assert_int_equal(
        om_snapshot_page_json(s, t, t ? strlen(t) : 0, 3, &out, &len, &err), 0);
    collect_page(out, ids, 1000, token, &count);
    free(out);
    npages++;
  } while (token[0] != '\0');
  assert_int_equal(npages, 4);
  assert_int_equal(count, 10);
  assert_string_equal(ids, want);

  /* one page holds everything: next is null */
  assert_int_equal(om_snapshot_page_json(s, NULL, 0, 100, &out, &len, &err), 0);
  assert_non_null(strstr(out, "\"next_page_token\":null}"));
  free(out);

  /* a token from another revision: revision_changed */
  assert_int_equal(om_snapshot_page_json(s, NULL, 0, 4, &out, &len, &err), 0);
  {
    json_t *j = json_loads(out, 0, NULL);
    strcpy(token, json_string_value(json_object_get(j, "next_page_token")));
    json_decref(j);
  }
  free(out);
  s2 = snap_of("svc", 1001, in, 10);
  out = NULL;
  assert_int_equal(
      om_snapshot_page_json(s2, token, strlen(token), 4, &out, &len, &err),
      OM_ESTATE);
  assert_null(out);
  assert_string_equal(err.field, "page_token");
  assert_string_equal(
      err.text, "field 'page_token': was issued at revision 1000; the "
                "service is now at revision 1001 (revision_changed): restart "
                "from the first page");
  om_snapshot_unref(s2);

  /* forged or mangled tokens */
  token[5] = token[5] == 'A' ? 'B' : 'A';
  assert_int_equal(
      om_snapshot_page_json(s, token, strlen(token), 4, &out, &len, &err),
      OM_EPARSE);
  assert_string_equal(err.text, "field 'page_token': is malformed or was not "
                                "issued by this service");
  assert_int_equal(om_snapshot_page_json(s, "1000:4", 6, 4, &out, &len, &err),
                   OM_EPARSE);
  assert_int_equal(om_snapshot_page_json(s, "", 0, 4, &out, &len, &err),
                   OM_EPARSE);
  memset(token, '!', OM_PAGE_TOKEN_LEN);
  assert_int_equal(
      om_snapshot_page_json(s, token, OM_PAGE_TOKEN_LEN, 4, &out, &len, &err),
      OM_EPARSE);
  /* a well-formed token past the end */
  om_page_token_encode(1000, 11, token);
  assert_int_equal(
      om_snapshot_page_json(s, token, strlen(token), 4, &out, &len, &err),
      OM_ERANGE);
  om_page_token_encode(1000, 10, token); /* exactly the end: empty page */
  assert_int_equal(
      om_snapshot_page_json(s, token, strlen(token), 4, &out, &len, &err), 0);
  assert_non_null(strstr(out, "\"instances\":[],\"next_page_token\":null}"));
  free(out);
  assert_int_equal(om_snapshot_page_json(s, NULL, 0, 0, &out, &len, &err),
                   OM_EINVAL);
  assert_int_equal(om_snapshot_page_json(s, NULL, 0, 3, &out, &len, NULL), 0);
  free(out);
  om_snapshot_unref(s);
}

static void page_tokens(void **state) {
  om_rng_t rng;
  char tok[OM_PAGE_TOKEN_LEN + 1];
  uint64_t r, o;
  (void)state;
  om_rng_seed(&rng, 7);
  for (int i = 0; i < 2000; i++) {
    uint64_t rev = om_rng_next(&rng), off = om_rng_next(&rng) >> (i % 64);
    om_page_token_encode(rev, off, tok);
    assert_int_equal(strlen(tok), OM_PAGE_TOKEN_LEN);
    assert_int_equal(strspn(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnop"
                                 "qrstuvwxyz0123456789-_"),
                     OM_PAGE_TOKEN_LEN);
    assert_int_equal(om_page_token_decode(tok, OM_PAGE_TOKEN_LEN, &r, &o), 0);
    assert_int_equal(r, rev);
    assert_int_equal(o, off);
    /* any single-character change is caught by the checksum */
    {
      size_t at = om_rng_below(&rng, OM_PAGE_TOKEN_LEN);
      tok[at] = tok[at] == 'x' ? 'y' : 'x';
      assert_int_equal(om_page_token_decode(tok, OM_PAGE_TOKEN_LEN, &r, &o),
                       OM_EPARSE);
    }
  }
  assert_int_equal(om_page_token_decode(NULL, 32, &r, &o), OM_EPARSE);
  assert_int_equal(om_page_token_decode(tok, 31, &r, &o), OM_EPARSE);
}

/* ---- decoding snapshots: malformed and hostile input ---- */

typedef struct {
  const char *json;
  int rc;
  const char *text; /* exact, or a prefix when it ends with '*' */
} dcase_t;

#define I0 "{\"id\":\"a\",\"url\":\"http://a\",\"weight\":1,\"ttl_ms\":1000"
#define SNAP(insts)                                                            \
  "{\"service\":\"s\",\"revision\":3,\"instances\":[" insts "]}"

/* want is exact, with '*' matching any run of characters. */
static int glob(const char *g, const char *w) {
  if (*w == '\0')
    return *g == '\0';
  if (*w == '*')
    return glob(g, w + 1) || (*g != '\0' && glob(g + 1, w));
  return *g == *w && glob(g + 1, w + 1);
}

static void text_matches(const char *got, const char *want, const char *in) {
  if (!glob(got, want))
    fail_msg("input %s\n got  \"%s\"\n want \"%s\"", in, got, want);
}

static void decode_snapshot_errors(void **state) {
  static const dcase_t cases[] = {
      {"", OM_EPARSE, "invalid JSON at line 1, column 0: *"},
      {"[]", OM_EPARSE, "the document must be a JSON object"},
      {"{", OM_EPARSE, "invalid JSON at line 1*"},
      {"{\"revision\":1,\"instances\":[]}", OM_EINVAL,
       "field 'service': is required"},
      {"{\"service\":7,\"revision\":1,\"instances\":[]}", OM_EINVAL,
       "field 'service': must be a string"},
      {"{\"service\":\"a/b\",\"revision\":1,\"instances\":[]}", OM_EINVAL,
       "field 'service': must be 1 to 128 characters*"},
      {"{\"service\":\"s\",\"instances\":[]}", OM_EINVAL,
       "field 'revision': is required"},
      {"{\"service\":\"s\",\"revision\":0,\"instances\":[]}", OM_EINVAL,
       "field 'revision': must be an integer >= 1"},
      {"{\"service\":\"s\",\"revision\":-5,\"instances\":[]}", OM_EINVAL,
       "field 'revision': must be an integer >= 1"},
      {"{\"service\":\"s\",\"revision\":1.5,\"instances\":[]}", OM_EINVAL,
       "field 'revision': must be an integer >= 1"},
      {"{\"service\":\"s\",\"revision\":\"9\",\"instances\":[]}", OM_EINVAL,
       "field 'revision': must be an integer >= 1"},
      {"{\"service\":\"s\",\"revision\":1}", OM_EINVAL,
       "field 'instances': is required"},
      {"{\"service\":\"s\",\"revision\":1,\"instances\":{}}", OM_EINVAL,
       "field 'instances': must be an array"},
      {SNAP(I0 "}, 5"), OM_EINVAL, "field 'instances[1]': must be an object"},
      {SNAP(I0 ",\"url\":\"ftp://x\"}"), OM_EPARSE,
       "invalid JSON at line 1, column *"}, /* duplicate key "url" */
      {SNAP(I0 "},{\"id\":\"b\",\"url\":\"http://b\",\"weight\":1,\"ttl_ms\":"
               "1000},{\"id\":\"c\",\"url\":\"http://c\",\"weight\":1,"
               "\"ttl_ms\":1000},{\"id\":\"d\",\"url\":\"http:/d\",\"weight\":"
               "1,\"ttl_ms\":1000}"),
       OM_EINVAL,
       "field 'instances[3].url': must be an absolute http:// or https:// "
       "URL"},
      {SNAP(I0 "}," I0 "}"), OM_EDUPLICATE,
       "field 'instances[1].id': duplicate id \"a\""},
      {SNAP("{\"id\":\"a\",\"url\":\"http://a\",\"weight\":1}"), OM_EINVAL,
       "field 'instances[0].ttl_ms': is required"},
      {SNAP("{\"url\":\"http://a\",\"weight\":1,\"ttl_ms\":1000}"), OM_EINVAL,
       "field 'instances[0].id': is required"},
      {SNAP("{\"id\":\"a\",\"url\":\"http://a\",\"ttl_ms\":1000}"), OM_EINVAL,
       "field 'instances[0].weight': is required"},
      {SNAP("{\"id\":\"a\",\"url\":\"http://a\",\"weight\":1,\"ttl_ms\":1e3}"),
       OM_EINVAL, "field 'instances[0].ttl_ms': must be an integer*"},
      {SNAP("{\"id\":\"a\",\"url\":\"http://a\",\"weight\":\"1\",\"ttl_ms\":"
            "1000}"),
       OM_EINVAL, "field 'instances[0].weight': must be a number"},
      {SNAP("{\"id\":\"a\",\"url\":\"http://a\",\"weight\":0,\"ttl_ms\":1000}"),
       OM_EINVAL, "field 'instances[0].weight': must be a finite number*"},
      {SNAP("{\"id\":\"a\",\"url\":\"http://a\",\"weight\":1,\"ttl_ms\":-1}"),
       OM_EINVAL, "field 'instances[0].ttl_ms': must be an integer from*"},
      {SNAP("{\"id\":7,\"url\":\"http://a\",\"weight\":1,\"ttl_ms\":1000}"),
       OM_EINVAL, "field 'instances[0].id': must be a string"},
      {SNAP(I0 ",\"zone\":5}"), OM_EINVAL,
       "field 'instances[0].zone': must be a string or null"},
      {SNAP(I0 ",\"zone\":\"\"}"), OM_EINVAL,
       "field 'instances[0].zone': must be 1 to 128*"},
      {SNAP(I0 ",\"metadata\":[]}"), OM_EINVAL,
       "field 'instances[0].metadata': must be an object*"},
      {SNAP(I0 ",\"metadata\":{\"env\":1}}"), OM_EINVAL,
       "field 'instances[0].metadata.env': must be a string*"},
      {SNAP(I0 ",\"metadata\":{\"a b\":{}}}"), OM_EINVAL,
       "field 'instances[0].metadata': must be a string*"},
      {SNAP(I0 ",\"metadata\":{\"\":\"x\"}}"), OM_EINVAL,
       "field 'instances[0].metadata': has an empty key"},
      /* hostile */
      {"{\"service\":\"s\",\"revision\":1e400,\"instances\":[]}", OM_EPARSE,
       "invalid JSON at line 1*real number overflow*"},
      {"{\"service\":\"s\",\"revision\":99999999999999999999,\"instances\":[]}",
       OM_EPARSE, "invalid JSON at line 1*too big integer*"},
      {SNAP("{\"id\":\"a\",\"url\":\"http://a\",\"weight\":NaN,\"ttl_ms\":1}"),
       OM_EPARSE, "invalid JSON*"},
      {SNAP("{\"id\":\"a\",\"url\":\"http://a\",\"weight\":Infinity}"),
       OM_EPARSE, "invalid JSON*"},
      {"{\"service\":\"s\",\"service\":\"t\",\"revision\":1,\"instances\":[]}",
       OM_EPARSE, "invalid JSON at line 1*duplicate object key*"},
      {"{\"service\":\"s\xff\",\"revision\":1,\"instances\":[]}", OM_EPARSE,
       "invalid JSON*"},
      {"{\"service\":\"s\xc0\x80\",\"revision\":1,\"instances\":[]}", OM_EPARSE,
       "invalid JSON*"},
      {"{\"service\":\"s\\u0000\",\"revision\":1,\"instances\":[]}", OM_EPARSE,
       "invalid JSON*"},
      {"{\"service\":\"s\\ud800\",\"revision\":1,\"instances\":[]}", OM_EPARSE,
       "invalid JSON*"},
      {"{\"service\":\"s\",\"revision\":1,\"instances\":[]} x", OM_EPARSE,
       "invalid JSON*"},
      {"{\"service\":\"s\",\"revision\":1,\"instances\":[]}{}", OM_EPARSE,
       "invalid JSON*"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    om_snapshot_t *s = (om_snapshot_t *)&s;
    om_json_error_t err;
    int rc =
        om_snapshot_from_json(cases[i].json, strlen(cases[i].json), &s, &err);
    if (rc != cases[i].rc)
      fail_msg("case %zu %s: rc %d (%s), want %d", i, cases[i].json, rc,
               rc != 0 ? err.text : "", cases[i].rc);
    text_matches(err.text, cases[i].text, cases[i].json);
    assert_ptr_equal(s, (om_snapshot_t *)&s);
  }
  {
    om_json_error_t err;
    om_snapshot_t *s;
    const char *j = "{\"service\":\"s\",\"revision\":1e400,\"instances\":[]}";
    assert_int_equal(om_snapshot_from_json(j, strlen(j), &s, &err), OM_EPARSE);
    assert_non_null(strstr(err.text, "real number overflow"));
    j = "{\"service\":\"s\",\"service\":\"t\",\"revision\":1,\"instances\":[]}";
    assert_int_equal(om_snapshot_from_json(j, strlen(j), &s, &err), OM_EPARSE);
    assert_non_null(strstr(err.text, "duplicate object key"));
    assert_string_equal(err.field, "");
  }
}

static void decode_snapshot_hostile_sizes(void **state) {
  size_t depth = 100000;
  char *deep = malloc(2 * depth + 64), *p;
  om_snapshot_t *s;
  om_json_error_t err;
  (void)state;
  /* nesting far past jansson's cap: an error, not a stack overflow */
  p = deep;
  p += sprintf(p, "{\"service\":\"s\",\"revision\":1,\"instances\":");
  memset(p, '[', depth);
  memset(p + depth, ']', depth);
  p[2 * depth] = '}';
  p[2 * depth + 1] = '\0';
  assert_int_equal(om_snapshot_from_json(deep, strlen(deep), &s, &err),
                   OM_EPARSE);
  assert_non_null(strstr(err.text, "depth"));
  free(deep);

  /* a NUL inside the buffer is not the end of the document */
  {
    const char j[] = "{\"service\":\"s\",\"revision\":1,\"instances\":[]}\0{}";
    assert_int_equal(om_snapshot_from_json(j, sizeof j - 1, &s, &err),
                     OM_EPARSE);
    assert_int_equal(om_snapshot_from_json(j, strlen(j), &s, &err), 0);
    assert_int_equal(om_snapshot_count(s), 0);
    om_snapshot_unref(s);
  }
  /* many instances, many metadata entries: fine */
  {
    size_t n = 2000, cap = n * 200 + 100;
    char *big = malloc(cap);
    size_t o = 0;
    o += (size_t)snprintf(big + o, cap - o,
                          "{\"service\":\"s\",\"revision\":9,\"instances\":[");
    for (size_t i = 0; i < n; i++)
      o += (size_t)snprintf(big + o, cap - o,
                            "%s{\"id\":\"x%zu\",\"url\":\"http://h:%zu\","
                            "\"weight\":1,\"ttl_ms\":5000,\"metadata\":{"
                            "\"a\":\"1\",\"b\":\"2\"},\"future\":[1,2]}",
                            i ? "," : "", i, 1 + i);
    o += (size_t)snprintf(big + o, cap - o, "],\"next_page_token\":null}");
    assert_int_equal(om_snapshot_from_json(big, o, &s, &err), 0);
    assert_int_equal(om_snapshot_count(s), n);
    assert_string_equal(om_snapshot_find(s, "x1999")->url, "http://h:2000");
    om_snapshot_unref(s);
    free(big);
  }
  /* 65 metadata entries */
  {
    char buf[4096];
    size_t o = (size_t)snprintf(buf, sizeof buf, SNAP(I0 ",\"metadata\":{"));
    o -= 2; /* drop "]}" */
    for (int i = 0; i < 65; i++)
      o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\"k%d\":\"v\"",
                            i ? "," : "", i);
    o += (size_t)snprintf(buf + o, sizeof buf - o, "}}]}");
    assert_int_equal(om_snapshot_from_json(buf, o, &s, &err), OM_EINVAL);
    assert_string_equal(err.text,
                        "field 'instances[0].metadata': has more than 64 "
                        "entries");
  }
}

/*
 * A failed allocation must fail the decode cleanly. Ours report OM_ENOMEM;
 * jansson 2.14 reports some of its own (a string buffer in the lexer) as a
 * syntax error, which we cannot tell apart, so EPARSE is accepted when an
 * allocation really failed. Either way nothing leaks (ASan).
 */
static void check_oom(int rc, long n, const om_json_error_t *err) {
  if (rc == OM_ENOMEM)
    return;
  if (rc == OM_EPARSE && om_test_alloc_failures() > 0)
    return;
  fail_msg("allocation %ld failed: rc %d: %s", n, rc, err->text);
}

static void decode_snapshot_fault_injection(void **state) {
  const char *j = SNAP(I0 ",\"zone\":\"z\",\"metadata\":{\"k\":\"v\",\"a\":"
                          "\"b\"}},{\"id\":\"b\",\"url\":\"http://b\","
                          "\"weight\":2,\"ttl_ms\":2000}");
  (void)state;
  for (long n = 0;; n++) {
    om_snapshot_t *s = NULL;
    om_json_error_t err;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_snapshot_from_json(j, strlen(j), &s, &err);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(om_snapshot_count(s), 2);
      assert_string_equal(om_snapshot_find(s, "a")->metadata[0].key, "a");
      om_snapshot_unref(s);
      OM_ASSERT_CMP(n, >, 5);
      break;
    }
    check_oom(rc, n, &err);
    assert_null(s);
  }
}

/* ---- registration bodies ---- */

static void decode_registration(void **state) {
  const char *body = "{\"url\":\"http://10.0.0.1:8080\",\"ttl_ms\":30000,"
                     "\"weight\":2.5,\"zone\":\"eu-1\",\"metadata\":{\"z\":"
                     "\"1\",\"a\":\"\\u00e9\"}}";
  om_instance_t in;
  om_json_error_t err;
  char *enc;
  size_t len;
  (void)state;
  assert_int_equal(om_instance_from_json(body, strlen(body), "i-1", &in, &err),
                   0);
  assert_string_equal(in.id, "i-1");
  assert_string_equal(in.url, "http://10.0.0.1:8080");
  assert_int_equal(in.ttl_ms, 30000);
  OM_ASSERT_CMP(in.weight, ==, 2.5);
  assert_string_equal(in.zone, "eu-1");
  assert_int_equal(in.n_metadata, 2);
  assert_string_equal(in.metadata[0].key, "a"); /* sorted */
  assert_string_equal(in.metadata[0].value, "\xc3\xa9");
  /* and back: what `openmesh register` sends */
  assert_int_equal(om_instance_to_json(&in, &enc, &len), 0);
  assert_string_equal(enc, "{\"url\":\"http://10.0.0.1:8080\",\"ttl_ms\":30000,"
                           "\"weight\":2.5,\"zone\":\"eu-1\",\"metadata\":{"
                           "\"a\":\"\xc3\xa9\",\"z\":\"1\"}}");
  {
    om_instance_t again;
    assert_int_equal(om_instance_from_json(enc, len, "i-1", &again, &err), 0);
    assert_true(om_instance_equal(&again, &in));
    om_instance_clear(&again);
  }
  free(enc);
  om_instance_clear(&in);

  /* defaults; null for the optional fields; a matching id */
  body = "{\"url\":\"https://h\",\"ttl_ms\":1000,\"zone\":null,"
         "\"metadata\":null,\"id\":\"x\"}";
  assert_int_equal(om_instance_from_json(body, strlen(body), "x", &in, &err),
                   0);
  OM_ASSERT_CMP(in.weight, ==, 1.0);
  assert_null(in.zone);
  assert_int_equal(in.n_metadata, 0);
  assert_null(in.metadata);
  om_instance_clear(&in);
}

static void decode_registration_errors(void **state) {
  static const dcase_t cases[] = {
      {"{\"ttl_ms\":1000}", OM_EINVAL, "field 'url': is required"},
      {"{\"url\":\"http://h\"}", OM_EINVAL, "field 'ttl_ms': is required"},
      {"{\"url\":\"http://h\",\"ttl\":1000}", OM_EINVAL,
       "field 'ttl': unknown field (expected url, ttl_ms, weight, zone, "
       "metadata)"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"w\\u00e9ight\\n'\":1}",
       OM_EINVAL,
       "field 'w?"
       "?ight?"
       "?': unknown field*"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"id\":\"other\"}", OM_EINVAL,
       "field 'id': does not match the id in the request path"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"id\":5}", OM_EINVAL,
       "field 'id': must be a string"},
      {"{\"url\":5,\"ttl_ms\":1000}", OM_EINVAL,
       "field 'url': must be a string"},
      {"{\"url\":null,\"ttl_ms\":1000}", OM_EINVAL,
       "field 'url': must be a string"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000.0}", OM_EINVAL,
       "field 'ttl_ms': must be an integer (milliseconds)"},
      {"{\"url\":\"http://h\",\"ttl_ms\":\"1000\"}", OM_EINVAL,
       "field 'ttl_ms': must be an integer (milliseconds)"},
      {"{\"url\":\"http://h\",\"ttl_ms\":999}", OM_EINVAL,
       "field 'ttl_ms': must be an integer from 1000 to 3600000 (1 s to 1 h)"},
      {"{\"url\":\"http://h\",\"ttl_ms\":9223372036854775807}", OM_EINVAL,
       "field 'ttl_ms': must be an integer from*"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"weight\":true}", OM_EINVAL,
       "field 'weight': must be a number"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"weight\":null}", OM_EINVAL,
       "field 'weight': must be a number"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"weight\":-1}", OM_EINVAL,
       "field 'weight': must be a finite number in (0, 10000]"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"weight\":1e308}", OM_EINVAL,
       "field 'weight': must be a finite number in (0, 10000]"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"zone\":[]}", OM_EINVAL,
       "field 'zone': must be a string or null"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"metadata\":\"a=b\"}", OM_EINVAL,
       "field 'metadata': must be an object (a flat map of strings)"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"metadata\":{\"env\":{\"x\":"
       "\"y\"}}}",
       OM_EINVAL,
       "field 'metadata.env': must be a string (metadata is a flat map of "
       "strings)"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"metadata\":{\"n\":null}}",
       OM_EINVAL, "field 'metadata.n': must be a string*"},
      {"{\"url\":\"http://user@h\",\"ttl_ms\":1000}", OM_EINVAL,
       "field 'url': must not carry userinfo (RFC 9110 section 4.2.4)"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000,\"url\":\"http://g\"}", OM_EPARSE,
       "invalid JSON*"},
      {"[\"url\"]", OM_EPARSE, "the body must be a JSON object"},
      {"{\"url\":\"http://h\",\"ttl_ms\":1000", OM_EPARSE, "invalid JSON*"},
      {"{\"url\":\"http://h\xed\xa0\x80\",\"ttl_ms\":1000}", OM_EPARSE,
       "invalid JSON*"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    om_instance_t in;
    om_json_error_t err;
    int rc;
    memset(&in, 0x5a, sizeof in);
    rc = om_instance_from_json(cases[i].json, strlen(cases[i].json), "x", &in,
                               &err);
    if (rc != cases[i].rc)
      fail_msg("case %zu %s: rc %d (%s), want %d", i, cases[i].json, rc,
               rc != 0 ? err.text : "", cases[i].rc);
    text_matches(err.text, cases[i].text, cases[i].json);
    assert_ptr_equal(in.url, (char *)(uintptr_t)0x5a5a5a5a5a5a5a5aull);
  }
  {
    om_instance_t in;
    om_json_error_t err;
    size_t big = OM_INSTANCE_JSON_MAX + 1;
    char *b = malloc(big);
    memset(b, ' ', big);
    assert_int_equal(om_instance_from_json(b, big, "x", &in, &err), OM_ETOOBIG);
    assert_string_equal(err.text, "the body is larger than 262144 bytes");
    assert_string_equal(err.field, "");
    free(b);
    assert_int_equal(om_instance_from_json("{}", 2, "..", &in, &err),
                     OM_EINVAL);
    assert_string_equal(err.field, "id");
    assert_int_equal(om_instance_from_json("{}", 2, NULL, &in, &err),
                     OM_EINVAL);
    assert_int_equal(om_instance_from_json("{}", 2, "x", &in, NULL), OM_EINVAL);
  }
}

static void decode_registration_fault_injection(void **state) {
  const char *body = "{\"url\":\"http://h\",\"ttl_ms\":5000,\"zone\":\"z\","
                     "\"metadata\":{\"b\":\"2\",\"a\":\"1\"}}";
  (void)state;
  for (long n = 0;; n++) {
    om_instance_t in;
    om_json_error_t err;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_instance_from_json(body, strlen(body), "x", &in, &err);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_string_equal(in.metadata[1].key, "b");
      om_instance_clear(&in);
      OM_ASSERT_CMP(n, >, 8);
      break;
    }
    check_oom(rc, n, &err);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(encode_exact),
      cmocka_unit_test(encode_round_trip),
      cmocka_unit_test(encode_fault_injection),
      cmocka_unit_test(cached_encodings_are_shared),
      cmocka_unit_test(chunk_fragments_follow_edits),
      cmocka_unit_test(get_gzip_is_the_document_compressed),
      cmocka_unit_test(warming_member),
      cmocka_unit_test(pages),
      cmocka_unit_test(page_tokens),
      cmocka_unit_test(decode_snapshot_errors),
      cmocka_unit_test(decode_snapshot_hostile_sizes),
      cmocka_unit_test(decode_snapshot_fault_injection),
      cmocka_unit_test(decode_registration),
      cmocka_unit_test(decode_registration_errors),
      cmocka_unit_test(decode_registration_fault_injection),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
