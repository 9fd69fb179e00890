/*
 * test_snapshot.c: instance validation (every rule, good and bad), deep
 * copies, equality, snapshots (sorted, binary search, duplicates,
 * refcount, cache slots), edits that share unchanged instances, random
 * sets and edits against a reference model, and fault injection on every
 * allocating call.
 */
#include "om_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "om_errno.h"
#include "om_rng.h"
#include "om_snapshot.h"

static om_instance_t inst(const char *id, const char *url) {
  om_instance_t in;
  memset(&in, 0, sizeof in);
  in.id = (char *)id;
  in.url = (char *)url;
  in.weight = 1.0;
  in.ttl_ms = 10000;
  return in;
}

/* "" when valid, else "field: why". */
static const char *check(const om_instance_t *in) {
  static char buf[256];
  const char *f = NULL, *w = NULL;
  int rc = om_instance_validate(in, &f, &w);
  if (rc == 0)
    return "";
  assert_int_equal(rc, OM_EINVAL);
  assert_non_null(f);
  assert_non_null(w);
  snprintf(buf, sizeof buf, "%s: %s", f, w);
  return buf;
}

static const char *url_check(const char *url) {
  om_instance_t in = inst("a", url);
  return check(&in);
}

#define ASSERT_FIELD(res, fieldname)                                           \
  do {                                                                         \
    const char *r_ = (res);                                                    \
    if (strncmp(r_, fieldname ": ", strlen(fieldname) + 2) != 0)               \
      fail_msg("got \"%s\", want a \"%s\" error", r_, fieldname);              \
  } while (0)

/* ---- names ---- */

static void names(void **state) {
  char n128[129], n129[130];
  (void)state;
  memset(n128, 'a', 128);
  n128[128] = '\0';
  memset(n129, 'b', 129);
  n129[129] = '\0';
  assert_int_equal(om_valid_name("api", 3), 1);
  assert_int_equal(om_valid_name("A.b_c-9", 7), 1);
  assert_int_equal(om_valid_name("...", 3), 1);
  assert_int_equal(om_valid_name(".hidden", 7), 1);
  assert_int_equal(om_valid_name(n128, 128), 1);
  assert_int_equal(om_valid_name(n129, 129), 0);
  assert_int_equal(om_valid_name("", 0), 0);
  assert_int_equal(om_valid_name(NULL, 3), 0);
  assert_int_equal(om_valid_name(".", 1), 0);
  assert_int_equal(om_valid_name("..", 2), 0);
  assert_int_equal(om_valid_name("a/b", 3), 0);
  assert_int_equal(om_valid_name("a b", 3), 0);
  assert_int_equal(om_valid_name("a:b", 3), 0);
  assert_int_equal(om_valid_name("\xc3\xa9", 2), 0);
  /* len, not NUL, bounds the name */
  assert_int_equal(om_valid_name("abc/", 3), 1);
}

/* ---- every validation rule ---- */

static void url_rules(void **state) {
  static char long_ok[OM_URL_MAX + 1], long_bad[OM_URL_MAX + 2];
  static const char *good[] = {
      "http://a",
      "https://example.com",
      "http://10.0.0.1:8080",
      "https://h:1/",
      "http://h:65535/path",
      "HTTP://Upper.Case",
      "HtTpS://x",
      "http://[::1]",
      "http://[::1]:9000/x",
      "http://[fe80::1:2:3:4]/",
      "http://[::ffff:1.2.3.4]",
      "http://my-host-1.local",
      "http://h:00080",
  };
  static const char *bad[] = {
      "",
      "a",
      "ftp://h",
      "http:/h",
      "//h",
      "http://",
      "https://",
      "http:///path",
      "http://:80",
      "http://h:",
      "http://h:0",
      "http://h:65536",
      "http://h:123456",
      "http://h:8x",
      "http://h:-1",
      "http://user@h",
      "http://user:pw@h/",
      "http://h h",
      " http://h",
      "http://h\t",
      "http://h/\x01",
      "http://h/\x7f",
      "http://h\xc3\xa9",
      "http://[::1",
      "http://[zz::1]",
      "http://[1.2.3.4]",
      "http://[]",
      "http://[::1]x",
      "http://a%zz",
      "http://a%4",
      "http://a^b",
      "http://a!b",
      "http://a,b",
      "mailto:x@y",
      "httpx://h",
      /* the one URL rule (om_url.h), which the proxy applies too */
      "http://h:65535/path?q=1#frag",
      "http://a%41b",
      "http://my_host~1.local",
      "http://h?query",
      "http://h#frag",
      "http://999.1.1.1",
      "http://h.",
  };
  (void)state;
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    const char *r = url_check(good[i]);
    if (r[0] != '\0')
      fail_msg("%s rejected: %s", good[i], r);
  }
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const char *r = url_check(bad[i]);
    if (strncmp(r, "url: ", 5) != 0)
      fail_msg("\"%s\" accepted or wrong field (%s)", bad[i], r);
  }
  memcpy(long_ok, "http://h/", 9);
  memset(long_ok + 9, 'x', OM_URL_MAX - 9);
  long_ok[OM_URL_MAX] = '\0';
  assert_string_equal(url_check(long_ok), "");
  memcpy(long_bad, long_ok, OM_URL_MAX);
  long_bad[OM_URL_MAX] = 'y';
  long_bad[OM_URL_MAX + 1] = '\0';
  assert_string_equal(url_check(long_bad), "url: is longer than 2048 bytes");
  assert_string_equal(url_check(NULL), "url: is required");
  assert_string_equal(url_check("http://u@h"),
                      "url: must not carry userinfo (RFC 9110 section 4.2.4)");
}

