/*
 * envd_fs.c: confined filesystem operations for envd (see envd.h).
 *
 * Why openat2 and not realpath + prefix checks: the sandbox's own processes
 * can change its tree at any moment (swap a directory for a symlink between
 * our check and our use). Resolving in the kernel from a root fd with
 * RESOLVE_BENEATH makes the check and the use one step.
 */
#include "envd.h"
#include "util.h"
#include "jail.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define HOME      "/home/user"
#define ROOT_HOME "/root"

/* ------------------------------------------------------------------ */
/* Resolution                                                          */
/* ------------------------------------------------------------------ */

/* Cleans an absolute path as the sandbox sees it (Go's filepath.Clean: "."
 * dropped, ".." pops, never above "/") into `jail`. */
static int clean_path(const char *abs_in, char *jail, size_t jlen) {
  char abs[2 * PATH_MAX];
  if (strlen(abs_in) >= sizeof abs) return -ENAMETOOLONG;
  strcpy(abs, abs_in);
  size_t ol = 0;
  char *save = NULL;
  jail[0] = 0;
  for (char *c = strtok_r(abs, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (strcmp(c, ".") == 0) continue;
    if (strcmp(c, "..") == 0) {
      while (ol > 0 && jail[ol - 1] != '/') ol--;
      if (ol > 0) ol--;
      jail[ol] = 0;
      continue;
    }
    size_t cl = strlen(c);
    if (ol + 1 + cl + 1 > jlen) return -ENAMETOOLONG;
    jail[ol++] = '/';
    memcpy(jail + ol, c, cl);
    ol += cl;
    jail[ol] = 0;
  }
  if (ol == 0) snprintf(jail, jlen, "/");
  return 0;
}

/* A read-only view of a host tree: a detached clone of its mounts, made
 * read-only by the kernel (root only: open_tree needs CAP_SYS_ADMIN), so
 * nothing done through it can write, whatever a caller forgets. Without it
 * the tree is opened as it is; `ro` makes every writing call refuse first. */
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x00000001
struct mount_attr {
  uint64_t attr_set, attr_clr, propagation, userns_fd;
};
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
static int open_ro_tree(const char *host) {
#if defined(SYS_open_tree) && defined(SYS_mount_setattr)
  int fd = (int)syscall(SYS_open_tree, AT_FDCWD, host, OPEN_TREE_CLONE | O_CLOEXEC | AT_RECURSIVE);
  if (fd >= 0) {
    struct mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_RDONLY;
    if (syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) == 0) return fd;
    close(fd);
  }
#endif
  return open(host, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

/* Opens the tree that holds jail path `jail` (wbd_rt_locate): its root fd,
 * the rest into `rel`, *ro for a host tree. -EACCES: not served. */
static int tree_open(struct wbd_sandbox *sb, const char *jail, char *rel, size_t rlen, int *ro) {
  char host[PATH_MAX];
  const char *rest;
  int kind = wbd_rt_locate(sb, jail, host, sizeof host, &rest);
  if (kind < 0) return kind;
  if ((size_t)snprintf(rel, rlen, "%s", rest) >= rlen) return -ENAMETOOLONG;
  *ro = kind == WBD_TREE_HOST;
  int fd = *ro ? open_ro_tree(host) : open(host, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT && !*ro ? -ESTALE : -errno;
  return fd;
}

int wbd_fs_resolve_as(struct wbd_sandbox *sb, const char *path, const char *user, struct wbd_fspath *p) {
  char abs[2 * PATH_MAX];
  int n;
  const char *home = user && strcmp(user, "root") == 0 && wbd_rt_isolated() ? ROOT_HOME : HOME;
  p->sb = sb;
  p->root = -1;
  p->ro = 0;
  p->jail[0] = p->rel[0] = 0;
  if (!path) path = "";
  if (path[0] == '~' && (path[1] == 0 || path[1] == '/'))
    n = snprintf(abs, sizeof abs, "%s%s", home, path + 1);
  else if (path[0] == '/')
    n = snprintf(abs, sizeof abs, "%s", path);
  else
    n = snprintf(abs, sizeof abs, "%s/%s", home, path);
  if (n < 0 || (size_t)n >= sizeof abs) return -ENAMETOOLONG;
  int rc = clean_path(abs, p->jail, sizeof p->jail);
  if (rc < 0) return rc;
  p->root = tree_open(sb, p->jail, p->rel, sizeof p->rel, &p->ro);
  if (p->root < 0) return p->root;
  /* What envd creates belongs to the sandbox's user, wherever it is. */
  char own[PATH_MAX];
  struct stat st;
  if (wbd_rt_home(sb, own, sizeof own) && stat(own, &st) == 0) {
    p->uid = st.st_uid;
    p->gid = st.st_gid;
  } else {
    p->uid = geteuid();
    p->gid = getegid();
  }
  return 0;
}

int wbd_fs_resolve(struct wbd_sandbox *sb, const char *path, struct wbd_fspath *p) {
  return wbd_fs_resolve_as(sb, path, NULL, p);
}

void wbd_fs_release(struct wbd_fspath *p) {
  if (p->root >= 0) close(p->root);
  p->root = -1;
}

/* Appends "/name" to the jail path `j` (of capacity PATH_MAX; "" is "/"). */
static int jail_push(char *j, const char *name, size_t nlen) {
  size_t l = strlen(j);
  if (l + 1 + nlen + 1 > PATH_MAX) return -ENAMETOOLONG;
  j[l] = '/';
  memcpy(j + l + 1, name, nlen);
  j[l + 1 + nlen] = 0;
  return 0;
}

/* Resolution one component at a time, each opened with O_NOFOLLOW from the
 * one before, as the sandbox's own processes would see it: the jail path
 * of each step is kept, and whenever a step leaves the tree it is in (a
 * symlink, absolute or relative, a ".." above the tree's root, or a name
 * that the jail mounts another tree on, like a root's /usr) the rest is
 * resolved again from the tree wbd_rt_locate gives for it. So what a
 * sandbox's link points at is what envd serves, and a link can never lead
 * where the jail cannot see, or make a read-only tree written (`mutate`).
 * Used for whatever openat2's kernel resolution below cannot do. */
#define WALK_MAX_DEPTH 256

/* The jail path of a tree's root, from a jail path and the rest of it in
 * the tree ("" for "/"). */
static void root_jail(const char *jail, const char *rel, char *out, size_t len) {
  size_t jl = strlen(jail), rl = strcmp(rel, ".") == 0 ? 0 : strlen(rel) + 1;
  snprintf(out, len, "%.*s", (int)(jl >= rl ? jl - rl : 0), jail);
  if (strcmp(out, "/") == 0) out[0] = 0;
}

/* The jail path of p's tree root: p->jail without p->rel ("" for "/"). */
static void tree_root_jail(const struct wbd_fspath *p, char *out, size_t len) {
  root_jail(p->jail, p->rel, out, len);
}

/* The host directory of the tree that holds jail path `jail` ("" when none
 * does): which tree a name is in, compared as it is walked. */
static void tree_host_of(struct wbd_sandbox *sb, const char *jail, char *host) {
  const char *r;
  if (wbd_rt_locate(sb, jail, host, PATH_MAX, &r) < 0) host[0] = 0;
}

/* Opens the directory a walk stands in (a path that ends in "." or ".."),
 * whose jail path is `here` ("" for "/"); -EROFS when `refuse`. */
static int open_here(int dirfd, int flags, mode_t mode, int refuse, const char *here, char *resolved) {
  if (refuse) return -EROFS;
  int fd = openat(dirfd, ".", flags | O_CLOEXEC, mode);
  if (fd < 0) return -errno;
  if (resolved) snprintf(resolved, PATH_MAX, "%s", here[0] ? here : "/");
  return fd;
}

/* A walk in progress: the directories it went down in the tree it is in
 * (stack[0] that tree's root, owned by the walk once it left p's), the
 * jail path of the one it stands in (`here`), the path left to walk. */
struct walker {
  const struct wbd_fspath *p;
  int flags, mutate;
  mode_t mode;
  char *resolved;
  int stack[WALK_MAX_DEPTH];
  int depth, links, owned_root, ro;
  int open_err;            /* errno of the last name that did not open */
  int rc;                  /* the result, once a step is STEP_DONE */
  char todo[2 * PATH_MAX]; /* the path left, in the current tree */
  char next[2 * PATH_MAX]; /* a jail path to resolve again from its own tree */
  char here[PATH_MAX], tree_host[PATH_MAX];
  char jail[PATH_MAX]; /* the jail path of the current name */
};

/* What a step leads to: the walk goes on (with this name's next check, or
 * the next name), starts again from w->next's tree, or ends with w->rc. */
enum step { STEP_ON, STEP_AGAIN, STEP_DONE };

static enum step walk_done(struct walker *w, int rc) {
  w->rc = rc;
  return STEP_DONE;
}

/* One name of a path and what follows it. */
struct comp {
  char name[NAME_MAX + 1];
  size_t len;
  char *rest; /* after the name and its slashes */
  int last;
};

static enum step comp_take(struct walker *w, char *cur, struct comp *c) {
  while (*cur == '/') cur++;
  char *end = strchr(cur, '/');
  c->len = end ? (size_t)(end - cur) : strlen(cur);
  if (c->len > NAME_MAX) return walk_done(w, -ENAMETOOLONG);
  memcpy(c->name, cur, c->len);
  c->name[c->len] = 0;
  c->rest = cur + c->len;
  while (*c->rest == '/') c->rest++;
  c->last = *c->rest == 0;
  return STEP_ON;
}

static int comp_is_dots(const struct comp *c) {
  return c->len == 0 || strcmp(c->name, ".") == 0 || strcmp(c->name, "..") == 0;
}

/* "." (or nothing) and "..": stays, or goes up a level; above the tree's
 * root, its parent as the jail has it. The last name opens where that
 * leaves the walk. */
static enum step walk_dots(struct walker *w, const struct comp *c) {
  if (strcmp(c->name, "..") == 0) {
    if (w->depth == 0) {
      int n = snprintf(w->next, sizeof w->next, "%s/../%s", w->here, c->rest);
      if (n < 0 || (size_t)n >= sizeof w->next) return walk_done(w, -ENAMETOOLONG);
      return STEP_AGAIN;
    }
    close(w->stack[w->depth--]);
    char *slash = strrchr(w->here, '/');
    if (slash) *slash = 0;
  }
  if (!c->last) return STEP_ON;
  return walk_done(w, open_here(w->stack[w->depth], w->flags, w->mode, w->mutate && w->ro, w->here, w->resolved));
}

/* The name's jail path into w->jail; a name the jail mounts another tree
 * on is that tree's: STEP_AGAIN, to resolve it and the rest from there. */
static enum step walk_mounted(struct walker *w, const struct comp *c) {
  char host[PATH_MAX];
  const char *r;
  snprintf(w->jail, sizeof w->jail, "%s", w->here);
  int rc = jail_push(w->jail, c->name, c->len);
  if (rc < 0) return walk_done(w, rc);
  int kind = wbd_rt_locate(w->p->sb, w->jail, host, sizeof host, &r);
  if (kind >= 0 && strcmp(host, w->tree_host) == 0) return STEP_ON;
  int n = snprintf(w->next, sizeof w->next, "%s/%s", w->jail, c->rest);
  if (n < 0 || (size_t)n >= sizeof w->next) return walk_done(w, -ENAMETOOLONG);
  return STEP_AGAIN;
}

/* Opens the name without following it: *fd and *st, or *fd -1 with
 * w->open_err. A symlink to follow (any but a last name asked with
 * O_NOFOLLOW) is STEP_AGAIN with its target, from here when relative. */
static enum step walk_open(struct walker *w, const struct comp *c, int *fd, struct stat *st) {
  *fd = openat(w->stack[w->depth], c->name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (*fd < 0) {
    w->open_err = errno;
    return STEP_ON;
  }
  if (fstat(*fd, st) != 0) {
    int rc = -errno;
    close(*fd);
    return walk_done(w, rc);
  }
  if (!S_ISLNK(st->st_mode) || (c->last && (w->flags & O_NOFOLLOW))) return STEP_ON;
  char target[PATH_MAX];
  ssize_t n = readlinkat(*fd, "", target, sizeof target - 1);
  close(*fd);
  *fd = -1;
  if (n < 0) return walk_done(w, -errno);
  target[n] = 0;
  int m = target[0] == '/' ? snprintf(w->next, sizeof w->next, "%s/%s", target, c->rest)
                           : snprintf(w->next, sizeof w->next, "%s/%s/%s", w->here, target, c->rest);
  if (m < 0 || (size_t)m >= sizeof w->next) return walk_done(w, -ENAMETOOLONG);
  return STEP_AGAIN;
}

/* The last name (fd: it opened as O_PATH, or -1): opened with the caller's
 * flags, never following, created when missing and O_CREAT asks. */
static enum step walk_last(struct walker *w, const struct comp *c, int fd) {
  if (fd >= 0)
    close(fd);
  else if (w->open_err != ENOENT || !(w->flags & O_CREAT))
    return walk_done(w, -w->open_err);
  if (w->mutate && w->ro) return walk_done(w, -EROFS);
  int rc = openat(w->stack[w->depth], c->name, w->flags | O_NOFOLLOW | O_CLOEXEC, w->mode);
  rc = rc < 0 ? -errno : rc;
  if (w->resolved) snprintf(w->resolved, PATH_MAX, "%s", w->jail);
  return walk_done(w, rc);
}

/* A name before the last: a directory the walk goes down into. */
static enum step walk_descend(struct walker *w, int fd, const struct stat *st) {
  if (fd < 0) return walk_done(w, -w->open_err);
  if (!S_ISDIR(st->st_mode)) {
    close(fd);
    return walk_done(w, -ENOTDIR);
  }
  if (w->depth + 1 >= WALK_MAX_DEPTH) {
    close(fd);
    return walk_done(w, -ENAMETOOLONG);
  }
  w->stack[++w->depth] = fd;
  snprintf(w->here, sizeof w->here, "%s", w->jail);
  return STEP_ON;
}

/* Starts the walk again from the tree that holds w->next (absolute): its
 * root and the rest in it; at most 40 times (ELOOP), never into a
 * read-only tree for a change (EROFS). */
static enum step walk_reroot(struct walker *w) {
  char clean[PATH_MAX], nrel[PATH_MAX];
  int nro, rc;
  if (++w->links > 40) return walk_done(w, -ELOOP);
  if ((rc = clean_path(w->next, clean, sizeof clean)) < 0) return walk_done(w, rc);
  int nr = tree_open(w->p->sb, clean, nrel, sizeof nrel, &nro);
  if (nr < 0) return walk_done(w, nr);
  if (w->mutate && nro) {
    close(nr);
    return walk_done(w, -EROFS);
  }
  root_jail(clean, nrel, w->here, sizeof w->here);
  tree_host_of(w->p->sb, clean, w->tree_host);
  while (w->depth > 0) close(w->stack[w->depth--]);
  if (w->owned_root >= 0) close(w->owned_root);
  w->stack[0] = w->owned_root = nr;
  w->ro = nro;
  strcpy(w->todo, nrel);
  return STEP_ON;
}

/* `resolved` (PATH_MAX, or NULL): the jail path the fd is for, after links. */
static int walk(const struct wbd_fspath *p, const char *rel, int flags, mode_t mode, int mutate, char *resolved) {
  struct walker w; /* not zeroed: its buffers are written before they are read */
  if (strlen(rel) >= sizeof w.todo) return -ENAMETOOLONG;
  w.p = p;
  w.flags = flags;
  w.mode = mode;
  w.mutate = mutate;
  w.resolved = resolved;
  w.depth = w.links = w.open_err = w.rc = 0;
  w.owned_root = -1;
  w.ro = p->ro;
  strcpy(w.todo, rel);
  tree_root_jail(p, w.here, sizeof w.here);
  tree_host_of(p->sb, p->jail, w.tree_host);
  w.stack[0] = p->root;
  char *cur = w.todo;
  for (;;) {
    struct comp c;
    int fd = -1;
    struct stat st;
    enum step s = comp_take(&w, cur, &c);
    if (s == STEP_ON && comp_is_dots(&c)) {
      s = walk_dots(&w, &c);
    } else if (s == STEP_ON) {
      s = walk_mounted(&w, &c);
      if (s == STEP_ON) s = walk_open(&w, &c, &fd, &st);
      if (s == STEP_ON) s = c.last ? walk_last(&w, &c, fd) : walk_descend(&w, fd, &st);
    }
    if (s == STEP_ON) {
      cur = c.rest;
      continue;
    }
    if (s == STEP_AGAIN) s = walk_reroot(&w);
    if (s == STEP_DONE) break;
    cur = w.todo;
  }
  while (w.depth > 0) close(w.stack[w.depth--]);
  if (w.owned_root >= 0) close(w.owned_root);
  return w.rc;
}

static int have_openat2 = 1;

#define WRITING (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)

/* `mutate`: the fd is for a change (a write, or a directory to change
 * entries of): refused in a read-only tree, however it is reached. */
static int fs_open(const struct wbd_fspath *p, const char *rel, int flags, mode_t mode, int mutate, char *resolved) {
  if (flags & WRITING) mutate = 1;
  if (mutate && p->ro) return -EROFS;
  if (__atomic_load_n(&have_openat2, __ATOMIC_RELAXED)) {
    /* The kernel's resolution, for a path without symlinks: it stays in
     * the tree, and no name in it is mounted over in the jail (the tree
     * was chosen for the whole path). Anything else is walk's. */
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (uint64_t)(flags | O_CLOEXEC);
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    long fd;
    do {
      fd = syscall(SYS_openat2, p->root, rel, &how, sizeof how);
    } while (fd < 0 && errno == EAGAIN);
    if (fd >= 0) {
      if (resolved) { /* no link on the way: the path itself */
        char top[PATH_MAX], joined[2 * PATH_MAX];
        tree_root_jail(p, top, sizeof top);
        snprintf(joined, sizeof joined, "%s/%s", top, rel);
        if (clean_path(joined, resolved, PATH_MAX) < 0) snprintf(resolved, PATH_MAX, "%s", p->jail);
      }
      return (int)fd;
    }
    if (errno != ENOSYS && errno != EXDEV && errno != ELOOP) return -errno;
    if (errno == ENOSYS) __atomic_store_n(&have_openat2, 0, __ATOMIC_RELAXED);
  }
  return walk(p, rel, flags, mode, mutate, resolved);
}

int wbd_fs_open(const struct wbd_fspath *p, const char *rel, int flags, mode_t mode) {
  return fs_open(p, rel, flags, mode, 0, NULL);
}

static int parent_fd(const struct wbd_fspath *p, const char **base, int mutate) {
  if (strcmp(p->rel, ".") == 0) return -EPERM;
  const char *slash = strrchr(p->rel, '/');
  if (!slash) {
    *base = p->rel;
    return fs_open(p, ".", O_PATH | O_DIRECTORY, 0, mutate, NULL);
  }
  char dir[PATH_MAX];
  size_t n = (size_t)(slash - p->rel);
  memcpy(dir, p->rel, n);
  dir[n] = 0;
  *base = slash + 1;
  return fs_open(p, dir, O_PATH | O_DIRECTORY, 0, mutate, NULL);
}

int wbd_fs_parent(const struct wbd_fspath *p, const char **base) {
  return parent_fd(p, base, 0);
}

void wbd_fs_chown(const struct wbd_fspath *p, int fd) {
  if (geteuid() != 0) return;
  if (fchown(fd, p->uid, p->gid) != 0) { /* best effort */
  }
}

static void chown_at(const struct wbd_fspath *p, int dirfd, const char *name) {
  if (geteuid() != 0) return;
  if (fchownat(dirfd, name, p->uid, p->gid, AT_SYMLINK_NOFOLLOW) != 0) { /* best effort */
  }
}

int wbd_fs_mkdirs(const struct wbd_fspath *p, int self) {
  if (strcmp(p->rel, ".") == 0) return self ? -EEXIST : 0;
  if (p->ro) return -EROFS;
  char prefix[PATH_MAX];
  size_t len = strlen(p->rel);
  int existed = 0;
  for (size_t i = 0; i <= len; i++) {
    if (p->rel[i] != '/' && p->rel[i] != 0) continue;
    if (p->rel[i] == 0 && !self) break;
    memcpy(prefix, p->rel, i);
    prefix[i] = 0;
    char *slash = strrchr(prefix, '/');
    const char *name = slash ? slash + 1 : prefix;
    int dfd;
    if (slash) {
      *slash = 0;
      dfd = fs_open(p, prefix, O_PATH | O_DIRECTORY, 0, 1, NULL);
    } else {
      dfd = fs_open(p, ".", O_PATH | O_DIRECTORY, 0, 1, NULL);
    }
    if (dfd < 0) return dfd;
    if (mkdirat(dfd, name, 0755) == 0) {
      chown_at(p, dfd, name);
      existed = 0;
    } else if (errno == EEXIST) {
      existed = 1;
    } else {
      int e = -errno;
      close(dfd);
      return e;
    }
    close(dfd);
  }
  return self && existed ? -EEXIST : 0;
}

/* ------------------------------------------------------------------ */
/* Remove and move                                                     */
/* ------------------------------------------------------------------ */

DIR *wbd_fs_dir(int fd, int dup_fd, int *err) {
  int dfd = dup_fd ? dup(fd) : fd;
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    *err = -errno;
    if (dfd >= 0) close(dfd);
  }
  return d;
}

struct dirent *wbd_fs_next(DIR *d) {
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) break;
  return de;
}

/* rm -rf name in dirfd without following any symlink. */
static int rm_tree(int dirfd, const char *name, int depth) {
  if (unlinkat(dirfd, name, 0) == 0) return 0;
  if (errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) return -errno;
  if (depth > 256) return -ELOOP;
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? 0 : -errno;
  int rc = 0;
  DIR *d = wbd_fs_dir(fd, 0, &rc);
  if (!d) return rc;
  struct dirent *de;
  while ((de = wbd_fs_next(d)) != NULL) {
    int r = rm_tree(fd, de->d_name, depth + 1);
    if (r < 0 && rc == 0) rc = r;
  }
  closedir(d);
  if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT && rc == 0) rc = -errno;
  return rc;
}

int wbd_fs_remove(const struct wbd_fspath *p) {
  const char *base;
  int dfd = parent_fd(p, &base, 1);
  if (dfd == -ENOENT || dfd == -ENOTDIR) return 0; /* RemoveAll: nothing there */
  if (dfd < 0) return dfd;
  int rc = rm_tree(dfd, base, 0);
  close(dfd);
  return rc;
}

int wbd_fs_move(const struct wbd_fspath *src, const struct wbd_fspath *dst) {
  const char *sbase, *dbase;
  int sfd = parent_fd(src, &sbase, 1);
  if (sfd < 0) return sfd;
  int rc = wbd_fs_mkdirs(dst, 0);
  if (rc < 0) {
    close(sfd);
    return rc;
  }
  int dfd = parent_fd(dst, &dbase, 1);
  if (dfd < 0) {
    close(sfd);
    return dfd;
  }
  rc = renameat(sfd, sbase, dfd, dbase) == 0 ? 0 : -errno;
  close(sfd);
  close(dfd);
  return rc;
}

/* ------------------------------------------------------------------ */
/* EntryInfo                                                           */
/* ------------------------------------------------------------------ */

/* Go's fs.FileMode.String(), which is what envd sends as "permissions". */
static void go_mode_string(mode_t m, char *out) {
  char *o = out;
  if (S_ISDIR(m)) *o++ = 'd';
  if (S_ISLNK(m)) *o++ = 'L';
  if (S_ISBLK(m) || S_ISCHR(m)) *o++ = 'D';
  if (S_ISFIFO(m)) *o++ = 'p';
  if (S_ISSOCK(m)) *o++ = 'S';
  if (m & S_ISUID) *o++ = 'u';
  if (m & S_ISGID) *o++ = 'g';
  if (S_ISCHR(m)) *o++ = 'c';
  if (m & S_ISVTX) *o++ = 't';
  if (o == out) *o++ = '-';
  const char *rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; i++) *o++ = (m & (1u << (8 - i))) ? rwx[i] : '-';
  *o = 0;
}

