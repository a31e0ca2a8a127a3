/* Placeholder until envd lands. */
#include "runtime.h"
enum MHD_Result wbd_envd_handle(struct wbd_req *req, struct wbd_sandbox *sb) { (void)req; (void)sb; return MHD_NO; }
