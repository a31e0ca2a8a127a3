/*
 * process.c: envd's process.Process service (Start, Connect, StreamInput
 * and the unary RPCs: List, SendInput, SendSignal, CloseStdin, Update), as
 * E2B's envd serves it with the JSON codec. Start and Connect are server
 * streams: one envelope per event, written by a reader that parks its
 * connection while there is none. envd.c routes here; rpc.c holds
 * the Connect helpers both use (envd.h).
 */
#include "jail.h"
#include "envd.h"
#include "state.h"
#include "server.h"
#include "util.h"
#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

/* ------------------------------------------------------------------ */
/* process.Process                                                     */
/* ------------------------------------------------------------------ */

/* Processes started by Process.Start, as E2B's envd keeps them: a process
 * outlives the stream that started it (the client may leave and come back
 * with Connect), its output is read by a pump thread of its own and fanned
 * out to the streams attached to it (dropped while none is), and its end is
 * kept PROC_RETAIN_US after it exited for a late Connect. Lock order:
 * procs_mu, then a proc's mu; in_mu alone. */
#define PROC_QUEUE_MAX     (256u << 10) /* envelope bytes waiting per stream: then the pump (and the process) waits */
#define PROC_TAG_MAX       4096         /* bytes of a tag (kept with an ended process) */
#define PROC_LIVE_MAX      64           /* running processes per sandbox (WARMBOXD_PROCS_MAX) */
#define PROC_RETAINED_MAX  64           /* ended ones kept per sandbox */
#define PROC_RETAIN_US     (30 * 1000000LL)
#define PROC_INPUT_WAIT_MS 30000 /* a process that reads no input fails the write after this */

struct sub { /* a stream attached to a process */
  struct sub *next;
  struct wbd_buf q; /* envelopes not yet taken by the stream, under proc.mu */
  int efd;          /* eventfd: q grew, or the stream must end */
  int ended;        /* q holds the end and the trailer: nothing follows */
  int dropped;      /* the sandbox went away under the process: drop the stream */
};

struct proc {
  struct proc *next; /* procs, under procs_mu */
  int refs;          /* under procs_mu: the list, the pump, each stream */
  char sbid[32];
  pid_t pid;
  json_t *config; /* ProcessConfig as received; NULL once ended */
  char *tag;
  int is_pty;
  int exited;          /* under procs_mu and mu: the end is known */
  int64_t expire_us;   /* ended: forgotten at this time */
  pthread_mutex_t mu;  /* subs, end */
  pthread_cond_t cond; /* a stream took from its queue or left */
  struct sub *subs;
  json_t *end;           /* the EndEvent, once exited (NULL: dropped) */
  pthread_mutex_t in_mu; /* input, resize, CloseStdin */
  int in_fd;             /* stdin's write end, or -1 (a pty: the master) */
  int pty_fd;            /* pty master, or -1; closed when freed */
  /* the pump's own */
  struct wbd_sandbox *sb; /* reference, held while the process runs */
  int out_fd, err_fd, pid_fd;
  int64_t deadline_us; /* Start's Connect-Timeout-Ms: then the process is killed */
  char boot[48];       /* the sandbox's boot id when it started */
};
static pthread_mutex_t procs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct proc *procs;

static int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void proc_free(struct proc *p) {
  if (p->in_fd >= 0 && p->in_fd != p->pty_fd) close(p->in_fd);
  if (p->pty_fd >= 0) close(p->pty_fd);
  json_decref(p->config);
  json_decref(p->end);
  free(p->tag);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->in_mu);
  free(p);
}

static void proc_unref(struct proc *p) {
  pthread_mutex_lock(&procs_mu);
  int last = --p->refs == 0;
  pthread_mutex_unlock(&procs_mu);
  if (last) proc_free(p);
}

/* Under procs_mu: forgets ended processes past their retention, and the
 * oldest ended ones of sbid beyond PROC_RETAINED_MAX (sbid may be NULL). */
static void procs_sweep_locked(const char *sbid) {
  int64_t now = mono_us();
  int kept = 0;
  for (struct proc **pp = &procs; *pp;) {
    struct proc *p = *pp;
    /* newest first: the list is in order of start */
    int mine = sbid && p->exited && strcmp(p->sbid, sbid) == 0;
    if (mine) kept++;
    if (p->exited && (p->expire_us <= now || (mine && kept > PROC_RETAINED_MAX))) {
      *pp = p->next;
      if (--p->refs == 0) proc_free(p);
      continue;
    }
    pp = &p->next;
  }
}

/* The process a ProcessSelector names in sb, referenced, or NULL. live:
 * only a running one (ended ones are kept for Connect). */
static struct proc *proc_find(struct wbd_sandbox *sb, json_t *sel, int live) {
  long long want = wbd_jint(sel, "pid", 0);
  const char *tag = wbd_jstr(sel, "tag", NULL);
  struct proc *found = NULL;
  pthread_mutex_lock(&procs_mu);
  procs_sweep_locked(NULL);
  for (struct proc *p = procs; p; p = p->next) {
    /* an ended process whose sandbox went away under it is gone (a fresh boot) */
    if (strcmp(p->sbid, sb->id) != 0 || (p->exited && (live || !p->end))) continue;
    if ((want > 0 && p->pid == want) || (want <= 0 && tag && p->tag && strcmp(tag, p->tag) == 0)) {
      /* a running process with the same pid or tag wins over an ended one */
      if (!found || (found->exited && !p->exited)) found = p;
    }
  }
  if (found) found->refs++;
  pthread_mutex_unlock(&procs_mu);
  return found;
}

