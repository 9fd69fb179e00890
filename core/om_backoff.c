/*
 * om_backoff.c: exponential backoff with full jitter, and the server's own
 * word on when to come back (Retry-After, retry-after-ms). See om_backoff.h.
 */
#include "om_backoff.h"

#include <stdbool.h>

#include "om_errno.h"

/* ---- exponential backoff ---------------------------------------------- */

uint64_t om_backoff_ceiling_ns(uint32_t attempt, uint64_t base_ns,
                               uint64_t cap_ns) {
  uint32_t shift = attempt > 0 ? attempt - 1 : 0;
  if (base_ns == 0)
    return 0;
  /* Compare before shifting, so attempt 1000 cannot wrap to a tiny wait. */
  if (shift >= 64 || base_ns > (cap_ns >> shift))
    return cap_ns;
  return base_ns << shift;
}

uint64_t om_backoff_full_jitter_ns(uint32_t attempt, uint64_t base_ns,
                                   uint64_t cap_ns, double r) {
  uint64_t ceiling = om_backoff_ceiling_ns(attempt, base_ns, cap_ns);
  double v;
  if (!(r >= 0.0)) /* also NaN */
    r = 0.0;
  if (r >= 1.0)
    r = 0x1.fffffffffffffp-1; /* the largest double below 1 */
  v = r * (double)ceiling;
  /* (double)ceiling may round up past ceiling; never return more. */
  if (v >= 18446744073709551616.0) /* 2^64 */
    return ceiling;
  return (uint64_t)v < ceiling ? (uint64_t)v : ceiling;
}

uint64_t om_backoff_ns(uint32_t attempt, uint64_t base_ns, uint64_t cap_ns,
                       om_rng_t *rng) {
  return om_backoff_full_jitter_ns(attempt, base_ns, cap_ns,
                                   om_rng_double(rng));
}

/* ---- calendar arithmetic (proleptic Gregorian, no libc) ---------------- */

/*
 * Days since 1970-01-01 of y-m-d (Howard Hinnant's days_from_civil, valid
 * for every int64 year this file produces). Out-of-range days extrapolate,
 * which the two-digit-year resolution relies on before validating.
 */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  int64_t era;
  unsigned yoe, doy, doe;
  y -= m <= 2;
  era = (y >= 0 ? y : y - 399) / 400;
  yoe = (unsigned)(y - era * 400);
  doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + (int64_t)doe - 719468;
}

