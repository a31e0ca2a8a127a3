/*
 * state.h: a sandbox's state on disk, in <data_dir>/.state/. Layers, each
 * calling only down:
 *   snapshot_api.c  the routes (snapshots, fork) in front of control.c's,
 *                   and the graceful stop; calls fork.c, control.c and below
 *   fork.c          POST /sandboxes/{id}/fork (calls control.c's launch)
 *   control.c       calls snapshot.c (create from a snapshot), persist.c (hooks)
 *   snapshot.c      the snapshots: kept in memory and on disk
 *   persist.c       paused sandboxes (record and files) outlive a restart;
 *                   the copy of a running sandbox (held still) for both
 *   rtfiles.c       the one copy step: a sandbox's files (root, home, /tmp)
 *                   out to a directory and back into a fresh sandbox
 *   treecopy.c      the copy itself: descriptor-relative, no symlink followed
 *   quota.c         what a team may keep on disk; the free-space reserve
 * Kernel memory is never on disk: a sandbox started from a snapshot, a fork,
 * or a paused sandbox after a restart boots afresh on the saved files (as
 * after a filesystem-only pause). The one exception: a snapshot's or fork's
 * copy also holds the default python context's user namespace, serialised
 * with dill (dir/kernel.json, next to dir/files; interp.c), which the new
 * sandbox's first python kernel loads before its first cell; names that
 * could not be carried are listed in its `warmbox_unrestored` dict.
 */
#ifndef WBD_STATE_H
#define WBD_STATE_H

#include "wbd.h"

/* The python namespace's dump next to a copy's files (persist.c, rtfiles.c). */
#define KERNEL_DUMP "kernel.json"

/* ---- treecopy.c ---- */
/* One copy's bounds and outcome. budget: bytes it may write (-1: no
 * bound; over it: ENOSPC); pool (may be NULL): a shared count the bytes
 * are added to as they are written, pool_limit its bound (-1: none; over
 * it: EDQUOT). remap: what from_uid/from_gid owned becomes to_uid/to_gid's.
 * On failure err is the errno and msg says which entry and why. */
struct wbd_copy {
  long long budget, pool_limit;
  long long *pool;
  int remap;
  uid_t from_uid, to_uid;
  gid_t from_gid, to_gid;
  long long bytes;         /* written (also added to *pool) */
  int err;
  char msg[768];
};
/* Copies directory sparent/name to dparent/name (merged into a directory
 * already there), descriptor-relative, no symlink followed at any level
 * (treecopy.c says what is kept). 0, or -1 with c->err and c->msg. */
int wbd_copy_tree(int sparent, const char *name, int dparent, struct wbd_copy *c);
/* A failed copy's HTTP status: 507 (disk full), 429 (the team's storage
 * limit), 500 (anything else). */
int wbd_copy_status(const struct wbd_copy *c);

/* ---- quota.c ---- */
/* What a team may keep on disk and how the copies are made (main.c's
 * flags; 0: no limit). */
struct wbd_state_limits {
  int max_snapshots;   /* --max-snapshots: per team (default 100) */
  int max_state_mb;    /* --max-state-mb: a team's snapshots and paused copies (default 8192) */
  int min_free_mb;     /* --min-free-mb: free space a copy leaves in the data directory (default 1024) */
  int pause_workers;   /* --pause-workers: lease-end pauses at once (default 4) */
  int copy_ms;         /* POST /_warmboxd/config's copy_ms: a copy starts this late (wbd_knob) */
};
extern struct wbd_state_limits wbd_state_lim;
/* Before a copy for `team` (snapshot: a snapshot's, counted among the
 * team's): fills c's budget and pool, or answers 429 (the team's count or
 * bytes) / 507 (the data directory's free space) with c->msg. */
int wbd_quota_begin(const char *team, int snapshot, struct wbd_copy *c);
/* Gives back what a copy held: bytes, and the snapshot's place. */
void wbd_quota_end(const char *team, int snapshot, long long bytes);
/* Counts a copy found on disk at start-up. */
void wbd_quota_add(const char *team, int snapshot, long long bytes);
void wbd_quota_free_all(void);

