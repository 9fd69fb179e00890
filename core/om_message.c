/*
 * om_message.c: agent messages, egress errors and splitting a body into
 * parts (see om_message.h).
 */
#include "om_message.h"

#include <stdlib.h>
#include <string.h>

#include "om_errno.h"

#define CAUSE_MAX 4096

struct om_agent_message_s {
  char *agent;
  char *conversation;
  char *run; /* NULL: no run */
  char *body;
  size_t len;
};

typedef struct {
  char *route;
  char *class_name;
  int status;
  uint64_t duration_ns;
} attempt_t;

struct om_egress_error_s {
  om_egress_error_class_t cls;
  int retryable;
  char *cause;
  attempt_t *attempts;
  size_t n_stored, cap, n_made;
  char *agent, *conversation, *run;
};

/* ------------------------------------------------------------------ */
/* Helpers                                                             */

int om_utf8_valid(const char *s, size_t len) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  if (s == NULL)
    return len == 0;
  /* RFC 3629 section 4, the UTF8-octets ABNF, byte by byte. */
  while (i < len) {
    unsigned char c = p[i];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      i++;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0)
        lo = 0xA0; /* no overlongs */
      else if (c == 0xED)
        hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0)
        lo = 0x90;
      else if (c == 0xF4)
        hi = 0x8F; /* nothing above U+10FFFF */
    } else {
      return 0;
    }
    if (len - i - 1 < need)
      return 0;
    if (p[i + 1] < lo || p[i + 1] > hi)
      return 0;
    for (size_t k = 2; k <= need; k++)
      if ((p[i + k] & 0xC0) != 0x80)
        return 0;
    i += need + 1;
  }
  return 1;
}

/* An id that is safe in headers, JSON and log lines. */
static int valid_id(const char *s, int optional) {
  size_t n;
  if (s == NULL)
    return optional;
  n = strlen(s);
  if (n == 0 || n > OM_MESSAGE_MAX_ID || !om_utf8_valid(s, n))
    return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7F)
      return 0;
  }
  return 1;
}

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d == NULL)
    return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static char *dup_opt(const char *s, int *fail) {
  char *d;
  if (s == NULL)
    return NULL;
  d = dup_n(s, strlen(s));
  if (d == NULL)
    *fail = 1;
  return d;
}

/* ------------------------------------------------------------------ */
/* Agent message                                                       */

int om_agent_message_new(const char *agent, const char *conversation,
                         const char *run_id, const char *body, size_t len,
                         om_agent_message_t **out) {
  om_agent_message_t *m;
  int fail = 0;
  if (out == NULL || !valid_id(agent, 0) || !valid_id(conversation, 0) ||
      !valid_id(run_id, 1) || (body == NULL && len > 0))
    return OM_EINVAL;
  if (len > OM_MESSAGE_MAX_BODY)
    return OM_ETOOBIG;
  if (!om_utf8_valid(body, len))
    return OM_EPARSE;
  m = calloc(1, sizeof *m);
  if (m == NULL)
    return OM_ENOMEM;
  m->agent = dup_opt(agent, &fail);
  m->conversation = dup_opt(conversation, &fail);
  m->run = dup_opt(run_id, &fail);
  m->body = dup_n(len ? body : "", len);
  if (fail || m->body == NULL) {
    om_agent_message_free(m);
    return OM_ENOMEM;
  }
  m->len = len;
  *out = m;
  return 0;
}

void om_agent_message_free(om_agent_message_t *m) {
  if (m == NULL)
    return;
  free(m->agent);
  free(m->conversation);
  free(m->run);
  free(m->body);
  free(m);
}

const char *om_agent_message_body(const om_agent_message_t *m, size_t *len) {
  if (len != NULL)
    *len = m->len;
  return m->body;
}

const char *om_agent_message_agent(const om_agent_message_t *m) {
  return m->agent;
}

const char *om_agent_message_conversation(const om_agent_message_t *m) {
  return m->conversation;
}

const char *om_agent_message_run(const om_agent_message_t *m) {
  return m->run;
}

/* ------------------------------------------------------------------ */
/* Egress error                                                        */

int om_egress_error_new(om_egress_error_class_t cls, int retryable,
                        const char *cause, om_egress_error_t **out) {
  om_egress_error_t *e;
  size_t n;
  if (out == NULL || cause == NULL ||
      (cls != OM_EGRESS_TRANSPORT && cls != OM_EGRESS_SEMANTIC))
    return OM_EINVAL;
  n = strlen(cause);
  if (n > CAUSE_MAX) {
    n = CAUSE_MAX;
    /* Keep the cut on a code point boundary so the cause stays UTF-8. */
    while (n > 0 && ((unsigned char)cause[n] & 0xC0) == 0x80)
      n--;
  }
  e = calloc(1, sizeof *e);
  if (e == NULL)
    return OM_ENOMEM;
  e->cause = dup_n(cause, n);
  if (e->cause == NULL) {
    free(e);
    return OM_ENOMEM;
  }
  e->cls = cls;
  e->retryable = retryable != 0;
  *out = e;
  return 0;
}