static enum MHD_Result proc_not_found(struct wbd_req *req, json_t *sel) {
  const char *tag = wbd_jstr(sel, "tag", NULL);
  if (wbd_jint(sel, "pid", 0) <= 0 && tag) return wbd_rpc_error(req, "not_found", "process with tag %s not found", tag);
  return wbd_rpc_error(req, "not_found", "process with pid %lld not found", wbd_jint(sel, "pid", 0));
}

static json_t *trailer_error(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static json_t *trailer_error(const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  json_t *e = wbd_connect_error_json(code, fmt, ap);
  va_end(ap);
  return json_pack("{s:o}", "error", e);
}

/* A streaming RPC that failed before streaming: HTTP 200, only the trailer. */
static enum MHD_Result stream_fail(struct wbd_req *req, json_t *trailer) {
  struct wbd_buf b = {0};
  wbd_connect_frame(&b, 0x02, trailer);
  enum MHD_Result r = wbd_reply_raw(req, 200, "application/connect+json", b.data, b.len, NULL);
  wbd_buf_free(&b);
  return r;
}

static void sub_wake(struct sub *s) {
  uint64_t one = 1;
  if (write(s->efd, &one, sizeof one) < 0) {
  } /* EAGAIN: already signalled */
}

/* A new stream attached to p, its start event queued; with the end too when
 * p already ended. NULL when out of memory. */
static struct sub *proc_subscribe(struct proc *p) {
  struct sub *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->efd < 0) {
    free(s);
    return NULL;
  }
  wbd_connect_frame(&s->q, 0, json_pack("{s:{s:{s:I}}}", "event", "start", "pid", (json_int_t)p->pid));
  pthread_mutex_lock(&p->mu);
  if (p->exited) {
    if (p->end) {
      wbd_connect_frame(&s->q, 0, json_pack("{s:{s:O}}", "event", "end", p->end));
      wbd_connect_frame(&s->q, 0x02, json_object());
      s->ended = 1;
    } else {
      s->dropped = 1;
    }
  } else {
    s->next = p->subs;
    p->subs = s;
  }
  pthread_mutex_unlock(&p->mu);
  sub_wake(s);
  return s;
}

static void proc_unsubscribe(struct proc *p, struct sub *s) {
  pthread_mutex_lock(&p->mu);
  for (struct sub **pp = &p->subs; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->mu);
  close(s->efd);
  wbd_buf_free(&s->q);
  free(s);
}

/* The pump: one message to every attached stream, waiting while one of them
 * is PROC_QUEUE_MAX behind (its client reads slowly: the process waits, as
 * envd's unbuffered channels make it); dropped when no stream is attached. */
static void proc_publish(struct proc *p, json_t *msg /* stolen */) {
  struct wbd_buf env = {0};
  wbd_connect_frame(&env, 0, msg);
  pthread_mutex_lock(&p->mu);
  for (;;) {
    int full = 0;
    for (struct sub *s = p->subs; s; s = s->next) full |= s->q.len - s->q.off > PROC_QUEUE_MAX;
    if (!full) break;
    pthread_cond_wait(&p->cond, &p->mu);
  }
  for (struct sub *s = p->subs; s; s = s->next) {
    wbd_buf_add(&s->q, env.data, env.len);
    sub_wake(s);
  }
  pthread_mutex_unlock(&p->mu);
  wbd_buf_free(&env);
}

/* Go's ProcessState.String() for a signal. */
static const char *go_signal_name(int sig) {
  switch (sig) {
    case SIGKILL:
      return "killed";
    case SIGTERM:
      return "terminated";
    case SIGINT:
      return "interrupt";
    case SIGHUP:
      return "hangup";
    case SIGQUIT:
      return "quit";
    case SIGPIPE:
      return "broken pipe";
    case SIGSEGV:
      return "segmentation fault";
    case SIGABRT:
      return "aborted";
    default:
      return strsignal(sig);
  }
}

static json_t *end_event(int st) {
  json_t *end = json_object();
  char status[96];
  int code;
  if (WIFEXITED(st)) {
    code = WEXITSTATUS(st);
    snprintf(status, sizeof status, "exit status %d", code);
    json_object_set_new(end, "exited", json_true());
  } else if (WIFSIGNALED(st)) {
    code = -1;
    snprintf(status, sizeof status, "signal: %s", go_signal_name(WTERMSIG(st)));
  } else {
    code = -1;
    snprintf(status, sizeof status, "unknown status %d", st);
  }
  if (code != 0) json_object_set_new(end, "exitCode", json_integer(code));
  json_object_set_new(end, "status", json_string(status));
  if (code != 0) json_object_set_new(end, "error", json_string(status));
  return end;
}

/* The process ended (status st): every attached stream gets the end and the
 * trailer, or, when the sandbox was killed or paused under the process, is
 * dropped (as E2B's VM going away: the SDK then finds the sandbox gone and
 * says "The sandbox was killed" rather than "signal: killed"). */
