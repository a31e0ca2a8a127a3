/*
 * control.c: E2B's control plane (sandboxes: create, info, kill, timeout,
 * pause, connect, resume, refreshes) and the lease timer. Listing, its
 * filters and page tokens are in list.c; the admin API (/_warmboxd/...)
 * in knobs.c. Runtime hooks are always called without the store
 * lock; a record's `busy` flag keeps its transitions one at a time.
 */
#include "util.h"
#include "control.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t max_len_us(void) {
  return (int64_t)wbd_opt.max_length_hours * 3600 * US;
}

static int64_t cap_end(const struct wbd_sandbox *sb, int64_t end) {
  int64_t cap = sb->started_at_us + max_len_us();
  return end < cap ? end : cap;
}

static enum MHD_Result reply_429(struct wbd_req *req) {
  return wbd_reply_error(req, 429,
                         "you have reached the maximum number of concurrent E2B sandboxes (%d). "
                         "If you need more, please visit 'https://e2b.dev/docs/billing'",
                         wbd_knob(&wbd_opt.max_running));
}

/* The team's memory budget (--max-team-memory-mb): the memoryMB of its
 * sandboxes held in host RAM, running or paused with their runtime (a
 * pause with memory keeps the processes; one without gives the runtime up,
 * its files kept on disk), and of those being created or resumed. Under
 * the store lock: whether `add_mb` more would go over. */
static int over_memory_locked(const struct wbd_team *t, long add_mb) {
  int cap = wbd_knob(&wbd_opt.max_team_memory_mb);
  return cap > 0 && add_mb > 0 && t->held_mb + t->reserved_mb + add_mb > cap;
}

enum MHD_Result wbd_ctl_reply_limit(struct wbd_req *req, int rc) {
  if (rc != WBD_OVER_MEMORY) return reply_429(req);
  return wbd_reply_error(req, 429,
                         "you have reached the maximum memory of your running and paused sandboxes (%d MB): "
                         "kill some, or pause them with memory: false, which keeps only their files "
                         "(warmboxd --max-team-memory-mb)",
                         wbd_knob(&wbd_opt.max_team_memory_mb));
}

/* ------------------------------------------------------------------ */
/* Routes                                                              */
/* ------------------------------------------------------------------ */

/* One path segment (no '/'), returns its length or 0. */
static size_t segment(const char *p) {
  return strcspn(p, "/");
}

/* The {id} of a path, as E2B reads it ("<id>" or the old "<id>-<clientID>").
 * Returns 0, or -1 for a malformed id (400 "Invalid sandbox ID"). */
