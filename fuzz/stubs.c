/*
 * stubs.c: the parts of warmboxd the fuzz targets leave out. Options as
 * main.c would set them (fuzz_options); the runtime hooks succeed without doing anything
 * (records need no directory, no process is ever spawned); the data plane
 * reaches only envd's POST /files (uploads land in a scratch directory),
 * every other data-plane request gets a plain 204.
 */
#include "control.h"
#include "jail.h"
#include "envd.h"
#include "interp.h"
#include "harness.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* config.c holds the defaults; the targets run unisolated, with small limits. */
void fuzz_options(void) {
  wbd_opt.unisolated = 1;
  wbd_lim.admin_token = FUZZ_ADMIN_TOKEN;
  wbd_lim.conn_timeout_s = 5;
  wbd_lim.max_conns = 256;
  wbd_lim.max_conns_per_ip = 256;
  wbd_lim.max_upload_mb = 1;
}

char fuzz_scratch[512];

int wbd_rt_init(void) {
  return 0;
}
int wbd_rt_on_create(struct wbd_sandbox *sb) {
  (void)sb;
  return 0;
}
int wbd_rt_on_pause(struct wbd_sandbox *sb, int memory) {
  (void)sb;
  (void)memory;
  return 0;
}
int wbd_rt_on_resume(struct wbd_sandbox *sb) {
  (void)sb;
  return 0;
}
void wbd_rt_on_kill(struct wbd_sandbox *sb) {
  (void)sb;
}
void wbd_rt_shutdown(void) {}

const char *wbd_rt_home(const struct wbd_sandbox *sb, char *buf, size_t len) {
  (void)sb;
  snprintf(buf, len, "%s/home", fuzz_scratch);
  return buf;
}

const char *wbd_rt_tmp(const struct wbd_sandbox *sb, char *buf, size_t len) {
  (void)sb;
  snprintf(buf, len, "%s/tmp", fuzz_scratch);
  return buf;
}

int wbd_rt_isolated(void) {
  return 0;
}

/* As an unisolated runtime: home and /tmp in the scratch directory, nothing else. */
int wbd_rt_locate(const struct wbd_sandbox *sb, const char *jail, char *host, size_t hlen, const char **rest) {
  static const char *const trees[][2] = {{"/home/user", "home"}, {"/tmp", "tmp"}};
  (void)sb;
  for (int i = 0; i < 2; i++) {
    size_t n = strlen(trees[i][0]);
    if (strncmp(jail, trees[i][0], n) != 0 || (jail[n] != 0 && jail[n] != '/')) continue;
    snprintf(host, hlen, "%s/%s", fuzz_scratch, trees[i][1]);
    *rest = jail[n] ? jail + n + 1 : ".";
    return WBD_TREE_OWN;
  }
  return -EACCES;
}

int wbd_rt_skeleton(const char *jail) {
  (void)jail;
  return 0; /* the fuzzer's scratch tree has no skeleton */
}

int wbd_rt_spawn(struct wbd_sandbox *sb, char *const argv[], json_t *envs, const char *cwd, pid_t *pid, int *stdin_fd,
                 int *stdout_fd, int *stderr_fd) {
  (void)sb;
  (void)argv;
  (void)envs;
  (void)cwd;
  (void)pid;
  (void)stdin_fd;
  (void)stdout_fd;
  (void)stderr_fd;
  return -EPERM; /* never run anything a fuzzer wrote */
}
int wbd_rt_spawn_pty(struct wbd_sandbox *sb, char *const argv[], json_t *envs, const char *cwd, unsigned cols,
                     unsigned rows, pid_t *pid, int *master_fd) {
  (void)sb;
  (void)argv;
  (void)envs;
  (void)cwd;
  (void)cols;
  (void)rows;
  (void)pid;
  (void)master_fd;
  return -EPERM;
}
void wbd_rt_boot_id(struct wbd_sandbox *sb, char *buf, size_t len) {
  (void)sb;
  if (len) buf[0] = 0;
}
int wbd_rt_signal(struct wbd_sandbox *sb, pid_t pid, int sig) {
  (void)sb;
  (void)pid;
  (void)sig;
  return -ESRCH;
}
int wbd_rt_wait(struct wbd_sandbox *sb, pid_t pid) {
  (void)sb;
  (void)pid;
  return 0;
}

int wbd_dataplane_changes(const struct wbd_req *req, int port) {
  (void)req;
  (void)port;
  return 0;
}

