/*
 * runtime.c: sandboxes as processes.
 *
 * Each sandbox is a directory, <data_dir>/<id>/{home,tmp}, seen by its
 * processes as /home/user and /tmp inside a bubblewrap jail (read-only system
 * directories, a generated /etc/passwd, no host files, no network unless the
 * sandbox allows internet access). Every process a sandbox starts joins the
 * sandbox's cgroup-v1 freezer group when one can be made, so a pause freezes
 * the whole tree at once and a kill finds every process; without the freezer
 * the tree is found through /proc and stopped with SIGSTOP.
 *
 * Children are forked by one long-lived spawner thread: PR_SET_PDEATHSIG
 * fires when the *thread* that forked exits, and connection threads come and
 * go, so forking from them would kill kernels at random. With the spawner, a
 * crashed warmboxd still takes its jails down.
 */
#include "rt_priv.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BWRAP "/usr/bin/bwrap"
#define JAIL_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* ------------------------------------------------------------------ */
/* State                                                               */
/* ------------------------------------------------------------------ */

struct rt_proc {
  pid_t pid;
  int waiters;      /* threads inside wbd_rt_wait for it */
  int exited;
  int status;
  struct rt_proc *next;
};

struct wbd_rt {
  pthread_mutex_t mu;       /* procs, frozen, dead */
  pthread_cond_t cond;      /* a tracked process was reaped */
  int refs;                 /* under g_mu */
  int owner;                /* sb->rt's reference is still held (under g_mu) */
  char id[32];
  char dir[PATH_MAX + 64];
  char cg[PATH_MAX + 64];   /* freezer group, "" without one */
  int allow_net;
  int frozen;
  int dead;                 /* torn down: no new processes */
  struct rt_proc *procs;
  pthread_mutex_t interp_mu;
  void *interp;
  struct wbd_rt *prev, *next;
};

/* sb->rt after a kill: the record stays around while referenced, and must
 * not get a fresh runtime. */
static char rt_killed_mark;
#define RT_KILLED ((struct wbd_rt *)(void *)&rt_killed_mark)

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static struct wbd_rt *g_all;
static int g_shut;
static int g_isolated;
static char g_cg_root[PATH_MAX];
static char g_etc[PATH_MAX + 32];
static char g_data[PATH_MAX];     /* wbd_opt.data_dir, absolute */

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

struct sv {
  char **v;
  size_t n, cap;
};

static void sv_add(struct sv *s, const char *str) {
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

static void sv_free(struct sv *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  s->v = NULL;
  s->n = s->cap = 0;
}

static int mkdir_p(const char *path, mode_t mode) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -ENAMETOOLONG;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -errno;
    *p = '/';
  }
  if (mkdir(buf, mode) != 0 && errno != EEXIST) return -errno;
  return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  if (flag == FTW_DP || flag == FTW_D) rmdir(path);
  else unlink(path);
  return 0;
}

static void rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return;
  /* A jailed process may have made a directory unreadable to itself; root
   * can still walk it. */
  nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS);
}

static int write_file(const char *path, const char *data) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = write(fd, data, strlen(data));
  int e = n < 0 ? -errno : 0;
  close(fd);
  return e;
}

static int write_new_file(const char *path, const char *data) {
  FILE *f = fopen(path, "we");
  if (!f) return -errno;
  fputs(data, f);
  return fclose(f) == 0 ? 0 : -errno;
}

static void sleep_ms(int ms) {
  struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ------------------------------------------------------------------ */
/* Process trees via /proc                                             */
/* ------------------------------------------------------------------ */

struct pp {
  pid_t pid, ppid;
};

static size_t proc_table(struct pp **out) {
  size_t n = 0, cap = 256;
  struct pp *v = malloc(cap * sizeof *v);
  if (!v) abort();
  DIR *d = opendir("/proc");
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
      char path[300], buf[512];
      snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ssize_t r = read(fd, buf, sizeof buf - 1);
      close(fd);
      if (r <= 0) continue;
      buf[r] = 0;
      char *rp = strrchr(buf, ')');
      if (!rp) continue;
      char state;
      int ppid;
      if (sscanf(rp + 1, " %c %d", &state, &ppid) != 2) continue;
      if (n == cap) {
        cap *= 2;
        struct pp *nv = realloc(v, cap * sizeof *nv);
        if (!nv) abort();
        v = nv;
      }
      v[n].pid = (pid_t)atoi(e->d_name);
      v[n].ppid = (pid_t)ppid;
      n++;
    }
    closedir(d);
  }
  *out = v;
  return n;
}

/* Every descendant of the roots (not the roots themselves). */
static size_t descendants(const pid_t *roots, size_t nroots, pid_t **out) {
  struct pp *t;
  size_t n = proc_table(&t);
  size_t cap = nroots + 16, m = 0;
  pid_t *v = calloc(cap, sizeof *v);  /* calloc: gcc -O2 cannot see every slot read was written */
  if (!v) abort();
  for (size_t i = 0; i < nroots; i++) v[m++] = roots[i];
  for (size_t q = 0; q < m; q++)
    for (size_t i = 0; i < n; i++)
      if (t[i].ppid == v[q]) {
        int seen = 0;
        for (size_t k = 0; k < m && !seen; k++) seen = v[k] == t[i].pid;
        if (seen) continue;
        if (m == cap) {
          cap *= 2;
          pid_t *nv = realloc(v, cap * sizeof *nv);
          if (!nv) abort();
          v = nv;
        }
        v[m++] = t[i].pid;
      }
  free(t);
  memmove(v, v + nroots, (m - nroots) * sizeof *v);
  *out = v;
  return m - nroots;
}

