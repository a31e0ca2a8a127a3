/* engine.c: warmbox.Engine, many transfers in flight at once behind ONE
 * pollable file descriptor (docs/core.md, "The engine").
 *
 * libcurl's multi interface in its event-driven form: curl_multi_socket_action
 * with a socket callback (each socket libcurl wants watched goes into an epoll
 * set) and a timer callback (libcurl's next timeout arms a timerfd that sits in
 * the same epoll set). So the epoll fd is readable exactly when the engine has
 * work: a socket event, libcurl's timeout, or a retry whose wait is over (a
 * retry waits on the same timerfd; nothing here sleeps). A host loop watches
 * eng:pollfd() and calls eng:step(0) when it is readable or eng:timeout() has
 * passed, as with cqueues' :pollfd()/:events()/:timeout().
 *
 * Each transfer (warmbox.Transfer) is a request set up by http.c exactly as
 * h:request sets it up (warmbox_http.h), on the client's connection pool.
 * Nothing here calls Lua while libcurl is on the C stack: bodies and stream
 * frames are collected in C buffers and turned into Lua values by tr:frames()
 * and tr:result(); an engine transfer has no on_chunk callback.
 *
 * References: a transfer holds its engine and its client (user values), so
 * neither is collected under it; the engine finds a transfer's Lua object
 * through a weak table (its user value), so a transfer nobody holds any more
 * is collected, and its __gc aborts it. Finalizers may run in any order within
 * one cycle: whichever of engine and transfer goes first leaves the other
 * consistent (memory of objects finalized in a cycle is freed later). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include <curl/curl.h>
#include "warmbox_core.h"
#include "warmbox_clock.h"
#include "warmbox_buf.h"
#include "warmbox_http.h"

#define ENGINE_MT               "warmbox.Engine"
#define TRANSFER_MT             "warmbox.Transfer"
#define ENGINE_MAX_EVENTS       64
#define ENGINE_DEFAULT_BUFFERED ((size_t)1024 * 1024)

enum { TR_WAITING = 0, TR_RUNNING = 1, TR_DONE = 2 };
enum { TR_OK = 0, TR_CANCELLED = 1, TR_ENGINE_CLOSED = 2, TR_SETUP_FAILED = 3, TR_ADD_FAILED = 4, TR_OOM = 5 };

typedef struct engine engine;

typedef struct transfer {
  engine *eng;        /* valid while this object lives (a user value holds it) */
  warmbox_xfer *x;    /* NULL once tr:result() has built the result */
  int state;          /* TR_WAITING (for its first try or a retry), TR_RUNNING, TR_DONE */
  int why;            /* TR_OK or how it ended other than by its response */
  int paused;         /* CURL_WRITEFUNC_PAUSE returned: too many unread frames */
  int news;           /* on the engine's news list */
  int live;           /* on the engine's live list */
  double not_before;  /* TR_WAITING: when the next attempt may start */
  warmbox_buf frames; /* unread frames, each [u32 len][u8 flags][bytes] */
  size_t nframes;
  struct transfer *prev, *next; /* live list: not done */
  struct transfer *next_news;
} transfer;

struct engine {
  CURLM *multi;
  int epfd, tfd;
  int closed;
  double curl_deadline; /* libcurl's timeout (monotonic s), < 0 none */
  double armed;         /* what the timerfd is armed for, < 0 disarmed */
  size_t max_buffered;  /* unread frame bytes per transfer before pausing it */
  long pending;         /* transfers not done */
  long waiting;         /* transfers in TR_WAITING (the deadline scan skips when 0) */
  transfer *live;
  transfer *news, *news_tail;
};

/* ======================================================================
 * Plain C: lists, timer, libcurl callbacks (no Lua below this line until
 * the Lua-facing part)
 * ====================================================================== */

static void set_state(transfer *t, int state) {
  if (t->state == TR_WAITING) t->eng->waiting--;
  if (state == TR_WAITING) t->eng->waiting++;
  t->state = state;
}