/* ------------------------------------------------------------------ */
/* Metadata (user.e2b.* extended attributes)                            */
/* ------------------------------------------------------------------ */

#define META_PREFIX_LEN (sizeof WBD_META_XATTR_PREFIX - 1)
#define META_MAX_KEY    (255 - META_PREFIX_LEN) /* an xattr name is at most 255 bytes */
#define META_MAX_TOTAL  4096                    /* names with prefix + values, as envd */

struct meta_scan {
  json_t *out;
};

static enum MHD_Result meta_header(void *cls, enum MHD_ValueKind kind, const char *name, const char *value) {
  struct meta_scan *m = cls;
  (void)kind;
  static const char pre[] = "x-metadata-";
  if (!name || strncasecmp(name, pre, sizeof pre - 1) != 0 || !name[sizeof pre - 1]) return MHD_YES;
  char key[512];
  size_t n = strlen(name + sizeof pre - 1);
  if (n >= sizeof key) n = sizeof key - 1; /* too long anyway: the check below refuses it */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[sizeof pre - 1 + i];
    key[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
  }
  key[n] = 0;
  if (strlen(name + sizeof pre - 1) > n) key[n - 1] = '~'; /* keeps it over the limit */
  if (!json_object_get(m->out, key)) json_object_set_new(m->out, key, wbd_json_str(value ? value : ""));
  return MHD_YES;
}

