/*
 * server.h: the server layer (server/): connections and requests
 * (server.c), handlers on workers and parked streams (defer.c), and what
 * the server applies to every request (counts, injected faults, body
 * limits). The reply functions every handler calls are in wbd.h.
 *
 * The server knows no handler by name: main.c hands it the route table
 * (struct wbd_routes), so every layer above calls down into it.
 */
#ifndef WBD_SERVER_H
#define WBD_SERVER_H

#include "wbd.h"

/* ---- route.c: the route table ---- */

/* Who may call a route: the server checks ADMIN (its admin gate) before
 * the row is found; wbd_routes.call checks the others before the handler. */
enum wbd_auth {
  WBD_AUTH_NONE,    /* anyone */
  WBD_AUTH_TEAM,    /* X-API-Key names a team (401 otherwise) */
  WBD_AUTH_SANDBOX, /* as TEAM, and the path's {id} is a sandbox id (400 "Invalid sandbox ID") */
  WBD_AUTH_ADMIN,   /* the admin API, /_warmboxd/... (X-Warmboxd-Token) */
};

/* What a handler is called with, once its row's auth let the request in:
 * the caller's team ("" for NONE and ADMIN), the sandbox id of the path
 * (SANDBOX only, else ""), and the row's arg. */
struct wbd_call {
  const char *team;
  const char *id;
  int arg;
};

/* One route: "METHOD /path/{id}/..." (method "*": any; a {name} matches one
 * non-empty path segment, everything else itself), which is also the name
 * the request counts and injected faults use; who may call it; its handler
 * (NULL: what matches this row has no route) and an argument for it. */
struct wbd_route {
  const char *route;
  enum wbd_auth auth;
  enum MHD_Result (*fn)(struct wbd_req *req, const struct wbd_call *c);
  int arg;
};

/* The first row of table[0..n) that matches method and path, among the
 * admin rows (admin = 1) or the others (admin = 0); NULL when none does or
 * that row has no handler. */
const struct wbd_route *wbd_route_match(const struct wbd_route *table, size_t n, const char *method, const char *path,
                                        int admin);

/* ---- server.c ---- */

/* What the server calls for each kind of request. main.c fills this in
 * (server.c knows no handler by name: every layer only calls down). */
struct wbd_routes {
  const struct wbd_route *table; /* every control-plane and admin route (control/routes.c) */
  size_t n;
  /* checks a matched row's auth (not ADMIN: the server did) and calls its handler */
  enum MHD_Result (*call)(struct wbd_req *req, const struct wbd_route *row);
  int (*control_key_ok)(const char *key);
  enum MHD_Result (*dataplane)(struct wbd_req *req, const char *id, int port);
  /* whether a data-plane request may send its body (token / signature) */
  int (*dataplane_body_ok)(struct wbd_req *req, struct wbd_sandbox *sb);
  /* the bytes an upload to the sandbox may bring (its disk's free space), -1: unknown */
  long long (*upload_room)(struct wbd_sandbox *sb);
};
void wbd_server_routes(const struct wbd_routes *r);

/* The request counts GET /_warmboxd/stats shows: {"requests": {route: n},
 * "counters": {name: n} (wbd_stat_add), "total_requests": n}, the admin
 * API's own requests not counted. */
json_t *wbd_stats_json(void);
void wbd_stats_reset(void);

/* A fault the server injects into the next `count` requests of `route` (a
 * route template as the stats name it, or "*"), before their handler: a
 * delay, then a dropped connection, or an answer with `status` (0: none,
 * the request goes on), `body` (NULL: an E2B error body) and `headers`. */
struct wbd_fault {
  char *route; /* malloc'd */
  long count;
  unsigned status;
  char *body;      /* malloc'd, or NULL */
  json_t *headers; /* an object of strings (a reference), or NULL */
  int delay_ms;
  int drop;
  struct wbd_fault *next;
};
/* Queues f after the faults already queued; the server owns it (and what
 * it points to) from here. A count <= 0 frees it at once. */
void wbd_fault_add(struct wbd_fault *f);
void wbd_faults_clear(void);

#define WBD_ADMIN_HEADER "X-Warmboxd-Token"
#define WBD_BODY_CONTROL ((size_t)1 << 20)  /* control plane and admin JSON */
#define WBD_BODY_DATA    ((size_t)16 << 20) /* data-plane RPCs, /execute */
#define WBD_BODY_UNAUTH  ((size_t)64 << 10) /* no or wrong credentials: enough for the 401 */

int wbd_server_start(void); /* binds, fills the port */
int wbd_server_port(void);
int wbd_server_tls_port(void); /* the HTTPS listener's (--tls-cert), 0 without one */
void wbd_server_quiesce(void);
void wbd_server_stop(void);

/* defer.c: handlers on workers, streams parked, off the polling threads.
 * wbd_defer_run runs fn(arg) on a worker (-1: stopping, or no thread). */
int wbd_defer_start(void);
void wbd_defer_stop(void); /* waits for the handlers in flight, resumes every parked stream */
int wbd_defer_run(void (*fn)(void *), void *arg);
void wbd_stats_free(void);

#endif