static void news_add(transfer *t) {
  engine *e = t->eng;
  if (t->news || e->closed) return;
  t->news = 1;
  t->next_news = NULL;
  if (e->news_tail)
    e->news_tail->next_news = t;
  else
    e->news = t;
  e->news_tail = t;
}

static void news_remove(transfer *t) {
  engine *e = t->eng;
  transfer **p, *prev = NULL;
  if (!t->news) return;
  for (p = &e->news; *p; prev = *p, p = &(*p)->next_news) {
    if (*p == t) {
      *p = t->next_news;
      if (e->news_tail == t) e->news_tail = prev;
      break;
    }
  }
  t->news = 0;
  t->next_news = NULL;
}

static void live_add(transfer *t) {
  engine *e = t->eng;
  t->prev = NULL;
  t->next = e->live;
  if (e->live) e->live->prev = t;
  e->live = t;
  t->live = 1;
  e->pending++;
}

static void live_remove(transfer *t) {
  engine *e = t->eng;
  if (!t->live) return;
  if (t->prev)
    t->prev->next = t->next;
  else
    e->live = t->next;
  if (t->next) t->next->prev = t->prev;
  t->prev = t->next = NULL;
  t->live = 0;
  e->pending--;
}

/* The earliest moment the engine needs a call without fd activity (< 0 none). */
static double engine_deadline(const engine *e) {
  double d = e->curl_deadline;
  const transfer *t;
  if (e->waiting == 0) return d;
  for (t = e->live; t; t = t->next)
    if (t->state == TR_WAITING && (d < 0 || t->not_before < d)) d = t->not_before;
  return d;
}

static void engine_rearm(engine *e) {
  double d = engine_deadline(e);
  struct itimerspec its;
  if (e->closed || d == e->armed) return;
  memset(&its, 0, sizeof its);
  if (d >= 0) {
    /* Absolute monotonic time; one in the past fires at once. Never 0,
     * which would disarm. */
    its.it_value.tv_sec = (time_t)d;
    its.it_value.tv_nsec = (long)((d - (double)its.it_value.tv_sec) * 1e9);
    if (its.it_value.tv_nsec > 999999999L) its.it_value.tv_nsec = 999999999L;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  if (timerfd_settime(e->tfd, TFD_TIMER_ABSTIME, &its, NULL) == 0) e->armed = d;
}

static int engine_socket_cb(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp) {
  engine *e = (engine *)userp;
  struct epoll_event ev;
  (void)easy;
  (void)socketp;
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, s, NULL);
    return 0;
  }
  memset(&ev, 0, sizeof ev);
  ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
  ev.data.fd = s;
  if (epoll_ctl(e->epfd, EPOLL_CTL_MOD, s, &ev) != 0) {
    if (errno != ENOENT || epoll_ctl(e->epfd, EPOLL_CTL_ADD, s, &ev) != 0) return -1;
  }
  return 0;
}

static int engine_timer_cb(CURLM *multi, long timeout_ms, void *userp) {
  engine *e = (engine *)userp;
  (void)multi;
  e->curl_deadline = timeout_ms < 0 ? -1 : warmbox_clock_now() + (double)timeout_ms / 1000.0;
  engine_rearm(e);
  return 0;
}

/* A frame of a streamed 2xx body: queued for tr:frames(). */
static int engine_frame_sink(void *ud, const char *data, size_t len, int flags) {
  transfer *t = (transfer *)ud;
  unsigned char hdr[5];
  if (len > 0xffffffffu) {
    t->why = TR_OOM;
    return 1;
  }
  hdr[0] = (unsigned char)(len >> 24);
  hdr[1] = (unsigned char)(len >> 16);
  hdr[2] = (unsigned char)(len >> 8);
  hdr[3] = (unsigned char)len;
  hdr[4] = (unsigned char)flags;
  if (warmbox_buf_append(&t->frames, hdr, sizeof hdr) || warmbox_buf_append(&t->frames, data, len)) {
    t->why = TR_OOM;
    return 1; /* stops the transfer; delivered frames forbid a retry */
  }
  t->nframes++;
  news_add(t);
  return 0;
}