static int is_bwrap(pid_t pid) {
  char path[64], buf[32];
  snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (r <= 0) return 0;
  buf[r] = 0;
  return strncmp(buf, "bwrap", 5) == 0;
}

/* The pids now in a cgroup. */
static size_t cg_pids(const char *cg, pid_t **out) {
  char path[PATH_MAX + 128];
  snprintf(path, sizeof path, "%s/cgroup.procs", cg);
  size_t n = 0, cap = 16;
  pid_t *v = malloc(cap * sizeof *v);
  if (!v) abort();
  FILE *f = fopen(path, "re");
  if (f) {
    int p;
    while (fscanf(f, "%d", &p) == 1) {
      if (n == cap) {
        cap *= 2;
        pid_t *nv = realloc(v, cap * sizeof *nv);
        if (!nv) abort();
        v = nv;
      }
      v[n++] = (pid_t)p;
    }
    fclose(f);
  }
  *out = v;
  return n;
}

static int cg_set_state(const char *cg, const char *state) {
  char path[PATH_MAX + 128];
  snprintf(path, sizeof path, "%s/freezer.state", cg);
  int rc = write_file(path, state);
  if (rc) return rc;
  /* FREEZING until every task has stopped: usually well under a millisecond. */
  long wait_us = 100, waited_us = 0;
  while (waited_us < 2000000) {
    char buf[32] = { 0 };
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r > 0 && strncmp(buf, state, strlen(state)) == 0) return 0;
    struct timespec ts = { 0, wait_us * 1000L };
    nanosleep(&ts, NULL);
    waited_us += wait_us;
    if (wait_us < 5000) wait_us *= 2;
  }
  return -ETIMEDOUT;
}

/* ------------------------------------------------------------------ */
/* The spawner thread                                                  */
/* ------------------------------------------------------------------ */

struct spawn_job {
  char **argv, **envp;
  const char *chdir_to;     /* host path, or NULL */
  int fds[3];               /* child's 0/1/2: an fd, -1 /dev/null, -2 inherit */
  int cg_fd;                /* cgroup.procs of the sandbox, or -1 */
  pid_t pid;
  int err;
  int done;
  struct spawn_job *next;
};

static pthread_mutex_t sp_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sp_cond = PTHREAD_COND_INITIALIZER;
static struct spawn_job *sp_head, *sp_tail;
static int sp_running, sp_stop;
static pthread_t sp_thread;

static void child_exec(struct spawn_job *j, pid_t parent, int errpipe) {
  if (j->cg_fd >= 0 && write(j->cg_fd, "0", 1) < 0) {}
  setsid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  int devnull = open("/dev/null", O_RDWR);
  for (int i = 0; i < 3; i++) {
    int fd = j->fds[i] == -1 ? devnull : j->fds[i];
    if (j->fds[i] == -2) continue;
    if (fd >= 0) dup2(fd, i);
  }
  if (j->chdir_to && chdir(j->chdir_to) != 0) {
    int e = errno;
    if (write(errpipe, &e, sizeof e) < 0) {}
    _exit(127);
  }
  /* Other threads' sockets and pipes must not leak into the jail. */
  if (errpipe > 3) syscall(SYS_close_range, 3u, (unsigned)errpipe - 1, 0u);
  if (syscall(SYS_close_range, (unsigned)errpipe + 1, ~0u, 0u) != 0)
    for (int fd = errpipe + 1; fd < 65536; fd++) close(fd);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; s++) sigaction(s, &sa, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execve(j->argv[0], j->argv, j->envp);
  int e = errno;
  if (write(errpipe, &e, sizeof e) < 0) {}
  _exit(127);
}

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
  if (pid == 0) child_exec(j, parent, ep[1]);
  close(ep[1]);
  int e = 0;
  ssize_t r;
  do r = read(ep[0], &e, sizeof e);
  while (r < 0 && errno == EINTR);
  close(ep[0]);
  if (r == (ssize_t)sizeof e) {
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    j->err = -e;
    return;
  }
  j->pid = pid;
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

static int spawn_via_thread(struct spawn_job *j) {
  pthread_mutex_lock(&sp_mu);
  if (!sp_running || sp_stop) {
    pthread_mutex_unlock(&sp_mu);
    return -ESHUTDOWN;
  }
  j->next = NULL;
  if (sp_tail) sp_tail->next = j;
  else sp_head = j;
  sp_tail = j;
  pthread_cond_broadcast(&sp_cond);
  while (!j->done) pthread_cond_wait(&sp_cond, &sp_mu);
  pthread_mutex_unlock(&sp_mu);
  return j->err;
}

/* ------------------------------------------------------------------ */
/* Jail arguments                                                      */
/* ------------------------------------------------------------------ */

static const char *const etc_ro[] = {
  /* /etc/ssl/private holds keys: only the public parts of /etc/ssl */
  "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "ssl/certs",
  "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf", "resolv.conf", "hosts", "nsswitch.conf", "host.conf",
  "gai.conf", "protocols", "services", "matplotlibrc", "mime.types", "python3", "python3.11",
  "bash.bashrc", "profile", "inputrc", "fonts", "magic", "magic.mime", "os-release",
  "debian_version", "login.defs", "terminfo", "mailcap", NULL,
};