int om_egress_error_add_attempt(om_egress_error_t *e, const char *route,
                                int status, const char *class_name,
                                uint64_t duration_ns) {
  attempt_t a;
  if (e == NULL || !valid_id(route, 0) || !valid_id(class_name, 0))
    return OM_EINVAL;
  if (e->n_stored == OM_EGRESS_MAX_ATTEMPTS) {
    e->n_made++;
    return 0;
  }
  if (e->n_stored == e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 4;
    attempt_t *grown = realloc(e->attempts, cap * sizeof *grown);
    if (grown == NULL)
      return OM_ENOMEM;
    e->attempts = grown;
    e->cap = cap;
  }
  a.route = dup_n(route, strlen(route));
  a.class_name = dup_n(class_name, strlen(class_name));
  if (a.route == NULL || a.class_name == NULL) {
    free(a.route);
    free(a.class_name);
    return OM_ENOMEM;
  }
  a.status = status;
  a.duration_ns = duration_ns;
  e->attempts[e->n_stored++] = a;
  e->n_made++;
  return 0;
}

int om_egress_error_set_attribution(om_egress_error_t *e, const char *agent,
                                    const char *conversation,
                                    const char *run_id) {
  char *a, *c, *r;
  int fail = 0;
  if (e == NULL || !valid_id(agent, 0) || !valid_id(conversation, 0) ||
      !valid_id(run_id, 1))
    return OM_EINVAL;
  a = dup_opt(agent, &fail);
  c = dup_opt(conversation, &fail);
  r = dup_opt(run_id, &fail);
  if (fail) {
    free(a);
    free(c);
    free(r);
    return OM_ENOMEM;
  }
  free(e->agent);
  free(e->conversation);
  free(e->run);
  e->agent = a;
  e->conversation = c;
  e->run = r;
  return 0;
}

void om_egress_error_free(om_egress_error_t *e) {
  if (e == NULL)
    return;
  for (size_t i = 0; i < e->n_stored; i++) {
    free(e->attempts[i].route);
    free(e->attempts[i].class_name);
  }
  free(e->attempts);
  free(e->cause);
  free(e->agent);
  free(e->conversation);
  free(e->run);
  free(e);
}

om_egress_error_class_t om_egress_error_class(const om_egress_error_t *e) {
  return e->cls;
}

const char *om_egress_error_class_name(om_egress_error_class_t cls) {
  switch (cls) {
  case OM_EGRESS_TRANSPORT:
    return "transport";
  case OM_EGRESS_SEMANTIC:
    return "semantic";
  }
  return "unknown";
}

int om_egress_error_retryable(const om_egress_error_t *e) {
  return e->retryable;
}

const char *om_egress_error_cause(const om_egress_error_t *e) {
  return e->cause;
}

size_t om_egress_error_attempts(const om_egress_error_t *e) {
  return e->n_made;
}

size_t om_egress_error_attempts_stored(const om_egress_error_t *e) {
  return e->n_stored;
}

int om_egress_error_attempt(const om_egress_error_t *e, size_t i,
                            const char **route, int *status,
                            const char **class_name, uint64_t *duration_ns) {
  const attempt_t *a;
  if (e == NULL || i >= e->n_stored)
    return OM_ERANGE;
  a = &e->attempts[i];
  if (route != NULL)
    *route = a->route;
  if (status != NULL)
    *status = a->status;
  if (class_name != NULL)
    *class_name = a->class_name;
  if (duration_ns != NULL)
    *duration_ns = a->duration_ns;
  return 0;
}

const char *om_egress_error_agent(const om_egress_error_t *e) {
  return e->agent;
}

const char *om_egress_error_conversation(const om_egress_error_t *e) {
  return e->conversation;
}

const char *om_egress_error_run(const om_egress_error_t *e) {
  return e->run;
}

/* ------------------------------------------------------------------ */
/* Splitting                                                           */

/*
 * A fenced code block (CommonMark 0.31 section 4.5): [start, end) is the
 * opening line through the closing line (newline included); open_end is
 * where the content starts and close_start where the closing line starts
 * (both == end when the block runs to the end of the body unclosed).
 */
typedef struct {
  size_t start, open_end, close_start, end;
  char ch;
  size_t count;
} fence_t;

