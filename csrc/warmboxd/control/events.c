/*
 * events.c: E2B's sandbox lifecycle events (control.h's events section): recorded by the
 * control plane's hooks, kept for the retention (in memory, and appended to
 * <data_dir>/.state/events/events.jsonl with --data-dir so they outlive a
 * restart), served by GET /events/sandboxes[/{id}] with E2B's paging
 * (offset, limit 1..100 default 10, orderAsc default false, repeated types).
 *
 * An event has E2B's schema (infra's SandboxEvent, as the API answers it:
 * camelCase): version "v2", id, type (sandbox.lifecycle.*), the deprecated
 * eventCategory/eventLabel pair as infra's migration fills it, timestamp,
 * eventData {sandbox_metadata, execution | set_timeout}, sandboxId,
 * sandboxExecutionId (one per run: create or resume), sandboxTemplateId,
 * sandboxBuildId, sandboxTeamId (UUIDs derived from the template and the
 * team).
 */
#include "control.h"
#include "state.h"
#include "util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int wbd_events_ttl_days = 7;

static const char *const type_names[] = {
  "sandbox.lifecycle.created", "sandbox.lifecycle.killed",  "sandbox.lifecycle.paused",
  "sandbox.lifecycle.resumed", "sandbox.lifecycle.updated", "sandbox.lifecycle.checkpointed",
};
/* infra's migration pairs (none for checkpointed) */
static const char *const labels[] = {"create", "kill", "pause", "resume", "update", NULL};
#define N_TYPES (sizeof type_names / sizeof *type_names)

struct ev {
  int64_t ts;
  char team[64];
  char sid[32];
  int type;
  json_t *j;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ev *evs;
static size_t nev, cap_ev;
static FILE *log_file;

/* ------------------------------------------------------------------ */
/* Keeping                                                             */
/* ------------------------------------------------------------------ */

static int64_t retention_us(void) {
  return (int64_t)wbd_knob(&wbd_events_ttl_days) * 86400 * US;
}

/* Drops what is past the retention (evs is in time order). Under mu. */
static void prune_locked(int64_t now) {
  int64_t cut = now - retention_us();
  size_t k = 0;
  while (k < nev && evs[k].ts < cut) json_decref(evs[k++].j);
  if (k == 0) return;
  memmove(evs, evs + k, (nev - k) * sizeof *evs);
  nev -= k;
}

/* Inserts in time order (an event timed at a lease's end may come after a
 * later one). Steals j. Under mu. */
static void insert_locked(int64_t ts, const char *team, const char *sid, int type, json_t *j) {
  if (nev == cap_ev && !(evs = realloc(evs, (cap_ev = cap_ev ? cap_ev * 2 : 256) * sizeof *evs))) abort();
  size_t i = nev;
  while (i > 0 && evs[i - 1].ts > ts) i--;
  memmove(evs + i + 1, evs + i, (nev - i) * sizeof *evs);
  struct ev *e = &evs[i];
  e->ts = ts;
  snprintf(e->team, sizeof e->team, "%s", team);
  snprintf(e->sid, sizeof e->sid, "%s", sid);
  e->type = type;
  e->j = j;
  nev++;
}

static int type_index(const char *name) {
  for (size_t i = 0; i < N_TYPES; i++)
    if (strcmp(type_names[i], name) == 0) return (int)i;
  return -1;
}

static void append_line(const char *team, json_t *j) {
  if (!log_file) return;
  json_t *line = json_pack("{s:s,s:O}", "team", team, "event", j);
  if (line && json_dumpf(line, log_file, JSON_COMPACT) == 0 && fputc('\n', log_file) != EOF && fflush(log_file) == 0) {
  } else {
    wbd_stat_add("events_write_failed", 1);
  }
  json_decref(line);
}

/* ------------------------------------------------------------------ */
/* Recording                                                           */
/* ------------------------------------------------------------------ */

static void rfc3339_s(int64_t us, char *buf, size_t len) {
  time_t s = (time_t)(us / US);
  struct tm tm;
  gmtime_r(&s, &tm);
  strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static json_t *event_data(const struct wbd_sandbox *sb, int type, int64_t at) {
  json_t *d = json_object();
  if (sb->metadata && json_object_size(sb->metadata) > 0)
    json_object_set_new(d, "sandbox_metadata", json_deep_copy(sb->metadata));
  if ((type == WBD_EV_PAUSED || type == WBD_EV_KILLED) && sb->state == WBD_RUNNING) {
    char started[40];
    rfc3339_s(sb->started_at_us, started, sizeof started);
    int64_t ms = (at - sb->started_at_us) / 1000;
    json_object_set_new(d, "execution",
                        json_pack("{s:s,s:i,s:i,s:I}", "started_at", started, "vcpu_count", sb->cpu_count, "memory_mb",
                                  sb->memory_mb, "execution_time", (json_int_t)(ms < 0 ? 0 : ms)));
  }
  if (type == WBD_EV_UPDATED) {
    char end[40];
    rfc3339_s(sb->end_at_us, end, sizeof end);
    json_object_set_new(d, "set_timeout", json_string(end));
  }
  return d;
}

static json_t *event_json(const struct wbd_sandbox *sb, int type, int64_t at) {
  char id[37], exec[37], build[37], team[37], ts[48], seed[64];
  wbd_uuid4(id, sizeof id);
  snprintf(seed, sizeof seed, "%s/%lld", sb->id, (long long)sb->started_at_us);
  wbd_uuid_of("execution", seed, exec);
  wbd_uuid_of("build", sb->template_id ? sb->template_id : "", build);
  wbd_uuid_of("team", sb->team, team);
  wbd_format_time(at, ts, sizeof ts);
  json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:s,s:s,s:s,s:s}", "version", "v2", "id", id, "type",
                        type_names[type], "timestamp", ts, "eventData", event_data(sb, type, at), "sandboxId", sb->id,
                        "sandboxExecutionId", exec, "sandboxTemplateId", sb->template_id ? sb->template_id : "",
                        "sandboxBuildId", build, "sandboxTeamId", team);
  if (!j) abort();
  if (labels[type]) {
    json_object_set_new(j, "eventCategory", json_string("lifecycle"));
    json_object_set_new(j, "eventLabel", json_string(labels[type]));
  }
  return j;
}