static int printable(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) return 0;
  return 1;
}

json_t *wbd_fs_meta_headers(struct wbd_req *req, char *err, size_t errlen) {
  struct meta_scan m = {json_object()};
  MHD_get_connection_values(req->conn, MHD_HEADER_KIND, meta_header, &m);
  size_t total = 0;
  const char *k;
  json_t *v;
  json_object_foreach(m.out, k, v) {
    const char *val = json_string_value(v);
    if (strlen(k) > META_MAX_KEY) {
      snprintf(err, errlen, "metadata key exceeds %zu bytes", (size_t)META_MAX_KEY);
    } else if (!printable(k)) {
      snprintf(err, errlen, "metadata key contains a byte that is not printable ASCII");
    } else if (!printable(val)) {
      snprintf(err, errlen, "metadata value for key \"%s\" contains a byte that is not printable ASCII", k);
    } else {
      total += META_PREFIX_LEN + strlen(k) + strlen(val);
      continue;
    }
    json_decref(m.out);
    return NULL;
  }
  if (total > META_MAX_TOTAL) {
    snprintf(err, errlen, "total metadata size %zu exceeds %d bytes", total, META_MAX_TOTAL);
    json_decref(m.out);
    return NULL;
  }
  return m.out;
}

/* The names of a file's extended attributes (a NUL-separated list,
 * malloc'd) through `procpath` or else `fd`; NULL with *len = 0 when it has
 * none (errno 0) or on an error (errno set: ENOTSUP when unsupported). */
