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
 * The pieces below this file are declared in jail.h: the spawner thread
 * that forks every child (spawn.c), the sandbox's network namespace
 * (net.c), the seccomp filter (seccomp.c) and a root instance's uid range
 * (uidmap.c).
 */
#include "jail.h"
#include "util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <sys/random.h>
#include <grp.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <stddef.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BWRAP "/usr/bin/bwrap"
/* One host uid per live sandbox when warmboxd is root: base + slot. */
#define UID_SLOTS        4096
#define UID_BASE_DEFAULT 1900000000u
/* Where a root warmboxd locks its uid range (uidmap.c). */
#define UID_LOCK_DIR     "/run/warmboxd"
#define PIDS_MAX_DEFAULT 256
static const char *const cg_ctrl[CG_N] = {"freezer", "memory", "pids", "cpu"};

/* Host paths (as bubblewrap sees them) of what a jail binds, NULL: none. */
struct jail_src {
  const char *home, *tmp, *passwd, *group;
  const char *resolv; /* slirp4netns's DNS (10.0.2.3), or NULL: the host's resolv.conf */
  const char *root;   /* the sandbox's persistent `/` (root_prepare), or NULL: a tmpfs per process */
  long memory_mb;     /* the sandbox's memoryMB (0: the default), for /dev/shm */
};

/* A root warmboxd's jails bind what their child staged (jail.h, STAGE). */
static const struct jail_src g_staged = {STAGED_PATHS, 0};

/* ------------------------------------------------------------------ */
/* State                                                               */
/* ------------------------------------------------------------------ */

struct rt_proc {
  pid_t pid;
  int waiters; /* threads inside wbd_rt_wait for it */
  int exited;
  int status;
  struct rt_proc *next;
};

struct wbd_rt {
  pthread_mutex_t mu;  /* procs, frozen, dead */
  pthread_cond_t cond; /* a tracked process was reaped */
  int refs;            /* under g_mu */
  int owner;           /* sb->rt's reference is still held (under g_mu) */
  char id[32];
  char name[32]; /* wbd_rt_name(id): what the host sees (dir, cgroups) */
  char dir[PATH_MAX + 64];
  char cg[PATH_MAX + 64];        /* freezer group, "" without one */
  char cgx[CG_N][PATH_MAX + 64]; /* memory, pids, cpu groups ([CG_FREEZER] unused), "" without */
  int allow_net;
  long memory_mb; /* the sandbox's memoryMB */
  int cpu_count;  /* and cpuCount */
  uid_t uid;      /* host uid and gid of the jail's processes */
  gid_t gid;
  int slot;           /* uid slot (root only), -1 */
  int mounted;        /* dir is a size-limited tmpfs */
  struct wbd_net net; /* its network namespace (net.checked: under mu) */
  int frozen;
  int dead; /* torn down: no new processes */
  struct rt_proc *procs;
  pthread_mutex_t interp_mu;
  void *interp;
  const struct wbd_rt_hooks *hooks; /* the interpreter's, with interp; NULL before */
  char boot_id[40];                 /* this boot's /proc/sys/kernel/random/boot_id, with "\n" */
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
static char g_cgx_root[CG_N][PATH_MAX]; /* memory, pids, cpu parents, "" without */
static char g_etc[PATH_MAX + 32];
static int g_root; /* warmboxd is host root: jails get their own host uid */
static uid_t g_uid_base = UID_BASE_DEFAULT;
static unsigned char g_slots[UID_SLOTS]; /* under g_mu */
static int g_private_mnt;                /* warmboxd has its own mount namespace: homes are tmpfs */
static long g_pids_max = PIDS_MAX_DEFAULT, g_disk_mb = WBD_DISK_MB;
static char g_data[PATH_MAX];        /* wbd_opt.data_dir, absolute */
static unsigned char g_name_key[32]; /* wbd_rt_name's key, random per process */

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

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

/* Removes the tree at path, however deep: one directory descriptor at a
 * time, descending with openat and climbing back with "..", checked against
 * the device and inode recorded on the way down (no path is ever longer
 * than one name, so depth beyond PATH_MAX is fine). Stops at the first
 * entry it cannot remove. Only called once the sandbox's processes are gone. */
struct di {
  dev_t dev;
  ino_t ino;
};

/* The directories from the top down to the one open now (v[depth]). */
struct di_path {
  struct di *v;
  size_t depth, cap;
};

/* One pass over the directory open at fd, unlinking what it can: 0 when it
 * is empty now, 1 with *sub (malloc'd) a subdirectory to empty first, -1
 * when an entry cannot be removed. */
static int rm_entries(int fd, char **sub) {
  /* A jailed process may have made a directory unreadable to itself. */
  if (fchmod(fd, 0700) != 0) {
  }
  int dfd = dup(fd);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0) close(dfd);
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (unlinkat(fd, e->d_name, 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) {
      rc = -1;
      break;
    }
    if (unlinkat(fd, e->d_name, AT_REMOVEDIR) == 0 || errno == ENOENT) continue;
    if (errno == ENOTEMPTY || errno == EEXIST || errno == EACCES) {
      *sub = strdup(e->d_name);
      if (!*sub) abort();
      rc = 1;
    } else {
      rc = -1;
    }
  }
  closedir(d);
  return rc;
}

/* Opens sub (freed) below fd, recorded in p: its fd, or -1. */
static int rm_descend(int fd, char *sub, struct di_path *p) {
  /* Not root: our own directory made unreadable is made readable first. */
  if (fchmodat(fd, sub, 0700, 0) != 0) {
  }
  int nfd = openat(fd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat ns;
  free(sub);
  if (nfd < 0 || fstat(nfd, &ns) != 0) {
    if (nfd >= 0) close(nfd);
    return -1;
  }
  if (p->depth + 1 == p->cap) {
    p->cap *= 2;
    struct di *nv = realloc(p->v, p->cap * sizeof *nv);
    if (!nv) abort();
    p->v = nv;
  }
  p->v[++p->depth] = (struct di){ns.st_dev, ns.st_ino};
  return nfd;
}

/* Opens fd's parent, which must be the one p recorded above it: its fd, or
 * -1 (said on stderr: the tree was moved meanwhile). */
static int rm_climb(int fd, struct di_path *p, const char *path) {
  int pfd = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  struct stat ps;
  const struct di *up = &p->v[p->depth - 1];
  if (pfd < 0 || fstat(pfd, &ps) != 0 || ps.st_dev != up->dev || ps.st_ino != up->ino) {
    if (pfd >= 0) close(pfd);
    fprintf(stderr, "warmboxd: %s changed while it was removed; stopped\n", path);
    return -1;
  }
  p->depth--;
  return pfd;
}

static void rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    unlink(path);
    return;
  }
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct di_path p = {malloc(64 * sizeof(struct di)), 0, 64};
  if (!p.v) abort();
  p.v[0] = (struct di){st.st_dev, st.st_ino};
  for (;;) {
    char *sub = NULL;
    int rc = rm_entries(fd, &sub);
    /* Empty at the top: done. */
    if (rc < 0 || (rc == 0 && p.depth == 0)) break;
    int next = rc == 1 ? rm_descend(fd, sub, &p) : rm_climb(fd, &p, path);
    if (next < 0) break;
    close(fd);
    fd = next;
  }
  close(fd);
  free(p.v);
  rmdir(path);
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
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
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
  pid_t *v = calloc(cap, sizeof *v); /* calloc: gcc -O2 cannot see every slot read was written */
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
    char buf[32] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r > 0 && strncmp(buf, state, strlen(state)) == 0) return 0;
    struct timespec ts = {0, wait_us * 1000L};
    nanosleep(&ts, NULL);
    waited_us += wait_us;
    if (wait_us < 5000) wait_us *= 2;
  }
  return -ETIMEDOUT;
}

/* A group is removable once its last task is gone; that can lag a kill. */
static void cg_rmdir(const char *cg) {
  for (int i = 0; i < 50 && rmdir(cg) != 0 && errno == EBUSY; i++) sleep_ms(10);
}

/* ------------------------------------------------------------------ */
/* Jail arguments                                                      */
/* ------------------------------------------------------------------ */

static const char *const etc_ro[] = {
  /* /etc/ssl/private holds keys: only the public parts of /etc/ssl */
  "alternatives",    "ld.so.cache",
  "ld.so.conf",      "ld.so.conf.d",
  "localtime",       "timezone",
  "ssl/certs",       "ssl/openssl.cnf",
  "ca-certificates", "ca-certificates.conf",
  "hosts",           "nsswitch.conf",
  "host.conf",       "gai.conf",
  "protocols",       "services",
  "matplotlibrc",    "mime.types",
  "python3",         "python3.11",
  "bash.bashrc",     "profile",
  "inputrc",         "fonts",
  "magic",           "magic.mime",
  "os-release",      "debian_version",
  "login.defs",      "terminfo",
  "mailcap",         NULL,
};

/* embed/'s files, compiled in (cmake/embed.cmake). */
const unsigned char *wbd_embedded(const char *name, size_t *len);