static void id_weight_ttl_zone_rules(void **state) {
  om_instance_t in = inst("a", "http://h");
  char z128[129], z129[130];
  (void)state;
  assert_string_equal(check(&in), "");
  in.id = NULL;
  ASSERT_FIELD(check(&in), "id");
  in.id = "..";
  ASSERT_FIELD(check(&in), "id");
  in.id = "a/b";
  ASSERT_FIELD(check(&in), "id");
  in.id = "ok";

  static const double wgood[] = {1.0, 10000.0, 1e-300, 0.5, 9999.999};
  static const double wbad[] = {0.0, -0.0, -1.0, 10000.0000001, 1e9};
  for (size_t i = 0; i < sizeof wgood / sizeof *wgood; i++) {
    in.weight = wgood[i];
    assert_string_equal(check(&in), "");
  }
  for (size_t i = 0; i < sizeof wbad / sizeof *wbad; i++) {
    in.weight = wbad[i];
    ASSERT_FIELD(check(&in), "weight");
  }
  in.weight = NAN;
  ASSERT_FIELD(check(&in), "weight");
  in.weight = INFINITY;
  ASSERT_FIELD(check(&in), "weight");
  in.weight = -INFINITY;
  ASSERT_FIELD(check(&in), "weight");
  in.weight = 2.0;

  in.ttl_ms = 1000;
  assert_string_equal(check(&in), "");
  in.ttl_ms = 3600000;
  assert_string_equal(check(&in), "");
  in.ttl_ms = 999;
  ASSERT_FIELD(check(&in), "ttl_ms");
  in.ttl_ms = 3600001;
  ASSERT_FIELD(check(&in), "ttl_ms");
  in.ttl_ms = 0;
  ASSERT_FIELD(check(&in), "ttl_ms");
  in.ttl_ms = UINT64_MAX;
  ASSERT_FIELD(check(&in), "ttl_ms");
  in.ttl_ms = 5000;

  memset(z128, 'z', 128);
  z128[128] = '\0';
  memset(z129, 'z', 129);
  z129[129] = '\0';
  in.zone = "eu-west-1a";
  assert_string_equal(check(&in), "");
  in.zone = "rack 7 (row ~3)";
  assert_string_equal(check(&in), "");
  in.zone = z128;
  assert_string_equal(check(&in), "");
  in.zone = z129;
  ASSERT_FIELD(check(&in), "zone");
  in.zone = "";
  ASSERT_FIELD(check(&in), "zone");
  in.zone = "a\tb";
  ASSERT_FIELD(check(&in), "zone");
  in.zone = "a\x7f";
  ASSERT_FIELD(check(&in), "zone");
  in.zone = "\xc3\xa9";
  ASSERT_FIELD(check(&in), "zone");
  in.zone = NULL;
  assert_string_equal(check(&in), "");
  assert_int_equal(om_instance_validate(NULL, NULL, NULL), OM_EINVAL);
  /* field and why are optional */
  in.ttl_ms = 1;
  assert_int_equal(om_instance_validate(&in, NULL, NULL), OM_EINVAL);
}

