/*
 * treecopy.c: copies a tree a sandbox can write, descriptor by descriptor,
 * without ever following a symlink (state.h's wbd_copy_tree). Every name is
 * opened relative to its directory's descriptor with O_NOFOLLOW and checked
 * against what fstatat saw (device, inode, type): a directory swapped for a
 * symlink, or a file for a fifo, between the look and the open fails the
 * copy ("changed during the copy"); nothing outside the tree is ever read.
 *
 * Kept as cp -a kept them: symlinks (as links), fifos, sockets, hard links
 * (regular files), sparse files (holes by SEEK_DATA/SEEK_HOLE), extended
 * attributes, set-id bits, modes, owners and times. Device nodes fail the
 * copy (a jail cannot make one). Mount points below the top are left out.
 *
 * However deep the tree, at most WINDOW directories per side stay open:
 * deeper ones are closed and reopened through ".." (checked against the
 * device and inode recorded on the way down) on the way back up.
 */
#include "state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define WINDOW 32
#define CHUNK  ((size_t)1 << 20)
#define DFLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)

struct level {
  char **names;
  size_t n, i;
  struct stat st; /* the source directory */
  dev_t ddev;     /* the destination directory */
  ino_t dino;
  int sfd, dfd; /* -1 when closed (outside the window) */
  size_t plen;  /* length of the relative path up to here */
};

struct link_ent {
  dev_t dev;
  ino_t ino;
  char *rel; /* its copy's path below the destination top */
  struct link_ent *next;
};

struct walk {
  struct wbd_copy *c;
  struct level *v;
  size_t depth, cap;
  dev_t top_dev;
  int dtop;   /* the destination top's parent, for linkat */
  char *path; /* relative path of the entry at hand */
  size_t pcap;
  struct link_ent *links[256];
};

static int fail(struct walk *w, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct walk *w, int err, const char *fmt, ...) {
  struct wbd_copy *c = w->c;
  if (!c->err) {
    c->err = err ? err : EIO;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(c->msg, sizeof c->msg, "%s: %s", w->path[0] ? w->path : ".", what);
  }
  return -1;
}

static int fail_errno(struct walk *w, const char *what) {
  int e = errno ? errno : EIO;
  return fail(w, e, "%s: %s", what, strerror(e));
}

static void path_set(struct walk *w, size_t base, const char *name) {
  size_t n = strlen(name);
  if (base + n + 2 > w->pcap) {
    while (base + n + 2 > w->pcap) w->pcap *= 2;
    char *p = realloc(w->path, w->pcap);
    if (!p) abort();
    w->path = p;
  }
  if (base) w->path[base++] = '/';
  memcpy(w->path + base, name, n + 1);
}

/* ---- metadata ---- */

static uid_t map_uid(const struct wbd_copy *c, uid_t u) {
  return c->remap && u == c->from_uid ? c->to_uid : u;
}
static gid_t map_gid(const struct wbd_copy *c, gid_t g) {
  return c->remap && g == c->from_gid ? c->to_gid : g;
}

/* Owner then mode (chown clears set-id bits). Without root, another owner
 * is not ours to give: left as it is, as cp -a does. */
static int set_owner_mode(struct walk *w, int fd, const struct stat *st) {
  if (fchown(fd, map_uid(w->c, st->st_uid), map_gid(w->c, st->st_gid)) != 0 && errno != EPERM)
    return fail_errno(w, "cannot set the owner");
  if (fchmod(fd, st->st_mode & 07777) != 0) return fail_errno(w, "cannot set the mode");
  return 0;
}

static int set_times(struct walk *w, int fd, const struct stat *st) {
  struct timespec ts[2] = {st->st_atim, st->st_mtim};
  if (futimens(fd, ts) != 0) return fail_errno(w, "cannot set the times");
  return 0;
}

/* Extended attributes, fd to fd; one that cannot be set is skipped (as cp
 * -a skips it), one that cannot be read fails the copy. */