int wbd_dataplane_refused(struct wbd_req *req, struct wbd_sandbox *sb, int port, enum MHD_Result *r) {
  (void)req;
  (void)sb;
  (void)port;
  (void)r;
  return 0;
}

enum MHD_Result wbd_dataplane_handle(struct wbd_req *req, struct wbd_sandbox *sb, int port) {
  if (port == 49983 && strcmp(req->method, "POST") == 0 &&
      (strcmp(req->path, "/files") == 0 || strncmp(req->path, "/process.Process/", 17) == 0))
    return wbd_envd_handle(req, sb);
  return wbd_reply_raw(req, 204, NULL, "", 0, NULL);
}

/* state.h: the targets keep no state on disk and have no snapshots. */
#include "state.h"
struct wbd_snapshot *wbd_snapshot_get(const char *team, const char *ref) {
  (void)team;
  (void)ref;
  return NULL;
}
void wbd_snapshot_put(struct wbd_snapshot *s) {
  (void)s;
}
const char *wbd_snapshot_template(const struct wbd_snapshot *s) {
  (void)s;
  return "";
}
void wbd_snapshot_env(const struct wbd_snapshot *s, json_t *env) {
  (void)s;
  (void)env;
}
int wbd_snapshot_fill(struct wbd_sandbox *sb, void *cls) {
  (void)sb;
  (void)cls;
  return 0;
}
int wbd_persist_save(struct wbd_sandbox *sb, char *msg, size_t len) {
  (void)sb;
  (void)msg;
  (void)len;
  return 0;
}
int wbd_persist_release(struct wbd_sandbox *sb) {
  (void)sb;
  return -1; /* the runtime stays (the targets have none to release) */
}
/* wbd.h's runtime names and the pause's settle: no jails in the targets. */
int wbd_rt_settling(struct wbd_sandbox *sb) {
  (void)sb;
  return 0;
}
void wbd_rt_name(const char *id, char *out, size_t len) {
  snprintf(out, len, "r-%s", id);
}
void wbd_snapshot_size(const struct wbd_snapshot *s, struct wbd_sandbox *sb) {
  (void)s;
  (void)sb;
}
struct wbd_state_limits wbd_state_lim = {.pause_workers = 1};
int wbd_persist_restore(struct wbd_sandbox *sb) {
  (void)sb;
  return 0;
}
void wbd_persist_drop(struct wbd_sandbox *sb) {
  (void)sb;
}

/* The metrics routes read cgroups: not the parsers' business. */
enum MHD_Result wbd_metrics_one(struct wbd_req *req, const char *team, const char *id) {
  (void)team;
  (void)id;
  return wbd_reply_error(req, 404, "no metrics in the fuzzer");
}
enum MHD_Result wbd_metrics_many(struct wbd_req *req, const char *team) {
  (void)team;
  return wbd_reply_error(req, 404, "no metrics in the fuzzer");
}
json_t *wbd_metrics_envd(struct wbd_sandbox *sb) {
  (void)sb;
  return json_object();
}

/* The snapshot and fork routes keep state on disk: not built in here. */
static enum MHD_Result no_route(struct wbd_req *req) {
  return wbd_reply_error(req, 404, "no route for %s %s", req->method, req->path);
}
enum MHD_Result wbd_h_snapshot_take(struct wbd_req *req, const struct wbd_call *c) {
  (void)c;
  return no_route(req);
}
enum MHD_Result wbd_h_snapshot_list(struct wbd_req *req, const struct wbd_call *c) {
  (void)c;
  return no_route(req);
}
enum MHD_Result wbd_h_template_delete(struct wbd_req *req, const struct wbd_call *c) {
  (void)c;
  return no_route(req);
}
enum MHD_Result wbd_h_fork(struct wbd_req *req, const struct wbd_call *c) {
  (void)c;
  return no_route(req);
}

/* The lifecycle events (control/events.c, control/webhooks.c) are left out:
 * the control plane's hooks record nothing, the knobs have their storage. */
int wbd_webhook_retry_ms = 10000, wbd_webhook_retries = 3, wbd_webhook_duplicates = 0;
int wbd_events_ttl_days = 7;
void wbd_event_locked(const struct wbd_sandbox *sb, enum wbd_event_type type, int64_t at_us) {
  (void)sb;
  (void)type;
  (void)at_us;
}
enum MHD_Result wbd_h_events(struct wbd_req *req, const struct wbd_call *c) {
  (void)c;
  return no_route(req);
}
enum MHD_Result wbd_h_webhooks(struct wbd_req *req, const struct wbd_call *c) {
  (void)c;
  return no_route(req);
}