/* A file of NUL-separated bubblewrap arguments setting exactly the
 * environment in `ev` ("K=V" strings): --clearenv, then --setenv K V each.
 * A memfd, as the environment may be larger than a pipe holds. Returns its
 * fd at offset 0, or -1. */
static int env_args_fd(const struct wbd_sv *ev) {
  int fd = memfd_create("wbd-env", MFD_CLOEXEC);
  if (fd < 0) return -1;
  FILE *f = fdopen(dup(fd), "w");
  if (!f) {
    close(fd);
    return -1;
  }
  fputs("--clearenv", f);
  fputc(0, f);
  for (size_t i = 0; i < ev->n; i++) {
    const char *kv = ev->v[i], *eq = strchr(kv, '=');
    fputs("--setenv", f);
    fputc(0, f);
    fwrite(kv, 1, (size_t)(eq - kv), f);
    fputc(0, f);
    fputs(eq + 1, f);
    fputc(0, f);
  }
  int bad = ferror(f);
  if (fclose(f) != 0 || bad || lseek(fd, 0, SEEK_SET) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* The host's top-level trees the jail binds read-only (or re-creates as the
 * same symlinks, /bin -> usr/bin on a merged-/usr system), besides /usr. */
static const char *const top_dirs[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", NULL};

/* shared_net: the process already is in the sandbox's network namespace. */
/* boot_fd: bubblewrap's fd holding the boot id, or -1; sudo_fd: holding
 * embed/sudo, or -1. keep_tty: the process was given a pty of its own as
 * its controlling terminal (spawn_job.ctty), which bubblewrap must not
 * detach it from; every other jail gets a new session without one. */
static void jail_args(struct wbd_sv *a, const char *id, const struct jail_src *f, int shared_net, int seccomp_fd,
                      int boot_fd, int sudo_fd, int keep_tty, const char *cwd) {
  wbd_sv_add(a, BWRAP);
  if (seccomp_fd >= 0) {
    char n[16];
    snprintf(n, sizeof n, "%d", seccomp_fd);
    wbd_sv_add(a, "--seccomp");
    wbd_sv_add(a, n);
  }
  /* Names the sandbox's runtime (wbd_rt_name: not its id, which every
   * local user could read here) in bubblewrap's command line (ps, tests);
   * the jail's own environment (E2B_SANDBOX_ID...) comes by --args. */
  wbd_sv_add3(a, "--setenv", "WARMBOXD_RUNTIME", id);
  wbd_sv_add(a, "--unshare-all");
  wbd_sv_add(a, "--unshare-user");
  /* No nested user namespaces: they open kernel surface a sandbox needs not. */
  wbd_sv_add(a, "--disable-userns");
  if (shared_net) wbd_sv_add(a, "--share-net");
  wbd_sv_add(a, "--die-with-parent");
  if (!keep_tty) wbd_sv_add(a, "--new-session");
  wbd_sv_add(a, "--uid");
  wbd_sv_add(a, "1000");
  wbd_sv_add(a, "--gid");
  wbd_sv_add(a, "1000");
  wbd_sv_add(a, "--hostname");
  wbd_sv_add(a, "e2b.local");
  /* The sandbox's own `/`, the same for every process and kept across
   * pauses; everything below is mounted on top of it, on mount points
   * root_prepare made (the jail's user may not create them there). */
  if (f->root) wbd_sv_add3(a, "--bind", f->root, "/");
  wbd_sv_add(a, "--ro-bind");
  wbd_sv_add(a, "/usr");
  wbd_sv_add(a, "/usr");
  for (int i = 0; top_dirs[i]; i++) {
    char p[64], target[PATH_MAX];
    snprintf(p, sizeof p, "/%s", top_dirs[i]);
    struct stat st;
    if (lstat(p, &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      if (f->root) continue; /* root_prepare made it */
      ssize_t n = readlink(p, target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      wbd_sv_add(a, "--symlink");
      wbd_sv_add(a, target);
      wbd_sv_add(a, p);
    } else if (S_ISDIR(st.st_mode)) {
      wbd_sv_add(a, "--ro-bind");
      wbd_sv_add(a, p);
      wbd_sv_add(a, p);
    }
  }
  for (int i = 0; etc_ro[i]; i++) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "/etc/%s", etc_ro[i]);
    wbd_sv_add(a, "--ro-bind-try");
    wbd_sv_add(a, p);
    wbd_sv_add(a, p);
  }
  /* The host's resolver may listen on its loopback (127.0.0.53), out of
   * reach: internet jails ask slirp4netns's forwarder. */
  if (f->resolv)
    wbd_sv_add3(a, "--ro-bind", f->resolv, "/etc/resolv.conf");
  else
    wbd_sv_add3(a, "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf");
  if (f->passwd) wbd_sv_add3(a, "--ro-bind", f->passwd, "/etc/passwd");
  if (f->group) wbd_sv_add3(a, "--ro-bind", f->group, "/etc/group");
  wbd_sv_add(a, "--proc");
  wbd_sv_add(a, "/proc");
  if (boot_fd >= 0) {
    /* Each boot of the sandbox (a start, a resume from its files) has its
     * own boot id, as a VM has; a resume with memory keeps it. */
    char n[16];
    snprintf(n, sizeof n, "%d", boot_fd);
    wbd_sv_add3(a, "--ro-bind-data", n, "/proc/sys/kernel/random/boot_id");
  }
  if (sudo_fd >= 0) {
    /* E2B's user has sudo: a stub that runs the command as the same user
     * (the jail has no privilege to give). /usr/local/bin (on PATH, login
     * shells' too) becomes a read-only tmpfs holding only it: the host's own
     * /usr/local/bin is not the sandbox's business either. */
    char n[16];
    snprintf(n, sizeof n, "%d", sudo_fd);
    wbd_sv_add(a, "--tmpfs");
    wbd_sv_add(a, "/usr/local/bin");
    wbd_sv_add(a, "--perms");
    wbd_sv_add(a, "0755");
    wbd_sv_add3(a, "--ro-bind-data", n, "/usr/local/bin/sudo");
    wbd_sv_add(a, "--remount-ro");
    wbd_sv_add(a, "/usr/local/bin");
  }
  wbd_sv_add(a, "--dev");
  wbd_sv_add(a, "/dev");
  /* /dev/shm: a tmpfs of its own (bubblewrap's /dev has no size limit),
   * half the memory limit as on a VM; in the user namespace of the jail, so
   * without root too. */
  char shm[32];
  snprintf(shm, sizeof shm, "%lld", (long long)(f->memory_mb > 0 ? f->memory_mb : WBD_MEMORY_MB) << 19);
  wbd_sv_add(a, "--perms");
  wbd_sv_add(a, "01777");
  wbd_sv_add(a, "--size");
  wbd_sv_add(a, shm);
  wbd_sv_add(a, "--tmpfs");
  wbd_sv_add(a, "/dev/shm");
  if (!f->root) {
    wbd_sv_add(a, "--size");
    wbd_sv_add(a, "16777216");
    wbd_sv_add(a, "--tmpfs");
    wbd_sv_add(a, "/run");
    wbd_sv_add(a, "--dir");
    wbd_sv_add(a, "/var/tmp");
  } /* else the root's own /run and /var/tmp */
  /* bubblewrap mounts binds nosuid (and nodev, without --dev-bind). */
  if (f->home) {
    wbd_sv_add3(a, "--bind", f->home, "/home/user");
  } else {
    wbd_sv_add(a, "--dir");
    wbd_sv_add(a, "/home/user");
  }
  if (f->tmp) {
    wbd_sv_add3(a, "--bind", f->tmp, "/tmp");
  } else {
    wbd_sv_add(a, "--tmpfs");
    wbd_sv_add(a, "/tmp");
  }
  wbd_sv_add(a, "--chdir");
  wbd_sv_add(a, cwd ? cwd : "/home/user");
  wbd_sv_add(a, "--");
}

/* ------------------------------------------------------------------ */
/* Runtimes                                                            */
/* ------------------------------------------------------------------ */

static void rt_sub(const struct wbd_rt *rt, const char *sub, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", rt->dir, sub);
}

static int cg_write(const char *cg, const char *file, long long v) {
  char path[PATH_MAX + 128], val[32];
  snprintf(path, sizeof path, "%s/%s", cg, file);
  snprintf(val, sizeof val, "%lld", v);
  return write_file(path, val);
}

/* The sandbox's memory, pids and cpu groups, with their limits. A group that
 * cannot be made or limited is left out (rlimits stand in, see spawn). */
static void cg_make(struct wbd_rt *rt) {
  for (int i = 0; i < CG_N; i++) {
    rt->cgx[i][0] = 0;
    if (i == CG_FREEZER || !g_cgx_root[i][0]) continue;
    char *p = rt->cgx[i];
    snprintf(p, sizeof rt->cgx[i], "%.*s/%s", PATH_MAX, g_cgx_root[i], rt->name);
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
      p[0] = 0;
      continue;
    }
    int rc = 0;
    if (i == CG_MEMORY) {
      rc = cg_write(p, "memory.limit_in_bytes", (long long)rt->memory_mb << 20);
      /* With swap accounting, swap counts too (else a hog just swaps). */
      cg_write(p, "memory.memsw.limit_in_bytes", (long long)rt->memory_mb << 20);
    } else if (i == CG_PIDS) {
      rc = cg_write(p, "pids.max", g_pids_max);
    } else if (i == CG_CPU) {
      /* cpuCount cores at most, and half the weight of warmboxd's own group. */
      rc = cg_write(p, "cpu.cfs_quota_us", 100000LL * rt->cpu_count);
      if (!rc) rc = cg_write(p, "cpu.shares", 512);
    }
    if (rc) {
      rmdir(p);
      p[0] = 0;
    }
  }
}

static int slot_take(void) {
  pthread_mutex_lock(&g_mu);
  int s = -1;
  for (int i = 0; i < UID_SLOTS && s < 0; i++)
    if (!g_slots[i]) {
      g_slots[i] = 1;
      s = i;
    }
  pthread_mutex_unlock(&g_mu);
  return s;
}

static void slot_give(int s) {
  if (s < 0) return;
  pthread_mutex_lock(&g_mu);
  g_slots[s] = 0;
  pthread_mutex_unlock(&g_mu);
}

/* A random (version 4) UUID and a newline, as the kernel's boot_id. */
static void new_boot_id(char *buf, size_t len) {
  wbd_uuid4(buf, len - 1);
  size_t n = strlen(buf);
  buf[n] = '\n';
  buf[n + 1] = 0;
}

/* The sandbox's `/` (<dir>/root, in the sandbox's tmpfs with home and
 * /tmp): what bubblewrap binds as the jail's root before mounting the rest
 * on it, so a file written anywhere else (/opt/app, /root, /etc/myapp, /run)
 * is the same for every process and kept across pauses, as on E2B's VM. Its
 * skeleton belongs to warmboxd, not to the jail's user, who can therefore
 * not swap a mount point for a symlink: every mount point jail_args uses
 * (host trees, /etc's bound files, /proc, /dev, /home/user, /tmp), the
 * host's top-level symlinks, and the user's own /root, /run and /var/tmp.
 * Without root, warmboxd and the jail's user are one uid: the user owns it
 * all (and can only break its own jail). */
static int root_prepare(const struct wbd_rt *rt, const char *root) {
  static const char *const dirs[] = {"", "usr", "proc", "dev", "etc", "home", "home/user", "tmp", "var", NULL};
  char p[PATH_MAX + 256];
  for (int i = 0; dirs[i]; i++) {
    snprintf(p, sizeof p, "%s/%s", root, dirs[i]);
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
  }
  for (int i = 0; top_dirs[i]; i++) {
    char hp[64], target[PATH_MAX];
    snprintf(hp, sizeof hp, "/%s", top_dirs[i]);
    struct stat st;
    if (lstat(hp, &st) != 0) continue;
    snprintf(p, sizeof p, "%s/%s", root, top_dirs[i]);
    if (S_ISLNK(st.st_mode)) {
      ssize_t n = readlink(hp, target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      if (symlink(target, p) != 0 && errno != EEXIST) return -1;
    } else if (S_ISDIR(st.st_mode) && mkdir(p, 0755) != 0 && errno != EEXIST) {
      return -1;
    }
  }
  static const char *const etc_own[] = {"passwd", "group", "resolv.conf", NULL};
  for (int pass = 0; pass < 2; pass++) {
    const char *const *list = pass ? etc_own : etc_ro;
    for (int i = 0; list[i]; i++) {
      int is_dir = 0;
      if (!pass) { /* --ro-bind-try: only what the host has */
        char hp[PATH_MAX];
        struct stat st;
        snprintf(hp, sizeof hp, "/etc/%s", list[i]);
        if (stat(hp, &st) != 0) continue;
        is_dir = S_ISDIR(st.st_mode);
      }
      snprintf(p, sizeof p, "%s/etc/%s", root, list[i]);
      char *slash = strrchr(p, '/');
      *slash = 0;
      int rc = mkdir_p(p, 0755);
      *slash = '/';
      if (rc != 0) return -1;
      if (is_dir) {
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
      } else {
        int fd = open(p, O_CREAT | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0) return -1;
        close(fd);
      }
    }
  }
  static const struct {
    const char *name;
    mode_t mode;
  } own[] = {
    {"root", 0700},
    {"run", 0755},
    {"var/tmp", 01777},
  };
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", root, own[i].name);
    if ((mkdir(p, own[i].mode) != 0 && errno != EEXIST) || chown(p, rt->uid, rt->gid) != 0 ||
        chmod(p, own[i].mode) != 0)
      return -1;
  }
  return 0;
}

/* jail is `s` or one of its ancestors. */
static int holds(const char *jail, const char *s) {
  size_t n = strlen(jail);
  if (strcmp(jail, "/") == 0) return 1;
  return strncmp(s, jail, n) == 0 && (s[n] == 0 || s[n] == '/');
}

int wbd_rt_skeleton(const char *jail) {
  static const char *const fixed[] = {
    "/usr",     "/proc",       "/dev",       "/home/user",       "/tmp", "/root", "/run",
    "/var/tmp", "/etc/passwd", "/etc/group", "/etc/resolv.conf", NULL};
  if (!g_isolated || !jail || !*jail) return 0;
  for (int i = 0; fixed[i]; i++)
    if (holds(jail, fixed[i])) return 1;
  char p[PATH_MAX];
  for (int i = 0; top_dirs[i]; i++) {
    snprintf(p, sizeof p, "/%s", top_dirs[i]);
    if (holds(jail, p)) return 1;
  }
  for (int i = 0; etc_ro[i]; i++) {
    snprintf(p, sizeof p, "/etc/%s", etc_ro[i]);
    if (holds(jail, p)) return 1;
  }
  return 0;
}

static struct wbd_rt *rt_new(struct wbd_sandbox *sb) {
  struct wbd_rt *rt = calloc(1, sizeof *rt);
  if (!rt) return NULL;
  snprintf(rt->id, sizeof rt->id, "%s", sb->id);
  wbd_rt_name(sb->id, rt->name, sizeof rt->name);
  snprintf(rt->dir, sizeof rt->dir, "%s/%s", g_data, rt->name);
  rt->allow_net = sb->allow_internet;
  rt->memory_mb = sb->memory_mb > 0 ? sb->memory_mb : WBD_MEMORY_MB;
  rt->cpu_count = sb->cpu_count > 0 ? sb->cpu_count : WBD_CPU_COUNT;
  wbd_net_clear(&rt->net);
  rt->slot = -1;
  new_boot_id(rt->boot_id, sizeof rt->boot_id);
  rt->uid = geteuid();
  rt->gid = getegid();
  if (g_isolated && g_root) {
    rt->slot = slot_take();
    if (rt->slot < 0) {
      fprintf(stderr, "warmboxd: no free jail uid (%d sandboxes)\n", UID_SLOTS);
      free(rt);
      return NULL;
    }
    rt->uid = (uid_t)(g_uid_base + (unsigned)rt->slot);
    rt->gid = (gid_t)rt->uid;
  }
  char home[PATH_MAX + 128], tmp[PATH_MAX + 128];
  rt_sub(rt, "home", home, sizeof home);
  rt_sub(rt, "tmp", tmp, sizeof tmp);
  int ok = mkdir_p(rt->dir, 0700) == 0;
  if (ok && g_private_mnt) {
    /* home and /tmp share one tmpfs of diskSizeMB, in warmboxd's own mount
     * namespace (gone with it); the pages the sandbox writes count toward its
     * memory group, those envd's uploads write toward warmboxd's: so it is
     * no larger than memoryMB either, and an upload cannot put more in it
     * than the sandbox could itself (a full tmpfs refuses it, 507). */
    char opts[96];
    long size_mb = g_disk_mb < rt->memory_mb ? g_disk_mb : rt->memory_mb;
    snprintf(opts, sizeof opts, "size=%ldm,mode=0700,nr_inodes=262144", size_mb);
    rt->mounted = mount("tmpfs", rt->dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) == 0;
    if (!rt->mounted) fprintf(stderr, "warmboxd: cannot mount a tmpfs on %s: %s\n", rt->dir, strerror(errno));
  }
  ok = ok && mkdir_p(home, 0700) == 0 && mkdir_p(tmp, 0700) == 0;
  if (ok && g_isolated) {
    /* Only the jail's uid reaches in (the child stages them for bubblewrap). */
    ok = chmod(rt->dir, 0700) == 0 && chown(home, rt->uid, rt->gid) == 0 && chown(tmp, rt->uid, rt->gid) == 0 &&
         chmod(home, 0700) == 0 && chmod(tmp, 01777) == 0;
  } else if (ok) {
    chmod(tmp, 01777);
  }
  if (ok && g_isolated) {
    char root[PATH_MAX + 128];
    rt_sub(rt, "root", root, sizeof root);
    ok = root_prepare(rt, root) == 0;
  }
  int net_failed = 0;
  if (ok && g_isolated) {
    int rc = wbd_net_make(&rt->net, rt->allow_net);
    if (rc) {
      fprintf(stderr, "warmboxd: cannot make the network of %s: %s\n", rt->id, strerror(-rc));
      ok = 0;
      net_failed = 1;
    }
  }
  if (!ok) {
    if (!net_failed) fprintf(stderr, "warmboxd: cannot create %s: %s\n", rt->dir, strerror(errno));
    wbd_net_end(&rt->net);
    wbd_net_close(&rt->net);
    if (rt->mounted) umount2(rt->dir, MNT_DETACH);
    rm_rf(rt->dir);
    slot_give(rt->slot);
    free(rt);
    return NULL;
  }
  if (g_cg_root[0]) {
    snprintf(rt->cg, sizeof rt->cg, "%s/%s", g_cg_root, rt->name);
    if (mkdir(rt->cg, 0755) != 0 && errno != EEXIST) rt->cg[0] = 0;
  }
  cg_make(rt);
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
  if (rt->prev)
    rt->prev->next = rt->next;
  else
    g_all = rt->next;
  if (rt->next) rt->next->prev = rt->prev;
  pthread_cond_broadcast(&g_cond);
  pthread_mutex_unlock(&g_mu);
  if (rt->hooks && rt->hooks->free_slot) rt->hooks->free_slot(rt->interp);
  wbd_net_end(&rt->net);
  wbd_net_close(&rt->net);
  slot_give(rt->slot);
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

static void teardown(struct wbd_rt *rt, int remove);
static void drop_owner(struct wbd_rt *rt);
static struct wbd_rt *rt_take_live(struct wbd_sandbox *sb);

/* Serialises making runtimes, which happens outside the store lock (it
 * starts processes). */
static pthread_mutex_t g_new_mu = PTHREAD_MUTEX_INITIALIZER;

static struct wbd_rt *take_locked(struct wbd_sandbox *sb, int *dead) {
  struct wbd_rt *rt = sb->rt;
  *dead = sb->state == WBD_KILLED || rt == RT_KILLED || g_shut;
  if (*dead) return NULL;
  if (rt) wbd_rt_ref(rt);
  return rt;
}

struct wbd_rt *wbd_rt_get(struct wbd_sandbox *sb) {
  int dead;
  wbd_store_lock();
  struct wbd_rt *rt = take_locked(sb, &dead);
  wbd_store_unlock();
  if (rt || dead) return rt;
  pthread_mutex_lock(&g_new_mu);
  wbd_store_lock();
  rt = take_locked(sb, &dead);
  wbd_store_unlock();
  if (!rt && !dead) {
    struct wbd_rt *made = rt_new(sb);
    if (made) {
      wbd_store_lock();
      rt = take_locked(sb, &dead);
      if (!dead) {
        sb->rt = made;
        wbd_rt_ref(made);
        rt = made;
        made = NULL;
      }
      wbd_store_unlock();
      if (made) {
        /* Killed while it was being made. */
        teardown(made, 1);
        drop_owner(made);
      }
    }
  }
  pthread_mutex_unlock(&g_new_mu);
  return rt;
}

int wbd_rt_isolated(void) {
  return g_isolated;
}

long wbd_rt_memory_mb(const struct wbd_rt *rt) {
  return rt->memory_mb;
}

long wbd_rt_oom_kills(struct wbd_rt *rt) {
  if (!rt->cgx[CG_MEMORY][0]) return -1;
  char path[PATH_MAX + 128], line[128];
  snprintf(path, sizeof path, "%s/memory.oom_control", rt->cgx[CG_MEMORY]);
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  long n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "oom_kill %ld", &n) == 1) break;
  fclose(f);
  return n;
}