static int copy_xattrs(struct walk *w, int in, int out) {
  ssize_t n = flistxattr(in, NULL, 0);
  if (n < 0) return errno == ENOTSUP ? 0 : fail_errno(w, "cannot list the extended attributes");
  if (n == 0) return 0;
  char *names = malloc((size_t)n), *val = NULL;
  if (!names) abort();
  n = flistxattr(in, names, (size_t)n);
  int rc = n < 0 ? fail_errno(w, "cannot list the extended attributes") : 0;
  for (ssize_t off = 0; rc == 0 && off < n; off += (ssize_t)strlen(names + off) + 1) {
    const char *k = names + off;
    ssize_t vn = fgetxattr(in, k, NULL, 0);
    char *nv = vn >= 0 ? realloc(val, (size_t)vn + 1) : NULL;
    if (vn >= 0 && !nv) abort();
    if (nv) val = nv;
    if (vn < 0 || (vn = fgetxattr(in, k, val, (size_t)vn)) < 0) {
      if (errno == ENODATA) continue;
      rc = fail_errno(w, "cannot read an extended attribute");
      break;
    }
    if (fsetxattr(out, k, val, (size_t)vn, 0) != 0) {
    }
  }
  free(names);
  free(val);
  return rc;
}

/* ---- regular files ---- */

/* n more bytes written (less when negative): within the copy's budget (the
 * data directory's free space) and its pool's (the team's stored bytes). */
static int charge(struct walk *w, long long n) {
  struct wbd_copy *c = w->c;
  if (n > 0 && c->budget >= 0 && c->bytes + n > c->budget)
    return fail(w, ENOSPC, "not enough free space in the data directory");
  if (c->pool) {
    long long now = __atomic_add_fetch(c->pool, n, __ATOMIC_RELAXED);
    if (n > 0 && c->pool_limit >= 0 && now > c->pool_limit) {
      __atomic_sub_fetch(c->pool, n, __ATOMIC_RELAXED);
      return fail(w, EDQUOT, "over the team's storage limit of %lld MB", c->pool_limit >> 20);
    }
  }
  c->bytes += n;
  return 0;
}

/* Bytes [off, end) of in to out, by copy_file_range, or read/write when the
 * two filesystems cannot. A read that would block fails the copy. */
static int copy_range(struct walk *w, int in, int out, off_t off, off_t end) {
  static int no_cfr;
  char *buf = NULL;
  int rc = 0;
  while (rc == 0 && off < end) {
    size_t want = (size_t)(end - off) < CHUNK ? (size_t)(end - off) : CHUNK;
    if ((rc = charge(w, (long long)want)) != 0) break;
    ssize_t got = -1;
    if (!__atomic_load_n(&no_cfr, __ATOMIC_RELAXED)) {
      loff_t a = off, b = off;
      got = copy_file_range(in, &a, out, &b, want, 0);
      if (got < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL)) {
        if (errno == ENOSYS) __atomic_store_n(&no_cfr, 1, __ATOMIC_RELAXED);
        got = -2;
      }
    }
    if (got == -1 || got >= 0) {
      if (got < 0)
        rc = fail_errno(w, "cannot copy the data");
      else if (got == 0)
        rc = fail(w, EIO, "the file shrank during the copy");
      off += got > 0 ? got : 0;
      if (got > 0) charge(w, -(long long)(want - (size_t)got));
      continue;
    }
    if (!buf && !(buf = malloc(CHUNK))) abort();
    ssize_t r = pread(in, buf, want, off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = errno == EAGAIN ? fail(w, EAGAIN, "a read would block") : fail_errno(w, "cannot read");
      break;
    }
    if (r == 0) {
      rc = fail(w, EIO, "the file shrank during the copy");
      break;
    }
    for (ssize_t done = 0; done < r;) {
      ssize_t k = pwrite(out, buf + done, (size_t)(r - done), off + done);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        rc = fail_errno(w, "cannot write");
        break;
      }
      done += k;
    }
    charge(w, -(long long)(want - (size_t)r));
    off += r;
  }
  free(buf);
  return rc;
}

