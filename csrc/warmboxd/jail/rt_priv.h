/*
 * rt_priv.h: what runtime.c and interp.c share beyond runtime.h (both files
 * belong to the same owner; nothing else includes this).
 */
#ifndef WBD_RT_PRIV_H
#define WBD_RT_PRIV_H

#include "runtime.h"

/* A sandbox's runtime state. Reference-counted: sb->rt holds one reference
 * until the sandbox is killed (then sb->rt points at a sentinel), and every
 * stream or kernel thread that uses it holds one. */
struct wbd_rt;

/* A referenced runtime for sb (created with its directories on first use), or
 * NULL when the sandbox is killed or the directories cannot be made. */
struct wbd_rt *wbd_rt_get(struct wbd_sandbox *sb);
void wbd_rt_ref(struct wbd_rt *rt);
void wbd_rt_put(struct wbd_rt *rt);

/* The code interpreter's per-sandbox state slot (its owner frees what it
 * holds through the hooks below). */
void **wbd_rt_interp_slot(struct wbd_rt *rt);
pthread_mutex_t *wbd_rt_interp_mu(struct wbd_rt *rt);

/* What the runtime calls in the interpreter: given to it, with the state,
 * by the interpreter (interp.c) so that runtime.c only calls down.
 *  - on_pause(memory=1): streams in flight are dropped (as E2B drops outside
 *    connections at a pause); the kernels stay, frozen.
 *  - on_pause(memory=0) or kill: every context is forgotten (old ids 404),
 *    streams dropped; runtime.c then ends the processes.
 *  - free_slot(slot): the runtime is freed; slot = *wbd_rt_interp_slot(rt). */
struct wbd_rt_hooks {
  void (*on_pause)(struct wbd_rt *rt, int memory);
  void (*free_slot)(void *slot);
};
/* Under wbd_rt_interp_mu(rt), when filling the slot. */
void wbd_rt_set_hooks(struct wbd_rt *rt, const struct wbd_rt_hooks *hooks);

/* Processes the sandbox's memory group has OOM-killed so far (-1: no memory
 * group), and its limit in MB. */
long wbd_rt_oom_kills(struct wbd_rt *rt);
long wbd_rt_memory_mb(const struct wbd_rt *rt);

/* The runtime's directory (<data_dir>/<id>: home, tmp, root) and the host
 * uid/gid its jail runs as. */
const char *wbd_rt_dir(const struct wbd_rt *rt);
void wbd_rt_owner(const struct wbd_rt *rt, uid_t *uid, gid_t *gid);
/* Freezes (on = 1) or thaws the jail's processes and nothing else; 1 when
 * this call froze them. */
int wbd_rt_hold(struct wbd_rt *rt, int on);
/* Removes a tree without following symlinks (what a kill does to a sandbox's directory). */
void wbd_rt_remove_tree(const char *path);

/* 1 when sandboxes run in bubblewrap jails (0: --unisolated). */
int wbd_rt_isolated(void);

/* wbd_rt_spawn on a runtime; inherit_stderr: the child's stderr is warmboxd's. */
int wbd_rt_spawn_rt(struct wbd_rt *rt, char *const argv[], json_t *envs, const char *cwd, int inherit_stderr,
                    pid_t *pid, int *stdin_fd, int *stdout_fd, int *stderr_fd);
int wbd_rt_signal_rt(struct wbd_rt *rt, pid_t pid, int sig);
int wbd_rt_wait_rt(struct wbd_rt *rt, pid_t pid);


#endif