static char *xattr_names(const char *procpath, int fd, ssize_t *len) {
  *len = 0;
  for (int tries = 0; tries < 4; tries++) {
    ssize_t n = procpath ? listxattr(procpath, NULL, 0) : flistxattr(fd, NULL, 0);
    if (n < 0) return NULL;
    if (n == 0) {
      errno = 0;
      return NULL;
    }
    char *buf = malloc((size_t)n);
    if (!buf) return NULL;
    ssize_t got = procpath ? listxattr(procpath, buf, (size_t)n) : flistxattr(fd, buf, (size_t)n);
    if (got >= 0) {
      *len = got;
      return buf;
    }
    int e = errno;
    free(buf);
    errno = e;
    if (e != ERANGE) return NULL; /* ERANGE: the list grew meanwhile */
  }
  return NULL;
}

int wbd_fs_meta_write(int fd, json_t *meta) {
  ssize_t len;
  char *names = xattr_names(NULL, fd, &len);
  if (!names && (errno == ENOTSUP || errno == EOPNOTSUPP))
    return json_object_size(meta) ? -errno : 0; /* nothing to clear, nothing asked */
  for (ssize_t off = 0; names && off < len; off += (ssize_t)strlen(names + off) + 1) {
    const char *name = names + off;
    if (strncmp(name, WBD_META_XATTR_PREFIX, META_PREFIX_LEN) != 0) continue;
    if (meta && json_object_get(meta, name + META_PREFIX_LEN)) continue;
    if (fremovexattr(fd, name) != 0 && errno != ENODATA) {
      int e = -errno;
      free(names);
      return e;
    }
  }
  free(names);
  const char *k;
  json_t *v;
  json_object_foreach(meta, k, v) {
    char name[300];
    snprintf(name, sizeof name, WBD_META_XATTR_PREFIX "%s", k);
    const char *val = json_string_value(v);
    if (fsetxattr(fd, name, val, strlen(val), 0) != 0) return -errno;
  }
  return 0;
}