/* The data of in to out, holes kept: a reflink when the filesystem makes
 * one, else segment by segment. */
static int copy_data(struct walk *w, int in, int out, const struct stat *st) {
  if (st->st_size == 0) return 0;
  if (ioctl(out, FICLONE, in) == 0) return charge(w, (long long)st->st_blocks * 512);
  off_t off = 0;
  while (off < st->st_size) {
    off_t data = lseek(in, off, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break; /* only a hole is left */
    if (data < 0) return fail_errno(w, "cannot find the data");
    off_t hole = lseek(in, data, SEEK_HOLE);
    if (hole < 0) return fail_errno(w, "cannot find the holes");
    if (hole > st->st_size) hole = st->st_size;
    if (copy_range(w, in, out, data, hole) != 0) return -1;
    off = hole;
  }
  if (ftruncate(out, st->st_size) != 0) return fail_errno(w, "cannot size the copy");
  return 0;
}

static unsigned link_hash(dev_t d, ino_t i) {
  return (unsigned)((d * 31u + i) % 256u);
}

static struct link_ent *link_find(struct walk *w, const struct stat *st) {
  for (struct link_ent *e = w->links[link_hash(st->st_dev, st->st_ino)]; e; e = e->next)
    if (e->dev == st->st_dev && e->ino == st->st_ino) return e;
  return NULL;
}

static void link_add(struct walk *w, const struct stat *st) {
  struct link_ent *e = calloc(1, sizeof *e);
  if (!e || !(e->rel = strdup(w->path))) abort();
  e->dev = st->st_dev;
  e->ino = st->st_ino;
  unsigned h = link_hash(st->st_dev, st->st_ino);
  e->next = w->links[h];
  w->links[h] = e;
}

/* Opens name below dfd for writing, replacing what is there unless it is a
 * directory (a fresh sandbox's skeleton holds a few empty files). */
static int open_out(int dfd, const char *name) {
  int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST && unlinkat(dfd, name, 0) == 0)
    fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  return fd;
}

static int same(const struct stat *a, const struct stat *b) {
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino && (a->st_mode & S_IFMT) == (b->st_mode & S_IFMT);
}

static int copy_file(struct walk *w, int sfd, int dfd, const char *name, const struct stat *st) {
  if (st->st_nlink > 1) {
    struct link_ent *e = link_find(w, st);
    if (e && strlen(e->rel) < PATH_MAX) {
      if (unlinkat(dfd, name, 0) != 0 && errno != ENOENT) return fail_errno(w, "cannot replace");
      if (linkat(w->dtop, e->rel, dfd, name, 0) == 0) return 0;
      return fail_errno(w, "cannot make the hard link");
    }
  }
  int in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  struct stat now;
  if (in < 0) return fail_errno(w, "cannot open");
  if (fstat(in, &now) != 0 || !same(&now, st)) {
    close(in);
    return fail(w, EAGAIN, "changed during the copy");
  }
  int out = open_out(dfd, name), rc = -1;
  if (out < 0)
    rc = fail_errno(w, "cannot create the copy");
  else if (copy_data(w, in, out, &now) == 0 && copy_xattrs(w, in, out) == 0 && set_owner_mode(w, out, &now) == 0 &&
           set_times(w, out, &now) == 0)
    rc = 0;
  if (out >= 0 && close(out) != 0 && rc == 0) rc = fail_errno(w, "cannot write");
  close(in);
  if (rc == 0 && st->st_nlink > 1 && !link_find(w, st)) link_add(w, st);
  return rc;
}

/* ---- the other kinds ---- */

/* Makes the node (a symlink, fifo or socket) name below dfd, replacing a
 * non-directory already there. */