static void metadata_rules(void **state) {
  om_instance_t in = inst("a", "http://h");
  om_kv_t kv[OM_META_MAX_ENTRIES + 1];
  char keys[OM_META_MAX_ENTRIES + 1][8];
  char k128[129], k129[130], v1024[1025], v1025[1026];
  static const char *bad_utf8[] = {
      "\x80",             /* lone continuation */
      "\xc0\x80",         /* overlong NUL */
      "\xc1\xbf",         /* overlong */
      "\xe0\x80\xaf",     /* overlong */
      "\xed\xa0\x80",     /* surrogate U+D800 */
      "\xf4\x90\x80\x80", /* above U+10FFFF */
      "\xf5\x80\x80\x80", /* invalid lead */
      "\xe2\x82",         /* truncated */
      "\xff",
      "ok\xc3",
  };
  static const char *good_utf8[] = {"\xc3\xa9",         "\xe2\x82\xac",
                                    "\xf0\x9f\x98\x80", "\xef\xbf\xbf",
                                    "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf"};
  (void)state;
  for (int i = 0; i <= OM_META_MAX_ENTRIES; i++) {
    snprintf(keys[i], sizeof keys[i], "k%02d", i);
    kv[i].key = keys[i];
    kv[i].value = "v";
  }
  in.metadata = kv;
  in.n_metadata = OM_META_MAX_ENTRIES;
  assert_string_equal(check(&in), "");
  in.n_metadata = OM_META_MAX_ENTRIES + 1;
  assert_string_equal(check(&in), "metadata: has more than 64 entries");
  in.n_metadata = 2;
  kv[1].value = "";
  assert_string_equal(check(&in), "");
  kv[1].key = "";
  assert_string_equal(check(&in), "metadata: has an empty key");
  memset(k128, 'k', 128);
  k128[128] = '\0';
  memset(k129, 'k', 129);
  k129[129] = '\0';
  memset(v1024, 'v', 1024);
  v1024[1024] = '\0';
  memset(v1025, 'v', 1025);
  v1025[1025] = '\0';
  kv[1].key = k128;
  kv[1].value = v1024;
  assert_string_equal(check(&in), "");
  kv[1].key = k129;
  assert_string_equal(check(&in), "metadata: has a key longer than 128 bytes");
  kv[1].key = k128;
  kv[1].value = v1025;
  assert_string_equal(check(&in),
                      "metadata: has a value longer than 1024 bytes");
  kv[1].value = "v";
  for (size_t i = 0; i < sizeof bad_utf8 / sizeof *bad_utf8; i++) {
    kv[1].key = (char *)bad_utf8[i];
    kv[1].value = "v";
    assert_string_equal(check(&in),
                        "metadata: has a key that is not valid UTF-8");
    kv[1].key = "x";
    kv[1].value = (char *)bad_utf8[i];
    assert_string_equal(check(&in),
                        "metadata: has a value that is not valid UTF-8");
  }
  for (size_t i = 0; i < sizeof good_utf8 / sizeof *good_utf8; i++) {
    kv[1].key = (char *)good_utf8[i];
    kv[1].value = (char *)good_utf8[i];
    assert_string_equal(check(&in), "");
  }
  /* duplicates, sorted and unsorted */
  kv[0].key = "a";
  kv[1].key = "a";
  kv[1].value = "w";
  assert_string_equal(check(&in), "metadata: has a duplicate key");
  in.n_metadata = 3;
  kv[0].key = "b";
  kv[1].key = "a";
  kv[2].key = "b";
  assert_string_equal(check(&in), "metadata: has a duplicate key");
  kv[2].key = "c";
  assert_string_equal(check(&in), "");
  kv[2].value = NULL;
  assert_string_equal(check(&in), "metadata: has a NULL key or value");
  kv[2].value = "v";
  kv[2].key = NULL;
  assert_string_equal(check(&in), "metadata: has a NULL key or value");
  in.metadata = NULL;
  assert_string_equal(check(&in), "metadata: is NULL with entries");
  in.n_metadata = 0;
  assert_string_equal(check(&in), "");
}

/* ---- copy, clear, equal ---- */