static json_t *meta_read_path(const char *procpath) {
  ssize_t len;
  char *names = xattr_names(procpath, -1, &len);
  json_t *out = NULL;
  for (ssize_t off = 0; names && off < len; off += (ssize_t)strlen(names + off) + 1) {
    const char *name = names + off;
    if (strncmp(name, WBD_META_XATTR_PREFIX, META_PREFIX_LEN) != 0) continue;
    char val[META_MAX_TOTAL + 1];
    ssize_t n = getxattr(procpath, name, val, sizeof val - 1);
    if (n < 0) continue; /* gone meanwhile, or larger than envd ever stores */
    /* json_stringn and json_string refuse bytes that are not UTF-8: such an
     * entry (set from inside the sandbox) is skipped, as envd skips it. */
    json_t *js = json_stringn(val, (size_t)n), *key = json_string(name + META_PREFIX_LEN);
    if (js && key) {
      if (!out) out = json_object();
      json_object_set(out, name + META_PREFIX_LEN, js);
    }
    json_decref(js);
    json_decref(key);
  }
  free(names);
  return out;
}

json_t *wbd_fs_meta_read(int fd) {
  char procpath[64];
  snprintf(procpath, sizeof procpath, "/proc/self/fd/%d", fd);
  return meta_read_path(procpath);
}

