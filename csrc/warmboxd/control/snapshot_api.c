/*
 * snapshot_api.c: the HTTP side of state.h, above control.c: the snapshot
 * routes (POST /sandboxes/{id}/snapshots, GET /snapshots, DELETE
 * /templates/{id}) and fork's, put in front of control.c's in main.c's
 * route table, and the graceful stop that pauses what should come back.
 */
#include "wbd_int.h"
#include "control.h"
#include "state.h"

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
    return wbd_reply_error(req, 400, "Invalid snapshot name: letters, digits, '-', '_' and '.', with an optional ':tag'");
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
  const char *const hdr[] = { "X-Next-Token", next, NULL };
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

#define R_TAKE "POST /sandboxes/{id}/snapshots"
#define R_FORK "POST /sandboxes/{id}/fork"
#define R_LIST "GET /snapshots"
#define R_DELETE "DELETE /templates/{id}"

static const char *own_route(const char *method, const char *path) {
  if (strcmp(path, "/snapshots") == 0) return strcmp(method, "GET") == 0 ? R_LIST : NULL;
  if (strncmp(path, "/templates/", 11) == 0 && path[11])
    return strcmp(method, "DELETE") == 0 && !strchr(path + 11, '/') ? R_DELETE : NULL;
  if (strncmp(path, "/sandboxes/", 11) != 0 || strcmp(method, "POST") != 0) return NULL;
  const char *rest = strchr(path + 11, '/');
  if (!rest || rest == path + 11) return NULL;
  if (strcmp(rest, "/snapshots") == 0) return R_TAKE;
  if (strcmp(rest, "/fork") == 0) return R_FORK;
  return NULL;
}

static int owns(const char *route) {
  return strcmp(route, R_TAKE) == 0 || strcmp(route, R_FORK) == 0 || strcmp(route, R_LIST) == 0 ||
         strcmp(route, R_DELETE) == 0;
}

static enum MHD_Result handle(struct wbd_req *req, const char *route, const char *team) {
  if (strcmp(route, R_LIST) == 0) return h_list(req, team);
  if (strcmp(route, R_DELETE) == 0) return h_delete(req, team);
  if (strcmp(route, R_TAKE) == 0) return h_take(req, team);
  char id[64];
  if (wbd_ctl_path_id(req->path, id, sizeof id) != 0) return wbd_reply_error(req, 400, "Invalid sandbox ID");
  return wbd_fork_handle(req, team, id);
}

const char *wbd_state_route(const char *method, const char *path) {
  const char *r = own_route(method, path);
  return r ? r : wbd_control_route(method, path);
}

enum MHD_Result wbd_state_control(struct wbd_req *req, const char *route) {
  if (!owns(route)) return wbd_control_handle(req, route);
  char team[64];
  enum MHD_Result r = MHD_NO;
  if (wbd_ctl_authenticate(req, team, sizeof team, &r) != 0) return r;
  return handle(req, route, team);
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
