/* Placeholder until the data plane lands. */
#include "wbd.h"

enum MHD_Result wbd_dataplane_handle(struct wbd_req *req, struct wbd_sandbox *sb, int port) {
  (void)req; (void)sb; (void)port;
  return MHD_NO;
}