static void proc_ended(struct proc *p, int st) {
  /* A pause or kill in flight ends what it does first; then the sandbox is
   * not running, or (a pause without memory and a resume since) it is
   * running a new boot. */
  wbd_store_lock();
  wbd_store_wait_idle_locked(p->sb);
  int gone = p->sb->state != WBD_RUNNING;
  wbd_store_unlock();
  char boot[sizeof p->boot];
  wbd_rt_boot_id(p->sb, boot, sizeof boot);
  gone |= strcmp(boot, p->boot) != 0;
  json_t *end = gone ? NULL : end_event(st);
  pthread_mutex_lock(&procs_mu);
  pthread_mutex_lock(&p->mu);
  p->exited = 1;
  p->expire_us = mono_us() + PROC_RETAIN_US;
  p->end = end;
  json_decref(p->config);
  p->config = NULL;
  for (struct sub *s = p->subs; s; s = s->next) {
    if (end) {
      wbd_connect_frame(&s->q, 0, json_pack("{s:{s:O}}", "event", "end", end));
      wbd_connect_frame(&s->q, 0x02, json_object());
      s->ended = 1;
    } else {
      s->dropped = 1;
    }
    sub_wake(s);
  }
  p->subs = NULL; /* the streams unsubscribe from an empty list */
  pthread_mutex_unlock(&p->mu);
  procs_sweep_locked(p->sbid);
  pthread_mutex_unlock(&procs_mu);
}

static void *proc_pump(void *arg) {
  struct proc *p = arg;
  int fds_open = (p->out_fd >= 0) + (p->err_fd >= 0);
  for (;;) {
    /* Like Go's exec.Cmd, the end comes when the output is at EOF and the
     * process has exited. */
    struct pollfd fds[3] = {
      {.fd = p->out_fd, .events = POLLIN},
      {.fd = p->err_fd, .events = POLLIN},
      {.fd = fds_open ? -1 : p->pid_fd, .events = POLLIN},
    };
    if (!fds_open && p->pid_fd < 0) break; /* no pidfd: a blocking wait */
    int timeout = -1;
    if (p->deadline_us) {
      int64_t now = mono_us();
      if (now >= p->deadline_us) {
        /* Start's Connect-Timeout-Ms ran out: envd kills the process. */
        wbd_rt_signal(p->sb, p->pid, SIGKILL);
        p->deadline_us = 0;
        continue;
      }
      int64_t ms = (p->deadline_us - now + 999) / 1000;
      timeout = ms > 60000 ? 60000 : (int)ms;
    }
    int n = poll(fds, 3, timeout);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    if (fds[2].revents) break;
    for (int i = 0; i < 2; i++) {
      if (!fds[i].revents) continue;
      char chunk[32768];
      /* 16 KiB from a pty, 32 KiB from a pipe, as envd reads them */
      ssize_t r = read(fds[i].fd, chunk, p->is_pty ? 16384 : sizeof chunk);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) { /* EOF, or EIO: a pty's last slave end closed */
        if (fds[i].fd != p->pty_fd) close(fds[i].fd);
        if (i == 0)
          p->out_fd = -1;
        else
          p->err_fd = -1;
        fds_open--;
        continue;
      }
      pthread_mutex_lock(&p->mu);
      int attached = p->subs != NULL;
      pthread_mutex_unlock(&p->mu);
      if (!attached) continue; /* nobody to send it to: not even encoded */
      char *b64 = wbd_b64_encode(chunk, (size_t)r);
      proc_publish(p, json_pack("{s:{s:{s:s}}}", "event", "data",
                                p->is_pty ? "pty"
                                : i == 0  ? "stdout"
                                          : "stderr",
                                b64 ? b64 : ""));
      free(b64);
    }
  }
  proc_ended(p, wbd_rt_wait(p->sb, p->pid));
  if (p->out_fd >= 0 && p->out_fd != p->pty_fd) close(p->out_fd);
  if (p->err_fd >= 0) close(p->err_fd);
  if (p->pid_fd >= 0) close(p->pid_fd);
  wbd_sandbox_unref(p->sb);
  p->sb = NULL;
  proc_unref(p);
  return NULL;
}

/* ---- the streams (Start, Connect): one per attached client ---- */

enum { PS_RUNNING = WBD_STREAM_RUNNING, PS_DONE = WBD_STREAM_DONE, PS_ABORT = WBD_STREAM_ABORT };

struct pstream {
  struct wbd_sandbox *sb; /* our own reference */
  struct proc *p;         /* referenced */
  struct sub *s;
  struct MHD_Connection *conn;
  int phase;
  int64_t deadline_us; /* this stream's Connect-Timeout-Ms; 0: none */
  int64_t keepalive_us;
  int64_t last_sent_us;
  struct wbd_buf buf;
};

/* Produce the next envelope(s) into ps->buf (or end the stream): 0; or,
 * with nothing to do yet, the milliseconds to wait (*wait_fds: the
 * descriptors that end the wait). Never blocks. */