int wbd_ctl_path_id(const char *path, char *id, size_t len) {
  const char *p = strncmp(path, "/v2/", 4) == 0 ? path + 14 : path + 11;
  size_t n = segment(p);
  const char *dash = memchr(p, '-', n);
  size_t idn = dash ? (size_t)(dash - p) : n;
  if (dash && memchr(dash + 1, '-', n - idn - 1)) return -1;
  if (idn == 0 || idn >= len) return -1;
  for (size_t i = 0; i < idn; i++)
    if (!islower((unsigned char)p[i]) && !isdigit((unsigned char)p[i])) return -1;
  memcpy(id, p, idn);
  id[idn] = 0;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Auth                                                                */
/* ------------------------------------------------------------------ */

#define AUTH_MSG "Invalid API key, please visit https://e2b.dev/docs/quickstart/api-key for more information."

/* 0 and the team in `team`, or -1 and the reason after AUTH_MSG. */
static int key_team(const char *key, char *team, size_t len, const char **why) {
  if (!key || !*key) {
    *why = " authorization header is missing";
    return -1;
  }
  if (wbd_opt.api_key) {
    if (!wbd_str_eq_ct(key, wbd_opt.api_key)) {
      *why = " invalid API key";
      return -1;
    }
    snprintf(team, len, "%s", "team");
    return 0;
  }
  size_t n = strlen(key);
  int ok = n > 4 && n < len && strncmp(key, "e2b_", 4) == 0;
  for (size_t i = 4; ok && i < n; i++)
    if (!isdigit((unsigned char)key[i]) && !(key[i] >= 'a' && key[i] <= 'f')) ok = 0;
  if (!ok) {
    *why = strncmp(key, "e2b_", 4) == 0 ? " invalid API key" : " authorization header is malformed";
    return -1;
  }
  snprintf(team, len, "%s", key);
  return 0;
}

int wbd_control_key_ok(const char *key) {
  char team[64];
  const char *why;
  return key_team(key, team, sizeof team, &why) == 0;
}

/* Fills `team` from X-API-Key; replies 401 and returns -1 when it is bad. */
int wbd_ctl_authenticate(struct wbd_req *req, char *team, size_t len, enum MHD_Result *r) {
  const char *why = "";
  if (key_team(wbd_req_header(req, "X-API-Key"), team, len, &why) != 0) {
    *r = wbd_reply_error(req, 401, AUTH_MSG "%s", why);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* JSON bodies (the object itself: body.c)                             */
/* ------------------------------------------------------------------ */

/* Field `name` of `o`: NULL when absent or null. Sets *bad and replies 400
 * when it has the wrong type. */
json_t *wbd_ctl_field(struct wbd_req *req, json_t *o, const char *name, enum jtype t, int *bad, enum MHD_Result *r) {
  json_t *v = json_object_get(o, name);
  if (!v || json_is_null(v) || *bad) return NULL;
  const char *want = NULL;
  switch (t) {
    case J_BOOL:
      if (!json_is_boolean(v)) want = "value must be a boolean";
      break;
    case J_INT:
      if (!json_is_integer(v))
        want = "value must be an integer";
      else if (json_integer_value(v) < -2147483648LL || json_integer_value(v) > 2147483647LL)
        want = "number must be an int32";
      break;
    case J_STRING:
      if (!json_is_string(v)) want = "value must be a string";
      break;
    case J_OBJECT:
      if (!json_is_object(v)) want = "value must be an object";
      break;
    case J_STRMAP:
      if (!json_is_object(v))
        want = "value must be an object";
      else {
        const char *k;
        json_t *x;
        size_t bytes = 0, max = strcmp(name, "envVars") == 0 ? WBD_ENV_MAX_BYTES : WBD_META_MAX_BYTES;
        json_object_foreach(v, k, x) {
          if (!json_is_string(x))
            want = "value must be a string";
          else if (strlen(k) > WBD_MAP_MAX_KEY)
            want = "a key is longer than 256 bytes";
          else if (max == WBD_ENV_MAX_BYTES && wbd_env_refused(k))
            want = "a loader variable (LD_*, GCONV_PATH, GLIBC_TUNABLES, ...) is not allowed";
          else
            bytes += strlen(k) + json_string_length(x);
        }
        if (!want && json_object_size(v) > WBD_MAP_MAX_KEYS)
          want = "more than 1000 entries";
        else if (!want && bytes > max)
          want = max == WBD_ENV_MAX_BYTES ? "keys and values add up to more than 256 KiB"
                                          : "keys and values add up to more than 64 KiB";
      }
      break;
  }
  if (want) {
    *bad = 1;
    *r = wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/%s\": %s", name, want);
    return NULL;
  }
  return v;
}

/* ------------------------------------------------------------------ */
/* Views                                                               */
/* ------------------------------------------------------------------ */

/* `Sandbox`, as create/connect/resume answer. Under the store lock. */
json_t *wbd_ctl_sandbox_json(const struct wbd_sandbox *sb) {
  json_t *o = json_object();
  json_object_set_new(o, "alias", json_string(sb->template_id));
  json_object_set_new(o, "clientID", json_string(WBD_CLIENT_ID));
  if (sb->secure) json_object_set_new(o, "envdAccessToken", json_string(sb->access_token));
  json_object_set_new(o, "envdVersion", json_string(WBD_ENVD_VERSION));
  json_object_set_new(o, "sandboxID", json_string(sb->id));
  json_object_set_new(o, "templateID", json_string(sb->template_id));
  if (sb->traffic_token[0]) json_object_set_new(o, "trafficAccessToken", json_string(sb->traffic_token));
  return o;
}

/* ------------------------------------------------------------------ */
/* Operations on a referenced record (store lock not held)             */
/* ------------------------------------------------------------------ */

/* Under the lock: the team's record with that id, not killed; no reference. */
static struct wbd_sandbox *find_locked(const char *team, const char *id) {
  struct wbd_sandbox *sb = wbd_store_lookup_locked(id);
  if (!sb || sb->state == WBD_KILLED || strcmp(sb->team, team) != 0) return NULL;
  return sb;
}

struct wbd_sandbox *wbd_ctl_find_ref(const char *team, const char *id) {
  return wbd_store_team_ref(team, id);
}

/* Cost accounting (the stats' "running_ms"): the milliseconds of a run that
 * ends now (a pause or a kill; the lease timer's at the lease end, however
 * late the timer or a clock move found it due). Store lock held. */
static void count_running_locked(struct wbd_sandbox *sb, int expire_only) {
  if (sb->state != WBD_RUNNING) return;
  int64_t end = wbd_now_us();
  if (expire_only && sb->end_at_us < end) end = sb->end_at_us;
  if (end > sb->started_at_us) wbd_stat_add("running_ms", (long)((end - sb->started_at_us) / 1000));
}

/* expire_only: the lease timer's call; skip when the lease moved meanwhile. */
static int op_kill(struct wbd_sandbox *sb, int expire_only) {
  wbd_store_lock();
  wbd_store_wait_idle_locked(sb);
  if (sb->state == WBD_KILLED || (expire_only && (sb->state != WBD_RUNNING || sb->end_at_us > wbd_now_us()))) {
    wbd_store_unlock();
    return 404;
  }
  if (sb->runs_in_flight > 0) wbd_stat_add("kill_during_run", 1);
  count_running_locked(sb, expire_only);
  wbd_event_locked(sb, WBD_EV_KILLED, expire_only ? sb->end_at_us : 0);
  wbd_store_remove_locked(sb);
  sb->state = WBD_KILLED;
  wbd_store_unlock();
  wbd_rt_on_kill(sb);
  wbd_persist_drop(sb);
  wbd_store_lock();
  wbd_store_unref_locked(sb); /* the store's own reference */
  wbd_store_unlock();
  return 204;
}

/* A pause that comes right after a command's start lets the command get
 * going before its processes are frozen: `bash -l -c "sleep 2 && ..."` frozen
 * while still reading its profile would start its sleep only at the thaw.
 * E2B's pause takes long enough for a command started just before it to be
 * under way; warmboxd's takes milliseconds. So: within PAUSE_SETTLE_MAX_MS of
 * the last Process.Start, the pause waits (at least PAUSE_SETTLE_MIN_MS after
 * the start) until none of the sandbox's processes runs or waits for a CPU. */
#define PAUSE_SETTLE_MIN_MS 500
#define PAUSE_SETTLE_MAX_MS 2000

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void settle_started(struct wbd_sandbox *sb) {
  wbd_store_lock();
  int64_t started = sb->last_start_mono_us / 1000;
  wbd_store_unlock();
  if (started == 0) return;
  for (;;) {
    int64_t age = mono_ms() - started;
    if (age < 0 || age >= PAUSE_SETTLE_MAX_MS) return;
    if (age >= PAUSE_SETTLE_MIN_MS && !wbd_rt_settling(sb)) return;
    wbd_sleep_ms(age < PAUSE_SETTLE_MIN_MS ? (int)(PAUSE_SETTLE_MIN_MS - age) : 20);
  }
}

int wbd_ctl_pause(struct wbd_sandbox *sb, int memory, int expire_only, char *msg, size_t len) {
  wbd_store_lock();
  /* E2B answers 204 to a pause that joins one already in flight */
  int joined = WBD_REC(sb)->busy == WBD_BUSY_PAUSING;
  wbd_store_wait_idle_locked(sb);
  if (sb->state == WBD_KILLED) {
    wbd_store_unlock();
    return 404;
  }
  if (sb->state == WBD_PAUSED) {
    wbd_store_unlock();
    return joined ? 204 : 409;
  }
  if (expire_only && sb->end_at_us > wbd_now_us()) {
    wbd_store_unlock();
    return 204;
  }
  if (sb->runs_in_flight > 0) wbd_stat_add("pause_during_run", 1);
  wbd_store_set_busy_locked(sb, WBD_BUSY_PAUSING);
  /* envd's changes already under way end first; new ones are refused */
  wbd_store_wait_changes_locked(sb);
  wbd_store_unlock();
  if (memory) settle_started(sb); /* (a pause without memory ends the processes anyway) */
  if (wbd_opt.keep_state) wbd_sleep_ms(wbd_knob(&wbd_state_lim.copy_ms));
  int rc = wbd_rt_on_pause(sb, memory), kept = 0;
  char why[800] = "";
  if (rc == 0 && (kept = wbd_persist_save(sb, why, sizeof why)) != 0) {
    wbd_stat_add("persist_failed", 1);
    /* An explicit pause whose copy cannot be kept fails and the sandbox
     * runs on; the lease timer's stays paused (in memory only: a restart
     * would lose it). */
    if (!expire_only)
      wbd_rt_on_resume(sb);
    else
      fprintf(stderr, "warmboxd: %s paused at its timeout but not kept on disk: %s\n", sb->id, why);
  }
  int failed = rc != 0 || (kept && !expire_only);
  /* Without memory nothing needs the runtime until the resume: the files
   * go to disk and what held RAM (the tmpfs, the groups) goes. */
  int released = rc == 0 && !kept && !memory && wbd_persist_release(sb) == 0;
  if (rc == 0 && !kept && !memory && !released) wbd_stat_add("pause_kept_in_ram", 1);
  wbd_store_lock();
  if (!failed) {
    count_running_locked(sb, expire_only); /* a failed pause's run goes on */
    wbd_event_locked(sb, WBD_EV_PAUSED, expire_only ? sb->end_at_us : 0);
    sb->paused_with_memory = memory;
    if (released) sb->files_on_disk = 1;
    sb->paused_ram = !released; /* counted when it turns paused, just below */
    wbd_store_set_end_locked(sb, wbd_now_us());
    wbd_store_update_locked(sb, sb->started_at_us, WBD_PAUSED);
  }
  wbd_store_set_busy_locked(sb, 0);
  wbd_store_unlock();
  if (msg) snprintf(msg, len, "%s", why);
  if (rc != 0) return 500;
  return failed ? kept : 204;
}

enum resume_mode { R_CONNECT, R_RESUME, R_AUTO };

/* Connect/resume. memory: -1 keep what the pause kept, 0 reboot from the
 * filesystem. *out (when given) receives the Sandbox JSON. */
static int op_resume(struct wbd_sandbox *sb, int timeout_s, int memory, enum resume_mode mode, int auto_pause,
                     json_t **out) {
  wbd_store_lock();
  wbd_store_wait_idle_locked(sb);
  if (sb->state == WBD_KILLED) {
    wbd_store_unlock();
    return mode == R_AUTO ? 409 : 404;
  }
  if (sb->state == WBD_RUNNING) {
    if (mode == R_RESUME) {
      wbd_store_unlock();
      return 409;
    }
    if (mode == R_CONNECT) {
      int64_t end = cap_end(sb, wbd_now_us() + (int64_t)timeout_s * US);
      if (end > sb->end_at_us) {
        wbd_store_set_end_locked(sb, end);
        wbd_event_locked(sb, WBD_EV_UPDATED, 0);
      }
    }
    if (out) *out = wbd_ctl_sandbox_json(sb);
    wbd_store_unlock();
    return mode == R_AUTO ? 0 : 200;
  }
  struct wbd_team *t = wbd_store_team_locked(sb->team, 1);
  int maxr = wbd_knob(&wbd_opt.max_running);
  if (maxr > 0 && t->running + t->reserved >= maxr) {
    wbd_store_unlock();
    return 429;
  }
  /* a sandbox paused in RAM holds its memory already */
  long add_mb = sb->paused_ram ? 0 : wbd_store_rec_mb(sb);
  if (over_memory_locked(t, add_mb)) {
    wbd_store_unlock();
    return WBD_OVER_MEMORY;
  }
  t->reserved++;
  t->reserved_mb += add_mb;
  wbd_store_set_busy_locked(sb, 1);
  int reboot = memory == 0 && sb->paused_with_memory;
  wbd_store_unlock();

  int rc = 0;
  if (reboot) rc = wbd_rt_on_pause(sb, 0); /* end the kept processes: a cold boot */
  if (rc == 0) rc = wbd_persist_restore(sb);
  if (rc == 0) rc = wbd_rt_on_resume(sb);
  /* --resume-ms: the answer comes that much after the thaw, as E2B's comes
   * once the restored VM has been running a while (its processes run on). */
  wbd_sleep_ms(wbd_knob(&wbd_opt.resume_ms));

  wbd_store_lock();
  t->reserved--;
  t->reserved_mb -= add_mb;
  if (rc == 0) {
    if (reboot) sb->paused_with_memory = 0;
    wbd_store_set_paused_ram_locked(sb, 0);
    if (mode == R_RESUME && auto_pause >= 0) sb->auto_pause = auto_pause;
    int64_t now = wbd_now_us();
    wbd_store_update_locked(sb, now, WBD_RUNNING);
    wbd_store_set_end_locked(sb, cap_end(sb, now + (int64_t)timeout_s * US));
    wbd_event_locked(sb, WBD_EV_RESUMED, 0);
    if (out) *out = wbd_ctl_sandbox_json(sb);
  }
  wbd_store_set_busy_locked(sb, 0);
  wbd_store_unlock();
  if (rc != 0) return 500;
  wbd_persist_drop(sb);
  return mode == R_AUTO ? 0 : 201;
}

int wbd_sandbox_auto_resume(struct wbd_sandbox *sb) {
  wbd_store_lock();
  int ok = sb->auto_resume && sb->paused_with_memory;
  int timeout = sb->timeout_s > 0 ? sb->timeout_s : 300;
  wbd_store_unlock();
  if (!ok) return 409;
  if (timeout < 300) timeout = 300;
  int64_t maxs = (int64_t)wbd_opt.max_length_hours * 3600;
  if (timeout > maxs) timeout = (int)maxs;
  int rc = op_resume(sb, timeout, -1, R_AUTO, -1, NULL);
  return rc == 0 ? 0 : rc == 500 ? 409 : rc;
}

/* ------------------------------------------------------------------ */
/* Data-plane requests: find the sandbox, auto-resume, hand over       */
/* ------------------------------------------------------------------ */

static enum MHD_Result sandbox_gone(struct wbd_req *req, const char *id) {
  json_t *o = json_object();
  json_object_set_new(o, "sandboxId", wbd_json_str(id));
  json_object_set_new(o, "message", json_string("The sandbox was not found"));
  json_object_set_new(o, "code", json_integer(502));
  return wbd_reply_json(req, 502, o, NULL);
}

/* The proxy's 409 for a sandbox in transition, in E2B's words. */
static enum MHD_Result in_transition(struct wbd_req *req, const char *id, int busy) {
  char msg[128];
  snprintf(msg, sizeof msg, "Sandbox \"%s\" is being %s", id,
           busy == WBD_BUSY_SNAPSHOT  ? "snapshotted"
           : busy == WBD_BUSY_PAUSING ? "paused"
                                      : "resumed");
  json_t *o = json_object();
  json_object_set_new(o, "sandboxId", wbd_json_str(id));
  json_object_set_new(o, "message", json_string(msg));
  json_object_set_new(o, "code", json_integer(409));
  return wbd_reply_json(req, 409, o, NULL);
}

enum MHD_Result wbd_control_dataplane(struct wbd_req *req, const char *id, int port) {
  struct wbd_sandbox *sb = wbd_sandbox_get(id);
  if (!sb) return sandbox_gone(req, id);
  wbd_store_lock();
  enum wbd_state st = sb->state;
  int can_resume = sb->auto_resume && sb->paused_with_memory;
  wbd_store_unlock();
  if (st == WBD_PAUSED && !can_resume) {
    wbd_sandbox_unref(sb);
    return sandbox_gone(req, id);
  }
  enum MHD_Result denied;
  if (wbd_dataplane_refused(req, sb, port, &denied)) { /* before an auto-resume, as E2B's */
    wbd_sandbox_unref(sb);
    return denied;
  }
  if (st == WBD_PAUSED) {
    int rc = wbd_sandbox_auto_resume(sb);
    if (rc == 429 || rc == WBD_OVER_MEMORY) {
      wbd_sandbox_unref(sb);
      return wbd_ctl_reply_limit(req, rc);
    }
    if (rc != 0) {
      wbd_sandbox_unref(sb);
      return sandbox_gone(req, id);
    }
  }
  /* While its files are copied (a pause, a snapshot, a fork), what could
   * change them is refused, as E2B's proxy answers a sandbox in transition. */
  int changes = wbd_dataplane_changes(req, port), busy = 0;
  if (changes) {
    wbd_store_lock();
    busy = wbd_store_change_begin_locked(sb);
    wbd_store_unlock();
  }
  if (busy < 0) {
    wbd_sandbox_unref(sb);
    return sandbox_gone(req, id);
  }
  if (busy) {
    wbd_stat_add("dataplane_in_transition", 1);
    wbd_sandbox_unref(sb);
    return in_transition(req, id, busy);
  }
  enum MHD_Result r = wbd_dataplane_handle(req, sb, port);
  if (changes) {
    wbd_store_lock();
    wbd_store_change_end_locked(sb);
    wbd_store_unlock();
  }
  wbd_sandbox_unref(sb);
  return r;
}

/* ------------------------------------------------------------------ */
/* Handlers                                                            */
/* ------------------------------------------------------------------ */

int wbd_ctl_launch(struct wbd_sandbox *sb, long long to, int (*fill)(struct wbd_sandbox *sb, void *cls), void *cls,
                   json_t **out) {
  wbd_store_lock();
  struct wbd_team *t = wbd_store_team_locked(sb->team, 1);
  int maxr = wbd_knob(&wbd_opt.max_running);
  int over = maxr > 0 && t->running + t->reserved >= maxr ? 429 : 0;
  long add_mb = wbd_store_rec_mb(sb);
  if (!over && over_memory_locked(t, add_mb)) over = WBD_OVER_MEMORY;
  if (over) {
    wbd_store_unlock();
    wbd_store_discard(sb);
    return over;
  }
  t->reserved++;
  t->reserved_mb += add_mb;
  wbd_store_unlock();

  wbd_sleep_ms(wbd_knob(&wbd_opt.create_ms));
  sb->started_at_us = wbd_now_us();
  sb->end_at_us = sb->started_at_us + to * US;
  int rc = wbd_rt_on_create(sb);
  if (rc == 0 && fill) rc = fill(sb, cls);
  if (rc != 0) {
    wbd_rt_on_kill(sb);
    wbd_store_lock();
    t->reserved--;
    t->reserved_mb -= add_mb;
    wbd_store_unlock();
    wbd_store_discard(sb);
    return 500;
  }
  wbd_store_lock();
  t->reserved--;
  t->reserved_mb -= add_mb;
  int64_t now = wbd_now_us();
  sb->started_at_us = now;
  sb->end_at_us = cap_end(sb, now + to * US);
  sb->state = WBD_RUNNING;
  wbd_store_insert_locked(sb);
  wbd_event_locked(sb, WBD_EV_CREATED, 0);
  *out = wbd_ctl_sandbox_json(sb);
  wbd_store_unlock();
  return 0;
}

/* E2B's `network.allowPublicTraffic` (default true): 1 when false. The
 * other keys of `network` (egress rules) are not warmboxd's to enforce. */
static int private_ingress(struct wbd_req *req, json_t *o, int *bad, enum MHD_Result *r) {
  json_t *net = wbd_ctl_field(req, o, "network", J_OBJECT, bad, r);
  json_t *pub = net ? wbd_ctl_field(req, net, "allowPublicTraffic", J_BOOL, bad, r) : NULL;
  return pub && json_is_false(pub);
}

static enum MHD_Result h_create(struct wbd_req *req, const char *team, int v2) {
  enum MHD_Result r = MHD_NO;
  json_t *o = wbd_ctl_body_object(req, 1, &r);
  if (!o) return r;
  int bad = 0;
  json_t *tmpl = wbd_ctl_field(req, o, "templateID", J_STRING, &bad, &r);
  json_t *timeout = wbd_ctl_field(req, o, "timeout", J_INT, &bad, &r);
  json_t *ap = wbd_ctl_field(req, o, "autoPause", J_BOOL, &bad, &r);
  json_t *apm = wbd_ctl_field(req, o, "autoPauseMemory", J_BOOL, &bad, &r);
  json_t *ar = wbd_ctl_field(req, o, "autoResume", J_OBJECT, &bad, &r);
  json_t *are = ar ? wbd_ctl_field(req, ar, "enabled", J_BOOL, &bad, &r) : NULL;
  json_t *secure = wbd_ctl_field(req, o, "secure", J_BOOL, &bad, &r);
  json_t *inet = wbd_ctl_field(req, o, "allow_internet_access", J_BOOL, &bad, &r);
  json_t *meta = wbd_ctl_field(req, o, "metadata", J_STRMAP, &bad, &r);
  json_t *env = wbd_ctl_field(req, o, "envVars", J_STRMAP, &bad, &r);
  int private = private_ingress(req, o, &bad, &r); /* a trafficAccessToken for its other ports */
  if (bad) {
    json_decref(o);
    return r;
  }
  if (!tmpl) {
    json_decref(o);
    return wbd_reply_error(req, 400,
                           VERR "doesn't match schema: Error at \"/templateID\": property \"templateID\" is missing");
  }
  const char *tid = json_string_value(tmpl);
  if (!*tid) {
    json_decref(o);
    return wbd_reply_error(req, 400, "Invalid template ID");
  }
  long long to = timeout ? json_integer_value(timeout) : wbd_opt.default_timeout_s;
  int auto_pause = ap && json_is_true(ap);
  int auto_pause_memory = apm ? json_is_true(apm) : 1;
  int auto_resume = are && json_is_true(are);
  const char *err = NULL;
  char msg[128];
  if (to <= 0)
    err = "Timeout must be greater than 0";
  else if (to > (long long)wbd_opt.max_length_hours * 3600) {
    snprintf(msg, sizeof msg, "Timeout cannot be greater than %d hours", wbd_opt.max_length_hours);
    err = msg;
  } else if (!auto_pause_memory && !auto_pause)
    err = "autoPauseMemory=false only applies when autoPause is true.";
  else if (!auto_pause_memory && auto_resume)
    err =
      "A sandbox paused with autoPauseMemory=false cannot be auto-resumed by traffic "
      "and must be resumed explicitly.";
  else if (private && !(v2 || (secure && json_is_true(secure)) || wbd_opt.secure_all))
    err =
      "You cannot create a sandbox without public access unless you enable secure envd access "
      "via 'secure' flag.";
  if (err) {
    json_decref(o);
    return wbd_reply_error(req, 400, "%s", err);
  }

  struct wbd_snapshot *snap = wbd_snapshot_get(team, tid);
  /* A snapshot id (`<name>:<tag>`) this team has not got, deleted or another
   * team's, starts nothing: a checkpoint never silently becomes a new sandbox. */
  if (!snap && strchr(tid, ':')) {
    enum MHD_Result gone = wbd_reply_error(req, 404, "template '%s' not found", tid); /* tid is o's */
    json_decref(o);
    return gone;
  }
  struct wbd_sandbox *sb = wbd_store_alloc(team);
  wbd_sandbox_set_template(sb, snap ? wbd_snapshot_template(snap) : tid);
  if (snap) {
    wbd_snapshot_size(snap, sb);
    wbd_snapshot_env(snap, sb->env_vars);
  }
  if (meta) json_object_update(sb->metadata, meta);
  if (env) json_object_update(sb->env_vars, env);
  /* POST /v2/sandboxes always secures envd (e2b 2.51's API types: "All system
   * communication with the sandbox is always secured"; the SDK no longer sends
   * `secure`). The older path keeps the opt-in `secure` flag, unless
   * --secure-all (warmbox's own servers): then no sandbox's data plane answers
   * on its id alone, which every local user might learn. */
  sb->secure = v2 || (secure && json_is_true(secure)) || wbd_opt.secure_all;
  if (!sb->secure) sb->access_token[0] = 0;
  if (private) wbd_sandbox_traffic_token(sb);
  sb->allow_internet = inet ? json_is_true(inet) : 1;
  sb->auto_pause = auto_pause;
  sb->auto_pause_memory = auto_pause_memory;
  sb->auto_resume = auto_resume;
  sb->timeout_s = (int)to;
  json_decref(o);

  json_t *res = NULL;
  int rc = wbd_ctl_launch(sb, to, snap ? wbd_snapshot_fill : NULL, snap, &res);
  wbd_snapshot_put(snap);
  if (rc == 429 || rc == WBD_OVER_MEMORY) return wbd_ctl_reply_limit(req, rc);
  if (rc != 0) return wbd_reply_error(req, 500, "Failed to create sandbox");
  return wbd_reply_json(req, 201, res, NULL);
}

static enum MHD_Result h_info(struct wbd_req *req, const char *team, const char *id) {
  wbd_store_lock();
  struct wbd_sandbox *sb = find_locked(team, id);
  json_t *o = sb ? wbd_ctl_listed_json(sb, 1) : NULL;
  wbd_store_unlock();
  if (!o) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  return wbd_reply_json(req, 200, o, NULL);
}

static enum MHD_Result h_kill(struct wbd_req *req, const char *team, const char *id) {
  struct wbd_sandbox *sb = wbd_ctl_find_ref(team, id);
  int rc = sb ? op_kill(sb, 0) : 404;
  wbd_sandbox_unref(sb);
  if (rc == 404) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  return wbd_reply_json(req, 204, NULL, NULL);
}

static enum MHD_Result h_timeout(struct wbd_req *req, const char *team, const char *id, int refresh) {
  enum MHD_Result r = MHD_NO;
  json_t *o = wbd_ctl_body_object(req, !refresh, &r);
  if (!o) return r;
  int bad = 0;
  json_t *v = wbd_ctl_field(req, o, refresh ? "duration" : "timeout", J_INT, &bad, &r);
  if (bad) {
    json_decref(o);
    return r;
  }
  long long secs = v ? json_integer_value(v) : refresh ? 15 : -1;
  int missing = !v;
  json_decref(o);
  if (refresh) {
    if (secs < 0)
      return wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/duration\": number must be at least 0");
    if (secs > 3600)
      return wbd_reply_error(req, 400,
                             VERR "doesn't match schema: Error at \"/duration\": number must be at most 3600");
    if (secs < 15) secs = 15;
  } else {
    if (missing)
      return wbd_reply_error(req, 400,
                             VERR "doesn't match schema: Error at \"/timeout\": property \"timeout\" is missing");
    if (secs < 0)
      return wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/timeout\": number must be at least 0");
  }
  wbd_store_lock();
  struct wbd_sandbox *sb = find_locked(team, id);
  int status = 204;
  if (!sb || sb->state != WBD_RUNNING) {
    status = 404;
  } else if (WBD_REC(sb)->busy) {
    status = 409;
  } else {
    int64_t now = wbd_now_us();
    if (now - sb->started_at_us > max_len_us()) {
      status = 400;
    } else {
      int64_t end = cap_end(sb, now + secs * US);
      if (!refresh || end > sb->end_at_us) {
        wbd_store_set_end_locked(sb, end);
        wbd_event_locked(sb, WBD_EV_UPDATED, 0);
      }
    }
  }
  wbd_store_unlock();
  if (status == 404) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  if (status == 409) return wbd_reply_error(req, 409, "Sandbox \"%s\" is being paused", id);
  if (status == 400) return wbd_reply_error(req, 400, "Max instance length exceeded");
  return wbd_reply_json(req, 204, NULL, NULL);
}

