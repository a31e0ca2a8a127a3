/*
 * wbd.h: the contract between warmboxd's layers (the folders beside base/:
 * server/ the HTTP server, control/ the control plane and admin API,
 * state/ records and what is kept on disk, jail/ sandbox directories and
 * bubblewrap jails, envd/ and interp/ the data plane; main.c wires them).
 * Every layer may include it; which layer may include which other's header
 * is written in scripts/warmboxd_layers.lua.
 *
 * Threading: libmicrohttpd's few polling threads serve every connection; a
 * request's handler runs on a worker thread of its own, so it may block, and
 * a streamed answer's reader never does (it parks: wbd_park). A lifecycle thread expires
 * leases. Sandbox records live in the store behind one mutex (wbd_store_lock);
 * never hold it while waiting on a process or on the network.
 */
#ifndef WBD_H
#define WBD_H

#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <microhttpd.h>
#include <jansson.h>

/* ------------------------------------------------------------------ */
/* Requests and responses (server.c)                                   */
/* ------------------------------------------------------------------ */

struct wbd_req {
  struct MHD_Connection *conn;
  const char *method; /* "GET", "POST", ... */
  const char *path;   /* URL path, no query string */
  char *body;         /* whole request body, NUL-terminated (body[body_len] == 0) */
  size_t body_len;
  int body_fd; /* >= 0: the body (body_len bytes) is in this unlinked file, read from
                * offset 0, and `body` is ""; only envd's POST /files gets one */
  int replied; /* set by the wbd_reply_* functions */
};

/* Case-insensitive header lookup; NULL when absent. */
const char *wbd_req_header(struct wbd_req *req, const char *name);
/* Decoded query argument; NULL when absent. */
const char *wbd_req_query(struct wbd_req *req, const char *name);

/* Each reply function queues exactly one response and returns MHD_YES/MHD_NO
 * for the access handler to return. Extra headers: NULL-terminated list of
 * "Name", "value" pairs, or NULL. */
enum MHD_Result wbd_reply_json(struct wbd_req *req, unsigned status, json_t *body /* stolen, may be NULL for no body */,
                               const char *const *headers);