/* ---- rtfiles.c ---- */
/* <data_dir>/.state/<sub> into buf (made on first use): buf, or NULL. */
const char *wbd_state_dir(const char *sub, char *buf, size_t len);
/* Copies the running sandbox's files into dest/files (dest is made; the
 * jail's processes are held still meanwhile when `hold`) within c's
 * bounds. 0 or -1 (c says why). */
int wbd_files_save(struct wbd_sandbox *sb, const char *dest, int hold, struct wbd_copy *c);
/* Copies src/files into the sandbox's (fresh) runtime, giving what the
 * saved jail's user owned to this one's. 0 or -1. */
int wbd_files_load(struct wbd_sandbox *sb, const char *src);
/* Removes a directory tree (no symlink followed). */
void wbd_files_remove(const char *dir);
/* Writes `o` (stolen) as dir/name, atomically. 0 or -1. */
int wbd_state_write_json(const char *dir, const char *name, json_t *o);

/* ---- persist.c ---- */
/* A record as JSON (under the store lock): every field a restart or a
 * fork needs. */
json_t *wbd_persist_record_json(const struct wbd_sandbox *sb);
/* Fills a fresh record from that JSON; `identity`: also its id, team,
 * token and times (a restart), else only what a fork inherits. 0 or -1. */
int wbd_persist_record_apply(struct wbd_sandbox *sb, json_t *o, int identity);
/* The hooks control.c calls (without the store lock): */
/* paused: record and files to disk; 0, or 429 / 507 / 500 with msg */
int wbd_persist_save(struct wbd_sandbox *sb, char *msg, size_t len);
int wbd_persist_restore(struct wbd_sandbox *sb);   /* resuming: files back when they are on disk only */
void wbd_persist_drop(struct wbd_sandbox *sb);     /* resumed or killed: forget the copy */
/* Start-up: takes the data directory (an flock: one server each), cleans
 * what a killed warmboxd left, loads the paused records. 0 or -1. */
int wbd_persist_load_all(void);
void wbd_persist_close(void);                      /* lets go of the data directory */
/* Holds the team's running sandbox `id` still while its files are copied
 * to dir/files within c's bounds (envd's changes refused meanwhile); *rec
 * gets its record (wbd_persist_record_json). 0, 404, 409 (a snapshot of it
 * is being taken), paused_status when it is paused, or the copy's failure
 * (wbd_copy_status, c->msg). */
int wbd_state_capture(const char *team, const char *id, const char *dir, int paused_status, json_t **rec,
                      struct wbd_copy *c);

/* ---- snapshot.c ---- */
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
/* The source's size (cpuCount, memoryMB) onto a sandbox made from it. */
void wbd_snapshot_size(const struct wbd_snapshot *s, struct wbd_sandbox *sb);
/* Takes a snapshot of the team's running sandbox `id`: 0 and a referenced
 * *out, or 404 / 409, or 429 / 507 / 500 with msg (quota.c, the copy). */
int wbd_snapshot_take(const char *team, const char *id, const char *name, struct wbd_snapshot **out, char *msg,
                      size_t len);
/* E2B's SnapshotInfo {snapshotID, names}. */
json_t *wbd_snapshot_info(struct wbd_snapshot *s);
/* One page of the team's snapshots, newest first, after (after_us,
 * after_id) when after_id is given; filters may be NULL. next gets the token
 * of the next page, "" when this is the last. */
json_t *wbd_snapshot_page(const char *team, const char *sandbox_id, const char *name, long long after_us,
                          const char *after_id, long limit, char *next, size_t nlen);
int wbd_snapshot_delete(const char *team, const char *ref);   /* 0, or -1: none */
/* A snapshot name: [A-Za-z0-9._-]{1,128}, optionally ":tag". */
int wbd_snapshot_name_ok(const char *name);
void wbd_snapshot_load_all(void);                /* start-up, with --data-dir */
void wbd_snapshot_free_all(void);

/* ---- fork.c ---- */
enum MHD_Result wbd_fork_handle(struct wbd_req *req, const char *team, const char *id);

/* ---- snapshot_api.c (main.c's route table) ---- */
const char *wbd_state_route(const char *method, const char *path);
enum MHD_Result wbd_state_control(struct wbd_req *req, const char *route);
/* Shutdown: running sandboxes that pause at their timeout are paused
 * (files only) now, so that they come back after the restart. */
void wbd_state_shutdown(void);

#endif
