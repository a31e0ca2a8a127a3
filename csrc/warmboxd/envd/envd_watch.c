/*
 * envd_watch.c: envd's directory watchers (see envd.h), as E2B's envd
 * serves them on fsnotify: WatchDir streams {"start":{}}, then one
 * {"filesystem":{"name","type"[,"entry"]}} per event and {"keepalive":{}}
 * at the client's Keepalive-Ping-Interval, until Connect-Timeout-Ms ends it
 * (deadline_exceeded), the client leaves, or the sandbox stops running
 * (dropped). CreateWatcher queues the same events for GetWatcherEvents.
 *
 * Names are relative to the watched directory ("sub/file.txt"); the types
 * are fsnotify's: CREATE (IN_CREATE, IN_MOVED_TO), RENAME (IN_MOVED_FROM,
 * IN_MOVE_SELF), CHMOD (IN_ATTRIB), WRITE (IN_MODIFY), REMOVE (IN_DELETE,
 * IN_DELETE_SELF). A recursive watch adds every directory below, and each
 * one created or moved in later.
 *
 * Directories are opened beneath the watched one (envd_fs.c's openat2) and
 * watched through /proc/self/fd/N, so a symlink swapped in by the sandbox
 * never makes warmboxd watch a host directory.
 *
 * Every watcher of every sandbox shares one inotify instance (the kernel
 * allows a uid 128 of them, host-wide): a reader thread reads it and copies
 * each event to the queue of every watcher holding its watch descriptor
 * (two watchers of one directory share it: counted references), bounded by
 * WATCH_QUEUE_MAX bytes per watcher (then the watcher has overflowed, as
 * inotify's own queue would), and wakes the watcher's eventfd.
 */
#include "envd.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WATCH_MASK                                                                                               \
  (IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_ATTRIB | IN_MODIFY | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | \
   IN_ONLYDIR)
#define WALK_MAX_DEPTH  256
#define WATCH_QUEUE_MAX (1 << 20)

struct wd_ent {
  int wd;
  char *rel; /* "" for the watched directory itself */
};

struct watcher {
  struct watcher *next;
  char sbid[32];
  char id[24]; /* "w" + 20 random characters; polled watchers only */
  int stream;
  int wake;             /* eventfd: events queued, or the sandbox stopped running */
  int gone;             /* the sandbox stopped running (under mu) */
  struct wbd_buf queue; /* raw inotify events for this watcher (under mu) */
  int overflow;         /* the queue was full: events were lost (under mu) */
  int recursive, include_entry;
  struct wbd_fspath base; /* root: the watched directory (O_PATH); jail: its path */
  struct wd_ent *wds;
  size_t nwds, cap;
  char error_code[24]; /* a terminal error, "" while fine */
  char error_msg[256];
};

/* mu guards the registry, every watcher's wds, queue and flags, and the
 * shared instance's references. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct watcher *watchers;
static struct watcher *g_pending; /* being made: not yet counted or found, but fed events */
static pthread_once_t hook_once = PTHREAD_ONCE_INIT;
static int g_ifd = -1; /* the shared inotify instance, -1 when it cannot be made */
static int g_ifd_errno;

/* Watch descriptors of the shared instance and how many watchers hold each. */
struct wd_ref {
  int wd, refs;
};
static struct wd_ref *g_refs;
static size_t g_nrefs, g_caprefs;

/* Connect replies and requests: rpc.c's. */
static int user_ok(struct wbd_req *req) {
  char name[64];
  return wbd_rpc_user(req, name, sizeof name) == 0;
}

static int jbool(json_t *o, const char *camel, const char *snake) {
  json_t *v = json_object_get(o, camel);
  if (!v) v = json_object_get(o, snake);
  return json_is_true(v);
}

