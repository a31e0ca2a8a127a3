/*
 * interp.c: the code interpreter on port 49999, as E2B's code interpreter serves it.
 *
 * A context is a language, a cwd and, once used, a kernel: python/kernel.py
 * run as `/usr/bin/python3 -c <kernel.py> python|bash`, or embed/kernel.js
 * run by /usr/bin/node for javascript|typescript, inside the sandbox's
 * jail. The kernel reads one JSON request a line on its stdin and writes the
 * /execute NDJSON lines on its stdout, then {"type": "__wb_done__"}; a thread
 * per kernel reads them and hands them to the stream of the run in progress.
 *
 * A context runs one cell at a time. It is held from the moment a run starts
 * until both the stream is over (end_of_execution produced, or the client
 * gone) and the kernel said the cell is done, so that a run whose client went
 * away keeps the context until the interrupted cell has finished.
 */
#include "jail.h"
#include "interp.h"
#include "server.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

const unsigned char *wbd_embedded(const char *name, size_t *len);

#define KEEPALIVE_US (5 * 1000000LL)
/* Lines queued for one stream before the kernel's reader stops reading (the
 * kernel then blocks on its pipe: a slow client slows the cell down). */
#define QUEUE_MAX (1u << 20)
/* Longest kernel line kept (a result with a large image is one line); the
 * rest of a longer line is dropped. */
#define LINE_MAX_BYTES (16u << 20)
/* After an execute timeout's interrupt, how long the cell has to stop before
 * the kernel is restarted (WARMBOXD_INTERRUPT_GRACE_MS). */
#define GRACE_MS_DEFAULT 2000
#define END_LINE         "{\"type\": \"end_of_execution\"}\n"
#define DONE_MARK        "{\"type\": \"__wb_done__\"}"
#define DUMP_MARK        "{\"type\": \"__wb_dump__\""
/* How long a snapshot waits for the python kernel's namespace dump. */
#define DUMP_WAIT_S 30

struct line {
  struct line *next;
  size_t len;
  char data[];
};

struct ictx;

struct kern {
  int refs; /* under the interp lock */
  pid_t pid;
  int in_fd, out_fd;
  int dead;
  pthread_mutex_t wmu;  /* one writer at a time on in_fd */
  pthread_cond_t space; /* the stream took lines off its queue, or ended */
  struct ictx *ctx;     /* referenced */
  char *dump;           /* the last __wb_dump__ line (under the interp lock) */
};

struct run;

struct ictx {
  int refs;
  char id[40];
  char lang[16];
  char cwd[1024];
  int gone;        /* deleted, or the sandbox lost its memory */
  struct kern *k;  /* referenced; NULL until first used */
  int busy_kernel; /* busy_k still runs this run's cell */
  int busy_stream; /* this run's stream is not over */
  struct kern *busy_k;
  int busy_fenced;               /* busy_k's cell came with a fencing number ... */
  unsigned long long busy_fence; /* ... this one (X-Warmbox-Fence) */
  struct run *run;               /* the stream that gets the kernel's lines */
  pthread_cond_t cond;           /* the context became free, or gone */
  struct ictx *next;
};

struct istate {
  int init;
  struct ictx *ctxs; /* each referenced by the list */
  struct ictx *def_python, *def_bash, *def_js, *def_ts;
  char *restore; /* a load line for def_python's first kernel */
};

struct run {
  struct wbd_rt *rt;
  pthread_mutex_t *mu;
  struct wbd_sandbox *sb; /* referenced */
  struct ictx *ctx;       /* referenced */
  struct kern *k;         /* referenced */
  struct line *head, *tail;
  size_t queued; /* bytes in head..tail */
  int efd;
  struct MHD_Connection *conn; /* parked on while nothing is to be sent (wbd_park) */
  int conn_fd;
  int kernel_done, kernel_dead, aborted, finished, counted, error_seen, interrupted;
  int keep_cell; /* dropped by a pause: the cell goes on after resume */
  int restarted; /* the context was restarted under it */
  int timed_out; /* restarted because the cell outlived its timeout */
  long oom0;     /* the memory group's OOM kills when the run began, -1 */
  int64_t last_us, deadline_us;
  int fenced; /* the execute carried X-Warmbox-Fence: fence */
  unsigned long long fence;
  char *pend;
  size_t pend_len, pend_off;
};

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

static void notify(struct run *r) {
  uint64_t one = 1;
  if (r->efd >= 0 && write(r->efd, &one, sizeof one) < 0) {
  }
}

