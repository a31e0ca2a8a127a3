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
