/*
 * list.c: GET /v2/sandboxes and GET /sandboxes: E2B's metadata filter
 * (decoded as its server decodes the SDK's layers), page tokens, times.
 * Listing walks a team's ordered index a bounded number of records at a
 * time under the store lock, so one team's large listing never holds every
 * other request back (see list_walk).
 */
#include "control.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ */
/* Listed sandboxes as JSON (also control.c's GET /sandboxes/{id})     */
/* ------------------------------------------------------------------ */

static void set_time(json_t *o, const char *name, int64_t us) {
  char buf[48];
  wbd_format_time(us, buf, sizeof buf);
  json_object_set_new(o, name, json_string(buf));
}

/* `ListedSandbox`; with `detail`, `SandboxDetail`. Under the store lock. */
json_t *wbd_ctl_listed_json(const struct wbd_sandbox *sb, int detail) {
  json_t *o = json_object();
  json_object_set_new(o, "alias", json_string(sb->template_id));
  if (detail) json_object_set_new(o, "allowInternetAccess", json_boolean(sb->allow_internet));
  json_object_set_new(o, "clientID", json_string(WBD_CLIENT_ID));
  json_object_set_new(o, "cpuCount", json_integer(sb->cpu_count));
  json_object_set_new(o, "diskSizeMB", json_integer(WBD_DISK_MB));
  set_time(o, "endAt", sb->end_at_us);
  if (detail && sb->secure) json_object_set_new(o, "envdAccessToken", json_string(sb->access_token));
  json_object_set_new(o, "envdVersion", json_string(WBD_ENVD_VERSION));
  if (detail) {
    json_t *lc = json_object();
    json_object_set_new(lc, "autoResume", json_boolean(sb->auto_resume));
    json_object_set_new(lc, "onTimeout", json_string(sb->auto_pause ? "pause" : "kill"));
    json_object_set_new(o, "lifecycle", lc);
  }
  json_object_set_new(o, "memoryMB", json_integer(sb->memory_mb));
  json_object_set_new(o, "metadata", json_deep_copy(sb->metadata));
  /* E2B's detail shows the ingress setting (not the traffic token) */
  if (detail && sb->traffic_token[0]) json_object_set_new(o, "network", json_pack("{s:b}", "allowPublicTraffic", 0));
  json_object_set_new(o, "sandboxID", json_string(sb->id));
  set_time(o, "startedAt", sb->started_at_us);
  json_object_set_new(o, "state", json_string(sb->state == WBD_PAUSED ? "paused" : "running"));
  json_object_set_new(o, "templateID", json_string(sb->template_id));
  return o;
}

/* ------------------------------------------------------------------ */
/* Query strings and filters                                           */
/* ------------------------------------------------------------------ */

/* Go's url.QueryUnescape: %XX (strict) and '+' as a space. */
/* Decodes %XX and '+'; *outlen (when given) is the decoded length, which
 * may hold NUL bytes. */
static char *query_unescape(const char *s, size_t n, size_t *outlen) {
  char *out = malloc(n + 1), *w = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '%') {
      if (i + 2 >= n || !isxdigit((unsigned char)s[i + 1]) || !isxdigit((unsigned char)s[i + 2])) {
        free(out);
        return NULL;
      }
      char hx[3] = {s[i + 1], s[i + 2], 0};
      *w++ = (char)strtol(hx, NULL, 16);
      i += 2;
    } else if (s[i] == '+') {
      *w++ = ' ';
    } else {
      *w++ = s[i];
    }
  }
  *w = 0;
  if (outlen) *outlen = (size_t)(w - out);
  return out;
}

/* A filter no record matches: its key is not UTF-8, and metadata keys are. */
static json_t *impossible_filter(void) {
  json_t *f = json_object();
  json_object_set_new_nocheck(f, "\xff", json_string(""));
  return f;
}

