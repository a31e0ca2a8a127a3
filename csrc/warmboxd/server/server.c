/*
 * server.c: the HTTP server (libmicrohttpd: a few polling threads for every
 * connection; a request's handler runs on a worker and a stream waits
 * parked, defer.c, so an idle or slow connection costs no thread), routing
 * between the control plane, the admin API and the data plane through the
 * table main.c hands over (wbd_server_routes), and what it does to every
 * request on the way: counting it, injecting a fault, the server's resource
 * limits (connection timeout and caps, per-route body limits) and the admin
 * API's gate. The admin API's handlers, which read and set the counts and
 * faults, are knobs.c's.
 */
#include "server.h"
#include "util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static struct MHD_Daemon *daemon_;
static int bound_port;
/* --tls-cert: the HTTPS listener, its port and the PEM texts it serves */
static struct MHD_Daemon *tls_daemon;
static int tls_port;
static char *tls_cert_pem, *tls_key_pem;
static struct wbd_routes routes_;

void wbd_server_routes(const struct wbd_routes *r) {
  routes_ = *r;
}

/* ------------------------------------------------------------------ */
/* Stats                                                               */
/* ------------------------------------------------------------------ */

struct stat_entry {
  char *name;
  long n;
};
struct stat_table {
  struct stat_entry *v;
  size_t n, cap;
};

static pthread_mutex_t stats_mu = PTHREAD_MUTEX_INITIALIZER;
static struct stat_table routes, counters;
static long total_requests;

static void table_add(struct stat_table *t, const char *name, long delta) {
  for (size_t i = 0; i < t->n; i++)
    if (strcmp(t->v[i].name, name) == 0) {
      t->v[i].n += delta;
      return;
    }
  if (t->n == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 32;
    struct stat_entry *nv = realloc(t->v, nc * sizeof *nv);
    if (!nv) abort();
    t->v = nv;
    t->cap = nc;
  }
  t->v[t->n].name = strdup(name);
  if (!t->v[t->n].name) abort();
  t->v[t->n].n = delta;
  t->n++;
}

static void table_clear(struct stat_table *t) {
  for (size_t i = 0; i < t->n; i++) free(t->v[i].name);
  free(t->v);
  t->v = NULL;
  t->n = t->cap = 0;
}

void wbd_stat_add(const char *name, long delta) {
  pthread_mutex_lock(&stats_mu);
  table_add(&counters, name, delta);
  pthread_mutex_unlock(&stats_mu);
}

static void stat_request(const char *route) {
  pthread_mutex_lock(&stats_mu);
  table_add(&routes, route, 1);
  total_requests++;
  pthread_mutex_unlock(&stats_mu);
}

static json_t *table_json(struct stat_table *t) {
  json_t *o = json_object();
  for (size_t i = 0; i < t->n; i++) json_object_set_new(o, t->v[i].name, json_integer(t->v[i].n));
  return o;
}

json_t *wbd_stats_json(void) {
  json_t *o = json_object();
  pthread_mutex_lock(&stats_mu);
  json_object_set_new(o, "requests", table_json(&routes));
  json_object_set_new(o, "counters", table_json(&counters));
  json_object_set_new(o, "total_requests", json_integer(total_requests));
  pthread_mutex_unlock(&stats_mu);
  return o;
}

void wbd_stats_reset(void) {
  pthread_mutex_lock(&stats_mu);
  table_clear(&routes);
  table_clear(&counters);
  total_requests = 0;
  pthread_mutex_unlock(&stats_mu);
}

/* ------------------------------------------------------------------ */
/* Faults                                                              */
/* ------------------------------------------------------------------ */

static pthread_mutex_t faults_mu = PTHREAD_MUTEX_INITIALIZER;
static struct wbd_fault *faults, **faults_tail = &faults;

static void fault_free(struct wbd_fault *f) {
  free(f->route);
  free(f->body);
  json_decref(f->headers);
  free(f);
}

void wbd_faults_clear(void) {
  pthread_mutex_lock(&faults_mu);
  while (faults) {
    struct wbd_fault *f = faults;
    faults = f->next;
    fault_free(f);
  }
  faults_tail = &faults;
  pthread_mutex_unlock(&faults_mu);
}

void wbd_fault_add(struct wbd_fault *f) {
  if (f->count <= 0) {
    fault_free(f);
    return;
  }
  f->next = NULL;
  pthread_mutex_lock(&faults_mu);
  *faults_tail = f;
  faults_tail = &f->next;
  pthread_mutex_unlock(&faults_mu);
}

/* Takes one use of the first fault matching `route`; the caller owns the copy. */
static struct wbd_fault *fault_take(const char *route) {
  struct wbd_fault *copy = NULL;
  pthread_mutex_lock(&faults_mu);
  for (struct wbd_fault **pp = &faults; *pp; pp = &(*pp)->next) {
    struct wbd_fault *f = *pp;
    if (strcmp(f->route, "*") != 0 && strcmp(f->route, route) != 0) continue;
    copy = calloc(1, sizeof *copy);
    if (!copy) abort();
    copy->status = f->status;
    copy->body = f->body ? strdup(f->body) : NULL;
    copy->headers = f->headers ? json_incref(f->headers) : NULL;
    copy->delay_ms = f->delay_ms;
    copy->drop = f->drop;
    if (--f->count <= 0) {
      *pp = f->next;
      if (faults_tail == &f->next) faults_tail = pp;
      fault_free(f);
    }
    break;
  }
  pthread_mutex_unlock(&faults_mu);
  return copy;
}

/* ------------------------------------------------------------------ */
/* Requests and responses                                              */
/* ------------------------------------------------------------------ */

const char *wbd_req_header(struct wbd_req *req, const char *name) {
  return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const char *wbd_req_query(struct wbd_req *req, const char *name) {
  return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

static void add_headers(struct MHD_Response *resp, const char *const *headers) {
  for (size_t i = 0; headers && headers[i] && headers[i + 1]; i += 2)
    MHD_add_response_header(resp, headers[i], headers[i + 1]);
}

static enum MHD_Result queue(struct wbd_req *req, unsigned status, struct MHD_Response *resp) {
  if (!resp) return MHD_NO;
  enum MHD_Result r = MHD_queue_response(req->conn, status, resp);
  MHD_destroy_response(resp);
  req->replied = 1;
  return r;
}

enum MHD_Result wbd_reply_raw(struct wbd_req *req, unsigned status, const char *content_type, const void *data,
                              size_t len, const char *const *headers) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)(uintptr_t)data, MHD_RESPMEM_MUST_COPY);
  if (!resp) return MHD_NO;
  if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  add_headers(resp, headers);
  return queue(req, status, resp);
}

