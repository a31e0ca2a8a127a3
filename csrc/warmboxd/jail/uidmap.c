/*
 * uidmap.c: a root warmboxd's host uid range. Each live sandbox runs as a
 * host uid of its own (the range's first uid + a slot); two instances on one
 * host must not share a range, or one instance's jail could signal, trace or
 * read the /proc of another's. A range is taken with an flock of its own
 * file, held for the life of the process, and only when no account and no
 * running process already uses one of its uids.
 *
 * Without root, warmboxd enters a user namespace of its own instead
 * (wbd_userns_enter), its uid mapped to itself, to own a mount namespace.
 */
#include "jail.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* How many ranges of `slots` are tried after the base. */
#define N_RANGES 64

static int in_range(unsigned long id, uid_t first, unsigned slots) {
  return id >= first && id - first < slots;
}

/* An account of /etc/passwd or /etc/group in the range: its name, or NULL. */
static const char *account_in(uid_t first, unsigned slots, char *buf, size_t len) {
  FILE *f = fopen("/etc/passwd", "re");
  struct passwd *pw;
  while (f && (pw = fgetpwent(f)))
    if (in_range(pw->pw_uid, first, slots) || in_range(pw->pw_gid, first, slots)) {
      snprintf(buf, len, "user %s (%lu)", pw->pw_name, (unsigned long)pw->pw_uid);
      fclose(f);
      return buf;
    }
  if (f) fclose(f);
  f = fopen("/etc/group", "re");
  struct group *gr;
  while (f && (gr = fgetgrent(f)))
    if (in_range(gr->gr_gid, first, slots)) {
      snprintf(buf, len, "group %s (%lu)", gr->gr_name, (unsigned long)gr->gr_gid);
      fclose(f);
      return buf;
    }
  if (f) fclose(f);
  return NULL;
}

/* A process running as a uid of the range (another instance's jail, an
 * older warmboxd that takes no lock): its pid, or 0. */
static long process_in(uid_t first, unsigned slots) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  struct dirent *e;
  long found = 0;
  while (!found && (e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    struct stat st;
    if (pid <= 0 || *end || fstatat(dirfd(d), e->d_name, &st, 0) != 0) continue;
    if (in_range(st.st_uid, first, slots)) found = pid;
  }
  closedir(d);
  return found;
}

/* 0: the range is this process's (its lock fd stays open), else -1 and why. */
static int try_range(const char *lock_dir, uid_t first, unsigned slots, char *why, size_t len) {
  char path[4096], acct[320];
  snprintf(path, sizeof path, "%s/uids-%lu.lock", lock_dir, (unsigned long)first);
  int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(why, len, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    snprintf(why, len, "uids %lu-%lu are another warmboxd's (%s is locked)", (unsigned long)first,
             (unsigned long)first + slots - 1, path);
    close(fd);
    return -1;
  }
  long pid = process_in(first, slots);
  const char *who = pid ? NULL : account_in(first, slots, acct, sizeof acct);
  if (pid || who) {
    if (pid)
      snprintf(why, len, "uids %lu-%lu are in use: process %ld runs as one", (unsigned long)first,
               (unsigned long)first + slots - 1, pid);
    else
      snprintf(why, len, "uids %lu-%lu are in use: %s", (unsigned long)first, (unsigned long)first + slots - 1, who);
    close(fd);
    return -1;
  }
  return 0; /* fd is kept: the lock lasts as long as the process */
}

uid_t wbd_uid_range_take(const char *lock_dir, uid_t base, uid_t want, unsigned slots, char *why, size_t len) {
  why[0] = 0;
  if (mkdir(lock_dir, 0700) != 0 && errno != EEXIST) {
    snprintf(why, len, "cannot create %s: %s", lock_dir, strerror(errno));
    return 0;
  }
  struct stat st;
  if (lstat(lock_dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
    snprintf(why, len, "%s is not a directory of warmboxd's own that only it can write", lock_dir);
    return 0;
  }
  if (want) return try_range(lock_dir, want, slots, why, len) == 0 ? want : 0;
  for (unsigned i = 0; i < N_RANGES; i++) {
    uid_t first = base + (uid_t)(i * slots);
    if (try_range(lock_dir, first, slots, why, len) == 0) return first;
  }
  return 0;
}

static int write_str(const char *path, const char *s) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, s, strlen(s));
  int e = errno;
  close(fd);
  errno = e;
  return n == (ssize_t)strlen(s) ? 0 : -1;
}

int wbd_userns_enter(void) {
  uid_t uid = geteuid();
  gid_t gid = getegid();
  if (unshare(CLONE_NEWUSER) != 0) return -1;
  char m[64];
  if (write_str("/proc/self/setgroups", "deny") != 0 && errno != ENOENT) return -1;
  snprintf(m, sizeof m, "%lu %lu 1\n", (unsigned long)uid, (unsigned long)uid);
  if (write_str("/proc/self/uid_map", m) != 0) return -1;
  snprintf(m, sizeof m, "%lu %lu 1\n", (unsigned long)gid, (unsigned long)gid);
  return write_str("/proc/self/gid_map", m);
}