static void jail_args(struct sv *a, const char *home, const char *tmp, int net, const char *cwd) {
  sv_add(a, BWRAP);
  sv_add(a, "--unshare-all");
  if (net) sv_add(a, "--share-net");
  sv_add(a, "--die-with-parent");
  sv_add(a, "--new-session");
  sv_add(a, "--uid");
  sv_add(a, "1000");
  sv_add(a, "--gid");
  sv_add(a, "1000");
  sv_add(a, "--hostname");
  sv_add(a, "e2b.local");
  sv_add(a, "--ro-bind");
  sv_add(a, "/usr");
  sv_add(a, "/usr");
  static const char *const top[] = { "bin", "sbin", "lib", "lib32", "lib64", "libx32", NULL };
  for (int i = 0; top[i]; i++) {
    char p[64], target[PATH_MAX];
    snprintf(p, sizeof p, "/%s", top[i]);
    struct stat st;
    if (lstat(p, &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      ssize_t n = readlink(p, target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      sv_add(a, "--symlink");
      sv_add(a, target);
      sv_add(a, p);
    } else if (S_ISDIR(st.st_mode)) {
      sv_add(a, "--ro-bind");
      sv_add(a, p);
      sv_add(a, p);
    }
  }
  for (int i = 0; etc_ro[i]; i++) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "/etc/%s", etc_ro[i]);
    sv_add(a, "--ro-bind-try");
    sv_add(a, p);
    sv_add(a, p);
  }
  static const char *const gen[] = { "passwd", "group", NULL };
  for (int i = 0; gen[i]; i++) {
    char src[PATH_MAX + 64], dst[64];
    snprintf(src, sizeof src, "%s/%s", g_etc, gen[i]);
    snprintf(dst, sizeof dst, "/etc/%s", gen[i]);
    sv_add(a, "--ro-bind");
    sv_add(a, src);
    sv_add(a, dst);
  }
  sv_add(a, "--proc");
  sv_add(a, "/proc");
  sv_add(a, "--dev");
  sv_add(a, "/dev");
  sv_add(a, "--tmpfs");
  sv_add(a, "/run");
  sv_add(a, "--dir");
  sv_add(a, "/var/tmp");
  if (home) {
    sv_add(a, "--bind");
    sv_add(a, home);
    sv_add(a, "/home/user");
  } else {
    sv_add(a, "--dir");
    sv_add(a, "/home/user");
  }
  if (tmp) {
    sv_add(a, "--bind");
    sv_add(a, tmp);
    sv_add(a, "/tmp");
  } else {
    sv_add(a, "--tmpfs");
    sv_add(a, "/tmp");
  }
  sv_add(a, "--chdir");
  sv_add(a, cwd ? cwd : "/home/user");
  sv_add(a, "--");
}

/* ------------------------------------------------------------------ */
/* Runtimes                                                            */
/* ------------------------------------------------------------------ */

static void rt_sub(const struct wbd_rt *rt, const char *sub, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", rt->dir, sub);
}

static struct wbd_rt *rt_new(struct wbd_sandbox *sb) {
  struct wbd_rt *rt = calloc(1, sizeof *rt);
  if (!rt) return NULL;
  snprintf(rt->id, sizeof rt->id, "%s", sb->id);
  snprintf(rt->dir, sizeof rt->dir, "%s/%s", g_data, sb->id);
  rt->allow_net = sb->allow_internet;
  char home[PATH_MAX + 128], tmp[PATH_MAX + 128];
  rt_sub(rt, "home", home, sizeof home);
  rt_sub(rt, "tmp", tmp, sizeof tmp);
  if (mkdir_p(rt->dir, 0755) != 0 || mkdir_p(home, 0755) != 0 || mkdir_p(tmp, 01777) != 0) {
    fprintf(stderr, "warmboxd: cannot create %s: %s\n", rt->dir, strerror(errno));
    rm_rf(rt->dir);
    free(rt);
    return NULL;
  }
  chmod(tmp, 01777);
  if (g_cg_root[0]) {
    snprintf(rt->cg, sizeof rt->cg, "%s/%s", g_cg_root, sb->id);
    if (mkdir(rt->cg, 0755) != 0 && errno != EEXIST) rt->cg[0] = 0;
  }
  pthread_mutex_init(&rt->mu, NULL);
  pthread_cond_init(&rt->cond, NULL);
  pthread_mutex_init(&rt->interp_mu, NULL);
  rt->refs = 1;
  rt->owner = 1;
  pthread_mutex_lock(&g_mu);
  rt->next = g_all;
  if (g_all) g_all->prev = rt;
  g_all = rt;
  pthread_mutex_unlock(&g_mu);
  return rt;
}

void wbd_rt_ref(struct wbd_rt *rt) {
  pthread_mutex_lock(&g_mu);
  rt->refs++;
  pthread_mutex_unlock(&g_mu);
}