static enum MHD_Result h_pause(struct wbd_req *req, const char *team, const char *id) {
  enum MHD_Result r = MHD_NO;
  json_t *o = wbd_ctl_body_object(req, 0, &r);
  if (!o) return r;
  int bad = 0;
  json_t *mem = wbd_ctl_field(req, o, "memory", J_BOOL, &bad, &r);
  int memory = mem ? json_is_true(mem) : 1;
  json_decref(o);
  if (bad) return r;
  struct wbd_sandbox *sb = wbd_ctl_find_ref(team, id);
  char why[800] = "";
  int rc = sb ? wbd_ctl_pause(sb, memory, 0, why, sizeof why) : 404;
  wbd_sandbox_unref(sb);
  if (rc == 404) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  if (rc == 409) return wbd_reply_error(req, 409, "Error pausing sandbox - sandbox '%s' is already paused", id);
  if (rc == 429 || rc == 507) return wbd_reply_error(req, (unsigned)rc, "Error pausing sandbox: %s", why);
  if (rc == 500) return wbd_reply_error(req, 500, "Error pausing sandbox%s%s", why[0] ? ": " : "", why);
  return wbd_reply_json(req, 204, NULL, NULL);
}

static enum MHD_Result h_connect(struct wbd_req *req, const char *team, const char *id, enum resume_mode mode, int v2) {
  enum MHD_Result r = MHD_NO;
  json_t *o = wbd_ctl_body_object(req, mode == R_CONNECT && !v2, &r);
  if (!o) return r;
  int bad = 0;
  json_t *to = wbd_ctl_field(req, o, "timeout", J_INT, &bad, &r);
  json_t *mem = v2 ? wbd_ctl_field(req, o, "memory", J_BOOL, &bad, &r) : NULL;
  json_t *ap = mode == R_RESUME ? wbd_ctl_field(req, o, "autoPause", J_BOOL, &bad, &r) : NULL;
  if (bad) {
    json_decref(o);
    return r;
  }
  if (!to && mode == R_CONNECT && !v2) {
    json_decref(o);
    return wbd_reply_error(req, 400,
                           VERR "doesn't match schema: Error at \"/timeout\": property \"timeout\" is missing");
  }
  long long secs = to ? json_integer_value(to) : wbd_opt.default_timeout_s;
  int memory = mem ? json_is_true(mem) : -1;
  if (memory == 1) memory = -1;
  int auto_pause = ap ? json_is_true(ap) : -1;
  json_decref(o);
  if (secs < 0)
    return wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/timeout\": number must be at least 0");
  if (secs > (long long)wbd_opt.max_length_hours * 3600)
    return wbd_reply_error(req, 400, "Timeout cannot be greater than %d hours", wbd_opt.max_length_hours);
  struct wbd_sandbox *sb = wbd_ctl_find_ref(team, id);
  json_t *out = NULL;
  int rc = sb ? op_resume(sb, (int)secs, memory, mode, auto_pause, &out) : 404;
  wbd_sandbox_unref(sb);
  switch (rc) {
    case 200:
    case 201:
      return wbd_reply_json(req, (unsigned)rc, out, NULL);
    case 404:
      return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
    case 409:
      return wbd_reply_error(req, 409, "Sandbox %s is already running", id);
    case 429:
    case WBD_OVER_MEMORY:
      return wbd_ctl_reply_limit(req, rc);
    default:
      return wbd_reply_error(req, 500, "Failed to resume sandbox");
  }
}