/* E2B's utils.parseFilters on the once-decoded `metadata` value. */
json_t *wbd_parse_metadata(const char *q, const char **err) {
  size_t qn = strlen(q), wn = 0;
  char *whole = query_unescape(q, qn, &wn);
  if (!whole) {
    *err = "error when unescaping query: invalid URL escape";
    return NULL;
  }
  if (wn != strlen(whole)) { /* a NUL would cut the filter short and widen it */
    free(whole);
    return impossible_filter();
  }
  json_t *f = json_object();
  char *p = whole;
  for (;;) {
    char *amp = strchr(p, '&');
    size_t n = amp ? (size_t)(amp - p) : strlen(p);
    char *eq = memchr(p, '=', n);
    if (!eq || memchr(eq + 1, '=', n - (size_t)(eq - p) - 1)) {
      *err = "invalid key value pair in query";
      json_decref(f);
      free(whole);
      return NULL;
    }
    size_t kl = 0, vl = 0;
    char *k = query_unescape(p, (size_t)(eq - p), &kl);
    char *v = query_unescape(eq + 1, n - (size_t)(eq - p) - 1, &vl);
    if (!k || !v) {
      free(k);
      free(v);
      *err = "error when unescaping key or value: invalid URL escape";
      json_decref(f);
      free(whole);
      return NULL;
    }
    /* Raw bytes, unchecked and with their length: a key or value that is not
     * UTF-8 or holds a NUL matches no record (metadata is UTF-8 without NUL)
     * rather than being dropped from the filter (json_object_set refuses
     * such a key) or cut at the NUL, which widened the filter. */
    if (kl != strlen(k)) {
      free(k);
      free(v);
      json_decref(f);
      free(whole);
      return impossible_filter();
    }
    json_object_set_new_nocheck(f, k, json_stringn_nocheck(v, vl));
    free(k);
    free(v);
    if (!amp) break;
    p = amp + 1;
  }
  free(whole);
  return f;
}

static int meta_match(const struct wbd_sandbox *sb, json_t *filter, int loose) {
  if (!filter) return 1;
  const char *k;
  json_t *want;
  json_object_foreach(filter, k, want) {
    json_t *have = json_object_get(sb->metadata, k);
    if (!have) return 0;
    const char *hv = json_string_value(have), *wv = json_string_value(want);
    size_t hl = json_string_length(have), wl = json_string_length(want);
    if (loose) {
      if (wl > hl || memcmp(hv, wv, wl) != 0) return 0;
    } else if (hl != wl || memcmp(hv, wv, wl) != 0) {
      return 0;
    }
  }
  return 1;
}

/* RFC 3339 → unix microseconds (fraction truncated). */
int wbd_parse_time(const char *s, int64_t *us) {
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
  if (!p) return -1;
  int64_t frac = 0;
  int digits = 0;
  if (*p == '.') {
    p++;
    while (isdigit((unsigned char)*p)) {
      if (digits < 6) frac = frac * 10 + (*p - '0');
      digits++;
      p++;
    }
    if (!digits) return -1;
    for (int d = digits; d < 6; d++) frac *= 10;
  }
  int64_t off = 0;
  if (*p == 'Z' || *p == 'z')
    p++;
  else if (*p == '+' || *p == '-') {
    int sign = *p == '-' ? -1 : 1;
    if (!isdigit((unsigned char)p[1]) || !isdigit((unsigned char)p[2]) || p[3] != ':' ||
        !isdigit((unsigned char)p[4]) || !isdigit((unsigned char)p[5]))
      return -1;
    off = sign * (((p[1] - '0') * 10 + (p[2] - '0')) * 3600 + ((p[4] - '0') * 10 + (p[5] - '0')) * 60);
    p += 6;
  } else
    return -1;
  if (*p) return -1;
  time_t t = timegm(&tm);
  *us = ((int64_t)t - off) * US + frac;
  return 0;
}

/* Go's RFC3339Nano (trailing zeros of the fraction dropped). */
static void format_nano(int64_t us, char *buf, size_t len) {
  char full[48];
  wbd_format_time(us, full, sizeof full);
  char *dot = strchr(full, '.'), *z = strchr(full, 'Z');
  if (dot && z) {
    char *e = z;
    while (e > dot + 1 && e[-1] == '0') e--;
    if (e == dot + 1) e = dot;
    memmove(e, z, 2);
  }
  snprintf(buf, len, "%s", full);
}