static void copy_clear_equal(void **state) {
  om_kv_t kv[3] = {{"zeta", "1"}, {"alpha", "2"}, {"mid", ""}};
  om_instance_t in = inst("i-1", "http://h:1");
  om_instance_t c, d;
  (void)state;
  in.zone = "z";
  in.metadata = kv;
  in.n_metadata = 3;
  assert_int_equal(om_instance_copy(&c, &in), 0);
  assert_ptr_not_equal(c.id, in.id);
  assert_string_equal(c.id, "i-1");
  assert_string_equal(c.url, "http://h:1");
  assert_string_equal(c.zone, "z");
  assert_int_equal(c.n_metadata, 3);
  assert_string_equal(c.metadata[0].key, "alpha");
  assert_string_equal(c.metadata[1].key, "mid");
  assert_string_equal(c.metadata[2].key, "zeta");
  assert_string_equal(c.metadata[2].value, "1");
  assert_true(om_instance_equal(&in, &c));
  assert_true(om_instance_equal(&c, &in));
  assert_true(om_instance_equal(&in, &in));

  assert_int_equal(om_instance_copy(&d, &c), 0);
  assert_true(om_instance_equal(&c, &d));
  d.weight = 2.0;
  assert_false(om_instance_equal(&c, &d));
  d.weight = c.weight;
  d.ttl_ms++;
  assert_false(om_instance_equal(&c, &d));
  d.ttl_ms--;
  d.metadata[1].value[0] = '\0';
  assert_true(om_instance_equal(&c, &d));
  free(d.metadata[0].value);
  d.metadata[0].value = malloc(2);
  memcpy(d.metadata[0].value, "3", 2);
  assert_false(om_instance_equal(&c, &d));
  assert_false(om_instance_equal(&in, &d)); /* unsorted vs sorted */
  free(d.zone);
  d.zone = NULL;
  assert_false(om_instance_equal(&c, &d));
  om_instance_clear(&d);
  assert_null(d.id);
  assert_int_equal(d.n_metadata, 0);

  /* same keys, different key sets, both unsorted */
  {
    om_kv_t x[2] = {{"b", "1"}, {"a", "1"}}, y[2] = {{"b", "1"}, {"c", "1"}};
    om_instance_t p = inst("p", "http://h"), q = inst("p", "http://h");
    p.metadata = x;
    p.n_metadata = 2;
    q.metadata = y;
    q.n_metadata = 2;
    assert_false(om_instance_equal(&p, &q));
    y[1].key = "a";
    assert_true(om_instance_equal(&p, &q));
    q.url = "http://other";
    assert_false(om_instance_equal(&p, &q));
  }

  /* every allocation of a copy can fail; nothing leaks, out untouched */
  for (long n = 0;; n++) {
    om_instance_t t;
    int rc;
    memset(&t, 0xab, sizeof t);
    om_test_fail_alloc_after(n);
    rc = om_instance_copy(&t, &in);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_true(om_instance_equal(&t, &in));
      om_instance_clear(&t);
      assert_int_equal(n, 10); /* 3 strings, array, 3 keys, 3 values */
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_ptr_equal(t.id, (char *)(uintptr_t)0xababababababababull);
  }
  assert_int_equal(om_instance_copy(NULL, &in), OM_EINVAL);
  in.metadata = NULL;
  assert_int_equal(om_instance_copy(&c, &in), OM_EINVAL);
  om_instance_clear(&c);
  om_instance_clear(NULL);
}

/* ---- snapshots ---- */

static int freed_count;
static void count_free(void *p) {
  freed_count++;
  free(p);
}