static const char *jstr(json_t *o, const char *camel, const char *snake) {
  json_t *v = json_object_get(o, camel);
  if (!v && snake) v = json_object_get(o, snake);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

/* ------------------------------------------------------------------ */
/* Watchers                                                            */
/* ------------------------------------------------------------------ */

static struct wd_ref *ref_find(int wd) {
  for (size_t i = 0; i < g_nrefs; i++)
    if (g_refs[i].wd == wd) return &g_refs[i];
  return NULL;
}

static void ref_take(int wd) {
  struct wd_ref *r = ref_find(wd);
  if (r) {
    r->refs++;
    return;
  }
  if (g_nrefs == g_caprefs) {
    size_t nc = g_caprefs ? g_caprefs * 2 : 64;
    struct wd_ref *nv = realloc(g_refs, nc * sizeof *nv);
    if (!nv) abort();
    g_refs = nv;
    g_caprefs = nc;
  }
  g_refs[g_nrefs].wd = wd;
  g_refs[g_nrefs++].refs = 1;
}

/* The watcher no longer holds wd; the last holder removes the kernel watch
 * (rm_watch 0) or knows it is gone already (the directory went). */
static void ref_drop(int wd, int rm_watch) {
  struct wd_ref *r = ref_find(wd);
  if (!r || --r->refs > 0) return;
  if (rm_watch) inotify_rm_watch(g_ifd, wd);
  *r = g_refs[--g_nrefs];
}

/* Under mu (a watcher being made holds it too). */
static void watcher_free(struct watcher *w) {
  if (w->wake >= 0) close(w->wake);
  wbd_fs_release(&w->base);
  for (size_t i = 0; i < w->nwds; i++) {
    ref_drop(w->wds[i].wd, 1);
    free(w->wds[i].rel);
  }
  free(w->wds);
  wbd_buf_free(&w->queue);
  free(w);
}

/* Called by the store (its lock held) when a sandbox stops running. */
static void on_leave(struct wbd_sandbox *sb) {
  pthread_mutex_lock(&mu);
  for (struct watcher **pp = &watchers; *pp;) {
    struct watcher *w = *pp;
    if (strcmp(w->sbid, sb->id) != 0) {
      pp = &w->next;
      continue;
    }
    if (w->stream) { /* its thread frees it */
      w->gone = 1;
      uint64_t one = 1;
      if (write(w->wake, &one, sizeof one) < 0) { /* the counter cannot overflow here */
      }
      pp = &w->next;
    } else {
      *pp = w->next;
      watcher_free(w);
    }
  }
  pthread_mutex_unlock(&mu);
}

static const char *wd_rel(struct watcher *w, int wd);

/* Copies one event to every watcher holding its wd (all of them on an
 * overflow of the shared queue). Under mu. */
static void dispatch_to(struct watcher *list, const struct inotify_event *ev) {
  size_t sz = sizeof *ev + ev->len;
  for (struct watcher *w = list; w; w = w->next) {
    if (!(ev->mask & IN_Q_OVERFLOW) && !wd_rel(w, ev->wd)) continue;
    if ((ev->mask & IN_Q_OVERFLOW) || w->queue.len - w->queue.off + sz > WATCH_QUEUE_MAX)
      w->overflow = 1;
    else if (wbd_buf_add(&w->queue, ev, sz) != 0)
      abort();
    uint64_t one = 1;
    if (write(w->wake, &one, sizeof one) < 0) { /* the counter cannot overflow here */
    }
  }
}

static void dispatch(const struct inotify_event *ev) {
  dispatch_to(watchers, ev);
  dispatch_to(g_pending, ev);
  /* The directory went: its wd is no more, whoever still lists it. */
  if (ev->mask & IN_IGNORED) {
    struct wd_ref *r = ref_find(ev->wd);
    if (r) *r = g_refs[--g_nrefs];
  }
}

static void *reader(void *arg) {
  (void)arg;
  char buf[65536] __attribute__((aligned(__alignof__(struct inotify_event))));
  for (;;) {
    ssize_t n = read(g_ifd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      struct pollfd pf = {.fd = g_ifd, .events = POLLIN};
      poll(&pf, 1, -1);
      continue;
    }
    pthread_mutex_lock(&mu);
    for (char *p = buf; p < buf + n;) {
      const struct inotify_event *ev = (const struct inotify_event *)(void *)p;
      p += sizeof *ev + ev->len;
      dispatch(ev);
    }
    pthread_mutex_unlock(&mu);
  }
  return NULL;
}

static void set_hook(void) {
  wbd_store_set_leave_hook(on_leave);
  g_ifd = inotify_init1(IN_CLOEXEC);
  g_ifd_errno = errno;
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  if (g_ifd >= 0 && pthread_create(&t, &a, reader, NULL) != 0) {
    g_ifd_errno = errno;
    close(g_ifd);
    g_ifd = -1;
  }
  pthread_attr_destroy(&a);
}

static void set_error(struct watcher *w, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_error(struct watcher *w, const char *code, const char *fmt, ...) {
  if (w->error_code[0]) return;
  snprintf(w->error_code, sizeof w->error_code, "%s", code);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->error_msg, sizeof w->error_msg, fmt, ap);
  va_end(ap);
}

static const char *wd_rel(struct watcher *w, int wd) {
  for (size_t i = 0; i < w->nwds; i++)
    if (w->wds[i].wd == wd) return w->wds[i].rel;
  return NULL;
}

static void wd_forget(struct watcher *w, int wd) {
  for (size_t i = 0; i < w->nwds; i++)
    if (w->wds[i].wd == wd) {
      ref_drop(wd, 0);
      free(w->wds[i].rel);
      w->wds[i] = w->wds[--w->nwds];
      return;
    }
}

/* Directories the sandbox's watchers hold, w's included. Under mu. */
static size_t sandbox_dirs(const struct watcher *w) {
  size_t n = w->nwds;
  for (const struct watcher *o = watchers; o; o = o->next)
    if (o != w && strcmp(o->sbid, w->sbid) == 0) n += o->nwds;
  return n;
}

/* Watches the open directory `fd` (relative path `rel`); with `recursive`,
 * every directory below too. 0, or -errno (-EDQUOT: over the watcher's or
 * the sandbox's limit; -ENOSPC: the host's). Under mu. */
static int watch_tree(struct watcher *w, int fd, const char *rel, int depth) {
  if (w->nwds >= WBD_WATCH_MAX_DIRS || sandbox_dirs(w) >= WBD_WATCH_SANDBOX_DIRS) return -EDQUOT;
  char proc[64];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
  int wd = inotify_add_watch(g_ifd, proc, WATCH_MASK);
  if (wd < 0) return -errno;
  if (!wd_rel(w, wd)) { /* the same directory again (a move): keep its first name */
    ref_take(wd);
    if (w->nwds == w->cap) {
      size_t nc = w->cap ? w->cap * 2 : 16;
      struct wd_ent *nv = realloc(w->wds, nc * sizeof *nv);
      if (!nv) abort();
      w->wds = nv;
      w->cap = nc;
    }
    w->wds[w->nwds].wd = wd;
    w->wds[w->nwds].rel = strdup(rel);
    if (!w->wds[w->nwds].rel) abort();
    w->nwds++;
  }
  if (!w->recursive || depth >= WALK_MAX_DEPTH) return 0;
  int rc = 0;
  DIR *d = wbd_fs_dir(fd, 1, &rc);
  if (!d) return rc;
  struct dirent *de;
  while (rc == 0 && (de = wbd_fs_next(d)) != NULL) {
    if (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) continue;
    int sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) continue; /* not a directory, or gone meanwhile */
    char child[PATH_MAX];
    int n = snprintf(child, sizeof child, "%s%s%s", rel, *rel ? "/" : "", de->d_name);
    if (n > 0 && (size_t)n < sizeof child) rc = watch_tree(w, sub, child, depth + 1);
    close(sub);
  }
  closedir(d);
  return rc;
}