void wbd_event_locked(const struct wbd_sandbox *sb, enum wbd_event_type type, int64_t at_us) {
  int64_t now = wbd_now_us();
  if (at_us <= 0 || at_us > now) at_us = now;
  json_t *j = event_json(sb, (int)type, at_us);
  pthread_mutex_lock(&mu);
  prune_locked(now);
  append_line(sb->team, j);
  insert_locked(at_us, sb->team, sb->id, (int)type, json_incref(j));
  pthread_mutex_unlock(&mu);
  wbd_webhooks_publish(sb->team, type_names[type], j);
  json_decref(j);
  wbd_stat_add("events_recorded", 1);
}

/* ------------------------------------------------------------------ */
/* The data directory                                                  */
/* ------------------------------------------------------------------ */

static void load_line(const char *line) {
  json_t *o = json_loads(line, 0, NULL);
  json_t *e = json_object_get(o, "event");
  const char *team = json_string_value(json_object_get(o, "team"));
  const char *type = json_string_value(json_object_get(e, "type"));
  const char *ts = json_string_value(json_object_get(e, "timestamp"));
  const char *sid = json_string_value(json_object_get(e, "sandboxId"));
  int64_t us = 0;
  int t = type ? type_index(type) : -1;
  if (team && sid && t >= 0 && ts && wbd_parse_time(ts, &us) == 0) insert_locked(us, team, sid, t, json_incref(e));
  json_decref(o);
}

/* Reads events.jsonl, keeps what the retention keeps, writes it back
 * compacted and opens it for appending. Under mu. */
static int load_locked(void) {
  char dir[PATH_MAX], path[PATH_MAX + 32], tmp[PATH_MAX + 32];
  if (!wbd_state_dir("events", dir, sizeof dir)) return -1;
  snprintf(path, sizeof path, "%s/events.jsonl", dir);
  snprintf(tmp, sizeof tmp, "%s/events.jsonl.tmp", dir);
  FILE *f = fopen(path, "r");
  if (f) {
    char *line = NULL;
    size_t n = 0;
    while (getline(&line, &n, f) > 0) load_line(line);
    free(line);
    fclose(f);
  }
  prune_locked(wbd_now_us());
  FILE *out = fopen(tmp, "w");
  if (!out) return -1;
  for (size_t i = 0; i < nev; i++) {
    json_t *line = json_pack("{s:s,s:O}", "team", evs[i].team, "event", evs[i].j);
    json_dumpf(line, out, JSON_COMPACT);
    fputc('\n', out);
    json_decref(line);
  }
  if (fclose(out) != 0 || rename(tmp, path) != 0) return -1;
  log_file = fopen(path, "a");
  return log_file ? 0 : -1;
}