enum MHD_Result wbd_reply_json(struct wbd_req *req, unsigned status, json_t *body, const char *const *headers) {
  if (!body) return wbd_reply_raw(req, status, NULL, "", 0, headers);
  char *s = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
  json_decref(body);
  if (!s) return MHD_NO;
  struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(s);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  add_headers(resp, headers);
  return queue(req, status, resp);
}

static enum MHD_Result vreply_error(struct wbd_req *req, unsigned status, const char *const *headers, const char *fmt,
                                    va_list ap) __attribute__((format(printf, 4, 0)));
static enum MHD_Result vreply_error(struct wbd_req *req, unsigned status, const char *const *headers, const char *fmt,
                                    va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  json_t *o = json_object();
  json_object_set_new(o, "code", json_integer(status));
  json_object_set_new(o, "message", wbd_json_str(msg));
  return wbd_reply_json(req, status, o, headers);
}

enum MHD_Result wbd_reply_error(struct wbd_req *req, unsigned status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  enum MHD_Result r = vreply_error(req, status, NULL, fmt, ap);
  va_end(ap);
  return r;
}

enum MHD_Result wbd_reply_stream(struct wbd_req *req, unsigned status, const char *content_type,
                                 MHD_ContentReaderCallback reader, void *cls, MHD_ContentReaderFreeCallback done,
                                 const char *const *headers) {
  struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, reader, cls, done);
  if (!resp) {
    if (done) done(cls);
    return MHD_NO;
  }
  if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  add_headers(resp, headers);
  return queue(req, status, resp);
}

/* ------------------------------------------------------------------ */
/* The admin API's gate                                                */
/* ------------------------------------------------------------------ */

static int is_admin_path(const char *path) {
  return strncmp(path, "/_warmboxd", 10) == 0 && (path[10] == 0 || path[10] == '/');
}

static int peer_is_loopback(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (!ci || !ci->client_addr) return 0;
  if (ci->client_addr->sa_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)ci->client_addr;
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  return 0;
}

/* The name of a Host header without its port ("[::1]" keeps its brackets),
 * 0; -1 when malformed. */
static int host_name(const char *host, char *h, size_t len) {
  size_t n = strlen(host);
  if (n == 0 || n >= len) return -1;
  memcpy(h, host, n + 1);
  char *colon = h[0] == '[' ? strchr(h, ']') : h;
  if (!colon) return -1;
  colon = strchr(colon, ':');
  if (colon) {
    if (!colon[1]) return -1;
    for (char *c = colon + 1; *c; c++)
      if (!isdigit((unsigned char)*c)) return -1;
    *colon = 0;
  }
  return h[0] ? 0 : -1;
}

/* Host: localhost, 127.x.y.z or [::1], with an optional :port. A browser
 * tricked by DNS rebinding sends the attacker's name instead. */