void wbd_rt_put(struct wbd_rt *rt) {
  if (!rt) return;
  pthread_mutex_lock(&g_mu);
  if (--rt->refs > 0) {
    pthread_mutex_unlock(&g_mu);
    return;
  }
  if (rt->prev) rt->prev->next = rt->next;
  else g_all = rt->next;
  if (rt->next) rt->next->prev = rt->prev;
  pthread_cond_broadcast(&g_cond);
  pthread_mutex_unlock(&g_mu);
  wbd_interp_free(rt->interp);
  while (rt->procs) {
    struct rt_proc *p = rt->procs;
    rt->procs = p->next;
    free(p);
  }
  pthread_mutex_destroy(&rt->mu);
  pthread_cond_destroy(&rt->cond);
  pthread_mutex_destroy(&rt->interp_mu);
  free(rt);
}

struct wbd_rt *wbd_rt_get(struct wbd_sandbox *sb) {
  wbd_store_lock();
  struct wbd_rt *rt = sb->rt;
  if (sb->state == WBD_KILLED || rt == RT_KILLED || g_shut) {
    wbd_store_unlock();
    return NULL;
  }
  if (!rt) {
    rt = rt_new(sb);
    sb->rt = rt;
  }
  if (rt) wbd_rt_ref(rt);
  wbd_store_unlock();
  return rt;
}

int wbd_rt_isolated(void) { return g_isolated; }

void **wbd_rt_interp_slot(struct wbd_rt *rt) { return &rt->interp; }
pthread_mutex_t *wbd_rt_interp_mu(struct wbd_rt *rt) { return &rt->interp_mu; }

const char *wbd_rt_home(const struct wbd_sandbox *sb, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s/home", g_data[0] ? g_data : wbd_opt.data_dir, sb->id);
  return buf;
}

const char *wbd_rt_tmp(const struct wbd_sandbox *sb, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s/tmp", g_data[0] ? g_data : wbd_opt.data_dir, sb->id);
  return buf;
}

/* ------------------------------------------------------------------ */
/* Spawn, signal, wait                                                 */
/* ------------------------------------------------------------------ */

static int valid_env_key(const char *k) { return k[0] && !strchr(k, '='); }

static void env_set_from(json_t *env, json_t *src) {
  const char *k;
  json_t *v;
  json_object_foreach(src, k, v) {
    if (!valid_env_key(k)) continue;
    if (json_is_string(v)) json_object_set(env, k, v);
    else if (json_is_integer(v)) json_object_set_new(env, k, json_sprintf("%" JSON_INTEGER_FORMAT, json_integer_value(v)));
    else if (json_is_real(v)) json_object_set_new(env, k, json_sprintf("%g", json_real_value(v)));
    else if (json_is_boolean(v)) json_object_set_new(env, k, json_string(json_is_true(v) ? "true" : "false"));
  }
}

/* Jail path -> host path (unisolated mode). */
static void host_path(const struct wbd_rt *rt, const char *p, char *buf, size_t len) {
  if (strncmp(p, "/home/user", 10) == 0 && (p[10] == 0 || p[10] == '/'))
    snprintf(buf, len, "%s/home%s", rt->dir, p + 10);
  else if (strncmp(p, "/tmp", 4) == 0 && (p[4] == 0 || p[4] == '/'))
    snprintf(buf, len, "%s/tmp%s", rt->dir, p + 4);
  else snprintf(buf, len, "%s", p);
}

