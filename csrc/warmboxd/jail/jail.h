/*
 * jail.h: the jail layer (jail/): sandboxes as processes (runtime.c) and
 * the pieces kept out of runtime.c: the spawner thread and what its
 * children do before they exec (spawn.c), a sandbox's network namespace
 * and slirp4netns (net.c), the code interpreter's /health answered inside
 * it (health.c), the seccomp program (seccomp.c) and the host uid range of
 * a root warmboxd (uidmap.c). Those pieces call nothing of runtime.c:
 * net.c and seccomp.c call spawn.c, net.c health.c; spawn.c calls none.
 *
 * The first part is what other layers use (envd, the code interpreter,
 * the state on disk); the rest, from "spawn.c" on, only jail/'s files.
 *
 * Layout on disk, per sandbox: <data_dir>/<name>/home  (the jail's /home/user)
 *                              <data_dir>/<name>/tmp   (the jail's /tmp)
 *                              <data_dir>/<name>/root  (the jail's /, under the rest)
 * where <name> is wbd_rt_name(id) (wbd.h), never the id itself.
 */
#ifndef WBD_JAIL_H
#define WBD_JAIL_H

#include "wbd.h"
#include <stddef.h>
#include <sys/types.h>

/* ------------------------------------------------------------------ */
/* runtime.c: a sandbox's directories, processes, pause, resume, kill */
/* ------------------------------------------------------------------ */

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
int wbd_rt_spawn(struct wbd_sandbox *sb, char *const argv[], json_t *envs, const char *cwd, pid_t *pid, int *stdin_fd,
                 int *stdout_fd, int *stderr_fd);
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

/* ------------------------------------------------------------------ */
/* spawn.c: argument vectors, and the spawner thread                   */
/* ------------------------------------------------------------------ */

/* A NULL-terminated vector of strings it owns (an argv or an envp). Adding
 * aborts when memory runs out. */
struct wbd_sv {
  char **v;
  size_t n, cap;
};
void wbd_sv_add(struct wbd_sv *s, const char *str);
void wbd_sv_add3(struct wbd_sv *s, const char *a, const char *b, const char *c);
void wbd_sv_free(struct wbd_sv *s);

/* PATH in a jail, and for the helpers the spawner starts. */
#define JAIL_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* A sandbox's cgroup-v1 groups, by controller (runtime.c makes them). */
enum { CG_FREEZER, CG_MEMORY, CG_PIDS, CG_CPU, CG_N };

/* Descriptors a child gets as its fds 3, 4, ... (spawn_job.pass). */
#define MAX_PASS 8

/* As root, bubblewrap runs as the sandbox's uid, which must not traverse
 * warmboxd's private data directory: the child mounts a small tmpfs of its
 * own on STAGE (in a mount namespace of its own) and binds what the jail
 * needs there, before it drops root. STAGED_PATHS: where each of
 * spawn_job.stage_src goes, in that order (home, tmp, passwd, group,
 * resolv, root). */
#define STAGE        "/tmp"
#define N_STAGED     6
#define STAGED_PATHS STAGE "/h", STAGE "/t", STAGE "/p", STAGE "/g", STAGE "/r", STAGE "/R"

/* What the spawner thread forks, and what the child does before its exec.
 * wbd_job_init first (every fd -1). */
struct spawn_job {
  char **argv, **envp;
  const char *chdir_to; /* host path, or NULL */
  int fds[3];           /* child's 0/1/2: an fd, -1 /dev/null */
  int ctty;             /* fds[0] is a terminal: it becomes the child's controlling one */
  int pass[MAX_PASS];   /* become the child's fds 3, 4, ... */
  int npass;
  int cg_fd[CG_N];                 /* cgroup.procs of the sandbox's groups, or -1 */
  int userns_fd, net_fd;           /* joined before exec, or -1 */
  int stage;                       /* bind stage_src under STAGE (STAGED_PATHS) */
  const char *stage_src[N_STAGED]; /* host paths; resolv ([4]) may be NULL */
  int setid;                       /* become uid/gid (warmboxd is root) */
  uid_t uid;
  gid_t gid;
  long nproc, data_mb; /* rlimits when there is no cgroup for them; 0: none */
  /* NULL: the child execs argv. Else it runs hold(parent, errpipe, hold_fd)
   * instead, which never returns: it writes a 0 on errpipe once ready (an
   * errno on failure) and then waits to be killed. wbd_spawn returns with it
   * alive (pid), for the caller to read what it made before wbd_spawn_reap.
   * hold_fd: a descriptor of the caller's for hold, or -1. */
  void (*hold)(pid_t parent, int errpipe, int hold_fd);
  int hold_fd;
  pid_t pid;
  int errfd; /* the child's error pipe, inside wbd_spawn */
  int err;
  int done;
  struct spawn_job *next;
};

void wbd_job_init(struct spawn_job *j);
/* Has the spawner thread fork j's child, then waits in the calling thread
 * (at most WARMBOXD_SPAWN_TIMEOUT_MS) for it to exec or fail, so that a
 * child that hangs before its exec holds up its own request only (it is
 * then killed). 0 with j->pid, or -errno (-ETIMEDOUT, -ESHUTDOWN when the
 * spawner is not running). */