/* Backpressure: a streamed body whose unread frames exceed the bound is
 * paused (libcurl keeps this chunk and stops reading the socket) until
 * tr:frames() takes them. */
static size_t engine_on_write(char *p, size_t size, size_t n, void *ud) {
  transfer *t = (transfer *)ud;
  if (warmbox_xfer_streaming(t->x) && t->frames.len >= t->eng->max_buffered) {
    t->paused = 1;
    return CURL_WRITEFUNC_PAUSE;
  }
  return warmbox_xfer_write(p, size, n, t->x);
}

/* Starts the next attempt of a waiting transfer. */
static void engine_launch(engine *e, transfer *t) {
  warmbox_xfer_begin(t->x);
  t->paused = 0;
  if (curl_multi_add_handle(e->multi, warmbox_xfer_easy(t->x)) != CURLM_OK) {
    t->why = TR_ADD_FAILED;
    set_state(t, TR_DONE);
    live_remove(t);
    news_add(t);
    return;
  }
  set_state(t, TR_RUNNING);
}

/* An attempt ended: retry on the timer, or done. */
static void engine_attempt_done(engine *e, transfer *t, CURLcode rc) {
  double delay;
  curl_multi_remove_handle(e->multi, warmbox_xfer_easy(t->x));
  warmbox_xfer_end(t->x, rc);
  delay = t->why == TR_OK ? warmbox_xfer_retry_delay(t->x) : -1;
  if (delay >= 0) {
    set_state(t, TR_WAITING);
    t->not_before = warmbox_clock_now() + delay;
    return;
  }
  set_state(t, TR_DONE);
  live_remove(t);
  news_add(t);
}

static void engine_read_info(engine *e) {
  CURLMsg *m;
  int left = 0;
  while ((m = curl_multi_info_read(e->multi, &left)) != NULL) {
    transfer *t = NULL;
    if (m->msg != CURLMSG_DONE) continue;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&t);
    if (t) engine_attempt_done(e, t, m->data.result);
  }
}

/* One round: wait at most ms for the epoll set, then serve sockets, the
 * timer and due retries. */
static void engine_run(engine *e, int ms) {
  struct epoll_event evs[ENGINE_MAX_EVENTS];
  int n, i, running = 0;
  double now;
  transfer *t, *next;
  if (e->news) ms = 0;
  n = epoll_wait(e->epfd, evs, ENGINE_MAX_EVENTS, ms);
  if (n < 0) n = 0; /* EINTR: nothing ready */
  for (i = 0; i < n; i++) {
    int fd = evs[i].data.fd, flags = 0;
    if (fd == e->tfd) {
      uint64_t ticks;
      if (read(e->tfd, &ticks, sizeof ticks) < 0) {
      } /* drained; EAGAIN when raced */
      continue;
    }
    if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) flags |= CURL_CSELECT_IN;
    if (evs[i].events & EPOLLOUT) flags |= CURL_CSELECT_OUT;
    if (evs[i].events & EPOLLERR) flags |= CURL_CSELECT_ERR;
    curl_multi_socket_action(e->multi, fd, flags, &running);
  }
  now = warmbox_clock_now();
  for (t = e->live; t; t = next) {
    next = t->next;
    if (t->state == TR_WAITING && t->not_before <= now) engine_launch(e, t);
  }
  if (e->curl_deadline >= 0 && e->curl_deadline <= warmbox_clock_now()) {
    e->curl_deadline = -1; /* libcurl sets the next one from inside */
    curl_multi_socket_action(e->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  }
  engine_read_info(e);
  e->armed = -2; /* rearm unconditionally: a fired timerfd stays readable */
  engine_rearm(e);
}