static int host_is_loopback(const char *host) {
  if (!host) return 1; /* HTTP/1.0 without Host: no browser sends that */
  char h[128];
  if (host_name(host, h, sizeof h) != 0) return 0;
  if (h[0] == '[') return strcmp(h, "[::1]") == 0;
  if (strcasecmp(h, "localhost") == 0) return 1;
  struct in_addr a;
  return inet_pton(AF_INET, h, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* A Host that DNS rebinding cannot produce: an address literal, or a name a
 * browser resolves to loopback itself (localhost and *.localhost, RFC 6761;
 * PORT-ID.localhost routes to a sandbox). */
static int host_is_ours(const char *host) {
  char h[256];
  if (!host) return 1;
  if (host_name(host, h, sizeof h) != 0) return 0;
  size_t n = strlen(h);
  if (h[n - 1] == '.') h[--n] = 0; /* "localhost." is localhost */
  struct in_addr a4;
  struct in6_addr a6;
  if (inet_pton(AF_INET, h, &a4) == 1) return 1;
  if (h[0] == '[' && h[n - 1] == ']') {
    h[n - 1] = 0;
    return inet_pton(AF_INET6, h + 1, &a6) == 1;
  }
  if (strcasecmp(h, "localhost") == 0) return 1;
  return n > 10 && strcasecmp(h + n - 10, ".localhost") == 0;
}

/* Every route: no browser (an Origin header) and no foreign Host, so a web
 * page cannot drive the server through DNS rebinding. Replies and returns -1
 * when refused. */
static int client_gate(struct wbd_req *req, enum MHD_Result *r) {
  if (wbd_req_header(req, "Origin")) {
    wbd_stat_add("foreign_origin", 1);
    *r = wbd_reply_error(req, 403, "warmboxd refuses requests with an Origin header (a browser's)");
    return -1;
  }
  if (!host_is_ours(wbd_req_header(req, MHD_HTTP_HEADER_HOST))) {
    wbd_stat_add("foreign_host", 1);
    *r = wbd_reply_error(req, 403,
                         "warmboxd answers only a Host that is an address, localhost or "
                         "*.localhost (a DNS name could be rebound by a web page)");
    return -1;
  }
  return 0;
}

/* Replies and returns -1 unless the admin request may go on. */
static int admin_gate(struct wbd_req *req, enum MHD_Result *r) {
  if (!peer_is_loopback(req->conn)) {
    *r = wbd_reply_error(req, 403, "the warmboxd admin API answers loopback clients only");
    return -1;
  }
  if (!host_is_loopback(wbd_req_header(req, MHD_HTTP_HEADER_HOST))) {
    *r = wbd_reply_error(req, 403, "the warmboxd admin API answers only a loopback Host");
    return -1;
  }
  const char *tok = wbd_req_header(req, WBD_ADMIN_HEADER);
  if (!tok || !wbd_lim.admin_token || !wbd_str_eq_ct(tok, wbd_lim.admin_token)) {
    *r = wbd_reply_error(req, 401,
                         "the warmboxd admin API needs its token in " WBD_ADMIN_HEADER
                         " (see --admin-token; by default it is in <data-dir>/admin-token)");
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* Data-plane routing                                                  */
/* ------------------------------------------------------------------ */

/* Sandbox id and port from the E2B headers or a Host "PORT-ID.DOMAIN". */
static int dataplane_target(struct wbd_req *req, char *id, size_t idlen, int *port) {
  const char *hid = wbd_req_header(req, "E2b-Sandbox-Id");
  const char *hport = wbd_req_header(req, "E2b-Sandbox-Port");
  if (hid && hport) {
    size_t n = strcspn(hid, "-");
    if (n >= idlen) n = idlen - 1;
    memcpy(id, hid, n);
    id[n] = 0;
    long long pv;
    if (wbd_parse_ll(hport, 0, 65535, 0, &pv) != 0 || pv == 0) return 0;
    *port = (int)pv;
    return 1;
  }
  const char *host = wbd_req_header(req, MHD_HTTP_HEADER_HOST);
  if (!host || !isdigit((unsigned char)host[0])) return 0;
  const char *s = host;
  int p = 0;
  while (isdigit((unsigned char)*s)) {
    p = p * 10 + (*s - '0');
    if (p > 65535) return 0;
    s++;
  }
  if (*s != '-') return 0;
  s++;
  size_t n = 0;
  while (s[n] && (islower((unsigned char)s[n]) || isdigit((unsigned char)s[n]))) n++;
  if (n == 0 || n >= idlen) return 0;
  if (s[n] != '.' && s[n] != '-') return 0;
  memcpy(id, s, n);
  id[n] = 0;
  *port = p;
  return 1;
}

/* A signed /files URL (the SDK's uploadUrl/downloadUrl with E2B_SANDBOX_URL)
 * carries no sandbox id: the signature, made with one sandbox's access
 * token, is what names it. A request that names its sandbox (E2b-Sandbox-Id,
 * or a Host) is looked up by id first (dataplane_target) and never comes
 * here. The search costs what the request cannot inflate: the part of the
 * signed string before the token (its path, bounded) is hashed once, and
 * each running secure sandbox's token adds only its own few blocks. */
struct signed_want {
  struct wbd_sha256 prefix; /* "path:op:user:" */
  const char *exp, *sig;
  size_t hashed; /* bytes hashed (the stat signed_url_hashed_bytes) */
};

static int signed_match(const char *token, void *cls) {
  struct signed_want *w = cls;
  char sig[64];
  wbd_files_sig_finish(&w->prefix, token, w->exp, sig);
  w->hashed += strlen(token) + (w->exp ? 1 + strlen(w->exp) : 0);
  return wbd_str_eq_ct(w->sig, sig);
}

/* What a signed request may hold: a path envd could serve (PATH_MAX), a
 * user name and an expiration of sane length. */
#define SIGNED_PATH_MAX  4096
#define SIGNED_FIELD_MAX 256

/* 1 with the sandbox's id when the request is a signed GET/POST /files whose
 * signature one running secure sandbox's token made; 0 when it is not a
 * signed /files request; -1 when it is one that no sandbox signed. The
 * expiration is not checked here: envd checks it (and answers as envd). */
static int signed_target(struct wbd_req *req, char *id, size_t idlen) {
  int get = strcmp(req->method, "GET") == 0, post = strcmp(req->method, "POST") == 0;
  if (strcmp(req->path, "/files") != 0 || (!get && !post)) return 0;
  const char *sig = wbd_req_query(req, "signature");
  if (!sig) return 0;
  /* "v1_" + 43 characters of unpadded base64: anything else matches no one. */
  if (strncmp(sig, "v1_", 3) != 0 || strlen(sig) != 46) return -1;
  const char *path = wbd_req_query(req, "path"), *user = wbd_req_query(req, "username");
  struct signed_want w = {.exp = wbd_req_query(req, "signature_expiration"), .sig = sig};
  if ((path && strlen(path) > SIGNED_PATH_MAX) || (user && strlen(user) > SIGNED_FIELD_MAX) ||
      (w.exp && strlen(w.exp) > SIGNED_FIELD_MAX))
    return -1;
  wbd_files_sig_prefix(&w.prefix, path ? path : "", get ? "read" : "write", user);
  w.hashed = w.prefix.len;
  int found = wbd_store_find_signed(signed_match, &w, id, idlen);
  wbd_stat_add("signed_url_hashed_bytes", (long)w.hashed);
  return found ? 1 : -1;
}

/* Data-plane paths that stats name one by one; any other path counts as
 * "<svc> <METHOD> unknown" so the table stays bounded (and holds no ids). */
static const char *const envd_paths[] = {
  "/health",
  "/files",
  "/envs",
  "/metrics",
  "/init",
  "/filesystem.Filesystem/Stat",
  "/filesystem.Filesystem/MakeDir",
  "/filesystem.Filesystem/Move",
  "/filesystem.Filesystem/ListDir",
  "/filesystem.Filesystem/Remove",
  "/filesystem.Filesystem/WatchDir",
  "/filesystem.Filesystem/CreateWatcher",
  "/filesystem.Filesystem/GetWatcherEvents",
  "/filesystem.Filesystem/RemoveWatcher",
  "/process.Process/List",
  "/process.Process/Connect",
  "/process.Process/Start",
  "/process.Process/Update",
  "/process.Process/StreamInput",
  "/process.Process/SendInput",
  "/process.Process/SendSignal",
  "/process.Process/CloseStdin",
};
static const char *const interp_paths[] = {"/health", "/execute", "/contexts"};

static int path_known(const char *path, const char *const *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(path, v[i]) == 0) return 1;
  return 0;
}

static void dataplane_route(struct wbd_req *req, int port, char *buf, size_t len) {
  const char *svc = port == 49983 ? "envd" : port == 49999 ? "interp" : "other-port";
  const char *path = req->path;
  const char *method = strcmp(req->method, "GET") == 0 || strcmp(req->method, "POST") == 0 ||
                           strcmp(req->method, "DELETE") == 0 || strcmp(req->method, "PUT") == 0 ||
                           strcmp(req->method, "PATCH") == 0 || strcmp(req->method, "HEAD") == 0
                         ? req->method
                         : "OTHER";
  if (port == 49999 && strncmp(path, "/contexts/", 10) == 0) {
    const char *rest = strchr(path + 10, '/');
    if (!rest || strcmp(rest, "/restart") == 0) {
      snprintf(buf, len, "%s %s /contexts/{id}%s", svc, method, rest ? rest : "");
      return;
    }
  } else if ((port == 49983 && path_known(path, envd_paths, sizeof envd_paths / sizeof *envd_paths)) ||
             (port == 49999 && path_known(path, interp_paths, sizeof interp_paths / sizeof *interp_paths))) {
    snprintf(buf, len, "%s %s %s", svc, method, path);
    return;
  }
  snprintf(buf, len, "%s %s unknown", svc, method);
}

/* ------------------------------------------------------------------ */
/* Requests have deadlines; slow connections make room                 */
/* ------------------------------------------------------------------ */

/* libmicrohttpd's connection timeout counts idle time only, so a client
 * that trickles a byte now and then keeps a request open for ever. Every
 * connection is watched: waiting for a request head (from when it opened or
 * its last request ended) it has --conn-timeout, receiving a body (from when
 * the head was complete) --body-timeout; a reaper shuts down those over
 * their time. While a request is served (a handler runs or streams its
 * answer) there is no deadline. The watch entry goes away in the
 * connection's CLOSED notice, which libmicrohttpd sends before it closes
 * the socket, so the reaper never shuts a descriptor that was reused.
 *
 * The connection caps (--max-conns-per-ip, --max-conns) are warmboxd's own
 * (accept_policy): a new connection over a cap makes room by shutting the
 * oldest connection of that address (or of all) that is waiting: one that
 * has waited at least EVICT_GRACE_US, else (a flood of new connections, all
 * younger) the oldest still waiting for its request head. It never shuts a
 * request being served, nor one whose body is making progress (an upload);
 * and is refused only when there is none. Local clients all share
 * 127.0.0.1, so without this one of them holding its slots with slow
 * requests (or opening many at once) would lock out the others.
 *
 * Streams (a request served for as long as it likes: Process Start and
 * Connect, WatchDir, /execute) are never shut, so they take slots of their
 * own, bounded (stream_take): --max-streams per team, and never the last
 * STREAM_RESERVE of an address's or of all the slots, which stay for new
 * requests (/health, the admin API, another client). */
enum { W_HEAD, W_BODY, W_SERVING };
#define EVICT_GRACE_US (1000 * 1000)
/* A body makes progress while its bytes came within EVICT_GRACE_US and at
 * BODY_MIN_RATE bytes a second on average since its head. */
#define BODY_MIN_RATE 4096

struct conn_watch {
  MHD_socket fd;
  uint32_t addr;    /* IPv4 peer (host order), 0 when not IPv4 */
  int64_t since_us; /* monotonic: when the present state began */
  int state;        /* W_* */
  int shut;
  int64_t body_bytes; /* W_BODY: bytes of the body in so far */
  int64_t chunk_us;   /* W_BODY: when the last of them came */
  int stream;         /* holds a stream slot (stream_take) of `team` */
  char team[64];
  struct conn_watch *prev, *next;
};

static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cv = PTHREAD_COND_INITIALIZER;
static struct conn_watch *watch_head;
static pthread_t reaper;
static int reaper_started, reaper_stop;

static int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static uint32_t ipv4_of(const struct sockaddr *sa) {
  if (!sa || sa->sa_family != AF_INET) return 0;
  return ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr);
}

/* Under watch_mu. */
static void watch_shut(struct conn_watch *w, const char *why) {
  shutdown(w->fd, SHUT_RDWR); /* its thread sees the end and closes it */
  w->shut = 1;
  wbd_stat_add(why, 1);
}

/* Connections the accept policy let in whose STARTED notice has not come
 * yet: counted toward the caps, so polling threads accepting at once cannot
 * both take the last slot. One that never starts is forgotten after
 * PENDING_TTL_US. Under watch_mu. */
#define PENDING_MAX    64
#define PENDING_TTL_US (1000 * 1000)
struct pending_conn {
  uint32_t addr;
  int64_t since_us;
};
static struct pending_conn pending[PENDING_MAX];
static int n_pending;

static void pending_expire(int64_t now) {
  int j = 0;
  for (int i = 0; i < n_pending; i++)
    if (now - pending[i].since_us < PENDING_TTL_US) pending[j++] = pending[i];
  n_pending = j;
}

static void pending_drop(uint32_t addr) {
  for (int i = 0; i < n_pending; i++)
    if (pending[i].addr == addr) {
      pending[i] = pending[--n_pending];
      return;
    }
}

static int body_progressing(const struct conn_watch *w, int64_t now) {
  if (w->state != W_BODY || now - w->chunk_us >= EVICT_GRACE_US) return 0;
  return w->body_bytes * 1000000 >= (int64_t)BODY_MIN_RATE * (now - w->since_us);
}

/* Which waiting connection to shut first: 2 one that waited the grace
 * (oldest first), 1 a younger one still without its request head, 0 none. */
static int evict_rank(const struct conn_watch *w, int64_t now) {
  if (w->state == W_SERVING || body_progressing(w, now)) return 0;
  if (now - w->since_us >= EVICT_GRACE_US) return 2;
  return w->state == W_HEAD ? 1 : 0;
}

static int evict_before(const struct conn_watch *a, const struct conn_watch *b, int64_t now) {
  if (!b) return 1;
  int ra = evict_rank(a, now), rb = evict_rank(b, now);
  return ra != rb ? ra > rb : a->since_us < b->since_us;
}

/* Under watch_mu: room for one more connection from addr (1), shutting the
 * oldest waiting connection over a cap, or 0 when there is none to shut. */
static int make_room(uint32_t addr, int64_t now) {
  pending_expire(now);
  if (n_pending >= PENDING_MAX) return 0;
  long total = n_pending, mine = 0;
  for (int i = 0; i < n_pending; i++) mine += pending[i].addr == addr;
  struct conn_watch *old_all = NULL, *old_mine = NULL;
  for (struct conn_watch *w = watch_head; w; w = w->next) {
    if (w->shut) continue;
    total++;
    mine += w->addr == addr;
    if (!evict_rank(w, now)) continue;
    if (evict_before(w, old_all, now)) old_all = w;
    if (w->addr == addr && evict_before(w, old_mine, now)) old_mine = w;
  }
  if (mine >= wbd_lim.max_conns_per_ip) {
    if (!old_mine) return 0;
    watch_shut(old_mine, "evicted_waiting_conn");
    total--;
    if (old_all == old_mine) old_all = NULL;
  }
  if (total >= wbd_lim.max_conns) {
    if (!old_all) return 0;
    watch_shut(old_all, "evicted_waiting_conn");
  }
  return 1;
}

static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t len) {
  (void)cls;
  (void)len;
  pthread_mutex_lock(&watch_mu);
  int64_t now = mono_us();
  uint32_t a = ipv4_of(addr);
  int ok = make_room(a, now);
  if (ok) pending[n_pending++] = (struct pending_conn){a, now};
  pthread_mutex_unlock(&watch_mu);
  if (!ok) wbd_stat_add("refused_conn", 1);
  return ok ? MHD_YES : MHD_NO;
}

static void notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe) {
  (void)cls;
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ai = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    struct conn_watch *w = calloc(1, sizeof *w);
    if (!w || !ci) {
      free(w);
      return;
    }
    w->fd = ci->connect_fd;
    w->addr = ai ? ipv4_of(ai->client_addr) : 0;
    w->since_us = mono_us();
    pthread_mutex_lock(&watch_mu);
    pending_drop(w->addr);
    w->next = watch_head;
    if (watch_head) watch_head->prev = w;
    watch_head = w;
    pthread_mutex_unlock(&watch_mu);
    *socket_context = w;
  } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
    struct conn_watch *w = *socket_context;
    if (!w) return;
    pthread_mutex_lock(&watch_mu);
    if (w->prev)
      w->prev->next = w->next;
    else
      watch_head = w->next;
    if (w->next) w->next->prev = w->prev;
    pthread_mutex_unlock(&watch_mu);
    free(w);
    *socket_context = NULL;
  }
}