static int ps_step(void *cls, int wait_fds[2]) {
  struct pstream *ps = cls;
  struct proc *p = ps->p;
  struct sub *s = ps->s;
  int64_t now = mono_us();
  if (ps->deadline_us && now >= ps->deadline_us) {
    wbd_connect_frame(&ps->buf, 0x02, trailer_error("deadline_exceeded", "the operation timed out"));
    ps->phase = PS_DONE;
    return 0;
  }
  pthread_mutex_lock(&p->mu);
  if (s->dropped) {
    pthread_mutex_unlock(&p->mu);
    ps->phase = PS_ABORT;
    return 0;
  }
  if (s->q.len > s->q.off) {
    /* take the whole queue */
    struct wbd_buf t = ps->buf;
    ps->buf = s->q;
    s->q = t;
    s->q.len = s->q.off = 0;
    if (s->ended) ps->phase = PS_DONE;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    ps->last_sent_us = now;
    return 0;
  }
  pthread_mutex_unlock(&p->mu);
  int64_t wait_us = 1000000;
  if (ps->deadline_us && ps->deadline_us - now < wait_us) wait_us = ps->deadline_us - now;
  if (ps->keepalive_us) {
    int64_t due = ps->last_sent_us + ps->keepalive_us;
    if (now >= due) {
      wbd_connect_frame(&ps->buf, 0, json_pack("{s:{s:{}}}", "event", "keepalive"));
      ps->last_sent_us = now;
      return 0;
    }
    if (due - now < wait_us) wait_us = due - now;
  }
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(ps->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  struct pollfd fds[2] = {{.fd = s->efd, .events = POLLIN}, {.fd = ci ? ci->connect_fd : -1, .events = POLLRDHUP}};
  int n = poll(fds, 2, 0);
  if (n < 0 && errno != EINTR) {
    ps->phase = PS_ABORT;
    return 0;
  }
  if (n > 0 && (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
    ps->phase = PS_ABORT; /* the client went away; the process goes on */
    return 0;
  }
  if (n > 0 && fds[0].revents) {
    uint64_t v;
    if (read(s->efd, &v, sizeof v) < 0) {
    }
    return 0;
  }
  wait_fds[0] = fds[0].fd;
  wait_fds[1] = fds[1].fd;
  return (int)((wait_us + 999) / 1000);
}

static ssize_t ps_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct pstream *ps = cls;
  (void)pos;
  return wbd_rpc_stream_read(ps->conn, &ps->buf, &ps->phase, ps_step, ps, out, max);
}

static void ps_done(void *cls) {
  struct pstream *ps = cls;
  proc_unsubscribe(ps->p, ps->s);
  proc_unref(ps->p);
  wbd_store_lock();
  ps->sb->runs_in_flight--;
  wbd_store_unlock();
  wbd_sandbox_unref(ps->sb);
  wbd_buf_free(&ps->buf);
  free(ps);
}

/* Saturated: ~34 years of milliseconds. */
#define TIMEOUT_MS_MAX ((int64_t)1 << 40)

/* Streams p to the client from s on (the reference to p is the stream's). */
static enum MHD_Result proc_stream(struct wbd_req *req, struct wbd_sandbox *sb, struct proc *p, struct sub *s) {
  struct pstream *ps = calloc(1, sizeof *ps);
  if (!ps) {
    proc_unsubscribe(p, s);
    proc_unref(p);
    return stream_fail(req, trailer_error("internal", "out of memory"));
  }
  wbd_store_lock();
  sb->refcount++; /* the stream outlives this handler */
  sb->runs_in_flight++;
  wbd_store_unlock();
  ps->sb = sb;
  ps->p = p;
  ps->s = s;
  ps->conn = req->conn;
  ps->phase = PS_RUNNING;
  ps->last_sent_us = mono_us();
  int64_t timeout_ms = wbd_rpc_header_num(req, "Connect-Timeout-Ms", TIMEOUT_MS_MAX);
  if (timeout_ms > 0) ps->deadline_us = mono_us() + timeout_ms * 1000;
  /* a day of seconds between pings at most */
  int64_t ka = wbd_rpc_header_num(req, "Keepalive-Ping-Interval", 86400);
  ps->keepalive_us = (ka > 0 ? ka : 50) * 1000000;
  return wbd_reply_stream(req, 200, "application/connect+json", ps_read, ps, ps_done, NULL);
}

/* The one request envelope of a server-streaming RPC, parsed; NULL after
 * replying (*r). */
static json_t *stream_request(struct wbd_req *req, const char *what, enum MHD_Result *r) {
  if (!wbd_content_type_is(req, "application/connect+json")) {
    *r = wbd_reply_error(req, 415, "process.Process/%s is a streaming RPC: use application/connect+json", what);
    return NULL;
  }
  char bad[128];
  if (wbd_rpc_user(req, bad, sizeof bad) != 0) {
    *r = stream_fail(req, trailer_error("unauthenticated", "invalid username: '%s'", bad));
    return NULL;
  }
  size_t len = 0;
  switch (wbd_connect_envelope(req->body, req->body_len, &len)) {
    case WBD_ENV_OK:
      break;
    case WBD_ENV_SHORT:
      *r = stream_fail(req, trailer_error("invalid_argument", "missing request envelope"));
      return NULL;
    case WBD_ENV_COMPRESSED:
      *r = stream_fail(req, trailer_error("internal", "compressed envelopes are not supported"));
      return NULL;
    default:
      *r =
        stream_fail(req, trailer_error("invalid_argument", "request envelope length %zu does not match the body", len));
      return NULL;
  }
  json_error_t jerr;
  json_t *in = json_loadb(req->body + 5, len, 0, &jerr);
  if (!json_is_object(in)) {
    json_decref(in);
    *r = stream_fail(req, trailer_error("invalid_argument", "the request is not a JSON object"));
    return NULL;
  }
  return in;
}

/* A pty size field (uint32 in the proto; a terminal holds 16 bits). */
static unsigned pty_dim(json_t *size, const char *name) {
  long long v = wbd_jint(size, name, 0);
  return v < 0 ? 0 : v > 65535 ? 65535 : (unsigned)v;
}

/* ---- process.Process/Start ---- */

/* What makes a Start request unusable before anything runs (no cmd, a tag
 * too long, a loader variable in envs): its trailer, or NULL. */
static json_t *start_refusal(json_t *in) {
  json_t *proc = json_object_get(in, "process");
  const char *cmd = wbd_jstr(proc, "cmd", NULL);
  if (!cmd || !*cmd) return trailer_error("invalid_argument", "process.cmd is required");
  const char *tag = wbd_jstr(in, "tag", NULL);
  if (tag && strlen(tag) > PROC_TAG_MAX)
    return trailer_error("invalid_argument", "tag is longer than %d bytes", PROC_TAG_MAX);
  json_t *envs = json_object_get(proc, "envs");
  if (json_is_object(envs)) {
    const char *ek;
    json_t *ev;
    json_object_foreach(envs, ek, ev) {
      (void)ev;
      if (wbd_env_refused(ek))
        return trailer_error("invalid_argument", "process.envs: '%s' is a loader variable, not allowed", ek);
    }
  }
  return NULL;
}

/* The caller's home and the process's working directory in `cwd`: E2B's
 * root starts in (and has HOME at) /root; the jail has no other uid to give
 * it, so only the directory differs, and HOME goes into process.envs unless
 * the request set it. A relative cwd or "~" is under the home. */
static void start_home(struct wbd_req *req, json_t *proc, char *cwd, size_t len) {
  char user[64];
  wbd_rpc_user(req, user, sizeof user); /* checked by stream_request */
  const char *home = strcmp(user, "root") == 0 && wbd_rt_isolated() ? "/root" : ENVD_HOME;
  if (strcmp(home, ENVD_HOME) != 0 && json_is_object(proc)) {
    json_t *envs = json_object_get(proc, "envs");
    if (!json_is_object(envs)) {
      envs = json_object();
      json_object_set_new(proc, "envs", envs);
    }
    if (!json_object_get(envs, "HOME")) json_object_set_new(envs, "HOME", json_string(home));
  }
  const char *in = wbd_jstr(proc, "cwd", NULL);
  if (!in || !*in)
    snprintf(cwd, len, "%s", home);
  else if (in[0] == '~' && (in[1] == 0 || in[1] == '/'))
    snprintf(cwd, len, "%s%s", home, in + 1);
  else if (in[0] != '/')
    snprintf(cwd, len, "%s/%s", home, in);
  else
    snprintf(cwd, len, "%s", in);
}

/* Running processes a sandbox may have (each is a jail and a pump thread):
 * WARMBOXD_PROCS_MAX, read once, else PROC_LIVE_MAX. */
static long procs_max(void) {
  static long live_max;
  if (!__atomic_load_n(&live_max, __ATOMIC_RELAXED)) {
    const char *e = getenv("WARMBOXD_PROCS_MAX");
    long long v;
    long m = e && wbd_parse_ll(e, 1, 4096, PROC_LIVE_MAX, &v) == 0 ? (long)v : PROC_LIVE_MAX;
    __atomic_store_n(&live_max, m, __ATOMIC_RELAXED);
  }
  return __atomic_load_n(&live_max, __ATOMIC_RELAXED);
}

static int procs_live(const char *sbid) {
  int live = 0;
  pthread_mutex_lock(&procs_mu);
  for (struct proc *q = procs; q; q = q->next) live += !q->exited && strcmp(q->sbid, sbid) == 0;
  pthread_mutex_unlock(&procs_mu);
  return live;
}

/* argv for execve: cmd, then process.args (a non-string as ""), NULL;
 * *n is the number of args. NULL when out of memory. */
static char **start_argv(const char *cmd, json_t *args, size_t *n) {
  *n = json_is_array(args) ? json_array_size(args) : 0;
  char **argv = calloc(*n + 2, sizeof *argv);
  if (!argv) return NULL;
  argv[0] = strdup(cmd);
  for (size_t i = 0; i < *n; i++) {
    const char *a = json_string_value(json_array_get(args, i));
    argv[i + 1] = strdup(a ? a : "");
  }
  return argv;
}

/* Starts the process in the sandbox, on a pty when the request asks for one
 * (in and out are then its master), else on pipes (stdin only if asked);
 * fills p's pid, descriptors and is_pty. 0, or -errno. */
static int start_spawn(struct wbd_sandbox *sb, json_t *in, char **argv, const char *cwd, struct proc *p) {
  json_t *envs = json_object_get(json_object_get(in, "process"), "envs");
  if (!json_is_object(envs)) envs = NULL;
  json_t *pty = json_object_get(in, "pty");
  p->is_pty = json_is_object(pty);
  p->in_fd = p->pty_fd = p->out_fd = p->err_fd = -1;
  int rc;
  if (p->is_pty) {
    json_t *size = json_object_get(pty, "size");
    rc = wbd_rt_spawn_pty(sb, argv, envs, cwd, pty_dim(size, "cols"), pty_dim(size, "rows"), &p->pid, &p->pty_fd);
    if (rc == 0) {
      fcntl(p->pty_fd, F_SETFL, fcntl(p->pty_fd, F_GETFL) | O_NONBLOCK);
      p->out_fd = p->in_fd = p->pty_fd;
    }
  } else {
    int want_stdin = json_is_true(json_object_get(in, "stdin"));
    rc = wbd_rt_spawn(sb, argv, envs, cwd, &p->pid, want_stdin ? &p->in_fd : NULL, &p->out_fd, &p->err_fd);
    if (rc == 0 && p->in_fd >= 0) fcntl(p->in_fd, F_SETFL, fcntl(p->in_fd, F_GETFL) | O_NONBLOCK);
  }
  return rc;
}

/* The rest of a started process's record: what it belongs to, its
 * ProcessConfig (its fields only: execve bounds their size; nothing else is
 * kept), tag, pidfd, boot id, locks and Connect-Timeout-Ms deadline. */
static void proc_init(struct proc *p, struct wbd_req *req, struct wbd_sandbox *sb, json_t *in) {
  json_t *proc = json_object_get(in, "process");
  const char *tag = wbd_jstr(in, "tag", NULL);
  snprintf(p->sbid, sizeof p->sbid, "%s", sb->id);
  p->config = json_object();
  static const char *const fields[] = {"cmd", "args", "envs", "cwd"};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
    json_t *v = json_object_get(proc, fields[i]);
    if (v) json_object_set_new(p->config, fields[i], json_deep_copy(v));
  }
  p->tag = tag ? strdup(tag) : NULL;
  p->pid_fd = (int)syscall(SYS_pidfd_open, p->pid, 0); /* -1 (ENOSYS...): a blocking wait at the end */
  wbd_rt_boot_id(sb, p->boot, sizeof p->boot);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cond, NULL);
  pthread_mutex_init(&p->in_mu, NULL);
  int64_t timeout_ms = wbd_rpc_header_num(req, "Connect-Timeout-Ms", TIMEOUT_MS_MAX);
  if (timeout_ms > 0) p->deadline_us = mono_us() + timeout_ms * 1000;
}