static enum MHD_Result reply_text(struct wbd_req *req, unsigned status, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
static enum MHD_Result reply_text(struct wbd_req *req, unsigned status, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
  return wbd_reply_raw(req, status, "text/plain; charset=utf-8", buf, (size_t)n, NULL);
}

static enum MHD_Result reply_detail(struct wbd_req *req, unsigned status, const char *detail) {
  return wbd_reply_json(req, status, json_pack("{s:s}", "detail", detail), NULL);
}

/* "python" / "bash" / "javascript" / "typescript", or NULL when warmboxd has
 * no such kernel. */
static const char *norm_lang(const char *in, char *buf, size_t len) {
  size_t i = 0;
  for (; in[i] && i + 1 < len; i++) buf[i] = (char)tolower((unsigned char)in[i]);
  buf[i] = 0;
  if (strcmp(buf, "python") == 0 || strcmp(buf, "python3") == 0) return "python";
  if (strcmp(buf, "bash") == 0) return "bash";
  if (strcmp(buf, "javascript") == 0 || strcmp(buf, "js") == 0) return "javascript";
  if (strcmp(buf, "typescript") == 0 || strcmp(buf, "ts") == 0) return "typescript";
  return NULL;
}

/* ------------------------------------------------------------------ */
/* State                                                               */
/* ------------------------------------------------------------------ */

static void kern_put_locked(struct kern *k);

static void ctx_put_locked(struct ictx *c) {
  /* A kernel holds a reference on its context, so c->k is NULL here. */
  if (--c->refs > 0) return;
  pthread_cond_destroy(&c->cond);
  free(c);
}

static void kern_put_locked(struct kern *k) {
  if (--k->refs > 0) return;
  if (k->in_fd >= 0) close(k->in_fd);
  pthread_mutex_destroy(&k->wmu);
  pthread_cond_destroy(&k->space);
  struct ictx *c = k->ctx;
  free(k->dump);
  free(k);
  if (c) ctx_put_locked(c);
}

/* Contexts a sandbox may have at once (the two defaults included; each is
 * a record, and a kernel once used): --max-contexts, wbd_opt.max_contexts. */

static size_t ctx_count_locked(const struct istate *ist) {
  size_t n = 0;
  for (const struct ictx *c = ist->ctxs; c; c = c->next) n++;
  return n;
}

static struct ictx *ctx_new_locked(struct istate *ist, const char *lang, const char *cwd) {
  struct ictx *c = calloc(1, sizeof *c);
  if (!c) abort();
  c->refs = 1; /* the list's */
  wbd_uuid4(c->id, sizeof c->id);
  snprintf(c->lang, sizeof c->lang, "%s", lang);
  snprintf(c->cwd, sizeof c->cwd, "%s", cwd && *cwd ? cwd : "/home/user");
  pthread_cond_init(&c->cond, NULL);
  c->next = ist->ctxs;
  ist->ctxs = c;
  return c;
}

static void interp_on_pause(struct wbd_rt *rt, int memory);
static void interp_free(void *slot);
static const struct wbd_rt_hooks interp_hooks = {interp_on_pause, interp_free};

/* Locks the sandbox's interpreter state, creating it (with the default
 * python context) when needed. */
static struct istate *ist_lock(struct wbd_rt *rt) {
  pthread_mutex_lock(wbd_rt_interp_mu(rt));
  void **slot = wbd_rt_interp_slot(rt);
  if (!*slot) {
    *slot = calloc(1, sizeof(struct istate));
    if (!*slot) abort();
    wbd_rt_set_hooks(rt, &interp_hooks);
  }
  struct istate *ist = *slot;
  if (!ist->init) {
    ist->init = 1;
    /* E2B's default contexts: python and javascript. */
    ist->def_python = ctx_new_locked(ist, "python", "/home/user");
    ist->def_js = ctx_new_locked(ist, "javascript", "/home/user");
  }
  return ist;
}

static void ist_unlock(struct wbd_rt *rt) {
  pthread_mutex_unlock(wbd_rt_interp_mu(rt));
}

static struct ictx *ctx_find_locked(struct istate *ist, const char *id) {
  for (struct ictx *c = ist->ctxs; c; c = c->next)
    if (strcmp(c->id, id) == 0) return c;
  return NULL;
}

/* Under the lock: forget a context (it stays alive while referenced). */
static struct kern *ctx_remove_locked(struct istate *ist, struct ictx *c) {
  for (struct ictx **pp = &ist->ctxs; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  if (ist->def_python == c) ist->def_python = NULL;
  if (ist->def_bash == c) ist->def_bash = NULL;
  if (ist->def_js == c) ist->def_js = NULL;
  if (ist->def_ts == c) ist->def_ts = NULL;
  c->gone = 1;
  if (c->run) {
    c->run->aborted = 1;
    notify(c->run);
  }
  pthread_cond_broadcast(&c->cond);
  struct kern *k = c->k;
  if (k) k->refs++; /* for the caller, to end it */
  ctx_put_locked(c);
  return k;
}

/* ------------------------------------------------------------------ */
/* Kernels                                                             */
/* ------------------------------------------------------------------ */

static void maybe_release_locked(struct ictx *c) {
  if (!c->busy_kernel && !c->busy_stream) pthread_cond_broadcast(&c->cond);
}

/* The kernel finished (or lost) the cell it was running. */
static void kern_cell_over_locked(struct ictx *c, struct kern *k, int dead) {
  if (c->busy_k != k || !c->busy_kernel) return;
  c->busy_kernel = 0;
  c->busy_k = NULL;
  c->busy_fenced = 0;
  if (c->run && c->run->k == k) {
    if (dead)
      c->run->kernel_dead = 1;
    else
      c->run->kernel_done = 1;
    notify(c->run);
  }
  maybe_release_locked(c);
}

static int kern_write(struct kern *k, const char *s, size_t n) {
  pthread_mutex_lock(&k->wmu);
  int rc = 0;
  size_t off = 0;
  int waited = 0;
  while (off < n) {
    ssize_t w = write(k->in_fd, s + off, n - off);
    if (w > 0) {
      off += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN && waited < 30000) {
      struct pollfd p = {k->in_fd, POLLOUT, 0};
      poll(&p, 1, 100);
      waited += 100;
      continue;
    }
    rc = -1;
    break;
  }
  pthread_mutex_unlock(&k->wmu);
  return rc;
}

static void kern_interrupt(struct kern *k) {
  static const char msg[] = "{\"op\": \"interrupt\"}\n";
  kern_write(k, msg, sizeof msg - 1);
}

struct kthread {
  struct wbd_rt *rt;
  struct kern *k;
};

static void *kern_thread(void *arg) {
  struct kthread *kt = arg;
  struct wbd_rt *rt = kt->rt;
  struct kern *k = kt->k;
  free(kt);
  pthread_mutex_t *mu = wbd_rt_interp_mu(rt);
  size_t cap = 65536, len = 0, scanned = 0;
  int skipping = 0; /* inside a line longer than LINE_MAX_BYTES */
  char *buf = malloc(cap);
  if (!buf) abort();
  for (;;) {
    if (len == cap) {
      /* Never beyond the longest line kept plus one read. */
      cap = cap * 2 < LINE_MAX_BYTES + 65536 ? cap * 2 : LINE_MAX_BYTES + 65536;
      char *nb = realloc(buf, cap);
      if (!nb) abort();
      buf = nb;
    }
    ssize_t r = read(k->out_fd, buf + len, cap - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    len += (size_t)r;
    size_t start = 0;
    pthread_mutex_lock(mu);
    for (;;) {
      /* Only the new bytes are searched: a long line costs linear time. */
      char *nl = memchr(buf + scanned, '\n', len - scanned);
      if (!nl) {
        scanned = len;
        break;
      }
      size_t n = (size_t)(nl - (buf + start)) + 1;
      const char *s = buf + start;
      scanned = start + n;
      struct ictx *c = k->ctx;
      if (skipping) {
        skipping = 0;
      } else if (n - 1 == strlen(DONE_MARK) && memcmp(s, DONE_MARK, n - 1) == 0) {
        kern_cell_over_locked(c, k, 0);
      } else if (n > strlen(DUMP_MARK) && memcmp(s, DUMP_MARK, strlen(DUMP_MARK)) == 0) {
        free(k->dump);
        k->dump = strndup(s, n);
        if (!k->dump) abort();
        pthread_cond_broadcast(&c->cond);
      } else if (c->run && c->run->k == k && !c->run->finished && c->busy_k == k) {
        struct line *l = malloc(sizeof *l + n);
        if (!l) abort();
        l->next = NULL;
        l->len = n;
        memcpy(l->data, s, n);
        struct run *rn = c->run;
        if (rn->tail)
          rn->tail->next = l;
        else
          rn->head = l;
        rn->tail = l;
        rn->queued += n;
        notify(rn);
        /* Backpressure: wait for the client to take some. */
        while (c->run == rn && !rn->finished && rn->queued > QUEUE_MAX) pthread_cond_wait(&k->space, mu);
      }
      start += n;
    }
    pthread_mutex_unlock(mu);
    /* Still inside an overlong line: what came is dropped as it comes. */
    if (skipping) len = scanned = start;
    memmove(buf, buf + start, len - start);
    len -= start;
    scanned -= start;
    if (len > LINE_MAX_BYTES) {
      /* Drop the rest of an overlong line. */
      if (!skipping) wbd_stat_add("kernel_line_dropped", 1);
      skipping = 1;
      len = scanned = 0;
    }
    if (cap > 65536 && len < cap / 4) {
      /* Give back what a long line took. */
      size_t ncap = len < 65536 ? 65536 : len * 2;
      char *nb = realloc(buf, ncap);
      if (nb) {
        buf = nb;
        cap = ncap;
      }
    }
  }
  free(buf);
  pthread_mutex_lock(mu);
  k->dead = 1;
  pthread_cond_broadcast(&k->ctx->cond); /* a dump waiting for it (wbd_interp_dump) */
  kern_cell_over_locked(k->ctx, k, 1);
  if (k->ctx->k == k) {
    k->ctx->k = NULL;
    kern_put_locked(k); /* the context's reference */
  }
  pthread_mutex_unlock(mu);
  close(k->out_fd);
  int st = wbd_rt_wait_rt(rt, k->pid);
  if (wbd_opt.verbose) fprintf(stderr, "warmboxd: kernel %d exited (status %d)\n", (int)k->pid, st);
  pthread_mutex_lock(mu);
  kern_put_locked(k); /* the thread's */
  pthread_mutex_unlock(mu);
  wbd_rt_put(rt);
  return NULL;
}

/* Under the lock: give the context a running kernel. */
static int kern_start_locked(struct wbd_rt *rt, struct ictx *c, char *err, size_t errlen) {
  size_t len = 0;
  int js = strcmp(c->lang, "javascript") == 0 || strcmp(c->lang, "typescript") == 0;
  const char *file = js ? "kernel.js" : "kernel.py";
  const unsigned char *src = wbd_embedded(file, &len);
  if (!src) {
    snprintf(err, errlen, "%s is not embedded", file);
    return -1;
  }
  /* A python kernel also gets charts.py, its e2b/chart formatter. */
  size_t clen = 0;
  const unsigned char *charts = strcmp(c->lang, "python") == 0 ? wbd_embedded("charts.py", &clen) : NULL;
  char *py_argv[] = {"/usr/bin/python3", "-c", (char *)(uintptr_t)src, c->lang, (char *)(uintptr_t)charts, NULL};
  /* node cannot move its own fds aside: the shell gives it the control pipe
   * as fd 3, the event pipe as fd 4 and /dev/null as fds 0-2 (kernel.js). */
  char *js_argv[] = {
    "/bin/sh", "-c", "exec /usr/bin/node -e \"$0\" \"$1\" 3<&0 4>&1 </dev/null >&2", (char *)(uintptr_t)src,
    c->lang,   NULL};
  char **argv = js ? js_argv : py_argv;
  json_t *envs = json_object();
  json_object_set_new(envs, "PYTHONDONTWRITEBYTECODE", json_string("1"));
  if (wbd_rt_isolated()) {
    /* Keep IPython's and matplotlib's caches out of the user's home. */
    json_object_set_new(envs, "IPYTHONDIR", json_string("/tmp/.ipython"));
    json_object_set_new(envs, "MPLCONFIGDIR", json_string("/tmp/.config/matplotlib"));
  }
  pid_t pid = 0;
  int in = -1, out = -1;
  /* stderr: /dev/null (kernel.py reports cell output on stdout). */
  int rc = wbd_rt_spawn_rt(rt, argv, envs, c->cwd, 0, &pid, &in, &out, NULL);
  json_decref(envs);
  if (rc) {
    snprintf(err, errlen, "%s", strerror(-rc));
    return -1;
  }
  fcntl(in, F_SETFL, fcntl(in, F_GETFL) | O_NONBLOCK);
  struct kern *k = calloc(1, sizeof *k);
  if (!k) abort();
  k->refs = 2; /* the context's and the thread's */
  k->pid = pid;
  k->in_fd = in;
  k->out_fd = out;
  pthread_mutex_init(&k->wmu, NULL);
  pthread_cond_init(&k->space, NULL);
  k->ctx = c;
  c->refs++;
  c->k = k;
  struct kthread *kt = malloc(sizeof *kt);
  if (!kt) abort();
  kt->rt = rt;
  kt->k = k;
  wbd_rt_ref(rt);
  pthread_t th;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&th, &at, kern_thread, kt) != 0) {
    pthread_attr_destroy(&at);
    /* Without its reader the kernel is useless: end it. */
    wbd_rt_signal_rt(rt, pid, SIGKILL);
    close(out);
    c->k = NULL;
    k->refs = 1;
    kern_put_locked(k);
    free(kt);
    wbd_rt_put(rt);
    pthread_mutex_unlock(wbd_rt_interp_mu(rt));
    wbd_rt_wait_rt(rt, pid);
    pthread_mutex_lock(wbd_rt_interp_mu(rt));
    snprintf(err, errlen, "cannot start a thread");
    return -1;
  }
  pthread_attr_destroy(&at);
  struct istate *ist = *wbd_rt_interp_slot(rt);
  if (c == ist->def_python && ist->restore) {
    kern_write(k, ist->restore, strlen(ist->restore));
    free(ist->restore);
    ist->restore = NULL;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* Hooks given to runtime.c (wbd_rt_set_hooks)                       */
/* ------------------------------------------------------------------ */

static void interp_on_pause(struct wbd_rt *rt, int memory) {
  pthread_mutex_lock(wbd_rt_interp_mu(rt));
  struct istate *ist = *wbd_rt_interp_slot(rt);
  if (!ist) {
    pthread_mutex_unlock(wbd_rt_interp_mu(rt));
    return;
  }
  if (memory) {
    /* Outside connections do not survive a pause; the cells do. */
    for (struct ictx *c = ist->ctxs; c; c = c->next)
      if (c->run) {
        c->run->aborted = 1;
        c->run->keep_cell = 1;
        notify(c->run);
      }
  } else {
    while (ist->ctxs) {
      struct kern *k = ctx_remove_locked(ist, ist->ctxs);
      if (k) kern_put_locked(k); /* runtime.c ends every process next */
    }
    ist->init = 0;
    free(ist->restore); /* a namespace not loaded yet is memory too */
    ist->restore = NULL;
  }
  pthread_mutex_unlock(wbd_rt_interp_mu(rt));
}

static void interp_free(void *slot) {
  struct istate *ist = slot;
  if (!ist) return;
  /* Called when nothing references the runtime any more: no kernel thread,
   * no stream. What is left are unused contexts. */
  while (ist->ctxs) {
    struct ictx *c = ist->ctxs;
    ist->ctxs = c->next;
    ctx_put_locked(c);
  }
  free(ist->restore);
  free(ist);
}

/* ------------------------------------------------------------------ */
/* Snapshots: the default python context's user namespace (state.h)    */
/* ------------------------------------------------------------------ */

static char *dump_failed(const char *why) {
  json_t *o = json_pack("{s:s, s:n, s:{s:s}}", "type", "__wb_dump__", "data", "unrestored", "*", why);
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return s;
}

/* Under the lock: wait (until deadline) for the context to be free, ask
 * its kernel for a dump and wait for it. */
static char *dump_locked(struct wbd_rt *rt, struct ictx *c) {
  static const char op[] = "{\"op\": \"dump\"}\n";
  pthread_mutex_t *mu = wbd_rt_interp_mu(rt);
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += DUMP_WAIT_S;
  int rc = 0;
  while ((c->busy_kernel || c->busy_stream) && !c->gone && rc == 0) rc = pthread_cond_timedwait(&c->cond, mu, &dl);
  struct kern *k = c->k;
  if (rc != 0 || c->gone || !k || k->dead) return k || rc ? dump_failed("the python kernel was busy or gone") : NULL;
  k->refs++;
  free(k->dump);
  k->dump = NULL;
  if (kern_write(k, op, sizeof op - 1) != 0) rc = -1;
  while (rc == 0 && !k->dump && !k->dead) rc = pthread_cond_timedwait(&c->cond, mu, &dl);
  char *out = k->dump;
  k->dump = NULL;
  kern_put_locked(k);
  return out ? out : dump_failed("the python kernel did not answer the dump");
}

char *wbd_interp_dump(struct wbd_sandbox *sb) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return NULL;
  pthread_mutex_lock(wbd_rt_interp_mu(rt));
  struct istate *ist = *wbd_rt_interp_slot(rt);
  struct ictx *c = ist && ist->init ? ist->def_python : NULL;
  char *out = NULL;
  if (c) {
    c->refs++;
    out = dump_locked(rt, c);
    ctx_put_locked(c);
  }
  pthread_mutex_unlock(wbd_rt_interp_mu(rt));
  wbd_rt_put(rt);
  return out;
}

void wbd_interp_restore(struct wbd_sandbox *sb, json_t *dump) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return;
  json_t *o = json_deep_copy(dump);
  json_object_set_new(o, "op", json_string("load"));
  json_object_del(o, "type");
  char *line = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  struct istate *ist = ist_lock(rt);
  size_t n = line ? strlen(line) : 0;
  char *l = line ? realloc(line, n + 2) : NULL;
  if (l) memcpy(l + n, "\n", 2);
  free(ist->restore);
  ist->restore = l;
  ist_unlock(rt);
  wbd_rt_put(rt);
}

/* ------------------------------------------------------------------ */
/* /execute                                                            */
/* ------------------------------------------------------------------ */

static void kern_end(struct wbd_rt *rt, struct kern *k);

static int64_t grace_us(void) {
  static int64_t g = -1;
  if (g < 0) {
    const char *e = getenv("WARMBOXD_INTERRUPT_GRACE_MS");
    long ms = e ? atol(e) : GRACE_MS_DEFAULT;
    g = (ms > 0 ? ms : GRACE_MS_DEFAULT) * 1000LL;
  }
  return g;
}

/* Under the lock: the stream is over (end produced, or the client gone).
 * Returns 1 when the kernel should be interrupted. */
static int run_finish_locked(struct run *r) {
  if (r->finished) return 0;
  r->finished = 1;
  struct ictx *c = r->ctx;
  if (c->run == r) c->run = NULL;
  c->busy_stream = 0;
  int interrupt = c->busy_kernel && c->busy_k == r->k && !r->keep_cell;
  pthread_cond_broadcast(&r->k->space);
  maybe_release_locked(c);
  if (r->counted) {
    r->counted = 0;
    wbd_store_lock();
    if (r->sb->runs_in_flight > 0) r->sb->runs_in_flight--;
    wbd_store_unlock();
  }
  return interrupt;
}

static void run_set_pend(struct run *r, char *s, size_t n) {
  free(r->pend);
  r->pend = s;
  r->pend_len = n;
  r->pend_off = 0;
}

/* Copies what is left of the pending bytes to the client's buffer. */
static ssize_t run_give(struct run *r, char *buf, size_t max) {
  size_t n = r->pend_len - r->pend_off;
  if (n > max) n = max;
  memcpy(buf, r->pend + r->pend_off, n);
  r->pend_off += n;
  return (ssize_t)n;
}

/* Under the lock: takes the oldest line the kernel queued, waking the
 * kernel's reader when the queue drained to half. */
static struct line *run_pop_locked(struct run *r) {
  struct line *l = r->head;
  r->head = l->next;
  if (!r->head) r->tail = NULL;
  r->queued -= l->len;
  if (r->queued <= QUEUE_MAX / 2) pthread_cond_broadcast(&r->k->space);
  return l;
}

/* A kernel line becomes the pending bytes (an error among them is noted:
 * then the stream's end adds none of its own). */
static void run_pend_line(struct run *r, struct line *l) {
  if (!r->error_seen && strncmp(l->data, "{\"type\": \"error\"", 16) == 0) r->error_seen = 1;
  char *s = malloc(l->len);
  if (!s) abort();
  memcpy(s, l->data, l->len);
  run_set_pend(r, s, l->len);
  free(l);
  r->last_us = wbd_now_us();
}

/* The stream's last bytes once the kernel is done with the cell, or died
 * under it (`dead`) without an error of the cell's own: an error that says
 * why (the sandbox's memory limit, the cell's timeout, a restart of the
 * context, an end without one), then END_LINE. */
static void run_pend_end(struct run *r, int dead) {
  const char *err = "";
  char oom[320];
  long kills = dead && !r->error_seen && !r->timed_out && r->oom0 >= 0 ? wbd_rt_oom_kills(r->rt) : -1;
  if (kills > r->oom0) {
    snprintf(oom, sizeof oom,
             "{\"type\": \"error\", \"name\": \"OutOfMemoryError\", \"value\": \"The sandbox "
             "reached its memory limit (%ld MB): the context's kernel was killed and its state was lost\", "
             "\"traceback\": \"\"}\n",
             wbd_rt_memory_mb(r->rt));
    err = oom;
  } else if (dead && !r->error_seen && r->timed_out)
    err =
      "{\"type\": \"error\", \"name\": \"TimeoutError\", \"value\": \"The cell did not stop after its "
      "timeout was reached: the context's kernel was restarted and its state was lost\", \"traceback\": \"\"}\n";
  else if (dead && !r->error_seen)
    err = r->restarted ? "{\"type\": \"error\", \"name\": \"ContextRestarting\", \"value\": \"Context was restarted\", "
                         "\"traceback\": \"\"}\n"
                       : "{\"type\": \"error\", \"name\": \"UnexpectedEndOfExecution\", \"value\": \"Connection to the "
                         "execution was closed before the execution was finished\", \"traceback\": \"\"}\n";
  size_t n = strlen(err) + strlen(END_LINE);
  char *s = malloc(n + 1);
  if (!s) abort();
  snprintf(s, n + 1, "%s%s", err, END_LINE);
  run_set_pend(r, s, n);
}

/* When the stream must look again without news: the next keepalive, the
 * cell's timeout, or the end of the grace an interrupted cell has. */
static int64_t run_wake_at(struct run *r) {
  int64_t wake = r->last_us + KEEPALIVE_US;
  if (r->deadline_us && !r->interrupted && r->deadline_us < wake) wake = r->deadline_us;
  int64_t hard = r->deadline_us + grace_us();
  if (r->deadline_us && r->interrupted && !r->timed_out && hard < wake) wake = hard;
  return wake;
}

/* The cell's timeout: at the deadline the kernel is interrupted; a cell
 * that ignores it for grace_us() has its kernel restarted (as
 * /contexts/{id}/restart does), and the stream ends with the error. */
static void run_enforce_timeout(struct run *r, int64_t now) {
  if (r->deadline_us && !r->interrupted && now >= r->deadline_us) {
    r->interrupted = 1;
    kern_interrupt(r->k);
  }
  if (r->deadline_us && r->interrupted && !r->timed_out && now >= r->deadline_us + grace_us()) {
    r->timed_out = 1;
    pthread_mutex_lock(r->mu);
    struct kern *k = NULL;
    if (r->ctx->k == r->k && !r->finished) {
      k = r->k;
      r->ctx->k = NULL;
      r->restarted = 1;
    }
    pthread_mutex_unlock(r->mu);
    if (k) kern_end(r->rt, k);
    wbd_stat_add("exec_timeout_restart", 1);
  }
}

/* Nothing to send and the cell not over: parks the stream until the
 * kernel (the eventfd), the client (its socket) or the next timer wakes
 * it; once woken, notes a client that left (the run is aborted), enforces
 * the cell's timeout and queues a keepalive when one is due. 1: look
 * again; 0: parked (the reader answers 0); -1: it could not park. */
static int run_idle(struct run *r) {
  int64_t now = wbd_now_us();
  int64_t wake = run_wake_at(r);
  int64_t ms = (wake - now) / 1000;
  if (ms < 0) ms = 0;
  struct pollfd p[2] = {{r->efd, POLLIN, 0}, {r->conn_fd, POLLRDHUP, 0}};
  int np = r->conn_fd >= 0 ? 2 : 1;
  int pr = poll(p, (nfds_t)np, 0);
  if (pr < 0 && errno != EINTR) pr = 0;
  if (pr <= 0 && wake > now) return wbd_park(r->conn, r->efd, r->conn_fd, (int)(ms + 1)) == 0 ? 0 : -1;
  if (pr > 0 && (p[0].revents & POLLIN)) {
    uint64_t v;
    if (read(r->efd, &v, sizeof v) < 0) {
    }
  }
  if (np == 2 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
    /* The client went away: stop the cell, drop the stream. */
    pthread_mutex_lock(r->mu);
    r->aborted = 1;
    pthread_mutex_unlock(r->mu);
    return 1;
  }
  now = wbd_now_us();
  run_enforce_timeout(r, now);
  if (now >= r->last_us + KEEPALIVE_US) {
    static const char ka[] = "{\"type\": \"keepalive\"}\n";
    char *s = malloc(sizeof ka);
    if (!s) abort();
    memcpy(s, ka, sizeof ka);
    run_set_pend(r, s, sizeof ka - 1);
    r->last_us = now;
  }
  return 1;
}

/* The stream's reader: the pending bytes, then the kernel's next line, the
 * end (when the kernel is done or dead), an error end (aborted), or a wait. */
static ssize_t run_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  struct run *r = cls;
  for (;;) {
    if (r->pend && r->pend_off < r->pend_len) return run_give(r, buf, max);
    if (r->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    pthread_mutex_lock(r->mu);
    if (r->head) {
      struct line *l = run_pop_locked(r);
      pthread_mutex_unlock(r->mu);
      run_pend_line(r, l);
      continue;
    }
    if (r->aborted) {
      int intr = run_finish_locked(r);
      pthread_mutex_unlock(r->mu);
      if (intr) kern_interrupt(r->k);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (r->kernel_done || r->kernel_dead) {
      int dead = r->kernel_dead && !r->kernel_done;
      run_finish_locked(r);
      pthread_mutex_unlock(r->mu);
      run_pend_end(r, dead);
      continue;
    }
    pthread_mutex_unlock(r->mu);
    int w = run_idle(r);
    if (w <= 0) return w == 0 ? 0 : MHD_CONTENT_READER_END_WITH_ERROR;
  }
}

static void run_done(void *cls) {
  struct run *r = cls;
  pthread_mutex_lock(r->mu);
  int intr = run_finish_locked(r);
  pthread_mutex_unlock(r->mu);
  if (intr) kern_interrupt(r->k);
  pthread_mutex_lock(r->mu);
  while (r->head) {
    struct line *l = r->head;
    r->head = l->next;
    free(l);
  }
  kern_put_locked(r->k);
  ctx_put_locked(r->ctx);
  pthread_mutex_unlock(r->mu);
  free(r->pend);
  if (r->efd >= 0) close(r->efd);
  wbd_sandbox_unref(r->sb);
  wbd_rt_put(r->rt);
  free(r);
}

static enum MHD_Result sandbox_gone(struct wbd_req *req, struct wbd_sandbox *sb) {
  return wbd_reply_json(
    req, 502, json_pack("{s:s,s:s,s:i}", "sandboxId", sb->id, "message", "The sandbox was not found", "code", 502),
    NULL);
}

static enum MHD_Result unprocessable(struct wbd_req *req, const char *type, const char *field, const char *msg) {
  json_t *d = json_pack("{s:[{s:s,s:[s,s],s:s}]}", "detail", "type", type, "loc", "body", field, "msg", msg);
  return wbd_reply_json(req, 422, d, NULL);
}

/* The client closed its side (or the connection broke). */
static int client_gone(struct wbd_req *req) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return 0;
  struct pollfd p = {ci->connect_fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* An /execute request's fields (pointers into body, which the caller
 * frees); ctx_id and lang NULL when absent or empty, as the server's
 * truthiness tests have them. */
struct exec_req {
  json_t *body, *code, *env, *timeout;
  const char *ctx_id, *lang;
  int fenced; /* X-Warmbox-Fence (warmbox's own header; E2B ignores it) */
  unsigned long long fence;
};

/* X-Warmbox-Fence: the run's fencing number (a conversation's lock counts
 * them up: a later holder's is higher). 0 absent, 1 read, -1 malformed. */
static int exec_fence(struct wbd_req *req, unsigned long long *fence) {
  const char *h = wbd_req_header(req, "X-Warmbox-Fence");
  if (!h) return 0;
  if (!*h || strlen(h) > 19 || strspn(h, "0123456789") != strlen(h)) return -1;
  *fence = strtoull(h, NULL, 10);
  return 1;
}

/* Parses and checks the body as the code interpreter's server does (422
 * with its detail; 400 for both context_id and language). 0, or -1 after
 * replying (*m), the body freed. */
static int exec_parse(struct wbd_req *req, struct exec_req *e, enum MHD_Result *m) {
  json_error_t jerr;
  json_t *body = req->body_len ? json_loadb(req->body, req->body_len, 0, &jerr) : NULL;
  if (!json_is_object(body)) {
    json_decref(body);
    *m = unprocessable(req, "json_invalid", "body", "JSON decode error");
    return -1;
  }
  json_t *code = json_object_get(body, "code");
  if (!json_is_string(code)) {
    *m = code ? unprocessable(req, "string_type", "code", "Input should be a valid string")
              : unprocessable(req, "missing", "code", "Field required");
    json_decref(body);
    return -1;
  }
  json_t *jctx = json_object_get(body, "context_id");
  json_t *jlang = json_object_get(body, "language");
  json_t *jenv = json_object_get(body, "env_vars");
  if ((jctx && !json_is_null(jctx) && !json_is_string(jctx)) ||
      (jlang && !json_is_null(jlang) && !json_is_string(jlang)) ||
      (jenv && !json_is_null(jenv) && !json_is_object(jenv))) {
    json_decref(body);
    *m = unprocessable(req, "type_error", "body", "Input should be a valid string or object");
    return -1;
  }
  unsigned long long fence = 0;
  int fenced = exec_fence(req, &fence);
  if (fenced < 0) {
    json_decref(body);
    *m = reply_text(req, 400, "X-Warmbox-Fence must be a decimal number");
    return -1;
  }
  *e = (struct exec_req){.body = body,
                         .code = code,
                         .env = jenv,
                         .timeout = json_object_get(body, "timeout"),
                         .ctx_id = json_string_value(jctx),
                         .lang = json_string_value(jlang),
                         .fenced = fenced,
                         .fence = fence};
  if (e->ctx_id && !*e->ctx_id) e->ctx_id = NULL;
  if (e->lang && !*e->lang) e->lang = NULL;
  if (e->ctx_id && e->lang) {
    json_decref(body);
    *m = reply_text(req, 400, "Only one of context_id or language can be provided");
    return -1;
  }
  return 0;
}

/* Leaves the interpreter on the way to an error reply: c's reference (when
 * not NULL), the lock and rt released. */
static void exec_leave_locked(struct wbd_rt *rt, struct ictx *c) {
  if (c) ctx_put_locked(c);
  ist_unlock(rt);
  wbd_rt_put(rt);
}

/* Under the lock: the context the request names, or its language's
 * default (made on first use). NULL after leaving (exec_leave_locked) and
 * replying (*m). */
static struct ictx *exec_context_locked(struct wbd_req *req, struct wbd_rt *rt, struct istate *ist,
                                        const struct exec_req *e, enum MHD_Result *m) {
  if (e->ctx_id) {
    struct ictx *c = ctx_find_locked(ist, e->ctx_id);
    if (!c) {
      exec_leave_locked(rt, NULL);
      *m = reply_text(req, 404, "Context %s not found", e->ctx_id);
    }
    return c;
  }
  char lbuf[32];
  const char *lang = norm_lang(e->lang ? e->lang : "python", lbuf, sizeof lbuf);
  if (!lang) {
    exec_leave_locked(rt, NULL);
    *m = reply_text(req, 500,
                    "Failed to create context: warmboxd has no %s kernel (python, bash, javascript, typescript)", lbuf);
    return NULL;
  }
  struct ictx **def = strcmp(lang, "bash") == 0         ? &ist->def_bash
                      : strcmp(lang, "javascript") == 0 ? &ist->def_js
                      : strcmp(lang, "typescript") == 0 ? &ist->def_ts
                                                        : &ist->def_python;
  if (!*def) *def = ctx_new_locked(ist, lang, "/home/user");
  return *def;
}

/* Under the lock: another context of the sandbox whose kernel still runs a
 * cell of another fenced run than e's (an older holder's cell goes on after
 * its lock was lost), else NULL. */
static struct ictx *fenced_elsewhere_locked(struct istate *ist, const struct ictx *c, const struct exec_req *e) {
  if (!e->fenced) return NULL;
  for (struct ictx *o = ist->ctxs; o; o = o->next)
    if (o != c && o->busy_kernel && o->busy_fenced && o->busy_fence != e->fence) return o;
  return NULL;
}

/* How long a fenced execute waits for another run's cell in another context
 * (the execute's own timeout, else E2B's default 300 s), in µs. */
static int64_t fence_wait_us(const struct exec_req *e) {
  double t = json_is_number(e->timeout) ? json_number_value(e->timeout) : 0;
  return (int64_t)((t > 0 && t < 31536000 ? t : 300) * 1e6);
}

/* Under the lock, c referenced: waits for the context to be free and, for a
 * fenced execute, for every other context's cell of another fenced run to be
 * over: two runs of one conversation never execute at once, in any of the
 * sandbox's kernels (one context runs one cell at a time already). 0; or -1
 * after leaving and replying (*m): 409 when the other cell outlived the wait
 * (this cell is not started), MHD_NO when the client left. */
static int exec_wait_free_locked(struct wbd_req *req, struct wbd_rt *rt, struct istate *ist, struct ictx *c,
                                 const struct exec_req *e, enum MHD_Result *m) {
  pthread_mutex_t *mu = wbd_rt_interp_mu(rt);
  int64_t until = wbd_now_us() + fence_wait_us(e);
  int waited = 0;
  for (;;) {
    while ((c->busy_kernel || c->busy_stream) && !c->gone) pthread_cond_wait(&c->cond, mu);
    struct ictx *o = c->gone ? NULL : fenced_elsewhere_locked(ist, c, e);
    if (!o) return 0;
    if (!waited++) wbd_stat_add("exec_fence_waited", 1);
    if (client_gone(req)) return 0; /* exec_ready_locked replies */
    if (wbd_now_us() >= until) {
      unsigned long long other = o->busy_fence;
      char oid[sizeof o->id];
      snprintf(oid, sizeof oid, "%s", o->id);
      exec_leave_locked(rt, c);
      wbd_stat_add("exec_fence_refused", 1);
      *m = reply_text(req, 409,
                      "Conflict: run %llu's cell still executes in context %s of this sandbox; the cell "
                      "of run %llu was not started",
                      other, oid, e->fence);
      return -1;
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 50 * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&c->cond, mu, &dl);
  }
}

/* Under the lock, c referenced: waits for the context to be free and
 * makes sure it has a live kernel. 0; or -1 after leaving and replying
 * (*m): the context went away, or its kernel would not start; or the
 * client left while it waited (MHD_NO: the cell is never started). */
static int exec_ready_locked(struct wbd_req *req, struct wbd_rt *rt, struct istate *ist, struct ictx *c,
                             const struct exec_req *e, enum MHD_Result *m) {
  if (exec_wait_free_locked(req, rt, ist, c, e, m) != 0) return -1;
  if (!c->gone && client_gone(req)) {
    exec_leave_locked(rt, c);
    wbd_stat_add("exec_client_gone", 1);
    *m = MHD_NO;
    return -1;
  }
  if (c->gone) {
    exec_leave_locked(rt, c);
    *m = e->ctx_id ? reply_text(req, 404, "Context %s not found", e->ctx_id)
                   : reply_text(req, 500, "Failed to create context: the sandbox restarted");
    return -1;
  }
  if (c->k && !c->k->dead) return 0;
  char err[256], lang[sizeof c->lang];
  if (kern_start_locked(rt, c, err, sizeof err) == 0) return 0;
  snprintf(lang, sizeof lang, "%s", c->lang); /* c may go once its reference is dropped */
  exec_leave_locked(rt, c);
  *m = reply_text(req, 500, "Failed to start the %s kernel: %s", lang, err);
  return -1;
}

/* Under the lock: a run of c's kernel for sandbox sb, holding its own
 * references (the sandbox's record, c, the kernel; rt and c's reference
 * are the caller's, handed over). NULL, with nothing taken, when the
 * sandbox's record is gone. */
static struct run *run_new_locked(struct wbd_rt *rt, struct ictx *c, struct wbd_sandbox *sb) {
  struct run *r = calloc(1, sizeof *r);
  if (!r) abort();
  r->rt = rt;
  r->mu = wbd_rt_interp_mu(rt);
  r->ctx = c;
  r->k = c->k;
  r->k->refs++;
  r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  r->conn_fd = -1;
  r->oom0 = wbd_rt_oom_kills(rt);
  r->sb = wbd_sandbox_get(sb->id);
  if (!r->sb) {
    kern_put_locked(r->k);
    if (r->efd >= 0) close(r->efd);
    free(r);
    return NULL;
  }
  return r;
}

/* Under the lock: the run holds its context (busy until the kernel is done
 * with the cell and the stream is over). 1 when another context's kernel
 * was still running a cell: two cells of a sandbox at once (other contexts
 * included) are what the session layer must never let happen. */
static int run_begin_locked(struct run *r, struct istate *ist) {
  struct ictx *c = r->ctx;
  /* Two cells at once: another context's kernel still runs a cell (a
   * stream whose cell ended but whose client has not read its end yet is
   * not an execution). */
  int overlap = 0;
  for (struct ictx *o = ist->ctxs; o; o = o->next)
    if (o != c && o->busy_kernel) overlap = 1;
  c->run = r;
  c->busy_kernel = 1;
  c->busy_stream = 1;
  c->busy_k = r->k;
  c->busy_fenced = r->fenced;
  c->busy_fence = r->fence;
  return overlap;
}

/* Sends the cell to the kernel (code, env_vars) and sets its deadline from
 * the request's timeout (seconds, saturated at a year); a write that fails
 * ends the cell as a dead kernel's would. */
static void run_send(struct run *r, const struct exec_req *e) {
  json_t *msg = json_pack("{s:s,s:O,s:o}", "op", "exec", "code", e->code, "env",
                          json_is_object(e->env) ? json_incref(e->env) : json_object());
  char *s = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
  json_decref(msg);
  json_t *jto = e->timeout;
  if (json_is_number(jto) && json_number_value(jto) > 0)
    r->deadline_us =
      wbd_now_us() + (int64_t)(json_number_value(jto) < 31536000 ? json_number_value(jto) * 1e6 : 31536000e6);
  int bad = !s;
  if (s) {
    size_t n = strlen(s);
    char *line = malloc(n + 2);
    if (!line) abort();
    memcpy(line, s, n);
    line[n] = '\n';
    line[n + 1] = 0;
    free(s);
    bad = kern_write(r->k, line, n + 1) != 0;
    free(line);
  }
  if (bad) {
    pthread_mutex_lock(r->mu);
    kern_cell_over_locked(r->ctx, r->k, 1);
    pthread_mutex_unlock(r->mu);
  }
}

/* POST /execute: parse, find the context and wait for it, start the run,
 * send the cell, stream the kernel's lines (run_read). */
static enum MHD_Result handle_execute(struct wbd_req *req, struct wbd_sandbox *sb) {
  struct exec_req e;
  enum MHD_Result m = MHD_NO;
  if (exec_parse(req, &e, &m) != 0) return m;
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) {
    json_decref(e.body);
    return sandbox_gone(req, sb);
  }
  struct istate *ist = ist_lock(rt);
  struct ictx *c = exec_context_locked(req, rt, ist, &e, &m);
  if (!c) {
    json_decref(e.body);
    return m;
  }
  c->refs++;
  if (exec_ready_locked(req, rt, ist, c, &e, &m) != 0) {
    json_decref(e.body);
    return m;
  }
  struct run *r = run_new_locked(rt, c, sb);
  if (!r) {
    exec_leave_locked(rt, c);
    json_decref(e.body);
    return sandbox_gone(req, sb);
  }
  r->fenced = e.fenced;
  r->fence = e.fence;
  int overlap = run_begin_locked(r, ist);
  ist_unlock(rt);
  if (overlap) wbd_stat_add("exec_overlap", 1);
  wbd_store_lock();
  r->sb->runs_in_flight++;
  wbd_store_unlock();
  r->counted = 1;
  run_send(r, &e);
  json_decref(e.body);
  r->last_us = wbd_now_us();
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (ci) r->conn_fd = ci->connect_fd;
  r->conn = req->conn;
  return wbd_reply_stream(req, 200, "application/x-ndjson", run_read, r, run_done, NULL);
}

/* ------------------------------------------------------------------ */
/* /contexts                                                           */
/* ------------------------------------------------------------------ */

static json_t *ctx_json(const struct ictx *c) {
  return json_pack("{s:s,s:s,s:s}", "id", c->id, "language", c->lang, "cwd", c->cwd);
}

/* End a kernel that no context uses any more (outside the lock). */
static void kern_end(struct wbd_rt *rt, struct kern *k) {
  if (!k) return;
  if (!k->dead) wbd_rt_signal_rt(rt, k->pid, SIGKILL);
  pthread_mutex_lock(wbd_rt_interp_mu(rt));
  kern_put_locked(k);
  pthread_mutex_unlock(wbd_rt_interp_mu(rt));
}

static enum MHD_Result handle_contexts(struct wbd_req *req, struct wbd_sandbox *sb, const char *rest) {
  struct wbd_rt *rt = wbd_rt_get(sb);
  if (!rt) return sandbox_gone(req, sb);
  enum MHD_Result m;
  int is_post = strcmp(req->method, "POST") == 0, is_get = strcmp(req->method, "GET") == 0,
      is_del = strcmp(req->method, "DELETE") == 0;
  if (!*rest) {
    if (is_post) {
      json_error_t jerr;
      json_t *body = req->body_len ? json_loadb(req->body, req->body_len, 0, &jerr) : json_object();
      if (!json_is_object(body)) {
        json_decref(body);
        wbd_rt_put(rt);
        return unprocessable(req, "json_invalid", "body", "JSON decode error");
      }
      const char *lang_in = json_string_value(json_object_get(body, "language"));
      const char *cwd = json_string_value(json_object_get(body, "cwd"));
      if (lang_in && !*lang_in) lang_in = NULL;
      if (cwd && !*cwd) cwd = NULL;
      char lbuf[32];
      const char *lang = norm_lang(lang_in ? lang_in : "python", lbuf, sizeof lbuf);
      if (!lang) {
        m = reply_text(
          req, 500, "Failed to create context: warmboxd has no %s kernel (python, bash, javascript, typescript)", lbuf);
      } else {
        struct istate *ist = ist_lock(rt);
        int full = (long)ctx_count_locked(ist) >= (long)wbd_opt.max_contexts;
        json_t *o = full ? NULL : ctx_json(ctx_new_locked(ist, lang, cwd ? cwd : "/home/user"));
        ist_unlock(rt);
        m = full ? reply_text(req, 429,
                              "Failed to create context: this sandbox has %d contexts, the most it "
                              "may have (remove one first)",
                              wbd_opt.max_contexts)
                 : wbd_reply_json(req, 200, o, NULL);
      }
      json_decref(body);
    } else if (is_get) {
      json_t *a = json_array();
      struct istate *ist = ist_lock(rt);
      for (struct ictx *c = ist->ctxs; c; c = c->next) json_array_insert_new(a, 0, ctx_json(c));
      ist_unlock(rt);
      m = wbd_reply_json(req, 200, a, NULL);
    } else {
      m = reply_detail(req, 405, "Method Not Allowed");
    }
    wbd_rt_put(rt);
    return m;
  }
  /* /contexts/{id} and /contexts/{id}/restart */
  char id[64];
  const char *slash = strchr(rest, '/');
  size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
  if (n >= sizeof id) n = sizeof id - 1;
  memcpy(id, rest, n);
  id[n] = 0;
  int restart = slash && strcmp(slash, "/restart") == 0;
  if ((slash && !restart) || (restart && !is_post) || (!restart && !is_del)) {
    wbd_rt_put(rt);
    return slash && !restart ? reply_detail(req, 404, "Not Found") : reply_detail(req, 405, "Method Not Allowed");
  }
  struct istate *ist = ist_lock(rt);
  struct ictx *c = ctx_find_locked(ist, id);
  if (!c) {
    ist_unlock(rt);
    wbd_rt_put(rt);
    return reply_text(req, 404, "Context %s not found", id);
  }
  struct kern *k = NULL;
  if (restart) {
    /* Same id, fresh kernel (started on the next run). */
    k = c->k;
    c->k = NULL;
    if (c->run) c->run->restarted = 1;
  } else {
    k = ctx_remove_locked(ist, c);
  }
  ist_unlock(rt);
  kern_end(rt, k);
  wbd_rt_put(rt);
  return wbd_reply_json(req, 200, json_null(), NULL);
}

/* ------------------------------------------------------------------ */
/* Routing                                                             */
/* ------------------------------------------------------------------ */

enum MHD_Result wbd_interp_handle(struct wbd_req *req, struct wbd_sandbox *sb) {
  const char *p = req->path;
  if (strcmp(p, "/health") == 0) {
    if (strcmp(req->method, "GET") != 0) return reply_detail(req, 405, "Method Not Allowed");
    return wbd_reply_json(req, 200, json_string("OK"), NULL);
  }
  if (strcmp(p, "/execute") == 0) {
    if (strcmp(req->method, "POST") != 0) return reply_detail(req, 405, "Method Not Allowed");
    return handle_execute(req, sb);
  }
  if (strcmp(p, "/contexts") == 0) return handle_contexts(req, sb, "");
  if (strncmp(p, "/contexts/", 10) == 0 && p[10]) return handle_contexts(req, sb, p + 10);
  return reply_detail(req, 404, "Not Found");
}