int wbd_rt_spawn_rt(struct wbd_rt *rt, char *const argv[], json_t *envs, const char *cwd, int inherit_stderr,
                    pid_t *pid, int *stdin_fd, int *stdout_fd, int *stderr_fd) {
  if (!argv || !argv[0]) return -EINVAL;
  if (!cwd || !*cwd) cwd = "/home/user";
  char home[PATH_MAX + 128], tmp[PATH_MAX + 128], hcwd[PATH_MAX + 128];
  rt_sub(rt, "home", home, sizeof home);
  rt_sub(rt, "tmp", tmp, sizeof tmp);

  /* Environment: defaults, then the sandbox's envVars, then `envs`. */
  json_t *env = json_object();
  json_object_set_new(env, "PATH", json_string(JAIL_PATH));
  json_object_set_new(env, "HOME", json_string(g_isolated ? "/home/user" : home));
  json_object_set_new(env, "USER", json_string("user"));
  json_object_set_new(env, "LOGNAME", json_string("user"));
  json_object_set_new(env, "SHELL", json_string("/bin/bash"));
  json_object_set_new(env, "LANG", json_string("C.UTF-8"));
  json_object_set_new(env, "E2B_SANDBOX", json_string("true"));
  json_object_set_new(env, "E2B_SANDBOX_ID", json_string(rt->id));
  struct wbd_sandbox *sb = wbd_sandbox_get(rt->id);
  if (sb) {
    wbd_store_lock();
    if (sb->env_vars) env_set_from(env, sb->env_vars);
    wbd_store_unlock();
    wbd_sandbox_unref(sb);
  }
  if (envs && json_is_object(envs)) env_set_from(env, envs);
  struct sv ev = { 0 };
  const char *k;
  json_t *v;
  json_object_foreach(env, k, v) {
    const char *s = json_string_value(v);
    size_t n = strlen(k) + strlen(s) + 2;
    char *kv = malloc(n);
    if (!kv) abort();
    snprintf(kv, n, "%s=%s", k, s);
    sv_add(&ev, kv);
    free(kv);
  }
  json_decref(env);

  struct sv av = { 0 };
  if (g_isolated) jail_args(&av, home, tmp, rt->allow_net, cwd);
  for (int i = 0; argv[i]; i++) sv_add(&av, argv[i]);
  if (!g_isolated) host_path(rt, cwd, hcwd, sizeof hcwd);

  int pin[2] = { -1, -1 }, pout[2] = { -1, -1 }, perr[2] = { -1, -1 };
  int rc = 0;
  if ((stdin_fd && pipe2(pin, O_CLOEXEC) != 0) || (stdout_fd && pipe2(pout, O_CLOEXEC) != 0) ||
      (stderr_fd && pipe2(perr, O_CLOEXEC) != 0))
    rc = -errno;

  struct spawn_job j;
  memset(&j, 0, sizeof j);
  j.argv = av.v;
  j.envp = ev.v;
  j.chdir_to = g_isolated ? NULL : hcwd;
  j.fds[0] = stdin_fd ? pin[0] : -1;
  j.fds[1] = stdout_fd ? pout[1] : -1;
  j.fds[2] = stderr_fd ? perr[1] : inherit_stderr ? -2 : -1;
  j.cg_fd = -1;

  pthread_mutex_lock(&rt->mu);
  if (!rc && rt->dead) rc = -ESRCH;
  if (!rc && rt->cg[0]) {
    char p[PATH_MAX + 128];
    snprintf(p, sizeof p, "%s/cgroup.procs", rt->cg);
    j.cg_fd = open(p, O_WRONLY | O_CLOEXEC);
  }
  struct rt_proc *pr = NULL;
  if (!rc) rc = spawn_via_thread(&j);
  if (!rc) {
    pr = calloc(1, sizeof *pr);
    if (!pr) abort();
    pr->pid = j.pid;
    pr->next = rt->procs;
    rt->procs = pr;
  }
  pthread_mutex_unlock(&rt->mu);
  if (j.cg_fd >= 0) close(j.cg_fd);
  sv_free(&av);
  sv_free(&ev);
  if (pin[0] >= 0) close(pin[0]);
  if (pout[1] >= 0) close(pout[1]);
  if (perr[1] >= 0) close(perr[1]);
  if (rc) {
    if (pin[1] >= 0) close(pin[1]);
    if (pout[0] >= 0) close(pout[0]);
    if (perr[0] >= 0) close(perr[0]);
    return rc;
  }
  *pid = j.pid;
  if (stdin_fd) *stdin_fd = pin[1];
  if (stdout_fd) *stdout_fd = pout[0];
  if (stderr_fd) *stderr_fd = perr[0];
  return 0;
}

int wbd_rt_spawn(struct wbd_sandbox *sb, char *const argv[], json_t *envs, const char *cwd, pid_t *pid,
                 int *stdin_fd, int *stdout_fd, int *stderr_fd) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return -ESRCH;
  int rc = wbd_rt_spawn_rt(rt, argv, envs, cwd, 0, pid, stdin_fd, stdout_fd, stderr_fd);
  wbd_rt_put(rt);
  return rc;
}

static struct rt_proc *find_proc(struct wbd_rt *rt, pid_t pid) {
  for (struct rt_proc *p = rt->procs; p; p = p->next)
    if (p->pid == pid) return p;
  return NULL;
}

int wbd_rt_signal_rt(struct wbd_rt *rt, pid_t pid, int sig) {
  pthread_mutex_lock(&rt->mu);
  struct rt_proc *p = find_proc(rt, pid);
  int alive = p && !p->exited;
  pthread_mutex_unlock(&rt->mu);
  if (!alive) return -ESRCH;
  pid_t *d;
  size_t n = descendants(&pid, 1, &d);
  int whole = sig == SIGKILL || sig == SIGSTOP || sig == SIGCONT;
  if (!g_isolated) kill(-pid, sig);
  /* In a jail, bwrap's own processes (the monitor, the namespace's init)
   * would die of most signals and take the jail with them: the signal is
   * for the program. */
  for (size_t i = 0; i < n; i++)
    if (whole || !g_isolated || !is_bwrap(d[i])) kill(d[i], sig);
  if (whole || !g_isolated) kill(pid, sig);
  free(d);
  return 0;
}

int wbd_rt_signal(struct wbd_sandbox *sb, pid_t pid, int sig) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return -ESRCH;
  int rc = wbd_rt_signal_rt(rt, pid, sig);
  wbd_rt_put(rt);
  return rc;
}

static void unlink_proc(struct wbd_rt *rt, struct rt_proc *p) {
  for (struct rt_proc **pp = &rt->procs; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      free(p);
      return;
    }
}

int wbd_rt_wait_rt(struct wbd_rt *rt, pid_t pid) {
  pthread_mutex_lock(&rt->mu);
  struct rt_proc *p = find_proc(rt, pid);
  if (!p) {
    pthread_mutex_unlock(&rt->mu);
    return W_EXITCODE(0, SIGKILL);
  }
  if (!p->exited) {
    p->waiters++;
    pthread_mutex_unlock(&rt->mu);
    /* Wait without reaping, so that the pid cannot be reused before the
     * record says it exited. */
    siginfo_t si;
    while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) != 0 && errno == EINTR) {}
    pthread_mutex_lock(&rt->mu);
    if (!p->exited) {
      int st = 0;
      pid_t r;
      do r = waitpid(pid, &st, 0);
      while (r < 0 && errno == EINTR);
      p->status = r == pid ? st : W_EXITCODE(0, SIGKILL);
      p->exited = 1;
    }
    p->waiters--;
  }
  int status = p->status;
  if (p->waiters == 0) unlink_proc(rt, p);
  pthread_cond_broadcast(&rt->cond);
  pthread_mutex_unlock(&rt->mu);
  return status;
}