/* Puts p on the list, where it replaces for Connect an ended process of the
 * sandbox with its pid or tag, and starts its pump. 1 when the pump runs;
 * 0 (the pump's reference dropped) when no thread could be made or `s` is
 * NULL. */
static int proc_launch(struct proc *p, struct sub *s) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 512 * 1024);
  pthread_t th;
  pthread_mutex_lock(&procs_mu);
  for (struct proc **pp = &procs; *pp;) {
    struct proc *q = *pp;
    if (q->exited && strcmp(q->sbid, p->sbid) == 0 &&
        (q->pid == p->pid || (p->tag && q->tag && strcmp(q->tag, p->tag) == 0))) {
      *pp = q->next;
      if (--q->refs == 0) proc_free(q);
      continue;
    }
    pp = &q->next;
  }
  p->next = procs;
  procs = p;
  int started = s && pthread_create(&th, &attr, proc_pump, p) == 0;
  if (!started) p->refs--; /* no pump */
  pthread_mutex_unlock(&procs_mu);
  pthread_attr_destroy(&attr);
  return started;
}

/* A process whose pump could not start: killed and reaped here, as the pump
 * would have, and the request answered out of memory. */
static enum MHD_Result start_unpumped(struct wbd_req *req, struct proc *p, struct sub *s) {
  struct wbd_sandbox *sb = p->sb;
  wbd_rt_signal(sb, p->pid, SIGKILL);
  proc_ended(p, wbd_rt_wait(sb, p->pid));
  if (p->out_fd >= 0 && p->out_fd != p->pty_fd) close(p->out_fd);
  if (p->err_fd >= 0) close(p->err_fd);
  if (p->pid_fd >= 0) close(p->pid_fd);
  wbd_sandbox_unref(sb);
  if (s) proc_unsubscribe(p, s);
  proc_unref(p);
  return stream_fail(req, trailer_error("internal", "out of memory"));
}