static int make_node(struct walk *w, int sfd, int dfd, const char *name, const struct stat *st) {
  char *target = NULL;
  if (S_ISLNK(st->st_mode)) {
    size_t cap = (size_t)st->st_size + 2;
    target = malloc(cap);
    if (!target) abort();
    ssize_t n = readlinkat(sfd, name, target, cap);
    if (n < 0 || (size_t)n >= cap - 1) {
      free(target);
      return n < 0 ? fail_errno(w, "cannot read the link") : fail(w, EAGAIN, "changed during the copy");
    }
    target[n] = 0;
  }
  int rc = -1;
  for (int tries = 0; tries < 2 && rc != 0; tries++) {
    if (target)
      rc = symlinkat(target, dfd, name);
    else if (S_ISFIFO(st->st_mode))
      rc = mkfifoat(dfd, name, 0600);
    else
      rc = mknodat(dfd, name, S_IFSOCK | 0600, 0);
    if (rc != 0 && (errno != EEXIST || unlinkat(dfd, name, 0) != 0)) break;
  }
  free(target);
  if (rc != 0) return fail_errno(w, "cannot make the copy");
  if (fchownat(dfd, name, map_uid(w->c, st->st_uid), map_gid(w->c, st->st_gid), AT_SYMLINK_NOFOLLOW) != 0 &&
      errno != EPERM)
    return fail_errno(w, "cannot set the owner");
  /* the node was just made in the copy, which only warmboxd writes */
  if (!S_ISLNK(st->st_mode) && fchmodat(dfd, name, st->st_mode & 07777, 0) != 0)
    return fail_errno(w, "cannot set the mode");
  struct timespec ts[2] = {st->st_atim, st->st_mtim};
  if (utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW) != 0) return fail_errno(w, "cannot set the times");
  return 0;
}

/* ---- directories ---- */

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in the directory open at fd (a copy of fd is read). */
static int read_names(struct walk *w, int fd, struct level *l) {
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
  if (!d) {
    if (dup_fd >= 0) close(dup_fd);
    return fail_errno(w, "cannot read the directory");
  }
  rewinddir(d);
  size_t cap = 0;
  struct dirent *e;
  errno = 0;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (l->n == cap && !(l->names = realloc(l->names, (cap = cap ? cap * 2 : 16) * sizeof *l->names))) abort();
    if (!(l->names[l->n++] = strdup(e->d_name))) abort();
  }
  int rc = errno ? fail_errno(w, "cannot read the directory") : 0;
  closedir(d);
  if (l->n) qsort(l->names, l->n, sizeof *l->names, cmp_names);
  return rc;
}

/* The directory `name` below sfd (seen as st) and its copy below dfd,
 * opened: a new level. */
static int push(struct walk *w, int sfd, int dfd, const char *name, const struct stat *st) {
  int s = openat(sfd, name, DFLAGS), d = -1;
  struct stat now, dst;
  if (s < 0 && (errno == ELOOP || errno == ENOTDIR)) return fail(w, EAGAIN, "changed during the copy");
  if (s < 0) return fail_errno(w, "cannot open the directory");
  if (fstat(s, &now) != 0 || !same(&now, st)) {
    close(s);
    return fail(w, EAGAIN, "changed during the copy");
  }
  if (mkdirat(dfd, name, 0700) != 0 && errno != EEXIST) {
    close(s);
    return fail_errno(w, "cannot make the directory");
  }
  d = openat(dfd, name, DFLAGS);
  if (d < 0 || fstat(d, &dst) != 0) {
    if (d >= 0) close(d);
    close(s);
    return fail_errno(w, "cannot open the copy");
  }
  if (w->depth + 1 >= w->cap) {
    w->cap = w->cap ? w->cap * 2 : 64;
    if (!(w->v = realloc(w->v, w->cap * sizeof *w->v))) abort();
  }
  struct level *l = &w->v[w->depth++];
  memset(l, 0, sizeof *l);
  l->st = now;
  l->ddev = dst.st_dev;
  l->dino = dst.st_ino;
  l->sfd = s;
  l->dfd = d;
  l->plen = strlen(w->path);
  if (w->depth > WINDOW) {
    struct level *old = &w->v[w->depth - 1 - WINDOW];
    if (old->sfd >= 0) close(old->sfd);
    if (old->dfd >= 0) close(old->dfd);
    old->sfd = old->dfd = -1;
  }
  if (read_names(w, s, l) != 0 || copy_xattrs(w, s, d) != 0) return -1;
  return 0;
}