#define STR_(x) #x
#define STR(x)  STR_(x)
static const char *limit_msg(int rc) {
  if (rc == -ENOSPC) return "the host's inotify watch limit is reached";
  return "more than " STR(WBD_WATCH_MAX_DIRS) " directories to watch for one watcher, or " STR(
    WBD_WATCH_SANDBOX_DIRS) " for all of a sandbox's watchers";
}

/* A directory created or moved in below a recursive watch. */
static void watch_new_dir(struct watcher *w, struct wbd_sandbox *sb, const char *rel) {
  w->base.sb = sb;
  int fd = wbd_fs_open(&w->base, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
  if (fd < 0) return; /* gone again, or replaced by something else */
  int rc = watch_tree(w, fd, rel, 1);
  close(fd);
  if (rc == -EDQUOT || rc == -ENOSPC) set_error(w, "resource_exhausted", "watcher error: %s", limit_msg(rc));
}

static json_t *event_json(struct watcher *w, struct wbd_sandbox *sb, const char *name, const char *type) {
  json_t *ev = json_object();
  json_object_set_new(ev, "name", wbd_json_str(name));
  json_object_set_new(ev, "type", json_string(type));
  /* As envd: entry info only where the path should still exist, best effort. */
  if (w->include_entry && strcmp(type, "EVENT_TYPE_REMOVE") != 0 && strcmp(type, "EVENT_TYPE_RENAME") != 0) {
    char jail[3 * PATH_MAX];
    int n = snprintf(jail, sizeof jail, "%s/%s", w->base.jail, name);
    struct wbd_fspath p;
    p.root = -1;
    if (n > 0 && (size_t)n < sizeof jail && wbd_fs_resolve(sb, jail, &p) == 0) {
      json_t *e = wbd_fs_entry(&p);
      if (e) json_object_set_new(ev, "entry", e);
    }
    wbd_fs_release(&p);
  }
  return ev;
}

/* Takes the events queued for the watcher (never blocks) and appends
 * FilesystemEvents to `out`; sets the watcher's error on overflow. Under mu. */
static void drain(struct watcher *w, struct wbd_sandbox *sb, json_t *out) {
  struct wbd_buf q = w->queue; /* what the reader queued so far; it waits for mu */
  memset(&w->queue, 0, sizeof w->queue);
  if (w->overflow) set_error(w, "internal", "watcher error: fsnotify: queue or buffer overflow");
  for (char *p = q.data + q.off; p < q.data + q.len;) {
    const struct inotify_event *ev = (const struct inotify_event *)(void *)p;
    p += sizeof *ev + ev->len;
    const char *rel = wd_rel(w, ev->wd);
    if (!rel) continue;
    if (ev->mask & IN_IGNORED) {
      wd_forget(w, ev->wd);
      continue;
    }
    char name[2 * PATH_MAX];
    if (ev->len && ev->name[0])
      snprintf(name, sizeof name, "%s%s%s", rel, *rel ? "/" : "", ev->name);
    else if (!*rel)
      snprintf(name, sizeof name, "."); /* the watched directory itself */
    else
      continue; /* a subdirectory's own event: its parent reported it */
    static const struct {
      uint32_t mask;
      const char *type;
    } ops[] = {
      {IN_CREATE | IN_MOVED_TO, "EVENT_TYPE_CREATE"},
      {IN_MOVED_FROM | IN_MOVE_SELF, "EVENT_TYPE_RENAME"},
      {IN_ATTRIB, "EVENT_TYPE_CHMOD"},
      {IN_MODIFY, "EVENT_TYPE_WRITE"},
      {IN_DELETE | IN_DELETE_SELF, "EVENT_TYPE_REMOVE"},
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
      if (ev->mask & ops[i].mask) json_array_append_new(out, event_json(w, sb, name, ops[i].type));
    if (w->recursive && (ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO)) && strcmp(name, ".") != 0)
      watch_new_dir(w, sb, name);
  }
  wbd_buf_free(&q);
}

static void unlink_from(struct watcher **head, struct watcher *w) {
  for (struct watcher **pp = head; *pp; pp = &(*pp)->next)
    if (*pp == w) {
      *pp = w->next;
      return;
    }
}

/* Frees a watcher that is not registered (pending: still on g_pending). */
static void watcher_discard(struct watcher *w, int pending) {
  pthread_mutex_lock(&mu);
  if (pending) unlink_from(&g_pending, w);
  watcher_free(w);
  pthread_mutex_unlock(&mu);
}

static struct watcher *watcher_alloc(struct wbd_sandbox *sb, json_t *in, int stream, const struct wbd_fspath *p) {
  struct watcher *w = calloc(1, sizeof *w);
  if (!w) abort();
  w->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  w->stream = stream;
  w->recursive = jbool(in, "recursive", "recursive");
  w->include_entry = jbool(in, "includeEntry", "include_entry");
  snprintf(w->sbid, sizeof w->sbid, "%s", sb->id);
  w->base.sb = sb;
  w->base.root = -1;
  snprintf(w->base.jail, sizeof w->base.jail, "%s", p->jail);
  snprintf(w->base.rel, sizeof w->base.rel, ".");
  w->base.uid = p->uid;
  w->base.gid = p->gid;
  return w;
}

/* A new watcher on `path`, registered for sb; NULL with the reply sent. */
static struct watcher *watcher_new(struct wbd_req *req, struct wbd_sandbox *sb, json_t *in, int stream,
                                   enum MHD_Result *r) {
  enum MHD_Result (*fail)(struct wbd_req *, const char *, const char *, ...) =
    stream ? wbd_envd_stream_error : wbd_rpc_error;
  const char *path = jstr(in, "path", NULL);
  if (!path) path = "";
  struct wbd_fspath p;
  int rc = wbd_fs_resolve(sb, path, &p);
  int fd = rc < 0 ? rc : wbd_fs_open(&p, p.rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) != 0) {
    rc = -errno;
    close(fd);
    fd = rc;
  }
  if (fd >= 0 && !S_ISDIR(st.st_mode)) {
    close(fd);
    *r = fail(req, "invalid_argument", "path %s not a directory", p.jail);
    wbd_fs_release(&p);
    return NULL;
  }
  if (fd < 0) {
    const char *shown = p.jail[0] ? p.jail : path;
    if (fd == -ENOENT)
      *r = fail(req, "not_found", "path %s not found", shown);
    else if (fd == -ENOTDIR)
      *r = fail(req, "invalid_argument", "path %s not a directory", shown);
    else if (fd == -EACCES || fd == -EPERM)
      *r = fail(req, "permission_denied", "'%s': %s", shown, wbd_fs_strerror(fd));
    else
      *r = fail(req, "internal", "error statting path %s: %s", shown, wbd_fs_strerror(fd));
    wbd_fs_release(&p);
    return NULL;
  }
  struct watcher *w = watcher_alloc(sb, in, stream, &p);
  wbd_fs_release(&p);
  pthread_once(&hook_once, set_hook);
  if (g_ifd < 0 || w->wake < 0) {
    int e = g_ifd < 0 ? g_ifd_errno : errno;
    close(fd);
    watcher_discard(w, 0);
    *r = fail(req, "internal", "error creating watcher: %s", strerror(e));
    return NULL;
  }
  w->base.root = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  /* Pending while its directories are added: the reader queues their events. */
  pthread_mutex_lock(&mu);
  w->next = g_pending;
  g_pending = w;
  rc = w->base.root < 0 ? -errno : watch_tree(w, fd, "", 0);
  pthread_mutex_unlock(&mu);
  close(fd);
  if (rc < 0) {
    if (rc == -EDQUOT || rc == -ENOSPC)
      *r = fail(req, "resource_exhausted", "cannot watch %s: %s", w->base.jail, limit_msg(rc));
    else
      *r = fail(req, "internal", "error adding path %s to watcher: %s", w->base.jail, strerror(-rc));
    watcher_discard(w, 1);
    return NULL;
  }
  /* Registered only while the sandbox runs; the count is per sandbox. The
   * store lock comes first, as when the store calls on_leave. */
  static const char alnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  w->id[0] = 'w';
  wbd_random_chars(w->id + 1, 20, alnum, 36);
  wbd_store_lock();
  int running = sb->state == WBD_RUNNING, count = 0;
  pthread_mutex_lock(&mu);
  unlink_from(&g_pending, w);
  for (struct watcher *o = watchers; o; o = o->next) count += strcmp(o->sbid, sb->id) == 0;
  if (running && count < WBD_WATCH_MAX) {
    w->next = watchers;
    watchers = w;
  }
  pthread_mutex_unlock(&mu);
  wbd_store_unlock();
  if (!running || count >= WBD_WATCH_MAX) {
    watcher_discard(w, 0);
    *r = !running ? fail(req, "unavailable", "the sandbox is not running")
                  : fail(req, "resource_exhausted", "too many watchers in this sandbox (at most %d)", WBD_WATCH_MAX);
    return NULL;
  }
  return w;
}

