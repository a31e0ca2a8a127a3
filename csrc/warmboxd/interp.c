/* Placeholder until the code interpreter lands. */
#include "runtime.h"
enum MHD_Result wbd_interp_handle(struct wbd_req *req, struct wbd_sandbox *sb) { (void)req; (void)sb; return MHD_NO; }