/* The inverse: the civil date of day z since the epoch. */
static void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d) {
  int64_t era;
  unsigned doe, yoe, doy, mp;
  z += 719468;
  era = (z >= 0 ? z : z - 146096) / 146097;
  doe = (unsigned)(z - era * 146097);
  yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  mp = (5 * doy + 2) / 153;
  *d = doy - (153 * mp + 2) / 5 + 1;
  *m = mp < 10 ? mp + 3 : mp - 9;
  *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

static bool is_leap(int64_t y) {
  return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static unsigned days_in_month(int64_t y, unsigned m) {
  static const unsigned char dim[12] = {31, 28, 31, 30, 31, 30,
                                        31, 31, 30, 31, 30, 31};
  return m == 2 && is_leap(y) ? 29 : dim[m - 1];
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* ---- HTTP-date (RFC 9110 section 5.6.7) -------------------------------- */

typedef struct {
  const char *p, *end;
} cursor_t;

static const char *const day_short[7] = {"Sun", "Mon", "Tue", "Wed",
                                         "Thu", "Fri", "Sat"};
static const char *const day_long[7] = {"Sunday",    "Monday",   "Tuesday",
                                        "Wednesday", "Thursday", "Friday",
                                        "Saturday"};
static const char *const month_name[12] = {"Jan", "Feb", "Mar", "Apr",
                                           "May", "Jun", "Jul", "Aug",
                                           "Sep", "Oct", "Nov", "Dec"};

static bool lit(cursor_t *c, const char *s) {
  const char *p = c->p;
  for (; *s != '\0'; s++, p++)
    if (p == c->end || *p != *s)
      return false;
  c->p = p;
  return true;
}

static bool is_digit(char ch) {
  return ch >= '0' && ch <= '9';
}

/* Exactly n DIGITs. */
static bool digits(cursor_t *c, int n, unsigned *out) {
  unsigned v = 0;
  if (c->end - c->p < n)
    return false;
  for (int i = 0; i < n; i++) {
    if (!is_digit(c->p[i]))
      return false;
    v = v * 10 + (unsigned)(c->p[i] - '0');
  }
  c->p += n;
  *out = v;
  return true;
}

/* Names are case-sensitive (%s"..." in the ABNF). Returns index or -1. */
static int name_in(cursor_t *c, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (lit(c, names[i]))
      return i;
  return -1;
}

/* time-of-day = hour ":" minute ":" second; returns seconds of the day. */
static bool time_of_day(cursor_t *c, unsigned *sod) {
  unsigned h, m, s;
  if (!digits(c, 2, &h) || !lit(c, ":") || !digits(c, 2, &m) || !lit(c, ":") ||
      !digits(c, 2, &s))
    return false;
  /* "00:00:00 - 23:59:60 (leap second)" */
  if (h > 23 || m > 59 || (s > 59 && !(s == 60 && h == 23 && m == 59)))
    return false;
  *sod = h * 3600 + m * 60 + s;
  return true;
}

/* -1, 0, 1 as (y1,m1,d1,sod1) is before, equal to, after (y2,m2,d2,sod2). */
static int cmp_moment(int64_t y1, unsigned m1, unsigned d1, unsigned s1,
                      int64_t y2, unsigned m2, unsigned d2, unsigned s2) {
  if (y1 != y2)
    return y1 < y2 ? -1 : 1;
  if (m1 != m2)
    return m1 < m2 ? -1 : 1;
  if (d1 != d2)
    return d1 < d2 ? -1 : 1;
  if (s1 != s2)
    return s1 < s2 ? -1 : 1;
  return 0;
}

/*
 * RFC 9110 section 5.6.7: "Recipients of a timestamp value in rfc850-date
 * format, which uses a two-digit year, MUST interpret a timestamp that
 * appears to be more than 50 years in the future as representing the most
 * recent year in the past that had the same last two digits." We take the
 * latest year ending in yy whose moment is not more than 50 years after
 * now. Compared field by field (not in seconds) so no now_s can overflow.
 */
static int64_t resolve_two_digit_year(unsigned yy, unsigned mon, unsigned day,
                                      unsigned sod, int64_t now_s) {
  int64_t now_days = floor_div(now_s, 86400), cy, y;
  unsigned now_sod = (unsigned)(now_s - now_days * 86400), cm, cd;
  civil_from_days(now_days, &cy, &cm, &cd);
  y = floor_div(cy, 100) * 100 + yy;
  if (cmp_moment(y, mon, day, sod, cy + 50, cm, cd, now_sod) > 0)
    y -= 100;
  else if (cmp_moment(y + 100, mon, day, sod, cy + 50, cm, cd, now_sod) <= 0)
    y += 100;
  return y;
}

int om_http_date_parse(const char *s, size_t len, int64_t now_s,
                       int64_t *out_s) {
  cursor_t c;
  int wday, mon;
  unsigned day, sod, y4;
  int64_t year, days;
  if (out_s == NULL || (s == NULL && len > 0))
    return OM_EINVAL;
  if (s == NULL)
    return OM_EPARSE;
  c.p = s;
  c.end = s + len;

  wday = name_in(&c, day_short, 7);
  if (wday < 0)
    return OM_EPARSE;
  if (lit(&c, ", ")) {
    /* IMF-fixdate = day-name "," SP date1 SP time-of-day SP GMT
     * date1 = day SP month SP year; day = 2DIGIT; year = 4DIGIT */
    if (!digits(&c, 2, &day) || !lit(&c, " ") ||
        (mon = name_in(&c, month_name, 12)) < 0 || !lit(&c, " ") ||
        !digits(&c, 4, &y4) || !lit(&c, " ") || !time_of_day(&c, &sod) ||
        !lit(&c, " GMT"))
      return OM_EPARSE;
    year = y4;
  } else if (lit(&c, " ")) {
    /* asctime-date = day-name SP date3 SP time-of-day SP year
     * date3 = month SP ( 2DIGIT / ( SP DIGIT ) ) */
    if ((mon = name_in(&c, month_name, 12)) < 0 || !lit(&c, " "))
      return OM_EPARSE;
    if (lit(&c, " ")) {
      if (!digits(&c, 1, &day))
        return OM_EPARSE;
    } else if (!digits(&c, 2, &day)) {
      return OM_EPARSE;
    }
    if (!lit(&c, " ") || !time_of_day(&c, &sod) || !lit(&c, " ") ||
        !digits(&c, 4, &y4))
      return OM_EPARSE;
    year = y4;
  } else {
    /* rfc850-date = day-name-l "," SP date2 SP time-of-day SP GMT
     * date2 = day "-" month "-" 2DIGIT. The short name matched the first
     * three letters of the long one; re-read the whole long name. */
    unsigned yy;
    c.p = s;
    if (!lit(&c, day_long[wday]) || !lit(&c, ", ") || !digits(&c, 2, &day) ||
        !lit(&c, "-") || (mon = name_in(&c, month_name, 12)) < 0 ||
        !lit(&c, "-") || !digits(&c, 2, &yy) || !lit(&c, " ") ||
        !time_of_day(&c, &sod) || !lit(&c, " GMT"))
      return OM_EPARSE;
    year = resolve_two_digit_year(yy, (unsigned)mon + 1, day, sod, now_s);
  }
  if (c.p != c.end)
    return OM_EPARSE;
  if (day < 1 || day > days_in_month(year, (unsigned)mon + 1))
    return OM_EPARSE;
  days = days_from_civil(year, (unsigned)mon + 1, day);
  /* Only a two-digit year near an absurd now_s can get here. */
  if (days > INT64_MAX / 86400 - 1 || days < INT64_MIN / 86400 + 1)
    return OM_EPARSE;
  if ((int)(((days % 7) + 7 + 4) % 7) != wday) /* 1970-01-01 was a Thu */
    return OM_EPARSE;
  *out_s = days * 86400 + (int64_t)sod;
  return 0;
}

/* ---- Retry-After and retry-after-ms ------------------------------------ */

static bool is_ows(char ch) {
  return ch == ' ' || ch == '\t';
}

/* Trim OWS (RFC 9110 section 5.6.3) from both ends of c. */
static void trim_ows(cursor_t *c) {
  while (c->p < c->end && is_ows(*c->p))
    c->p++;
  while (c->end > c->p && is_ows(c->end[-1]))
    c->end--;
}

/* 1*DIGIT, saturating at UINT64_MAX instead of wrapping. */
static bool digits_sat(cursor_t *c, uint64_t *out) {
  uint64_t v = 0;
  const char *start = c->p;
  for (; c->p < c->end && is_digit(*c->p); c->p++) {
    unsigned dg = (unsigned)(*c->p - '0');
    v = v > (UINT64_MAX - dg) / 10 ? UINT64_MAX : v * 10 + dg;
  }
  *out = v;
  return c->p > start;
}

static uint64_t mul_sat(uint64_t a, uint64_t b) {
  return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static uint64_t clamp(uint64_t v, uint64_t ceiling) {
  return v < ceiling ? v : ceiling;
}

int om_retry_after_parse(const char *s, size_t len, int64_t now_s,
                         uint64_t ceiling_ms, uint64_t *out_ms) {
  cursor_t c;
  if (out_ms == NULL || (s == NULL && len > 0))
    return OM_EINVAL;
  if (s == NULL)
    return OM_EPARSE;
  c.p = s;
  c.end = s + len;
  trim_ows(&c);
  if (c.p == c.end)
    return OM_EPARSE;
  if (is_digit(*c.p)) {
    /* delay-seconds = 1*DIGIT; no HTTP-date starts with a digit. */
    uint64_t secs;
    digits_sat(&c, &secs);
    if (c.p != c.end)
      return OM_EPARSE;
    *out_ms = clamp(mul_sat(secs, 1000), ceiling_ms);
  } else {
    int64_t date_s;
    int rc = om_http_date_parse(c.p, (size_t)(c.end - c.p), now_s, &date_s);
    if (rc != 0)
      return rc;
    if (date_s <= now_s) {
      *out_ms = 0;
    } else {
      /* The true difference is below 2^64, so unsigned math is exact. */
      uint64_t secs = (uint64_t)date_s - (uint64_t)now_s;
      *out_ms = clamp(mul_sat(secs, 1000), ceiling_ms);
    }
  }
  return 0;
}

int om_retry_after_ms_parse(const char *s, size_t len, uint64_t ceiling_ms,
                            uint64_t *out_ms) {
  cursor_t c;
  uint64_t ms, frac;
  if (out_ms == NULL || (s == NULL && len > 0))
    return OM_EINVAL;
  if (s == NULL)
    return OM_EPARSE;
  c.p = s;
  c.end = s + len;
  trim_ows(&c);
  if (!digits_sat(&c, &ms))
    return OM_EPARSE;
  if (c.p < c.end && *c.p == '.') {
    c.p++;
    if (!digits_sat(&c, &frac))
      return OM_EPARSE;
    if (frac > 0 && ms < UINT64_MAX)
      ms++; /* round a fraction up */
  }
  if (c.p != c.end)
    return OM_EPARSE;
  *out_ms = clamp(ms, ceiling_ms);
  return 0;
}