static void snapshot_basics(void **state) {
  om_instance_t in[4] = {inst("c", "http://c"), inst("a", "http://a"),
                         inst("d", "http://d"), inst("b", "http://b")};
  om_kv_t kv[2] = {{"z", "1"}, {"a", "2"}};
  om_snapshot_t *s = NULL;
  size_t idx = 99;
  const char *f = NULL, *w = NULL;
  void *blob;
  (void)state;
  in[2].metadata = kv;
  in[2].n_metadata = 2;
  assert_int_equal(om_snapshot_new("svc", 7, in, 4, &s, &idx, &f, &w), 0);
  assert_string_equal(om_snapshot_service(s), "svc");
  assert_int_equal(om_snapshot_revision(s), 7);
  assert_int_equal(om_snapshot_count(s), 4);
  assert_string_equal(om_snapshot_instance(s, 0)->id, "a");
  assert_string_equal(om_snapshot_instance(s, 1)->id, "b");
  assert_string_equal(om_snapshot_instance(s, 2)->id, "c");
  assert_string_equal(om_snapshot_instance(s, 3)->id, "d");
  assert_null(om_snapshot_instance(s, 4));
  assert_string_equal(om_snapshot_find(s, "d")->url, "http://d");
  assert_string_equal(om_snapshot_find(s, "d")->metadata[0].key, "a");
  assert_ptr_not_equal(om_snapshot_find(s, "d")->url, in[2].url);
  assert_null(om_snapshot_find(s, "e"));
  assert_null(om_snapshot_find(s, ""));
  assert_null(om_snapshot_find(s, NULL));

  /* refcount and cache slots */
  assert_ptr_equal(om_snapshot_ref(s), s);
  assert_null(om_snapshot_ref(NULL));
  blob = malloc(16);
  assert_null(om_snapshot_cache(s, 0));
  assert_int_equal(om_snapshot_set_cache(s, 0, blob, count_free), 0);
  assert_ptr_equal(om_snapshot_cache(s, 0), blob);
  assert_int_equal(om_snapshot_set_cache(s, 0, blob, count_free), OM_ESTATE);
  assert_int_equal(om_snapshot_set_cache(s, -1, blob, count_free), OM_EINVAL);
  assert_int_equal(
      om_snapshot_set_cache(s, OM_SNAPSHOT_CACHE_SLOTS, blob, count_free),
      OM_EINVAL);
  assert_int_equal(om_snapshot_set_cache(s, 1, NULL, count_free), OM_EINVAL);
  assert_null(om_snapshot_cache(s, OM_SNAPSHOT_CACHE_SLOTS));
  assert_int_equal(om_snapshot_set_cache(s, 3, malloc(8), count_free), 0);
  freed_count = 0;
  om_snapshot_unref(s);
  assert_int_equal(freed_count, 0); /* one reference left */
  om_snapshot_unref(s);
  assert_int_equal(freed_count, 2);
  om_snapshot_unref(NULL);

  /* empty */
  assert_int_equal(om_snapshot_new("empty", 0, NULL, 0, &s, NULL, NULL, NULL),
                   0);
  assert_int_equal(om_snapshot_count(s), 0);
  assert_null(om_snapshot_find(s, "a"));
  om_snapshot_unref(s);
}

static void snapshot_errors(void **state) {
  om_instance_t in[4] = {inst("c", "http://c"), inst("a", "http://a"),
                         inst("c", "http://c2"), inst("a", "http://a2")};
  om_snapshot_t *s = (om_snapshot_t *)&s;
  size_t idx = 99;
  const char *f = NULL, *w = NULL;
  (void)state;
  assert_int_equal(om_snapshot_new("svc", 1, in, 4, &s, &idx, &f, &w),
                   OM_EDUPLICATE);
  assert_int_equal(idx, 3); /* the later "a" */
  assert_string_equal(f, "id");
  assert_string_equal(w, "duplicate id");
  assert_ptr_equal(s, (om_snapshot_t *)&s);
  assert_int_equal(om_snapshot_new("svc", 1, in, 3, &s, &idx, &f, &w),
                   OM_EDUPLICATE);
  assert_int_equal(idx, 2);
  in[2].id = "e";
  in[3].id = "f";
  in[3].weight = -1;
  assert_int_equal(om_snapshot_new("svc", 1, in, 4, &s, &idx, &f, &w),
                   OM_EINVAL);
  assert_int_equal(idx, 3);
  assert_string_equal(f, "weight");
  in[3].weight = 1;
  assert_int_equal(om_snapshot_new("bad/name", 1, in, 4, &s, &idx, &f, &w),
                   OM_EINVAL);
  assert_int_equal(idx, SIZE_MAX);
  assert_string_equal(f, "service");
  assert_int_equal(om_snapshot_new(NULL, 1, in, 4, &s, NULL, NULL, NULL),
                   OM_EINVAL);
  assert_int_equal(om_snapshot_new("svc", 1, NULL, 2, &s, NULL, NULL, NULL),
                   OM_EINVAL);
  assert_int_equal(om_snapshot_new("svc", 1, in, 4, NULL, NULL, NULL, NULL),
                   OM_EINVAL);
  assert_ptr_equal(s, (om_snapshot_t *)&s);
}

