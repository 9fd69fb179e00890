/*
 * om_proxy_circuits.c: peer circuits shared by the workers of a process
 * (om_proxy_workers.h). A record is keyed by service, peer id and URL;
 * every worker's peer with that key holds a reference to the same one, so
 * a failing peer is ejected after the failures the policy names whichever
 * workers saw them, and a half-open circuit admits one probe in the whole
 * process. Each om_circuit_* call on a record runs under its mutex (calls
 * are short: a few comparisons). A proxy without a table (one loop, or a
 * test) gets private records that nobody else sees.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "om_proxy_internal.h"

#define BUCKETS 4096

struct om__proxy_circuit_s {
  pthread_mutex_t mu;
  om_circuit_t c;
  om_proxy_circuits_t *tab; /* NULL: private */
  size_t refs;              /* under tab->mu (or the owner's, private) */
  struct om__proxy_circuit_s *next;
  size_t key_len;
  char key[]; /* service \n id \n url */
};

struct om_proxy_circuits_s {
  pthread_mutex_t mu;
  om__proxy_circuit_t *buckets[BUCKETS];
};

om_proxy_circuits_t *om_proxy_circuits_new(void) {
  om_proxy_circuits_t *t = calloc(1, sizeof *t);
  if (t != NULL && pthread_mutex_init(&t->mu, NULL) != 0) {
    free(t);
    return NULL;
  }
  return t;
}

void om_proxy_circuits_free(om_proxy_circuits_t *t) {
  if (t == NULL)
    return;
  for (size_t i = 0; i < BUCKETS; i++)
    while (t->buckets[i] != NULL) { /* none left once every proxy closed */
      om__proxy_circuit_t *r = t->buckets[i];
      t->buckets[i] = r->next;
      pthread_mutex_destroy(&r->mu);
      free(r);
    }
  pthread_mutex_destroy(&t->mu);
  free(t);
}

static size_t bucket_of(const char *key, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)key[i]) * 1099511628211ull;
  return (size_t)(h % BUCKETS);
}

om__proxy_circuit_t *om__proxy_circuit_get(om_proxy_circuits_t *t,
                                           const char *service, const char *id,
                                           const char *url,
                                           const om_circuit_opts_t *co) {
  size_t sn = strlen(service), in = strlen(id), un = strlen(url);
  size_t n = sn + in + un + 2, b = 0;
  om__proxy_circuit_t *r = malloc(sizeof *r + n + 1);
  if (r == NULL)
    return NULL;
  memcpy(r->key, service, sn);
  r->key[sn] = '\n';
  memcpy(r->key + sn + 1, id, in);
  r->key[sn + 1 + in] = '\n';
  memcpy(r->key + sn + in + 2, url, un + 1);
  r->key_len = n;
  if (t != NULL) {
    b = bucket_of(r->key, n);
    pthread_mutex_lock(&t->mu);
    for (om__proxy_circuit_t *x = t->buckets[b]; x != NULL; x = x->next)
      if (x->key_len == n && memcmp(x->key, r->key, n) == 0) {
        x->refs++;
        pthread_mutex_unlock(&t->mu);
        free(r);
        return x;
      }
  }
  if (pthread_mutex_init(&r->mu, NULL) != 0) {
    if (t != NULL)
      pthread_mutex_unlock(&t->mu);
    free(r);
    return NULL;
  }
  om_circuit_init(&r->c, co); /* the options were checked before */
  r->tab = t;
  r->refs = 1;
  r->next = NULL;
  if (t != NULL) {
    r->next = t->buckets[b];
    t->buckets[b] = r;
    pthread_mutex_unlock(&t->mu);
  }
  return r;
}

void om__proxy_circuit_unref(om__proxy_circuit_t *r) {
  om_proxy_circuits_t *t;
  if (r == NULL)
    return;
  t = r->tab;
  if (t != NULL) {
    om__proxy_circuit_t **pp;
    pthread_mutex_lock(&t->mu);
    if (--r->refs > 0) {
      pthread_mutex_unlock(&t->mu);
      return;
    }
    for (pp = &t->buckets[bucket_of(r->key, r->key_len)]; *pp != r;
         pp = &(*pp)->next)
      ;
    *pp = r->next;
    pthread_mutex_unlock(&t->mu);
  } else if (--r->refs > 0) {
    return;
  }
  pthread_mutex_destroy(&r->mu);
  free(r);
}

void om__proxy_circuit_init(om__proxy_circuit_t *r,
                            const om_circuit_opts_t *co) {
  pthread_mutex_lock(&r->mu);
  om_circuit_init(&r->c, co);
  pthread_mutex_unlock(&r->mu);
}

bool om__proxy_circuit_allow(om__proxy_circuit_t *r, uint64_t now) {
  bool ok;
  pthread_mutex_lock(&r->mu);
  ok = om_circuit_allow(&r->c, now);
  pthread_mutex_unlock(&r->mu);
  return ok;
}

bool om__proxy_circuit_peek(om__proxy_circuit_t *r, uint64_t now) {
  bool ok;
  pthread_mutex_lock(&r->mu);
  ok = om_circuit_peek(&r->c, now);
  pthread_mutex_unlock(&r->mu);
  return ok;
}

void om__proxy_circuit_release(om__proxy_circuit_t *r, uint64_t now) {
  pthread_mutex_lock(&r->mu);
  om_circuit_release(&r->c, now);
  pthread_mutex_unlock(&r->mu);
}

om_circuit_state_t om__proxy_circuit_record(om__proxy_circuit_t *r,
                                            uint64_t now, bool ok) {
  om_circuit_state_t st;
  pthread_mutex_lock(&r->mu);
  st = om_circuit_record(&r->c, now, ok);
  pthread_mutex_unlock(&r->mu);
  return st;
}

om_circuit_state_t om__proxy_circuit_state(om__proxy_circuit_t *r,
                                           uint64_t now) {
  om_circuit_state_t st;
  pthread_mutex_lock(&r->mu);
  st = om_circuit_state(&r->c, now);
  pthread_mutex_unlock(&r->mu);
  return st;
}

uint32_t om__proxy_circuit_trips(om__proxy_circuit_t *r, uint64_t now) {
  uint32_t n;
  pthread_mutex_lock(&r->mu);
  n = om_circuit_trips(&r->c, now);
  pthread_mutex_unlock(&r->mu);
  return n;
}

uint64_t om__proxy_circuit_open_until(om__proxy_circuit_t *r, uint64_t now) {
  uint64_t t;
  pthread_mutex_lock(&r->mu);
  t = om_circuit_open_until(&r->c, now);
  pthread_mutex_unlock(&r->mu);
  return t;
}
