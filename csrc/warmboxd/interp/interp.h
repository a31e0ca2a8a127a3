/*
 * interp.h: the code interpreter layer (interp/): port 49999 of every
 * sandbox (interp.c), as the data plane and the state on disk call it.
 */
#ifndef WBD_INTERP_H
#define WBD_INTERP_H

#include "wbd.h"

/* Routes for port 49999. Must reply. */
enum MHD_Result wbd_interp_handle(struct wbd_req *req, struct wbd_sandbox *sb);
/* Snapshots and forks: the default python context's user namespace as one
 * {"type": "__wb_dump__", "data", "unrestored"} JSON line (malloc'd), or
 * NULL when that context never ran; waits for a running cell (bounded).
 * wbd_interp_restore gives such a dump to the sandbox's first python kernel. */
char *wbd_interp_dump(struct wbd_sandbox *sb);
void wbd_interp_restore(struct wbd_sandbox *sb, json_t *dump);

#endif