/* Fail the Nth allocation of om_snapshot_new until it succeeds. */
static void snapshot_fault_injection(void **state) {
  om_kv_t kv[2] = {{"k", "v"}, {"a", "b"}};
  om_instance_t in[5];
  (void)state;
  for (int i = 0; i < 5; i++) {
    static const char *ids[] = {"e", "b", "d", "a", "c"};
    in[i] = inst(ids[i], "http://h");
    in[i].metadata = kv;
    in[i].n_metadata = 2;
  }
  for (long n = 0;; n++) {
    om_snapshot_t *s = NULL;
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_snapshot_new("svc", 3, in, 5, &s, NULL, NULL, NULL);
    om_test_alloc_reset();
    if (rc == 0) {
      assert_int_equal(om_snapshot_count(s), 5);
      assert_string_equal(om_snapshot_instance(s, 4)->id, "e");
      om_snapshot_unref(s);
      OM_ASSERT_CMP(n, >=, 7); /* ids, node array, 5 nodes, block */
      break;
    }
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(s);
  }
}

/* ---- edits ---- */

static void edit_shares_and_replaces(void **state) {
  om_instance_t in[3] = {inst("a", "http://a"), inst("b", "http://b"),
                         inst("c", "http://c")};
  om_instance_t put[2] = {inst("b", "http://b2"), inst("bb", "http://bb")};
  const char *rm[3] = {"c", "zz", "bb"};
  om_snapshot_t *s1, *s2, *s3;
  (void)state;
  assert_int_equal(om_snapshot_new("svc", 1, in, 3, &s1, NULL, NULL, NULL), 0);
  assert_int_equal(
      om_snapshot_edit(s1, 2, put, 2, rm, 3, &s2, NULL, NULL, NULL), 0);
  assert_int_equal(om_snapshot_revision(s2), 2);
  assert_string_equal(om_snapshot_service(s2), "svc");
  assert_int_equal(om_snapshot_count(s2), 3);
  assert_string_equal(om_snapshot_instance(s2, 0)->id, "a");
  assert_string_equal(om_snapshot_instance(s2, 1)->id, "b");
  assert_string_equal(om_snapshot_instance(s2, 1)->url, "http://b2");
  assert_string_equal(om_snapshot_instance(s2, 2)->id, "bb"); /* put wins */
  /* "a" is shared, not copied; base unchanged */
  assert_ptr_equal(om_snapshot_find(s2, "a"), om_snapshot_find(s1, "a"));
  assert_string_equal(om_snapshot_find(s1, "b")->url, "http://b");
  assert_non_null(om_snapshot_find(s1, "c"));
  assert_int_equal(om_snapshot_count(s1), 3);
  /* the base can go first: shared instances stay alive */
  om_snapshot_unref(s1);
  assert_string_equal(om_snapshot_find(s2, "a")->url, "http://a");
  assert_int_equal(
      om_snapshot_edit(s2, 3, NULL, 0, NULL, 0, &s3, NULL, NULL, NULL), 0);
  assert_int_equal(om_snapshot_count(s3), 3);
  assert_ptr_equal(om_snapshot_instance(s3, 1), om_snapshot_instance(s2, 1));
  om_snapshot_unref(s3);
  {
    const char *all[3] = {"a", "b", "bb"};
    assert_int_equal(
        om_snapshot_edit(s2, 4, NULL, 0, all, 3, &s3, NULL, NULL, NULL), 0);
    assert_int_equal(om_snapshot_count(s3), 0);
    om_snapshot_unref(s3);
  }
  om_snapshot_unref(s2);
}