int wbd_rt_wait(struct wbd_sandbox *sb, pid_t pid) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) {
    /* Killed meanwhile: the runtime reaped it. */
    return W_EXITCODE(0, SIGKILL);
  }
  int st = wbd_rt_wait_rt(rt, pid);
  wbd_rt_put(rt);
  return st;
}

/* ------------------------------------------------------------------ */
/* Pause, resume, kill                                                 */
/* ------------------------------------------------------------------ */

static size_t live_pids(struct wbd_rt *rt, pid_t **out) {
  size_t n = 0;
  for (struct rt_proc *p = rt->procs; p; p = p->next) n++;
  pid_t *v = calloc(n + 1, sizeof *v);  /* calloc: see descendants() */
  if (!v) abort();
  n = 0;
  for (struct rt_proc *p = rt->procs; p; p = p->next)
    if (!p->exited) v[n++] = p->pid;
  *out = v;
  return n;
}

/* Unisolated and without a freezer, a process that left its parent (setsid
 * and a double fork) is found by the E2B_SANDBOX_ID its environment
 * inherited. */
static void signal_tagged(const struct wbd_rt *rt, int sig) {
  char tag[64];
  int tlen = snprintf(tag, sizeof tag, "E2B_SANDBOX_ID=%s", rt->id);
  DIR *d = opendir("/proc");
  if (!d) return;
  struct dirent *e;
  static char buf[65536];  /* too big for a thread stack; guarded by buf_mu */
  static pthread_mutex_t buf_mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&buf_mu);
  while ((e = readdir(d))) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0) continue;
    for (ssize_t off = 0; off < r;) {
      const char *v = buf + off;
      size_t l = strnlen(v, (size_t)(r - off));
      if (l == (size_t)tlen && memcmp(v, tag, l) == 0) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid != getpid()) kill(pid, sig);
        break;
      }
      off += (ssize_t)l + 1;
    }
  }
  pthread_mutex_unlock(&buf_mu);
  closedir(d);
}

/* Under rt->mu. */
static void signal_tree_locked(struct wbd_rt *rt, int sig) {
  pid_t *roots, *d;
  size_t nr = live_pids(rt, &roots);
  size_t n = descendants(roots, nr, &d);
  for (size_t i = 0; i < nr; i++) kill(roots[i], sig);
  for (size_t i = 0; i < n; i++) kill(d[i], sig);
  if (!g_isolated) {
    for (size_t i = 0; i < nr; i++) kill(-roots[i], sig);
    if (!rt->cg[0]) signal_tagged(rt, sig);
  }
  free(roots);
  free(d);
}

/* End every process of the sandbox and reap the ones we started. */
static void kill_all_procs(struct wbd_rt *rt) {
  pthread_mutex_lock(&rt->mu);
  for (int round = 0; round < 3; round++) {
    if (rt->cg[0]) {
      pid_t *v;
      size_t n = cg_pids(rt->cg, &v);
      for (size_t i = 0; i < n; i++) kill(v[i], SIGKILL);
      free(v);
    }
    signal_tree_locked(rt, SIGKILL);
    if (rt->frozen) {
      if (rt->cg[0]) cg_set_state(rt->cg, "THAWED");
      rt->frozen = 0;
    }
  }
  /* Reap the ones nobody waits for; wait for the waiters to reap theirs. */
  for (struct rt_proc *p = rt->procs; p; p = p->next)
    if (!p->exited && p->waiters == 0) {
      int st = 0;
      pid_t r;
      do r = waitpid(p->pid, &st, 0);
      while (r < 0 && errno == EINTR);
      p->status = r == p->pid ? st : W_EXITCODE(0, SIGKILL);
      p->exited = 1;
    }
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 5;
  for (;;) {
    int pending = 0;
    for (struct rt_proc *p = rt->procs; p; p = p->next) pending |= !p->exited;
    if (!pending) break;
    if (pthread_cond_timedwait(&rt->cond, &rt->mu, &dl) == ETIMEDOUT) break;
  }
  /* Forget exited processes nobody will ask about. */
  for (struct rt_proc **pp = &rt->procs; *pp;) {
    struct rt_proc *p = *pp;
    if (p->exited && p->waiters == 0) {
      *pp = p->next;
      free(p);
    } else pp = &p->next;
  }
  pthread_mutex_unlock(&rt->mu);
  if (rt->cg[0]) {
    /* The jail's grandchildren die with their namespace; wait for them. */
    for (int i = 0; i < 500; i++) {
      pid_t *v;
      size_t n = cg_pids(rt->cg, &v);
      for (size_t k = 0; k < n; k++) kill(v[k], SIGKILL);
      free(v);
      if (n == 0) break;
      sleep_ms(10);
    }
  }
}

static void teardown(struct wbd_rt *rt, int remove) {
  wbd_interp_on_pause(rt, 0);
  pthread_mutex_lock(&rt->mu);
  if (remove) rt->dead = 1;
  pthread_mutex_unlock(&rt->mu);
  kill_all_procs(rt);
  if (remove) {
    rm_rf(rt->dir);
    if (rt->cg[0]) rmdir(rt->cg);
  }
}

