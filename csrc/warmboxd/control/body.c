/* body.c: a request's JSON body as an object, for every control-plane
 * handler (control.c, knobs.c, fork.c, snapshot_api.c, webhooks.c). Apart
 * from control.c so that a handler below it (webhooks) calls only down. */
#include "control.h"

/* Parses the body as a JSON object. An empty body gives an empty object
 * unless `required` (then 400, as the validator answers). */
json_t *wbd_ctl_body_object(struct wbd_req *req, int required, enum MHD_Result *r) {
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