/* ------------------------------------------------------------------ */
/* WatchDir: the stream                                                */
/* ------------------------------------------------------------------ */

enum {
  WS_START = WBD_STREAM_START,
  WS_RUNNING = WBD_STREAM_RUNNING,
  WS_DONE = WBD_STREAM_DONE,
  WS_ABORT = WBD_STREAM_ABORT
};

struct wstream {
  struct watcher *w;
  struct wbd_sandbox *sb; /* our own reference */
  struct MHD_Connection *conn;
  int phase;
  int64_t deadline_us, keepalive_us, last_sent_us;
  struct wbd_buf buf;
};

static int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void ws_end(struct wstream *ws, const char *code, const char *msg) {
  json_t *e = json_object();
  json_object_set_new(e, "code", json_string(code));
  json_object_set_new(e, "message", wbd_json_str(msg));
  wbd_connect_frame(&ws->buf, 0x02, json_pack("{s:o}", "error", e));
  ws->phase = WS_DONE;
}

/* The next envelope(s) into ws->buf (or the stream's end): 0; or, with
 * nothing yet, the milliseconds to wait (*wait_fds: the descriptors that end
 * the wait). Never blocks. */
static int ws_step(void *cls, int wait_fds[2]) {
  struct wstream *ws = cls;
  struct watcher *w = ws->w;
  if (ws->phase == WS_START) {
    wbd_connect_frame(&ws->buf, 0, json_pack("{s:{}}", "start"));
    ws->phase = WS_RUNNING;
    ws->last_sent_us = mono_us();
    return 0;
  }
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(ws->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  struct pollfd fds[2] = {
    {.fd = w->wake, .events = POLLIN},
    {.fd = ci ? ci->connect_fd : -1, .events = POLLRDHUP},
  };
  for (;;) {
    pthread_mutex_lock(&mu);
    int gone = w->gone;
    pthread_mutex_unlock(&mu);
    if (gone) { /* as a VM going away: no end, no trailer */
      ws->phase = WS_ABORT;
      return 0;
    }
    int64_t now = mono_us(), wait_us = 1000000;
    if (ws->deadline_us) {
      if (now >= ws->deadline_us) {
        ws_end(ws, "deadline_exceeded", "context deadline exceeded");
        return 0;
      }
      if (ws->deadline_us - now < wait_us) wait_us = ws->deadline_us - now;
    }
    int64_t due = ws->last_sent_us + ws->keepalive_us;
    if (now >= due) {
      wbd_connect_frame(&ws->buf, 0, json_pack("{s:{}}", "keepalive"));
      ws->last_sent_us = now;
      return 0;
    }
    if (due - now < wait_us) wait_us = due - now;
    int n = poll(fds, 2, 0);
    if (n < 0 && errno != EINTR) {
      ws->phase = WS_ABORT;
      return 0;
    }
    if (n <= 0) {
      wait_fds[0] = fds[0].fd;
      wait_fds[1] = fds[1].fd;
      return (int)((wait_us + 999) / 1000);
    }
    if (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
      ws->phase = WS_ABORT; /* the client went away */
      return 0;
    }
    if (fds[0].revents) { /* events queued, or `gone` (seen at the top) */
      uint64_t cnt;
      if (read(w->wake, &cnt, sizeof cnt) < 0) { /* EAGAIN: already read */
      }
      json_t *evs = json_array();
      pthread_mutex_lock(&mu);
      drain(w, ws->sb, evs);
      pthread_mutex_unlock(&mu);
      size_t i;
      json_t *ev;
      json_array_foreach(evs, i, ev) wbd_connect_frame(&ws->buf, 0, json_pack("{s:O}", "filesystem", ev));
      json_decref(evs);
      if (w->error_code[0]) {
        ws_end(ws, w->error_code, w->error_msg);
        return 0;
      }
      if (ws->buf.len > ws->buf.off) {
        ws->last_sent_us = mono_us();
        return 0;
      }
    }
  }
}

static ssize_t ws_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct wstream *ws = cls;
  (void)pos;
  return wbd_rpc_stream_read(ws->conn, &ws->buf, &ws->phase, ws_step, ws, out, max);
}