static struct conn_watch *watch_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* The connection's request moved to `state` (W_*); a request that ended
 * (W_HEAD: waiting for the next) gives its stream slot back. */
static void watch_mark(struct MHD_Connection *conn, int state) {
  struct conn_watch *w = watch_of(conn);
  if (!w) return;
  pthread_mutex_lock(&watch_mu);
  w->state = state;
  w->since_us = w->chunk_us = mono_us();
  w->body_bytes = 0;
  if (state == W_HEAD) w->stream = 0;
  pthread_mutex_unlock(&watch_mu);
}

/* n more bytes of the connection's request body came in. */
static void watch_body(struct MHD_Connection *conn, size_t n) {
  struct conn_watch *w = watch_of(conn);
  if (!w) return;
  pthread_mutex_lock(&watch_mu);
  w->body_bytes += (int64_t)n;
  w->chunk_us = mono_us();
  pthread_mutex_unlock(&watch_mu);
}

/* Routes whose answer streams for as long as the caller likes. */
static int stream_route(int port, const char *path) {
  if (port == 49999) return strcmp(path, "/execute") == 0;
  return port == 49983 &&
         (strcmp(path, "/process.Process/Start") == 0 || strcmp(path, "/process.Process/Connect") == 0 ||
          strcmp(path, "/filesystem.Filesystem/WatchDir") == 0);
}

