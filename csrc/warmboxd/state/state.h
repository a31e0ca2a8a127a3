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
  int busy;                    /* a pause/resume/create is in flight */
  int indexed;                 /* in the hash and the team's index */
  struct wbd_rec *hnext;       /* hash chain */
  struct wbd_rec *rprev, *rnext;  /* the team's running list */
  struct wbd_team *team;
  size_t hidx;                 /* 1 + position in the lease heap; 0: not in it */
  size_t sidx;                 /* 1 + position in the signing index; 0: not in it */
  long held_mb;                /* what it adds to its team's held_mb now */
};
#define WBD_REC(s) ((struct wbd_rec *)(s))

struct wbd_team {
  char name[64];
  struct wbd_rec **v;          /* ordered: startedAt asc, id desc (the asc listing) */
  size_t n, cap;
  struct wbd_rec *run_head;    /* running records, any order */
  int running, paused, reserved;  /* reserved: creates/resumes in flight */
  long held_mb, reserved_mb;   /* memoryMB held in host RAM (running, and paused_ram), and
                                * that creates/resumes in flight will hold */
  struct wbd_team *next;
};

/* A new record: fresh id, refcount 1 (the store's), empty metadata/env. */
struct wbd_sandbox *wbd_store_alloc(const char *team);
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

/* ---- rtfiles.c ---- */
/* <data_dir>/.state/<sub> into buf (made on first use): buf, or NULL. */
const char *wbd_state_dir(const char *sub, char *buf, size_t len);
/* Copies the running sandbox's files into dest/files (dest is made; the
 * jail's processes are held still meanwhile when `hold`). 0 or -1. */
int wbd_files_save(struct wbd_sandbox *sb, const char *dest, int hold);
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
int wbd_persist_save(struct wbd_sandbox *sb);      /* paused: record and files to disk; 0 or -1 */
int wbd_persist_restore(struct wbd_sandbox *sb);   /* resuming: files back when they are on disk only */
void wbd_persist_drop(struct wbd_sandbox *sb);     /* resumed or killed: forget the copy */
/* A pause without memory, saved: the files stay on disk only (a copy made
 * now without --data-dir) and the runtime that held them in RAM goes
 * (wbd_rt_release); the resume brings them back (wbd_persist_restore).
 * 0, or -1: the sandbox keeps its runtime. */
int wbd_persist_release(struct wbd_sandbox *sb);
/* Start-up: takes the data directory (an flock: one server each), cleans
 * what a killed warmboxd left, loads the paused records. 0 or -1. */
int wbd_persist_load_all(void);
void wbd_persist_close(void);                      /* lets go of the data directory */
/* Holds the team's running sandbox `id` still while its files are copied
 * to dir/files; *rec gets its record (wbd_persist_record_json). 0, 404,
 * 409 (a snapshot of it is being taken), paused_status when it is paused,
 * or 500. */
int wbd_state_capture(const char *team, const char *id, const char *dir, int paused_status, json_t **rec);

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
/* Takes a snapshot of the team's running sandbox `id`: 0 and a referenced
 * *out, or 404 / 409 / 500. */
int wbd_snapshot_take(const char *team, const char *id, const char *name, struct wbd_snapshot **out);
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

#endif
