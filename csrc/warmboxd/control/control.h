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

#define US               1000000LL
#define VERR             "validation error: request body has an error: "
#define WBD_CLIENT_ID    "6532622b"
#define WBD_ENVD_VERSION "0.6.4"
/* E2B-style bounds on a sandbox's metadata and envVars (control.c). */
#define WBD_MAP_MAX_KEYS   1000
#define WBD_MAP_MAX_KEY    256
#define WBD_META_MAX_BYTES (64 << 10) /* keys + values */
#define WBD_ENV_MAX_BYTES  (256 << 10)

enum jtype { J_BOOL, J_INT, J_STRING, J_OBJECT, J_STRMAP };

/* The body as a JSON object (empty body: {} unless `required`); replies 400
 * and returns NULL when it is not one. */
json_t *wbd_ctl_body_object(struct wbd_req *req, int required, enum MHD_Result *r);
/* Field `name` of `o`: NULL when absent or null; sets *bad and replies 400
 * when it has the wrong type (J_STRMAP also bounds metadata/envVars). */
json_t *wbd_ctl_field(struct wbd_req *req, json_t *o, const char *name, enum jtype t, int *bad, enum MHD_Result *r);
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
 * 404 (killed), 409 (already paused) or 500; with --data-dir, 429 / 507 /
 * 500 and msg (may be NULL) when its copy cannot be kept: then the sandbox
 * runs on as before (the lease timer's pause stays paused, in memory). */
int wbd_ctl_pause(struct wbd_sandbox *sb, int memory, int expire_only, char *msg, size_t len);

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
enum MHD_Result wbd_h_create(struct wbd_req *req, const struct wbd_call *c); /* arg: v2 */
enum MHD_Result wbd_h_list_v2(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_list_v1(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_metrics_many(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_info(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_metrics_one(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_kill(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_timeout(struct wbd_req *req, const struct wbd_call *c); /* arg: a refresh */
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
enum MHD_Result wbd_admin_clock(struct wbd_req *req, const struct wbd_call *c); /* GET reads, POST moves */

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

/* ---- events.c, webhooks.c: E2B's lifecycle events ---- */
/*
 * E2B's sandbox lifecycle events (events.c) and the webhooks that
 * deliver them (webhooks.c).
 *
 *   events.c    records one event per lifecycle change (the control plane's
 *               hooks call wbd_event_locked under the store lock), keeps them
 *               (memory, and <data_dir>/.state/events/ with --data-dir) for
 *               the retention, serves GET /events/sandboxes[/{id}]
 *   webhooks.c  POST/GET/PATCH/DELETE /events/webhooks[/{id}] and one
 *               delivery thread: signed POSTs (libcurl) to loopback URLs,
 *               retried, optionally duplicated (a knob)
 *
 * Lock order: the store lock, then the events lock, then the webhooks lock;
 * none of these files takes the store lock.
 */

enum wbd_event_type {
  WBD_EV_CREATED = 0,
  WBD_EV_KILLED,
  WBD_EV_PAUSED,
  WBD_EV_RESUMED,
  WBD_EV_UPDATED,
  WBD_EV_CHECKPOINTED,
};

/* Records an event of sb, which the caller holds the store lock on, at
 * at_us (0: now). Call it before a pause or kill changes sb's state: a
 * paused or killed event of a running sandbox carries its execution
 * (started_at, vcpu_count, memory_mb, execution_time up to at_us); an
 * updated event carries set_timeout (sb's lease end). */
void wbd_event_locked(const struct wbd_sandbox *sb, enum wbd_event_type type, int64_t at_us);

/* Start-up (after the data directory is taken) and the end (after the last
 * lifecycle change). 0 or -1. */
int wbd_events_start(void);
void wbd_events_stop(void);

/* Rows of routes.c's table: GET /events/sandboxes (arg 0) and
 * /events/sandboxes/{id} (arg 1); /events/webhooks[/{id}], every method. */
enum MHD_Result wbd_h_events(struct wbd_req *req, const struct wbd_call *c);
enum MHD_Result wbd_h_webhooks(struct wbd_req *req, const struct wbd_call *c);

/* Knobs (POST /_warmboxd/config, read atomically): the pause between two
 * attempts of a delivery (ms, E2B's 10 s), how many retries after the first
 * attempt (E2B's 3), and whether each delivery that succeeded is sent once
 * more (E2B warns that an event may arrive twice). */
extern int wbd_webhook_retry_ms, wbd_webhook_retries, wbd_webhook_duplicates;
/* Event retention in days (E2B's default 7). */
extern int wbd_events_ttl_days;

/* ---- webhooks.c (events.c calls these) ---- */
int wbd_webhooks_start(void);
void wbd_webhooks_stop(void);
/* Queues the event (its API JSON, borrowed) for the team's webhooks that
 * want its type. Takes the webhooks lock only. */
void wbd_webhooks_publish(const char *team, const char *type, json_t *event);
enum MHD_Result wbd_webhooks_handle(struct wbd_req *req, const char *team);

#endif