static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static char *b64_encode(const unsigned char *s, size_t n) {
  char *out = malloc(4 * ((n + 2) / 3) + 1), *w = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i += 3) {
    unsigned v = (unsigned)s[i] << 16 | (i + 1 < n ? (unsigned)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
    *w++ = b64url[(v >> 18) & 63];
    *w++ = b64url[(v >> 12) & 63];
    *w++ = i + 1 < n ? b64url[(v >> 6) & 63] : '=';
    *w++ = i + 2 < n ? b64url[v & 63] : '=';
  }
  *w = 0;
  return out;
}

/* Strict base64url with padding (Go's base64.URLEncoding). */
static char *b64_decode(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n % 4) return NULL;
  char *out = malloc(n / 4 * 3 + 1), *w = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n; i += 4) {
    int v[4], pad = 0;
    for (int j = 0; j < 4; j++) {
      char c = s[i + j];
      const char *pos = c ? strchr(b64url, c) : NULL;
      if (c == '=' && i + 4 == n && j >= 2) {
        v[j] = 0;
        pad++;
      } else if (pos && !pad) {
        v[j] = (int)(pos - b64url);
      } else {
        free(out);
        return NULL;
      }
    }
    unsigned x = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 | (unsigned)v[3];
    *w++ = (char)(x >> 16);
    if (pad < 2) *w++ = (char)(x >> 8 & 255);
    if (pad < 1) *w++ = (char)(x & 255);
  }
  *w = 0;
  return out;
}

int wbd_parse_token(const char *tok, int asc, int64_t *ts, char *id, size_t idlen) {
  char *s = b64_decode(tok);
  if (!s) return -1;
  size_t n = strlen(s);
  int rc = -1;
  if (asc) {
    if (n < 5 || strcmp(s + n - 5, "__asc") != 0) goto out;
    s[n - 5] = 0;
  }
  char *sep = strstr(s, "__");
  if (!sep) goto out;
  *sep = 0;
  const char *sid = sep + 2;
  size_t il = strlen(sid);
  if (il == 0 || il >= idlen) goto out;
  for (size_t i = 0; i < il; i++)
    if (!islower((unsigned char)sid[i]) && !isdigit((unsigned char)sid[i])) goto out;
  if (wbd_parse_time(s, ts) != 0) goto out;
  memcpy(id, sid, il + 1);
  rc = 0;
out:
  free(s);
  return rc;
}

static char *make_token(int64_t started_at_us, const char *id, int asc) {
  char t[48], raw[128];
  format_nano(started_at_us, t, sizeof t);
  snprintf(raw, sizeof raw, "%s__%s%s", t, id, asc ? "__asc" : "");
  return b64_encode((const unsigned char *)raw, strlen(raw));
}

/* ------------------------------------------------------------------ */
/* Walking a team's records without stalling everyone else             */
/* ------------------------------------------------------------------ */

/* Records visited per hold of the store lock: a listing of a million
 * records lets other requests in between every WALK_CHUNK of them. */
#define WALK_CHUNK 256

/* Called under the store lock for each record in listing order; returns 0 to
 * go on, 1 to stop. */
typedef int (*walk_fn)(struct wbd_sandbox *sb, void *cls);

/* Visits team's records in asc (or desc) listing order after the cursor
 * (when has_cursor), WALK_CHUNK at a time: between two chunks the lock is
 * released and the walk resumes after the last record it saw (by its
 * startedAt and id, as a page token does), so records created or removed
 * meanwhile are seen or not as in a paginated listing. */
static void list_walk(const char *team, int asc, int has_cursor, int64_t cur_ts, const char *cur_id, walk_fn fn,
                      void *cls) {
  char id[sizeof((struct wbd_sandbox *)0)->id] = "";
  int64_t ts = cur_ts;
  if (has_cursor) snprintf(id, sizeof id, "%s", cur_id);
  for (;;) {
    wbd_store_lock();
    struct wbd_team *t = wbd_store_team_locked(team, 0);
    if (!t) {
      wbd_store_unlock();
      return;
    }
    size_t n = t->n;
    size_t i =
      asc ? (has_cursor ? wbd_store_upper_locked(t, ts, id) : 0) : (has_cursor ? wbd_store_lower_locked(t, ts, id) : n);
    int stop = 0;
    for (int k = 0; k < WALK_CHUNK; k++) {
      if (asc ? i >= n : i == 0) {
        stop = 1;
        break;
      }
      struct wbd_sandbox *sb = asc ? &t->v[i++]->sb : &t->v[--i]->sb;
      ts = sb->started_at_us;
      memcpy(id, sb->id, sizeof id);
      has_cursor = 1;
      if (fn(sb, cls)) {
        stop = 1;
        break;
      }
    }
    wbd_store_unlock();
    if (stop) return;
  }
}

