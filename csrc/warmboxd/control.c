/*
 * control.c: E2B's control plane (sandboxes: create, list, info, kill,
 * timeout, pause, connect, resume, refreshes), the lease timer, and the
 * config and seed knobs. Runtime hooks are always called without the store
 * lock; a record's `busy` flag keeps its transitions one at a time.
 */
#include "wbd_int.h"
#include "envd_util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int wbd_loose_metadata;

#define US 1000000LL
#define NOT_FOUND_FMT "Sandbox \"%s\" doesn't exist or you don't have access to it"

static int64_t max_len_us(void) { return (int64_t)wbd_opt.max_length_hours * 3600 * US; }

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

/* ------------------------------------------------------------------ */
/* Routes                                                              */
/* ------------------------------------------------------------------ */

/* One path segment (no '/'), returns its length or 0. */
static size_t segment(const char *p) { return strcspn(p, "/"); }

const char *wbd_control_route(const char *method, const char *path) {
  int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0, del = strcmp(method, "DELETE") == 0;
  if (strcmp(path, "/health") == 0) return get ? "GET /health" : NULL;
  if (strcmp(path, "/sandboxes") == 0) return post ? "POST /sandboxes" : get ? "GET /sandboxes" : NULL;
  if (strcmp(path, "/v2/sandboxes") == 0) return post ? "POST /v2/sandboxes" : get ? "GET /v2/sandboxes" : NULL;
  int v2 = 0;
  const char *p;
  if (strncmp(path, "/sandboxes/", 11) == 0) p = path + 11;
  else if (strncmp(path, "/v2/sandboxes/", 14) == 0) {
    p = path + 14;
    v2 = 1;
  } else
    return NULL;
  size_t n = segment(p);
  if (n == 0) return NULL;
  const char *rest = p + n;
  if (v2) return strcmp(rest, "/connect") == 0 && post ? "POST /v2/sandboxes/{id}/connect" : NULL;
  if (*rest == 0) return get ? "GET /sandboxes/{id}" : del ? "DELETE /sandboxes/{id}" : NULL;
  if (!post) return NULL;
  if (strcmp(rest, "/timeout") == 0) return "POST /sandboxes/{id}/timeout";
  if (strcmp(rest, "/pause") == 0) return "POST /sandboxes/{id}/pause";
  if (strcmp(rest, "/connect") == 0) return "POST /sandboxes/{id}/connect";
  if (strcmp(rest, "/resume") == 0) return "POST /sandboxes/{id}/resume";
  if (strcmp(rest, "/refreshes") == 0) return "POST /sandboxes/{id}/refreshes";
  return NULL;
}

/* The {id} of a path, as E2B reads it ("<id>" or the old "<id>-<clientID>").
 * Returns 0, or -1 for a malformed id (400 "Invalid sandbox ID"). */
