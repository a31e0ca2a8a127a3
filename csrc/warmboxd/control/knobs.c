/*
 * knobs.c: the admin API, every /_warmboxd/... route (tests and operators
 * set and read the server with it; an E2B client never calls it): request
 * stats, injected faults, run-time config, seeded records and the server's
 * clock. server.c's gate checks the admin token first and keeps the counts
 * and faults it applies to every request; these handlers read and set them.
 */
#include "control.h"
#include "state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Stats                                                               */
/* ------------------------------------------------------------------ */

/* Bytes of heap the process holds in live allocations: what a memory bound
 * is about. RSS is not that under ASan, whose quarantine keeps up to 256 MB
 * of freed blocks mapped (RSS then grows with what was allocated and freed),
 * so a sanitized build asks the sanitizer's allocator instead of malloc. */
#if defined(__SANITIZE_ADDRESS__)
#define WBD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WBD_ASAN 1
#endif
#endif
#ifdef WBD_ASAN
size_t __sanitizer_get_current_allocated_bytes(void); /* sanitizer/allocator_interface.h, not always installed */
static long long heap_in_use(void) {
  return (long long)__sanitizer_get_current_allocated_bytes();
}
#else
#include <malloc.h>
static long long heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return (long long)(mi.uordblks + mi.hblkhd);
}
#endif

/* GET /_warmboxd/stats: the server's counts (wbd_stats_json; the counters
 * a test reads shown as 0 before they first count), the store's records by
 * state and the heap in use. */
enum MHD_Result wbd_admin_stats(struct wbd_req *req, const struct wbd_call *call) {
  (void)call;
  long running, paused;
  wbd_store_lock();
  wbd_store_counts_locked(&running, &paused);
  wbd_store_unlock();
  json_t *o = wbd_stats_json();
  json_t *c = json_object_get(o, "counters");
  static const char *const known[] = {"exec_overlap", "kill_during_run", "pause_during_run", "running_ms"};
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (!json_object_get(c, known[i])) json_object_set_new(c, known[i], json_integer(0));
  json_t *s = json_object();
  json_object_set_new(s, "running", json_integer(running));
  json_object_set_new(s, "paused", json_integer(paused));
  json_object_set_new(o, "sandboxes", s);
  json_object_set_new(o, "heap_bytes", json_integer(heap_in_use()));
  return wbd_reply_json(req, 200, o, NULL);
}

enum MHD_Result wbd_admin_stats_reset(struct wbd_req *req, const struct wbd_call *call) {
  (void)call;
  wbd_stats_reset();
  return wbd_reply_json(req, 204, NULL, NULL);
}

/* ------------------------------------------------------------------ */
/* Faults                                                              */
/* ------------------------------------------------------------------ */

/* What is wrong with a fault's JSON, or NULL. */
static const char *fault_refusal(json_t *o) {
  json_t *route = json_object_get(o, "route"), *count = json_object_get(o, "count"),
         *status = json_object_get(o, "status"), *body = json_object_get(o, "body"),
         *headers = json_object_get(o, "headers"), *delay = json_object_get(o, "delay_ms"),
         *drop = json_object_get(o, "drop");
  if (!json_is_string(route)) return "route (string) is required";
  if (count && !json_is_integer(count)) return "count must be an integer";
  if (status && !json_is_integer(status)) return "status must be an integer";
  if (status && (json_integer_value(status) < 100 || json_integer_value(status) > 599))
    return "status must be 100..599";
  if (body && !json_is_string(body)) return "body must be a string";
  if (headers && !json_is_object(headers)) return "headers must be an object";
  if (delay && !json_is_integer(delay)) return "delay_ms must be an integer";
  if (delay && (json_integer_value(delay) < 0 || json_integer_value(delay) > 600000))
    return "delay_ms must be 0..600000";
  if (drop && !json_is_boolean(drop)) return "drop must be a boolean";
  const char *k;
  json_t *v;
  if (headers) json_object_foreach(headers, k, v) {
      if (!json_is_string(v)) return "header values must be strings";
    }
  return NULL;
}

/* The fault a checked JSON object describes (count 1, no status, no delay
 * unless it says otherwise). */