void **wbd_rt_interp_slot(struct wbd_rt *rt) {
  return &rt->interp;
}
void wbd_rt_set_hooks(struct wbd_rt *rt, const struct wbd_rt_hooks *hooks) {
  rt->hooks = hooks;
}
pthread_mutex_t *wbd_rt_interp_mu(struct wbd_rt *rt) {
  return &rt->interp_mu;
}

const char *wbd_rt_home(const struct wbd_sandbox *sb, char *buf, size_t len) {
  char name[32];
  wbd_rt_name(sb->id, name, sizeof name);
  snprintf(buf, len, "%s/%s/home", g_data[0] ? g_data : wbd_opt.data_dir, name);
  return buf;
}

const char *wbd_rt_tmp(const struct wbd_sandbox *sb, char *buf, size_t len) {
  char name[32];
  wbd_rt_name(sb->id, name, sizeof name);
  snprintf(buf, len, "%s/%s/tmp", g_data[0] ? g_data : wbd_opt.data_dir, name);
  return buf;
}

/* Path `p` is `prefix` or below it; *rest: what follows ("." for itself). */
static int path_under(const char *p, const char *prefix, const char **rest) {
  size_t n = strlen(prefix);
  if (strncmp(p, prefix, n) != 0 || (p[n] != 0 && p[n] != '/')) return 0;
  *rest = p[n] ? p + n + 1 : ".";
  return 1;
}