/* Slots of a cap that streams never take: room for new requests. */
static long stream_reserve(long cap) {
  long r = cap / 8;
  if (r < 4) r = 4;
  return r < cap ? r : cap - 1;
}

/* A stream slot for the connection, for `team`: 0, or -1 with what is full
 * in *why (the team's --max-streams, or the slots of its address or of all
 * that are kept for new requests). */
static int stream_take(struct MHD_Connection *conn, const char *team, const char **why) {
  struct conn_watch *me = watch_of(conn);
  if (!me) return 0;
  int max_team = wbd_knob(&wbd_opt.max_streams);
  long of_team = 0, of_addr = 0, total = 0;
  pthread_mutex_lock(&watch_mu);
  for (struct conn_watch *w = watch_head; w; w = w->next) {
    if (!w->stream || w->shut) continue;
    total++;
    of_addr += w->addr == me->addr;
    of_team += strcmp(w->team, team) == 0;
  }
  *why = NULL;
  if (max_team > 0 && of_team >= max_team)
    *why = "this team's concurrent streams (--max-streams)";
  else if (of_addr >= wbd_lim.max_conns_per_ip - stream_reserve(wbd_lim.max_conns_per_ip))
    *why = "the streams this client address may hold (--max-conns-per-ip, less the slots kept for new requests)";
  else if (total >= wbd_lim.max_conns - stream_reserve(wbd_lim.max_conns))
    *why = "the streams the server may hold (--max-conns, less the slots kept for new requests)";
  if (!*why) {
    me->stream = 1;
    snprintf(me->team, sizeof me->team, "%s", team);
  }
  pthread_mutex_unlock(&watch_mu);
  return *why ? -1 : 0;
}

static void *reaper_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&watch_mu);
  while (!reaper_stop) {
    int64_t head = (int64_t)wbd_lim.conn_timeout_s * 1000000, body = (int64_t)wbd_lim.body_timeout_s * 1000000;
    int64_t now = mono_us();
    for (struct conn_watch *w = watch_head; w; w = w->next) {
      if (w->shut || w->state == W_SERVING) continue;
      if (w->state == W_HEAD && now - w->since_us >= head)
        watch_shut(w, "slow_request_head");
      else if (w->state == W_BODY && now - w->since_us >= body)
        watch_shut(w, "slow_request_body");
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&watch_cv, &watch_mu, &ts);
  }
  pthread_mutex_unlock(&watch_mu);
  return NULL;
}

static void reaper_end(void) {
  if (!reaper_started) return;
  pthread_mutex_lock(&watch_mu);
  reaper_stop = 1;
  pthread_cond_signal(&watch_cv);
  pthread_mutex_unlock(&watch_mu);
  pthread_join(reaper, NULL);
  reaper_started = 0;
}

/* ------------------------------------------------------------------ */
/* The access handler                                                  */
/* ------------------------------------------------------------------ */

enum req_kind { K_ADMIN, K_CONTROL, K_DATA, K_UNKNOWN };

struct req_ctx {
  struct wbd_req req;
  size_t cap;
  size_t limit; /* body bytes this request may send */
  enum req_kind kind;
  const struct wbd_route *row; /* the control route's row */
  char id[64];                 /* data plane: sandbox id and port */
  int port;
  int bad_signature;                          /* a signed /files URL that no sandbox signed */
  long long too_large;                        /* a refused body being read and dropped: its length */
  int spool;                                  /* the body goes to an unlinked file (envd's uploads) */
  int spool_err;                              /* errno of a failed spool write: the rest is dropped */
  long long room;                             /* an upload: the sandbox's free disk bytes (-1: unknown) */
  size_t spooled;                             /* bytes counted in g_spooled */
  char route[160];                            /* the stats / faults name */
  enum { H_NOT, H_WORKER, H_REFUSED } handed; /* where its handler went (serve) */
  enum MHD_Result result;                     /* what serve's handler returned */
};

/* The body limit of a data-plane route, once the caller's credentials are
 * known: a secure sandbox's routes take only a small body (enough for the
 * handler's own 401) without its token or a signature to check. */
static size_t dataplane_limit(struct req_ctx *ctx) {
  struct wbd_sandbox *sb = wbd_sandbox_get(ctx->id);
  if (!sb) return WBD_BODY_UNAUTH;
  int authed = ctx->port == 49983 || ctx->port == 49999
                 ? !routes_.dataplane_body_ok || routes_.dataplane_body_ok(&ctx->req, sb)
                 : 0;
  wbd_sandbox_unref(sb);
  if (!authed) return WBD_BODY_UNAUTH;
  if (ctx->port == 49983 && strcmp(ctx->req.path, "/files") == 0) {
    ctx->spool = strcmp(ctx->req.method, "POST") == 0;
    sb = ctx->spool && routes_.upload_room ? wbd_sandbox_get(ctx->id) : NULL;
    ctx->room = sb ? routes_.upload_room(sb) : -1;
    wbd_sandbox_unref(sb);
    return (size_t)wbd_lim.max_upload_mb << 20;
  }
  return WBD_BODY_DATA;
}

/* A body over its route's limit is answered 413 at once when the client
 * waits for a 100 Continue or the body is large; a smaller one is read and
 * dropped first, then answered: a client that sends its whole body before it
 * reads (most do below 1 MiB, curl's Expect threshold) would otherwise fail
 * its send on the closed connection and never see the 413. */
#define BODY_DRAIN_MAX ((long long)1 << 20)

static int expects_continue(struct wbd_req *req) {
  const char *e = wbd_req_header(req, "Expect");
  return e && strcasecmp(e, "100-continue") == 0;
}

static enum MHD_Result too_large(struct req_ctx *ctx, long long n) {
  return wbd_reply_error(&ctx->req, 413, "request body too large: %lld bytes, this route takes at most %zu", n,
                         ctx->limit);
}