static json_t *entry_json(const struct stat *st, const char *jailpath, const char *target) {
  const char *name = strrchr(jailpath, '/');
  name = name && name[1] ? name + 1 : jailpath;
  const char *type = S_ISDIR(st->st_mode)   ? "FILE_TYPE_DIRECTORY"
                     : S_ISLNK(st->st_mode) ? "FILE_TYPE_SYMLINK"
                     : S_ISREG(st->st_mode) ? "FILE_TYPE_FILE"
                                            : "FILE_TYPE_UNSPECIFIED";
  json_t *e = json_object();
  json_object_set_new(e, "name", wbd_json_str(name));
  json_object_set_new(e, "type", json_string(type));
  json_object_set_new(e, "path", wbd_json_str(jailpath));
  if (st->st_size != 0) {
    char sz[32];
    snprintf(sz, sizeof sz, "%lld", (long long)st->st_size);
    json_object_set_new(e, "size", json_string(sz));
  }
  if (st->st_mode & 0777) json_object_set_new(e, "mode", json_integer(st->st_mode & 0777));
  char perms[24];
  go_mode_string(st->st_mode, perms);
  json_object_set_new(e, "permissions", json_string(perms));
  json_object_set_new(e, "owner", json_string("user"));
  json_object_set_new(e, "group", json_string("user"));
  struct tm tm;
  time_t secs = st->st_mtim.tv_sec;
  char ts[64], full[80];
  gmtime_r(&secs, &tm);
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  if (st->st_mtim.tv_nsec)
    snprintf(full, sizeof full, "%s.%09ldZ", ts, (long)st->st_mtim.tv_nsec);
  else
    snprintf(full, sizeof full, "%sZ", ts);
  json_object_set_new(e, "modifiedTime", json_string(full));
  if (target) json_object_set_new(e, "symlinkTarget", wbd_json_str(target));
  return e;
}