int wbd_rt_locate(const struct wbd_sandbox *sb, const char *jail, char *host, size_t hlen, const char **rest) {
  const char *data = g_data[0] ? g_data : wbd_opt.data_dir;
  const char *r;
  char name[32];
  wbd_rt_name(sb->id, name, sizeof name);
  int n = -1, kind = WBD_TREE_OWN;
  if (path_under(jail, "/home/user", &r)) {
    n = snprintf(host, hlen, "%s/%s/home", data, name);
  } else if (path_under(jail, "/tmp", &r)) {
    n = snprintf(host, hlen, "%s/%s/tmp", data, name);
  } else if (!g_isolated || path_under(jail, "/proc", &r) || path_under(jail, "/dev", &r) ||
             path_under(jail, "/sys", &r) || path_under(jail, "/usr/local/bin", &r)) {
    /* Not the sandbox's, or a view of its own per process (jail_args). */
    return -EACCES;
  } else if (path_under(jail, "/usr", &r)) {
    kind = WBD_TREE_HOST;
    n = snprintf(host, hlen, "/usr");
  } else {
    for (int i = 0; top_dirs[i] && n < 0; i++) {
      char top[16];
      struct stat st;
      snprintf(top, sizeof top, "/%s", top_dirs[i]);
      if (path_under(jail, top, &r) && lstat(top, &st) == 0 && S_ISDIR(st.st_mode)) {
        kind = WBD_TREE_HOST;
        n = snprintf(host, hlen, "%s", top);
      }
    }
    if (n < 0 && path_under(jail, "/etc", &r) && strcmp(r, ".") != 0) {
      /* The generated files, then the host's bound ones: a directory is its
       * own tree (nothing beside it in the host's /etc is reachable), a file
       * is served from the host's /etc by its one name. */
      static const char *const own[] = {"passwd", "group", NULL};
      for (int i = 0; own[i] && n < 0; i++)
        if (strcmp(r, own[i]) == 0) n = snprintf(host, hlen, "%s", g_etc);
      if (n < 0 && strcmp(r, "resolv.conf") == 0)
        n = sb->allow_internet ? snprintf(host, hlen, "%s", g_etc) : snprintf(host, hlen, "/etc");
      for (int i = 0; etc_ro[i] && n < 0; i++) {
        char e[PATH_MAX];
        const char *below;
        struct stat st;
        snprintf(e, sizeof e, "/etc/%s", etc_ro[i]);
        if (!path_under(jail, e, &below) || stat(e, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
          r = below;
          n = snprintf(host, hlen, "%s", e);
        } else if (strcmp(below, ".") == 0) {
          r = strrchr(jail, '/') + 1;
          n = snprintf(host, hlen, "%.*s", (int)(r - 1 - jail), jail);
        }
      }
      if (n >= 0) kind = WBD_TREE_HOST;
    }
    if (n < 0) { /* everything else is the sandbox's own root */
      r = jail[1] ? jail + 1 : ".";
      n = snprintf(host, hlen, "%s/%s/root", data, name);
    }
  }
  if (n < 0 || (size_t)n >= hlen) return -ENAMETOOLONG;
  *rest = r;
  return kind;
}

/* ------------------------------------------------------------------ */
/* Spawn, signal, wait                                                 */
/* ------------------------------------------------------------------ */

static int valid_env_key(const char *k) {
  return k[0] && !strchr(k, '=') && !wbd_env_refused(k);
}

static void env_set_from(json_t *env, json_t *src) {
  const char *k;
  json_t *v;
  json_object_foreach(src, k, v) {
    if (!valid_env_key(k)) continue;
    if (json_is_string(v))
      json_object_set(env, k, v);
    else if (json_is_integer(v))
      json_object_set_new(env, k, json_sprintf("%" JSON_INTEGER_FORMAT, json_integer_value(v)));
    else if (json_is_real(v))
      json_object_set_new(env, k, json_sprintf("%g", json_real_value(v)));
    else if (json_is_boolean(v))
      json_object_set_new(env, k, json_string(json_is_true(v) ? "true" : "false"));
  }
}

/* Jail path -> host path (unisolated mode). */
static void host_path(const struct wbd_rt *rt, const char *p, char *buf, size_t len) {
  if (strncmp(p, "/home/user", 10) == 0 && (p[10] == 0 || p[10] == '/'))
    snprintf(buf, len, "%s/home%s", rt->dir, p + 10);
  else if (strncmp(p, "/tmp", 4) == 0 && (p[4] == 0 || p[4] == '/'))
    snprintf(buf, len, "%s/tmp%s", rt->dir, p + 4);
  else
    snprintf(buf, len, "%s", p);
}

/* One spawn's parts, from the request to the tracked process (spawn_rt owns
 * them; spawn_release lets them go). */
struct spawn {
  struct wbd_sv env;  /* the command's environment, "K=V" */
  struct wbd_sv argv; /* what the spawner execs: bubblewrap and the command, or the command */
  char home[PATH_MAX + 128], tmp[PATH_MAX + 128], root[PATH_MAX + 128];    /* the sandbox's trees */
  char passwd[PATH_MAX + 64], group[PATH_MAX + 64], resolv[PATH_MAX + 64]; /* the generated /etc files */
  char hcwd[PATH_MAX + 128]; /* unisolated: the working directory on the host */
  /* What bubblewrap reads, -1: the seccomp program, the boot id, embed/sudo
   * and its environment's arguments; its fds 3, 4, ... in this order. */
  int seccomp_fd, boot_fd, sudo_fd, env_fd;
  int in[2], out[2], err[2]; /* the std pipes asked for, -1 */
};

static void spawn_init(struct spawn *s, const struct wbd_rt *rt) {
  memset(&s->env, 0, sizeof s->env);
  memset(&s->argv, 0, sizeof s->argv);
  rt_sub(rt, "home", s->home, sizeof s->home);
  rt_sub(rt, "tmp", s->tmp, sizeof s->tmp);
  rt_sub(rt, "root", s->root, sizeof s->root);
  snprintf(s->passwd, sizeof s->passwd, "%s/passwd", g_etc);
  snprintf(s->group, sizeof s->group, "%s/group", g_etc);
  snprintf(s->resolv, sizeof s->resolv, "%s/resolv.conf", g_etc);
  s->hcwd[0] = 0;
  s->seccomp_fd = s->boot_fd = s->sudo_fd = s->env_fd = -1;
  for (int i = 0; i < 2; i++) s->in[i] = s->out[i] = s->err[i] = -1;
}

/* What the jail binds from the host (resolv.conf: only with internet). */
static struct jail_src spawn_src(const struct wbd_rt *rt, const struct spawn *s) {
  struct jail_src own = {s->home, s->tmp,       s->passwd, s->group, rt->allow_net ? s->resolv : NULL,
                         s->root, rt->memory_mb};
  return own;
}

/* The command's environment: defaults, then the sandbox's envVars, then
 * `envs` (refused and malformed keys left out). */
static void spawn_env(const struct wbd_rt *rt, const char *home, json_t *envs, struct wbd_sv *ev) {
  json_t *env = json_object();
  json_object_set_new(env, "PATH", json_string(JAIL_PATH));
  json_object_set_new(env, "HOME", json_string(home));
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
  const char *k;
  json_t *v;
  json_object_foreach(env, k, v) {
    const char *str = json_string_value(v);
    size_t n = strlen(k) + strlen(str) + 2;
    char *kv = malloc(n);
    if (!kv) abort();
    snprintf(kv, n, "%s=%s", k, str);
    wbd_sv_add(ev, kv);
    free(kv);
  }
  json_decref(env);
}

/* What bubblewrap reads besides its arguments: the seccomp filter (none
 * where there is no program), this boot's id, embed/sudo, and the
 * environment as arguments (env_args_fd). 0 or -EMFILE (a jail never
 * starts without its filter). */
static int bwrap_fds(struct wbd_rt *rt, struct spawn *s) {
  int no_filter = wbd_seccomp_pipe(&s->seccomp_fd) != 0;
  char boot[sizeof rt->boot_id];
  pthread_mutex_lock(&rt->mu);
  memcpy(boot, rt->boot_id, sizeof boot);
  pthread_mutex_unlock(&rt->mu);
  s->boot_fd = wbd_data_pipe(boot, strlen(boot));
  size_t sudo_len = 0;
  const unsigned char *sudo_src = wbd_embedded("sudo", &sudo_len);
  if (sudo_src) s->sudo_fd = wbd_data_pipe(sudo_src, sudo_len);
  /* The tenant's environment is the jailed command's alone: bubblewrap
   * itself runs with a fixed one (job_fill), so nothing a tenant sets
   * (LD_PRELOAD, LD_AUDIT, ...) reaches ld.so before the namespaces, the
   * pivot and the seccomp filter exist. It reaches bubblewrap as
   * --clearenv and --setenv arguments read from a file (--args FD), not
   * its command line, which every host user can read. */
  s->env_fd = env_args_fd(&s->env);
  return no_filter || s->boot_fd < 0 || (sudo_src && s->sudo_fd < 0) || s->env_fd < 0 ? -EMFILE : 0;
}

/* bubblewrap's command line: the jail (jail_args, with bwrap_fds' fds as
 * bubblewrap will number them), then --args for the environment, then
 * "--" (the command follows). */
static void bwrap_args(const struct wbd_rt *rt, const struct spawn *s, int keep_tty, const char *cwd,
                       struct wbd_sv *av) {
  int next = 3;
  int seccomp_n = s->seccomp_fd >= 0 ? next++ : -1;
  int boot_n = s->boot_fd >= 0 ? next++ : -1;
  int sudo_n = s->sudo_fd >= 0 ? next++ : -1;
  struct jail_src src = spawn_src(rt, s), staged = g_staged;
  staged.memory_mb = rt->memory_mb;
  if (!rt->allow_net) staged.resolv = NULL;
  jail_args(av, rt->name, g_root ? &staged : &src, 1, seccomp_n, boot_n, sudo_n, keep_tty, cwd);
  char n[16];
  snprintf(n, sizeof n, "%d", next++);
  free(av->v[--av->n]); /* jail_args' closing "--": the arguments go before it */
  av->v[av->n] = NULL;
  wbd_sv_add(av, "--args");
  wbd_sv_add(av, n);
  wbd_sv_add(av, "--");
}

/* The pipes for the std fds the caller asked for. 0 or -errno. */
static int std_pipes(struct spawn *s, const int *stdin_fd, const int *stdout_fd, const int *stderr_fd) {
  if ((stdin_fd && pipe2(s->in, O_CLOEXEC) != 0) || (stdout_fd && pipe2(s->out, O_CLOEXEC) != 0) ||
      (stderr_fd && pipe2(s->err, O_CLOEXEC) != 0))
    return -errno;
  return 0;
}

/* What the child execs, with which fds 0-2 (tty_fd >= 0: that terminal on
 * all three, as its controlling one), and where. */
static void job_fill(struct spawn_job *j, struct spawn *s, int tty_fd) {
  static char *bwrap_env[] = {"PATH=" JAIL_PATH, NULL};
  wbd_job_init(j);
  j->argv = s->argv.v;
  j->envp = g_isolated ? bwrap_env : s->env.v;
  j->chdir_to = g_isolated ? NULL : s->hcwd;
  j->fds[0] = s->in[0];
  j->fds[1] = s->out[1];
  j->fds[2] = s->err[1];
  if (tty_fd >= 0) {
    for (int i = 0; i < 3; i++) j->fds[i] = tty_fd;
    j->ctty = 1;
  }
}

/* Under rt->mu: the child joins the sandbox's groups before its exec (their
 * cgroup.procs, opened here); without a memory or pids group, per-process
 * rlimits stand in. */
static void job_groups(const struct wbd_rt *rt, struct spawn_job *j) {
  const char *groups[CG_N] = {rt->cg, rt->cgx[CG_MEMORY], rt->cgx[CG_PIDS], rt->cgx[CG_CPU]};
  for (int i = 0; i < CG_N; i++)
    if (groups[i][0]) {
      char p[PATH_MAX + 128];
      snprintf(p, sizeof p, "%s/cgroup.procs", groups[i]);
      j->cg_fd[i] = open(p, O_WRONLY | O_CLOEXEC);
    }
  if (j->cg_fd[CG_PIDS] < 0 && g_isolated) j->nproc = g_pids_max;
  if (j->cg_fd[CG_MEMORY] < 0 && g_isolated) j->data_mb = rt->memory_mb;
}

/* Under rt->mu, isolated: bubblewrap's fds, the staging of the jail's
 * binds (root), the sandbox's network namespace (ready) and host uid. */
static void job_jail(struct wbd_rt *rt, struct spawn_job *j, const struct spawn *s) {
  const int bw[] = {s->seccomp_fd, s->boot_fd, s->sudo_fd, s->env_fd};
  for (size_t i = 0; i < sizeof bw / sizeof *bw; i++)
    if (bw[i] >= 0) j->pass[j->npass++] = bw[i];
  if (g_root) {
    struct jail_src src = spawn_src(rt, s);
    const char *stage[N_STAGED] = {src.home, src.tmp, src.passwd, src.group, src.resolv, src.root};
    j->stage = 1;
    memcpy(j->stage_src, stage, sizeof stage);
  }
  j->net_fd = rt->net.net_fd;
  j->userns_fd = rt->net.userns_fd;
  j->setid = g_root;
  j->uid = rt->uid;
  j->gid = rt->gid;
  wbd_net_wait_ready(&rt->net, rt->id);
}

/* Starts the job in the sandbox and tracks its process: 0, -ESRCH when the
 * sandbox is torn down, -EAGAIN when it is frozen, or wbd_spawn's error. */
static int spawn_tracked(struct wbd_rt *rt, struct spawn_job *j, const struct spawn *s) {
  int rc = 0;
  pthread_mutex_lock(&rt->mu);
  if (rt->dead) rc = -ESRCH;
  /* A frozen sandbox (a pause that won the race with this request) gets no
   * new process: the child would join the frozen group before its exec and
   * the spawner would wait for it forever, holding up every sandbox. A pause
   * takes rt->mu to freeze, so it waits for a spawn in flight instead. */
  else if (rt->frozen)
    rc = -EAGAIN;
  if (!rc) {
    job_groups(rt, j);
    if (g_isolated) job_jail(rt, j, s);
    rc = wbd_spawn(j);
  }
  if (!rc) {
    struct rt_proc *pr = calloc(1, sizeof *pr);
    if (!pr) abort();
    pr->pid = j->pid;
    pr->next = rt->procs;
    rt->procs = pr;
  }
  pthread_mutex_unlock(&rt->mu);
  for (int i = 0; i < CG_N; i++)
    if (j->cg_fd[i] >= 0) close(j->cg_fd[i]);
  return rc;
}

static void close_fd(int fd) {
  if (fd >= 0) close(fd);
}

/* Frees what the spawn holds and closes the child's ends of its pipes;
 * `failed`: the caller's ends too (else they are the caller's now). */
static void spawn_release(struct spawn *s, int failed) {
  wbd_sv_free(&s->argv);
  wbd_sv_free(&s->env);
  const int fds[] = {s->seccomp_fd, s->boot_fd, s->sudo_fd, s->env_fd, s->in[0], s->out[1], s->err[1]};
  for (size_t i = 0; i < sizeof fds / sizeof *fds; i++) close_fd(fds[i]);
  if (failed) {
    close_fd(s->in[1]);
    close_fd(s->out[0]);
    close_fd(s->err[0]);
  }
}

/* tty_fd >= 0: a pty's slave end, the child's fds 0-2 and controlling
 * terminal (the std fd pointers are then NULL). */
static int spawn_rt(struct wbd_rt *rt, char *const argv[], json_t *envs, const char *cwd, int tty_fd, pid_t *pid,
                    int *stdin_fd, int *stdout_fd, int *stderr_fd) {
  if (!argv || !argv[0]) return -EINVAL;
  if (!cwd || !*cwd) cwd = "/home/user";
  struct spawn s;
  spawn_init(&s, rt);
  spawn_env(rt, g_isolated ? "/home/user" : s.home, envs, &s.env);
  int rc = 0;
  if (g_isolated) {
    rc = bwrap_fds(rt, &s);
    bwrap_args(rt, &s, tty_fd >= 0, cwd, &s.argv);
  } else {
    host_path(rt, cwd, s.hcwd, sizeof s.hcwd);
  }
  for (int i = 0; argv[i]; i++) wbd_sv_add(&s.argv, argv[i]);
  if (!rc) rc = std_pipes(&s, stdin_fd, stdout_fd, stderr_fd);
  struct spawn_job j;
  job_fill(&j, &s, tty_fd);
  if (!rc) rc = spawn_tracked(rt, &j, &s);
  spawn_release(&s, rc != 0);
  if (rc) return rc;
  *pid = j.pid;
  if (stdin_fd) *stdin_fd = s.in[1];
  if (stdout_fd) *stdout_fd = s.out[0];
  if (stderr_fd) *stderr_fd = s.err[0];
  return 0;
}

int wbd_rt_spawn_rt(struct wbd_rt *rt, char *const argv[], json_t *envs, const char *cwd, int inherit_stderr,
                    pid_t *pid, int *stdin_fd, int *stdout_fd, int *stderr_fd) {
  (void)inherit_stderr;
  return spawn_rt(rt, argv, envs, cwd, -1, pid, stdin_fd, stdout_fd, stderr_fd);
}

int wbd_rt_spawn_pty(struct wbd_sandbox *sb, char *const argv[], json_t *envs, const char *cwd, unsigned cols,
                     unsigned rows, pid_t *pid, int *master_fd) {
  /* The pty comes from warmboxd's devpts; the jail holds only its slave
   * end, as fds 0-2 (its own /dev/pts instance does not show it). */
  int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (m < 0) return -errno;
  char name[64];
  int s = -1;
  if (grantpt(m) == 0 && unlockpt(m) == 0 && ptsname_r(m, name, sizeof name) == 0)
    s = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  struct winsize ws = {.ws_row = (unsigned short)(rows ? rows : 24), .ws_col = (unsigned short)(cols ? cols : 80)};
  if (s < 0 || ioctl(m, TIOCSWINSZ, &ws) != 0) {
    int e = errno ? errno : EIO;
    if (s >= 0) close(s);
    close(m);
    return -e;
  }
  struct wbd_rt *rt = wbd_rt_get(sb);
  int rc = rt ? spawn_rt(rt, argv, envs, cwd, s, pid, NULL, NULL, NULL) : -ESRCH;
  if (rt) wbd_rt_put(rt);
  close(s);
  if (rc != 0) {
    close(m);
    return rc;
  }
  *master_fd = m;
  return 0;
}

void wbd_rt_boot_id(struct wbd_sandbox *sb, char *buf, size_t len) {
  struct wbd_rt *rt = rt_take_live(sb);
  if (len) buf[0] = 0;
  if (!rt) return;
  pthread_mutex_lock(&rt->mu);
  snprintf(buf, len, "%s", rt->boot_id);
  pthread_mutex_unlock(&rt->mu);
  wbd_rt_put(rt);
}

int wbd_rt_spawn(struct wbd_sandbox *sb, char *const argv[], json_t *envs, const char *cwd, pid_t *pid, int *stdin_fd,
                 int *stdout_fd, int *stderr_fd) {
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
  /* SIGKILL: the process we started first, so that its status is always
   * "killed" (bwrap's monitor would otherwise report its child's 137). */
  if (sig == SIGKILL) kill(pid, sig);
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
    while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
    }
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
  pid_t *v = calloc(n + 1, sizeof *v); /* calloc: see descendants() */
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
  static char buf[65536]; /* too big for a thread stack; guarded by buf_mu */
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

/* /proc/PID/stat read into buf, from its command's closing ")" on (the
 * command may hold spaces and parentheses); NULL when it cannot be read. */
static const char *proc_stat(int pid, char *buf, size_t len) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "re");
  if (!f) return NULL;
  size_t n = fread(buf, 1, len - 1, f);
  fclose(f);
  buf[n] = 0;
  return strrchr(buf, ')');
}

