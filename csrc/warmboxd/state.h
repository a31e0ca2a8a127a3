/*
 * state.h: a sandbox's state on disk, in <data_dir>/.state/:
 *   rtfiles.c   the one copy step: a sandbox's files (root, home, /tmp) out
 *               to a directory and back into a fresh sandbox
 *   snapshot.c  persistent snapshots (E2B's POST /sandboxes/{id}/snapshots,
 *               GET /snapshots, DELETE /templates/{id}, create from one)
 *   fork.c      POST /sandboxes/{id}/fork (a snapshot, started count times)
 *   persist.c   paused sandboxes (record and files) outlive a restart
 * Kernel memory is never on disk: a sandbox started from a snapshot, a fork,
 * or a paused sandbox after a restart boots afresh on the saved files (as
 * after a filesystem-only pause).
 */
#ifndef WBD_STATE_H
#define WBD_STATE_H

#include "wbd.h"

/* <data_dir>/.state/<sub> into buf (made on first use): buf, or NULL. */
const char *wbd_state_dir(const char *sub, char *buf, size_t len);

/* rtfiles.c. Copies the running sandbox's files into dest/files (dest is
 * made; the jail's processes are held still meanwhile when `hold`). 0 or -1. */
int wbd_files_save(struct wbd_sandbox *sb, const char *dest, int hold);
/* Copies src/files into the sandbox's (fresh) runtime, giving what the
 * saved jail's user owned to this one's. 0 or -1. */
int wbd_files_load(struct wbd_sandbox *sb, const char *src);
/* Removes a directory tree (no symlink followed). */
void wbd_files_remove(const char *dir);
/* Writes `o` (stolen) as dir/name, atomically. 0 or -1. */
int wbd_state_write_json(const char *dir, const char *name, json_t *o);

/* snapshot.c, with the routes of fork.c */
const char *wbd_state_route(const char *method, const char *path);
int wbd_state_owns(const char *route);
enum MHD_Result wbd_state_handle(struct wbd_req *req, const char *route, const char *team);
struct wbd_snapshot;
/* The team's snapshot named by `ref` (its id, "id:tag", name or "name:tag"),
 * referenced, or NULL. */
struct wbd_snapshot *wbd_snapshot_get(const char *team, const char *ref);
void wbd_snapshot_put(struct wbd_snapshot *s);   /* NULL is fine */
const char *wbd_snapshot_template(const struct wbd_snapshot *s);
/* Adds the snapshot's envVars to `env`. */
void wbd_snapshot_env(const struct wbd_snapshot *s, json_t *env);
/* wbd_ctl_launch's fill: the snapshot's files into sb (cls: the snapshot). */
int wbd_snapshot_fill(struct wbd_sandbox *sb, void *cls);
/* Takes a snapshot of the team's running sandbox `id`: 0 and a referenced
 * *out, or 404 / 409 / 500. */
int wbd_snapshot_take(const char *team, const char *id, const char *name, struct wbd_snapshot **out);
/* Holds the team's running sandbox `id` still while its files are copied
 * to dir/files; *rec gets its record (wbd_persist_record_json). 0, 404,
 * 409 (a snapshot of it is being taken), paused_status when it is paused,
 * or 500. */
int wbd_state_capture(const char *team, const char *id, const char *dir, int paused_status, json_t **rec);
/* Loads the snapshots kept in the data directory (start-up). */
void wbd_snapshot_load_all(void);
void wbd_snapshot_free_all(void);

/* fork.c */
enum MHD_Result wbd_fork_handle(struct wbd_req *req, const char *team, const char *id);

/* persist.c. The hooks control.c calls (without the store lock): */
int wbd_persist_save(struct wbd_sandbox *sb);      /* paused: record and files to disk; 0 or -1 */
int wbd_persist_restore(struct wbd_sandbox *sb);   /* resuming: files back when they are on disk only */
void wbd_persist_drop(struct wbd_sandbox *sb);     /* resumed or killed: forget the copy */
/* A record as JSON (under the store lock): every field a restart or a
 * fork needs. */
json_t *wbd_persist_record_json(const struct wbd_sandbox *sb);
/* Fills a fresh record from that JSON; `identity`: also its id, team,
 * token and times (a restart), else only what a fork inherits. 0 or -1. */
int wbd_persist_record_apply(struct wbd_sandbox *sb, json_t *o, int identity);
/* Start-up: cleans what a killed warmboxd left and loads the paused records. */
int wbd_persist_load_all(void);
/* Shutdown: running sandboxes that pause at their timeout are paused
 * (files only) now, so that they come back after the restart. */
void wbd_persist_shutdown(void);

#endif