static struct wbd_fault *fault_new(json_t *o) {
  json_t *count = json_object_get(o, "count"), *status = json_object_get(o, "status"),
         *body = json_object_get(o, "body"), *headers = json_object_get(o, "headers"),
         *delay = json_object_get(o, "delay_ms"), *drop = json_object_get(o, "drop");
  struct wbd_fault *f = calloc(1, sizeof *f);
  if (!f) abort();
  f->route = strdup(json_string_value(json_object_get(o, "route")));
  f->count = count ? (long)json_integer_value(count) : 1;
  f->status = status ? (unsigned)json_integer_value(status) : 0;
  f->body = body ? strdup(json_string_value(body)) : NULL;
  f->headers = headers ? json_incref(headers) : NULL;
  f->delay_ms = delay ? (int)json_integer_value(delay) : 0;
  f->drop = drop ? json_is_true(drop) : 0;
  return f;
}

/* POST /_warmboxd/faults {"route", "count", "status", "body", "headers",
 * "delay_ms", "drop"}: queues a fault (struct wbd_fault); count 0 queues
 * none. */
enum MHD_Result wbd_admin_fault_add(struct wbd_req *req, const struct wbd_call *call) {
  (void)call;
  json_error_t err;
  json_t *o = json_loadb(req->body, req->body_len, 0, &err);
  if (!json_is_object(o)) {
    json_decref(o);
    return wbd_reply_error(req, 400, "fault: a JSON object is required");
  }
  const char *bad = fault_refusal(o);
  if (bad) {
    json_decref(o);
    return wbd_reply_error(req, 400, "fault: %s", bad);
  }
  wbd_fault_add(fault_new(o));
  json_decref(o);
  return wbd_reply_json(req, 204, NULL, NULL);
}

enum MHD_Result wbd_admin_faults_clear(struct wbd_req *req, const struct wbd_call *call) {
  (void)call;
  wbd_faults_clear();
  return wbd_reply_json(req, 204, NULL, NULL);
}

/* ------------------------------------------------------------------ */
/* Config, clock and seed                                              */
/* ------------------------------------------------------------------ */

/* POST /_warmboxd/config {"loose_metadata": bool, "rtt_ms", "create_ms",
 * "resume_ms", "max_running", "max_team_memory_mb", "max_streams", "copy_ms": 0..600000,
 * the lifecycle events' "webhook_duplicates": bool, "webhook_retry_ms",
 * "webhook_retries", "events_ttl_days"}: all checked before any is set.
 * copy_ms: a pause's, snapshot's or fork's copy starts that much later, the
 * sandbox in transition meanwhile (specs). */
enum MHD_Result wbd_admin_config(struct wbd_req *req, const struct wbd_call *call) {
  (void)call;
  enum MHD_Result r = MHD_NO;
  json_t *o = wbd_ctl_body_object(req, 1, &r);
  if (!o) return r;
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int is_bool = strcmp(k, "loose_metadata") == 0 || strcmp(k, "webhook_duplicates") == 0;
    int is_int = strcmp(k, "rtt_ms") == 0 || strcmp(k, "create_ms") == 0 || strcmp(k, "resume_ms") == 0 ||
                 strcmp(k, "max_running") == 0 || strcmp(k, "webhook_retry_ms") == 0 ||
                 strcmp(k, "webhook_retries") == 0 || strcmp(k, "events_ttl_days") == 0 ||
                 strcmp(k, "max_team_memory_mb") == 0 || strcmp(k, "max_streams") == 0 || strcmp(k, "copy_ms") == 0;
    if (!is_bool && !is_int) {
      r = wbd_reply_error(req, 400, "config: unknown key '%s'", k);
      json_decref(o);
      return r;
    }
    if ((is_bool && !json_is_boolean(v)) ||
        (is_int && (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 600000))) {
      r = wbd_reply_error(req, 400, "config: bad value for '%s'", k);
      json_decref(o);
      return r;
    }
  }
  json_object_foreach(o, k, v) {
    int iv = json_is_integer(v) ? (int)json_integer_value(v) : json_is_true(v);
    if (strcmp(k, "loose_metadata") == 0)
      wbd_knob_set(&wbd_loose_metadata, iv);
    else if (strcmp(k, "rtt_ms") == 0)
      wbd_knob_set(&wbd_opt.rtt_ms, iv);
    else if (strcmp(k, "create_ms") == 0)
      wbd_knob_set(&wbd_opt.create_ms, iv);
    else if (strcmp(k, "resume_ms") == 0)
      wbd_knob_set(&wbd_opt.resume_ms, iv);
    else if (strcmp(k, "max_running") == 0)
      wbd_knob_set(&wbd_opt.max_running, iv);
    else if (strcmp(k, "max_team_memory_mb") == 0)
      wbd_knob_set(&wbd_opt.max_team_memory_mb, iv);
    else if (strcmp(k, "max_streams") == 0)
      wbd_knob_set(&wbd_opt.max_streams, iv);
    else if (strcmp(k, "webhook_duplicates") == 0)
      wbd_knob_set(&wbd_webhook_duplicates, iv);
    else if (strcmp(k, "webhook_retry_ms") == 0)
      wbd_knob_set(&wbd_webhook_retry_ms, iv);
    else if (strcmp(k, "webhook_retries") == 0)
      wbd_knob_set(&wbd_webhook_retries, iv);
    else if (strcmp(k, "events_ttl_days") == 0)
      wbd_knob_set(&wbd_events_ttl_days, iv);
    else if (strcmp(k, "copy_ms") == 0)
      wbd_knob_set(&wbd_state_lim.copy_ms, iv);
  }
  json_decref(o);
  return wbd_reply_json(req, 204, NULL, NULL);
}