/* Whether pid runs, waits for a CPU or is in an uninterruptible wait. */
static int proc_busy(pid_t pid) {
  char buf[512];
  const char *end = proc_stat((int)pid, buf, sizeof buf);
  return end && end[1] == ' ' && (end[2] == 'R' || end[2] == 'D');
}

int wbd_rt_settling(struct wbd_sandbox *sb) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return 0;
  pid_t *roots, *d;
  pthread_mutex_lock(&rt->mu);
  size_t nr = live_pids(rt, &roots);
  pthread_mutex_unlock(&rt->mu);
  size_t n = descendants(roots, nr, &d);
  int busy = 0;
  for (size_t i = 0; i < n && !busy; i++) busy = proc_busy(d[i]);
  free(roots);
  free(d);
  wbd_rt_put(rt);
  return busy;
}

int wbd_rt_port_socket(struct wbd_sandbox *sb) {
  if (!g_isolated) return -ENOENT; /* no namespace: the host's own ports are not the sandbox's */
  struct wbd_rt *rt = rt_take_live(sb);
  if (!rt) return -ENOENT;
  pthread_mutex_lock(&rt->mu);
  int net = rt->dead || rt->net.net_fd < 0 ? -1 : fcntl(rt->net.net_fd, F_DUPFD_CLOEXEC, 0);
  int userns = net >= 0 && rt->net.userns_fd >= 0 ? fcntl(rt->net.userns_fd, F_DUPFD_CLOEXEC, 0) : -1;
  int lost = net >= 0 && rt->net.userns_fd >= 0 && userns < 0;
  pthread_mutex_unlock(&rt->mu);
  wbd_rt_put(rt);
  int fd = net < 0 || lost ? -ENOENT : wbd_net_socket(net, userns);
  if (net >= 0) close(net);
  if (userns >= 0) close(userns);
  return fd;
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
    } else
      pp = &p->next;
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