/* Classifies a request when its headers are in: route name, stats, and the
 * body limit. Replies (and returns -1) when it must not go on: the admin
 * gate, or a Content-Length over the limit (unless its body is drained
 * first: ctx->too_large). */
static int classify(struct req_ctx *ctx, enum MHD_Result *r) {
  struct wbd_req *req = &ctx->req;
  int signed_kind;
  if (client_gate(req, r) != 0) return -1;
  if (is_admin_path(req->path)) {
    ctx->kind = K_ADMIN;
    if (admin_gate(req, r) != 0) return -1;
    ctx->limit = WBD_BODY_CONTROL;
  } else if (dataplane_target(req, ctx->id, sizeof ctx->id, &ctx->port)) {
    ctx->kind = K_DATA;
    dataplane_route(req, ctx->port, ctx->route, sizeof ctx->route);
    ctx->limit = dataplane_limit(ctx);
  } else if ((signed_kind = signed_target(req, ctx->id, sizeof ctx->id)) != 0) {
    ctx->kind = K_DATA;
    ctx->port = 49983;
    dataplane_route(req, ctx->port, ctx->route, sizeof ctx->route);
    ctx->bad_signature = signed_kind < 0;
    ctx->limit = ctx->bad_signature ? WBD_BODY_UNAUTH : dataplane_limit(ctx);
  } else if ((ctx->row = wbd_route_match(routes_.table, routes_.n, req->method, req->path, 0))) {
    ctx->kind = K_CONTROL;
    snprintf(ctx->route, sizeof ctx->route, "%s", ctx->row->route);
    const char *key = wbd_req_header(req, "X-API-Key");
    ctx->limit = key && routes_.control_key_ok && routes_.control_key_ok(key) ? WBD_BODY_CONTROL : WBD_BODY_UNAUTH;
  } else {
    ctx->kind = K_UNKNOWN;
    snprintf(ctx->route, sizeof ctx->route, "unknown");
    ctx->limit = WBD_BODY_UNAUTH;
  }
  if (ctx->kind != K_ADMIN) stat_request(ctx->route);
  const char *cl = wbd_req_header(req, MHD_HTTP_HEADER_CONTENT_LENGTH);
  long long n;
  if (cl && wbd_parse_ll(cl, 0, LLONG_MAX, 0, &n) == 0 && (unsigned long long)n > ctx->limit) {
    wbd_stat_add("body_too_large", 1);
    if (n <= BODY_DRAIN_MAX && !expects_continue(req)) {
      ctx->too_large = n;
      ctx->spool = 0;
      return 0;
    }
    *r = too_large(ctx, n);
    return -1;
  }
  /* an upload the sandbox's disk cannot take is refused before its body is read */
  if (ctx->spool && cl && ctx->room >= 0 && wbd_parse_ll(cl, 0, LLONG_MAX, 0, &n) == 0 && n > ctx->room) {
    wbd_stat_add("upload_no_room", 1);
    *r = wbd_reply_error(req, 507, "not enough disk space in the sandbox: the upload has %lld bytes, %lld are free", n,
                         ctx->room);
    return -1;
  }
  return 0;
}

/* A streamed call takes a stream slot of its sandbox's team before its
 * handler runs (an unknown sandbox: the handler's own 502); replies 429
 * (envd: Connect's resource_exhausted) and returns -1 when none is free. */
static int stream_gate(struct req_ctx *ctx, enum MHD_Result *r) {
  struct wbd_sandbox *sb = wbd_sandbox_get(ctx->id);
  if (!sb) return 0;
  char team[64];
  wbd_store_lock();
  snprintf(team, sizeof team, "%s", sb->team);
  wbd_store_unlock();
  wbd_sandbox_unref(sb);
  const char *why;
  if (stream_take(ctx->req.conn, team, &why) == 0) return 0;
  wbd_stat_add("refused_stream", 1);
  char msg[256];
  snprintf(msg, sizeof msg, "too many concurrent streams: %s are all taken; end one and retry", why);
  json_t *e = json_object();
  json_object_set_new(e, "code", ctx->port == 49983 ? json_string("resource_exhausted") : json_integer(429));
  json_object_set_new(e, "message", json_string(msg));
  *r = wbd_reply_json(&ctx->req, 429, e, NULL);
  return -1;
}

static enum MHD_Result dispatch(struct req_ctx *ctx) {
  struct wbd_req *req = &ctx->req;
  if (ctx->kind == K_ADMIN) {
    const struct wbd_route *row = wbd_route_match(routes_.table, routes_.n, req->method, req->path, 1);
    return row && routes_.call ? routes_.call(req, row)
                               : wbd_reply_error(req, 404, "unknown warmboxd knob %s %s", req->method, req->path);
  }
  wbd_sleep_ms(wbd_knob(&wbd_opt.rtt_ms));

  struct wbd_fault *f = fault_take(ctx->route);
  if (f) {
    wbd_sleep_ms(f->delay_ms);
    if (f->drop) {
      fault_free(f);
      return MHD_NO; /* libmicrohttpd closes the connection without an answer */
    }
    if (f->status) {
      const char **hv = NULL;
      size_t nh = f->headers ? json_object_size(f->headers) : 0;
      if (nh) {
        hv = calloc(2 * nh + 1, sizeof *hv);
        if (!hv) abort();
        size_t i = 0;
        const char *k;
        json_t *v;
        json_object_foreach(f->headers, k, v) {
          hv[i++] = k;
          hv[i++] = json_string_value(v);
        }
      }
      enum MHD_Result r;
      if (f->body) {
        r = wbd_reply_raw(req, f->status, "application/json", f->body, strlen(f->body), hv);
      } else {
        json_t *o = json_object();
        json_object_set_new(o, "code", json_integer(f->status));
        json_object_set_new(o, "message", json_string("injected fault"));
        r = wbd_reply_json(req, f->status, o, hv);
      }
      free(hv);
      fault_free(f);
      return r;
    }
    fault_free(f);
  }

  /* envd's own answer to a signature its sandbox's token did not make */
  if (ctx->kind == K_DATA && ctx->bad_signature) return wbd_reply_error(req, 401, "invalid signature");
  if (ctx->kind == K_DATA && stream_route(ctx->port, req->path)) {
    enum MHD_Result r;
    if (stream_gate(ctx, &r) != 0) return r;
  }
  if (ctx->kind == K_DATA && routes_.dataplane) return routes_.dataplane(req, ctx->id, ctx->port);
  if (ctx->kind == K_CONTROL && routes_.call) return routes_.call(req, ctx->row);
  return wbd_reply_error(req, 404, "no route for %s %s", req->method, req->path);
}

/* Bytes of upload bodies spooled now (all connections), bounded by
 * --max-spool-mb. */
