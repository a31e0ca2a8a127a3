/*
 * routes.c: the route table. Every route of the control plane (E2B's
 * sandboxes, snapshots, templates, fork) and of the admin API
 * (/_warmboxd/...) is one row here: "METHOD /path", who may call it, its
 * handler and an argument for it. server.c matches a request against the
 * rows in order (server/route.c: the first that matches wins; a {name} is
 * one non-empty path segment; a row without a handler ends the search with
 * no route) and counts it under the row's route; its
 * admin gate lets admin rows be reached only with the admin token, and
 * wbd_route_call checks the others' auth before the handler. The data plane
 * (ports 49983 and 49999 of a sandbox) is routed by dataplane.c.
 */
#include "control.h"

const struct wbd_route wbd_route_table[] = {
  /* E2B's control plane */
  {"GET /health", WBD_AUTH_NONE, wbd_h_health, 0},
  {"POST /sandboxes", WBD_AUTH_TEAM, wbd_h_create, 0},
  {"GET /sandboxes", WBD_AUTH_TEAM, wbd_h_list_v1, 0},
  {"POST /v2/sandboxes", WBD_AUTH_TEAM, wbd_h_create, 1},
  {"GET /v2/sandboxes", WBD_AUTH_TEAM, wbd_h_list_v2, 0},
  {"GET /sandboxes/metrics", WBD_AUTH_TEAM, wbd_h_metrics_many, 0},
  {"* /sandboxes/metrics", WBD_AUTH_NONE, NULL, 0}, /* no sandbox id: other methods have no route */
  {"POST /v2/sandboxes/{id}/connect", WBD_AUTH_SANDBOX, wbd_h_connect, WBD_CONNECT_V2},
  {"GET /sandboxes/{id}", WBD_AUTH_SANDBOX, wbd_h_info, 0},
  {"DELETE /sandboxes/{id}", WBD_AUTH_SANDBOX, wbd_h_kill, 0},
  {"GET /sandboxes/{id}/metrics", WBD_AUTH_SANDBOX, wbd_h_metrics_one, 0},
  {"POST /sandboxes/{id}/timeout", WBD_AUTH_SANDBOX, wbd_h_timeout, 0},
  {"POST /sandboxes/{id}/pause", WBD_AUTH_SANDBOX, wbd_h_pause, 0},
  {"POST /sandboxes/{id}/connect", WBD_AUTH_SANDBOX, wbd_h_connect, WBD_CONNECT},
  {"POST /sandboxes/{id}/resume", WBD_AUTH_SANDBOX, wbd_h_connect, WBD_RESUME},
  {"POST /sandboxes/{id}/refreshes", WBD_AUTH_SANDBOX, wbd_h_timeout, 1},
  /* snapshots and fork (snapshot_api.c, fork.c); take checks the id itself */
  {"POST /sandboxes/{id}/snapshots", WBD_AUTH_TEAM, wbd_h_snapshot_take, 0},
  {"POST /sandboxes/{id}/fork", WBD_AUTH_SANDBOX, wbd_h_fork, 0},
  {"GET /snapshots", WBD_AUTH_TEAM, wbd_h_snapshot_list, 0},
  {"DELETE /templates/{id}", WBD_AUTH_TEAM, wbd_h_template_delete, 0},
  /* E2B's lifecycle events and webhooks (events.c, webhooks.c) */
  {"GET /events/sandboxes", WBD_AUTH_TEAM, wbd_h_events, 0},
  {"GET /events/sandboxes/{id}", WBD_AUTH_TEAM, wbd_h_events, 1},
  {"GET /events/webhooks", WBD_AUTH_TEAM, wbd_h_webhooks, 0},
  {"POST /events/webhooks", WBD_AUTH_TEAM, wbd_h_webhooks, 0},
  {"GET /events/webhooks/{id}", WBD_AUTH_TEAM, wbd_h_webhooks, 0},
  {"PATCH /events/webhooks/{id}", WBD_AUTH_TEAM, wbd_h_webhooks, 0},
  {"DELETE /events/webhooks/{id}", WBD_AUTH_TEAM, wbd_h_webhooks, 0},
  /* the admin API (knobs.c) */
  {"GET /_warmboxd/stats", WBD_AUTH_ADMIN, wbd_admin_stats, 0},
  {"POST /_warmboxd/stats/reset", WBD_AUTH_ADMIN, wbd_admin_stats_reset, 0},
  {"POST /_warmboxd/faults", WBD_AUTH_ADMIN, wbd_admin_fault_add, 0},
  {"DELETE /_warmboxd/faults", WBD_AUTH_ADMIN, wbd_admin_faults_clear, 0},
  {"POST /_warmboxd/config", WBD_AUTH_ADMIN, wbd_admin_config, 0},
  {"POST /_warmboxd/seed", WBD_AUTH_ADMIN, wbd_admin_seed, 0},
  {"* /_warmboxd/clock", WBD_AUTH_ADMIN, wbd_admin_clock, 0},
  {"GET /_warmboxd/runtime", WBD_AUTH_ADMIN, wbd_admin_runtime, 0},
};
const size_t wbd_route_count = sizeof wbd_route_table / sizeof *wbd_route_table;

enum MHD_Result wbd_route_call(struct wbd_req *req, const struct wbd_route *row) {
  char team[64] = "", id[64] = "";
  struct wbd_call c = {team, id, row->arg};
  enum MHD_Result r = MHD_NO;
  if (row->auth == WBD_AUTH_TEAM || row->auth == WBD_AUTH_SANDBOX) {
    if (wbd_ctl_authenticate(req, team, sizeof team, &r) != 0) return r;
  }
  if (row->auth == WBD_AUTH_SANDBOX && wbd_ctl_path_id(req->path, id, sizeof id) != 0)
    return wbd_reply_error(req, 400, "Invalid sandbox ID");
  return row->fn(req, &c);
}