/* GET /_warmboxd/clock: {"now", "offset_ms", "frozen"}. POST {"advance_ms":
 * N, "freeze": bool} (either or both): moves the server's clock N ms forward
 * (leases, auto-pause, endAt, listings' times) and freezes or thaws it, then
 * expires what that made due before answering, so the caller sees the
 * result of the move when the call returns. */
enum MHD_Result wbd_admin_clock(struct wbd_req *req, const struct wbd_call *call) {
  (void)call;
  enum MHD_Result r = MHD_NO;
  if (strcmp(req->method, "POST") == 0) {
    json_t *o = wbd_ctl_body_object(req, 1, &r);
    if (!o) return r;
    json_t *adv = json_object_get(o, "advance_ms"), *fr = json_object_get(o, "freeze");
    size_t known = (adv != NULL) + (fr != NULL);
    if (known == 0 || json_object_size(o) != known || (fr && !json_is_boolean(fr)) ||
        (adv && (!json_is_integer(adv) || json_integer_value(adv) < 0 ||
                 json_integer_value(adv) > (json_int_t)10 * 365 * 86400 * 1000))) {
      json_decref(o);
      return wbd_reply_error(req, 400,
                             "clock: expected {\"advance_ms\": a whole number of ms >= 0, \"freeze\": true|false}");
    }
    wbd_clock_advance(adv ? (int64_t)json_integer_value(adv) * 1000 : 0, fr ? json_is_true(fr) : -1);
    json_decref(o);
    wbd_lifecycle_expire_now();
  } else if (strcmp(req->method, "GET") != 0) {
    return wbd_reply_error(req, 405, "clock: GET or POST");
  }
  char now[48];
  int64_t offset;
  int frozen;
  wbd_clock_state(&offset, &frozen);
  wbd_format_time(wbd_now_us(), now, sizeof now);
  return wbd_reply_json(
    req, 200, json_pack("{s:s,s:I,s:b}", "now", now, "offset_ms", (json_int_t)(offset / 1000), "frozen", frozen), NULL);
}

/* POST /_warmboxd/seed {"count", "state", "metadata", "templateID",
 * "timeout", "started_ago_s", "paused_ago_s", "autoPause", "autoResume"}:
 * `count` records of the caller's team put straight into the store
 * (records only: no jail is made for them). */
