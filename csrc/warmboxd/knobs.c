/*
 * knobs.c: the admin API's config and seed knobs (POST /_warmboxd/config,
 * POST /_warmboxd/seed); the server checks the admin token first.
 */
#include "wbd_int.h"
#include "control.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Knobs: config and seed                                              */
/* ------------------------------------------------------------------ */

enum MHD_Result wbd_knob_config(struct wbd_req *req) {
  enum MHD_Result r = MHD_NO;
  json_t *o = wbd_ctl_body_object(req, 1, &r);
  if (!o) return r;
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int is_bool = strcmp(k, "loose_metadata") == 0;
    int is_int = strcmp(k, "rtt_ms") == 0 || strcmp(k, "create_ms") == 0 || strcmp(k, "resume_ms") == 0 ||
                 strcmp(k, "max_running") == 0;
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
    if (strcmp(k, "loose_metadata") == 0) wbd_knob_set(&wbd_loose_metadata, iv);
    else if (strcmp(k, "rtt_ms") == 0) wbd_knob_set(&wbd_opt.rtt_ms, iv);
    else if (strcmp(k, "create_ms") == 0) wbd_knob_set(&wbd_opt.create_ms, iv);
    else if (strcmp(k, "resume_ms") == 0) wbd_knob_set(&wbd_opt.resume_ms, iv);
    else if (strcmp(k, "max_running") == 0) wbd_knob_set(&wbd_opt.max_running, iv);
  }
  json_decref(o);
  return wbd_reply_json(req, 204, NULL, NULL);
}

/* GET /_warmboxd/clock: {"now", "offset_ms", "frozen"}. POST {"advance_ms":
 * N, "freeze": bool} (either or both): moves the server's clock N ms forward
 * (leases, auto-pause, endAt, listings' times) and freezes or thaws it, then
 * expires what that made due before answering, so the caller sees the
 * result of the move when the call returns. */
enum MHD_Result wbd_knob_clock(struct wbd_req *req) {
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
  return wbd_reply_json(req, 200, json_pack("{s:s,s:I,s:b}", "now", now, "offset_ms", (json_int_t)(offset / 1000),
                                            "frozen", frozen), NULL);
}

enum MHD_Result wbd_knob_seed(struct wbd_req *req) {
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
    return wbd_reply_error(req, 400, "seed: count must be 1..1000000, state running or paused, timeout > 0, "
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
    sb->metadata = json_incref(shared);  /* immutable after create: one copy for all */
    sb->secure = 1;
    sb->timeout_s = (int)to;
    sb->auto_pause = auto_pause;
    sb->auto_resume = auto_resume;
    /* distinct start times, oldest first, all before the pause time */
    sb->started_at_us = now - sago - (n - i);
    if (running) {
      sb->state = WBD_RUNNING;
      sb->end_at_us = now + to * US;  /* not capped: a record may outlive the maximum length */
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

