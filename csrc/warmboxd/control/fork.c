/*
 * fork.c: E2B's POST /sandboxes/{id}/fork {count (1..100, default 1),
 * timeout (s, default 15)}. The running parent is held still while its
 * files are copied once (it keeps its id and lease), then `count` sandboxes
 * start on them, each inheriting the parent's metadata, envVars, template,
 * security and lifecycle. 201 with one entry per fork: {"sandbox": Sandbox}
 * or {"error": {code, message}}. 404 unknown, 409 paused or being
 * snapshotted. Process memory is not carried, the default python
 * context's namespace is, serialised (state.h); other kernels start afresh.
 */
#include "control.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FORK_MAX 100

static int fill_from(struct wbd_sandbox *sb, void *cls) {
  return wbd_files_load(sb, cls);
}

static json_t *fork_error(int code, const char *msg) {
  return json_pack("{s:{s:i, s:s}}", "error", "code", code, "message", msg);
}

/* One child of the parent's record `rec`, on the files in dir. */
static json_t *fork_one(const char *team, json_t *rec, char *dir, long long timeout) {
  struct wbd_sandbox *sb = wbd_store_alloc(team);
  if (wbd_persist_record_apply(sb, rec, 0) != 0) {
    wbd_store_discard(sb);
    return fork_error(500, "Failed to start forked sandbox");
  }
  sb->timeout_s = (int)timeout;
  json_t *out = NULL;
  int rc = wbd_ctl_launch(sb, timeout, fill_from, dir, &out);
  if (rc == 429) return fork_error(429, "you have reached the maximum number of concurrent E2B sandboxes");
  if (rc == WBD_OVER_MEMORY)
    return fork_error(429,
                      "you have reached the maximum memory of your running and paused sandboxes "
                      "(warmboxd --max-team-memory-mb)");
  if (rc != 0) return fork_error(500, "Failed to start forked sandbox");
  return json_pack("{s:o}", "sandbox", out);
}

static int parse(struct wbd_req *req, long long *count, long long *timeout, enum MHD_Result *r) {
  json_t *o = wbd_ctl_body_object(req, 0, r);
  if (!o) return -1;
  int bad = 0;
  json_t *c = wbd_ctl_field(req, o, "count", J_INT, &bad, r);
  json_t *t = wbd_ctl_field(req, o, "timeout", J_INT, &bad, r);
  *count = c ? json_integer_value(c) : 1;
  *timeout = t ? json_integer_value(t) : wbd_opt.default_timeout_s;
  json_decref(o);
  if (bad) return -1;
  const char *err = NULL;
  if (*count < 1 || *count > FORK_MAX)
    err = VERR "doesn't match schema: Error at \"/count\": number must be between 1 and 100";
  else if (*timeout <= 0)
    err = "Timeout must be greater than 0";
  else if (*timeout > (long long)wbd_opt.max_length_hours * 3600)
    err = "Timeout cannot be greater than the maximum sandbox length";
  if (err) {
    *r = wbd_reply_error(req, 400, "%s", err);
    return -1;
  }
  return 0;
}

enum MHD_Result wbd_fork_handle(struct wbd_req *req, const char *team, const char *id) {
  enum MHD_Result r = MHD_NO;
  long long count, timeout;
  if (parse(req, &count, &timeout, &r) != 0) return r;
  char top[PATH_MAX], dir[PATH_MAX + 64];
  if (!wbd_state_dir("forks", top, sizeof top)) return wbd_reply_error(req, 500, "Error forking sandbox");
  static long seq;
  snprintf(dir, sizeof dir, "%s/%s-%ld", top, id, __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
  json_t *rec = NULL;
  /* the copy lives until the forks have started: bounded as a snapshot's */
  struct wbd_copy c = {.budget = -1, .pool_limit = -1};
  int rc = wbd_quota_begin(team, 0, &c);
  if (rc) return wbd_reply_error(req, (unsigned)rc, "%s", c.msg);
  rc = wbd_state_capture(team, id, dir, 409, &rec, &c);
  if (rc != 0) {
    wbd_quota_end(team, 0, c.bytes);
    wbd_files_remove(dir);
  }
  if (rc == 404) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  if (rc == 409)
    return wbd_reply_error(req, 409, "Sandbox \"%s\" is paused or being snapshotted and cannot be forked", id);
  if (rc == 429 || rc == 507) return wbd_reply_error(req, (unsigned)rc, "%s", c.msg);
  if (rc != 0) return wbd_reply_error(req, 500, "Error forking sandbox: %s", c.msg);
  json_t *arr = json_array();
  for (long long i = 0; i < count; i++) json_array_append_new(arr, fork_one(team, rec, dir, timeout));
  json_decref(rec);
  wbd_files_remove(dir);
  wbd_quota_end(team, 0, c.bytes);
  return wbd_reply_json(req, 201, arr, NULL);
}