/* process.Process/Start: checks the request and the sandbox's process cap,
 * spawns the process, puts it on the list with its pump and streams it. */
enum MHD_Result wbd_process_start(struct wbd_req *req, struct wbd_sandbox *sb) {
  enum MHD_Result r;
  json_t *in = stream_request(req, "Start", &r);
  if (!in) return r;
  json_t *t = start_refusal(in);
  if (t) {
    json_decref(in);
    return stream_fail(req, t);
  }
  json_t *proc = json_object_get(in, "process");
  char cwd[PATH_MAX + 16];
  start_home(req, proc, cwd, sizeof cwd);
  long max = procs_max();
  if (procs_live(sb->id) >= max) {
    json_decref(in);
    return stream_fail(req,
                       trailer_error("resource_exhausted", "too many running processes in this sandbox (%ld)", max));
  }
  const char *cmd = wbd_jstr(proc, "cmd", NULL);
  size_t nargs;
  struct proc *p = calloc(1, sizeof *p);
  char **argv = start_argv(cmd, json_object_get(proc, "args"), &nargs);
  if (!p || !argv) {
    free(p);
    free(argv);
    json_decref(in);
    return stream_fail(req, trailer_error("internal", "out of memory"));
  }
  int rc = start_spawn(sb, in, argv, cwd, p);
  for (size_t i = 0; i < nargs + 1; i++) free(argv[i]);
  free(argv);
  if (rc != 0) {
    free(p);
    t = trailer_error(rc == -ENOENT || rc == -ENOTDIR ? "invalid_argument" : "internal",
                      "failed to start process '%s': %s", cmd, strerror(-rc));
    json_decref(in); /* cmd is in it */
    return stream_fail(req, t);
  }
  proc_init(p, req, sb, in);
  json_decref(in);
  struct timespec started;
  clock_gettime(CLOCK_MONOTONIC, &started);
  wbd_store_lock();
  sb->refcount++; /* the pump's */
  sb->last_start_mono_us = (int64_t)started.tv_sec * 1000000 + started.tv_nsec / 1000;
  wbd_store_unlock();
  p->sb = sb;
  p->refs = 3; /* the list, the pump, this stream */
  struct sub *s = proc_subscribe(p);
  if (!proc_launch(p, s)) return start_unpumped(req, p, s);
  return proc_stream(req, sb, p, s);
}

/* process.Process/Connect: attach to a running process (by pid or tag): its
 * start event, then its further output and end. A process that ended less
 * than PROC_RETAIN_US ago answers its start and end. */