static void drop_owner(struct wbd_rt *rt) {
  pthread_mutex_lock(&g_mu);
  int own = rt->owner;
  rt->owner = 0;
  pthread_mutex_unlock(&g_mu);
  if (own) wbd_rt_put(rt);
}

int wbd_rt_on_create(struct wbd_sandbox *sb) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return -1;
  wbd_rt_put(rt);
  return 0;
}

/* The sandbox's runtime, referenced, or NULL when it has none (no process
 * ever ran), was killed, or warmboxd is shutting down: nothing to pause or resume. */
static struct wbd_rt *rt_take_live(struct wbd_sandbox *sb) {
  wbd_store_lock();
  struct wbd_rt *rt = sb->rt;
  if (rt == RT_KILLED || !rt || g_shut) rt = NULL;
  else wbd_rt_ref(rt);
  wbd_store_unlock();
  return rt;
}

int wbd_rt_on_pause(struct wbd_sandbox *sb, int memory) {
  struct wbd_rt *rt = rt_take_live(sb);
  if (!rt) return 0;
  int rc = 0;
  if (!memory) {
    teardown(rt, 0);
  } else {
    wbd_interp_on_pause(rt, 1);
    pthread_mutex_lock(&rt->mu);
    if (!rt->frozen) {
      if (rt->cg[0]) {
        rc = cg_set_state(rt->cg, "FROZEN");
        if (rc) {
          fprintf(stderr, "warmboxd: cannot freeze %s: %s\n", rt->id, strerror(-rc));
          cg_set_state(rt->cg, "THAWED");
        }
      } else {
        signal_tree_locked(rt, SIGSTOP);
      }
      rt->frozen = rc == 0;
    }
    pthread_mutex_unlock(&rt->mu);
  }
  wbd_rt_put(rt);
  return rc ? -1 : 0;
}

int wbd_rt_on_resume(struct wbd_sandbox *sb) {
  struct wbd_rt *rt = rt_take_live(sb);
  if (!rt) return 0;
  pthread_mutex_lock(&rt->mu);
  if (rt->frozen) {
    if (rt->cg[0]) cg_set_state(rt->cg, "THAWED");
    else signal_tree_locked(rt, SIGCONT);
    rt->frozen = 0;
  }
  pthread_mutex_unlock(&rt->mu);
  wbd_rt_put(rt);
  return 0;
}

void wbd_rt_on_kill(struct wbd_sandbox *sb) {
  wbd_store_lock();
  struct wbd_rt *rt = sb->rt;
  sb->rt = RT_KILLED;
  int shut = g_shut;
  wbd_store_unlock();
  if (rt && rt != RT_KILLED && !shut) {
    teardown(rt, 1);
    drop_owner(rt);
  } else if (!shut && g_data[0]) {
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/%s", g_data, sb->id);
    rm_rf(dir);
  }
}

/* ------------------------------------------------------------------ */
/* Start-up and shutdown                                               */
/* ------------------------------------------------------------------ */

/* Freezer groups left by a warmboxd that was killed (SIGKILL skips the
 * clean-up): removed when their owner is gone and they hold no process. */
static void reap_stale_cgroups(void) {
  const char *root = "/sys/fs/cgroup/freezer";
  DIR *d = opendir(root);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    int pid;
    if (sscanf(e->d_name, "warmboxd-%d", &pid) != 1 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    char top[PATH_MAX];
    snprintf(top, sizeof top, "%s/%s", root, e->d_name);
    DIR *sd = opendir(top);
    if (sd) {
      struct dirent *se;
      while ((se = readdir(sd)))
        if (se->d_type == DT_DIR && se->d_name[0] != '.') {
          char sub[PATH_MAX + 300];
          snprintf(sub, sizeof sub, "%s/%s", top, se->d_name);
          cg_set_state(sub, "THAWED");
          rmdir(sub);  /* fails, and stays, while it holds a process */
        }
      closedir(sd);
    }
    rmdir(top);
  }
  closedir(d);
}

