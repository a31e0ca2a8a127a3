/*
 * spawn.c: the spawner thread, and what a jail's child does between its
 * fork and its exec.
 *
 * Children are forked by one long-lived spawner thread: PR_SET_PDEATHSIG
 * fires when the *thread* that forked exits, and connection threads come and
 * go, so forking from them would kill kernels at random. With the spawner, a
 * crashed warmboxd still takes its jails down. The spawner only forks; the
 * requesting thread waits (bounded) for its own child's exec.
 */
#include "jail.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* How long a request waits for its jail's child to exec (or fail) before it
 * kills it: WARMBOXD_SPAWN_TIMEOUT_MS. */
#define SPAWN_TIMEOUT_MS_DEFAULT 30000
static int g_spawn_timeout_ms = SPAWN_TIMEOUT_MS_DEFAULT;
/* For tests (WARMBOXD_TEST_SPAWN_STALL): a child whose argv holds this
 * string hangs before its exec, as one stuck in the kernel would. */
static const char *g_stall;

static pthread_mutex_t sp_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sp_cond = PTHREAD_COND_INITIALIZER;
static struct spawn_job *sp_head, *sp_tail;
static int sp_running, sp_stop;
static pthread_t sp_thread;

/* ------------------------------------------------------------------ */
/* Argument vectors                                                    */
/* ------------------------------------------------------------------ */

void wbd_sv_add(struct wbd_sv *s, const char *str) {
  if (s->n + 2 > s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    char **nv = realloc(s->v, cap * sizeof *nv);
    if (!nv) abort();
    s->v = nv;
    s->cap = cap;
  }
  s->v[s->n] = strdup(str);
  if (!s->v[s->n]) abort();
  s->n++;
  s->v[s->n] = NULL;
}

void wbd_sv_add3(struct wbd_sv *s, const char *a, const char *b, const char *c) {
  wbd_sv_add(s, a);
  wbd_sv_add(s, b);
  wbd_sv_add(s, c);
}

void wbd_sv_free(struct wbd_sv *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  s->v = NULL;
  s->n = s->cap = 0;
}

/* ------------------------------------------------------------------ */
/* The child, between fork and exec                                    */
/* ------------------------------------------------------------------ */

void wbd_job_init(struct spawn_job *j) {
  memset(j, 0, sizeof *j);
  for (int i = 0; i < 3; i++) j->fds[i] = -1;
  for (int i = 0; i < CG_N; i++) j->cg_fd[i] = -1;
  j->userns_fd = j->net_fd = j->errfd = j->hold_fd = -1;
}

void wbd_child_fail(int errpipe, int e) {
  if (write(errpipe, &e, sizeof e) < 0) {
  }
  _exit(127);
}

int wbd_data_pipe(const void *data, size_t len) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  ssize_t w = write(p[1], data, len);
  close(p[1]);
  if (w != (ssize_t)len) {
    close(p[0]);
    return -1;
  }
  return p[0];
}

