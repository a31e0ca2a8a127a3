/* lock.c: the OS-level lock primitive of warmbox.core (warmbox.Flock).
 *
 * A Flock is one open file holding flock(2) state. flock locks belong to
 * the open file description, so two Flocks on one path exclude each other
 * even inside one process, and the kernel drops the lock when the holder
 * dies (every fd closed). The file's bytes are the per-key shared state
 * written while the lock is held (warmbox.lock puts a header and the
 * remembered sandbox there). Waiting policy (coroutines, backoff) is Lua's:
 * fl:lock(timeout) is the plain blocking poll for direct use.
 *
 * Also registers core.getpid (the holder pid written in lock files);
 * core.now / core.sleep / core.sha256 come from core.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "warmbox_core.h"
#include "warmbox_clock.h"

#define WARMBOX_FLOCK_MT "warmbox.Flock"

typedef struct {
  int fd;     /* -1 when closed */
  int locked; /* we hold flock on fd (as far as we know) */
} warmbox_flock;

/* ---------- warmbox.Flock ---------- */

static warmbox_flock *warmbox_flock_check(lua_State *L) {
  warmbox_flock *f = (warmbox_flock *)luaL_checkudata(L, 1, WARMBOX_FLOCK_MT);
  if (f->fd < 0) luaL_error(L, "attempt to use a closed " WARMBOX_FLOCK_MT);
  return f;
}

static int warmbox_flock_fail(lua_State *L, const char *what, int err) {
  luaL_pushfail(L);
  lua_pushfstring(L, "%s: %s", what, strerror(err));
  lua_pushliteral(L, "IO");
  return 3;
}

/* core.flock_open(path) -> warmbox.Flock | nil, msg, "IO" */
static int warmbox_flock_open(lua_State *L) {
  size_t len;
  const char *path = luaL_checklstring(L, 1, &len);
  warmbox_flock *f;
  int fd;
  luaL_argcheck(L, strlen(path) == len, 1, "path contains a NUL byte");
  /* Create the handle closed first, so a memory error while the userdata is
   * made cannot leak the descriptor. */
  f = (warmbox_flock *)lua_newuserdatauv(L, sizeof *f, 1);
  f->fd = -1;
  f->locked = 0;
  luaL_setmetatable(L, WARMBOX_FLOCK_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1); /* the path, for fl:stale() and __tostring */
  /* O_CLOEXEC: a child started while we hold the lock (io.popen, a kernel)
   * must not inherit the open file description and with it the lock. */
  /* O_NOFOLLOW: a symlink planted where the lock file goes is never
   * followed; a file someone else owns, or that others may write, is never
   * used (it holds the session's sandbox id and access token). */
  do {
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int e = errno;
    luaL_pushfail(L);
    lua_pushfstring(L, "cannot open lock file '%s': %s", path,
                    e == ELOOP ? "it is a symbolic link (refused)" : strerror(e));
    lua_pushliteral(L, "IO");
    return 3;
  }
  {
    struct stat st;
    const char *why = NULL;
    if (fstat(fd, &st) != 0)
      why = strerror(errno);
    else if (!S_ISREG(st.st_mode))
      why = "not a regular file";
    else if (st.st_uid != geteuid())
      why = "owned by another user";
    else if (st.st_mode & 022)
      why = "writable by others";
    if (why) {
      close(fd);
      luaL_pushfail(L);
      lua_pushfstring(L, "refusing lock file '%s': %s", path, why);
      lua_pushliteral(L, "IO");
      return 3;
    }
  }
  f->fd = fd;
  return 1;
}

/* core.private_dir(path) -> true | nil, msg, "IO": path is a directory
 * (not a symlink) owned by this user that no one else may write to. */
static int warmbox_private_dir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  const char *why = NULL;
  if (lstat(path, &st) != 0) {
    int e = errno;
    luaL_pushfail(L);
    lua_pushfstring(L, "cannot use directory '%s': %s", path, strerror(e));
    lua_pushliteral(L, "IO");
    return 3;
  }
  if (S_ISLNK(st.st_mode))
    why = "it is a symbolic link";
  else if (!S_ISDIR(st.st_mode))
    why = "not a directory";
  else if (st.st_uid != geteuid())
    why = "owned by another user";
  else if (st.st_mode & 022)
    why = "writable by others";
  if (!why) {
    lua_pushboolean(L, 1);
    return 1;
  }
  luaL_pushfail(L);
  lua_pushfstring(L, "refusing directory '%s': %s (it must be yours, mode 0700)", path, why);
  lua_pushliteral(L, "IO");
  return 3;
}