/* The handlers as the route table (routes.c) calls them. */
enum MHD_Result wbd_h_health(struct wbd_req *req, const struct wbd_call *c) {
  static const char ok[] = "Health check successful";
  (void)c;
  return wbd_reply_raw(req, 200, "text/plain; charset=utf-8", ok, sizeof ok - 1, NULL);
}
enum MHD_Result wbd_h_create(struct wbd_req *req, const struct wbd_call *c) {
  return h_create(req, c->team, c->arg);
}
enum MHD_Result wbd_h_list_v2(struct wbd_req *req, const struct wbd_call *c) {
  return wbd_list_v2(req, c->team);
}
enum MHD_Result wbd_h_list_v1(struct wbd_req *req, const struct wbd_call *c) {
  return wbd_list_v1(req, c->team);
}
enum MHD_Result wbd_h_metrics_many(struct wbd_req *req, const struct wbd_call *c) {
  return wbd_metrics_many(req, c->team);
}
enum MHD_Result wbd_h_info(struct wbd_req *req, const struct wbd_call *c) {
  return h_info(req, c->team, c->id);
}
enum MHD_Result wbd_h_metrics_one(struct wbd_req *req, const struct wbd_call *c) {
  return wbd_metrics_one(req, c->team, c->id);
}
enum MHD_Result wbd_h_kill(struct wbd_req *req, const struct wbd_call *c) {
  return h_kill(req, c->team, c->id);
}
enum MHD_Result wbd_h_timeout(struct wbd_req *req, const struct wbd_call *c) {
  return h_timeout(req, c->team, c->id, c->arg);
}
enum MHD_Result wbd_h_pause(struct wbd_req *req, const struct wbd_call *c) {
  return h_pause(req, c->team, c->id);
}
enum MHD_Result wbd_h_connect(struct wbd_req *req, const struct wbd_call *c) {
  return h_connect(req, c->team, c->id, c->arg == WBD_RESUME ? R_RESUME : R_CONNECT, c->arg == WBD_CONNECT_V2);
}

