/*
 * rtfiles.c: the one step that copies a sandbox's files (its `/`, home and
 * /tmp: everything the jail can write) out to a directory and back into a
 * fresh sandbox. Snapshots, forks and paused sandboxes kept across a
 * restart all go through here (state.h).
 *
 * The copy is GNU cp -a (symlinks copied as links, never followed; owners,
 * modes, times, fifos and sockets kept). The source sandbox's processes are
 * held still meanwhile, and the target is a new sandbox no process runs in
 * yet, so nothing in a jail can swap a path under the copy.
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

extern char **environ;

#define CP "/bin/cp"
static const char *const g_trees[] = { "home", "tmp", "root", NULL };

const char *wbd_state_dir(const char *sub, char *buf, size_t len) {
  char top[PATH_MAX];
  snprintf(top, sizeof top, "%s/.state", wbd_opt.data_dir);
  if (mkdir(top, 0700) != 0 && errno != EEXIST) return NULL;
  snprintf(buf, len, "%s/%s", top, sub);
  if (mkdir(buf, 0700) != 0 && errno != EEXIST) return NULL;
  return buf;
}

static int run(char *const argv[]) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    fprintf(stderr, "warmboxd: cannot run %s: %s\n", argv[0], strerror(rc));
    return -1;
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* cp -a from/<tree> ... into to/ for the trees `from` has. */
static int copy_trees(const char *from, const char *to) {
  char paths[4][PATH_MAX + 16];
  char *argv[8] = { CP, "-a", "--reflink=auto", NULL };
  int n = 3;
  for (int i = 0; g_trees[i]; i++) {
    struct stat st;
    snprintf(paths[i], sizeof paths[i], "%s/%s", from, g_trees[i]);
    if (lstat(paths[i], &st) == 0 && S_ISDIR(st.st_mode)) argv[n++] = paths[i];
  }
  if (n == 3) return 0;
  char target[PATH_MAX + 64];
  snprintf(target, sizeof target, "%s", to);
  argv[n++] = target;
  argv[n] = NULL;
  return run(argv);
}

int wbd_files_save(struct wbd_sandbox *sb, const char *dest, int hold) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return -1;
  char files[PATH_MAX + 16];
  snprintf(files, sizeof files, "%s/files", dest);
  int rc = mkdir(dest, 0700) != 0 && errno != EEXIST ? -1 : 0;
  if (rc == 0 && mkdir(files, 0700) != 0 && errno != EEXIST) rc = -1;
  int held = rc == 0 && hold ? wbd_rt_hold(rt, 1) : 0;
  if (rc == 0) rc = copy_trees(wbd_rt_dir(rt), files);
  if (held) wbd_rt_hold(rt, 0);
  wbd_rt_put(rt);
  if (rc != 0) fprintf(stderr, "warmboxd: cannot copy the files of %s to %s\n", sb->id, dest);
  return rc;
}

/* nftw has no closure: one remap at a time. */
static pthread_mutex_t g_remap_mu = PTHREAD_MUTEX_INITIALIZER;
static uid_t g_from_uid, g_to_uid;
static gid_t g_from_gid, g_to_gid;
static int g_remap_err;

static int remap_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)flag;
  (void)ftw;
  uid_t u = st->st_uid == g_from_uid ? g_to_uid : (uid_t)-1;
  gid_t g = st->st_gid == g_from_gid ? g_to_gid : (gid_t)-1;
  if ((u != (uid_t)-1 || g != (gid_t)-1) && lchown(path, u, g) != 0) g_remap_err = errno;
  /* lchown clears set-id bits; put them back on what keeps its mode */
  if (!S_ISLNK(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID)) && u != (uid_t)-1) chmod(path, st->st_mode & 07777);
  return 0;
}

/* What the saved jail's user owned (the owner of its home) is this jail's. */
static int remap_owner(const char *files, const char *dir, uid_t to_uid, gid_t to_gid) {
  char home[PATH_MAX + 64];
  struct stat st;
  snprintf(home, sizeof home, "%s/home", files);
  if (lstat(home, &st) != 0 || (st.st_uid == to_uid && st.st_gid == to_gid)) return 0;
  pthread_mutex_lock(&g_remap_mu);
  g_from_uid = st.st_uid;
  g_from_gid = st.st_gid;
  g_to_uid = to_uid;
  g_to_gid = to_gid;
  g_remap_err = 0;
  int rc = nftw(dir, remap_one, 16, FTW_PHYS | FTW_MOUNT);
  if (rc == 0 && g_remap_err) rc = -1;
  pthread_mutex_unlock(&g_remap_mu);
  return rc == 0 ? 0 : -1;
}

int wbd_files_load(struct wbd_sandbox *sb, const char *src) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return -1;
  char files[PATH_MAX + 16];
  snprintf(files, sizeof files, "%s/files", src);
  uid_t uid;
  gid_t gid;
  wbd_rt_owner(rt, &uid, &gid);
  int rc = copy_trees(files, wbd_rt_dir(rt));
  if (rc == 0) rc = remap_owner(files, wbd_rt_dir(rt), uid, gid);
  wbd_rt_put(rt);
  snprintf(files, sizeof files, "%s/" KERNEL_DUMP, src);
  json_t *dump = rc == 0 ? json_load_file(files, 0, NULL) : NULL;
  if (dump) wbd_interp_restore(sb, dump);
  json_decref(dump);
  if (rc != 0) fprintf(stderr, "warmboxd: cannot copy the files of %s into %s\n", src, sb->id);
  return rc;
}

void wbd_files_remove(const char *dir) { wbd_rt_remove_tree(dir); }

int wbd_state_write_json(const char *dir, const char *name, json_t *o) {
  char tmp[PATH_MAX + 64], path[PATH_MAX + 64];
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int rc = json_dump_file(o, tmp, JSON_COMPACT) == 0 && rename(tmp, path) == 0 ? 0 : -1;
  json_decref(o);
  if (rc != 0) unlink(tmp);
  return rc;
}