/* Aborts every transfer (engine closed); the engine is unusable after. */
static void engine_release(engine *e) {
  transfer *t;
  if (e->closed) return;
  while ((t = e->live) != NULL) {
    if (t->state == TR_RUNNING) curl_multi_remove_handle(e->multi, warmbox_xfer_easy(t->x));
    set_state(t, TR_DONE);
    t->why = TR_ENGINE_CLOSED;
    live_remove(t);
  }
  while ((t = e->news) != NULL) news_remove(t);
  e->closed = 1;
  if (e->multi) curl_multi_cleanup(e->multi);
  e->multi = NULL;
  if (e->epfd >= 0) close(e->epfd);
  if (e->tfd >= 0) close(e->tfd);
  e->epfd = e->tfd = -1;
}

/* Takes a transfer out of its engine (cancel, __gc). */
static void transfer_detach(transfer *t, int why) {
  engine *e = t->eng;
  if (t->state == TR_DONE) return;
  if (!e->closed && t->state == TR_RUNNING && t->x) {
    /* Removing a transfer in progress closes its connection (libcurl never
     * reuses a connection with a transfer cut short), so the server sees
     * the disconnect. */
    curl_multi_remove_handle(e->multi, warmbox_xfer_easy(t->x));
  }
  set_state(t, TR_DONE);
  t->why = why;
  live_remove(t);
}

/* ======================================================================
 * Lua: warmbox.Engine
 * ====================================================================== */

static engine *engine_check(lua_State *L, int idx) {
  engine *e = (engine *)luaL_checkudata(L, idx, ENGINE_MT);
  if (e->closed) luaL_error(L, "attempt to use a closed " ENGINE_MT);
  return e;
}

static transfer *transfer_check(lua_State *L, int idx) {
  return (transfer *)luaL_checkudata(L, idx, TRANSFER_MT);
}

static const char *const engine_fields[] = {"max_buffered", NULL};

/* core.engine{ max_buffered = 1048576 } */
static int engine_new(lua_State *L) {
  engine *e;
  double mb = (double)ENGINE_DEFAULT_BUFFERED;
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
      const char *const *f;
      int ok = 0;
      if (lua_type(L, -2) == LUA_TSTRING)
        for (f = engine_fields; *f; f++)
          if (strcmp(*f, lua_tostring(L, -2)) == 0) ok = 1;
      if (!ok) return luaL_argerror(L, 1, lua_pushfstring(L, "unknown option '%s'", luaL_tolstring(L, -2, NULL)));
      lua_pop(L, 1);
    }
    lua_getfield(L, 1, "max_buffered");
    if (!lua_isnil(L, -1)) {
      if (!lua_isnumber(L, -1))
        return luaL_argerror(
          L, 1, lua_pushfstring(L, "option 'max_buffered': number expected, got %s", luaL_typename(L, -1)));
      mb = (double)lua_tonumber(L, -1);
      if (!(mb >= 1)) return luaL_argerror(L, 1, "option 'max_buffered': a number >= 1 expected");
    }
    lua_pop(L, 1);
  }
  lua_settop(L, 0);
  /* Created closed, so a failure below leaves something __gc can release. */
  e = (engine *)lua_newuserdatauv(L, sizeof *e, 1);
  memset(e, 0, sizeof *e);
  e->closed = 1;
  e->epfd = e->tfd = -1;
  luaL_setmetatable(L, ENGINE_MT);
  lua_createtable(L, 0, 0); /* lightuserdata -> transfer, weak values */
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setiuservalue(L, 1, 1);
  e->max_buffered = mb > 1e15 ? (size_t)1e15 : (size_t)mb;
  e->curl_deadline = -1;
  e->armed = -1;
  e->epfd = epoll_create1(EPOLL_CLOEXEC);
  e->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  e->multi = curl_multi_init();
  if (e->epfd >= 0 && e->tfd >= 0 && e->multi) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.fd = e->tfd;
    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->tfd, &ev) == 0) e->closed = 0;
  }
  if (e->closed) {
    int err = errno;
    e->closed = 0;
    engine_release(e);
    lua_pushnil(L);
    lua_pushfstring(L, "cannot create an engine: %s", strerror(err));
    lua_pushliteral(L, "TRANSPORT");
    return 3;
  }
  curl_multi_setopt(e->multi, CURLMOPT_SOCKETFUNCTION, engine_socket_cb);
  curl_multi_setopt(e->multi, CURLMOPT_SOCKETDATA, e);
  curl_multi_setopt(e->multi, CURLMOPT_TIMERFUNCTION, engine_timer_cb);
  curl_multi_setopt(e->multi, CURLMOPT_TIMERDATA, e);
  return 1;
}