/* ------------------------------------------------------------------ */
/* The lease timer                                                     */
/* ------------------------------------------------------------------ */

static pthread_t lc_thread;
static pthread_mutex_t lc_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lc_cv = PTHREAD_COND_INITIALIZER;
static int lc_stop, lc_started;

/* Lease-end pauses (each a copy of the sandbox's files with --data-dir) run
 * on up to --pause-workers threads. A worker takes the queued pause of the
 * team with the fewest in flight (the oldest among equals), and one team has
 * at most half the workers (at least one): one team's many expiring
 * sandboxes never hold back another team's pause. */
struct pjob {
  struct wbd_sandbox *sb; /* referenced */
  int memory;
  struct pjob *next;
};
static pthread_mutex_t pq_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pq_cv = PTHREAD_COND_INITIALIZER;
static struct pjob *pq_queue, *pq_running; /* queued (oldest first), in flight */
static pthread_t *pq_threads;
static int pq_nthreads, pq_stop;

/* Under pq_mu. */
static int pq_has(const struct pjob *l, const struct wbd_sandbox *sb) {
  for (; l; l = l->next)
    if (l->sb == sb) return 1;
  return 0;
}

static int pq_team_running(const char *team) {
  int n = 0;
  for (const struct pjob *j = pq_running; j; j = j->next) n += strcmp(j->sb->team, team) == 0;
  return n;
}