static size_t g_spooled;

/* An upload's body goes to an unlinked file in the data directory as it
 * comes (not into memory); the handler reads it from req->body_fd. A body
 * past the sandbox's free disk space or the spool's total is dropped (507). */
static void spool_write(struct req_ctx *ctx, const char *data, size_t n) {
  struct wbd_req *req = &ctx->req;
  if (ctx->spool_err) return;
  if (ctx->room >= 0 && req->body_len + n > (unsigned long long)ctx->room) {
    ctx->spool_err = ENOSPC;
    return;
  }
  size_t cap = (size_t)wbd_lim.max_spool_mb << 20;
  if (__atomic_add_fetch(&g_spooled, n, __ATOMIC_RELAXED) > cap) {
    __atomic_sub_fetch(&g_spooled, n, __ATOMIC_RELAXED);
    ctx->spool_err = EDQUOT;
    return;
  }
  ctx->spooled += n;
  if (req->body_fd < 0) {
    req->body_fd = open(wbd_opt.data_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (req->body_fd < 0) {
      char path[PATH_MAX];
      snprintf(path, sizeof path, "%s/.upload-XXXXXX", wbd_opt.data_dir);
      req->body_fd = mkostemp(path, O_CLOEXEC);
      if (req->body_fd >= 0) unlink(path);
    }
    if (req->body_fd < 0) {
      ctx->spool_err = errno;
      return;
    }
  }
  while (n) {
    ssize_t w = write(req->body_fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ctx->spool_err = w < 0 ? errno : EIO;
      return;
    }
    data += w;
    n -= (size_t)w;
    req->body_len += (size_t)w;
  }
}

static enum MHD_Result spool_failed(struct req_ctx *ctx) {
  int e = ctx->spool_err;
  if (e == EDQUOT) {
    wbd_stat_add("upload_spool_full", 1);
    return wbd_reply_error(&ctx->req, 507,
                           "not enough space to take the upload: the server holds %d MB of uploads "
                           "at once (--max-spool-mb); try again",
                           wbd_lim.max_spool_mb);
  }
  if (e == ENOSPC && ctx->room >= 0)
    return wbd_reply_error(&ctx->req, 507, "not enough disk space in the sandbox: %lld bytes are free", ctx->room);
  if (e == ENOSPC || e == EDQUOT)
    return wbd_reply_error(&ctx->req, 507, "not enough space to take the upload: %s", strerror(e));
  return wbd_reply_error(&ctx->req, 500, "cannot take the upload: %s", strerror(e));
}

/* On a worker, the connection suspended: the handler queues its answer
 * (libmicrohttpd takes one for a suspended connection from any thread),
 * then the connection is resumed. */
static void serve(void *arg) {
  struct req_ctx *ctx = arg;
  enum MHD_Result r = ctx->spool_err ? spool_failed(ctx) : dispatch(ctx);
  if (r == MHD_YES && !ctx->req.replied) r = wbd_reply_error(&ctx->req, 500, "no reply");
  ctx->result = r;
  MHD_resume_connection(ctx->req.conn); /* ctx is the connection's again */
}

/* The request is in: its handler goes to a worker. Called again once the
 * connection is resumed without an answer queued: the handler returned
 * MHD_NO (the connection closes), or no worker took it (503). */
static enum MHD_Result hand_over(struct req_ctx *ctx) {
  if (ctx->handed == H_REFUSED) return wbd_reply_error(&ctx->req, 503, "warmboxd is shutting down");
  if (ctx->handed) return ctx->result;
  watch_mark(ctx->req.conn, W_SERVING);
  ctx->handed = H_WORKER;
  MHD_suspend_connection(ctx->req.conn); /* before the worker can resume it */
  if (wbd_defer_run(serve, ctx) != 0) {
    ctx->handed = H_REFUSED;
    MHD_resume_connection(ctx->req.conn);
  }
  return MHD_YES;
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                      const char *version, const char *upload_data, size_t *upload_data_size,
                                      void **con_cls) {
  (void)cls;
  (void)version;
  struct req_ctx *ctx = *con_cls;
  if (!ctx) {
    ctx = calloc(1, sizeof *ctx);
    if (!ctx) return MHD_NO;
    ctx->req.conn = conn;
    ctx->req.method = method;
    ctx->req.path = url;
    ctx->cap = 256;
    ctx->req.body = malloc(ctx->cap);
    if (!ctx->req.body) {
      free(ctx);
      return MHD_NO;
    }
    ctx->req.body[0] = 0;
    ctx->req.body_fd = -1;
    *con_cls = ctx;
    watch_mark(conn, W_BODY);
    if (wbd_opt.verbose) fprintf(stderr, "warmboxd: %s %s\n", method, url);
    enum MHD_Result r = MHD_NO;
    if (classify(ctx, &r) != 0) return r; /* answered before any body is read */
    return MHD_YES;
  }
  if (ctx->req.replied) {
    *upload_data_size = 0; /* answered early: drop what still comes */
    return MHD_YES;
  }
  if (ctx->too_large) { /* a refused body: dropped, then the 413 */
    if (!*upload_data_size) return too_large(ctx, ctx->too_large);
    watch_body(conn, *upload_data_size);
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (*upload_data_size) {
    size_t n = *upload_data_size;
    if (n > ctx->limit - ctx->req.body_len) {
      /* A body without Content-Length (chunked) ran over: close the
       * connection rather than read on (an answer cannot be queued now). */
      wbd_stat_add("body_too_large", 1);
      return MHD_NO;
    }
    watch_body(conn, n);
    if (ctx->spool) {
      spool_write(ctx, upload_data, n);
      *upload_data_size = 0;
      return MHD_YES;
    }
    if (ctx->req.body_len + n + 1 > ctx->cap) {
      size_t nc = ctx->cap;
      while (nc < ctx->req.body_len + n + 1) nc *= 2;
      char *nb = realloc(ctx->req.body, nc);
      if (!nb) return MHD_NO;
      ctx->req.body = nb;
      ctx->cap = nc;
    }
    memcpy(ctx->req.body + ctx->req.body_len, upload_data, n);
    ctx->req.body_len += n;
    ctx->req.body[ctx->req.body_len] = 0;
    *upload_data_size = 0;
    return MHD_YES;
  }
  return hand_over(ctx);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)toe;
  watch_mark(conn, W_HEAD);
  struct req_ctx *ctx = *con_cls;
  if (!ctx) return;
  if (ctx->req.body_fd >= 0) close(ctx->req.body_fd);
  if (ctx->spooled) __atomic_sub_fetch(&g_spooled, ctx->spooled, __ATOMIC_RELAXED);
  free(ctx->req.body);
  free(ctx);
  *con_cls = NULL;
}

/* libmicrohttpd decodes %XX; Go's query parser (which E2B's server uses) also
 * turns '+' into a space, so do that first. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s) {
  (void)cls;
  (void)c;
  for (char *p = s; *p; p++)
    if (*p == '+') *p = ' ';
  return MHD_http_unescape(s);
}

static void log_mhd(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void log_mhd(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  if (!wbd_opt.verbose) return;
  fprintf(stderr, "warmboxd: libmicrohttpd: ");
  vfprintf(stderr, fmt, ap);
}

/* The polling threads: they only read, write and park, never wait. */
enum { CONN_SLACK = 64, POLL_THREADS = 4 };

/* One listener on sa (tls: the TLS options, MHD_OPTION_END-terminated, or
 * NULL for plain HTTP): every listener serves the same routes. */
static struct MHD_Daemon *start_daemon(struct sockaddr_in *sa, struct MHD_OptionItem *tls) {
  /* The caps are accept_policy's; libmicrohttpd's own, higher, leave room
   * for connections it shut that are not closed yet: under a flood from one
   * address (each new connection shutting an older one) those can be many,
   * so its per-address cap is the total one (a connection refused there
   * would be one accept_policy let in, /health's included). */
  static struct MHD_OptionItem none[] = {{MHD_OPTION_END, 0, NULL}};
  return MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                            MHD_USE_ERROR_LOG | (tls ? MHD_USE_TLS : 0),
                          0, accept_policy, NULL, access_handler, NULL, MHD_OPTION_THREAD_POOL_SIZE,
                          (unsigned)POLL_THREADS, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)sa,
                          MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, notify_connection,
                          NULL, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
                          MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)256 * 1024,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)wbd_lim.conn_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                          (unsigned)wbd_lim.max_conns + CONN_SLACK, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                          (unsigned)wbd_lim.max_conns + CONN_SLACK, MHD_OPTION_ARRAY, tls ? tls : none, MHD_OPTION_END);
}