struct list_q {
  int want_running, want_paused, has_after, asc, loose;
  int64_t after;
  const char *tmpl;
  json_t *filter;
  long limit, got, total_running;
  json_t *items;
  char *next;
  int64_t last_ts;
  char last_id[32];
};

static int q_match(struct list_q *q, const struct wbd_sandbox *sb) {
  if (q->has_after && sb->started_at_us < q->after) return 0;
  if (q->tmpl && strcmp(sb->template_id, q->tmpl) != 0) return 0;
  return meta_match(sb, q->filter, q->loose);
}

static int page_fn(struct wbd_sandbox *sb, void *cls) {
  struct list_q *q = cls;
  if (!q->asc && q->has_after && sb->started_at_us < q->after) return 1; /* desc: all older from here */
  if (sb->state == WBD_RUNNING ? !q->want_running : !q->want_paused) return 0;
  if (!q_match(q, sb)) return 0;
  if (q->got == q->limit) {
    q->next = make_token(q->last_ts, q->last_id, q->asc);
    return 1;
  }
  json_array_append_new(q->items, wbd_ctl_listed_json(sb, 0));
  q->last_ts = sb->started_at_us;
  memcpy(q->last_id, sb->id, sizeof q->last_id);
  q->got++;
  return 0;
}

static int count_running_fn(struct wbd_sandbox *sb, void *cls) {
  struct list_q *q = cls;
  if (sb->state == WBD_RUNNING && q_match(q, sb)) q->total_running++;
  return 0;
}

static int running_fn(struct wbd_sandbox *sb, void *cls) {
  struct list_q *q = cls;
  if (sb->state == WBD_RUNNING && meta_match(sb, q->filter, q->loose))
    json_array_append_new(q->items, wbd_ctl_listed_json(sb, 0));
  return 0;
}

#define QERR "validation error: parameter \"%s\" in query has an error: "

/* Decodes ?metadata= into *filter (NULL when absent). A bad one is answered
 * with E2B's 400 here: the caller returns the result when req->replied. */
static enum MHD_Result metadata_filter(struct wbd_req *req, const char *metadata, json_t **filter) {
  *filter = NULL;
  if (!metadata) return MHD_YES;
  const char *err = NULL;
  const char *raw = NULL;
  size_t rawlen = 0;
  if (MHD_lookup_connection_value_n(req->conn, MHD_GET_ARGUMENT_KIND, "metadata", 8, &raw, &rawlen) == MHD_YES && raw &&
      rawlen != strlen(raw)) {
    /* A NUL inside: C strings would cut the filter there and widen it.
     * Metadata holds no NUL, so nothing matches. */
    *filter = impossible_filter();
    return MHD_YES;
  }
  *filter = wbd_parse_metadata(metadata, &err);
  if (!*filter) return wbd_reply_error(req, 400, "Error parsing metadata: %s", err);
  return MHD_YES;
}