static int path_id(const char *path, char *id, size_t len) {
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
    if (strcmp(key, wbd_opt.api_key) != 0) {
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
static int authenticate(struct wbd_req *req, char *team, size_t len, enum MHD_Result *r) {
  const char *why = "";
  if (key_team(wbd_req_header(req, "X-API-Key"), team, len, &why) != 0) {
    *r = wbd_reply_error(req, 401, AUTH_MSG "%s", why);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* JSON bodies                                                         */
/* ------------------------------------------------------------------ */

#define VERR "validation error: request body has an error: "

/* Parses the body as a JSON object. An empty body gives an empty object
 * unless `required` (then 400, as the validator answers). */
static json_t *body_object(struct wbd_req *req, int required, enum MHD_Result *r) {
  if (req->body_len == 0) {
    if (required) {
      *r = wbd_reply_error(req, 400, VERR "value is required but missing");
      return NULL;
    }
    return json_object();
  }
  json_error_t err;
  json_t *o = json_loadb(req->body, req->body_len, 0, &err);
  if (!o) {
    *r = wbd_reply_error(req, 400, VERR "failed to decode request body: %s", err.text);
    return NULL;
  }
  if (!json_is_object(o)) {
    json_decref(o);
    *r = wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/\": value must be an object");
    return NULL;
  }
  return o;
}

enum jtype { J_BOOL, J_INT, J_STRING, J_OBJECT, J_STRMAP };

/* Field `name` of `o`: NULL when absent or null. Sets *bad and replies 400
 * when it has the wrong type. */
static json_t *field(struct wbd_req *req, json_t *o, const char *name, enum jtype t, int *bad, enum MHD_Result *r) {
  json_t *v = json_object_get(o, name);
  if (!v || json_is_null(v) || *bad) return NULL;
  const char *want = NULL;
  switch (t) {
  case J_BOOL: if (!json_is_boolean(v)) want = "value must be a boolean"; break;
  case J_INT:
    if (!json_is_integer(v)) want = "value must be an integer";
    else if (json_integer_value(v) < -2147483648LL || json_integer_value(v) > 2147483647LL)
      want = "number must be an int32";
    break;
  case J_STRING: if (!json_is_string(v)) want = "value must be a string"; break;
  case J_OBJECT: if (!json_is_object(v)) want = "value must be an object"; break;
  case J_STRMAP:
    if (!json_is_object(v)) want = "value must be an object";
    else {
      const char *k;
      json_t *x;
      size_t bytes = 0, max = strcmp(name, "envVars") == 0 ? WBD_ENV_MAX_BYTES : WBD_META_MAX_BYTES;
      json_object_foreach(v, k, x) {
        if (!json_is_string(x)) want = "value must be a string";
        else if (strlen(k) > WBD_MAP_MAX_KEY) want = "a key is longer than 256 bytes";
        else bytes += strlen(k) + json_string_length(x);
      }
      if (!want && json_object_size(v) > WBD_MAP_MAX_KEYS) want = "more than 1000 entries";
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

static void set_time(json_t *o, const char *name, int64_t us) {
  char buf[48];
  wbd_format_time(us, buf, sizeof buf);
  json_object_set_new(o, name, json_string(buf));
}

/* `Sandbox`, as create/connect/resume answer. Under the store lock. */
static json_t *sandbox_json(const struct wbd_sandbox *sb) {
  json_t *o = json_object();
  json_object_set_new(o, "alias", json_string(sb->template_id));
  json_object_set_new(o, "clientID", json_string(WBD_CLIENT_ID));
  if (sb->secure) json_object_set_new(o, "envdAccessToken", json_string(sb->access_token));
  json_object_set_new(o, "envdVersion", json_string(WBD_ENVD_VERSION));
  json_object_set_new(o, "sandboxID", json_string(sb->id));
  json_object_set_new(o, "templateID", json_string(sb->template_id));
  return o;
}

/* `ListedSandbox`; with `detail`, `SandboxDetail`. Under the store lock. */
static json_t *listed_json(const struct wbd_sandbox *sb, int detail) {
  json_t *o = json_object();
  json_object_set_new(o, "alias", json_string(sb->template_id));
  if (detail) json_object_set_new(o, "allowInternetAccess", json_boolean(sb->allow_internet));
  json_object_set_new(o, "clientID", json_string(WBD_CLIENT_ID));
  json_object_set_new(o, "cpuCount", json_integer(WBD_CPU_COUNT));
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
  json_object_set_new(o, "memoryMB", json_integer(WBD_MEMORY_MB));
  json_object_set_new(o, "metadata", json_deep_copy(sb->metadata));
  json_object_set_new(o, "sandboxID", json_string(sb->id));
  set_time(o, "startedAt", sb->started_at_us);
  json_object_set_new(o, "state", json_string(sb->state == WBD_PAUSED ? "paused" : "running"));
  json_object_set_new(o, "templateID", json_string(sb->template_id));
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

static struct wbd_sandbox *find_ref(const char *team, const char *id) {
  wbd_store_lock();
  struct wbd_sandbox *sb = find_locked(team, id);
  if (sb) wbd_store_ref_locked(sb);
  wbd_store_unlock();
  return sb;
}

/* expire_only: the lease timer's call; skip when the lease moved meanwhile. */
static int op_kill(struct wbd_sandbox *sb, int expire_only) {
  wbd_store_lock();
  wbd_store_wait_idle_locked(sb);
  if (sb->state == WBD_KILLED ||
      (expire_only && (sb->state != WBD_RUNNING || sb->end_at_us > wbd_now_us()))) {
    wbd_store_unlock();
    return 404;
  }
  if (sb->runs_in_flight > 0) wbd_stat_add("kill_during_run", 1);
  wbd_store_remove_locked(sb);
  sb->state = WBD_KILLED;
  wbd_store_unlock();
  wbd_rt_on_kill(sb);
  wbd_store_lock();
  wbd_store_unref_locked(sb);  /* the store's own reference */
  wbd_store_unlock();
  return 204;
}

#define BUSY_PAUSING 2

static int op_pause(struct wbd_sandbox *sb, int memory, int expire_only) {
  wbd_store_lock();
  /* E2B answers 204 to a pause that joins one already in flight */
  int joined = WBD_REC(sb)->busy == BUSY_PAUSING;
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
  wbd_store_set_busy_locked(sb, BUSY_PAUSING);
  wbd_store_unlock();
  int rc = wbd_rt_on_pause(sb, memory);
  wbd_store_lock();
  if (rc == 0) {
    sb->paused_with_memory = memory;
    sb->end_at_us = wbd_now_us();
    wbd_store_update_locked(sb, sb->started_at_us, WBD_PAUSED);
  }
  wbd_store_set_busy_locked(sb, 0);
  wbd_store_unlock();
  return rc == 0 ? 204 : 500;
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
      if (end > sb->end_at_us) sb->end_at_us = end;
    }
    if (out) *out = sandbox_json(sb);
    wbd_store_unlock();
    return mode == R_AUTO ? 0 : 200;
  }
  struct wbd_team *t = wbd_store_team_locked(sb->team, 1);
  int maxr = wbd_knob(&wbd_opt.max_running);
  if (maxr > 0 && t->running + t->reserved >= maxr) {
    wbd_store_unlock();
    return 429;
  }
  t->reserved++;
  wbd_store_set_busy_locked(sb, 1);
  int reboot = memory == 0 && sb->paused_with_memory;
  wbd_store_unlock();

  wbd_sleep_ms(wbd_knob(&wbd_opt.resume_ms));
  int rc = 0;
  if (reboot) rc = wbd_rt_on_pause(sb, 0);  /* end the kept processes: a cold boot */
  if (rc == 0) rc = wbd_rt_on_resume(sb);

  wbd_store_lock();
  t->reserved--;
  if (rc == 0) {
    if (reboot) sb->paused_with_memory = 0;
    if (mode == R_RESUME && auto_pause >= 0) sb->auto_pause = auto_pause;
    int64_t now = wbd_now_us();
    wbd_store_update_locked(sb, now, WBD_RUNNING);
    sb->end_at_us = cap_end(sb, now + (int64_t)timeout_s * US);
    if (out) *out = sandbox_json(sb);
  }
  wbd_store_set_busy_locked(sb, 0);
  wbd_store_unlock();
  if (rc != 0) return 500;
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

enum MHD_Result wbd_control_dataplane(struct wbd_req *req, const char *id, int port) {
  struct wbd_sandbox *sb = wbd_sandbox_get(id);
  if (!sb) return sandbox_gone(req, id);
  wbd_store_lock();
  enum wbd_state st = sb->state;
  int can_resume = sb->auto_resume && sb->paused_with_memory;
  wbd_store_unlock();
  if (st == WBD_PAUSED) {
    if (!can_resume) {
      wbd_sandbox_unref(sb);
      return sandbox_gone(req, id);
    }
    int rc = wbd_sandbox_auto_resume(sb);
    if (rc == 429) {
      wbd_sandbox_unref(sb);
      return reply_429(req);
    }
    if (rc != 0) {
      wbd_sandbox_unref(sb);
      return sandbox_gone(req, id);
    }
  }
  enum MHD_Result r = wbd_dataplane_handle(req, sb, port);
  wbd_sandbox_unref(sb);
  return r;
}

/* ------------------------------------------------------------------ */
/* Handlers                                                            */
/* ------------------------------------------------------------------ */

static enum MHD_Result h_create(struct wbd_req *req, const char *team, int v2) {
  enum MHD_Result r = MHD_NO;
  json_t *o = body_object(req, 1, &r);
  if (!o) return r;
  int bad = 0;
  json_t *tmpl = field(req, o, "templateID", J_STRING, &bad, &r);
  json_t *timeout = field(req, o, "timeout", J_INT, &bad, &r);
  json_t *ap = field(req, o, "autoPause", J_BOOL, &bad, &r);
  json_t *apm = field(req, o, "autoPauseMemory", J_BOOL, &bad, &r);
  json_t *ar = field(req, o, "autoResume", J_OBJECT, &bad, &r);
  json_t *are = ar ? field(req, ar, "enabled", J_BOOL, &bad, &r) : NULL;
  json_t *secure = field(req, o, "secure", J_BOOL, &bad, &r);
  json_t *inet = field(req, o, "allow_internet_access", J_BOOL, &bad, &r);
  json_t *meta = field(req, o, "metadata", J_STRMAP, &bad, &r);
  json_t *env = field(req, o, "envVars", J_STRMAP, &bad, &r);
  if (bad) {
    json_decref(o);
    return r;
  }
  if (!tmpl) {
    json_decref(o);
    return wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/templateID\": property \"templateID\" is missing");
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
  if (to <= 0) err = "Timeout must be greater than 0";
  else if (to > (long long)wbd_opt.max_length_hours * 3600) {
    snprintf(msg, sizeof msg, "Timeout cannot be greater than %d hours", wbd_opt.max_length_hours);
    err = msg;
  } else if (!auto_pause_memory && !auto_pause)
    err = "autoPauseMemory=false only applies when autoPause is true.";
  else if (!auto_pause_memory && auto_resume)
    err = "A sandbox paused with autoPauseMemory=false cannot be auto-resumed by traffic "
          "and must be resumed explicitly.";
  if (err) {
    json_decref(o);
    return wbd_reply_error(req, 400, "%s", err);
  }

  struct wbd_sandbox *sb = wbd_store_alloc(team);
  sb->template_id = strdup(tid);
  if (meta) json_object_update(sb->metadata, meta);
  if (env) json_object_update(sb->env_vars, env);
  /* POST /v2/sandboxes always secures envd (e2b 2.51's API types: "All system
   * communication with the sandbox is always secured"; the SDK no longer sends
   * `secure`). The older path keeps the opt-in `secure` flag. */
  sb->secure = v2 || (secure && json_is_true(secure));
  if (!sb->secure) sb->access_token[0] = 0;
  sb->allow_internet = inet ? json_is_true(inet) : 1;
  sb->auto_pause = auto_pause;
  sb->auto_pause_memory = auto_pause_memory;
  sb->auto_resume = auto_resume;
  sb->timeout_s = (int)to;
  json_decref(o);

  wbd_store_lock();
  struct wbd_team *t = wbd_store_team_locked(team, 1);
  int maxr = wbd_knob(&wbd_opt.max_running);
  if (maxr > 0 && t->running + t->reserved >= maxr) {
    wbd_store_unlock();
    wbd_store_discard(sb);
    return reply_429(req);
  }
  t->reserved++;
  wbd_store_unlock();

  wbd_sleep_ms(wbd_knob(&wbd_opt.create_ms));
  sb->started_at_us = wbd_now_us();
  sb->end_at_us = sb->started_at_us + to * US;
  int rc = wbd_rt_on_create(sb);
  if (rc != 0) {
    wbd_rt_on_kill(sb);
    wbd_store_lock();
    t->reserved--;
    wbd_store_unlock();
    wbd_store_discard(sb);
    return wbd_reply_error(req, 500, "Failed to create sandbox");
  }
  wbd_store_lock();
  t->reserved--;
  int64_t now = wbd_now_us();
  sb->started_at_us = now;
  sb->end_at_us = cap_end(sb, now + to * US);
  sb->state = WBD_RUNNING;
  wbd_store_insert_locked(sb);
  json_t *res = sandbox_json(sb);
  wbd_store_unlock();
  return wbd_reply_json(req, 201, res, NULL);
}

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
      char hx[3] = { s[i + 1], s[i + 2], 0 };
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
static json_t *parse_metadata(const char *q, const char **err) {
  size_t qn = strlen(q), wn = 0;
  char *whole = query_unescape(q, qn, &wn);
  if (!whole) {
    *err = "error when unescaping query: invalid URL escape";
    return NULL;
  }
  if (wn != strlen(whole)) {   /* a NUL would cut the filter short and widen it */
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
static int parse_time(const char *s, int64_t *us) {
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
  if (*p == 'Z' || *p == 'z') p++;
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

static int parse_token(const char *tok, int asc, int64_t *ts, char *id, size_t idlen) {
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
  if (parse_time(s, ts) != 0) goto out;
  memcpy(id, sid, il + 1);
  rc = 0;
out:
  free(s);
  return rc;
}

static char *make_token(const struct wbd_sandbox *sb, int asc) {
  char t[48], raw[128];
  format_nano(sb->started_at_us, t, sizeof t);
  snprintf(raw, sizeof raw, "%s__%s%s", t, sb->id, asc ? "__asc" : "");
  return b64_encode((const unsigned char *)raw, strlen(raw));
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
  if (MHD_lookup_connection_value_n(req->conn, MHD_GET_ARGUMENT_KIND, "metadata", 8, &raw, &rawlen) == MHD_YES &&
      raw && rawlen != strlen(raw)) {
    /* A NUL inside: C strings would cut the filter there and widen it.
     * Metadata holds no NUL, so nothing matches. */
    *filter = impossible_filter();
    return MHD_YES;
  }
  *filter = parse_metadata(metadata, &err);
  if (!*filter) return wbd_reply_error(req, 400, "Error parsing metadata: %s", err);
  return MHD_YES;
}

static enum MHD_Result h_list_v2(struct wbd_req *req, const char *team) {
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
      if (n == 7 && strncmp(p, "running", 7) == 0) want_running = 1;
      else if (n == 6 && strncmp(p, "paused", 6) == 0) want_paused = 1;
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
    if (strcmp(order, "asc") == 0) asc = 1;
    else if (strcmp(order, "desc") != 0)
      return wbd_reply_error(req, 400, QERR "value is not one of the allowed values [\"asc\",\"desc\"]", "order");
  }
  int64_t after = 0;
  int has_after = 0;
  if (after_s) {
    if (parse_time(after_s, &after) != 0)
      return wbd_reply_error(req, 400, QERR "value %s: an invalid date-time", "startedAfter", after_s);
    has_after = 1;
  }
  if (tmpl && strchr(tmpl, ':'))
    return wbd_reply_error(req, 400, "Template tags are not supported when filtering sandboxes");
  if (tmpl && !*tmpl) tmpl = NULL;
  int64_t cur_ts = 0;
  char cur_id[64];
  int has_cursor = 0;
  if (token) {
    if (parse_token(token, asc, &cur_ts, cur_id, sizeof cur_id) != 0)
      return wbd_reply_error(req, 400, "Invalid next token");
    has_cursor = 1;
  }
  json_t *filter;
  enum MHD_Result mr = metadata_filter(req, metadata, &filter);
  if (req->replied) return mr;
  int loose = wbd_knob(&wbd_loose_metadata);

  json_t *items = json_array();
  char *next = NULL;
  long total_running = -1;
  wbd_store_lock();
  struct wbd_team *t = wbd_store_team_locked(team, 0);
  if (t) {
    long got = 0;
    struct wbd_sandbox *last = NULL;
    size_t n = t->n;
    size_t i = asc ? (has_cursor ? wbd_store_upper_locked(t, cur_ts, cur_id) : 0)
                   : (has_cursor ? wbd_store_lower_locked(t, cur_ts, cur_id) : n);
    for (;;) {
      struct wbd_sandbox *sb;
      if (asc) {
        if (i >= n) break;
        sb = &t->v[i++]->sb;
      } else {
        if (i == 0) break;
        sb = &t->v[--i]->sb;
        if (has_after && sb->started_at_us < after) break;
      }
      if (sb->state == WBD_RUNNING ? !want_running : !want_paused) continue;
      if (has_after && sb->started_at_us < after) continue;
      if (tmpl && strcmp(sb->template_id, tmpl) != 0) continue;
      if (!meta_match(sb, filter, loose)) continue;
      if (got == limit) {
        next = make_token(last, asc);
        break;
      }
      json_array_append_new(items, listed_json(sb, 0));
      last = sb;
      got++;
    }
    if (want_running) {
      if (!filter && !tmpl && !has_after) {
        total_running = t->running;
      } else {
        total_running = 0;
        for (struct wbd_rec *r = t->run_head; r; r = r->rnext) {
          if (has_after && r->sb.started_at_us < after) continue;
          if (tmpl && strcmp(r->sb.template_id, tmpl) != 0) continue;
          if (meta_match(&r->sb, filter, loose)) total_running++;
        }
      }
    }
  } else if (want_running) {
    total_running = 0;
  }
  wbd_store_unlock();
  json_decref(filter);

  const char *hv[5] = { NULL };
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

static int desc_cmp(const void *a, const void *b) {
  const struct wbd_sandbox *x = *(struct wbd_sandbox *const *)a, *y = *(struct wbd_sandbox *const *)b;
  if (x->started_at_us != y->started_at_us) return x->started_at_us > y->started_at_us ? -1 : 1;
  return strcmp(x->id, y->id);
}

static enum MHD_Result h_list_v1(struct wbd_req *req, const char *team) {
  const char *metadata = wbd_req_query(req, "metadata");
  json_t *filter;
  enum MHD_Result mr = metadata_filter(req, metadata, &filter);
  if (req->replied) return mr;
  int loose = wbd_knob(&wbd_loose_metadata);
  json_t *items = json_array();
  wbd_store_lock();
  struct wbd_team *t = wbd_store_team_locked(team, 0);
  if (t && t->running > 0) {
    struct wbd_sandbox **v = malloc((size_t)t->running * sizeof *v);
    size_t n = 0;
    for (struct wbd_rec *r = t->run_head; r && v; r = r->rnext)
      if (meta_match(&r->sb, filter, loose)) v[n++] = &r->sb;
    if (v) qsort(v, n, sizeof *v, desc_cmp);
    for (size_t i = 0; i < n; i++) json_array_append_new(items, listed_json(v[i], 0));
    free(v);
  }
  wbd_store_unlock();
  json_decref(filter);
  return wbd_reply_json(req, 200, items, NULL);
}

static enum MHD_Result h_info(struct wbd_req *req, const char *team, const char *id) {
  wbd_store_lock();
  struct wbd_sandbox *sb = find_locked(team, id);
  json_t *o = sb ? listed_json(sb, 1) : NULL;
  wbd_store_unlock();
  if (!o) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  return wbd_reply_json(req, 200, o, NULL);
}

static enum MHD_Result h_kill(struct wbd_req *req, const char *team, const char *id) {
  struct wbd_sandbox *sb = find_ref(team, id);
  int rc = sb ? op_kill(sb, 0) : 404;
  wbd_sandbox_unref(sb);
  if (rc == 404) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  return wbd_reply_json(req, 204, NULL, NULL);
}

static enum MHD_Result h_timeout(struct wbd_req *req, const char *team, const char *id, int refresh) {
  enum MHD_Result r = MHD_NO;
  json_t *o = body_object(req, !refresh, &r);
  if (!o) return r;
  int bad = 0;
  json_t *v = field(req, o, refresh ? "duration" : "timeout", J_INT, &bad, &r);
  if (bad) {
    json_decref(o);
    return r;
  }
  long long secs = v ? json_integer_value(v) : refresh ? 15 : -1;
  int missing = !v;
  json_decref(o);
  if (refresh) {
    if (secs < 0) return wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/duration\": number must be at least 0");
    if (secs > 3600) return wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/duration\": number must be at most 3600");
    if (secs < 15) secs = 15;
  } else {
    if (missing) return wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/timeout\": property \"timeout\" is missing");
    if (secs < 0) return wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/timeout\": number must be at least 0");
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
      if (!refresh || end > sb->end_at_us) sb->end_at_us = end;
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
  json_t *o = body_object(req, 0, &r);
  if (!o) return r;
  int bad = 0;
  json_t *mem = field(req, o, "memory", J_BOOL, &bad, &r);
  int memory = mem ? json_is_true(mem) : 1;
  json_decref(o);
  if (bad) return r;
  struct wbd_sandbox *sb = find_ref(team, id);
  int rc = sb ? op_pause(sb, memory, 0) : 404;
  wbd_sandbox_unref(sb);
  if (rc == 404) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  if (rc == 409) return wbd_reply_error(req, 409, "Error pausing sandbox - sandbox '%s' is already paused", id);
  if (rc == 500) return wbd_reply_error(req, 500, "Error pausing sandbox");
  return wbd_reply_json(req, 204, NULL, NULL);
}

static enum MHD_Result h_connect(struct wbd_req *req, const char *team, const char *id, enum resume_mode mode,
                                 int v2) {
  enum MHD_Result r = MHD_NO;
  json_t *o = body_object(req, mode == R_CONNECT && !v2, &r);
  if (!o) return r;
  int bad = 0;
  json_t *to = field(req, o, "timeout", J_INT, &bad, &r);
  json_t *mem = v2 ? field(req, o, "memory", J_BOOL, &bad, &r) : NULL;
  json_t *ap = mode == R_RESUME ? field(req, o, "autoPause", J_BOOL, &bad, &r) : NULL;
  if (bad) {
    json_decref(o);
    return r;
  }
  if (!to && mode == R_CONNECT && !v2) {
    json_decref(o);
    return wbd_reply_error(req, 400, VERR "doesn't match schema: Error at \"/timeout\": property \"timeout\" is missing");
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
  struct wbd_sandbox *sb = find_ref(team, id);
  json_t *out = NULL;
  int rc = sb ? op_resume(sb, (int)secs, memory, mode, auto_pause, &out) : 404;
  wbd_sandbox_unref(sb);
  switch (rc) {
  case 200:
  case 201: return wbd_reply_json(req, (unsigned)rc, out, NULL);
  case 404: return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  case 409: return wbd_reply_error(req, 409, "Sandbox %s is already running", id);
  case 429: return reply_429(req);
  default: return wbd_reply_error(req, 500, "Failed to resume sandbox");
  }
}

enum MHD_Result wbd_control_handle(struct wbd_req *req, const char *route) {
  if (strcmp(route, "GET /health") == 0) {
    static const char ok[] = "Health check successful";
    return wbd_reply_raw(req, 200, "text/plain; charset=utf-8", ok, sizeof ok - 1, NULL);
  }
  char team[64], id[64];
  enum MHD_Result r = MHD_NO;
  if (authenticate(req, team, sizeof team, &r) != 0) return r;
  if (strcmp(route, "POST /sandboxes") == 0) return h_create(req, team, 0);
  if (strcmp(route, "POST /v2/sandboxes") == 0) return h_create(req, team, 1);
  if (strcmp(route, "GET /v2/sandboxes") == 0) return h_list_v2(req, team);
  if (strcmp(route, "GET /sandboxes") == 0) return h_list_v1(req, team);
  if (path_id(req->path, id, sizeof id) != 0) return wbd_reply_error(req, 400, "Invalid sandbox ID");
  if (strcmp(route, "GET /sandboxes/{id}") == 0) return h_info(req, team, id);
  if (strcmp(route, "DELETE /sandboxes/{id}") == 0) return h_kill(req, team, id);
  if (strcmp(route, "POST /sandboxes/{id}/timeout") == 0) return h_timeout(req, team, id, 0);
  if (strcmp(route, "POST /sandboxes/{id}/refreshes") == 0) return h_timeout(req, team, id, 1);
  if (strcmp(route, "POST /sandboxes/{id}/pause") == 0) return h_pause(req, team, id);
  if (strcmp(route, "POST /sandboxes/{id}/connect") == 0) return h_connect(req, team, id, R_CONNECT, 0);
  if (strcmp(route, "POST /v2/sandboxes/{id}/connect") == 0) return h_connect(req, team, id, R_CONNECT, 1);
  if (strcmp(route, "POST /sandboxes/{id}/resume") == 0) return h_connect(req, team, id, R_RESUME, 0);
  return wbd_reply_error(req, 404, "no route for %s %s", req->method, req->path);
}

/* ------------------------------------------------------------------ */
/* Knobs: config and seed                                              */
/* ------------------------------------------------------------------ */

enum MHD_Result wbd_knob_config(struct wbd_req *req) {
  enum MHD_Result r = MHD_NO;
  json_t *o = body_object(req, 1, &r);
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

enum MHD_Result wbd_knob_seed(struct wbd_req *req) {
  char team[64];
  enum MHD_Result r = MHD_NO;
  if (authenticate(req, team, sizeof team, &r) != 0) return r;
  json_t *o = body_object(req, 1, &r);
  if (!o) return r;
  int bad = 0;
  json_t *count = field(req, o, "count", J_INT, &bad, &r);
  json_t *state = field(req, o, "state", J_STRING, &bad, &r);
  json_t *meta = field(req, o, "metadata", J_STRMAP, &bad, &r);
  json_t *tmpl = field(req, o, "templateID", J_STRING, &bad, &r);
  json_t *timeout = field(req, o, "timeout", J_INT, &bad, &r);
  json_t *started_ago = field(req, o, "started_ago_s", J_INT, &bad, &r);
  json_t *paused_ago = field(req, o, "paused_ago_s", J_INT, &bad, &r);
  json_t *ap = field(req, o, "autoPause", J_BOOL, &bad, &r);
  json_t *ar = field(req, o, "autoResume", J_BOOL, &bad, &r);
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
    sb->template_id = strdup(tid);
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

/* ------------------------------------------------------------------ */
/* The lease timer                                                     */
/* ------------------------------------------------------------------ */

static pthread_t lc_thread;
static pthread_mutex_t lc_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lc_cv = PTHREAD_COND_INITIALIZER;
static int lc_stop, lc_started;

static void expire_once(void) {
  size_t n = 0, cap = 0;
  struct wbd_sandbox **v = NULL;
  int *pause = NULL;  /* -1 kill, else pause with that memory flag */
  int64_t now = wbd_now_us();
  wbd_store_lock();
  for (struct wbd_team *t = wbd_store_teams_locked(); t; t = t->next)
    for (struct wbd_rec *r = t->run_head; r; r = r->rnext) {
      if (r->busy || r->sb.end_at_us > now) continue;
      if (n == cap) {
        cap = cap ? cap * 2 : 64;
        struct wbd_sandbox **nv = realloc(v, cap * sizeof *nv);
        int *np = realloc(pause, cap * sizeof *np);
        if (!nv || !np) abort();
        v = nv;
        pause = np;
      }
      wbd_store_ref_locked(&r->sb);
      pause[n] = r->sb.auto_pause ? r->sb.auto_pause_memory : -1;
      v[n++] = &r->sb;
    }
  wbd_store_unlock();
  for (size_t i = 0; i < n; i++) {
    struct wbd_sandbox *sb = v[i];
    if (pause[i] >= 0) op_pause(sb, pause[i], 1);
    else op_kill(sb, 1);
    wbd_sandbox_unref(sb);
  }
  free(v);
  free(pause);
}

static void *lifecycle_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lc_mu);
  while (!lc_stop) {
    pthread_mutex_unlock(&lc_mu);
    expire_once();
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
  if (pthread_create(&lc_thread, NULL, lifecycle_main, NULL) != 0) return -1;
  lc_started = 1;
  return 0;
}

void wbd_lifecycle_stop(void) {
  if (!lc_started) return;
  pthread_mutex_lock(&lc_mu);
  lc_stop = 1;
  pthread_cond_signal(&lc_cv);
  pthread_mutex_unlock(&lc_mu);
  pthread_join(lc_thread, NULL);
  lc_started = 0;
}
