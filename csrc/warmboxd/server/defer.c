/*
 * defer.c: what keeps the server's polling threads from blocking, so that a
 * connection costs a thread only while its request is being handled.
 *
 * libmicrohttpd runs a few polling threads (server.c) that read request
 * heads and bodies and write answers for every connection: an idle or slow
 * connection costs a descriptor and a little memory, no thread. Two things
 * would block them, and go elsewhere:
 *
 * - A request's handler (a create, a pause, a spawn, a fault's delay) runs on
 *   a worker (wbd_defer_run): the connection is suspended meanwhile and
 *   resumed by the worker once the handler queued its answer. Workers are
 *   made as requests need them (one per request being handled, as the
 *   thread-per-connection server had) and WORKERS_IDLE_KEPT of them wait for
 *   the next one; more idle than that end after WORKER_LINGER_S.
 * - A streamed answer's reader (process output, /execute, WatchDir) that has
 *   nothing to send parks its connection (wbd_park): suspended, and one
 *   parker thread polls every parked stream's data descriptor and client
 *   socket and resumes the connection when either wakes or its timeout (a
 *   keepalive, a deadline) is due.
 *
 * Stopping (wbd_defer_stop, before MHD_stop_daemon, which must find no
 * suspended connection): parks are refused from then on, every parked
 * connection is resumed, and the handlers in flight are waited for.
 */
#include "server.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

enum { WORKERS_IDLE_KEPT = 4, WORKER_LINGER_S = 10 };

/* ---- workers ---- */

struct job {
  void (*fn)(void *);
  void *arg;
  struct job *next;
};

static pthread_mutex_t jobs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER;  /* a job queued, or stopping */
static pthread_cond_t quiet_cv = PTHREAD_COND_INITIALIZER; /* a job done, or a worker ended */
static struct job *jobs_head, **jobs_tail = &jobs_head;
static int queued, idle, workers, busy, jobs_stopping;

static void deadline_in(struct timespec *ts, int s) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += s;
}

/* Under jobs_mu: the next job, waiting for one; NULL: this worker ends. */
static struct job *job_next(void) {
  while (!jobs_head && !jobs_stopping) {
    struct timespec ts;
    deadline_in(&ts, WORKER_LINGER_S);
    idle++;
    int rc = pthread_cond_timedwait(&jobs_cv, &jobs_mu, &ts);
    idle--;
    if (rc == ETIMEDOUT && !jobs_head && idle >= WORKERS_IDLE_KEPT) break;
  }
  struct job *j = jobs_head;
  if (j) {
    jobs_head = j->next;
    if (!jobs_head) jobs_tail = &jobs_head;
    queued--;
  }
  return j;
}

static void *worker_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&jobs_mu);
  struct job *j;
  while ((j = job_next()) != NULL) {
    pthread_mutex_unlock(&jobs_mu);
    j->fn(j->arg);
    free(j);
    pthread_mutex_lock(&jobs_mu);
    busy--;
    pthread_cond_broadcast(&quiet_cv);
  }
  workers--;
  pthread_cond_broadcast(&quiet_cv);
  pthread_mutex_unlock(&jobs_mu);
  return NULL;
}

/* Under jobs_mu: one more worker; -1 when none can be made. */
static int worker_add(void) {
  pthread_attr_t at;
  pthread_t t;
  if (pthread_attr_init(&at) != 0) return -1;
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &at, worker_main, NULL);
  pthread_attr_destroy(&at);
  if (rc != 0) return -1;
  workers++;
  return 0;
}

int wbd_defer_run(void (*fn)(void *), void *arg) {
  struct job *j = malloc(sizeof *j);
  if (!j) return -1;
  j->fn = fn;
  j->arg = arg;
  j->next = NULL;
  pthread_mutex_lock(&jobs_mu);
  /* a worker for it: an idle one not yet claimed, else a new one (none at
   * all: refused; some busy: it waits for the first free one) */
  if (jobs_stopping || (idle <= queued && worker_add() != 0 && workers == 0)) {
    pthread_mutex_unlock(&jobs_mu);
    free(j);
    return -1;
  }
  *jobs_tail = j;
  jobs_tail = &j->next;
  queued++;
  busy++;
  pthread_cond_signal(&jobs_cv);
  pthread_mutex_unlock(&jobs_mu);
  return 0;
}

static void workers_stop(void) {
  pthread_mutex_lock(&jobs_mu);
  jobs_stopping = 1;
  pthread_cond_broadcast(&jobs_cv);
  while (busy > 0 || workers > 0) pthread_cond_wait(&quiet_cv, &jobs_mu);
  pthread_mutex_unlock(&jobs_mu);
}

/* ---- parked streams ---- */

struct park {
  struct MHD_Connection *conn;
  int data_fd, conn_fd;
  int64_t due_us; /* monotonic */
  struct park *next;
};