enum MHD_Result wbd_list_v2(struct wbd_req *req, const char *team) {
  const char *state = wbd_req_query(req, "state"), *metadata = wbd_req_query(req, "metadata"),
             *limit_s = wbd_req_query(req, "limit"), *token = wbd_req_query(req, "nextToken"),
             *order = wbd_req_query(req, "order"), *after_s = wbd_req_query(req, "startedAfter"),
             *tmpl = wbd_req_query(req, "template");
  int want_running = 1, want_paused = 1;
  if (state) {
    want_running = want_paused = 0;
    const char *p = state;
    for (;;) {
      size_t n = strcspn(p, ",");
      if (n == 7 && strncmp(p, "running", 7) == 0)
        want_running = 1;
      else if (n == 6 && strncmp(p, "paused", 6) == 0)
        want_paused = 1;
      else
        return wbd_reply_error(req, 400, QERR "value is not one of the allowed values [\"running\",\"paused\"]",
                               "state");
      if (!p[n]) break;
      p += n + 1;
    }
  }
  long limit = 100;
  if (limit_s) {
    char *end;
    errno = 0;
    limit = strtol(limit_s, &end, 10);
    if (errno || end == limit_s || *end)
      return wbd_reply_error(req, 400, QERR "value %s: an invalid integer: invalid syntax", "limit", limit_s);
    if (limit < 1) return wbd_reply_error(req, 400, QERR "number must be at least 1", "limit");
    if (limit > 100) return wbd_reply_error(req, 400, QERR "number must be at most 100", "limit");
  }
  int asc = 0;
  if (order) {
    if (strcmp(order, "asc") == 0)
      asc = 1;
    else if (strcmp(order, "desc") != 0)
      return wbd_reply_error(req, 400, QERR "value is not one of the allowed values [\"asc\",\"desc\"]", "order");
  }
  int64_t after = 0;
  int has_after = 0;
  if (after_s) {
    if (wbd_parse_time(after_s, &after) != 0)
      return wbd_reply_error(req, 400, QERR "value %s: an invalid date-time", "startedAfter", after_s);
    has_after = 1;
  }
  if (tmpl && strchr(tmpl, ':'))
    return wbd_reply_error(req, 400, "Template tags are not supported when filtering sandboxes");
  if (tmpl && !*tmpl) tmpl = NULL;
  int64_t cur_ts = 0;
  char cur_id[sizeof((struct wbd_sandbox *)0)->id]; /* a longer id in a token is refused, never cut */
  int has_cursor = 0;
  if (token) {
    if (wbd_parse_token(token, asc, &cur_ts, cur_id, sizeof cur_id) != 0)
      return wbd_reply_error(req, 400, "Invalid next token");
    has_cursor = 1;
  }
  json_t *filter;
  enum MHD_Result mr = metadata_filter(req, metadata, &filter);
  if (req->replied) return mr;

  struct list_q q = {.want_running = want_running,
                     .want_paused = want_paused,
                     .has_after = has_after,
                     .asc = asc,
                     .loose = wbd_knob(&wbd_loose_metadata),
                     .after = after,
                     .tmpl = tmpl,
                     .filter = filter,
                     .limit = limit,
                     .total_running = -1,
                     .items = json_array()};
  list_walk(team, asc, has_cursor, cur_ts, cur_id, page_fn, &q);
  if (want_running) {
    int counted = 0;
    if (!filter && !tmpl && !has_after) {
      wbd_store_lock();
      struct wbd_team *t = wbd_store_team_locked(team, 0);
      q.total_running = t ? t->running : 0;
      wbd_store_unlock();
      counted = 1;
    }
    if (!counted) {
      q.total_running = 0;
      list_walk(team, 1, 0, 0, NULL, count_running_fn, &q);
    }
  }
  json_decref(filter);
  json_t *items = q.items;
  char *next = q.next;
  long total_running = q.total_running;

  const char *hv[5] = {NULL};
  char tr[32];
  int k = 0;
  if (next) {
    hv[k++] = "X-Next-Token";
    hv[k++] = next;
  }
  if (total_running >= 0) {
    snprintf(tr, sizeof tr, "%ld", total_running);
    hv[k++] = "X-Total-Running";
    hv[k++] = tr;
  }
  enum MHD_Result r = wbd_reply_json(req, 200, items, hv);
  free(next);
  return r;
}

enum MHD_Result wbd_list_v1(struct wbd_req *req, const char *team) {
  const char *metadata = wbd_req_query(req, "metadata");
  json_t *filter;
  enum MHD_Result mr = metadata_filter(req, metadata, &filter);
  if (req->replied) return mr;
  /* newest first (startedAt desc, id asc): the desc listing order */
  struct list_q q = {.loose = wbd_knob(&wbd_loose_metadata), .filter = filter, .items = json_array()};
  list_walk(team, 0, 0, 0, NULL, running_fn, &q);
  json_decref(filter);
  return wbd_reply_json(req, 200, q.items, NULL);
}
