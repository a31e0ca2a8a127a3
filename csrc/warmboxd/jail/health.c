/*
 * health.c: the code interpreter's `GET /health` inside each sandbox.
 *
 * E2B's code interpreter is a server in the VM on port 49999, and a process
 * of the sandbox may ask it `http://0.0.0.0:49999/health` ("OK", 200).
 * warmboxd serves the interpreter itself, from outside the jail; so that the
 * same request works from inside, each sandbox's network namespace gets a
 * socket listening on its port 49999 (made in the namespace by the runtime,
 * runtime.c's net_make), and this file's one thread answers every such
 * socket: `GET /health` is 200 "OK", anything else 404. It lives in the
 * sandbox's own namespace only: nothing listens on the host's, and no other
 * sandbox can reach it. There is no process in the jail to kill: the
 * interpreter and its health outlive any process of the sandbox, as E2B's
 * systemd units bring theirs back.
 *
 * Each sandbox may hold at most CONN_MAX connections at once, each at most
 * CONN_MS long: a sandbox cannot hold up another's answers.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "jail.h"

#define CONN_MAX 8
#define CONN_MS  5000
#define REQ_MAX  2048

struct listener {
  int fd;
  int conns;
  int dead;
  struct listener *next; /* g_dead, once removed */
};

struct conn {
  int fd;
  struct listener *l;
  long long until;
  size_t len;
  char buf[REQ_MAX];
  struct conn *next;
};

/* the tags of epoll_event.data.ptr: which kind of object it points at */
struct tag {
  int conn;
  void *p;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ep = -1;
static int g_wake = -1; /* an eventfd: a listener was removed (free it) */
static struct conn *g_conns;
static struct listener *g_dead;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void conn_close(struct conn *c) {
  for (struct conn **pp = &g_conns; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  close(c->fd); /* also leaves the epoll set */
  if (c->l) c->l->conns--;
  free(c);
}

static void reply(struct conn *c) {
  static const char ok[] =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n"
    "Connection: close\r\n\r\n\"OK\"";
  static const char nf[] =
    "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 22\r\n"
    "Connection: close\r\n\r\n{\"detail\":\"Not Found\"}";
  int health = (strncmp(c->buf, "GET /health ", 12) == 0 || strncmp(c->buf, "GET /health?", 12) == 0 ||
                strncmp(c->buf, "HEAD /health ", 13) == 0);
  const char *r = health ? ok : nf;
  size_t n = health ? sizeof ok - 1 : sizeof nf - 1;
  if (strncmp(c->buf, "HEAD ", 5) == 0) n = (size_t)(strstr(r, "\r\n\r\n") + 4 - r);
  /* a few hundred bytes: the new socket's buffer takes them at once */
  if (send(c->fd, r, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
  }
  conn_close(c);
}

static void on_accept(struct listener *l) {
  for (;;) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (l->conns >= CONN_MAX) {
      close(fd);
      continue;
    }
    struct conn *c = calloc(1, sizeof *c + sizeof(struct tag));
    if (!c) {
      close(fd);
      return;
    }
    struct tag *t = (struct tag *)(void *)(c + 1);
    t->conn = 1;
    t->p = c;
    c->fd = fd;
    c->l = l;
    c->until = now_ms() + CONN_MS;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = t};
    if (epoll_ctl(g_ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      free(c);
      continue;
    }
    l->conns++;
    c->next = g_conns;
    g_conns = c;
  }
}

static void on_read(struct conn *c) {
  ssize_t n = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    conn_close(c);
    return;
  }
  c->len += (size_t)n;
  c->buf[c->len] = 0;
  if (strstr(c->buf, "\r\n\r\n") || strstr(c->buf, "\n\n") || c->len == sizeof c->buf - 1) reply(c);
}

static void *serve(void *arg) {
  (void)arg;
  struct epoll_event evs[64];
  for (;;) {
    pthread_mutex_lock(&g_mu);
    int idle = g_conns == NULL;
    pthread_mutex_unlock(&g_mu);
    int n = epoll_wait(g_ep, evs, 64, idle ? -1 : 1000);
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < n; i++) {
      struct tag *t = evs[i].data.ptr;
      if (!t) {
        uint64_t v;
        if (read(g_wake, &v, sizeof v) < 0) {
        }
        continue;
      }
      if (!t->conn) {
        struct listener *l = t->p;
        if (!l->dead) on_accept(l);
        continue;
      }
      /* epoll reports an fd once a batch, and only its own event closes a
       * connection before the sweep below: c is live */
      on_read(t->p);
    }
    long long now = now_ms();
    for (struct conn *c = g_conns, *next; c; c = next) {
      next = c->next;
      if (c->until <= now || (c->l && c->l->dead)) conn_close(c);
    }
    while (g_dead) {
      struct listener *l = g_dead;
      g_dead = l->next;
      free(l);
    }
    pthread_mutex_unlock(&g_mu);
  }
  return NULL;
}

static void start(void) {
  g_ep = epoll_create1(EPOLL_CLOEXEC);
  if (g_ep < 0) return;
  g_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  if (g_wake < 0 || epoll_ctl(g_ep, EPOLL_CTL_ADD, g_wake, &ev) != 0) {
    if (g_wake >= 0) close(g_wake);
    close(g_ep);
    g_ep = -1;
    return;
  }
  pthread_t th;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&th, &a, serve, NULL) != 0) {
    close(g_ep);
    g_ep = -1;
  }
  pthread_attr_destroy(&a);
}

void *wbd_health_add(int fd) {
  pthread_once(&g_once, start);
  if (g_ep < 0) return NULL;
  struct listener *l = calloc(1, sizeof *l + sizeof(struct tag));
  if (!l) return NULL;
  struct tag *t = (struct tag *)(void *)(l + 1);
  t->conn = 0;
  t->p = l;
  l->fd = fd;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = t};
  pthread_mutex_lock(&g_mu);
  int rc = epoll_ctl(g_ep, EPOLL_CTL_ADD, fd, &ev);
  pthread_mutex_unlock(&g_mu);
  if (rc != 0) {
    free(l);
    return NULL;
  }
  return l;
}

void wbd_health_remove(void *h) {
  struct listener *l = h;
  if (!l) return;
  pthread_mutex_lock(&g_mu);
  epoll_ctl(g_ep, EPOLL_CTL_DEL, l->fd, NULL);
  close(l->fd);
  l->dead = 1; /* its connections close, and it is freed, by the thread */
  l->next = g_dead;
  g_dead = l;
  pthread_mutex_unlock(&g_mu);
  uint64_t one = 1;
  if (write(g_wake, &one, sizeof one) < 0) {
  }
}