/* A link's target as an absolute, clean path in the sandbox's view (envd
 * sends the resolved path, not the link's text): a relative target is taken
 * from the link's directory; ".", ".." and repeated slashes are folded. */
static void link_abs(const char *jailpath, const char *target, char *out, size_t len) {
  char joined[2 * PATH_MAX + 2];
  if (target[0] == '/') {
    snprintf(joined, sizeof joined, "%s", target);
  } else {
    const char *slash = strrchr(jailpath, '/');
    int dlen = slash ? (int)(slash - jailpath) : 0;
    snprintf(joined, sizeof joined, "%.*s/%s", dlen, jailpath, target);
  }
  size_t o = 0;
  out[0] = 0;
  for (char *save = NULL, *seg = strtok_r(joined, "/", &save); seg; seg = strtok_r(NULL, "/", &save)) {
    if (strcmp(seg, ".") == 0) continue;
    if (strcmp(seg, "..") == 0) {
      while (o > 0 && out[o - 1] != '/') o--;
      if (o > 0) o--;
      out[o] = 0;
      continue;
    }
    size_t n = strlen(seg);
    if (o + 1 + n + 1 > len) break;
    out[o++] = '/';
    memcpy(out + o, seg, n);
    o += n;
    out[o] = 0;
  }
  if (o == 0) snprintf(out, len, "/");
}

/* One O_PATH, O_NOFOLLOW descriptor for the stat, the link and the
 * metadata, so all three describe the same file. */
static json_t *entry_at(int dirfd, const char *name, const char *jailpath) {
  int fd = *name ? openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC) : fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return NULL;
  }
  char target[PATH_MAX], abs[PATH_MAX];
  const char *tp = NULL;
  if (S_ISLNK(st.st_mode)) {
    ssize_t n = readlinkat(fd, "", target, sizeof target - 1);
    if (n >= 0) {
      target[n] = 0;
      link_abs(jailpath, target, abs, sizeof abs);
      tp = abs;
    }
  }
  json_t *meta = S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) ? wbd_fs_meta_read(fd) : NULL;
  close(fd);
  json_t *e = entry_json(&st, jailpath, tp);
  if (meta) json_object_set_new(e, "metadata", meta);
  return e;
}