int wbd_spawn(struct spawn_job *j);
/* SIGKILL and reap a child of warmboxd. */
void wbd_spawn_reap(pid_t pid);
/* In a forked child: report errno e on errpipe and _exit(127). */
void wbd_child_fail(int errpipe, int e);
/* A pipe holding len bytes (len < PIPE_BUF: never a partial write) for a
 * child to read: its read end (close-on-exec), or -1. */
int wbd_data_pipe(const void *data, size_t len);
/* The spawner thread: started once the process's namespaces are set up
 * (it reads WARMBOXD_SPAWN_TIMEOUT_MS and WARMBOXD_TEST_SPAWN_STALL), and
 * stopped (joined) at shutdown. 0 or -1. */
int wbd_spawner_start(void);
void wbd_spawner_stop(void);

/* ------------------------------------------------------------------ */
/* net.c: a sandbox's network                                          */
/* ------------------------------------------------------------------ */

/* A sandbox's network namespace and the slirp4netns that gives it the
 * internet. Only its owner's thread uses it, or callers under its lock. */
struct wbd_net {
  int net_fd, userns_fd; /* the namespace (and its owner when not root), -1 */
  pid_t slirp_pid;       /* slirp4netns giving net_fd the internet, 0 */
  int slirp_exit_fd;     /* its --exit-fd: closing it ends slirp4netns */
  int slirp_ready_fd;    /* readable once slirp4netns configured tap0 */
  int checked;           /* slirp_ready_fd was read */
  void *health;          /* health.c's handle of port 49999 in net_fd, or NULL */
};

/* Once, isolated, before the first wbd_net_make: root says whether
 * warmboxd is host root (else each namespace gets a user namespace of its
 * own); warns when slirp4netns is missing. */
void wbd_net_init(int root);
/* No namespace: every descriptor -1. */
void wbd_net_clear(struct wbd_net *n);
/* A fresh network namespace: lo up, the host's own addresses unreachable,
 * and, with internet, slirp4netns on its tap0. 0 or -errno (-ENOENT:
 * internet without slirp4netns); what was made is n's either way. */
int wbd_net_make(struct wbd_net *n, int internet);
/* Before a process joins the namespace: waits (bounded, once) for
 * slirp4netns to be ready; says so on stderr when it is not. */
void wbd_net_wait_ready(struct wbd_net *n, const char *id);
/* Ends slirp4netns (the namespace itself stays while its fds are open). */
void wbd_net_end(struct wbd_net *n);
/* Closes the namespace's descriptors. */
void wbd_net_close(struct wbd_net *n);
/* A new TCP socket (IPv4) made in the network namespace net_fd (joining its
 * owner userns_fd first, when >= 0) by a short-lived child of the spawner:
 * warmboxd's threads never change namespace. The fd, or -errno. */
int wbd_net_socket(int net_fd, int userns_fd);

/* health.c: answers GET /health on listening socket fd (port 49999 of a
 * sandbox's network namespace, which net.c opens), which it then owns; a
 * handle for wbd_health_remove, which closes it, or NULL (fd not taken). */
void *wbd_health_add(int fd);
void wbd_health_remove(void *handle);

/* ------------------------------------------------------------------ */
/* seccomp.c: the jails' syscall filter                                */
/* ------------------------------------------------------------------ */

/* Builds the program once, at start-up. */
void wbd_seccomp_init(void);
/* A pipe holding the program for bubblewrap's --seccomp: 0 with *fd its
 * read end (-1 where there is no program: not x86-64), or -1 when the pipe
 * cannot be made (the jail must not start then). */
int wbd_seccomp_pipe(int *fd);

/* ------------------------------------------------------------------ */
/* uidmap.c: whose uids the jails run as                               */
/* ------------------------------------------------------------------ */

/* A host uid range of `slots` uids for this instance's jails (warmboxd is
 * root): `want` exactly when nonzero, else the first free one of the
 * default ranges from `base`. Free: no account of /etc/passwd or group in
 * it, no process running as one of its uids, and no other warmboxd holding
 * its lock (an flock on <lock_dir>/uids-<first>.lock, kept until exit).
 * Returns the first uid, or 0 with why filled. */
uid_t wbd_uid_range_take(const char *lock_dir, uid_t base, uid_t want, unsigned slots, char *why, size_t len);

/* Without root: moves the (still single-threaded) process into a user
 * namespace of its own that maps only its uid and gid to themselves, where
 * it may make a mount namespace and size-limited tmpfs mounts. 0 or -1
 * (errno). */
int wbd_userns_enter(void);

/* Forks the janitor (janitor.c): when warmboxd ends, however, it ends what
 * is left in warmboxd's cgroups and removes them. Before any thread or
 * descriptor of warmboxd's; its command line (argv's memory) then names
 * it a janitor rather than repeating warmboxd's flags. 0 or -1 (no fork). */
int wbd_janitor_start(int argc, char **argv);
/* Ends the processes in the cgroups warmboxd `pid` made and removes them
 * (runtime.c: also what a start-up does for a killed warmboxd's). */
void wbd_cgroups_reap(int pid);

#endif
