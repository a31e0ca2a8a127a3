/*
 * runtime.h: sandboxes as processes (runtime.c), the code interpreter
 * (interp.c) and envd (envd.c), as seen by each other.
 *
 * Layout on disk, per sandbox: <data_dir>/<id>/home  (the jail's /home/user)
 *                              <data_dir>/<id>/tmp   (the jail's /tmp)
 *                              <data_dir>/<id>/root  (the jail's /, under the rest)
 */
#ifndef WBD_RUNTIME_H
#define WBD_RUNTIME_H

#include "wbd.h"
#include <sys/types.h>

/* Host path of the sandbox's /home/user or /tmp; returns buf. */
const char *wbd_rt_home(const struct wbd_sandbox *sb, char *buf, size_t len);
const char *wbd_rt_tmp(const struct wbd_sandbox *sb, char *buf, size_t len);

/* Where the jail's path `jail` (absolute, clean) lives on the host, as
 * jail_args mounts it: `host` gets the directory of the tree that holds it,
 * *rest the path below that ("." for the tree itself, else a suffix of
 * `jail`). Returns WBD_TREE_OWN (the sandbox's own writable trees: home,
 * /tmp, and its root for every path not mounted over), WBD_TREE_HOST (a
 * host tree the jail binds read-only: /usr, /lib..., /etc's bound entries,
 * the generated /etc/passwd and group), or -EACCES: not served (the
 * per-process /proc, /dev and /sys, the jail's /usr/local/bin; without
 * isolation, everything outside /home/user and /tmp). */
enum { WBD_TREE_OWN = 0, WBD_TREE_HOST = 1 };
/* Sandboxes run in jails (not --unisolated). */
int wbd_rt_isolated(void);

int wbd_rt_locate(const struct wbd_sandbox *sb, const char *jail, char *host, size_t hlen, const char **rest);
/* 1 when removing or renaming the cleaned jail path `jail` (or moving
 * something onto it) would take away part of the jail's skeleton: a mount
 * point or top-level symlink root_prepare made in the sandbox's `/`, /root,
 * /run, /var/tmp, or a directory holding one. envd refuses those
 * (permission_denied) for every user; 0 otherwise and when unisolated. */
int wbd_rt_skeleton(const char *jail);

/* Starts argv inside the sandbox's jail (bubblewrap, or unisolated when
 * wbd_opt.unisolated), cwd and paths as the jail sees them, environment =
 * the sandbox's envVars overlaid with `envs` (object or NULL). Fills the
 * pipe ends the caller now owns (any may be NULL to get /dev/null). The
 * process is tracked: pause stops it, kill ends it. Returns 0 or -errno. */
int wbd_rt_spawn(struct wbd_sandbox *sb, char *const argv[], json_t *envs, const char *cwd,
                 pid_t *pid, int *stdin_fd, int *stdout_fd, int *stderr_fd);
/* As wbd_rt_spawn, on a new pseudo-terminal of cols x rows (0: 80 x 24):
 * the process leads a session whose controlling terminal it is (its fds
 * 0-2 are the slave end); *master_fd (close-on-exec) is the caller's: the
 * process's input and output, and TIOCSWINSZ resizes it. Same jail,
 * namespaces, groups, limits and seccomp filter as any process. */
int wbd_rt_spawn_pty(struct wbd_sandbox *sb, char *const argv[], json_t *envs, const char *cwd, unsigned cols,
                     unsigned rows, pid_t *pid, int *master_fd);
/* The sandbox's boot id (a new one after a pause without memory: a cold
 * boot) into buf; "" when the sandbox has no runtime (killed). */
void wbd_rt_boot_id(struct wbd_sandbox *sb, char *buf, size_t len);
/* Signal a process started by wbd_rt_spawn (its whole process group). */
int wbd_rt_signal(struct wbd_sandbox *sb, pid_t pid, int sig);
/* Reap: blocks until it exits; returns the wait status. */
int wbd_rt_wait(struct wbd_sandbox *sb, pid_t pid);

/* Routes for port 49999 (interp.c) and port 49983 (envd.c). Must reply. */
enum MHD_Result wbd_interp_handle(struct wbd_req *req, struct wbd_sandbox *sb);
/* Snapshots and forks: the default python context's user namespace as one
 * {"type": "__wb_dump__", "data", "unrestored"} JSON line (malloc'd), or
 * NULL when that context never ran; waits for a running cell (bounded).
 * wbd_interp_restore gives such a dump to the sandbox's first python kernel. */
char *wbd_interp_dump(struct wbd_sandbox *sb);
void wbd_interp_restore(struct wbd_sandbox *sb, json_t *dump);
enum MHD_Result wbd_envd_handle(struct wbd_req *req, struct wbd_sandbox *sb);

#endif