static int stage_binds(const struct spawn_job *j) {
  /* A copy of warmboxd's mount namespace; the sources are opened in it
   * before the tmpfs hides what was under STAGE, then bound from their fds. */
  if (unshare(CLONE_NEWNS) != 0) return -1;
  int src[N_STAGED];
  for (int i = 0; i < N_STAGED; i++) {
    src[i] = -1;
    if (!j->stage_src[i]) {
      if (i != 4) return errno = EINVAL, -1;
      continue;
    }
    src[i] = open(j->stage_src[i], O_PATH | O_CLOEXEC);
    if (src[i] < 0) return -1;
  }
  if (mount("tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0711") != 0) return -1;
  static const char *const dst[N_STAGED] = {STAGED_PATHS};
  for (int i = 0; i < N_STAGED; i++) {
    if (src[i] < 0) continue;
    char from[64];
    snprintf(from, sizeof from, "/proc/self/fd/%d", src[i]);
    int is_dir = i < 2 || i == 5;
    int r = is_dir ? mkdir(dst[i], 0700) : close(open(dst[i], O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    if (r != 0 || mount(from, dst[i], "none", MS_BIND, NULL) != 0) return -1;
    close(src[i]);
  }
  return 0;
}

static void child_stall(char **argv) {
  for (int i = 0; g_stall && argv[i]; i++)
    if (strcmp(argv[i], g_stall) == 0)
      for (;;) pause();
}

static void child_exec(struct spawn_job *j, pid_t parent, int errpipe) {
  for (int i = 0; i < CG_N; i++)
    if (j->cg_fd[i] >= 0 && write(j->cg_fd[i], "0", 1) < 0) {
    }
  child_stall(j->argv);
  setsid();
  /* A pty process: its own fresh terminal becomes the new session's
   * controlling one (job control, ^C, SIGWINCH on a resize). */
  if (j->ctty && ioctl(j->fds[0], TIOCSCTTY, 0) != 0) wbd_child_fail(errpipe, errno);
  if (j->stage && stage_binds(j) != 0) wbd_child_fail(errpipe, errno);
  if (j->userns_fd >= 0 && setns(j->userns_fd, CLONE_NEWUSER) != 0) wbd_child_fail(errpipe, errno);
  if (j->net_fd >= 0 && setns(j->net_fd, CLONE_NEWNET) != 0) wbd_child_fail(errpipe, errno);
  if (j->nproc > 0) {
    struct rlimit rl = {(rlim_t)j->nproc, (rlim_t)j->nproc};
    setrlimit(RLIMIT_NPROC, &rl);
  }
  if (j->data_mb > 0) {
    struct rlimit rl = {(rlim_t)j->data_mb << 20, (rlim_t)j->data_mb << 20};
    setrlimit(RLIMIT_DATA, &rl);
  }
  if (j->setid) {
    if (setgroups(0, NULL) != 0 || setresgid(j->gid, j->gid, j->gid) != 0 || setresuid(j->uid, j->uid, j->uid) != 0)
      wbd_child_fail(errpipe, errno);
  }
  /* After the uid change, which clears it. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  /* Move every descriptor the child keeps above the ones it is given, then
   * lay them out: 0-2, the passed ones from 3, errpipe (close-on-exec) last. */
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  int hi_std[3], hi_pass[MAX_PASS];
  int floor_fd = 3 + j->npass + 1;
  if (floor_fd < 16) floor_fd = 16;
  for (int i = 0; i < 3; i++) hi_std[i] = fcntl(j->fds[i] >= 0 ? j->fds[i] : devnull, F_DUPFD_CLOEXEC, floor_fd);
  for (int i = 0; i < j->npass; i++) hi_pass[i] = fcntl(j->pass[i], F_DUPFD_CLOEXEC, floor_fd);
  int hi_err = fcntl(errpipe, F_DUPFD_CLOEXEC, floor_fd);
  if (hi_err < 0) _exit(127);
  errpipe = hi_err;
  for (int i = 0; i < 3; i++)
    if (hi_std[i] < 0 || dup2(hi_std[i], i) < 0) wbd_child_fail(errpipe, EBADF);
  for (int i = 0; i < j->npass; i++)
    if (hi_pass[i] < 0 || dup2(hi_pass[i], 3 + i) < 0) wbd_child_fail(errpipe, EBADF);
  int efd = 3 + j->npass;
  if (dup3(errpipe, efd, O_CLOEXEC) < 0) _exit(127);
  errpipe = efd;
  /* Nothing else of warmboxd's reaches the jail: sockets, pipes, logs. */
  if (syscall(SYS_close_range, (unsigned)efd + 1, ~0u, 0u) != 0)
    for (int fd = efd + 1; fd < 65536; fd++) close(fd);
  if (j->chdir_to && chdir(j->chdir_to) != 0) wbd_child_fail(errpipe, errno);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; s++) sigaction(s, &sa, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execve(j->argv[0], j->argv, j->envp);
  wbd_child_fail(errpipe, errno);
}

/* ------------------------------------------------------------------ */
/* The spawner thread and its callers                                  */
/* ------------------------------------------------------------------ */

/* The spawner thread's part: the fork alone (j->pid, j->errfd: the read end
 * of the child's error pipe), so that it never waits for a child. */
static void run_job(struct spawn_job *j) {
  int ep[2];
  if (pipe2(ep, O_CLOEXEC) != 0) {
    j->err = -errno;
    return;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    j->err = -errno;
    close(ep[0]);
    close(ep[1]);
    return;
  }
  if (pid == 0) {
    close(ep[0]);
    if (j->hold) j->hold(parent, ep[1], j->hold_fd);
    child_exec(j, parent, ep[1]);
  }
  close(ep[1]);
  j->pid = pid;
  j->errfd = ep[0];
}

/* The child's word on its error pipe: 0 and *e set, 1 at EOF (it exec'd),
 * -ETIMEDOUT when it said nothing within the spawn timeout. */
static int errpipe_read(int fd, int *e) {
  struct pollfd pf = {fd, POLLIN, 0};
  int pr;
  while ((pr = poll(&pf, 1, g_spawn_timeout_ms)) < 0 && errno == EINTR) {
  }
  if (pr == 0) return -ETIMEDOUT;
  ssize_t r;
  do r = read(fd, e, sizeof *e);
  while (r < 0 && errno == EINTR);
  return r == (ssize_t)sizeof *e ? 0 : 1;
}

void wbd_spawn_reap(pid_t pid) {
  kill(pid, SIGKILL);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
}

/* The caller's part, in its own thread: waits (at most the spawn timeout)
 * for the child to exec or fail, so a child that hangs before its exec holds
 * up its own sandbox's request only; it is then killed. */
static void job_finish(struct spawn_job *j) {
  pid_t pid = j->pid;
  int e = 0;
  int rd = errpipe_read(j->errfd, &e);
  close(j->errfd);
  j->errfd = -1;
  if (rd == -ETIMEDOUT) {
    fprintf(stderr, "warmboxd: a jail did not start within %d ms: killed\n", g_spawn_timeout_ms);
    wbd_spawn_reap(pid);
    j->pid = 0;
    j->err = -ETIMEDOUT;
    return;
  }
  if (j->hold) {
    /* Ready (a 0): the caller's until it reaps it. */
    if (rd == 0 && e == 0) return;
    j->err = rd == 0 ? -e : -ECHILD;
    wbd_spawn_reap(pid);
    return;
  }
  if (rd == 0) {
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    j->pid = 0;
    j->err = -e;
  }
}

static void *spawner(void *arg) {
  (void)arg;
  pthread_mutex_lock(&sp_mu);
  for (;;) {
    while (!sp_head && !sp_stop) pthread_cond_wait(&sp_cond, &sp_mu);
    if (!sp_head) break;
    struct spawn_job *j = sp_head;
    sp_head = j->next;
    if (!sp_head) sp_tail = NULL;
    pthread_mutex_unlock(&sp_mu);
    run_job(j);
    pthread_mutex_lock(&sp_mu);
    j->done = 1;
    pthread_cond_broadcast(&sp_cond);
  }
  pthread_mutex_unlock(&sp_mu);
  return NULL;
}

int wbd_spawn(struct spawn_job *j) {
  pthread_mutex_lock(&sp_mu);
  if (!sp_running || sp_stop) {
    pthread_mutex_unlock(&sp_mu);
    return -ESHUTDOWN;
  }
  j->next = NULL;
  if (sp_tail)
    sp_tail->next = j;
  else
    sp_head = j;
  sp_tail = j;
  pthread_cond_broadcast(&sp_cond);
  while (!j->done) pthread_cond_wait(&sp_cond, &sp_mu);
  pthread_mutex_unlock(&sp_mu);
  if (!j->err) job_finish(j);
  return j->err;
}

int wbd_spawner_start(void) {
  const char *e;
  if ((e = getenv("WARMBOXD_SPAWN_TIMEOUT_MS")) && atoi(e) > 0) g_spawn_timeout_ms = atoi(e);
  g_stall = (e = getenv("WARMBOXD_TEST_SPAWN_STALL")) && *e ? e : NULL;
  pthread_mutex_lock(&sp_mu);
  sp_stop = 0;
  if (pthread_create(&sp_thread, NULL, spawner, NULL) != 0) {
    pthread_mutex_unlock(&sp_mu);
    fprintf(stderr, "warmboxd: cannot start the spawner thread\n");
    return -1;
  }
  sp_running = 1;
  pthread_mutex_unlock(&sp_mu);
  return 0;
}

void wbd_spawner_stop(void) {
  pthread_mutex_lock(&sp_mu);
  int running = sp_running;
  sp_stop = 1;
  sp_running = 0;
  pthread_cond_broadcast(&sp_cond);
  pthread_mutex_unlock(&sp_mu);
  if (running) pthread_join(sp_thread, NULL);
}