/* The port d listens on, or fallback. */
static int daemon_port(struct MHD_Daemon *d, int fallback) {
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_LISTEN_FD);
  struct sockaddr_in got;
  socklen_t gl = sizeof got;
  if (info && getsockname(info->listen_fd, (struct sockaddr *)&got, &gl) == 0) return ntohs(got.sin_port);
  return fallback;
}

/* A PEM file's text (malloc'd), or NULL (said on stderr). */
static char *read_pem(const char *what, const char *path) {
  FILE *f = fopen(path, "re");
  char *buf = NULL;
  size_t len = 0;
  if (f) {
    buf = malloc(1 << 20);
    len = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    if (buf && (ferror(f) || len == 0 || !feof(f))) len = 0;
    fclose(f);
  }
  if (!buf || len == 0) {
    fprintf(stderr, "warmboxd: cannot read the TLS %s %s%s%s\n", what, path, f ? "" : ": ", f ? "" : strerror(errno));
    free(buf);
    return NULL;
  }
  buf[len] = 0;
  return buf;
}

/* --tls-cert/--tls-key: the second listener, serving HTTPS (libmicrohttpd's
 * TLS, GnuTLS). 0 (none asked for, or started), -1 (said on stderr). */
static int start_tls(struct sockaddr_in sa) {
  if (!wbd_lim.tls_cert && !wbd_lim.tls_key) return 0;
  if (!wbd_lim.tls_cert || !wbd_lim.tls_key) {
    fprintf(stderr, "warmboxd: --tls-cert and --tls-key go together\n");
    return -1;
  }
  tls_cert_pem = read_pem("certificate", wbd_lim.tls_cert);
  tls_key_pem = tls_cert_pem ? read_pem("key", wbd_lim.tls_key) : NULL;
  if (!tls_key_pem) return -1;
  struct MHD_OptionItem tls[] = {
    {MHD_OPTION_HTTPS_MEM_CERT, 0, tls_cert_pem},
    {MHD_OPTION_HTTPS_MEM_KEY, 0, tls_key_pem},
    {MHD_OPTION_END, 0, NULL},
  };
  sa.sin_port = htons((uint16_t)wbd_lim.tls_port);
  tls_daemon = start_daemon(&sa, tls);
  if (!tls_daemon) {
    fprintf(stderr,
            "warmboxd: cannot serve TLS on %s:%d (a PEM certificate and key, and libmicrohttpd "
            "built with TLS, are needed)\n",
            wbd_opt.host, wbd_lim.tls_port);
    return -1;
  }
  tls_port = daemon_port(tls_daemon, wbd_lim.tls_port);
  return 0;
}

int wbd_server_start(void) {
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)wbd_opt.port);
  const char *host = wbd_opt.host;
  if (strcmp(host, "localhost") == 0) host = "127.0.0.1";
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    fprintf(stderr, "warmboxd: --host must be an IPv4 address, got '%s'\n", wbd_opt.host);
    return -1;
  }
  if (wbd_defer_start() != 0) {
    fprintf(stderr, "warmboxd: cannot start the server's workers: %s\n", strerror(errno));
    return -1;
  }
  daemon_ = start_daemon(&sa, NULL);
  if (!daemon_) {
    fprintf(stderr, "warmboxd: cannot listen on %s:%d: %s\n", wbd_opt.host, wbd_opt.port, strerror(errno));
    wbd_defer_stop();
    return -1;
  }
  if (start_tls(sa) != 0) {
    MHD_stop_daemon(daemon_);
    daemon_ = NULL;
    wbd_defer_stop();
    return -1;
  }
  if (pthread_create(&reaper, NULL, reaper_main, NULL) == 0) reaper_started = 1;
  bound_port = daemon_port(daemon_, wbd_opt.port);
  return 0;
}

int wbd_server_tls_port(void) {
  return tls_daemon ? tls_port : 0;
}

int wbd_server_port(void) {
  return bound_port;
}

void wbd_server_quiesce(void) {
  if (!daemon_) return;
  MHD_socket fd = MHD_quiesce_daemon(daemon_);
  if (fd != MHD_INVALID_SOCKET) close(fd);
  if (tls_daemon && (fd = MHD_quiesce_daemon(tls_daemon)) != MHD_INVALID_SOCKET) close(fd);
}

void wbd_server_stop(void) {
  reaper_end();
  wbd_defer_stop(); /* libmicrohttpd stops only with no connection suspended */
  if (daemon_) MHD_stop_daemon(daemon_);
  daemon_ = NULL;
  if (tls_daemon) MHD_stop_daemon(tls_daemon);
  tls_daemon = NULL;
  free(tls_cert_pem);
  free(tls_key_pem);
  tls_cert_pem = tls_key_pem = NULL;
}

void wbd_stats_free(void) {
  pthread_mutex_lock(&stats_mu);
  table_clear(&routes);
  table_clear(&counters);
  pthread_mutex_unlock(&stats_mu);
  wbd_faults_clear();
}