/* eng:start(h, req) -> tr */
static int engine_start(lua_State *L) {
  engine *e = engine_check(L, 1);
  warmbox_http *h = warmbox_http_check(L, 2);
  transfer *t;
  int failed = 0;
  warmbox_http_check_request(L, 3, WARMBOX_REQ_FRAMES);
  lua_settop(L, 3);
  t = (transfer *)lua_newuserdatauv(L, sizeof *t, 3); /* 4 */
  memset(t, 0, sizeof *t);
  t->eng = e;
  t->state = TR_DONE; /* until it is on the live list */
  t->why = TR_SETUP_FAILED;
  luaL_setmetatable(L, TRANSFER_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, 4, 1); /* the engine outlives its transfers */
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, 4, 2); /* and so does the client (its pool) */
  lua_getiuservalue(L, 1, 1);
  lua_pushvalue(L, 4);
  lua_rawsetp(L, -2, t);
  lua_pop(L, 1);
  t->x = warmbox_xfer_new(h);
  if (!t->x) return luaL_error(L, "out of memory");
  failed = warmbox_xfer_setup(L, 3, t->x, engine_frame_sink, t); /* if it raises, __gc frees t->x */
  if (failed) {
    news_add(t);
    return 1;
  }
  curl_easy_setopt(warmbox_xfer_easy(t->x), CURLOPT_WRITEFUNCTION, engine_on_write);
  curl_easy_setopt(warmbox_xfer_easy(t->x), CURLOPT_WRITEDATA, t);
  curl_easy_setopt(warmbox_xfer_easy(t->x), CURLOPT_PRIVATE, t);
  t->why = TR_OK;
  set_state(t, TR_WAITING);
  live_add(t);
  engine_launch(e, t); /* libcurl asks for a timeout of 0: the pollfd turns readable */
  return 1;
}

static int seconds_to_ms(double s) {
  double ms;
  if (!(s > 0)) return 0;
  ms = ceil(s * 1000.0);
  return ms > (double)INT_MAX ? INT_MAX : (int)ms;
}

/* eng:step(timeout) -> { tr, ... } with news (frames or done) */
static int engine_step(lua_State *L) {
  engine *e = engine_check(L, 1);
  lua_Number timeout = luaL_optnumber(L, 2, 0);
  transfer *t;
  lua_Integer n = 0;
  lua_settop(L, 1);
  engine_run(e, seconds_to_ms((double)timeout));
  lua_getiuservalue(L, 1, 1); /* 2: the weak table */
  lua_createtable(L, 4, 0);   /* 3 */
  /* Pop one at a time: building the table may run a transfer's __gc, which
   * takes that transfer off the list. */
  while ((t = e->news) != NULL) {
    e->news = t->next_news;
    if (!e->news) e->news_tail = NULL;
    t->news = 0;
    t->next_news = NULL;
    if (lua_rawgetp(L, 2, t) == LUA_TUSERDATA) {
      lua_rawseti(L, 3, ++n);
    } else {
      lua_pop(L, 1); /* being collected */
    }
  }
  return 1;
}

/* eng:timeout() -> seconds | nil */
static int engine_timeout(lua_State *L) {
  engine *e = engine_check(L, 1);
  double d;
  if (e->news) {
    lua_pushnumber(L, 0);
    return 1;
  }
  d = engine_deadline(e);
  if (d < 0) {
    lua_pushnil(L);
  } else {
    d -= warmbox_clock_now();
    lua_pushnumber(L, (lua_Number)(d > 0 ? d : 0));
  }
  return 1;
}