/* The next job to run (unlinked), or NULL. */
static struct pjob *pq_take(void) {
  int cap = pq_nthreads / 2 > 1 ? pq_nthreads / 2 : 1, best = -1;
  struct pjob **bp = NULL;
  for (struct pjob **pp = &pq_queue; *pp; pp = &(*pp)->next) {
    int n = pq_team_running((*pp)->sb->team);
    if (n < cap && (best < 0 || n < best)) {
      best = n;
      bp = pp;
    }
  }
  if (!bp) return NULL;
  struct pjob *j = *bp;
  *bp = j->next;
  return j;
}

static void *pause_worker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&pq_mu);
  for (;;) {
    struct pjob *j = pq_stop ? NULL : pq_take();
    if (!j) {
      if (pq_stop) break;
      pthread_cond_wait(&pq_cv, &pq_mu);
      continue;
    }
    j->next = pq_running;
    pq_running = j;
    pthread_mutex_unlock(&pq_mu);
    wbd_ctl_pause(j->sb, j->memory, 1, NULL, 0);
    pthread_mutex_lock(&pq_mu);
    for (struct pjob **pp = &pq_running; *pp; pp = &(*pp)->next)
      if (*pp == j) {
        *pp = j->next;
        break;
      }
    wbd_sandbox_unref(j->sb);
    free(j);
    pthread_cond_broadcast(&pq_cv); /* a team's slot is free; and for expire_once's wait */
  }
  pthread_mutex_unlock(&pq_mu);
  return NULL;
}