enum MHD_Result wbd_process_connect(struct wbd_req *req, struct wbd_sandbox *sb) {
  enum MHD_Result r;
  json_t *in = stream_request(req, "Connect", &r);
  if (!in) return r;
  json_t *sel = json_object_get(in, "process");
  struct proc *p = proc_find(sb, sel, 0);
  if (!p) {
    const char *tag = wbd_jstr(sel, "tag", NULL);
    json_t *t = wbd_jint(sel, "pid", 0) <= 0 && tag
                  ? trailer_error("not_found", "process with tag %s not found", tag)
                  : trailer_error("not_found", "process with pid %lld not found", wbd_jint(sel, "pid", 0));
    json_decref(in);
    return stream_fail(req, t);
  }
  json_decref(in);
  struct sub *s = proc_subscribe(p);
  if (!s) {
    proc_unref(p);
    return stream_fail(req, trailer_error("internal", "out of memory"));
  }
  return proc_stream(req, sb, p, s);
}

/* Writes input to p's stdin or pty (as the input's oneof says); NULL, or the
 * Connect error (code, message) in err. */
static int proc_input(struct proc *p, json_t *input, const char **code, char *msg, size_t msglen) {
  const char *b64 = wbd_jstr(input, "stdin", NULL);
  int to_pty = 0;
  if (!b64 && (b64 = wbd_jstr(input, "pty", NULL))) to_pty = 1;
  *code = "internal";
  if (!b64) {
    *code = "unimplemented";
    snprintf(msg, msglen, "invalid input type: give input.stdin or input.pty");
    return -1;
  }
  if (to_pty != p->is_pty) {
    snprintf(msg, msglen, "%s",
             to_pty ? "tty not assigned to process — input should be written to the stdin, not the tty"
                    : "tty assigned to process — input should be written to the pty, not the stdin");
    return -1;
  }
  size_t n = 0;
  unsigned char *data = wbd_b64_decode(b64, &n);
  if (!data) {
    *code = "invalid_argument";
    snprintf(msg, msglen, "the input is not base64");
    return -1;
  }
  int rc = 0;
  pthread_mutex_lock(&p->in_mu);
  if (p->in_fd < 0) {
    snprintf(msg, msglen, "stdin not enabled or closed");
    rc = -1;
  }
  int64_t until = mono_us() + (int64_t)PROC_INPUT_WAIT_MS * 1000;
  size_t off = 0;
  while (!rc && off < n) {
    ssize_t w = write(p->in_fd, data + off, n - off);
    if (w > 0) {
      off += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      int64_t left = until - mono_us();
      struct pollfd pf = {.fd = p->in_fd, .events = POLLOUT};
      if (left > 0 && poll(&pf, 1, (int)((left + 999) / 1000)) >= 0) continue;
      *code = "deadline_exceeded";
      snprintf(msg, msglen, "process %d did not read its input within %d s", (int)p->pid, PROC_INPUT_WAIT_MS / 1000);
    } else {
      snprintf(msg, msglen, "error writing to %s of process '%d': %s", p->is_pty ? "tty" : "stdin", (int)p->pid,
               strerror(w < 0 ? errno : EIO));
    }
    rc = -1;
  }
  pthread_mutex_unlock(&p->in_mu);
  free(data);
  return rc;
}

/* process.Process/StreamInput: a client stream of StreamInputRequest
 * envelopes (start selects the process, data is its input, keepalive
 * nothing), applied in order. warmboxd holds request bodies whole, so the
 * input reaches the process when the client ends its stream. */
enum MHD_Result wbd_process_stream_input(struct wbd_req *req, struct wbd_sandbox *sb) {
  if (!wbd_content_type_is(req, "application/connect+json"))
    return wbd_reply_error(req, 415, "process.Process/StreamInput is a streaming RPC: use application/connect+json");
  char bad[128];
  if (wbd_rpc_user(req, bad, sizeof bad) != 0)
    return stream_fail(req, trailer_error("unauthenticated", "invalid username: '%s'", bad));
  struct proc *p = NULL;
  json_t *fail = NULL;
  const unsigned char *b = (const unsigned char *)(req->body ? req->body : "");
  size_t left = req->body_len;
  while (left && !fail) {
    if (left < 5) {
      fail = trailer_error("invalid_argument", "a truncated envelope");
      break;
    }
    size_t len = (size_t)b[1] << 24 | (size_t)b[2] << 16 | (size_t)b[3] << 8 | b[4];
    if (b[0] & 0x01) {
      fail = trailer_error("internal", "compressed envelopes are not supported");
      break;
    }
    if (len > left - 5) {
      fail = trailer_error("invalid_argument", "envelope length %zu runs past the body", len);
      break;
    }
    json_error_t jerr;
    json_t *m = json_loadb((const char *)b + 5, len, 0, &jerr);
    b += 5 + len;
    left -= 5 + len;
    json_t *start = json_object_get(m, "start"), *data = json_object_get(m, "data");
    if (!json_is_object(m)) {
      fail = trailer_error("invalid_argument", "an envelope is not a JSON object");
    } else if (json_is_object(start)) {
      json_t *sel = json_object_get(start, "process");
      if (p) proc_unref(p);
      p = proc_find(sb, sel, 1);
      if (!p) {
        const char *tag = wbd_jstr(sel, "tag", NULL);
        fail = wbd_jint(sel, "pid", 0) <= 0 && tag
                 ? trailer_error("not_found", "process with tag %s not found", tag)
                 : trailer_error("not_found", "process with pid %lld not found", wbd_jint(sel, "pid", 0));
      }
    } else if (json_is_object(data)) {
      const char *code;
      char msg[256];
      if (!p)
        fail = trailer_error("failed_precondition", "a start event must come before data");
      else if (proc_input(p, json_object_get(data, "input"), &code, msg, sizeof msg) != 0)
        fail = trailer_error(code, "%s", msg);
    } else if (!json_object_get(m, "keepalive")) {
      fail = trailer_error("unimplemented", "invalid event type");
    }
    json_decref(m);
  }
  if (p) proc_unref(p);
  if (fail) return stream_fail(req, fail);
  struct wbd_buf out = {0};
  wbd_connect_frame(&out, 0, json_object());
  wbd_connect_frame(&out, 0x02, json_object());
  enum MHD_Result r = wbd_reply_raw(req, 200, "application/connect+json", out.data, out.len, NULL);
  wbd_buf_free(&out);
  return r;
}