int wbd_events_start(void) {
  pthread_mutex_lock(&mu);
  int rc = wbd_opt.keep_state ? load_locked() : 0;
  pthread_mutex_unlock(&mu);
  if (rc != 0) fprintf(stderr, "warmboxd: cannot keep lifecycle events in the data directory\n");
  return wbd_webhooks_start();
}

void wbd_events_stop(void) {
  wbd_webhooks_stop();
  pthread_mutex_lock(&mu);
  if (log_file) fclose(log_file);
  log_file = NULL;
  for (size_t i = 0; i < nev; i++) json_decref(evs[i].j);
  free(evs);
  evs = NULL;
  nev = cap_ev = 0;
  pthread_mutex_unlock(&mu);
}

/* ------------------------------------------------------------------ */
/* GET /events/sandboxes[/{id}]                                        */
/* ------------------------------------------------------------------ */

struct query {
  unsigned types; /* bit per type; 0: all */
  int bad;
  char bad_type[64];
};

static enum MHD_Result each_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  (void)kind;
  struct query *q = cls;
  if (!key || strcmp(key, "types") != 0 || !value) return MHD_YES;
  int t = type_index(value);
  if (t < 0) {
    q->bad = 1;
    snprintf(q->bad_type, sizeof q->bad_type, "%s", value);
    return MHD_NO;
  }
  q->types |= 1u << t;
  return MHD_YES;
}

static int parse_long(const char *s, long lo, long hi, long def, long *out) {
  if (!s) {
    *out = def;
    return 0;
  }
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static json_t *page(const char *team, const char *sid, unsigned types, int asc, long offset, long limit) {
  json_t *arr = json_array();
  pthread_mutex_lock(&mu);
  prune_locked(wbd_now_us());
  long skipped = 0;
  for (size_t k = 0; k < nev && (long)json_array_size(arr) < limit; k++) {
    struct ev *e = &evs[asc ? k : nev - 1 - k];
    if (strcmp(e->team, team) != 0 || (sid && strcmp(e->sid, sid) != 0)) continue;
    if (types && !(types & (1u << e->type))) continue;
    if (skipped++ < offset) continue;
    json_array_append(arr, e->j);
  }
  pthread_mutex_unlock(&mu);
  return arr;
}

static enum MHD_Result h_list(struct wbd_req *req, const char *team, const char *sid) {
  long offset, limit;
  if (parse_long(wbd_req_query(req, "offset"), 0, LONG_MAX / 2, 0, &offset) != 0)
    return wbd_reply_error(req, 400, "validation error: parameter \"offset\" must be a whole number of at least 0");
  if (parse_long(wbd_req_query(req, "limit"), 1, 100, 10, &limit) != 0)
    return wbd_reply_error(req, 400, "validation error: parameter \"limit\" must be between 1 and 100");
  const char *oa = wbd_req_query(req, "orderAsc");
  if (oa && strcmp(oa, "true") != 0 && strcmp(oa, "false") != 0)
    return wbd_reply_error(req, 400, "validation error: parameter \"orderAsc\" must be true or false");
  struct query q = {0, 0, ""};
  MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, each_arg, &q);
  if (q.bad) return wbd_reply_error(req, 400, "validation error: invalid event type \"%s\"", q.bad_type);
  return wbd_reply_json(req, 200, page(team, sid, q.types, oa && strcmp(oa, "true") == 0, offset, limit), NULL);
}

/* ------------------------------------------------------------------ */
/* Handlers (rows of routes.c's table)                                 */
/* ------------------------------------------------------------------ */

/* GET /events/sandboxes (arg 0) and GET /events/sandboxes/{id} (arg 1). */
enum MHD_Result wbd_h_events(struct wbd_req *req, const struct wbd_call *c) {
  return h_list(req, c->team, c->arg ? req->path + strlen("/events/sandboxes/") : NULL);
}

/* POST, GET /events/webhooks and GET, PATCH, DELETE /events/webhooks/{id}. */
enum MHD_Result wbd_h_webhooks(struct wbd_req *req, const struct wbd_call *c) {
  return wbd_webhooks_handle(req, c->team);
}
