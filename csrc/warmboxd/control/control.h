/*
 * control.h: the control layer (control/): E2B's control plane
 * (control.c, list.c), the snapshot and fork routes (snapshot_api.c,
 * fork.c) and the admin API (knobs.c). What they share: request-body
 * helpers, auth, the listed view of a record, the list handlers and their
 * parsers (also the fuzz targets' entry points).
 */
#ifndef WBD_CONTROL_H
#define WBD_CONTROL_H

#include "wbd.h"
#include "server.h"
#include "state.h"

#define US 1000000LL
#define VERR "validation error: request body has an error: "
#define WBD_CLIENT_ID "6532622b"
#define WBD_ENVD_VERSION "0.6.4"
/* E2B-style bounds on a sandbox's metadata and envVars (control.c). */
#define WBD_MAP_MAX_KEYS 1000
#define WBD_MAP_MAX_KEY 256
#define WBD_META_MAX_BYTES (64 << 10)          /* keys + values */
#define WBD_ENV_MAX_BYTES (256 << 10)

enum jtype { J_BOOL, J_INT, J_STRING, J_OBJECT, J_STRMAP };

/* The body as a JSON object (empty body: {} unless `required`); replies 400
 * and returns NULL when it is not one. */
json_t *wbd_ctl_body_object(struct wbd_req *req, int required, enum MHD_Result *r);
/* Field `name` of `o`: NULL when absent or null; sets *bad and replies 400
 * when it has the wrong type (J_STRMAP also bounds metadata/envVars). */
json_t *wbd_ctl_field(struct wbd_req *req, json_t *o, const char *name, enum jtype t, int *bad,
                      enum MHD_Result *r);
/* Fills `team` from X-API-Key; replies 401 and returns -1 when it is bad. */
int wbd_ctl_authenticate(struct wbd_req *req, char *team, size_t len, enum MHD_Result *r);
/* `ListedSandbox`; with `detail`, `SandboxDetail`. Under the store lock. */
json_t *wbd_ctl_listed_json(const struct wbd_sandbox *sb, int detail);

/* The {id} of a /sandboxes/{id}... or /v2/sandboxes/{id}... path: 0, or -1
 * when malformed (400 "Invalid sandbox ID"). */
int wbd_ctl_path_id(const char *path, char *id, size_t len);
/* `Sandbox`, as create/connect/resume/fork answer. Under the store lock. */
json_t *wbd_ctl_sandbox_json(const struct wbd_sandbox *sb);
/* The team's record with that id, not killed, referenced; or NULL. */
struct wbd_sandbox *wbd_ctl_find_ref(const char *team, const char *id);
/* Starts a new record (wbd_store_alloc'd and filled in, not inserted) for a
 * lease of `to` seconds: reserves a place under the team's caps, makes its
 * runtime, lets `fill` (may be NULL) put files in it, inserts it running.
 * 0 and *out (its `Sandbox`), or 429 (--max-running) / WBD_OVER_MEMORY
 * (--max-team-memory-mb) / 500 (the record is then freed). */
#define WBD_OVER_MEMORY 1429
/* The 429 answer of a team's cap: --max-running, or (WBD_OVER_MEMORY) its
 * memory budget. */
enum MHD_Result wbd_ctl_reply_limit(struct wbd_req *req, int rc);
int wbd_ctl_launch(struct wbd_sandbox *sb, long long to, int (*fill)(struct wbd_sandbox *sb, void *cls), void *cls,
                   json_t **out);
/* Pauses a referenced record (expire_only: the lease timer's call): 204,
 * 404 (killed), 409 (already paused) or 500. */
int wbd_ctl_pause(struct wbd_sandbox *sb, int memory, int expire_only);

/* list.c */
enum MHD_Result wbd_list_v2(struct wbd_req *req, const char *team);
enum MHD_Result wbd_list_v1(struct wbd_req *req, const char *team);
/* E2B's parseFilters on the once-decoded ?metadata= value: an object, or
 * NULL and *err. */
json_t *wbd_parse_metadata(const char *q, const char **err);
/* A nextToken: 0 and its startedAt / id, or -1. */
int wbd_parse_token(const char *tok, int asc, int64_t *ts, char *id, size_t idlen);
/* RFC 3339 to unix microseconds: 0, or -1. */
int wbd_parse_time(const char *s, int64_t *us);

/* ---- routes.c: the route table, every control-plane and admin route ---- */
extern const struct wbd_route wbd_route_table[];
extern const size_t wbd_route_count;
/* Checks the row's auth (TEAM, SANDBOX) and calls its handler. */
enum MHD_Result wbd_route_call(struct wbd_req *req, const struct wbd_route *row);

/* ---- the handlers the table names (struct wbd_call: team, id, arg) ---- */
/* control.c; wbd_h_connect's arg: */
enum { WBD_CONNECT = 0, WBD_CONNECT_V2 = 1, WBD_RESUME = 2 };
enum MHD_Result wbd_h_health(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_create(struct wbd_req *req, const struct wbd_call *c);   /* arg: v2 */
enum MHD_Result wbd_h_list_v2(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_list_v1(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_metrics_many(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_info(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_metrics_one(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_kill(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_timeout(struct wbd_req *req, const struct wbd_call *c);  /* arg: a refresh */
enum MHD_Result wbd_h_pause(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_connect(struct wbd_req *req, const struct wbd_call *c);
/* snapshot_api.c */
enum MHD_Result wbd_h_snapshot_take(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_snapshot_list(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_template_delete(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_fork(struct wbd_req *req, const struct wbd_call *c);
/* knobs.c: the admin API, /_warmboxd/... (stats, faults, config, seed,
 * clock), once server.c's gate let the request in. */
enum MHD_Result wbd_admin_stats(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_admin_runtime(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_admin_stats_reset(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_admin_fault_add(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_admin_faults_clear(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_admin_config(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_admin_seed(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_admin_clock(struct wbd_req *req, const struct wbd_call *c);   /* GET reads, POST moves */

/* ---- control.c ---- */
/* Whether X-API-Key names a team (the same test the handlers make). */
int wbd_control_key_ok(const char *key);
/* A data-plane request for sandbox `id` on `port`: finds it, auto-resumes it
 * when paused, hands it to wbd_dataplane_handle. */
enum MHD_Result wbd_control_dataplane(struct wbd_req *req, const char *id, int port);
int wbd_lifecycle_start(void);
void wbd_lifecycle_stop(void);
/* Pauses or kills every sandbox past its end now (what the lifecycle thread
 * does every 100 ms), in the calling thread. */
void wbd_lifecycle_expire_now(void);

/* ---- fork.c ---- */
enum MHD_Result wbd_fork_handle(struct wbd_req *req, const char *team, const char *id);

/* ---- snapshot_api.c ---- */
/* Shutdown: running sandboxes that pause at their timeout are paused
 * (files only) now, so that they come back after the restart. */
void wbd_state_shutdown(void);

#endif
