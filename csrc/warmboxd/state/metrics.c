/*
 * metrics.c: E2B's sandbox metrics, GET /sandboxes/{id}/metrics?start&end
 * (`SandboxMetric[]`) and GET /sandboxes/metrics?sandbox_ids=a,b
 * (`{"sandboxes": {id: SandboxMetric}}`), from the jail's cgroups and disk
 * (runtime.c's wbd_rt_usage); and envd's own GET /metrics, of the same samples.
 *
 * E2B samples every 5 s; warmboxd samples a running sandbox when asked (at
 * most one sample a second: a second ask in the same second replaces it) and
 * keeps its last METRICS_KEEP samples, so a series shows the times it was
 * read. cpuUsedPct is the CPU time used since the previous sample (the run's
 * start for the first) over the wall time and cpuCount cores.
 */
#include "state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_KEEP    64
#define METRICS_IDS_MAX 100 /* E2B's maxItems of sandbox_ids */

struct metric {
  int64_t ts_us;
  double cpu_pct;
  int cpu_count;
  long long mem_used, mem_total, mem_cache, disk_used, disk_total;
};

struct wbd_metrics {
  size_t n, head;    /* samples s[(head + i) % KEEP], i < n, oldest first */
  double last_cpu_s; /* the jail's CPU seconds at the last sample */
  struct metric s[METRICS_KEEP];
};

static struct metric *newest(struct wbd_metrics *m) {
  return m->n ? &m->s[(m->head + m->n - 1) % METRICS_KEEP] : NULL;
}

/* Appends `x` (or replaces the newest sample, of the same second). */
static void keep(struct wbd_metrics *m, const struct metric *x) {
  struct metric *last = newest(m);
  if (last && last->ts_us / 1000000 == x->ts_us / 1000000) {
    *last = *x;
    return;
  }
  if (m->n == METRICS_KEEP)
    m->head = (m->head + 1) % METRICS_KEEP;
  else
    m->n++;
  m->s[(m->head + m->n - 1) % METRICS_KEEP] = *x;
}

/* Takes a sample of a running, referenced sandbox (store lock not held). */
static void sample(struct wbd_sandbox *sb) {
  struct wbd_usage u;
  int live = wbd_rt_usage(sb, &u) == 0;
  int64_t now = wbd_now_us();
  wbd_store_lock();
  if (sb->state == WBD_RUNNING && (sb->metrics || (sb->metrics = calloc(1, sizeof *sb->metrics)))) {
    struct wbd_metrics *m = sb->metrics;
    struct metric *last = newest(m);
    int64_t since = last && last->ts_us >= sb->started_at_us ? last->ts_us : sb->started_at_us;
    double wall = (double)(now - since) / 1e6, used = live ? u.cpu_s - m->last_cpu_s : 0;
    struct metric x = {.ts_us = now,
                       .cpu_count = sb->cpu_count,
                       .mem_used = u.mem_used,
                       .mem_total = (long long)sb->memory_mb << 20,
                       .mem_cache = u.mem_cache,
                       .disk_used = u.disk_used,
                       .disk_total = u.disk_total};
    x.cpu_pct = wall > 0 && used > 0 ? 100.0 * used / (wall * (sb->cpu_count > 0 ? sb->cpu_count : 1)) : 0;
    if (x.cpu_pct > 100) x.cpu_pct = 100;
    if (live) m->last_cpu_s = u.cpu_s;
    keep(m, &x);
  }
  wbd_store_unlock();
}

/* `SandboxMetric` */
static json_t *metric_json(const struct metric *x) {
  char ts[48];
  wbd_format_time(x->ts_us, ts, sizeof ts);
  return json_pack("{s:s,s:I,s:i,s:f,s:I,s:I,s:I,s:I,s:I}", "timestamp", ts, "timestampUnix",
                   (json_int_t)(x->ts_us / 1000000), "cpuCount", x->cpu_count, "cpuUsedPct", x->cpu_pct, "memUsed",
                   (json_int_t)x->mem_used, "memTotal", (json_int_t)x->mem_total, "memCache", (json_int_t)x->mem_cache,
                   "diskUsed", (json_int_t)x->disk_used, "diskTotal", (json_int_t)x->disk_total);
}