typedef struct {
  size_t a, b;          /* the body slice */
  int fence;            /* index of the re-opened fence, or -1 */
  size_t prefix, close; /* added bytes before / after */
} piece_t;

static size_t line_end(const char *s, size_t len, size_t i) {
  const char *nl = memchr(s + i, '\n', len - i);
  return nl ? (size_t)(nl - s) + 1 : len;
}

/* The fence run opening at line start i: its char and count, or 0. */
static size_t fence_run(const char *s, size_t len, size_t i, size_t eol,
                        char *ch) {
  size_t k = 0, n = 0;
  while (k < 3 && i + k < eol && s[i + k] == ' ')
    k++;
  i += k;
  if (i >= eol || (s[i] != '`' && s[i] != '~'))
    return 0;
  *ch = s[i];
  while (i + n < eol && s[i + n] == *ch)
    n++;
  return n >= 3 ? n : 0;
}

static int is_closing(const char *s, size_t len, size_t i, size_t eol,
                      const fence_t *f) {
  char ch;
  size_t n = fence_run(s, len, i, eol, &ch), k;
  if (n == 0 || ch != f->ch || n < f->count)
    return 0;
  k = i;
  while (s[k] == ' ')
    k++;
  for (k += n; k < eol; k++)
    if (s[k] != ' ' && s[k] != '\t' && s[k] != '\r' && s[k] != '\n')
      return 0;
  return 1;
}

/* Every fenced block of the body, in order; *out malloc'd (NULL if none). */
static int find_fences(const char *s, size_t len, fence_t **out, size_t *n) {
  fence_t *v = NULL;
  size_t cap = 0, cnt = 0, i = 0;
  while (i < len) {
    size_t eol = line_end(s, len, i);
    char ch;
    size_t run = fence_run(s, len, i, eol, &ch);
    if (run > 0 && ch == '`') {
      /* A backtick fence's info string may not contain a backtick. */
      const char *info = s + i;
      while (*info == ' ')
        info++;
      if (memchr(info + run, '`', (size_t)(s + eol - (info + run))) != NULL)
        run = 0;
    }
    if (run == 0) {
      i = eol;
      continue;
    }
    if (cnt == cap) {
      size_t nc = cap ? cap * 2 : 4;
      fence_t *g = realloc(v, nc * sizeof *g);
      if (g == NULL) {
        free(v);
        return OM_ENOMEM;
      }
      v = g;
      cap = nc;
    }
    fence_t f = {i, eol, len, len, ch, run};
    for (size_t j = eol; j < len;) {
      size_t e2 = line_end(s, len, j);
      if (is_closing(s, len, j, e2, &f)) {
        f.close_start = j;
        f.end = e2;
        break;
      }
      j = e2;
    }
    v[cnt++] = f;
    i = f.end;
  }
  *out = v;
  *n = cnt;
  return 0;
}

/* The fence strictly containing cut c, or -1. */
static int fence_at(const fence_t *f, size_t nf, size_t c) {
  size_t lo = 0, hi = nf;
  while (lo < hi) { /* first fence with end > c */
    size_t mid = lo + (hi - lo) / 2;
    if (f[mid].end <= c)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < nf && f[lo].start < c && c < f[lo].end)
    return (int)lo;
  return -1;
}

enum { CUT_PARA, CUT_LINE, CUT_SPACE, CUT_CHAR };

static int cut_ok(const char *s, size_t len, size_t c, int kind) {
  switch (kind) {
  case CUT_PARA:
    return c >= 2 && s[c - 1] == '\n' && s[c - 2] == '\n';
  case CUT_LINE:
    return s[c - 1] == '\n';
  case CUT_SPACE:
    return s[c - 1] == ' ' || s[c - 1] == '\t';
  default:
    return c == len || ((unsigned char)s[c] & 0xC0) != 0x80;
  }
}

/*
 * The last cut in (pos, hi] of the given kind that is not inside a fence
 * (a fence listed in `plain` has been given up on and counts as text).
 */
static size_t last_cut(const char *s, size_t len, size_t pos, size_t hi,
                       int kind, const fence_t *f, size_t nf, int plain) {
  for (size_t c = hi; c > pos; c--) {
    int in;
    if (!cut_ok(s, len, c, kind))
      continue;
    in = fence_at(f, nf, c);
    if (in < 0 || in == plain)
      return c;
  }
  return 0;
}

static int push_piece(piece_t **v, size_t *n, size_t *cap, piece_t p) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 8;
    piece_t *g = realloc(*v, nc * sizeof *g);
    if (g == NULL)
      return OM_ENOMEM;
    *v = g;
    *cap = nc;
  }
  (*v)[(*n)++] = p;
  return 0;
}

