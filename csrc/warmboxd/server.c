/*
 * server.c: the HTTP server (libmicrohttpd, one thread per connection so a
 * handler may block), routing between the control plane, the knobs and the
 * data plane, request statistics and fault injection.
 */
#include "wbd_int.h"
#include "envd_util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WBD_MAX_BODY ((size_t)1 << 30)

static struct MHD_Daemon *daemon_;
static int bound_port;

/* ------------------------------------------------------------------ */
/* Time                                                                */
/* ------------------------------------------------------------------ */

int64_t wbd_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void wbd_format_time(int64_t us, char *buf, size_t len) {
  time_t s = (time_t)(us / 1000000);
  int64_t frac = us % 1000000;
  if (frac < 0) {
    frac += 1000000;
    s -= 1;
  }
  struct tm tm;
  gmtime_r(&s, &tm);
  snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%06lld000Z", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long long)frac);
}

void wbd_sleep_ms(int ms) {
  if (ms <= 0) return;
  struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
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

/* ------------------------------------------------------------------ */
/* Faults                                                              */
/* ------------------------------------------------------------------ */

struct fault {
  char *route;
  long count;
  unsigned status;
  char *body;        /* NULL: E2B error body */
  json_t *headers;   /* object or NULL */
  int delay_ms;
  int drop;
  struct fault *next;
};

static pthread_mutex_t faults_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fault *faults, **faults_tail = &faults;

static void fault_free(struct fault *f) {
  free(f->route);
  free(f->body);
  json_decref(f->headers);
  free(f);
}

static void faults_clear(void) {
  pthread_mutex_lock(&faults_mu);
  while (faults) {
    struct fault *f = faults;
    faults = f->next;
    fault_free(f);
  }
  faults_tail = &faults;
  pthread_mutex_unlock(&faults_mu);
}

/* Takes one use of the first fault matching `route`; the caller owns the copy. */
static struct fault *fault_take(const char *route) {
  struct fault *copy = NULL;
  pthread_mutex_lock(&faults_mu);
  for (struct fault **pp = &faults; *pp; pp = &(*pp)->next) {
    struct fault *f = *pp;
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

struct req_ctx {
  struct wbd_req req;
  size_t cap;
  int too_big;
};

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

enum MHD_Result wbd_reply_raw(struct wbd_req *req, unsigned status, const char *content_type,
                              const void *data, size_t len, const char *const *headers) {
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(len, (void *)(uintptr_t)data, MHD_RESPMEM_MUST_COPY);
  if (!resp) return MHD_NO;
  if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  add_headers(resp, headers);
  return queue(req, status, resp);
}

enum MHD_Result wbd_reply_json(struct wbd_req *req, unsigned status, json_t *body,
                               const char *const *headers) {
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

static enum MHD_Result vreply_error(struct wbd_req *req, unsigned status, const char *const *headers,
                                    const char *fmt, va_list ap) {
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
                                 MHD_ContentReaderCallback reader, void *cls,
                                 MHD_ContentReaderFreeCallback done, const char *const *headers) {
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
/* Knobs: stats and faults                                             */
/* ------------------------------------------------------------------ */

static enum MHD_Result knob_stats(struct wbd_req *req) {
  long running, paused;
  wbd_store_lock();
  wbd_store_counts_locked(&running, &paused);
  wbd_store_unlock();
  json_t *o = json_object();
  pthread_mutex_lock(&stats_mu);
  json_object_set_new(o, "requests", table_json(&routes));
  json_t *c = table_json(&counters);
  static const char *const known[] = { "exec_overlap", "kill_during_run", "pause_during_run" };
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (!json_object_get(c, known[i])) json_object_set_new(c, known[i], json_integer(0));
  json_object_set_new(o, "counters", c);
  json_object_set_new(o, "total_requests", json_integer(total_requests));
  pthread_mutex_unlock(&stats_mu);
  json_t *s = json_object();
  json_object_set_new(s, "running", json_integer(running));
  json_object_set_new(s, "paused", json_integer(paused));
  json_object_set_new(o, "sandboxes", s);
  return wbd_reply_json(req, 200, o, NULL);
}

static enum MHD_Result knob_stats_reset(struct wbd_req *req) {
  pthread_mutex_lock(&stats_mu);
  table_clear(&routes);
  table_clear(&counters);
  total_requests = 0;
  pthread_mutex_unlock(&stats_mu);
  return wbd_reply_json(req, 204, NULL, NULL);
}

static enum MHD_Result knob_fault_add(struct wbd_req *req) {
  json_error_t err;
  json_t *o = json_loadb(req->body, req->body_len, 0, &err);
  if (!json_is_object(o)) {
    json_decref(o);
    return wbd_reply_error(req, 400, "fault: a JSON object is required");
  }
  json_t *route = json_object_get(o, "route"), *count = json_object_get(o, "count"),
         *status = json_object_get(o, "status"), *body = json_object_get(o, "body"),
         *headers = json_object_get(o, "headers"), *delay = json_object_get(o, "delay_ms"),
         *drop = json_object_get(o, "drop");
  const char *bad = NULL;
  if (!json_is_string(route)) bad = "route (string) is required";
  else if (count && !json_is_integer(count)) bad = "count must be an integer";
  else if (status && !json_is_integer(status)) bad = "status must be an integer";
  else if (status && (json_integer_value(status) < 100 || json_integer_value(status) > 599))
    bad = "status must be 100..599";
  else if (body && !json_is_string(body)) bad = "body must be a string";
  else if (headers && !json_is_object(headers)) bad = "headers must be an object";
  else if (delay && !json_is_integer(delay)) bad = "delay_ms must be an integer";
  else if (drop && !json_is_boolean(drop)) bad = "drop must be a boolean";
  if (bad) {
    json_decref(o);
    return wbd_reply_error(req, 400, "fault: %s", bad);
  }
  if (headers) {
    const char *k;
    json_t *v;
    json_object_foreach(headers, k, v) {
      if (!json_is_string(v)) {
        json_decref(o);
        return wbd_reply_error(req, 400, "fault: header values must be strings");
      }
    }
  }
  struct fault *f = calloc(1, sizeof *f);
  if (!f) abort();
  f->route = strdup(json_string_value(route));
  f->count = count ? (long)json_integer_value(count) : 1;
  f->status = status ? (unsigned)json_integer_value(status) : 0;
  f->body = body ? strdup(json_string_value(body)) : NULL;
  f->headers = headers ? json_incref(headers) : NULL;
  f->delay_ms = delay ? (int)json_integer_value(delay) : 0;
  f->drop = drop ? json_is_true(drop) : 0;
  json_decref(o);
  if (f->count <= 0) {
    fault_free(f);
    return wbd_reply_json(req, 204, NULL, NULL);
  }
  pthread_mutex_lock(&faults_mu);
  *faults_tail = f;
  faults_tail = &f->next;
  pthread_mutex_unlock(&faults_mu);
  return wbd_reply_json(req, 204, NULL, NULL);
}

static enum MHD_Result knob_handle(struct wbd_req *req) {
  const char *p = req->path + strlen("/_warmboxd");
  const char *m = req->method;
  if (strcmp(p, "/stats") == 0 && strcmp(m, "GET") == 0) return knob_stats(req);
  if (strcmp(p, "/stats/reset") == 0 && strcmp(m, "POST") == 0) return knob_stats_reset(req);
  if (strcmp(p, "/faults") == 0 && strcmp(m, "POST") == 0) return knob_fault_add(req);
  if (strcmp(p, "/faults") == 0 && strcmp(m, "DELETE") == 0) {
    faults_clear();
    return wbd_reply_json(req, 204, NULL, NULL);
  }
  if (strcmp(p, "/config") == 0 && strcmp(m, "POST") == 0) return wbd_knob_config(req);
  if (strcmp(p, "/seed") == 0 && strcmp(m, "POST") == 0) return wbd_knob_seed(req);
  return wbd_reply_error(req, 404, "unknown warmboxd knob %s %s", m, req->path);
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
    *port = atoi(hport);
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

static void dataplane_route(struct wbd_req *req, int port, char *buf, size_t len) {
  const char *svc = port == 49983 ? "envd" : port == 49999 ? "interp" : NULL;
  char pbuf[16];
  if (!svc) {
    snprintf(pbuf, sizeof pbuf, "port%d", port);
    svc = pbuf;
  }
  const char *path = req->path;
  if (port == 49999 && strncmp(path, "/contexts/", 10) == 0) {
    const char *rest = strchr(path + 10, '/');
    snprintf(buf, len, "%s %s /contexts/{id}%s", svc, req->method, rest ? rest : "");
    return;
  }
  snprintf(buf, len, "%s %s %s", svc, req->method, path);
}

static enum MHD_Result sandbox_gone(struct wbd_req *req, const char *id) {
  json_t *o = json_object();
  json_object_set_new(o, "sandboxId", wbd_json_str(id));
  json_object_set_new(o, "message", json_string("The sandbox was not found"));
  json_object_set_new(o, "code", json_integer(502));
  return wbd_reply_json(req, 502, o, NULL);
}

static enum MHD_Result dataplane(struct wbd_req *req, const char *id, int port) {
  struct wbd_sandbox *sb = wbd_sandbox_get(id);
  if (!sb) return sandbox_gone(req, id);
  wbd_store_lock();
  enum wbd_state st = sb->state;
  int can_resume = sb->auto_resume && sb->paused_with_memory;
  wbd_store_unlock();
  if (st == WBD_PAUSED) {
    if (!can_resume) {
      wbd_sandbox_unref(sb);
      return sandbox_gone(req, id);
    }
    int rc = wbd_sandbox_auto_resume(sb);
    if (rc == 429) {
      wbd_sandbox_unref(sb);
      return wbd_reply_error(req, 429, "you have reached the maximum number of concurrent E2B sandboxes (%d). "
                             "If you need more, please visit 'https://e2b.dev/docs/billing'",
                             wbd_knob(&wbd_opt.max_running));
    }
    if (rc != 0) {
      wbd_sandbox_unref(sb);
      return sandbox_gone(req, id);
    }
  }
  enum MHD_Result r = wbd_dataplane_handle(req, sb, port);
  wbd_sandbox_unref(sb);
  return r;
}

/* ------------------------------------------------------------------ */
/* The access handler                                                  */
/* ------------------------------------------------------------------ */

static enum MHD_Result dispatch(struct wbd_req *req) {
  if (strncmp(req->path, "/_warmboxd/", 11) == 0) return knob_handle(req);

  char id[64], route[512];
  int port = 0;
  int dp = dataplane_target(req, id, sizeof id, &port);
  const char *croute = NULL;
  if (dp) {
    dataplane_route(req, port, route, sizeof route);
  } else {
    croute = wbd_control_route(req->method, req->path);
    snprintf(route, sizeof route, "%s", croute ? croute : "");
    if (!croute) snprintf(route, sizeof route, "%s %s", req->method, req->path);
  }
  stat_request(route);
  wbd_sleep_ms(wbd_knob(&wbd_opt.rtt_ms));

  struct fault *f = fault_take(route);
  if (f) {
    wbd_sleep_ms(f->delay_ms);
    if (f->drop) {
      fault_free(f);
      return MHD_NO;  /* libmicrohttpd closes the connection without an answer */
    }
    if (f->status) {
      const char **hv = NULL;
      size_t nh = f->headers ? json_object_size(f->headers) : 0;
      if (nh) {
        hv = calloc(2 * nh + 1, sizeof *hv);
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

  if (dp) return dataplane(req, id, port);
  if (!croute) return wbd_reply_error(req, 404, "no route for %s %s", req->method, req->path);
  return wbd_control_handle(req, croute);
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version, const char *upload_data,
                                      size_t *upload_data_size, void **con_cls) {
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
    *con_cls = ctx;
    return MHD_YES;
  }
  if (*upload_data_size) {
    size_t n = *upload_data_size;
    if (ctx->too_big || ctx->req.body_len + n > WBD_MAX_BODY) {
      ctx->too_big = 1;
    } else {
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
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (ctx->req.replied) return MHD_YES;
  if (ctx->too_big) return wbd_reply_error(&ctx->req, 413, "request body too large");
  if (wbd_opt.verbose) fprintf(stderr, "warmboxd: %s %s\n", method, url);
  enum MHD_Result r = dispatch(&ctx->req);
  if (r == MHD_YES && !ctx->req.replied) r = wbd_reply_error(&ctx->req, 500, "no reply");
  return r;
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)conn;
  (void)toe;
  struct req_ctx *ctx = *con_cls;
  if (!ctx) return;
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

static void log_mhd(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  if (!wbd_opt.verbose) return;
  fprintf(stderr, "warmboxd: libmicrohttpd: ");
  vfprintf(stderr, fmt, ap);
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
  daemon_ = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                                 MHD_USE_ITC | MHD_USE_ERROR_LOG,
                             0, NULL, NULL, access_handler, NULL,
                             MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                             MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
                             MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
                             MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
                             MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024,
                             MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)256 * 1024,
                             MHD_OPTION_END);
  if (!daemon_) {
    fprintf(stderr, "warmboxd: cannot listen on %s:%d: %s\n", wbd_opt.host, wbd_opt.port, strerror(errno));
    return -1;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_LISTEN_FD);
  struct sockaddr_in got;
  socklen_t gl = sizeof got;
  if (info && getsockname(info->listen_fd, (struct sockaddr *)&got, &gl) == 0)
    bound_port = ntohs(got.sin_port);
  else
    bound_port = wbd_opt.port;
  return 0;
}

int wbd_server_port(void) { return bound_port; }

void wbd_server_quiesce(void) {
  if (!daemon_) return;
  MHD_socket fd = MHD_quiesce_daemon(daemon_);
  if (fd != MHD_INVALID_SOCKET) close(fd);
}

void wbd_server_stop(void) {
  if (daemon_) MHD_stop_daemon(daemon_);
  daemon_ = NULL;
}

void wbd_stats_free(void) {
  pthread_mutex_lock(&stats_mu);
  table_clear(&routes);
  table_clear(&counters);
  pthread_mutex_unlock(&stats_mu);
  faults_clear();
}