static void edit_errors_and_faults(void **state) {
  om_instance_t in[2] = {inst("a", "http://a"), inst("b", "http://b")};
  om_instance_t put[3] = {inst("x", "http://x"), inst("b", "http://b3"),
                          inst("x", "http://x2")};
  const char *rm[2] = {"a", NULL};
  om_snapshot_t *s1, *s2 = NULL;
  size_t idx = 0;
  const char *f = NULL, *w = NULL;
  (void)state;
  assert_int_equal(om_snapshot_new("svc", 1, in, 2, &s1, NULL, NULL, NULL), 0);
  assert_int_equal(om_snapshot_edit(s1, 2, put, 3, NULL, 0, &s2, &idx, &f, &w),
                   OM_EDUPLICATE);
  assert_int_equal(idx, 2);
  put[2].id = "y";
  put[2].ttl_ms = 5;
  assert_int_equal(om_snapshot_edit(s1, 2, put, 3, NULL, 0, &s2, &idx, &f, &w),
                   OM_EINVAL);
  assert_int_equal(idx, 2);
  assert_string_equal(f, "ttl_ms");
  put[2].ttl_ms = 5000;
  assert_int_equal(
      om_snapshot_edit(s1, 2, put, 3, rm, 2, &s2, NULL, NULL, NULL), OM_EINVAL);
  assert_int_equal(
      om_snapshot_edit(NULL, 2, put, 3, NULL, 0, &s2, NULL, NULL, NULL),
      OM_EINVAL);
  assert_int_equal(
      om_snapshot_edit(s1, 2, put, 3, NULL, 1, &s2, NULL, NULL, NULL),
      OM_EINVAL);
  assert_null(s2);
  for (long n = 0;; n++) {
    int rc;
    om_test_fail_alloc_after(n);
    rc = om_snapshot_edit(s1, 2, put, 3, rm, 1, &s2, NULL, NULL, NULL);
    om_test_alloc_reset();
    if (rc == 0)
      break;
    assert_int_equal(rc, OM_ENOMEM);
    assert_null(s2);
    /* the base is intact */
    assert_int_equal(om_snapshot_count(s1), 2);
    assert_string_equal(om_snapshot_find(s1, "b")->url, "http://b");
  }
  assert_int_equal(om_snapshot_count(s2), 3); /* b, x, y */
  assert_string_equal(om_snapshot_find(s2, "b")->url, "http://b3");
  assert_null(om_snapshot_find(s2, "a"));
  om_snapshot_unref(s2);
  om_snapshot_unref(s1);
}

/* ---- properties: random sets and edits against a reference model ---- */

#define MAXN 2000 /* several chunks of 256 */

typedef struct {
  char id[16];
  char url[32];
  int present;
} model_t;

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void check_against(const om_snapshot_t *s, const model_t *m,
                          size_t universe) {
  const char *want[MAXN];
  size_t n = 0;
  for (size_t i = 0; i < universe; i++)
    if (m[i].present)
      want[n++] = m[i].id;
  qsort(want, n, sizeof *want, cmp_str);
  assert_int_equal(om_snapshot_count(s), n);
  for (size_t i = 0; i < n; i++) {
    const om_instance_t *x = om_snapshot_instance(s, i);
    assert_string_equal(x->id, want[i]);
    if (i > 0)
      if (strcmp(om_snapshot_instance(s, i - 1)->id, x->id) >= 0)
        fail_msg("ids out of order: \"%s\" before \"%s\"",
                 om_snapshot_instance(s, i - 1)->id, x->id);
  }
  for (size_t i = 0; i < universe; i++) {
    const om_instance_t *x = om_snapshot_find(s, m[i].id);
    if (m[i].present) {
      assert_non_null(x);
      assert_string_equal(x->url, m[i].url);
    } else
      assert_null(x);
  }
}

