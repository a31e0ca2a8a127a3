/*
 * snapshot_api.c: the HTTP side of state.h, above control.c: the snapshot
 * routes (POST /sandboxes/{id}/snapshots, GET /snapshots, DELETE
 * /templates/{id}) and fork's, rows of routes.c's table, and the graceful
 * stop that pauses what should come back.
 */
#include "control.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Handlers                                                            */
/* ------------------------------------------------------------------ */

static enum MHD_Result h_take(struct wbd_req *req, const char *team) {
  char id[64];
  if (wbd_ctl_path_id(req->path, id, sizeof id) != 0) return wbd_reply_error(req, 400, "Invalid sandbox ID");
  enum MHD_Result r = MHD_NO;
  json_t *o = wbd_ctl_body_object(req, 0, &r);
  if (!o) return r;
  int bad = 0;
  json_t *name = wbd_ctl_field(req, o, "name", J_STRING, &bad, &r);
  if (bad) {
    json_decref(o);
    return r;
  }
  if (name && !wbd_snapshot_name_ok(json_string_value(name))) {
    json_decref(o);
    return wbd_reply_error(req, 400,
                           "Invalid snapshot name: letters, digits, '-', '_' and '.', with an optional ':tag'");
  }
  struct wbd_snapshot *s = NULL;
  char msg[800] = "";
  int rc = wbd_snapshot_take(team, id, name ? json_string_value(name) : NULL, &s, msg, sizeof msg);
  json_decref(o);
  if (rc == 404) return wbd_reply_error(req, 404, NOT_FOUND_FMT, id);
  if (rc == 409) return wbd_reply_error(req, 409, "Sandbox \"%s\" is being snapshotted", id);
  if (rc == 429 || rc == 507) return wbd_reply_error(req, (unsigned)rc, "%s", msg);
  if (rc != 0) return wbd_reply_error(req, 500, "Error creating the snapshot: %s", msg);
  json_t *out = wbd_snapshot_info(s);
  wbd_snapshot_put(s);
  struct wbd_sandbox *sb = wbd_ctl_find_ref(team, id);
  if (sb) {
    wbd_store_lock();
    wbd_event_locked(sb, WBD_EV_CHECKPOINTED, 0);
    wbd_store_unlock();
    wbd_sandbox_unref(sb);
  }
  return wbd_reply_json(req, 201, out, NULL);
}

/* The page after `tok` ("<createdAt us>.<templateID>", newest first). */
static enum MHD_Result h_list(struct wbd_req *req, const char *team) {
  const char *sid = wbd_req_query(req, "sandboxID"), *name = wbd_req_query(req, "name");
  const char *lim = wbd_req_query(req, "limit"), *tok = wbd_req_query(req, "nextToken");
  char *end = NULL;
  long limit = lim ? strtol(lim, &end, 10) : 100;
  if (lim && (!*lim || *end || limit < 1 || limit > 100))
    return wbd_reply_error(req, 400, "validation error: parameter \"limit\" must be between 1 and 100");
  long long after_us = 0;
  char after_id[32] = "", next[80];
  if (tok && *tok && (sscanf(tok, "%lld.%31[a-z0-9]", &after_us, after_id) != 2 || strlen(after_id) != 21))
    return wbd_reply_error(req, 400, "Invalid next token");
  json_t *arr = wbd_snapshot_page(team, sid && *sid ? sid : NULL, name && *name ? name : NULL, after_us,
                                  after_id[0] ? after_id : NULL, limit, next, sizeof next);
  const char *const hdr[] = {"X-Next-Token", next, NULL};
  return wbd_reply_json(req, 200, arr, next[0] ? hdr : NULL);
}

static enum MHD_Result h_delete(struct wbd_req *req, const char *team) {
  const char *ref = req->path + strlen("/templates/");
  if (wbd_snapshot_delete(team, ref) != 0) return wbd_reply_error(req, 404, "Template '%s' not found", ref);
  return wbd_reply_json(req, 204, NULL, NULL);
}

/* ------------------------------------------------------------------ */
/* Routes                                                              */
/* ------------------------------------------------------------------ */

enum MHD_Result wbd_h_snapshot_take(struct wbd_req *req, const struct wbd_call *c) {
  return h_take(req, c->team);
}
enum MHD_Result wbd_h_snapshot_list(struct wbd_req *req, const struct wbd_call *c) {
  return h_list(req, c->team);
}
enum MHD_Result wbd_h_template_delete(struct wbd_req *req, const struct wbd_call *c) {
  return h_delete(req, c->team);
}
enum MHD_Result wbd_h_fork(struct wbd_req *req, const struct wbd_call *c) {
  return wbd_fork_handle(req, c->team, c->id);
}

/* ------------------------------------------------------------------ */
/* Shutdown                                                            */
/* ------------------------------------------------------------------ */

void wbd_state_shutdown(void) {
  if (wbd_opt.keep_state) {
    size_t n = 0, cap = 0;
    struct wbd_sandbox **v = NULL;
    wbd_store_lock();
    for (struct wbd_team *t = wbd_store_teams_locked(); t; t = t->next)
      for (struct wbd_rec *r = t->run_head; r; r = r->rnext) {
        if (!r->sb.auto_pause) continue;
        if (n == cap && !(v = realloc(v, (cap = cap ? cap * 2 : 64) * sizeof *v))) abort();
        wbd_store_ref_locked(&r->sb);
        v[n++] = &r->sb;
      }
    wbd_store_unlock();
    for (size_t i = 0; i < n; i++) {
      wbd_ctl_pause(v[i], 0, 0, NULL, 0);
      wbd_sandbox_unref(v[i]);
    }
    free(v);
  } else {
    char top[PATH_MAX + 16];
    snprintf(top, sizeof top, "%s/.state", wbd_opt.data_dir);
    wbd_files_remove(top);
  }
  wbd_persist_close();
}
