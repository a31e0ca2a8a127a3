/*
 * state.h: the state layer (state/): sandbox records (store.c), their
 * metrics samples (metrics.c) and a sandbox's state on disk, in
 * <data_dir>/.state/. Layers, each calling only down (the routes above it
 * are control/'s: snapshot_api.c, fork.c; control.c calls snapshot.c in
 * create and persist.c's hooks):
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

/* ---- store.c: records and indexes (the *_locked functions need wbd_store_lock) ---- */

struct wbd_team;

/* A record as the store keeps it; `sb` first so the two pointers convert. */
struct wbd_rec {
  struct wbd_sandbox sb;
  int busy;                      /* a pause/resume/create is in flight (WBD_BUSY_*) */
  int changing;                  /* data-plane requests that may change its files, in flight */
  int indexed;                   /* in the hash and the team's index */
  struct wbd_rec *hnext;         /* hash chain */
  struct wbd_rec *rprev, *rnext; /* the team's running list */
  struct wbd_team *team;
  size_t hidx;  /* 1 + position in the lease heap; 0: not in it */
  size_t sidx;  /* 1 + position in the signing index; 0: not in it */
  long held_mb; /* what it adds to its team's held_mb now */
};
#define WBD_REC(s)        ((struct wbd_rec *)(s))
#define WBD_BUSY_PAUSING  2 /* busy: a pause (and its copy) */
#define WBD_BUSY_SNAPSHOT 3 /* busy: a snapshot's or a fork's copy */

struct wbd_team {
  char name[64];
  struct wbd_rec **v; /* ordered: startedAt asc, id desc (the asc listing) */
  size_t n, cap;
  struct wbd_rec *run_head;      /* running records, any order */
  int running, paused, reserved; /* reserved: creates/resumes in flight */
  long held_mb, reserved_mb;     /* memoryMB held in host RAM (running, and paused_ram), and
                                  * that creates/resumes in flight will hold */
  struct wbd_team *next;
};

/* A new record: fresh id, refcount 1 (the store's), empty metadata/env. */
struct wbd_sandbox *wbd_store_alloc(const char *team);
/* Gives sb a fresh trafficAccessToken ("ta_" + 64 random hex): its ports
 * other than envd's then need it (network.allowPublicTraffic false). */
void wbd_sandbox_traffic_token(struct wbd_sandbox *sb);
/* Frees a record that was never inserted. */
void wbd_store_discard(struct wbd_sandbox *sb);
/* The team's record with that id (not killed), referenced, or NULL (takes the lock). */
struct wbd_sandbox *wbd_store_team_ref(const char *team, const char *id);
struct wbd_team *wbd_store_team_locked(const char *team, int create);
void wbd_store_insert_locked(struct wbd_sandbox *sb);
/* Bulk insert (seed): one sort at the end. */
void wbd_store_insert_many_locked(struct wbd_sandbox **v, size_t n);
void wbd_store_remove_locked(struct wbd_sandbox *sb);
/* Sets a record's lease end (end_at_us), keeping the lease heap right: use
 * it for every record already inserted. */
void wbd_store_set_end_locked(struct wbd_sandbox *sb, int64_t end_at_us);
/* The running records whose lease ended by `now` and that no operation is
 * busy with, each referenced (release with wbd_store_unref_locked); *n is
 * their number. Costs what expired, not what is running (a min-heap on
 * end_at_us holds every running record). NULL when none. */