/* A query integer >= 0 (Unix seconds); absent: `dflt`. -1 when malformed. */
static int query_seconds(struct wbd_req *req, const char *name, long long dflt, long long *out) {
  const char *s = wbd_req_query(req, name);
  *out = dflt;
  if (!s) return 0;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < 0) return -1;
  *out = v;
  return 0;
}

/* envd's own GET /metrics (port 49983): the sandbox as seen from inside, in
 * envd's `Metrics` shape, from a sample taken now (the same samples, kept
 * with the others). A sandbox that cannot be sampled reads 0 but for its size. */
json_t *wbd_metrics_envd(struct wbd_sandbox *sb) {
  sample(sb);
  wbd_store_lock();
  struct metric *last = sb->metrics ? newest(sb->metrics) : NULL;
  struct metric x = last ? *last : (struct metric){.ts_us = wbd_now_us()};
  if (!last) {
    x.cpu_count = sb->cpu_count;
    x.mem_total = (long long)sb->memory_mb << 20;
  }
  wbd_store_unlock();
  return json_pack("{s:I,s:i,s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "ts", (json_int_t)(x.ts_us / 1000000), "cpu_count",
                   x.cpu_count, "cpu_used_pct", x.cpu_pct, "mem_total", (json_int_t)x.mem_total, "mem_used",
                   (json_int_t)x.mem_used, "mem_cache", (json_int_t)x.mem_cache, "mem_total_mib",
                   (json_int_t)(x.mem_total >> 20), "mem_used_mib", (json_int_t)(x.mem_used >> 20), "disk_used",
                   (json_int_t)x.disk_used, "disk_total", (json_int_t)x.disk_total);
}

enum MHD_Result wbd_metrics_one(struct wbd_req *req, const char *team, const char *id) {
  long long start, end;
  if (query_seconds(req, "start", 0, &start) != 0)
    return wbd_reply_error(req, 400, "validation error: parameter \"start\" in query: a Unix time in seconds");
  if (query_seconds(req, "end", INT64_MAX / 1000000, &end) != 0)
    return wbd_reply_error(req, 400, "validation error: parameter \"end\" in query: a Unix time in seconds");
  struct wbd_sandbox *sb = wbd_store_team_ref(team, id);
  if (!sb) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  sample(sb);
  json_t *a = json_array();
  wbd_store_lock();
  struct wbd_metrics *m = sb->metrics;
  for (size_t i = 0; m && i < m->n; i++) {
    const struct metric *x = &m->s[(m->head + i) % METRICS_KEEP];
    long long t = x->ts_us / 1000000;
    if (t >= start && t <= end) json_array_append_new(a, metric_json(x));
  }
  wbd_store_unlock();
  wbd_sandbox_unref(sb);
  return wbd_reply_json(req, 200, a, NULL);
}

/* One id of sandbox_ids: its newest sample, under "sandboxes", when the
 * team has it running (a paused or unknown one is left out). */
static void add_latest(json_t *out, const char *team, const char *id) {
  struct wbd_sandbox *sb = wbd_store_team_ref(team, id);
  if (!sb) return;
  sample(sb);
  wbd_store_lock();
  struct metric *x = sb->state == WBD_RUNNING && sb->metrics ? newest(sb->metrics) : NULL;
  if (x) json_object_set_new(out, id, metric_json(x));
  wbd_store_unlock();
  wbd_sandbox_unref(sb);
}

enum MHD_Result wbd_metrics_many(struct wbd_req *req, const char *team) {
  const char *ids = wbd_req_query(req, "sandbox_ids");
  if (!ids || !*ids)
    return wbd_reply_error(req, 400,
                           "validation error: parameter \"sandbox_ids\" in query has an error: "
                           "value is required but missing");
  size_t count = 1;
  for (const char *p = ids; *p; p++) count += *p == ',';
  if (count > METRICS_IDS_MAX)
    return wbd_reply_error(req, 400,
                           "validation error: parameter \"sandbox_ids\" in query has an error: "
                           "maximum number of items is %d",
                           METRICS_IDS_MAX);
  json_t *out = json_object();
  for (const char *p = ids; *p;) {
    size_t n = strcspn(p, ",");
    char id[64];
    if (n && n < sizeof id) {
      memcpy(id, p, n);
      id[n] = 0;
      add_latest(out, team, id);
    }
    p += n + (p[n] == ',');
  }
  return wbd_reply_json(req, 200, json_pack("{s:o}", "sandboxes", out), NULL);
}