/* Returns 1 when acquired, 0 when busy, -1 with errno on error. */
static int warmbox_flock_try(int fd, int shared) {
  for (;;) {
    if (flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) == 0) return 1;
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return 0;
    return -1;
  }
}

/* fl:lock(timeout_seconds [, shared]) -> true | nil, "timeout" | nil, msg, "IO"
 * Polls with LOCK_NB and short sleeps (1 ms doubling to 50 ms) so that the
 * timeout is honoured without signals. timeout <= 0: one attempt. */
static int warmbox_flock_lock(lua_State *L) {
  warmbox_flock *f = warmbox_flock_check(L);
  double timeout = luaL_checknumber(L, 2);
  int shared = lua_toboolean(L, 3);
  double deadline = warmbox_clock_now() + timeout;
  double step = 0.001;
  for (;;) {
    int r = warmbox_flock_try(f->fd, shared);
    double left;
    if (r == 1) {
      f->locked = 1;
      lua_pushboolean(L, 1);
      return 1;
    }
    if (r < 0) return warmbox_flock_fail(L, "flock", errno);
    left = deadline - warmbox_clock_now();
    if (left <= 0) {
      luaL_pushfail(L);
      lua_pushliteral(L, "timeout");
      return 2;
    }
    warmbox_clock_sleep(step < left ? step : left);
    step *= 2;
    if (step > 0.05) step = 0.05;
  }
}

/* fl:try_lock([shared]) -> true | nil, "busy" | nil, msg, "IO" */
static int warmbox_flock_try_lock(lua_State *L) {
  warmbox_flock *f = warmbox_flock_check(L);
  int r = warmbox_flock_try(f->fd, lua_toboolean(L, 2));
  if (r == 1) {
    f->locked = 1;
    lua_pushboolean(L, 1);
    return 1;
  }
  if (r < 0) return warmbox_flock_fail(L, "flock", errno);
  luaL_pushfail(L);
  lua_pushliteral(L, "busy");
  return 2;
}

/* fl:unlock() -> true | nil, msg, "IO" */
static int warmbox_flock_unlock(lua_State *L) {
  warmbox_flock *f = warmbox_flock_check(L);
  while (flock(f->fd, LOCK_UN) != 0) {
    if (errno != EINTR) return warmbox_flock_fail(L, "flock", errno);
  }
  f->locked = 0;
  lua_pushboolean(L, 1);
  return 1;
}

/* fl:read() -> the whole file | nil, msg, "IO" */
static int warmbox_flock_read(lua_State *L) {
  warmbox_flock *f = warmbox_flock_check(L);
  luaL_Buffer b;
  off_t off = 0;
  luaL_buffinit(L, &b);
  for (;;) {
    char *p = luaL_prepbuffer(&b);
    ssize_t n = pread(f->fd, p, LUAL_BUFFERSIZE, off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return warmbox_flock_fail(L, "read", errno);
    }
    if (n == 0) break;
    luaL_addsize(&b, (size_t)n);
    off += n;
  }
  luaL_pushresult(&b);
  return 1;
}

/* fl:write(str) -> true | nil, msg, "IO": replaces the contents (pwrite,
 * then truncate to the new length; no fsync: the state is a cache, E2B stays
 * the source of truth). Not truncating to zero first matters on ext4, whose
 * auto_da_alloc flushes a file truncated to zero when it is closed. */