/* Queues sb's lease-end pause (takes the reference), or runs it here when
 * no worker runs. */
static void pause_queue(struct wbd_sandbox *sb, int memory) {
  pthread_mutex_lock(&pq_mu);
  if (pq_nthreads == 0 || pq_stop) {
    pthread_mutex_unlock(&pq_mu);
    wbd_ctl_pause(sb, memory, 1, NULL, 0);
    wbd_sandbox_unref(sb);
    return;
  }
  if (pq_has(pq_queue, sb) || pq_has(pq_running, sb)) {
    pthread_mutex_unlock(&pq_mu);
    wbd_sandbox_unref(sb);
    return;
  }
  struct pjob *j = calloc(1, sizeof *j), **pp = &pq_queue;
  if (!j) abort();
  j->sb = sb;
  j->memory = memory;
  while (*pp) pp = &(*pp)->next;
  *pp = j;
  pthread_cond_broadcast(&pq_cv);
  pthread_mutex_unlock(&pq_mu);
}

/* Kills what expired, queues the pauses; `wait`: returns once no pause is
 * queued or in flight. */
static void expire_once(int wait) {
  size_t n = 0;
  int64_t now = wbd_now_us();
  wbd_store_lock();
  struct wbd_sandbox **v = wbd_store_expired_locked(now, &n);
  int *pause = n ? malloc(n * sizeof *pause) : NULL; /* -1 kill, else pause with that memory flag */
  if (n && !pause) abort();
  for (size_t i = 0; i < n; i++) pause[i] = v[i]->auto_pause ? v[i]->auto_pause_memory : -1;
  wbd_store_unlock();
  for (size_t i = 0; i < n; i++) {
    if (pause[i] >= 0) {
      pause_queue(v[i], pause[i]);
      continue;
    }
    op_kill(v[i], 1);
    wbd_sandbox_unref(v[i]);
  }
  free(v);
  free(pause);
  if (!wait) return;
  pthread_mutex_lock(&pq_mu);
  while ((pq_queue || pq_running) && !pq_stop) pthread_cond_wait(&pq_cv, &pq_mu);
  pthread_mutex_unlock(&pq_mu);
}