static int engine_pollfd(lua_State *L) {
  lua_pushinteger(L, engine_check(L, 1)->epfd);
  return 1;
}

static int engine_events(lua_State *L) {
  engine_check(L, 1);
  lua_pushliteral(L, "r");
  return 1;
}

static int engine_pending(lua_State *L) {
  lua_pushinteger(L, engine_check(L, 1)->pending);
  return 1;
}

static int engine_close(lua_State *L) {
  engine *e = (engine *)luaL_checkudata(L, 1, ENGINE_MT);
  engine_release(e);
  return 0;
}

static int engine_tostring(lua_State *L) {
  engine *e = (engine *)luaL_checkudata(L, 1, ENGINE_MT);
  if (e->closed) {
    lua_pushliteral(L, ENGINE_MT " (closed)");
  } else {
    lua_pushfstring(L, ENGINE_MT ": %p", (void *)e);
  }
  return 1;
}

/* ======================================================================
 * Lua: warmbox.Transfer
 * ====================================================================== */

static int transfer_done(lua_State *L) {
  lua_pushboolean(L, transfer_check(L, 1)->state == TR_DONE);
  return 1;
}

/* tr:frames() -> { frame, ... }, { flags, ... } (both empty when none) */
static int transfer_frames(lua_State *L) {
  transfer *t = transfer_check(L, 1);
  size_t off = 0, i = 0, n = t->nframes;
  const unsigned char *d = (const unsigned char *)t->frames.data;
  lua_settop(L, 1);
  lua_createtable(L, n > INT_MAX ? 0 : (int)n, 0);
  lua_createtable(L, n > INT_MAX ? 0 : (int)n, 0);
  while (off + 5 <= t->frames.len) {
    size_t len = ((size_t)d[off] << 24) | ((size_t)d[off + 1] << 16) | ((size_t)d[off + 2] << 8) | d[off + 3];
    i++;
    lua_pushlstring(L, (const char *)d + off + 5, len);
    lua_rawseti(L, 2, (lua_Integer)i);
    lua_pushinteger(L, d[off + 4]);
    lua_rawseti(L, 3, (lua_Integer)i);
    off += 5 + len;
  }
  warmbox_buf_reset(&t->frames);
  t->nframes = 0;
  if (t->paused && t->state == TR_RUNNING && !t->eng->closed && t->x) {
    /* Resume: libcurl may hand the held chunk to engine_on_write right
     * here (C only), and asks for a timeout of 0 to go on reading. */
    t->paused = 0;
    curl_easy_pause(warmbox_xfer_easy(t->x), CURLPAUSE_CONT);
  }
  return 2;
}

/* tr:result() -> res | nil, msg, code (raises while not done) */
static int transfer_result(lua_State *L) {
  transfer *t = transfer_check(L, 1);
  int nres, k;
  if (t->state != TR_DONE) return luaL_error(L, "the transfer is not done (check tr:done())");
  lua_settop(L, 1);
  if (lua_getiuservalue(L, 1, 3) != LUA_TTABLE) {
    lua_pop(L, 1);
    if (!t->x) return luaL_error(L, "out of memory");
    lua_createtable(L, 3, 1); /* 2 */
    switch (t->why) {
      case TR_CANCELLED:
        nres = warmbox_xfer_push_error(L, t->x, "transfer cancelled", "ABORTED");
        break;
      case TR_ENGINE_CLOSED:
        nres = warmbox_xfer_push_error(L, t->x, "engine closed", "ABORTED");
        break;
      case TR_OOM:
        nres = warmbox_xfer_push_error(L, t->x, "out of memory", "TRANSPORT");
        break;
      case TR_ADD_FAILED:
        nres = warmbox_xfer_push_error(L, t->x, "cannot add the transfer to the engine", "TRANSPORT");
        break;
      default:
        nres = warmbox_xfer_push_outcome(L, t->x);
        break;
    }
    for (k = nres; k >= 1; k--) lua_rawseti(L, -1 - k, k);
    lua_pushinteger(L, nres);
    lua_setfield(L, -2, "n");
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, 1, 3);
    /* The result is built: the handle and the client's share go now. */
    warmbox_xfer_destroy(t->x);
    t->x = NULL;
  }
  lua_getfield(L, 2, "n");
  nres = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  for (k = 1; k <= nres; k++) lua_rawgeti(L, 2, k);
  return nres;
}