static int warmbox_flock_write(lua_State *L) {
  warmbox_flock *f = warmbox_flock_check(L);
  size_t len, done = 0;
  const char *s = luaL_checklstring(L, 2, &len);
  while (done < len) {
    ssize_t n = pwrite(f->fd, s + done, len - done, (off_t)done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return warmbox_flock_fail(L, "write", errno);
    }
    done += (size_t)n;
  }
  while (ftruncate(f->fd, (off_t)len) != 0) {
    if (errno != EINTR) return warmbox_flock_fail(L, "truncate", errno);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* fl:touch() -> true | nil, msg, "IO": sets the file's times to now, which
 * wakes the waiters watching it (core.lock_watch: IN_ATTRIB; the header
 * writes of lockers are IN_MODIFY and wake nobody). */
static int warmbox_flock_touch(lua_State *L) {
  warmbox_flock *f = warmbox_flock_check(L);
  while (futimens(f->fd, NULL) != 0) {
    if (errno != EINTR) return warmbox_flock_fail(L, "futimens", errno);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* fl:stale() -> true when the path no longer names this open file (removed
 * or replaced), so a lock taken on it protects nothing. */
static int warmbox_flock_stale(lua_State *L) {
  warmbox_flock *f = warmbox_flock_check(L);
  struct stat a, b;
  const char *path;
  lua_getiuservalue(L, 1, 1);
  path = lua_tostring(L, -1);
  if (fstat(f->fd, &a) != 0) return warmbox_flock_fail(L, "fstat", errno);
  if (stat(path, &b) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      lua_pushboolean(L, 1);
      return 1;
    }
    return warmbox_flock_fail(L, "stat", errno);
  }
  lua_pushboolean(L, a.st_dev != b.st_dev || a.st_ino != b.st_ino);
  return 1;
}

static void warmbox_flock_release(warmbox_flock *f) {
  if (f->fd >= 0) {
    /* close() drops the flock with the last reference to the description. */
    close(f->fd);
    f->fd = -1;
    f->locked = 0;
  }
}

/* fl:close(): idempotent */
static int warmbox_flock_close(lua_State *L) {
  warmbox_flock *f = (warmbox_flock *)luaL_checkudata(L, 1, WARMBOX_FLOCK_MT);
  warmbox_flock_release(f);
  lua_pushboolean(L, 1);
  return 1;
}

static int warmbox_flock_gc(lua_State *L) {
  warmbox_flock *f = (warmbox_flock *)luaL_checkudata(L, 1, WARMBOX_FLOCK_MT);
  warmbox_flock_release(f);
  return 0;
}

static int warmbox_flock_tostring(lua_State *L) {
  warmbox_flock *f = (warmbox_flock *)luaL_checkudata(L, 1, WARMBOX_FLOCK_MT);
  if (f->fd < 0)
    lua_pushliteral(L, WARMBOX_FLOCK_MT " (closed)");
  else
    lua_pushfstring(L, WARMBOX_FLOCK_MT ": %p", (void *)f);
  return 1;
}

static int warmbox_flock_is_locked(lua_State *L) {
  warmbox_flock *f = (warmbox_flock *)luaL_checkudata(L, 1, WARMBOX_FLOCK_MT);
  lua_pushboolean(L, f->fd >= 0 && f->locked);
  return 1;
}

static const luaL_Reg warmbox_flock_methods[] = {{"lock", warmbox_flock_lock},     {"try_lock", warmbox_flock_try_lock},
                                                 {"unlock", warmbox_flock_unlock}, {"read", warmbox_flock_read},
                                                 {"write", warmbox_flock_write},   {"stale", warmbox_flock_stale},
                                                 {"touch", warmbox_flock_touch},   {"locked", warmbox_flock_is_locked},
                                                 {"close", warmbox_flock_close},   {NULL, NULL}};

static const luaL_Reg warmbox_flock_meta[] = {{"__gc", warmbox_flock_gc},
                                              {"__close", warmbox_flock_gc},
                                              {"__tostring", warmbox_flock_tostring},
                                              {"__index", NULL},
                                              {NULL, NULL}};

/* ---------- warmbox.LockWatch: a waiter's wake-up (inotify) ----------
 *
 * core.lock_watch() -> watch | nil, msg, "IO". w:add(path) -> true | nil,
 * msg, code (watches the file for IN_ATTRIB: fl:touch(), a removal);
 * w:wait(timeout) -> true when such an event came (drained), false when
 * `timeout` seconds passed; w:attach(epfd) -> true | nil, msg, "IO" adds the
 * watch to an epoll set (the engine's pollfd: a waiter inside a runner's task
 * wakes its poll; libcurl ignores the stray fd, the runner drains it);
 * w:close() (idempotent; leaves that set first). */

#define WARMBOX_WATCH_MT "warmbox.LockWatch"

typedef struct {
  int fd;   /* -1 when closed */
  int epfd; /* the epoll set it was attached to, or -1 */
} warmbox_watch;

static warmbox_watch *warmbox_watch_check(lua_State *L) {
  warmbox_watch *w = (warmbox_watch *)luaL_checkudata(L, 1, WARMBOX_WATCH_MT);
  if (w->fd < 0) luaL_error(L, "attempt to use a closed " WARMBOX_WATCH_MT);
  return w;
}

static int warmbox_watch_new(lua_State *L) {
  warmbox_watch *w = (warmbox_watch *)lua_newuserdatauv(L, sizeof *w, 0);
  w->fd = -1;
  w->epfd = -1;
  luaL_setmetatable(L, WARMBOX_WATCH_MT);
  w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (w->fd < 0) return warmbox_flock_fail(L, "inotify_init1", errno);
  return 1;
}

static int warmbox_watch_add(lua_State *L) {
  warmbox_watch *w = warmbox_watch_check(L);
  const char *path = luaL_checkstring(L, 2);
  if (inotify_add_watch(w->fd, path, IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF) < 0)
    return warmbox_flock_fail(L, "inotify_add_watch", errno);
  lua_pushboolean(L, 1);
  return 1;
}

/* Reads every queued event; true when there was one. */
static int warmbox_watch_drain(int fd) {
  char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
  int got = 0;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      got = 1;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return got;
  }
}

static int warmbox_watch_wait(lua_State *L) {
  warmbox_watch *w = warmbox_watch_check(L);
  double timeout = luaL_checknumber(L, 2);
  double deadline = warmbox_clock_now() + (timeout > 0 ? timeout : 0);
  int got = warmbox_watch_drain(w->fd); /* one that came meanwhile counts */
  while (!got) {
    struct pollfd p = {w->fd, POLLIN, 0};
    double left = deadline - warmbox_clock_now();
    int r;
    if (left <= 0) break;
    r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno != EINTR) return warmbox_flock_fail(L, "poll", errno);
    if (r > 0) got = warmbox_watch_drain(w->fd);
  }
  lua_pushboolean(L, got);
  return 1;
}

static int warmbox_watch_attach(lua_State *L) {
  warmbox_watch *w = warmbox_watch_check(L);
  int epfd = (int)luaL_checkinteger(L, 2);
  struct epoll_event ev;
  if (w->epfd == epfd) {
    lua_pushboolean(L, 1);
    return 1;
  }
  luaL_argcheck(L, w->epfd < 0, 2, "already attached to another set");
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  ev.data.fd = w->fd;
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, w->fd, &ev) != 0) return warmbox_flock_fail(L, "epoll_ctl", errno);
  w->epfd = epfd;
  lua_pushboolean(L, 1);
  return 1;
}

