/* Placeholder until the data plane lands: routes by port. */
#include "runtime.h"

enum MHD_Result wbd_dataplane_handle(struct wbd_req *req, struct wbd_sandbox *sb, int port) {
  if (port == 49999) return wbd_interp_handle(req, sb);
  return wbd_envd_handle(req, sb);
}