static void ws_done(void *cls) {
  struct wstream *ws = cls;
  pthread_mutex_lock(&mu);
  unlink_from(&watchers, ws->w);
  watcher_free(ws->w);
  pthread_mutex_unlock(&mu);
  wbd_sandbox_unref(ws->sb);
  wbd_buf_free(&ws->buf);
  free(ws);
}

static enum MHD_Result watch_dir(struct wbd_req *req, struct wbd_sandbox *sb) {
  if (strcmp(req->method, "POST") != 0) return wbd_reply_error(req, 405, "method not allowed");
  if (!wbd_content_type_is(req, "application/connect+json"))
    return wbd_reply_error(req, 415, "filesystem.Filesystem/WatchDir is a streaming RPC: use application/connect+json");
  if (!user_ok(req)) return wbd_envd_stream_error(req, "unauthenticated", "invalid username");
  size_t len = 0;
  switch (wbd_connect_envelope(req->body, req->body_len, &len)) {
    case WBD_ENV_OK:
      break;
    case WBD_ENV_SHORT:
      return wbd_envd_stream_error(req, "invalid_argument", "missing request envelope");
    case WBD_ENV_COMPRESSED:
      return wbd_envd_stream_error(req, "internal", "compressed envelopes are not supported");
    default:
      return wbd_envd_stream_error(req, "invalid_argument", "request envelope length %zu does not match the body", len);
  }
  json_error_t jerr;
  json_t *in = json_loadb(req->body + 5, len, 0, &jerr);
  if (!json_is_object(in)) {
    json_decref(in);
    return wbd_envd_stream_error(req, "invalid_argument", "the request is not a JSON object");
  }
  enum MHD_Result r = MHD_NO;
  struct watcher *w = watcher_new(req, sb, in, 1, &r);
  json_decref(in);
  if (!w) return r;
  struct wstream *ws = calloc(1, sizeof *ws);
  if (!ws) abort();
  wbd_store_lock();
  sb->refcount++; /* the stream outlives this handler */
  wbd_store_unlock();
  ws->w = w;
  ws->sb = sb;
  ws->conn = req->conn;
  ws->phase = WS_START;
  int64_t timeout_ms = wbd_rpc_header_num(req, "Connect-Timeout-Ms", (int64_t)1 << 40);
  if (timeout_ms > 0) ws->deadline_us = mono_us() + timeout_ms * 1000;
  int64_t ka = wbd_rpc_header_num(req, "Keepalive-Ping-Interval", 86400);
  ws->keepalive_us = (ka > 0 ? ka : 50) * 1000000;
  return wbd_reply_stream(req, 200, "application/connect+json", ws_read, ws, ws_done, NULL);
}