static int warmbox_watch_close(lua_State *L) {
  warmbox_watch *w = (warmbox_watch *)luaL_checkudata(L, 1, WARMBOX_WATCH_MT);
  /* out of the epoll set before the fd number can be reused */
  if (w->fd >= 0 && w->epfd >= 0) epoll_ctl(w->epfd, EPOLL_CTL_DEL, w->fd, NULL);
  w->epfd = -1;
  if (w->fd >= 0) close(w->fd);
  w->fd = -1;
  return 0;
}

static const luaL_Reg warmbox_watch_methods[] = {{"add", warmbox_watch_add},
                                                 {"wait", warmbox_watch_wait},
                                                 {"attach", warmbox_watch_attach},
                                                 {"close", warmbox_watch_close},
                                                 {NULL, NULL}};

static const luaL_Reg warmbox_watch_meta[] = {
  {"__gc", warmbox_watch_close}, {"__close", warmbox_watch_close}, {"__index", NULL}, {NULL, NULL}};

/* ---------- module helpers ---------- */

static int warmbox_lock_getpid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

static int warmbox_lock_geteuid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)geteuid());
  return 1;
}

void warmbox_lock_register(lua_State *L) {
  if (luaL_newmetatable(L, WARMBOX_FLOCK_MT)) {
    luaL_setfuncs(L, warmbox_flock_meta, 0);
    luaL_newlib(L, warmbox_flock_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, WARMBOX_WATCH_MT)) {
    luaL_setfuncs(L, warmbox_watch_meta, 0);
    luaL_newlib(L, warmbox_watch_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, warmbox_watch_new);
  lua_setfield(L, -2, "lock_watch");
  lua_pushcfunction(L, warmbox_flock_open);
  lua_setfield(L, -2, "flock_open");
  lua_pushcfunction(L, warmbox_lock_getpid);
  lua_setfield(L, -2, "getpid");
  lua_pushcfunction(L, warmbox_private_dir);
  lua_setfield(L, -2, "private_dir");
  lua_pushcfunction(L, warmbox_lock_geteuid);
  lua_setfield(L, -2, "geteuid");
}
