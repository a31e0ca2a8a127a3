/*
 * rtfiles.c: the one step that copies a sandbox's files (its `/`, home and
 * /tmp: everything the jail can write) out to a directory and back into a
 * fresh sandbox. Snapshots, forks and paused sandboxes kept across a
 * restart all go through here (state.h).
 *
 * The copy is treecopy.c's: descriptor-relative, no symlink followed at
 * any level, so a tree the jail (or envd on its behalf) changes under it
 * can at worst fail the copy, never put a file from outside it in. The
 * source sandbox's processes are held still meanwhile and envd's calls that
 * change files are refused (control.c's transition gate); the target is a
 * new sandbox no process runs in yet.
 */
#include "state.h"
#include "interp.h"
#include "jail.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const g_trees[] = {"home", "tmp", "root", NULL};

const char *wbd_state_dir(const char *sub, char *buf, size_t len) {
  char top[PATH_MAX];
  snprintf(top, sizeof top, "%s/.state", wbd_opt.data_dir);
  if (mkdir(top, 0700) != 0 && errno != EEXIST) return NULL;
  snprintf(buf, len, "%s/%s", top, sub);
  if (mkdir(buf, 0700) != 0 && errno != EEXIST) return NULL;
  return buf;
}

static int open_dir(const char *path, struct wbd_copy *c) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && !c->err) {
    c->err = errno;
    snprintf(c->msg, sizeof c->msg, "%.400s: %s", path, strerror(errno));
  }
  return fd;
}

/* from/<tree> into to/ for the trees `from` has. */
static int copy_trees(const char *from, const char *to, struct wbd_copy *c) {
  int sfd = open_dir(from, c), dfd = sfd >= 0 ? open_dir(to, c) : -1;
  int rc = sfd >= 0 && dfd >= 0 ? 0 : -1;
  struct stat st;
  if (rc == 0 && c->remap && fstatat(sfd, "home", &st, AT_SYMLINK_NOFOLLOW) == 0) {
    /* what the saved jail's user owned (the owner of its home) is this jail's */
    c->from_uid = st.st_uid;
    c->from_gid = st.st_gid;
  }
  for (int i = 0; rc == 0 && g_trees[i]; i++) rc = wbd_copy_tree(sfd, g_trees[i], dfd, c);
  if (sfd >= 0) close(sfd);
  if (dfd >= 0) close(dfd);
  return rc;
}

int wbd_files_save(struct wbd_sandbox *sb, const char *dest, int hold, struct wbd_copy *c) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) {
    c->err = ESRCH;
    snprintf(c->msg, sizeof c->msg, "the sandbox is gone");
    return -1;
  }
  char files[PATH_MAX + 16];
  snprintf(files, sizeof files, "%s/files", dest);
  int rc = 0;
  if ((mkdir(dest, 0700) != 0 && errno != EEXIST) || (mkdir(files, 0700) != 0 && errno != EEXIST)) {
    c->err = errno;
    snprintf(c->msg, sizeof c->msg, "cannot make %.400s: %s", files, strerror(errno));
    rc = -1;
  }
  int held = rc == 0 && hold ? wbd_rt_hold(rt, 1) : 0;
  if (rc == 0) rc = copy_trees(wbd_rt_dir(rt), files, c);
  if (held) wbd_rt_hold(rt, 0);
  wbd_rt_put(rt);
  if (rc != 0) fprintf(stderr, "warmboxd: cannot copy the files of %s to %s: %s\n", sb->id, dest, c->msg);
  return rc;
}

int wbd_files_load(struct wbd_sandbox *sb, const char *src) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return -1;
  char files[PATH_MAX + 16];
  snprintf(files, sizeof files, "%s/files", src);
  struct wbd_copy c = {.budget = -1, .pool_limit = -1, .remap = 1};
  wbd_rt_owner(rt, &c.to_uid, &c.to_gid);
  int rc = copy_trees(files, wbd_rt_dir(rt), &c);
  wbd_rt_put(rt);
  snprintf(files, sizeof files, "%s/" KERNEL_DUMP, src);
  json_t *dump = rc == 0 ? json_load_file(files, 0, NULL) : NULL;
  if (dump) wbd_interp_restore(sb, dump);
  json_decref(dump);
  if (rc != 0) fprintf(stderr, "warmboxd: cannot copy the files of %s into %s: %s\n", src, sb->id, c.msg);
  return rc;
}

void wbd_files_remove(const char *dir) {
  wbd_rt_remove_tree(dir);
}

int wbd_state_write_json(const char *dir, const char *name, json_t *o) {
  char tmp[PATH_MAX + 64], path[PATH_MAX + 64];
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int rc = json_dump_file(o, tmp, JSON_COMPACT) == 0 && rename(tmp, path) == 0 ? 0 : -1;
  json_decref(o);
  if (rc != 0) unlink(tmp);
  return rc;
}