json_t *wbd_fs_entry(const struct wbd_fspath *p) {
  if (strcmp(p->rel, ".") == 0) return entry_at(p->root, "", p->jail);
  const char *base;
  int dfd = wbd_fs_parent(p, &base);
  if (dfd < 0) {
    errno = -dfd;
    return NULL;
  }
  json_t *e = entry_at(dfd, base, p->jail);
  int saved = errno;
  close(dfd);
  errno = saved;
  return e;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* How a directory's child `real` (its jail path, links resolved) is listed.
 * CHILD_OWN: an entry of the directory's own tree; CHILD_HIDDEN: a mount
 * point of a view envd does not serve (/proc, /dev): listed, never entered;
 * CHILD_MOUNTED: the jail mounts another tree there (a root's /usr, /tmp):
 * *e is that tree's entry (NULL: gone) and *fd (or -1) that tree opened. */
enum { CHILD_OWN, CHILD_HIDDEN, CHILD_MOUNTED };
static int mounted_child(const struct wbd_fspath *p, const char *tree_host, const char *real, json_t **e, int *fd) {
  char host[PATH_MAX];
  const char *r;
  int kind = wbd_rt_locate(p->sb, real, host, sizeof host, &r);
  if (kind < 0) return CHILD_HIDDEN;
  if (strcmp(host, tree_host) == 0) return CHILD_OWN;
  struct wbd_fspath q;
  *e = NULL;
  *fd = -1;
  if (wbd_fs_resolve(p->sb, real, &q) == 0) {
    *e = wbd_fs_entry(&q);
    *fd = wbd_fs_open(&q, q.rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
    if (*fd < 0) *fd = -1;
  }
  wbd_fs_release(&q);
  return CHILD_MOUNTED;
}

/* Lexical order per directory, parents before children: Go's WalkDir.
 * `shown` is the directory's path as asked for (entries are named from it),
 * `real` its jail path once links are resolved (what the jail mounts there
 * is decided from it). */
struct list_walk {
  json_t *out;   /* NULL: only count */
  size_t n, cap; /* entries seen; more than cap: -E2BIG */
  int depth;
};

/* One entry seen: kept in w->out, or (counting) dropped. */
static int walk_add(struct list_walk *w, json_t *e) {
  if (w->out) json_array_append(w->out, e);
  return ++w->n > w->cap ? -E2BIG : 0;
}

static int list_level(const struct wbd_fspath *p, const char *tree_host, int fd, const char *shown, const char *real,
                      int level, struct list_walk *wk) {
  int rc = 0;
  DIR *d = wbd_fs_dir(fd, 1, &rc);
  if (!d) return rc;
  rewinddir(d); /* the dup shares fd's offset: a second walk starts over */
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = wbd_fs_next(d)) != NULL) {
    if (n == cap) {
      cap = cap ? cap * 2 : 32;
      char **nn = realloc(names, cap * sizeof *names);
      if (!nn) break;
      names = nn;
    }
    names[n++] = strdup(de->d_name);
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, cmp_names);
  for (size_t i = 0; i < n; i++) {
    char child[PATH_MAX], real_child[PATH_MAX];
    int w = snprintf(child, sizeof child, "%s%s%s", shown, shown[strlen(shown) - 1] == '/' ? "" : "/", names[i]);
    int w2 =
      snprintf(real_child, sizeof real_child, "%s%s%s", real, real[strlen(real) - 1] == '/' ? "" : "/", names[i]);
    if (w < 0 || (size_t)w >= sizeof child || w2 < 0 || (size_t)w2 >= sizeof real_child) continue;
    int sub = -1;
    json_t *e = NULL;
    int how = mounted_child(p, tree_host, real_child, &e, &sub);
    if (how == CHILD_MOUNTED) {
      if (e) json_object_set_new(e, "path", wbd_json_str(child));
    } else {
      e = entry_at(fd, names[i], child);
    }
    if (!e) { /* vanished meanwhile */
      if (sub >= 0) close(sub);
      continue;
    }
    const char *etype = json_string_value(json_object_get(e, "type"));
    int is_dir = etype && strcmp(etype, "FILE_TYPE_DIRECTORY") == 0;
    rc = walk_add(wk, e);
    json_decref(e);
    if (rc == -E2BIG) {
      if (sub >= 0) close(sub);
      break;
    }
    if (is_dir && level < wk->depth && how != CHILD_HIDDEN) {
      if (how == CHILD_OWN) sub = openat(fd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) {
        char host[PATH_MAX];
        const char *r;
        if (how == CHILD_OWN || wbd_rt_locate(p->sb, real_child, host, sizeof host, &r) < 0)
          snprintf(host, sizeof host, "%s", tree_host);
        rc = list_level(p, host, sub, child, real_child, level + 1, wk);
      }
    }
    if (sub >= 0) close(sub);
    if (rc == -E2BIG) break;
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return rc == -E2BIG ? rc : 0;
}

json_t *wbd_fs_list(const struct wbd_fspath *p, int depth, size_t max, int *err) {
  char real[PATH_MAX];
  int fd = fs_open(p, p->rel, O_RDONLY | O_DIRECTORY, 0, 0, real);
  if (fd < 0) {
    *err = fd;
    return NULL;
  }
  char host[PATH_MAX];
  const char *r;
  if (wbd_rt_locate(p->sb, real, host, sizeof host, &r) < 0) host[0] = 0;
  /* Counted first, so a listing over the cap never holds its entries. */
  struct list_walk wk = {NULL, 0, max, depth < 1 ? 1 : depth};
  int rc = list_level(p, host, fd, p->jail, real, 1, &wk);
  json_t *arr = json_array();
  if (rc == 0) {
    wk.out = arr;
    wk.n = 0;
    rc = list_level(p, host, fd, p->jail, real, 1, &wk);
  }
  close(fd);
  if (rc < 0) {
    json_decref(arr);
    *err = rc;
    return NULL;
  }
  json_t *res = json_object();
  if (json_array_size(arr))
    json_object_set_new(res, "entries", arr);
  else
    json_decref(arr);
  return res;
}

const char *wbd_fs_strerror(int err) {
  switch (err) {
    case -EACCES:
      return "path is not served (outside the sandbox, or its per-process /proc, /dev, /sys)";
    case -EROFS:
      return "read-only file system";
    case -ELOOP:
      return "too many levels of symbolic links";
    case -ESTALE:
      return "the sandbox's filesystem is gone";
    case -EPERM:
      return "operation not permitted on the sandbox's root directory";
    default:
      return strerror(-err);
  }
}
