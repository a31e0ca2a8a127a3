/*
 * rpc.c: what envd's Connect-RPC services share (envd.c's filesystem,
 * process.c's process): Connect errors and replies, the request's user,
 * content types and protojson fields, a server stream's reader (envd.h).
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
/* Connect errors and replies                                          */
/* ------------------------------------------------------------------ */

static unsigned connect_status(const char *code) {
  static const struct {
    const char *code;
    unsigned status;
  } map[] = {
    {"canceled", 499},
    {"unknown", 500},
    {"invalid_argument", 400},
    {"deadline_exceeded", 504},
    {"not_found", 404},
    {"already_exists", 409},
    {"permission_denied", 403},
    {"resource_exhausted", 429},
    {"failed_precondition", 400},
    {"aborted", 409},
    {"out_of_range", 400},
    {"unimplemented", 501},
    {"internal", 500},
    {"unavailable", 503},
    {"data_loss", 500},
    {"unauthenticated", 401},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (strcmp(map[i].code, code) == 0) return map[i].status;
  return 500;
}

json_t *wbd_connect_error_json(const char *code, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  json_t *e = json_object();
  json_object_set_new(e, "code", json_string(code));
  json_object_set_new(e, "message", wbd_json_str(msg));
  return e;
}

/* A unary Connect error: non-200 status, {"code":"<connect code>","message"}. */
enum MHD_Result wbd_rpc_error(struct wbd_req *req, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  json_t *e = wbd_connect_error_json(code, fmt, ap);
  va_end(ap);
  return wbd_reply_json(req, connect_status(code), e, NULL);
}

enum MHD_Result wbd_rpc_ok(struct wbd_req *req, json_t *body) {
  return wbd_reply_json(req, 200, body ? body : json_object(), NULL);
}

/* ------------------------------------------------------------------ */
/* Users                                                               */
/* ------------------------------------------------------------------ */

int wbd_known_user(const char *u) {
  return !u || !*u || strcmp(u, "user") == 0 || strcmp(u, "root") == 0;
}

/* RPCs carry the user as Authorization: Basic base64("<user>:"). Returns 0
 * with the user's name in `name` ("" when none is given), or -1 with the
 * unknown name there. */
int wbd_rpc_user(struct wbd_req *req, char *name, size_t len) {
  name[0] = 0;
  const char *auth = wbd_req_header(req, "Authorization");
  if (!auth || strncasecmp(auth, "Basic ", 6) != 0) return 0;
  size_t n;
  unsigned char *dec = wbd_b64_decode(auth + 6, &n);
  if (!dec) {
    snprintf(name, len, "%s", "(malformed)");
    return -1;
  }
  char *colon = strchr((char *)dec, ':');
  if (colon) *colon = 0;
  int ok = wbd_known_user((char *)dec);
  snprintf(name, len, "%s", (char *)dec);
  free(dec);
  return ok ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* Request bodies                                                      */
/* ------------------------------------------------------------------ */

int wbd_content_type_is(struct wbd_req *req, const char *want) {
  const char *ct = wbd_req_header(req, "Content-Type");
  if (!ct) return 0;
  size_t n = strlen(want);
  return strncasecmp(ct, want, n) == 0 && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

/* A string field, accepting protojson's lowerCamelCase or the proto name. */
const char *wbd_jstr(json_t *o, const char *camel, const char *snake) {
  json_t *v = json_object_get(o, camel);
  if (!v && snake) v = json_object_get(o, snake);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

long long wbd_jint(json_t *o, const char *name, long long def) {
  json_t *v = json_object_get(o, name);
  if (json_is_integer(v)) return json_integer_value(v);
  long long n;
  if (json_is_string(v) && wbd_parse_ll(json_string_value(v), LLONG_MIN / 2, LLONG_MAX / 2, def, &n) == 0) return n;
  return def;
}

ssize_t wbd_rpc_stream_read(struct MHD_Connection *conn, struct wbd_buf *buf, const int *phase,
                            int (*step)(void *cls, int wait_fds[2]), void *cls, char *out, size_t max) {
  for (;;) {
    size_t n = wbd_buf_take(buf, out, max);
    if (n) return (ssize_t)n;
    if (*phase == WBD_STREAM_DONE) return MHD_CONTENT_READER_END_OF_STREAM;
    if (*phase == WBD_STREAM_ABORT) return MHD_CONTENT_READER_END_WITH_ERROR;
    int fds[2], wait_ms = step(cls, fds);
    if (wait_ms > 0) return wbd_park(conn, fds[0], fds[1], wait_ms) == 0 ? 0 : MHD_CONTENT_READER_END_WITH_ERROR;
  }
}

void wbd_connect_frame(struct wbd_buf *b, unsigned char flag, json_t *msg) {
  char *s = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  size_t n = s ? strlen(s) : 0;
  unsigned char hdr[5] = {flag, (unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8),
                          (unsigned char)n};
  if (wbd_buf_add(b, hdr, 5) != 0 || (s && wbd_buf_add(b, s, n) != 0)) abort();
  free(s);
}

int64_t wbd_rpc_header_num(struct wbd_req *req, const char *name, int64_t hi) {
  const char *v = wbd_req_header(req, name);
  long long n;
  if (!v || !isdigit((unsigned char)*v) || wbd_parse_ll(v, 0, hi, -1, &n) != 0) return -1;
  return n;
}
