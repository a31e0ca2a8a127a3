/*
 * control.h: what the control-plane files share (control.c, list.c,
 * knobs.c): request-body helpers, auth, the listed view of a record, the
 * list handlers and their parsers (also the fuzz targets' entry points).
 */
#ifndef WBD_CONTROL_H
#define WBD_CONTROL_H

#include "wbd_int.h"

#define US 1000000LL
#define VERR "validation error: request body has an error: "

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

#define NOT_FOUND_FMT "Sandbox \"%s\" doesn't exist or you don't have access to it"

/* The {id} of a /sandboxes/{id}... or /v2/sandboxes/{id}... path: 0, or -1
 * when malformed (400 "Invalid sandbox ID"). */
int wbd_ctl_path_id(const char *path, char *id, size_t len);
/* `Sandbox`, as create/connect/resume/fork answer. Under the store lock. */
json_t *wbd_ctl_sandbox_json(const struct wbd_sandbox *sb);
/* The team's record with that id, not killed, referenced; or NULL. */
struct wbd_sandbox *wbd_ctl_find_ref(const char *team, const char *id);
/* Starts a new record (wbd_store_alloc'd and filled in, not inserted) for a
 * lease of `to` seconds: reserves a place under the team's cap, makes its
 * runtime, lets `fill` (may be NULL) put files in it, inserts it running.
 * 0 and *out (its `Sandbox`), or 429 / 500 (the record is then freed). */
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

#endif