/* Runs a trivial jail; 0 when bubblewrap works. why gets bwrap's complaint. */
static int check_bwrap(char *why, size_t len) {
  why[0] = 0;
  if (access(BWRAP, X_OK) != 0) {
    snprintf(why, len, "%s not found (install Debian's bubblewrap)", BWRAP);
    return -1;
  }
  struct sv a = { 0 };
  jail_args(&a, NULL, NULL, 0, "/");
  sv_add(&a, "/bin/true");
  int ep[2];
  if (pipe2(ep, O_CLOEXEC) != 0) {
    sv_free(&a);
    snprintf(why, len, "pipe: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(ep[1], 2);
    int nul = open("/dev/null", O_RDWR);
    dup2(nul, 0);
    dup2(nul, 1);
    execv(a.v[0], a.v);
    _exit(127);
  }
  close(ep[1]);
  size_t got = 0;
  if (pid > 0) {
    ssize_t r;
    while (got + 1 < len && (r = read(ep[0], why + got, len - 1 - got)) != 0) {
      if (r < 0) {
        if (errno == EINTR) continue;
        break;
      }
      got += (size_t)r;
    }
  }
  why[got] = 0;
  while (got > 0 && (why[got - 1] == '\n' || why[got - 1] == '\r')) why[--got] = 0;
  close(ep[0]);
  sv_free(&a);
  if (pid < 0) {
    snprintf(why, len, "fork: %s", strerror(errno));
    return -1;
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  if (!why[0]) snprintf(why, len, "exit status %d", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  return -1;
}

int wbd_rt_init(void) {
  if (!wbd_opt.data_dir) {
    fprintf(stderr, "warmboxd: no data directory\n");
    return -1;
  }
  int rc = mkdir_p(wbd_opt.data_dir, 0755);
  if (rc) {
    fprintf(stderr, "warmboxd: cannot create %s: %s\n", wbd_opt.data_dir, strerror(-rc));
    return -1;
  }
  /* Absolute, for bubblewrap's binds and HOME in unisolated mode. */
  if (!realpath(wbd_opt.data_dir, g_data)) {
    fprintf(stderr, "warmboxd: cannot resolve %s: %s\n", wbd_opt.data_dir, strerror(errno));
    return -1;
  }
  snprintf(g_etc, sizeof g_etc, "%s/.warmboxd-etc", g_data);
  char p[PATH_MAX + 64];
  if (mkdir_p(g_etc, 0755) != 0) {
    fprintf(stderr, "warmboxd: cannot create %s\n", g_etc);
    return -1;
  }
  snprintf(p, sizeof p, "%s/passwd", g_etc);
  write_new_file(p, "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n"
                    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
  snprintf(p, sizeof p, "%s/group", g_etc);
  write_new_file(p, "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n");

  char why[512];
  int ok = check_bwrap(why, sizeof why) == 0;
  if (wbd_opt.unisolated) {
    fprintf(stderr,
            "warmboxd: WARNING: --unisolated: sandboxes run as plain processes WITHOUT isolation; code in a\n"
            "warmboxd: WARNING: sandbox can read and change every file warmboxd can and use the network.\n");
    g_isolated = 0;
  } else if (!ok) {
    fprintf(stderr,
            "warmboxd: bubblewrap cannot run here (%s), so sandboxes cannot be isolated.\n"
            "warmboxd: pass --unisolated to run them as plain processes anyway (unsafe: code in a sandbox\n"
            "warmboxd: could then read and change every file warmboxd can).\n",
            why[0] ? why : "unknown error");
    rm_rf(g_etc);
    return -1;
  } else {
    g_isolated = 1;
  }

  reap_stale_cgroups();
  /* WARMBOXD_NO_FREEZER=1 (for tests) takes the SIGSTOP path even where the
   * freezer is available. */
  const char *nofreeze = getenv("WARMBOXD_NO_FREEZER");
  snprintf(g_cg_root, sizeof g_cg_root, "/sys/fs/cgroup/freezer/warmboxd-%d", (int)getpid());
  if ((nofreeze && strcmp(nofreeze, "1") == 0) || mkdir(g_cg_root, 0755) != 0) {
    if (wbd_opt.verbose)
      fprintf(stderr, "warmboxd: no cgroup freezer (%s): pausing with SIGSTOP\n", strerror(errno));
    g_cg_root[0] = 0;
  }

  pthread_mutex_lock(&sp_mu);
  sp_stop = 0;
  if (pthread_create(&sp_thread, NULL, spawner, NULL) != 0) {
    pthread_mutex_unlock(&sp_mu);
    fprintf(stderr, "warmboxd: cannot start the spawner thread\n");
    return -1;
  }
  sp_running = 1;
  pthread_mutex_unlock(&sp_mu);
  g_shut = 0;
  return 0;
}

void wbd_rt_shutdown(void) {
  pthread_mutex_lock(&g_mu);
  if (g_shut) {
    pthread_mutex_unlock(&g_mu);
    return;
  }
  size_t n = 0;
  for (struct wbd_rt *rt = g_all; rt; rt = rt->next) n++;
  struct wbd_rt **v = calloc(n + 1, sizeof *v);
  if (!v) abort();
  n = 0;
  for (struct wbd_rt *rt = g_all; rt; rt = rt->next) {
    rt->refs++;
    v[n++] = rt;
  }
  pthread_mutex_unlock(&g_mu);
  for (size_t i = 0; i < n; i++) {
    teardown(v[i], 1);
    drop_owner(v[i]);
  }
  for (size_t i = 0; i < n; i++) wbd_rt_put(v[i]);
  free(v);
  wbd_store_lock();
  g_shut = 1;
  wbd_store_unlock();
  /* Kernel threads let go of their runtimes once their processes are gone. */
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 10;
  pthread_mutex_lock(&g_mu);
  while (g_all && pthread_cond_timedwait(&g_cond, &g_mu, &dl) != ETIMEDOUT) {}
  if (g_all) fprintf(stderr, "warmboxd: some sandbox runtimes are still referenced at exit\n");
  pthread_mutex_unlock(&g_mu);

  pthread_mutex_lock(&sp_mu);
  int running = sp_running;
  sp_stop = 1;
  sp_running = 0;
  pthread_cond_broadcast(&sp_cond);
  pthread_mutex_unlock(&sp_mu);
  if (running) pthread_join(sp_thread, NULL);
  if (g_cg_root[0]) rmdir(g_cg_root);
  if (g_etc[0]) rm_rf(g_etc);
}