static void interp_pause(struct wbd_rt *rt, int memory) {
  pthread_mutex_lock(&rt->interp_mu);
  const struct wbd_rt_hooks *h = rt->hooks;
  pthread_mutex_unlock(&rt->interp_mu);
  if (h && h->on_pause) h->on_pause(rt, memory);
}

static void teardown(struct wbd_rt *rt, int remove) {
  interp_pause(rt, 0);
  pthread_mutex_lock(&rt->mu);
  if (remove) rt->dead = 1;
  pthread_mutex_unlock(&rt->mu);
  kill_all_procs(rt);
  if (remove) {
    wbd_net_end(&rt->net);
    if (rt->mounted) {
      umount2(rt->dir, MNT_DETACH);
      rt->mounted = 0;
    }
    rm_rf(rt->dir);
    if (rt->cg[0]) rmdir(rt->cg);
    for (int i = 0; i < CG_N; i++)
      if (rt->cgx[i][0]) cg_rmdir(rt->cgx[i]);
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
  if (rt == RT_KILLED || !rt || g_shut)
    rt = NULL;
  else
    wbd_rt_ref(rt);
  wbd_store_unlock();
  return rt;
}

int wbd_rt_on_pause(struct wbd_sandbox *sb, int memory) {
  struct wbd_rt *rt = rt_take_live(sb);
  if (!rt) return 0;
  int rc = 0;
  if (!memory) {
    teardown(rt, 0);
    /* The next process starts a new boot (a resume from the files only). */
    pthread_mutex_lock(&rt->mu);
    new_boot_id(rt->boot_id, sizeof rt->boot_id);
    pthread_mutex_unlock(&rt->mu);
  } else {
    interp_pause(rt, 1);
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
    if (rt->cg[0])
      cg_set_state(rt->cg, "THAWED");
    else
      signal_tree_locked(rt, SIGCONT);
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
    char dir[PATH_MAX + 64], name[32];
    wbd_rt_name(sb->id, name, sizeof name);
    snprintf(dir, sizeof dir, "%s/%s", g_data, name);
    rm_rf(dir);
  }
}

int wbd_rt_release(struct wbd_sandbox *sb) {
  wbd_store_lock();
  struct wbd_rt *rt = sb->rt;
  int dead = rt == RT_KILLED || g_shut || sb->state == WBD_KILLED;
  if (!dead) sb->rt = NULL;
  wbd_store_unlock();
  if (dead) return -1;
  if (rt) {
    teardown(rt, 1);
    drop_owner(rt);
  }
  return 0;
}

const char *wbd_rt_dir(const struct wbd_rt *rt) {
  return rt->dir;
}

void wbd_rt_remove_tree(const char *path) {
  rm_rf(path);
}

void wbd_rt_owner(const struct wbd_rt *rt, uid_t *uid, gid_t *gid) {
  *uid = rt->uid;
  *gid = rt->gid;
}

/* Holds the jail's processes still (freezer, or SIGSTOP) without the
 * pause's other effects (streams keep their connections): for a copy of its
 * files. Returns 1 when it froze them (then call it again with on = 0). */
int wbd_rt_hold(struct wbd_rt *rt, int on) {
  int did = 0;
  pthread_mutex_lock(&rt->mu);
  if (on && !rt->frozen) {
    if (rt->cg[0])
      did = cg_set_state(rt->cg, "FROZEN") == 0;
    else {
      signal_tree_locked(rt, SIGSTOP);
      did = 1;
    }
    rt->frozen = did;
  } else if (!on && rt->frozen) {
    if (rt->cg[0])
      cg_set_state(rt->cg, "THAWED");
    else
      signal_tree_locked(rt, SIGCONT);
    rt->frozen = 0;
  }
  pthread_mutex_unlock(&rt->mu);
  return did;
}

/* ------------------------------------------------------------------ */
/* Start-up and shutdown                                               */
/* ------------------------------------------------------------------ */

/* The jail processes a killed warmboxd left in group `cg` (frozen, if it
 * paused them): killed, then thawed so that they die. */
static void end_orphans(const char *cg, int freezer) {
  for (int i = 0; i < 200; i++) {
    pid_t *v;
    size_t n = cg_pids(cg, &v);
    for (size_t k = 0; k < n; k++) kill(v[k], SIGKILL);
    free(v);
    if (freezer) cg_set_state(cg, "THAWED");
    if (n == 0) return;
    sleep_ms(10);
  }
}

/* A process that exists and is not a zombie (a killed warmboxd whose parent
 * never reaps it is dead all the same). */
static int owner_alive(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  char buf[512];
  const char *rp = proc_stat(pid, buf, sizeof buf);
  return !(rp && rp[1] == ' ' && rp[2] == 'Z');
}

/* A gone warmboxd's group `top` (its sandboxes' groups in it): their
 * processes ended, the groups removed. */
static void reap_group(const char *top, int freezer) {
  DIR *sd = opendir(top);
  if (sd) {
    struct dirent *se;
    while ((se = readdir(sd)))
      if (se->d_type == DT_DIR && se->d_name[0] != '.') {
        char sub[PATH_MAX + 300];
        snprintf(sub, sizeof sub, "%s/%s", top, se->d_name);
        end_orphans(sub, freezer);
        rmdir(sub); /* fails, and stays, while it holds a process */
      }
    closedir(sd);
  }
  rmdir(top);
}

/* Groups left by a warmboxd that was killed (SIGKILL skips the clean-up):
 * when their owner is gone, their processes are ended and they are removed. */
static void reap_stale_cgroups(const char *ctrl) {
  char root[64];
  snprintf(root, sizeof root, "/sys/fs/cgroup/%s", ctrl);
  int freezer = strcmp(ctrl, "freezer") == 0;
  DIR *d = opendir(root);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    int pid;
    if (sscanf(e->d_name, "warmboxd-%d", &pid) != 1 || pid <= 0) continue;
    if (owner_alive(pid)) continue;
    char top[PATH_MAX];
    snprintf(top, sizeof top, "%s/%s", root, e->d_name);
    reap_group(top, freezer);
  }
  closedir(d);
}