static void random_sets_and_edits(void **state) {
  static model_t m[MAXN];
  om_rng_t rng;
  (void)state;
  om_rng_seed(&rng, 42);
  for (int round = 0; round < 40; round++) {
    size_t universe = 1 + om_rng_below(&rng, MAXN);
    om_instance_t in[MAXN];
    size_t n = 0;
    om_snapshot_t *s;
    for (size_t i = 0; i < universe; i++) {
      /* ids of varying length and shared prefixes stress the ordering */
      snprintf(m[i].id, sizeof m[i].id, "%.*s%zu", (int)(i % 3), "ab-", i);
      snprintf(m[i].url, sizeof m[i].url, "http://h%zu:%zu", i,
               1 + (size_t)om_rng_below(&rng, 65535));
      m[i].present = om_rng_below(&rng, 2);
      if (m[i].present)
        in[n++] = inst(m[i].id, m[i].url);
    }
    for (size_t i = n; i > 1; i--) { /* shuffle the input order */
      size_t j = om_rng_below(&rng, (uint32_t)i);
      om_instance_t t = in[i - 1];
      in[i - 1] = in[j];
      in[j] = t;
    }
    assert_int_equal(om_snapshot_new("p", 1, in, n, &s, NULL, NULL, NULL), 0);
    check_against(s, m, universe);
    for (int step = 0; step < 20; step++) {
      om_instance_t put[8];
      const char *rm[8];
      size_t np = om_rng_below(&rng, 8), nr = om_rng_below(&rng, 8);
      int used[MAXN] = {0};
      om_snapshot_t *s2;
      size_t k = 0;
      for (size_t i = 0; i < np; i++) {
        size_t x = om_rng_below(&rng, (uint32_t)universe);
        if (used[x])
          continue;
        used[x] = 1;
        snprintf(m[x].url, sizeof m[x].url, "http://h%zu:%d", x, step + 1);
        put[k++] = inst(m[x].id, m[x].url);
      }
      np = k;
      for (size_t i = 0; i < nr; i++) {
        size_t x = om_rng_below(&rng, (uint32_t)universe);
        rm[i] = m[x].id;
        if (!used[x])
          m[x].present = 0; /* removal, unless also put */
      }
      for (size_t i = 0; i < np; i++)
        for (size_t x = 0; x < universe; x++)
          if (strcmp(m[x].id, put[i].id) == 0)
            m[x].present = 1;
      assert_int_equal(om_snapshot_edit(s, (uint64_t)step + 2, put, np, rm, nr,
                                        &s2, NULL, NULL, NULL),
                       0);
      om_snapshot_unref(s);
      s = s2;
      check_against(s, m, universe);
    }
    om_snapshot_unref(s);
  }
}

/* One instance at a time, as registrations and expiries come: up to MAXN
 * in a shuffled order (chunks fill and split), then every one removed in
 * another order (chunks shrink and vanish), the set checked as it goes;
 * each step's base stays valid after the next is made from it. */
static void one_at_a_time_grow_and_drain(void **state) {
  static model_t m[MAXN];
  static size_t order[MAXN];
  om_rng_t rng;
  om_snapshot_t *s;
  (void)state;
  om_rng_seed(&rng, 7);
  for (size_t i = 0; i < MAXN; i++) {
    snprintf(m[i].id, sizeof m[i].id, "i-%zu", i);
    snprintf(m[i].url, sizeof m[i].url, "http://h%zu:80", i);
    m[i].present = 0;
    order[i] = i;
  }
  assert_int_equal(om_snapshot_new("p", 1, NULL, 0, &s, NULL, NULL, NULL), 0);
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = MAXN; i > 1; i--) {
      size_t j = om_rng_below(&rng, (uint32_t)i), t = order[i - 1];
      order[i - 1] = order[j];
      order[j] = t;
    }
    for (size_t i = 0; i < MAXN; i++) {
      size_t x = order[i];
      om_snapshot_t *s2;
      const char *rm = m[x].id;
      if (pass == 0) {
        om_instance_t in = inst(m[x].id, m[x].url);
        assert_int_equal(
            om_snapshot_edit(s, i + 2, &in, 1, NULL, 0, &s2, NULL, NULL, NULL),
            0);
        m[x].present = 1;
      } else {
        assert_int_equal(
            om_snapshot_edit(s, i + 2, NULL, 0, &rm, 1, &s2, NULL, NULL, NULL),
            0);
        m[x].present = 0;
      }
      if (i % 97 == 0 || i == MAXN - 1) {
        check_against(s2, m, MAXN);
        OM_ASSERT_CMP(om_snapshot_count(s), ==,
                      pass == 0 ? i : (size_t)MAXN - i);
      }
      om_snapshot_unref(s);
      s = s2;
    }
  }
  OM_ASSERT_CMP(om_snapshot_count(s), ==, 0);
  assert_null(om_snapshot_instance(s, 0));
  assert_null(om_snapshot_find(s, "i-1"));
  om_snapshot_unref(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(names),
      cmocka_unit_test(url_rules),
      cmocka_unit_test(id_weight_ttl_zone_rules),
      cmocka_unit_test(metadata_rules),
      cmocka_unit_test(copy_clear_equal),
      cmocka_unit_test(snapshot_basics),
      cmocka_unit_test(snapshot_errors),
      cmocka_unit_test(snapshot_fault_injection),
      cmocka_unit_test(edit_shares_and_replaces),
      cmocka_unit_test(edit_errors_and_faults),
      cmocka_unit_test(random_sets_and_edits),
      cmocka_unit_test(one_at_a_time_grow_and_drain),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