static pthread_mutex_t park_mu = PTHREAD_MUTEX_INITIALIZER;
static struct park *parked;
static size_t n_parked;
static int park_wake = -1; /* eventfd: the parked set changed, or stopping */
static int park_stopping, parker_started;
static pthread_t parker;

static int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void wake_parker(void) {
  uint64_t one = 1;
  if (write(park_wake, &one, sizeof one) < 0) { /* already due to wake */
  }
}

int wbd_park(struct MHD_Connection *conn, int data_fd, int conn_fd, int timeout_ms) {
  struct park *pk = malloc(sizeof *pk);
  if (!pk) return -1;
  pk->conn = conn;
  pk->data_fd = data_fd;
  pk->conn_fd = conn_fd;
  pk->due_us = mono_us() + (int64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000;
  pthread_mutex_lock(&park_mu);
  if (park_stopping || !parker_started) {
    pthread_mutex_unlock(&park_mu);
    free(pk);
    return -1;
  }
  /* suspended before the parker can see it: its resume always follows */
  MHD_suspend_connection(conn);
  pk->next = parked;
  parked = pk;
  n_parked++;
  pthread_mutex_unlock(&park_mu);
  wake_parker();
  return 0;
}

/* Under park_mu: the parked streams' descriptors into fds (after the wake
 * eventfd at 0), in list order; the poll timeout in ms (-1: none parked). */
static int park_fds(struct pollfd *fds, int64_t now) {
  int64_t soonest = -1;
  size_t i = 1;
  fds[0] = (struct pollfd){.fd = park_wake, .events = POLLIN};
  for (struct park *pk = parked; pk; pk = pk->next, i += 2) {
    fds[i] = (struct pollfd){.fd = pk->data_fd, .events = POLLIN};
    fds[i + 1] = (struct pollfd){.fd = pk->conn_fd, .events = POLLRDHUP};
    if (soonest < 0 || pk->due_us < soonest) soonest = pk->due_us;
  }
  if (soonest < 0) return -1;
  return soonest <= now ? 0 : (int)((soonest - now + 999) / 1000);
}

/* Under park_mu: resumes the first `n` parked (those fds[] was made from)
 * whose descriptors woke or whose time came, or all of them when `all`. */
static void park_resume(const struct pollfd *fds, size_t n, int all) {
  int64_t now = mono_us();
  struct park **pp = &parked;
  size_t seen = 0;
  /* entries parked after fds[] was made are at the front: skip them */
  for (size_t skip = n_parked - n; skip > 0 && *pp; skip--) pp = &(*pp)->next;
  for (size_t i = 1; *pp && seen < n; seen++, i += 2) {
    struct park *pk = *pp;
    if (all || fds[i].revents || fds[i + 1].revents || now >= pk->due_us) {
      *pp = pk->next;
      n_parked--;
      MHD_resume_connection(pk->conn);
      free(pk);
    } else {
      pp = &pk->next;
    }
  }
}

static void *parker_main(void *arg) {
  (void)arg;
  struct pollfd *fds = NULL;
  size_t cap = 0;
  pthread_mutex_lock(&park_mu);
  while (!park_stopping) {
    size_t need = 1 + 2 * n_parked, n = n_parked;
    if (need > cap) {
      struct pollfd *nf = realloc(fds, need * sizeof *nf);
      if (!nf) abort();
      fds = nf;
      cap = need;
    }
    int timeout = park_fds(fds, mono_us());
    pthread_mutex_unlock(&park_mu);
    int rc = poll(fds, (nfds_t)need, timeout);
    if (rc < 0 && errno != EINTR) abort();
    if (rc > 0 && fds[0].revents) {
      uint64_t v;
      if (read(park_wake, &v, sizeof v) < 0) { /* EAGAIN: already read */
      }
    }
    pthread_mutex_lock(&park_mu);
    park_resume(fds, n, 0);
  }
  park_resume(NULL, n_parked, 1);
  pthread_mutex_unlock(&park_mu);
  free(fds);
  return NULL;
}

int wbd_defer_start(void) {
  park_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (park_wake < 0) return -1;
  if (pthread_create(&parker, NULL, parker_main, NULL) != 0) {
    close(park_wake);
    park_wake = -1;
    return -1;
  }
  pthread_mutex_lock(&park_mu);
  parker_started = 1;
  pthread_mutex_unlock(&park_mu);
  return 0;
}

void wbd_defer_stop(void) {
  workers_stop();
  pthread_mutex_lock(&park_mu);
  int started = parker_started;
  park_stopping = 1;
  pthread_mutex_unlock(&park_mu);
  if (!started) return;
  wake_parker();
  pthread_join(parker, NULL);
  parker_started = 0;
  close(park_wake);
  park_wake = -1;
}