void wbd_cgroups_reap(int pid) {
  for (int i = 0; i < CG_N; i++) {
    char top[128];
    snprintf(top, sizeof top, "/sys/fs/cgroup/%s/warmboxd-%d", cg_ctrl[i], pid);
    reap_group(top, i == CG_FREEZER);
  }
}

/* Runs a trivial jail; 0 when bubblewrap works. why gets bwrap's complaint. */
static int check_bwrap(char *why, size_t len) {
  why[0] = 0;
  if (access(BWRAP, X_OK) != 0) {
    snprintf(why, len, "%s not found (install Debian's bubblewrap)", BWRAP);
    return -1;
  }
  struct wbd_sv a = {0};
  struct jail_src none = {NULL, NULL, NULL, NULL, NULL, NULL, 0};
  jail_args(&a, "check", &none, 0, -1, -1, -1, 0, "/");
  wbd_sv_add(&a, "/bin/true");
  int ep[2];
  if (pipe2(ep, O_CLOEXEC) != 0) {
    wbd_sv_free(&a);
    snprintf(why, len, "pipe: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(ep[1], 2);
    int nul = open("/dev/null", O_RDWR);
    dup2(nul, 0);
    dup2(nul, 1);
    /* As a jail runs: unprivileged. */
    uid_t u = (uid_t)(g_uid_base + UID_SLOTS - 1);
    if (g_root && (setgroups(0, NULL) != 0 || setresgid(u, u, u) != 0 || setresuid(u, u, u) != 0)) _exit(126);
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
  wbd_sv_free(&a);
  if (pid < 0) {
    snprintf(why, len, "fork: %s", strerror(errno));
    return -1;
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  if (!why[0]) snprintf(why, len, "exit status %d", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  return -1;
}

/* The data directory, made and private (mode 0700) whatever it was. 0 or
 * -1, said on stderr. */
static int data_dir_prepare(void) {
  if (!wbd_opt.data_dir) {
    fprintf(stderr, "warmboxd: no data directory\n");
    return -1;
  }
  int rc = mkdir_p(wbd_opt.data_dir, 0700);
  if (rc) {
    fprintf(stderr, "warmboxd: cannot create %s: %s\n", wbd_opt.data_dir, strerror(-rc));
    return -1;
  }
  /* Sandboxes' files are nobody else's business, whatever the directory was. */
  if (chmod(wbd_opt.data_dir, 0700) != 0) {
    fprintf(stderr, "warmboxd: cannot make %s private: %s\n", wbd_opt.data_dir, strerror(errno));
    return -1;
  }
  return 0;
}

/* A root warmboxd's host uid range for its jails (exactly
 * WARMBOXD_JAIL_UID_BASE's when set). 0 or -1, said on stderr. */
static int uid_range_init(void) {
  const char *e = getenv("WARMBOXD_JAIL_UID_BASE");
  uid_t want = e && atol(e) > 0 ? (uid_t)atol(e) : 0;
  char why[512];
  g_uid_base = wbd_uid_range_take(UID_LOCK_DIR, UID_BASE_DEFAULT, want, UID_SLOTS, why, sizeof why);
  if (!g_uid_base) {
    fprintf(stderr, "warmboxd: no host uid range for the jails: %s\n", why);
    return -1;
  }
  if (wbd_opt.verbose)
    fprintf(stderr, "warmboxd: jails run as host uids %lu-%lu\n", (unsigned long)g_uid_base,
            (unsigned long)g_uid_base + UID_SLOTS - 1);
  return 0;
}

/* A mount namespace of warmboxd's own: the sandboxes' tmpfs homes live and
 * die with it, and the host's mount table does not see them. First, so
 * that every descriptor warmboxd opens is on one of its own mounts.
 * Without root, in a user namespace of its own (before any thread). */
static void private_mounts(void) {
  if ((g_root || wbd_userns_enter() == 0) && unshare(CLONE_NEWNS) == 0 &&
      mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0)
    g_private_mnt = 1;
  else
    fprintf(stderr, "warmboxd: no private mount namespace (%s): homes are not size-limited\n", strerror(errno));
}

/* g_data (the data directory, absolute: for bubblewrap's binds and HOME in
 * unisolated mode) and g_etc, the jails' generated /etc files. 0 or -1. */
static int etc_prepare(void) {
  if (!realpath(wbd_opt.data_dir, g_data)) {
    fprintf(stderr, "warmboxd: cannot resolve %s: %s\n", wbd_opt.data_dir, strerror(errno));
    return -1;
  }
  snprintf(g_etc, sizeof g_etc, "%s/.warmboxd-etc", g_data);
  char p[PATH_MAX + 64];
  if (mkdir_p(g_etc, 0700) != 0) {
    fprintf(stderr, "warmboxd: cannot create %s\n", g_etc);
    return -1;
  }
  snprintf(p, sizeof p, "%s/passwd", g_etc);
  write_new_file(p,
                 "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n"
                 "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
  snprintf(p, sizeof p, "%s/group", g_etc);
  write_new_file(p, "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n");
  /* slirp4netns's DNS forwarder, for jails with internet access. */
  snprintf(p, sizeof p, "%s/resolv.conf", g_etc);
  write_new_file(p, "nameserver 10.0.2.3\n");
  return 0;
}

/* g_isolated: jails unless --unisolated, and warmboxd does not start where
 * bubblewrap cannot run without it. 0 or -1. */
static int isolation_choose(void) {
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
  return 0;
}

/* The cgroups: those a killed warmboxd left are reaped; this instance's
 * parents of the limit groups (isolated only; WARMBOXD_NO_LIMIT_CGROUPS=1:
 * none) and of the freezer groups (WARMBOXD_NO_FREEZER=1, for tests: none,
 * so that pauses take the SIGSTOP path). A parent that cannot be made is
 * left out (""). */
static void cgroups_init(void) {
  for (int i = 0; i < CG_N; i++) reap_stale_cgroups(cg_ctrl[i]);
  const char *nolim = getenv("WARMBOXD_NO_LIMIT_CGROUPS");
  for (int i = 0; i < CG_N; i++) {
    g_cgx_root[i][0] = 0;
    if (i == CG_FREEZER || !g_isolated || (nolim && strcmp(nolim, "1") == 0)) continue;
    snprintf(g_cgx_root[i], sizeof g_cgx_root[i], "/sys/fs/cgroup/%s/warmboxd-%d", cg_ctrl[i], (int)getpid());
    if (mkdir(g_cgx_root[i], 0755) != 0 && errno != EEXIST) {
      if (wbd_opt.verbose)
        fprintf(stderr, "warmboxd: no %s cgroup (%s): rlimits instead\n", cg_ctrl[i], strerror(errno));
      g_cgx_root[i][0] = 0;
    }
  }
  const char *nofreeze = getenv("WARMBOXD_NO_FREEZER");
  snprintf(g_cg_root, sizeof g_cg_root, "/sys/fs/cgroup/freezer/warmboxd-%d", (int)getpid());
  if ((nofreeze && strcmp(nofreeze, "1") == 0) || mkdir(g_cg_root, 0755) != 0) {
    if (wbd_opt.verbose) fprintf(stderr, "warmboxd: no cgroup freezer (%s): pausing with SIGSTOP\n", strerror(errno));
    g_cg_root[0] = 0;
  }
}

/* A sandbox's runtime name: "r" + 20 hex of SHA-256(key, id), with a key
 * random per process. It names what the host shows every local user (the
 * tmpfs's mount point in /proc/PID/mountinfo, the cgroups, bubblewrap's
 * command line), so none of those gives away a sandbox's id (which, for a
 * sandbox without an access token, is all its data plane asks). */
void wbd_rt_name(const char *id, char *out, size_t len) {
  struct wbd_sha256 c;
  unsigned char d[32];
  wbd_sha256_init(&c);
  wbd_sha256_update(&c, g_name_key, sizeof g_name_key);
  wbd_sha256_update(&c, id, strlen(id));
  wbd_sha256_final(&c, d);
  char hex[22];
  hex[0] = 'r';
  for (int i = 0; i < 10; i++) snprintf(hex + 1 + 2 * i, 3, "%02x", d[i]);
  snprintf(out, len, "%s", hex);
}

int wbd_rt_is_name(const char *s) {
  if (strlen(s) != 21 || s[0] != 'r') return 0;
  for (int i = 1; i < 21; i++)
    if (!isdigit((unsigned char)s[i]) && !(s[i] >= 'a' && s[i] <= 'f')) return 0;
  return 1;
}

int wbd_rt_init(void) {
  size_t got = 0;
  while (got < sizeof g_name_key) {
    ssize_t r = getrandom(g_name_key + got, sizeof g_name_key - got, 0);
    if (r > 0)
      got += (size_t)r;
    else if (errno != EINTR)
      return -1;
  }
  if (data_dir_prepare() != 0) return -1;
  g_root = geteuid() == 0;
  if (g_root && !wbd_opt.unisolated && uid_range_init() != 0) return -1;
  const char *e = getenv("WARMBOXD_PIDS_MAX");
  if (e && atol(e) > 0) g_pids_max = atol(e);
  wbd_seccomp_init();
  if (!wbd_opt.unisolated) private_mounts();
  if (etc_prepare() != 0 || isolation_choose() != 0) return -1;
  if (g_isolated) wbd_net_init(g_root);
  cgroups_init();
  if (wbd_spawner_start() != 0) return -1;
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
  while (g_all && pthread_cond_timedwait(&g_cond, &g_mu, &dl) != ETIMEDOUT) {
  }
  if (g_all) fprintf(stderr, "warmboxd: some sandbox runtimes are still referenced at exit\n");
  pthread_mutex_unlock(&g_mu);

  wbd_spawner_stop();
  if (g_cg_root[0]) rmdir(g_cg_root);
  for (int i = 0; i < CG_N; i++)
    if (g_cgx_root[i][0]) cg_rmdir(g_cgx_root[i]);
  if (g_etc[0]) rm_rf(g_etc);
}

/* ------------------------------------------------------------------ */
/* Usage (GET /sandboxes/{id}/metrics)                                 */
/* ------------------------------------------------------------------ */

/* CPU seconds of one process and its reaped children (/proc/PID/stat's
 * utime, stime, cutime, cstime), 0 when it is gone. */
static double proc_cpu_s(int pid) {
  char buf[1024];
  const char *p = proc_stat(pid, buf, sizeof buf);
  unsigned long long ut, st;
  long long cut, cst;
  if (!p ||
      sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld", &ut, &st, &cut, &cst) != 4)
    return 0;
  return (double)(ut + st + (unsigned long long)(cut + cst)) / (double)sysconf(_SC_CLK_TCK);
}

/* The sum over the processes of a group (cgroup.procs). */
static double group_cpu_s(const char *cg) {
  char path[PATH_MAX + 128];
  snprintf(path, sizeof path, "%s/cgroup.procs", cg);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  double s = 0;
  int pid;
  while (fscanf(f, "%d", &pid) == 1) s += proc_cpu_s(pid);
  fclose(f);
  return s;
}

/* A number file of a group, or the value of `key` in it ("total_cache 123"). */
static long long group_value(const char *cg, const char *file, const char *key) {
  char path[PATH_MAX + 128], line[256];
  snprintf(path, sizeof path, "%s/%s", cg, file);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  long long v = 0;
  size_t kn = key ? strlen(key) : 0;
  while (fgets(line, sizeof line, f)) {
    if (!key) {
      v = atoll(line);
      break;
    }
    if (strncmp(line, key, kn) == 0 && line[kn] == ' ') {
      v = atoll(line + kn + 1);
      break;
    }
  }
  fclose(f);
  return v;
}

int wbd_rt_usage(struct wbd_sandbox *sb, struct wbd_usage *u) {
  memset(u, 0, sizeof *u);
  struct wbd_rt *rt = rt_take_live(sb);
  if (!rt) return -1;
  const char *mem = rt->cgx[CG_MEMORY], *cpu = mem[0] ? mem : rt->cgx[CG_CPU];
  if (cpu[0]) u->cpu_s = group_cpu_s(cpu);
  if (mem[0]) {
    u->mem_used = group_value(mem, "memory.usage_in_bytes", NULL);
    u->mem_cache = group_value(mem, "memory.stat", "total_cache");
  }
  struct statvfs vfs;
  if (rt->mounted && statvfs(rt->dir, &vfs) == 0) {
    u->disk_total = (long long)vfs.f_blocks * (long long)vfs.f_frsize;
    u->disk_used = (long long)(vfs.f_blocks - vfs.f_bfree) * (long long)vfs.f_frsize;
  }
  wbd_rt_put(rt);
  return 0;
}