void wbd_lifecycle_expire_now(void) {
  expire_once(1);
}

static void *lifecycle_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lc_mu);
  while (!lc_stop) {
    pthread_mutex_unlock(&lc_mu);
    expire_once(0);
    pthread_mutex_lock(&lc_mu);
    if (lc_stop) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&lc_cv, &lc_mu, &ts);
  }
  pthread_mutex_unlock(&lc_mu);
  return NULL;
}

int wbd_lifecycle_start(void) {
  int n = wbd_state_lim.pause_workers > 0 ? wbd_state_lim.pause_workers : 1;
  pq_threads = calloc((size_t)n, sizeof *pq_threads);
  if (!pq_threads) return -1;
  pthread_mutex_lock(&pq_mu);
  pq_stop = 0;
  for (int i = 0; i < n && pthread_create(&pq_threads[i], NULL, pause_worker, NULL) == 0; i++) pq_nthreads++;
  pthread_mutex_unlock(&pq_mu);
  if (pthread_create(&lc_thread, NULL, lifecycle_main, NULL) != 0) return -1;
  lc_started = 1;
  return 0;
}

void wbd_lifecycle_stop(void) {
  if (lc_started) {
    pthread_mutex_lock(&lc_mu);
    lc_stop = 1;
    pthread_cond_signal(&lc_cv);
    pthread_mutex_unlock(&lc_mu);
    pthread_join(lc_thread, NULL);
    lc_started = 0;
  }
  /* pauses in flight end; queued ones are dropped (the graceful stop
   * pauses what should come back) */
  pthread_mutex_lock(&pq_mu);
  pq_stop = 1;
  pthread_cond_broadcast(&pq_cv);
  int n = pq_nthreads;
  pthread_mutex_unlock(&pq_mu);
  for (int i = 0; i < n; i++) pthread_join(pq_threads[i], NULL);
  pthread_mutex_lock(&pq_mu);
  pq_nthreads = 0;
  while (pq_queue) {
    struct pjob *j = pq_queue;
    pq_queue = j->next;
    wbd_sandbox_unref(j->sb);
    free(j);
  }
  pthread_mutex_unlock(&pq_mu);
  free(pq_threads);
  pq_threads = NULL;
}