/* ------------------------------------------------------------------ */
/* CreateWatcher / GetWatcherEvents / RemoveWatcher                    */
/* ------------------------------------------------------------------ */

static enum MHD_Result polled(struct wbd_req *req, struct wbd_sandbox *sb, const char *method) {
  if (strcmp(req->method, "POST") != 0) return wbd_reply_error(req, 405, "method not allowed");
  if (!wbd_content_type_is(req, "application/json"))
    return wbd_reply_error(req, 415, "unsupported content type: envd's RPCs speak application/json here");
  if (!user_ok(req)) return wbd_rpc_error(req, "unauthenticated", "invalid username");
  json_error_t jerr;
  json_t *in = req->body_len ? json_loadb(req->body, req->body_len, 0, &jerr) : json_object();
  if (!json_is_object(in)) {
    json_decref(in);
    return wbd_rpc_error(req, "invalid_argument", "request body is not a JSON object");
  }
  enum MHD_Result r = MHD_NO;
  if (strcmp(method, "CreateWatcher") == 0) {
    struct watcher *w = watcher_new(req, sb, in, 0, &r);
    if (w) r = wbd_reply_json(req, 200, json_pack("{s:s}", "watcherId", w->id), NULL);
    json_decref(in);
    return r;
  }
  const char *id = jstr(in, "watcherId", "watcher_id");
  char shown[64];
  snprintf(shown, sizeof shown, "%s", id ? id : "");
  json_t *events = NULL;
  char code[24] = "", msg[256] = "";
  int found = 0;
  pthread_mutex_lock(&mu);
  for (struct watcher **pp = &watchers; *pp && !found; pp = &(*pp)->next) {
    struct watcher *w = *pp;
    if (w->stream || !id || strcmp(w->id, id) != 0 || strcmp(w->sbid, sb->id) != 0) continue;
    found = 1;
    if (strcmp(method, "RemoveWatcher") == 0) {
      *pp = w->next;
      watcher_free(w);
      break;
    }
    events = json_array();
    drain(w, sb, events);
    if (w->error_code[0]) { /* as envd: the error, every time it is asked */
      snprintf(code, sizeof code, "%s", w->error_code);
      snprintf(msg, sizeof msg, "%s", w->error_msg);
    }
  }
  pthread_mutex_unlock(&mu);
  json_decref(in);
  if (!found) {
    json_decref(events);
    return wbd_rpc_error(req, "not_found", "watcher with id %s not found", shown);
  }
  if (code[0]) {
    json_decref(events);
    return wbd_rpc_error(req, code, "%s", msg);
  }
  if (!events) return wbd_reply_json(req, 200, json_object(), NULL);
  json_t *res = json_object();
  if (json_array_size(events))
    json_object_set_new(res, "events", events);
  else
    json_decref(events);
  return wbd_reply_json(req, 200, res, NULL);
}

int wbd_envd_watch_route(struct wbd_req *req, struct wbd_sandbox *sb, enum MHD_Result *r) {
  static const char pre[] = "/filesystem.Filesystem/";
  if (strncmp(req->path, pre, sizeof pre - 1) != 0) return 0;
  const char *m = req->path + sizeof pre - 1;
  if (strcmp(m, "WatchDir") == 0) {
    *r = watch_dir(req, sb);
    return 1;
  }
  if (strcmp(m, "CreateWatcher") == 0 || strcmp(m, "GetWatcherEvents") == 0 || strcmp(m, "RemoveWatcher") == 0) {
    *r = polled(req, sb, m);
    return 1;
  }
  return 0;
}