/* Plan the parts; see om_message_split for the rules. */
static int plan(const char *s, size_t len, size_t limit, const fence_t *f,
                size_t nf, piece_t **out, size_t *nout) {
  piece_t *v = NULL;
  size_t n = 0, cap = 0, pos = 0;
  int cont = -1;  /* fence being continued (re-opened) at pos */
  int plain = -1; /* fence given up on: cut like text */
  while (pos < len) {
    size_t prefix = cont >= 0 ? f[cont].open_end - f[cont].start : 0;
    size_t c = 0, hi, close = 0;
    piece_t p;
    int rc, next_cont = -1;
    if (prefix < limit) {
      hi = len - pos <= limit - prefix ? len : pos + (limit - prefix);
      if (hi == len)
        c = len; /* the rest fits */
      for (int k = CUT_PARA; c == 0 && k <= CUT_SPACE; k++)
        c = last_cut(s, len, pos, hi, k, f, nf, plain);
    }
    if (c == 0) {
      /* Inside a fence that cannot fit: cut it at a line and re-fence. */
      int g = cont >= 0 ? cont : fence_at(f, nf, pos + 1);
      if (g >= 0 && g != plain && (cont >= 0 || f[g].start == pos)) {
        size_t fclose = f[g].count + 1;
        size_t lo = cont >= 0 ? pos : f[g].open_end;
        if (prefix + fclose < limit) {
          size_t top = pos + (limit - prefix - fclose);
          if (top >= f[g].close_start)
            top = f[g].close_start - 1; /* keep the closing line whole */
          for (size_t k = top; k > lo && c == 0; k--)
            if (s[k - 1] == '\n')
              c = k;
        }
        if (c != 0) {
          close = fclose;
          next_cont = g;
        }
      }
    }
    if (c == 0) {
      /* Last resort: cut like text, dropping the fence if there was one. */
      int g = cont >= 0 ? cont : fence_at(f, nf, pos + 1);
      if (g >= 0)
        plain = g;
      cont = -1;
      prefix = 0;
      hi = len - pos <= limit ? len : pos + limit;
      for (int k = CUT_PARA; c == 0 && k <= CUT_CHAR; k++)
        c = last_cut(s, len, pos, hi, k, f, 0, -1);
      if (c == 0) {
        free(v);
        return OM_ERANGE; /* a code point longer than the limit */
      }
    }
    p.a = pos;
    p.b = c;
    p.prefix = prefix;
    p.close = close;
    /* The re-opened fence and the closed one are the same when both. */
    p.fence = prefix ? cont : next_cont;
    rc = push_piece(&v, &n, &cap, p);
    if (rc) {
      free(v);
      return rc;
    }
    cont = next_cont;
    pos = c;
  }
  *out = v;
  *nout = n;
  return 0;
}

int om_message_split(const char *body, size_t len, size_t limit,
                     om_message_part_t **parts, size_t *n) {
  fence_t *f = NULL;
  piece_t *v = NULL;
  size_t nf = 0, np = 0, total = 0;
  om_message_part_t *out;
  char *w;
  int rc;
  if ((body == NULL && len > 0) || limit == 0 || parts == NULL || n == NULL)
    return OM_EINVAL;
  if (!om_utf8_valid(body, len))
    return OM_EPARSE;
  if (len == 0) {
    *parts = NULL;
    *n = 0;
    return 0;
  }
  rc = find_fences(body, len, &f, &nf);
  if (rc)
    return rc;
  rc = plan(body, len, limit, f, nf, &v, &np);
  if (rc) {
    free(f);
    return rc;
  }
  for (size_t i = 0; i < np; i++)
    total += v[i].prefix + (v[i].b - v[i].a) + v[i].close + 1;
  out = malloc(np * sizeof *out + total);
  if (out == NULL) {
    free(v);
    free(f);
    return OM_ENOMEM;
  }
  w = (char *)(out + np);
  for (size_t i = 0; i < np; i++) {
    const piece_t *p = &v[i];
    char *start = w;
    if (p->prefix) {
      memcpy(w, body + f[p->fence].start, p->prefix);
      w += p->prefix;
    }
    memcpy(w, body + p->a, p->b - p->a);
    w += p->b - p->a;
    if (p->close) {
      memset(w, f[p->fence].ch, p->close - 1);
      w[p->close - 1] = '\n';
      w += p->close;
    }
    *w++ = '\0';
    out[i].text = start;
    out[i].len = (size_t)(w - start) - 1;
    out[i].offset = p->a;
    out[i].prefix_len = p->prefix;
    out[i].suffix_len = p->close;
  }
  free(v);
  free(f);
  *parts = out;
  *n = np;
  return 0;
}

void om_message_parts_free(om_message_part_t *parts) {
  free(parts);
}