/* E2B's error body: {"code": status, "message": "..."} */
enum MHD_Result wbd_reply_error(struct wbd_req *req, unsigned status, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
enum MHD_Result wbd_reply_raw(struct wbd_req *req, unsigned status, const char *content_type /* may be NULL */,
                              const void *data, size_t len, const char *const *headers);
/* Streamed body. `reader` follows MHD_ContentReaderCallback and runs on one
 * of the server's few polling threads, so it never blocks: with nothing to
 * send yet it parks the connection (wbd_park) and returns 0. `done` is called
 * once when the response is finished or the client went away (use it to
 * interrupt a kernel). Handlers themselves run on a worker thread of their
 * own and may block. */
enum MHD_Result wbd_reply_stream(struct wbd_req *req, unsigned status, const char *content_type,
                                 MHD_ContentReaderCallback reader, void *cls, MHD_ContentReaderFreeCallback done,
                                 const char *const *headers);
/* From a stream's reader only: suspends the connection until `data_fd` is
 * readable, `conn_fd` (the client's socket, or -1) hangs up, or timeout_ms
 * passes, whichever is first; then the reader is called again (and looks
 * again: nothing is read from either descriptor). 0: parked, the reader
 * returns 0; -1: the server is stopping, the reader ends its stream
 * (MHD_CONTENT_READER_END_WITH_ERROR). Both descriptors must stay open
 * until the response's `done`. */
int wbd_park(struct MHD_Connection *conn, int data_fd, int conn_fd, int timeout_ms);

/* ------------------------------------------------------------------ */
/* Sandbox records (store.c)                                           */
/* ------------------------------------------------------------------ */

enum wbd_state { WBD_RUNNING = 0, WBD_PAUSED = 1, WBD_KILLED = 2 };

struct wbd_rt; /* runtime state, owned by runtime.c; NULL until first needed */

struct wbd_sandbox {
  char id[32];   /* "i" + 20 [a-z0-9] */
  char team[64]; /* which API key owns it */
  char *template_id;
  json_t *metadata;       /* object string->string (never NULL) */
  json_t *env_vars;       /* object string->string (never NULL) */
  char access_token[72];  /* envdAccessToken, "" when not secure */
  char traffic_token[72]; /* trafficAccessToken (network.allowPublicTraffic false), else "" */
  int secure;
  int allow_internet;
  int auto_pause;        /* lifecycle.onTimeout == "pause" */
  int auto_pause_memory; /* default 1; 0: filesystem-only snapshot on auto-pause */
  int auto_resume;
  int timeout_s;               /* timeout given at create (auto-resume lease rule) */
  int cpu_count, memory_mb;    /* the template's size (wbd_sandbox_set_template): cpuCount, memoryMB */
  struct wbd_metrics *metrics; /* metrics.c's samples, NULL before the first (under the store lock) */
  enum wbd_state state;
  int64_t started_at_us;  /* start of the current run, unix microseconds */
  int64_t end_at_us;      /* running: lease end; paused: when it was paused */
  int paused_with_memory; /* last pause kept memory */
  int refcount;           /* under the store lock; record freed at 0 after kill */
  /* data plane bookkeeping (under the store lock) */
  int runs_in_flight;         /* /execute and Process.Start streams now running */
  int64_t last_start_mono_us; /* CLOCK_MONOTONIC of its last Process.Start (a pause lets it settle) */
  int files_on_disk;          /* paused, its files only in the data directory (loaded after a restart,
                               * or released by a pause without memory) */
  int paused_ram;             /* paused with its runtime in host RAM (frozen processes, its tmpfs):
                               * counts toward the team's --max-team-memory-mb; set it with
                               * wbd_store_set_paused_ram_locked once the record is in the store */
  struct wbd_rt *rt;
};

void wbd_store_lock(void);
void wbd_store_unlock(void);
/* Look up by id (any team); returns a referenced record or NULL when unknown
 * or killed. Release with wbd_sandbox_unref. Takes the store lock itself. */
struct wbd_sandbox *wbd_sandbox_get(const char *id);
void wbd_sandbox_unref(struct wbd_sandbox *sb);
/* The running secure sandbox whose access token makes `match` true (a
 * signed /files URL names no sandbox: the signature is what finds it).
 * Walks the secure running records (only those: a sandbox without a token
 * is never found this way) 256 per hold of the store lock, testing them
 * outside it; a record that stays running throughout is never skipped.
 * 1 with its id in `id`, or 0. Takes the store lock itself. */
int wbd_store_find_signed(int (*match)(const char *token, void *cls), void *cls, char *id, size_t idlen);

/* One hook the data plane may set, called with the store lock held each
 * time a record stops running (paused, killed or dropped): envd's watchers
 * end there. It must not take the store lock. */
void wbd_store_set_leave_hook(void (*hook)(struct wbd_sandbox *sb));

/* Resume a paused sandbox as the proxy's auto-resume does (E2B's lease rule:
 * create timeout raised to >= 300 s, capped). Returns the HTTP status the
 * proxy would answer on failure (409, 429), or 0 on success. */
int wbd_sandbox_auto_resume(struct wbd_sandbox *sb);

/* ------------------------------------------------------------------ */
/* Runtime hooks (runtime.c); the control plane calls these            */
/* ------------------------------------------------------------------ */

/* Called once at start-up, after options are parsed (checks bubblewrap,
 * prepares wbd_opt.data_dir). Nonzero aborts start-up with a message. */
int wbd_rt_init(void);
/* Called without the store lock held. Return 0 on success. */
int wbd_rt_on_create(struct wbd_sandbox *sb); /* make its directory */
/* What a sandbox's jail uses now, read from its cgroups and its disk tmpfs:
 * the CPU seconds of the processes in its groups (their reaped children
 * included), memory.usage_in_bytes and the page cache in it, the disk's used
 * and total bytes. A part without its group or tmpfs is 0. Returns 0, or -1
 * when the sandbox has no live jail (no process ever ran, or killed). */
struct wbd_usage {
  double cpu_s;
  long long mem_used, mem_cache, disk_used, disk_total;
};
int wbd_rt_usage(struct wbd_sandbox *sb, struct wbd_usage *u);
int wbd_rt_on_pause(struct wbd_sandbox *sb, int memory); /* stop (memory) or end (no memory) its processes */
int wbd_rt_on_resume(struct wbd_sandbox *sb);            /* continue its processes */
/* 1 while a process of the sandbox runs or waits for a CPU (a command that
 * has not settled into waiting yet), else 0. */
int wbd_rt_settling(struct wbd_sandbox *sb);
/* A new TCP socket (IPv4, blocking, close-on-exec) made in the sandbox's
 * network namespace, for warmboxd to connect to one of its ports on its own
 * loopback; -errno (-ENOENT: no namespace: unisolated, or no live jail). */
int wbd_rt_port_socket(struct wbd_sandbox *sb);
void wbd_rt_on_kill(struct wbd_sandbox *sb); /* end processes, remove directory */
/* A paused sandbox whose files are kept on disk gives its runtime up
 * (processes, tmpfs, cgroups, network): what held host RAM. The next use
 * makes a fresh one (as after a restart). 0, or -1 (killed, shutting down). */
int wbd_rt_release(struct wbd_sandbox *sb);
void wbd_rt_shutdown(void); /* warmboxd exits: clean up everything */
/* The name of a sandbox's runtime on the host (its directory under the data
 * directory, its cgroups, bubblewrap's command line): "r" + 20 hex, a keyed
 * hash of the id that only this process can make (out: 22 bytes or more),
 * so nothing the host shows other users carries an id. wbd_rt_is_name: 1
 * for a string of that form (a runtime a killed warmboxd left). */
void wbd_rt_name(const char *id, char *out, size_t len);
int wbd_rt_is_name(const char *s);

/* ------------------------------------------------------------------ */
/* Data plane (dataplane.c); the server calls this                     */
/* ------------------------------------------------------------------ */

/* Called for a request routed to sandbox `sb` (already found, running, and
 * referenced; access token NOT yet checked) on `port` (49983 envd, 49999 code
 * interpreter). Must reply. */
enum MHD_Result wbd_dataplane_handle(struct wbd_req *req, struct wbd_sandbox *sb, int port);
/* ports.c: a request for one of the sandbox's own ports (not envd's, not the
 * interpreter's) sent on to that port on the sandbox's loopback, its answer
 * replied whole: 0 once replied (*r), else the status of the proxy's error
 * to reply (502: nothing listens there, or no namespace to reach it in). */
int wbd_ports_forward(struct wbd_req *req, struct wbd_sandbox *sb, int port, enum MHD_Result *r);
/* Whether a data-plane request may change the sandbox's files or start a
 * process (everything but the reads): refused while the sandbox's files
 * are copied (a pause, a snapshot, a fork). */
int wbd_dataplane_changes(const struct wbd_req *req, int port);
/* The proxy's credential check for a port other than envd's, made before an
 * auto-resume as E2B's: the traffic token (e2b-traffic-access-token) when
 * the sandbox has one; under --secure-all a forwarded port also needs the
 * X-Access-Token or the traffic token. 1 once refused (*r: the 403), else 0. */
int wbd_dataplane_refused(struct wbd_req *req, struct wbd_sandbox *sb, int port, enum MHD_Result *r);

/* ------------------------------------------------------------------ */
/* Stats and options (server.c / config.c)                             */
/* ------------------------------------------------------------------ */

/* Named counters shown by GET /_warmboxd/stats, e.g.
 * wbd_stat_add("exec_overlap", 1), wbd_stat_add("kill_during_run", 1). */
void wbd_stat_add(const char *name, long delta);

struct wbd_options {
  const char *host;
  int port;
  const char *api_key;   /* NULL: any e2b_<hex> key, one team per key */
  int max_length_hours;  /* default 24 */
  int max_running;       /* per team; 0: unlimited (default 20) */
  int default_timeout_s; /* 15, E2B's server default */
  int rtt_ms, create_ms, resume_ms;
  const char *data_dir; /* where sandbox directories live */
  int unisolated;       /* --unisolated: run without bubblewrap (warned) */
  int keep_state;       /* --data-dir given: paused sandboxes and snapshots outlive a restart */
  int strict_tokens;    /* --strict-tokens: /contexts* of a secure sandbox need its token too */
  int verbose;
  int max_list_entries;   /* envd ListDir answers at most this many (default 50000) */
  int max_contexts;       /* code contexts per sandbox, the two defaults included (default 128) */
  int secure_all;         /* --secure-all: every sandbox gets an access token (no id-only data plane) */
  int max_team_memory_mb; /* memoryMB of a team's sandboxes held in RAM (-1: the host's; 0: none) */
  int max_streams;        /* concurrent streamed calls per team (default 64; 0: unlimited) */
};
extern struct wbd_options wbd_opt;

/* Sets sb's template id (a copy) and the size E2B builds it with:
 * code-interpreter-v1 2 vCPU / 2048 MB, any other template E2B's default
 * 2 vCPU / 512 MB; $WARMBOXD_MEMORY_MB (> 0) overrides the memory (tests).
 * The listing shows the size and the jail gets it. */
void wbd_sandbox_set_template(struct wbd_sandbox *sb, const char *template_id);

/* clock.c: the server's clock, in µs since the epoch (the wall clock plus
 * what POST /_warmboxd/clock moved it forward). */
int64_t wbd_now_us(void);
/* Moves the server's clock forward by us (>= 0); freeze 1 stops it between
 * moves, 0 lets it run on, -1 leaves that as it is. */
void wbd_clock_advance(int64_t us, int freeze);
/* The clock's total offset (what it was moved forward) and whether it is
 * frozen; either pointer may be NULL. */
void wbd_clock_state(int64_t *offset_us, int *frozen);
/* RFC 3339 with nanoseconds, UTC ("2026-08-21T20:00:00.123456000Z"); buf >= 40 */
void wbd_format_time(int64_t us, char *buf, size_t len);

/* ------------------------------------------------------------------ */
/* Sizes, knobs, limits and sleep (config.c / clock.c)                  */
/* ------------------------------------------------------------------ */

/* A sandbox's size when its template is not in config.c's table, and its
 * disk: what the listing shows and the jail gets. */
#define WBD_CPU_COUNT 2
#define WBD_MEMORY_MB 512
#define WBD_DISK_MB   1024
/* E2B's 404 for a sandbox id a team cannot see */
#define NOT_FOUND_FMT "Sandbox \"%s\" doesn't exist or you don't have access to it"

/* Options changed at run time by POST /_warmboxd/config are read and written
 * atomically (handlers run on many threads). */
static inline int wbd_knob(const int *p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void wbd_knob_set(int *p, int v) {
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
extern int wbd_loose_metadata;

/* Server limits (main.c's flags). Body limits are per route class, checked
 * against Content-Length when the headers are in and again while the body
 * streams, once the route and the caller's credentials are known. */
struct wbd_limits {
  const char *admin_token;        /* required on the admin API (X-Warmboxd-Token) */
  int conn_timeout_s;             /* idle connection / slow headers, default 30 */
  int max_conns;                  /* connections in total, default 1024 */
  int max_conns_per_ip;           /* connections per client address, default 128 */
  int max_upload_mb;              /* envd POST /files body, default 100 */
  int body_timeout_s;             /* a request body must be in within this, default 120 */
  int max_spool_mb;               /* upload bodies spooled at once, all sandboxes, default 1024 */
  const char *tls_cert, *tls_key; /* PEM files: a second listener serves HTTPS, or NULL */
  int tls_port;                   /* its port (0: a free one) */
};
extern struct wbd_limits wbd_lim;

/* Sleeps ms milliseconds, however many signals arrive. */
void wbd_sleep_ms(int ms);

#endif