enum MHD_Result wbd_admin_seed(struct wbd_req *req, const struct wbd_call *call) {
  (void)call;
  char team[64];
  enum MHD_Result r = MHD_NO;
  if (wbd_ctl_authenticate(req, team, sizeof team, &r) != 0) return r;
  json_t *o = wbd_ctl_body_object(req, 1, &r);
  if (!o) return r;
  int bad = 0;
  json_t *count = wbd_ctl_field(req, o, "count", J_INT, &bad, &r);
  json_t *state = wbd_ctl_field(req, o, "state", J_STRING, &bad, &r);
  json_t *meta = wbd_ctl_field(req, o, "metadata", J_STRMAP, &bad, &r);
  json_t *tmpl = wbd_ctl_field(req, o, "templateID", J_STRING, &bad, &r);
  json_t *timeout = wbd_ctl_field(req, o, "timeout", J_INT, &bad, &r);
  json_t *started_ago = wbd_ctl_field(req, o, "started_ago_s", J_INT, &bad, &r);
  json_t *paused_ago = wbd_ctl_field(req, o, "paused_ago_s", J_INT, &bad, &r);
  json_t *ap = wbd_ctl_field(req, o, "autoPause", J_BOOL, &bad, &r);
  json_t *ar = wbd_ctl_field(req, o, "autoResume", J_BOOL, &bad, &r);
  if (bad) {
    json_decref(o);
    return r;
  }
  int64_t sago = started_ago ? json_integer_value(started_ago) * US : 0;
  int64_t pago = paused_ago ? json_integer_value(paused_ago) * US : 0;
  int auto_pause = ap && json_is_true(ap), auto_resume = ar && json_is_true(ar);
  long long n = count ? json_integer_value(count) : 0;
  const char *st = state ? json_string_value(state) : "paused";
  int running = strcmp(st, "running") == 0;
  long long to = timeout ? json_integer_value(timeout) : wbd_opt.default_timeout_s;
  if (n < 1 || n > 1000000 || (!running && strcmp(st, "paused") != 0) || to <= 0 || sago < 0 || pago < 0 ||
      pago > sago) {
    json_decref(o);
    return wbd_reply_error(req, 400,
                           "seed: count must be 1..1000000, state running or paused, timeout > 0, "
                           "0 <= paused_ago_s <= started_ago_s");
  }
  const char *tid = tmpl ? json_string_value(tmpl) : "base";
  json_t *shared = json_object();
  if (meta) json_object_update(shared, meta);
  struct wbd_sandbox **v = malloc((size_t)n * sizeof *v);
  if (!v) abort();
  int64_t now = wbd_now_us();
  for (long long i = 0; i < n; i++) {
    struct wbd_sandbox *sb = wbd_store_alloc(team);
    wbd_sandbox_set_template(sb, tid);
    json_decref(sb->metadata);
    sb->metadata = json_incref(shared); /* immutable after create: one copy for all */
    sb->secure = 1;
    sb->timeout_s = (int)to;
    sb->auto_pause = auto_pause;
    sb->auto_resume = auto_resume;
    /* distinct start times, oldest first, all before the pause time */
    sb->started_at_us = now - sago - (n - i);
    if (running) {
      sb->state = WBD_RUNNING;
      sb->end_at_us = now + to * US; /* not capped: a record may outlive the maximum length */
    } else {
      sb->state = WBD_PAUSED;
      sb->end_at_us = now - pago;
    }
    v[i] = sb;
  }
  json_decref(shared);
  json_decref(o);
  wbd_store_lock();
  wbd_store_insert_many_locked(v, (size_t)n);
  wbd_store_unlock();
  free(v);
  json_t *res = json_object();
  json_object_set_new(res, "created", json_integer(n));
  return wbd_reply_json(req, 200, res, NULL);
}

/* GET /_warmboxd/runtime?id=ID: {"name", "dir"}, where the sandbox's files
 * live on the host (wbd_rt_name: the host shows no id), for tests. */
enum MHD_Result wbd_admin_runtime(struct wbd_req *req, const struct wbd_call *call) {
  (void)call;
  const char *id = wbd_req_query(req, "id");
  if (!id || !*id || strlen(id) > 64) return wbd_reply_error(req, 400, "runtime: ?id=SANDBOX_ID expected");
  char name[32], dir[4200];
  wbd_rt_name(id, name, sizeof name);
  snprintf(dir, sizeof dir, "%s/%s", wbd_opt.data_dir, name);
  return wbd_reply_json(req, 200, json_pack("{s:s, s:s}", "name", name, "dir", dir), NULL);
}