struct wbd_sandbox **wbd_store_expired_locked(int64_t now, size_t *n);
/* Moves a record to a new startedAt and/or state, keeping indexes right. */
void wbd_store_update_locked(struct wbd_sandbox *sb, int64_t started_at_us, enum wbd_state st);
struct wbd_sandbox *wbd_store_lookup_locked(const char *id);
void wbd_store_ref_locked(struct wbd_sandbox *sb);
void wbd_store_unref_locked(struct wbd_sandbox *sb);
/* Waits (releasing the lock) until no operation is in flight on sb. */
void wbd_store_wait_idle_locked(struct wbd_sandbox *sb);
void wbd_store_set_busy_locked(struct wbd_sandbox *sb, int busy);
/* Sets sb->paused_ram, keeping its team's held_mb right. */
void wbd_store_set_paused_ram_locked(struct wbd_sandbox *sb, int in_ram);
/* The memoryMB a record holds in host RAM when running (its template's). */
long wbd_store_rec_mb(const struct wbd_sandbox *sb);
/* A data-plane request that may change the sandbox's files or start a
 * process: 0 and counted, or the busy value it is refused for (a pause, a
 * snapshot or a fork copies the files meanwhile), or -1 when the sandbox no
 * longer runs. End each counted one; wait_changes waits (releasing the
 * lock) until none is in flight. */
int wbd_store_change_begin_locked(struct wbd_sandbox *sb);
void wbd_store_change_end_locked(struct wbd_sandbox *sb);
void wbd_store_wait_changes_locked(struct wbd_sandbox *sb);
/* Index in team->v of the first record ordered after (started, id) in asc order. */
size_t wbd_store_upper_locked(struct wbd_team *t, int64_t started_us, const char *id);
/* Index of the first record not ordered before (started, id) in asc order. */
size_t wbd_store_lower_locked(struct wbd_team *t, int64_t started_us, const char *id);
void wbd_store_counts_locked(long *running, long *paused);
struct wbd_team *wbd_store_teams_locked(void);
void wbd_store_free_all(void);

/* ---- metrics.c ---- */
/* GET /sandboxes/{id}/metrics and GET /sandboxes/metrics. */
enum MHD_Result wbd_metrics_one(struct wbd_req *req, const char *team, const char *id);
enum MHD_Result wbd_metrics_many(struct wbd_req *req, const char *team);
/* envd's GET /metrics body for a referenced sandbox (a new sample). */
json_t *wbd_metrics_envd(struct wbd_sandbox *sb);

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
  long long bytes; /* written (also added to *pool) */
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
  int max_snapshots;      /* --max-snapshots: per team (default 100) */
  int snapshot_max_age_s; /* --snapshot-max-age: a snapshot older is deleted (default 0: never) */
  int max_state_mb;       /* --max-state-mb: a team's snapshots and paused copies (default 8192) */
  int min_free_mb;        /* --min-free-mb: free space a copy leaves in the data directory (default 1024) */
  int pause_workers;      /* --pause-workers: lease-end pauses at once (default 4) */
  int copy_ms;            /* POST /_warmboxd/config's copy_ms: a copy starts this late (wbd_knob) */
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
int wbd_persist_restore(struct wbd_sandbox *sb); /* resuming: files back when they are on disk only */
void wbd_persist_drop(struct wbd_sandbox *sb);   /* resumed or killed: forget the copy */
/* A pause without memory, saved: the files stay on disk only (a copy made
 * now without --data-dir) and the runtime that held them in RAM goes
 * (wbd_rt_release); the resume brings them back (wbd_persist_restore).
 * 0, or -1: the sandbox keeps its runtime. */
int wbd_persist_release(struct wbd_sandbox *sb);
/* Start-up: takes the data directory (an flock: one server each), cleans
 * what a killed warmboxd left, loads the paused records. 0 or -1. */
int wbd_persist_load_all(void);
void wbd_persist_close(void); /* lets go of the data directory */
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
void wbd_snapshot_put(struct wbd_snapshot *s); /* NULL is fine */
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
int wbd_snapshot_delete(const char *team, const char *ref); /* 0, or -1: none */
/* A snapshot name: [A-Za-z0-9._-]{1,128}, optionally ":tag". */
int wbd_snapshot_name_ok(const char *name);
void wbd_snapshot_load_all(void); /* start-up, with --data-dir */
void wbd_snapshot_free_all(void);

#endif
