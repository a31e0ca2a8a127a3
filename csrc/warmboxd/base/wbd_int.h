/*
 * wbd_int.h: what the control-plane files (main.c, server.c, store.c,
 * control.c, list.c, knobs.c) share beyond wbd.h. The data plane never
 * includes this.
 *
 * Layers, each calling only down: main.c wires the handlers (control.c,
 * knobs.c, list.c) into server.c through struct wbd_routes; the handlers
 * call server.c's reply functions and store.c; server.c calls store.c (and
 * the handlers only through the table); clock.c calls none of them.
 */
#ifndef WBD_INT_H
#define WBD_INT_H

#include "wbd.h"

#define WBD_CLIENT_ID "6532622b"
#define WBD_ENVD_VERSION "0.6.4"
#define WBD_CPU_COUNT 2
#define WBD_MEMORY_MB 512   /* a template not in config.c's table */
#define WBD_DISK_MB 1024
/* The control plane's 404 for a sandbox id */
#define NOT_FOUND_FMT "Sandbox \"%s\" doesn't exist or you don't have access to it"

/* Options changed at run time by POST /_warmboxd/config are read and written
 * atomically (handlers run on many threads). */
static inline int wbd_knob(const int *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void wbd_knob_set(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
extern int wbd_loose_metadata;

void wbd_sleep_ms(int ms);

/* ---- store.c: records and indexes (the *_locked functions need wbd_store_lock) ---- */

struct wbd_team;

/* A record as the store keeps it; `sb` first so the two pointers convert. */
struct wbd_rec {
  struct wbd_sandbox sb;
  int busy;                    /* a pause/resume/create is in flight (WBD_BUSY_*) */
  int changing;                /* data-plane requests that may change its files, in flight */
  int indexed;                 /* in the hash and the team's index */
  struct wbd_rec *hnext;       /* hash chain */
  struct wbd_rec *rprev, *rnext;  /* the team's running list */
  struct wbd_team *team;
  size_t hidx;                 /* 1 + position in the lease heap; 0: not in it */
  size_t sidx;                 /* 1 + position in the signing index; 0: not in it */
};
#define WBD_REC(s) ((struct wbd_rec *)(s))
#define WBD_BUSY_PAUSING 2     /* busy: a pause (and its copy) */
#define WBD_BUSY_SNAPSHOT 3    /* busy: a snapshot's or a fork's copy */

struct wbd_team {
  char name[64];
  struct wbd_rec **v;          /* ordered: startedAt asc, id desc (the asc listing) */
  size_t n, cap;
  struct wbd_rec *run_head;    /* running records, any order */
  int running, paused, reserved;  /* reserved: creates/resumes in flight */
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
/* A data-plane request that may change the sandbox's files or start a
 * process: 0 and counted, or the busy value it is refused for (a pause, a
 * snapshot or a fork copies the files meanwhile), or -1 when the sandbox no
 * longer runs. End each counted one;
 * wait_changes waits (releasing the lock) until none is in flight. */
int wbd_store_change_begin_locked(struct wbd_sandbox *sb);
void wbd_store_change_end_locked(struct wbd_sandbox *sb);
void wbd_store_wait_changes_locked(struct wbd_sandbox *sb);
/* Index in team->v of the first record ordered after (started, id) in asc order. */
size_t wbd_store_upper_locked(struct wbd_team *t, int64_t started_us, const char *id);
/* Index of the first record not ordered before (started, id) in asc order. */
size_t wbd_store_lower_locked(struct wbd_team *t, int64_t started_us, const char *id);
void wbd_store_counts_locked(long *running, long *paused);
/* The running secure sandbox whose access token makes `match` true (a
 * signed /files URL names no sandbox: the signature is what finds it).
 * Walks the secure running records (only those: a sandbox without a token
 * is never found this way) 256 per hold of the store lock, testing them
 * outside it; a record that stays running throughout is never skipped.
 * 1 with its id in `id`, or 0. Takes the store lock itself. */
int wbd_store_find_signed(int (*match)(const char *token, void *cls), void *cls, char *id, size_t idlen);
struct wbd_team *wbd_store_teams_locked(void);
void wbd_store_free_all(void);

/* ---- control.c, knobs.c ---- */
enum MHD_Result wbd_control_handle(struct wbd_req *req, const char *route);
/* metrics.c: GET /sandboxes/{id}/metrics and GET /sandboxes/metrics. */
enum MHD_Result wbd_metrics_one(struct wbd_req *req, const char *team, const char *id);
enum MHD_Result wbd_metrics_many(struct wbd_req *req, const char *team);
/* envd's GET /metrics body for a referenced sandbox (a new sample). */
json_t *wbd_metrics_envd(struct wbd_sandbox *sb);
/* knobs.c: the admin API, /_warmboxd/... (stats, faults, config, seed,
 * clock), once server.c's gate let the request in. */
enum MHD_Result wbd_knob_handle(struct wbd_req *req);
/* Route template for a control-plane request ("GET /sandboxes/{id}"), or NULL. */
const char *wbd_control_route(const char *method, const char *path);
/* Whether X-API-Key names a team (the same test the handlers make). */
int wbd_control_key_ok(const char *key);
/* A data-plane request for sandbox `id` on `port`: finds it, auto-resumes it
 * when paused, hands it to wbd_dataplane_handle. */
enum MHD_Result wbd_control_dataplane(struct wbd_req *req, const char *id, int port);
int wbd_lifecycle_start(void);
void wbd_lifecycle_stop(void);
/* Pauses or kills every sandbox past its end now (what the lifecycle thread
 * does every 100 ms), in the calling thread. */
void wbd_lifecycle_expire_now(void);

/* ---- server.c ---- */

/* What the server calls for each kind of request. main.c fills this in
 * (server.c knows no handler by name: every layer only calls down). */
struct wbd_routes {
  const char *(*control_route)(const char *method, const char *path);
  int (*control_key_ok)(const char *key);
  enum MHD_Result (*control)(struct wbd_req *req, const char *route);
  enum MHD_Result (*dataplane)(struct wbd_req *req, const char *id, int port);
  /* whether a data-plane request may send its body (token / signature) */
  int (*dataplane_body_ok)(struct wbd_req *req, struct wbd_sandbox *sb);
  /* the bytes an upload to the sandbox may bring (its disk's free space), -1: unknown */
  long long (*upload_room)(struct wbd_sandbox *sb);
  enum MHD_Result (*admin)(struct wbd_req *req);   /* past the admin gate; NULL: 404 */
};
void wbd_server_routes(const struct wbd_routes *r);

/* The request counts GET /_warmboxd/stats shows: {"requests": {route: n},
 * "counters": {name: n} (wbd_stat_add), "total_requests": n}, the admin
 * API's own requests not counted. */
json_t *wbd_stats_json(void);
void wbd_stats_reset(void);

/* A fault the server injects into the next `count` requests of `route` (a
 * route template as the stats name it, or "*"), before their handler: a
 * delay, then a dropped connection, or an answer with `status` (0: none,
 * the request goes on), `body` (NULL: an E2B error body) and `headers`. */
struct wbd_fault {
  char *route;       /* malloc'd */
  long count;
  unsigned status;
  char *body;        /* malloc'd, or NULL */
  json_t *headers;   /* an object of strings (a reference), or NULL */
  int delay_ms;
  int drop;
  struct wbd_fault *next;
};
/* Queues f after the faults already queued; the server owns it (and what
 * it points to) from here. A count <= 0 frees it at once. */
void wbd_fault_add(struct wbd_fault *f);
void wbd_faults_clear(void);

/* Server limits (main.c's flags). Body limits are per route class, checked
 * against Content-Length when the headers are in and again while the body
 * streams, once the route and the caller's credentials are known. */
struct wbd_limits {
  const char *admin_token;     /* required on the admin API (X-Warmboxd-Token) */
  int conn_timeout_s;          /* idle connection / slow headers, default 30 */
  int max_conns;               /* connections in total, default 1024 */
  int max_conns_per_ip;        /* connections per client address, default 128 */
  int max_upload_mb;           /* envd POST /files body, default 100 */
  int body_timeout_s;          /* a request body must be in within this, default 120 */
  int max_spool_mb;            /* upload bodies spooled at once, all sandboxes, default 1024 */
};
extern struct wbd_limits wbd_lim;
#define WBD_ADMIN_HEADER "X-Warmboxd-Token"
#define WBD_BODY_CONTROL ((size_t)1 << 20)     /* control plane and admin JSON */
#define WBD_BODY_DATA ((size_t)16 << 20)       /* data-plane RPCs, /execute */
#define WBD_BODY_UNAUTH ((size_t)64 << 10)     /* no or wrong credentials: enough for the 401 */
/* E2B-style bounds on a sandbox's metadata and envVars (control.c). */
#define WBD_MAP_MAX_KEYS 1000
#define WBD_MAP_MAX_KEY 256
#define WBD_META_MAX_BYTES (64 << 10)          /* keys + values */
#define WBD_ENV_MAX_BYTES (256 << 10)

int wbd_server_start(void);        /* binds, fills the port */
int wbd_server_port(void);
void wbd_server_quiesce(void);
void wbd_server_stop(void);

/* defer.c: handlers on workers, streams parked, off the polling threads.
 * wbd_defer_run runs fn(arg) on a worker (-1: stopping, or no thread). */
int wbd_defer_start(void);
void wbd_defer_stop(void);   /* waits for the handlers in flight, resumes every parked stream */
int wbd_defer_run(void (*fn)(void *), void *arg);
void wbd_stats_free(void);

#endif