enum MHD_Result wbd_process_rpc(struct wbd_req *req, struct wbd_sandbox *sb, const char *method, json_t *in) {
  if (strcmp(method, "List") == 0) {
    json_t *arr = json_array();
    pthread_mutex_lock(&procs_mu);
    for (struct proc *p = procs; p; p = p->next) {
      if (p->exited || strcmp(p->sbid, sb->id) != 0) continue;
      json_t *o =
        json_pack("{s:o,s:I}", "config", p->config ? json_incref(p->config) : json_object(), "pid", (json_int_t)p->pid);
      if (p->tag) json_object_set_new(o, "tag", json_string(p->tag));
      json_array_append_new(arr, o);
    }
    pthread_mutex_unlock(&procs_mu);
    json_t *res = json_object();
    if (json_array_size(arr))
      json_object_set_new(res, "processes", arr);
    else
      json_decref(arr);
    return wbd_rpc_ok(req, res);
  }
  int is_signal = strcmp(method, "SendSignal") == 0, is_close = strcmp(method, "CloseStdin") == 0,
      is_input = strcmp(method, "SendInput") == 0, is_update = strcmp(method, "Update") == 0;
  if (!is_signal && !is_close && !is_input && !is_update)
    return wbd_rpc_error(req, "unimplemented", "process.Process/%s is not implemented", method);
  json_t *sel = json_object_get(in, "process");
  struct proc *p = proc_find(sb, sel, 1);
  if (!p) return proc_not_found(req, sel);
  enum MHD_Result r;
  if (is_close) {
    pthread_mutex_lock(&p->in_mu);
    if (p->is_pty) {
      pthread_mutex_unlock(&p->in_mu);
      r = wbd_rpc_error(req, "unknown", "cannot close stdin for PTY process — send Ctrl+D (0x04) instead");
    } else {
      if (p->in_fd >= 0) close(p->in_fd);
      p->in_fd = -1;
      pthread_mutex_unlock(&p->in_mu);
      r = wbd_rpc_ok(req, NULL);
    }
  } else if (is_input) {
    const char *code;
    char msg[256];
    r = proc_input(p, json_object_get(in, "input"), &code, msg, sizeof msg) == 0 ? wbd_rpc_ok(req, NULL)
                                                                                 : wbd_rpc_error(req, code, "%s", msg);
  } else if (is_update) {
    json_t *pty = json_object_get(in, "pty");
    if (!json_is_object(pty)) {
      r = wbd_rpc_ok(req, NULL); /* nothing to change */
    } else if (!p->is_pty) {
      r = wbd_rpc_error(req, "internal", "error resizing tty: tty not assigned to process");
    } else {
      json_t *size = json_object_get(pty, "size");
      struct winsize ws = {.ws_row = (unsigned short)pty_dim(size, "rows"),
                           .ws_col = (unsigned short)pty_dim(size, "cols")};
      /* the master lives as long as p: the kernel signals SIGWINCH to the
       * terminal's foreground process group */
      r = ioctl(p->pty_fd, TIOCSWINSZ, &ws) == 0
            ? wbd_rpc_ok(req, NULL)
            : wbd_rpc_error(req, "internal", "error resizing tty: %s", strerror(errno));
    }
  } else {
    json_t *sv = json_object_get(in, "signal");
    int sig = 0;
    if (json_is_string(sv)) {
      const char *s = json_string_value(sv);
      if (strcmp(s, "SIGNAL_SIGKILL") == 0)
        sig = SIGKILL;
      else if (strcmp(s, "SIGNAL_SIGTERM") == 0)
        sig = SIGTERM;
    } else if (json_is_integer(sv)) {
      json_int_t n = json_integer_value(sv);
      if (n == SIGKILL || n == SIGTERM) sig = (int)n;
    }
    int rc = sig ? wbd_rt_signal(sb, p->pid, sig) : 0;
    if (!sig)
      r = wbd_rpc_error(req, "invalid_argument", "unsupported signal");
    else if (rc == -ESRCH)
      r = wbd_rpc_error(req, "not_found", "process with pid %d not found", (int)p->pid);
    else if (rc < 0)
      r = wbd_rpc_error(req, "internal", "signalling process %d: %s", (int)p->pid, strerror(-rc));
    else
      r = wbd_rpc_ok(req, NULL);
  }
  proc_unref(p);
  return r;
}

/* A streaming RPC that failed before streaming (envd.c's routing). */
enum MHD_Result wbd_envd_stream_error(struct wbd_req *req, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  json_t *e = wbd_connect_error_json(code, fmt, ap);
  va_end(ap);
  return stream_fail(req, json_pack("{s:o}", "error", e));
}