/* Reopens level l (closed) through ".." of the level below it. */
static int reopen(struct walk *w, struct level *l, const struct level *child) {
  int s = openat(child->sfd, "..", DFLAGS), d = openat(child->dfd, "..", DFLAGS);
  struct stat a, b;
  if (s < 0 || d < 0 || fstat(s, &a) != 0 || fstat(d, &b) != 0 || !same(&a, &l->st) || b.st_dev != l->ddev ||
      b.st_ino != l->dino) {
    if (s >= 0) close(s);
    if (d >= 0) close(d);
    return fail(w, EAGAIN, "changed during the copy");
  }
  l->sfd = s;
  l->dfd = d;
  return 0;
}

static void level_free(struct level *l) {
  for (size_t i = 0; i < l->n; i++) free(l->names[i]);
  free(l->names);
  if (l->sfd >= 0) close(l->sfd);
  if (l->dfd >= 0) close(l->dfd);
}

/* The level on top is done: its copy gets its owner, mode and times. */
static int pop(struct walk *w) {
  struct level *l = &w->v[w->depth - 1];
  w->path[l->plen] = 0;
  int rc = set_owner_mode(w, l->dfd, &l->st);
  if (rc == 0) rc = set_times(w, l->dfd, &l->st);
  if (rc == 0 && w->depth > 1 && w->v[w->depth - 2].sfd < 0) rc = reopen(w, &w->v[w->depth - 2], l);
  level_free(l);
  w->depth--;
  return rc;
}

static int copy_entry(struct walk *w, struct level *l, const char *name) {
  struct stat st;
  path_set(w, l->plen, name);
  if (fstatat(l->sfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return 0; /* gone meanwhile */
    return fail_errno(w, "cannot look at it");
  }
  if (st.st_dev != w->top_dev) return 0; /* a mount point: not the sandbox's files */
  if (S_ISDIR(st.st_mode)) return push(w, l->sfd, l->dfd, name, &st);
  if (S_ISREG(st.st_mode)) return copy_file(w, l->sfd, l->dfd, name, &st);
  if (S_ISLNK(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))
    return make_node(w, l->sfd, l->dfd, name, &st);
  return fail(w, EPERM, "a device node is not copied");
}

int wbd_copy_tree(int sparent, const char *name, int dparent, struct wbd_copy *c) {
  struct walk w = {.c = c, .dtop = dparent, .pcap = 256};
  if (!(w.path = malloc(w.pcap))) abort();
  path_set(&w, 0, name);
  struct stat st;
  int rc;
  if (fstatat(sparent, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    rc = errno == ENOENT ? 0 : fail_errno(&w, "cannot look at it");
  } else if (!S_ISDIR(st.st_mode)) {
    rc = fail(&w, ENOTDIR, "not a directory");
  } else {
    w.top_dev = st.st_dev;
    rc = push(&w, sparent, dparent, name, &st);
    while (rc == 0 && w.depth) {
      struct level *l = &w.v[w.depth - 1];
      if (l->i < l->n)
        rc = copy_entry(&w, l, l->names[l->i++]);
      else
        rc = pop(&w);
    }
  }
  while (w.depth) level_free(&w.v[--w.depth]);
  free(w.v);
  for (int i = 0; i < 256; i++)
    for (struct link_ent *e = w.links[i], *n; e; e = n) {
      n = e->next;
      free(e->rel);
      free(e);
    }
  free(w.path);
  return rc;
}

int wbd_copy_status(const struct wbd_copy *c) {
  if (c->err == ENOSPC || c->err == EFBIG) return 507;
  if (c->err == EDQUOT) return 429;
  return 500;
}
