/*
 * envd_watch.h: envd's directory watchers (filesystem.Filesystem/WatchDir,
 * a server stream, and the polled CreateWatcher / GetWatcherEvents /
 * RemoveWatcher), on inotify in warmboxd over the sandbox's own trees.
 *
 * Watchers belong to their sandbox: at most WBD_WATCH_MAX per sandbox
 * (streams and polled ones together), at most WBD_WATCH_MAX_DIRS watched
 * directories each (a recursive watch) and WBD_WATCH_SANDBOX_DIRS for all
 * of a sandbox's watchers together, and all of them end when the
 * sandbox stops running (kill or pause): a stream is dropped as a process
 * stream is, a polled watcher is freed (its id is then not found).
 */
#ifndef WBD_ENVD_WATCH_H
#define WBD_ENVD_WATCH_H

#include "wbd.h"

#define WBD_WATCH_MAX 32
#define WBD_WATCH_MAX_DIRS 4096
#define WBD_WATCH_SANDBOX_DIRS 8192

/* Serves the request when its path is one of the four watcher RPCs:
 * returns 1 with *r set; 0 (nothing sent) for any other path. The access
 * token was checked by the data plane. */
int wbd_envd_watch_route(struct wbd_req *req, struct wbd_sandbox *sb, enum MHD_Result *r);

#endif