/* tr:cancel() -> true (aborted now) | false (already done) */
static int transfer_cancel(lua_State *L) {
  transfer *t = transfer_check(L, 1);
  if (t->state == TR_DONE) {
    lua_pushboolean(L, 0);
    return 1;
  }
  transfer_detach(t, TR_CANCELLED);
  news_add(t);
  lua_pushboolean(L, 1);
  return 1;
}

static int transfer_gc(lua_State *L) {
  transfer *t = transfer_check(L, 1);
  if (!t->eng) return 0; /* never set up */
  transfer_detach(t, TR_CANCELLED);
  news_remove(t);
  if (t->x) warmbox_xfer_destroy(t->x);
  t->x = NULL;
  warmbox_buf_free(&t->frames);
  t->nframes = 0;
  return 0;
}

/* __close: a transfer leaving its scope unfinished is aborted. */
static int transfer_close(lua_State *L) {
  transfer *t = transfer_check(L, 1);
  if (t->eng && t->state != TR_DONE) {
    transfer_detach(t, TR_CANCELLED);
    news_add(t);
  }
  return 0;
}

static int transfer_tostring(lua_State *L) {
  transfer *t = transfer_check(L, 1);
  static const char *const states[] = {"waiting", "running", "done"};
  lua_pushfstring(L, TRANSFER_MT ": %p (%s)", (void *)t, states[t->state]);
  return 1;
}

/* ======================================================================
 * core.poll(fd, timeout): is fd readable within timeout seconds?
 * ====================================================================== */

static int core_poll(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  lua_Number timeout = luaL_optnumber(L, 2, 0);
  struct pollfd p;
  int r;
  luaL_argcheck(L, fd >= 0 && fd <= INT_MAX, 1, "not a file descriptor");
  p.fd = (int)fd;
  p.events = POLLIN;
  p.revents = 0;
  do {
    r = poll(&p, 1, seconds_to_ms((double)timeout));
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    lua_pushnil(L);
    lua_pushstring(L, strerror(errno));
    lua_pushliteral(L, "IO");
    return 3;
  }
  if (r > 0 && (p.revents & POLLNVAL)) return luaL_argerror(L, 1, "not an open file descriptor");
  lua_pushboolean(L, r > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)));
  return 1;
}

/* ======================================================================
 * Registration
 * ====================================================================== */

static const luaL_Reg engine_methods[] = {
  {"start", engine_start},   {"step", engine_step},       {"timeout", engine_timeout}, {"pollfd", engine_pollfd},
  {"events", engine_events}, {"pending", engine_pending}, {"close", engine_close},     {NULL, NULL}};

static const luaL_Reg engine_meta[] = {
  {"__gc", engine_close}, {"__close", engine_close}, {"__tostring", engine_tostring}, {NULL, NULL}};

static const luaL_Reg transfer_methods[] = {{"done", transfer_done},
                                            {"result", transfer_result},
                                            {"frames", transfer_frames},
                                            {"cancel", transfer_cancel},
                                            {NULL, NULL}};

static const luaL_Reg transfer_meta[] = {
  {"__gc", transfer_gc}, {"__close", transfer_close}, {"__tostring", transfer_tostring}, {NULL, NULL}};

void warmbox_engine_register(lua_State *L) {
  if (luaL_newmetatable(L, ENGINE_MT)) {
    luaL_setfuncs(L, engine_meta, 0);
    luaL_newlib(L, engine_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, TRANSFER_MT)) {
    luaL_setfuncs(L, transfer_meta, 0);
    luaL_newlib(L, transfer_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, engine_new);
  lua_setfield(L, -2, "engine");
  lua_pushcfunction(L, core_poll);
  lua_setfield(L, -2, "poll");
}
