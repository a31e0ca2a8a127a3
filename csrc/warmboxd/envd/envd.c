/*
 * envd.c: the in-sandbox daemon's API (port 49983) as E2B's envd serves it:
 * the HTTP routes (/health, /envs, /metrics, /files) and the Connect-RPC
 * services filesystem.Filesystem and process.Process with the JSON codec.
 *
 * Every path goes through envd_fs.c, which confines it to the sandbox's
 * /home/user and /tmp. Process.Start is a server stream: one envelope per
 * event, written by a reader that parks its connection while there is none.
 */
#include "runtime.h"
#include "envd_fs.h"
#include "envd_util.h"
#include "envd_watch.h"
#include "wbd_int.h"   /* wbd_lim.max_upload_mb: the cap of an inflated upload */

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

#define ENVD_HOME "/home/user"

/* ------------------------------------------------------------------ */
/* Connect errors and replies                                          */
/* ------------------------------------------------------------------ */

static unsigned connect_status(const char *code) {
  static const struct { const char *code; unsigned status; } map[] = {
    { "canceled", 499 }, { "unknown", 500 }, { "invalid_argument", 400 },
    { "deadline_exceeded", 504 }, { "not_found", 404 }, { "already_exists", 409 },
    { "permission_denied", 403 }, { "resource_exhausted", 429 }, { "failed_precondition", 400 },
    { "aborted", 409 }, { "out_of_range", 400 }, { "unimplemented", 501 }, { "internal", 500 },
    { "unavailable", 503 }, { "data_loss", 500 }, { "unauthenticated", 401 },
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (strcmp(map[i].code, code) == 0) return map[i].status;
  return 500;
}

static json_t *connect_error_json(const char *code, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static json_t *connect_error_json(const char *code, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  json_t *e = json_object();
  json_object_set_new(e, "code", json_string(code));
  json_object_set_new(e, "message", wbd_json_str(msg));
  return e;
}

/* A unary Connect error: non-200 status, {"code":"<connect code>","message"}. */
static enum MHD_Result rpc_error(struct wbd_req *req, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum MHD_Result rpc_error(struct wbd_req *req, const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  json_t *e = connect_error_json(code, fmt, ap);
  va_end(ap);
  return wbd_reply_json(req, connect_status(code), e, NULL);
}

static enum MHD_Result rpc_ok(struct wbd_req *req, json_t *body) {
  return wbd_reply_json(req, 200, body ? body : json_object(), NULL);
}

/* The Connect code for a filesystem errno. */
static const char *errno_code(int err) {
  switch (-err) {
    case ENOENT: return "not_found";
    case EACCES: case EPERM: case EROFS: return "permission_denied";
    case EEXIST: case ENOTEMPTY: return "already_exists";
    case ENOTDIR: case EISDIR: case EINVAL: case ENAMETOOLONG: case ELOOP: case EXDEV: return "invalid_argument";
    case ENOSPC: case EDQUOT: return "resource_exhausted";
    case ESTALE: return "unavailable";
    default: return "internal";
  }
}

static enum MHD_Result rpc_fs_error(struct wbd_req *req, int err, const char *path) {
  if (err == -ENOENT) return rpc_error(req, "not_found", "no such file or directory: '%s'", path);
  return rpc_error(req, errno_code(err), "'%s': %s", path, wbd_fs_strerror(err));
}

/* ------------------------------------------------------------------ */
/* Users                                                               */
/* ------------------------------------------------------------------ */

static int known_user(const char *u) {
  return !u || !*u || strcmp(u, "user") == 0 || strcmp(u, "root") == 0;
}

/* RPCs carry the user as Authorization: Basic base64("<user>:"). Returns 0
 * with the user's name in `name` ("" when none is given), or -1 with the
 * unknown name there. */
static int rpc_user(struct wbd_req *req, char *name, size_t len) {
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
  int ok = known_user((char *)dec);
  snprintf(name, len, "%s", (char *)dec);
  free(dec);
  return ok ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* Request bodies                                                      */
/* ------------------------------------------------------------------ */

static int content_type_is(struct wbd_req *req, const char *want) {
  const char *ct = wbd_req_header(req, "Content-Type");
  if (!ct) return 0;
  size_t n = strlen(want);
  return strncasecmp(ct, want, n) == 0 && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

/* A string field, accepting protojson's lowerCamelCase or the proto name. */
static const char *jstr(json_t *o, const char *camel, const char *snake) {
  json_t *v = json_object_get(o, camel);
  if (!v && snake) v = json_object_get(o, snake);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static long long jint(json_t *o, const char *name, long long def) {
  json_t *v = json_object_get(o, name);
  if (json_is_integer(v)) return json_integer_value(v);
  long long n;
  if (json_is_string(v) && wbd_parse_ll(json_string_value(v), LLONG_MIN / 2, LLONG_MAX / 2, def, &n) == 0) return n;
  return def;
}

/* ------------------------------------------------------------------ */
/* GET /files, POST /files                                             */
/* ------------------------------------------------------------------ */

/* envd's /files auth: the token when sent, else a URL signature. */
static int files_auth(struct wbd_req *req, struct wbd_sandbox *sb, const char *op, const char *path,
                      const char *user, const char **why) {
  if (!sb->secure || !sb->access_token[0]) return 0;
  const char *tok = wbd_req_header(req, "X-Access-Token");
  if (tok) {
    if (wbd_str_eq_ct(tok, sb->access_token)) return 0;
    *why = "unauthorized access, please provide a valid access token or method signing if supported";
    return -1;
  }
  const char *sig = wbd_req_query(req, "signature");
  const char *exp = wbd_req_query(req, "signature_expiration");
  if (!sig) {
    *why = "missing signature query parameter";
    return -1;
  }
  if (exp) {
    char *end;
    long long e = strtoll(exp, &end, 10);
    if (*exp == 0 || *end != 0) {
      *why = "invalid signature expiration";
      return -1;
    }
    if (e < (long long)time(NULL)) {
      *why = "signature is already expired";
      return -1;
    }
  }
  char want[64];
  wbd_files_signature(path, op, user, sb->access_token, exp, want);
  if (wbd_str_eq_ct(sig, want)) return 0;
  *why = "invalid signature";
  return -1;
}

long long wbd_envd_upload_room(struct wbd_sandbox *sb) {
  char home[PATH_MAX];
  struct statvfs v;
  if (statvfs(wbd_rt_home(sb, home, sizeof home), &v) != 0) return -1;
  return (long long)v.f_bavail * (long long)v.f_frsize;
}

int wbd_envd_body_authorized(struct wbd_req *req, struct wbd_sandbox *sb) {
  if (!sb->secure || !sb->access_token[0]) return 1;
  const char *tok = wbd_req_header(req, "X-Access-Token");
  if (tok) return wbd_str_eq_ct(tok, sb->access_token);
  if (strcmp(req->path, "/files") != 0 || strcmp(req->method, "POST") != 0) return 0;
  const char *path = wbd_req_query(req, "path"), *why = NULL;
  return files_auth(req, sb, "write", path ? path : "", wbd_req_query(req, "username"), &why) == 0;
}

/* The HTTP error for a /files path error. */
static enum MHD_Result files_path_error(struct wbd_req *req, int err, const char *shown) {
  switch (-err) {
    case ENOENT: return wbd_reply_error(req, 404, "path '%s' does not exist", shown);
    case EISDIR: return wbd_reply_error(req, 400, "path '%s' is a directory", shown);
    case ENOTDIR: return wbd_reply_error(req, 400, "path '%s': a parent is not a directory", shown);
    case EACCES: case EPERM: case ELOOP: case ENAMETOOLONG: case EINVAL:
      return wbd_reply_error(req, 400, "invalid path '%s': %s", shown, wbd_fs_strerror(err));
    case ENOSPC: case EDQUOT: return wbd_reply_error(req, 507, "not enough disk space for '%s'", shown);
    default: return wbd_reply_error(req, 500, "'%s': %s", shown, wbd_fs_strerror(err));
  }
}

/* Large downloads are streamed from the open file rather than held in memory. */
#define FILES_INLINE_MAX (4u << 20)

/* A download sends at most the size the file had when it was opened: a
 * sandbox growing the file meanwhile must not make one request endless. */
struct fstream {
  int fd;
  uint64_t size;
};

static ssize_t fstream_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct fstream *f = cls;
  if (pos >= f->size) return MHD_CONTENT_READER_END_OF_STREAM;
  if (max > f->size - pos) max = (size_t)(f->size - pos);
  for (;;) {
    ssize_t n = pread(f->fd, out, max, (off_t)pos);
    if (n > 0) return n;
    if (n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    if (errno != EINTR) return MHD_CONTENT_READER_END_WITH_ERROR;
  }
}

static void fstream_done(void *cls) {
  struct fstream *f = cls;
  close(f->fd);
  free(f);
}

/* ---- gzip (Content-Encoding on POST /files, Accept-Encoding on GET) ---- */

/* Whether Accept-Encoding lists gzip (or *) with a q-value above 0. */
static int accepts_gzip(const char *ae) {
  if (!ae) return 0;
  const char *p = ae;
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    const char *tok = p;
    while (*p && *p != ',' && *p != ';' && *p != ' ' && *p != '\t') p++;
    size_t n = (size_t)(p - tok);
    double q = 1.0;
    const char *end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    const char *qs = p;
    while (qs < end && (qs = strchr(qs, ';')) && qs < end) {
      qs++;
      while (*qs == ' ' || *qs == '\t') qs++;
      if ((qs[0] == 'q' || qs[0] == 'Q') && qs[1] == '=') q = strtod(qs + 2, NULL);
    }
    if (((n == 4 && strncasecmp(tok, "gzip", 4) == 0) || (n == 1 && *tok == '*')) && q > 0) return 1;
    p = end;
  }
  return 0;
}

/* gzip of len bytes into out; 0 or -1. */
static int gzip_buf(const char *data, size_t len, struct wbd_buf *out) {
  z_stream z = { 0 };
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) return -1;
  uLong bound = deflateBound(&z, (uLong)len);
  char *buf = malloc(bound ? bound : 1);
  if (!buf) {
    deflateEnd(&z);
    return -1;
  }
  z.next_in = (Bytef *)(uintptr_t)data;
  z.avail_in = (uInt)len;
  z.next_out = (Bytef *)buf;
  z.avail_out = (uInt)bound;
  int rc = deflate(&z, Z_FINISH);
  size_t n = z.total_out;
  deflateEnd(&z);
  if (rc != Z_STREAM_END || wbd_buf_add(out, buf, n) != 0) {
    free(buf);
    return -1;
  }
  free(buf);
  return 0;
}

/* The request body, chunk by chunk, to a sink (0, or nonzero to stop). */
typedef int (*body_sink)(void *cls, const char *data, size_t len);

#define FEED_CORRUPT (-1)    /* not a gzip stream, or a truncated one */
#define FEED_OVER_CAP (-2)   /* inflates to more than the cap: a decompression bomb */
#define FEED_NO_MEMORY (-3)
#define FEED_READ (-4)       /* the spooled body could not be read */
#define FEED_SINK (-5)       /* the sink stopped */

/* A gzip (or zlib) stream inflated on the way to the sink, at most cap bytes. */
struct inflater {
  z_stream z;
  size_t out, cap;
  int ended, err;           /* err: the FEED_* error that stopped it */
  body_sink sink;
  void *cls;
};

static int inflate_step(struct inflater *f, const char *data, size_t len) {
  char chunk[65536];
  f->z.next_in = (Bytef *)(uintptr_t)data;
  f->z.avail_in = (uInt)len;
  while (!f->ended && (f->z.avail_in || len == 0)) {
    f->z.next_out = (Bytef *)chunk;
    f->z.avail_out = sizeof chunk;
    int rc = inflate(&f->z, len ? Z_NO_FLUSH : Z_FINISH);
    if (rc == Z_MEM_ERROR) return FEED_NO_MEMORY;
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) return FEED_CORRUPT;
    size_t n = sizeof chunk - f->z.avail_out;
    if ((f->out += n) > f->cap) return FEED_OVER_CAP;
    if (n && f->sink(f->cls, chunk, n) != 0) return FEED_SINK;
    f->ended = rc == Z_STREAM_END;
    if (n == 0 && (len == 0 || rc == Z_BUF_ERROR)) break;   /* needs more input */
  }
  return len == 0 && !f->ended ? FEED_CORRUPT : 0;
}

static int inflate_chunk(void *cls, const char *data, size_t len) {
  struct inflater *f = cls;
  return (f->err = inflate_step(f, data, len));
}

/* The raw body (in memory, or spooled to req->body_fd) to sink. */
static int feed_raw(struct wbd_req *req, body_sink sink, void *cls) {
  if (req->body_fd < 0) return req->body_len && sink(cls, req->body, req->body_len) != 0 ? FEED_SINK : 0;
  char chunk[65536];
  for (off_t off = 0; (size_t)off < req->body_len;) {
    size_t want = req->body_len - (size_t)off < sizeof chunk ? req->body_len - (size_t)off : sizeof chunk;
    ssize_t n = pread(req->body_fd, chunk, want, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return FEED_READ;
    if (sink(cls, chunk, (size_t)n) != 0) return FEED_SINK;
    off += n;
  }
  return 0;
}

/* The body to sink, inflated first when gz (at most cap bytes then): 0 or a FEED_* error. */
static int feed_body(struct wbd_req *req, int gz, size_t cap, body_sink sink, void *cls) {
  if (!gz) return feed_raw(req, sink, cls);
  struct inflater f = { .cap = cap, .sink = sink, .cls = cls };
  if (inflateInit2(&f.z, 32 + MAX_WBITS) != Z_OK) return FEED_NO_MEMORY;   /* 32: gzip or zlib header */
  int rc = feed_raw(req, inflate_chunk, &f);
  if (rc == FEED_SINK) rc = f.err;
  if (rc == 0) rc = inflate_step(&f, "", 0);
  inflateEnd(&f.z);
  return rc;
}

static enum MHD_Result files_get(struct wbd_req *req, struct wbd_sandbox *sb) {
  const char *path = wbd_req_query(req, "path");
  const char *user = wbd_req_query(req, "username");
  const char *why = NULL;
  if (!path) path = "";
  if (files_auth(req, sb, "read", path, user, &why) != 0) return wbd_reply_error(req, 401, "%s", why);
  if (!known_user(user)) return wbd_reply_error(req, 401, "error looking up user '%s': unknown user", user);

  struct wbd_fspath p;
  int rc = wbd_fs_resolve_as(sb, path, user, &p);
  if (rc < 0) {
    wbd_fs_release(&p);
    return files_path_error(req, rc, path);
  }
  /* O_NONBLOCK: a FIFO planted by the sandbox must not hang this thread. */
  int fd = wbd_fs_open(&p, p.rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) != 0) {
    rc = -errno;
    close(fd);
    fd = rc;
  }
  if (fd < 0) {
    enum MHD_Result r = files_path_error(req, fd, p.jail);
    wbd_fs_release(&p);
    return r;
  }
  if (S_ISDIR(st.st_mode) || !S_ISREG(st.st_mode)) {
    close(fd);
    enum MHD_Result r = S_ISDIR(st.st_mode) ? wbd_reply_error(req, 400, "path '%s' is a directory", p.jail)
                                            : wbd_reply_error(req, 400, "path '%s' is not a regular file", p.jail);
    wbd_fs_release(&p);
    return r;
  }
  const char *base = strrchr(p.jail, '/');
  char disp[PATH_MAX + 64], name[PATH_MAX];
  snprintf(name, sizeof name, "%s", base ? base + 1 : p.jail);
  for (char *c = name; *c; c++)
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '_';
  snprintf(disp, sizeof disp, "inline; filename=\"%s\"", name);
  const char *headers[] = { "Content-Disposition", disp, "Vary", "Accept-Encoding", NULL };
  if ((uint64_t)st.st_size > FILES_INLINE_MAX) {
    struct fstream *f = malloc(sizeof *f);
    if (!f) {
      close(fd);
      wbd_fs_release(&p);
      return wbd_reply_error(req, 500, "out of memory");
    }
    f->fd = fd;
    f->size = (uint64_t)st.st_size;
    wbd_fs_release(&p);
    return wbd_reply_stream(req, 200, "application/octet-stream", fstream_read, f, fstream_done, headers);
  }
  struct wbd_buf data = { 0 };
  char chunk[65536];
  ssize_t n;
  int failed = 0;
  size_t left = (size_t)st.st_size;
  while (left && (n = read(fd, chunk, left < sizeof chunk ? left : sizeof chunk)) != 0) {
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      failed = errno;
      break;
    }
    if (wbd_buf_add(&data, chunk, (size_t)n) != 0) {
      failed = ENOMEM;
      break;
    }
    left -= (size_t)n;
  }
  close(fd);
  enum MHD_Result r;
  struct wbd_buf gz = { 0 };
  if (failed) {
    r = wbd_reply_error(req, 500, "reading '%s': %s", p.jail, strerror(failed));
  } else if (accepts_gzip(wbd_req_header(req, "Accept-Encoding")) &&
             gzip_buf(data.data ? data.data : "", data.len, &gz) == 0) {
    /* As envd: gzip when asked (files up to FILES_INLINE_MAX; larger ones
     * stream uncompressed, which Accept-Encoding allows). */
    const char *gzh[] = { "Content-Disposition", disp, "Vary", "Accept-Encoding", "Content-Encoding", "gzip", NULL };
    r = wbd_reply_raw(req, 200, "application/octet-stream", gz.data ? gz.data : "", gz.len, gzh);
  } else {
    r = wbd_reply_raw(req, 200, "application/octet-stream", data.data ? data.data : "", data.len, headers);
  }
  wbd_buf_free(&gz);
  wbd_buf_free(&data);
  wbd_fs_release(&p);
  return r;
}

struct upload {
  struct wbd_sandbox *sb;
  const char *user;          /* the username query parameter: whose home a relative path is in */
  const char *qpath;         /* the `path` query parameter, or NULL */
  int fd;                    /* file being written, -1 */
  size_t expect;             /* bytes a file may get (the body's size), 0: unknown (gzip) */
  json_t *entries;           /* [EntryInfo] answered */
  struct upfile {            /* the files written so far: the jail path (raw bytes: the
                              * JSON copies may have U+FFFD where a path is not UTF-8) */
    char *jail;
    dev_t dev;
    ino_t ino;
  } *files;
  size_t nfiles;
  json_t *meta;              /* X-Metadata-* headers: each file's user.e2b.* xattrs */
  unsigned status;           /* error to answer, 0 while fine */
  char msg[PATH_MAX + 128];
};

static void upload_fail(struct upload *u, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void upload_fail(struct upload *u, unsigned status, const char *fmt, ...) {
  if (u->status) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(u->msg, sizeof u->msg, fmt, ap);
  va_end(ap);
  u->status = status;
}

static void upload_path_fail(struct upload *u, int err, const char *shown) {
  switch (-err) {
    case EISDIR: upload_fail(u, 400, "path '%s' is a directory", shown); break;
    case ENOTDIR: upload_fail(u, 400, "path '%s': a parent is not a directory", shown); break;
    case EACCES: case EPERM: case ELOOP: case ENAMETOOLONG: case EINVAL: case ENOENT:
      upload_fail(u, 400, "invalid path '%s': %s", shown, wbd_fs_strerror(err));
      break;
    case ENOSPC: case EDQUOT: upload_fail(u, 507, "not enough disk space for '%s'", shown); break;
    default: upload_fail(u, 500, "'%s': %s", shown, wbd_fs_strerror(err));
  }
}

static void upload_close(struct upload *u) {
  if (u->fd >= 0) {
    if (close(u->fd) != 0) upload_fail(u, 500, "closing a file: %s", strerror(errno));
    u->fd = -1;
  }
}

/* Removes the file at p's path when it is still the one of st (never what
 * the sandbox put there since, nor what a symlink there points at). */
static void unlink_same(const struct wbd_fspath *p, dev_t dev, ino_t ino) {
  const char *base;
  int dfd = wbd_fs_parent(p, &base);
  struct stat now;
  if (dfd >= 0 && fstatat(dfd, base, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == dev && now.st_ino == ino)
    unlinkat(dfd, base, 0);
  if (dfd >= 0) close(dfd);
}

/* The destination, created or, when it exists, truncated; refused with
 * -ENOSPC before anything changed when the body cannot fit in what its
 * filesystem has left (the sandbox's disk: a tmpfs of its own). fd or -errno. */
static int upload_open(struct upload *u, const struct wbd_fspath *p, struct stat *st) {
  int fd = wbd_fs_open(p, p->rel, O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK | O_NOCTTY, 0644);
  int created = fd >= 0;
  if (fd == -EEXIST) fd = wbd_fs_open(p, p->rel, O_WRONLY | O_NONBLOCK | O_NOCTTY, 0);
  if (fd < 0) return fd;
  struct statvfs vfs;
  int rc = fstat(fd, st) != 0 ? -errno : !S_ISREG(st->st_mode) ? -EINVAL : 0;
  if (rc == 0 && u->expect && fstatvfs(fd, &vfs) == 0 &&
      u->expect > (uint64_t)vfs.f_bavail * vfs.f_frsize + (uint64_t)st->st_size)
    rc = -ENOSPC;
  if (rc == 0 && !created && ftruncate(fd, 0) != 0) rc = -errno;
  if (rc < 0) {
    if (created) unlink_same(p, st->st_dev, st->st_ino);
    close(fd);
  }
  return rc < 0 ? rc : fd;
}

/* A failed upload leaves none of the files it wrote (nothing half-written). */
static void upload_undo(struct upload *u) {
  for (size_t i = 0; i < u->nfiles; i++) {
    struct wbd_fspath p;
    if (wbd_fs_resolve(u->sb, u->files[i].jail, &p) == 0) unlink_same(&p, u->files[i].dev, u->files[i].ino);
    wbd_fs_release(&p);
  }
}

/* Opens (truncating) the destination of one uploaded file; 0 or -1 with u->status set. */
static int upload_begin(struct upload *u, const char *dest) {
  upload_close(u);
  if (!dest || !*dest) {
    upload_fail(u, 400, "a file part needs a filename when the path query parameter is absent");
    return -1;
  }
  struct wbd_fspath p;
  int rc = wbd_fs_resolve_as(u->sb, dest, u->user, &p);
  if (rc < 0) {
    wbd_fs_release(&p);
    upload_path_fail(u, rc, dest);
    return -1;
  }
  for (size_t i = 0; i < u->nfiles; i++) {
    if (strcmp(u->files[i].jail, p.jail) == 0) {
      wbd_fs_release(&p);
      upload_fail(u, 400, "you cannot upload multiple files to the same path '%s' in one upload request", p.jail);
      return -1;
    }
  }
  if (strcmp(p.rel, ".") == 0) rc = -EISDIR;
  if (rc == 0) rc = wbd_fs_mkdirs(&p, 0);
  struct stat st;
  if (rc == 0) rc = upload_open(u, &p, &st);
  if (rc < 0) {
    upload_path_fail(u, rc, p.jail);
    wbd_fs_release(&p);
    return -1;
  }
  u->fd = rc;
  wbd_fs_chown(&p, u->fd);
  /* Always written (an empty set clears what an earlier upload left), as envd. */
  if ((rc = wbd_fs_meta_write(u->fd, u->meta)) < 0) {
    if (rc == -ENOTSUP || rc == -EOPNOTSUPP)
      upload_fail(u, 500, "'%s': the filesystem does not support extended attributes: metadata not stored", p.jail);
    else if (rc == -ENOSPC || rc == -EDQUOT)
      upload_fail(u, 507, "not enough space for the metadata of '%s'", p.jail);
    else
      upload_fail(u, 500, "writing the metadata of '%s': %s", p.jail, strerror(-rc));
    wbd_fs_release(&p);
    return -1;
  }
  struct upfile *nf = realloc(u->files, (u->nfiles + 1) * sizeof *nf);
  if (!nf || !(nf[u->nfiles].jail = strdup(p.jail))) abort();
  nf[u->nfiles].dev = st.st_dev;
  nf[u->nfiles].ino = st.st_ino;
  u->files = nf;
  u->nfiles++;
  json_t *e = json_object();
  const char *base = strrchr(p.jail, '/');
  json_object_set_new(e, "path", wbd_json_str(p.jail));
  json_object_set_new(e, "name", wbd_json_str(base ? base + 1 : p.jail));
  json_object_set_new(e, "type", json_string("file"));
  json_t *stored = wbd_fs_meta_read(u->fd);
  if (stored) json_object_set_new(e, "metadata", stored);
  json_array_append_new(u->entries, e);
  wbd_fs_release(&p);
  return 0;
}

static int upload_write(struct upload *u, const char *data, size_t len) {
  while (len) {
    ssize_t w = write(u->fd, data, len);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ENOSPC || errno == EDQUOT)
        upload_fail(u, 507, "not enough disk space");
      else
        upload_fail(u, 500, "writing a file: %s", strerror(errno));
      return -1;
    }
    data += w;
    len -= (size_t)w;
  }
  return 0;
}

static enum MHD_Result upload_part(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                   const char *content_type, const char *transfer_encoding, const char *data,
                                   uint64_t off, size_t size) {
  struct upload *u = cls;
  (void)kind; (void)content_type; (void)transfer_encoding;
  if (u->status) return MHD_NO;
  if (!key || strcmp(key, "file") != 0) return MHD_YES;   /* other fields are ignored, as envd does */
  /* MHD calls once with off == 0 at the start of every part, even an empty one. */
  if (off == 0 && upload_begin(u, u->qpath && *u->qpath ? u->qpath : filename) != 0) return MHD_NO;
  if (u->fd < 0) return MHD_NO;
  return upload_write(u, data, size) == 0 ? MHD_YES : MHD_NO;
}

static int multipart_sink(void *cls, const char *data, size_t len) {
  return MHD_post_process(cls, data, len) == MHD_YES ? 0 : -1;
}

static int octet_sink(void *cls, const char *data, size_t len) { return upload_write(cls, data, len); }

/* The status of a body that could not be fed (FEED_SINK: the sink's own). */
static void upload_feed_fail(struct upload *u, int rc, size_t cap) {
  if (rc == FEED_OVER_CAP) upload_fail(u, 413, "the decompressed body exceeds the upload limit (%zu bytes)", cap);
  else if (rc == FEED_CORRUPT) upload_fail(u, 400, "invalid gzip body");
  else if (rc == FEED_NO_MEMORY) upload_fail(u, 500, "out of memory");
  else if (rc == FEED_READ) upload_fail(u, 500, "reading the spooled upload failed");
}

static void upload_multipart(struct wbd_req *req, struct upload *u, int gz, size_t cap) {
  struct MHD_PostProcessor *pp = MHD_create_post_processor(req->conn, 64 * 1024, upload_part, u);
  if (!pp) {
    upload_fail(u, 400, "invalid multipart/form-data request (no boundary?)");
    return;
  }
  int rc = feed_body(req, gz, cap, multipart_sink, pp);
  int ok = MHD_destroy_post_processor(pp) == MHD_YES;
  upload_close(u);
  upload_feed_fail(u, rc, cap);
  if (!u->status && (rc != 0 || !ok)) upload_fail(u, 400, "malformed multipart/form-data body");
  if (!u->status && json_array_size(u->entries) == 0) upload_fail(u, 400, "no file part named 'file' in the request");
}

/* POST /files: the body (spooled to a file by the server) goes to the
 * destination as it is read, inflated on the way for Content-Encoding: gzip
 * (at most the upload limit's bytes, as for a plain body). On any failure
 * the files it wrote are removed. */
static enum MHD_Result files_post(struct wbd_req *req, struct wbd_sandbox *sb) {
  const char *path = wbd_req_query(req, "path");
  const char *user = wbd_req_query(req, "username");
  const char *why = NULL;
  if (files_auth(req, sb, "write", path ? path : "", user, &why) != 0) return wbd_reply_error(req, 401, "%s", why);
  if (!known_user(user)) return wbd_reply_error(req, 401, "error looking up user '%s': unknown user", user);

  const char *enc = wbd_req_header(req, "Content-Encoding");
  int gz = enc && *enc && strcasecmp(enc, "identity") != 0;
  if (gz && strcasecmp(enc, "gzip") != 0 && strcasecmp(enc, "x-gzip") != 0)
    return wbd_reply_error(req, 400, "unsupported Content-Encoding '%s'", enc);
  size_t cap = (size_t)wbd_lim.max_upload_mb << 20;
  char merr[256];
  json_t *meta = wbd_fs_meta_headers(req, merr, sizeof merr);
  if (!meta) return wbd_reply_error(req, 400, "invalid metadata: %s", merr);
  struct upload u = { .sb = sb, .user = user, .qpath = path, .fd = -1, .expect = gz ? 0 : req->body_len,
                      .entries = json_array(), .meta = meta };
  if (content_type_is(req, "multipart/form-data")) {
    upload_multipart(req, &u, gz, cap);
  } else if (content_type_is(req, "application/octet-stream")) {
    if (!path || !*path) {
      upload_fail(&u, 400, "path query parameter is required for raw body upload");
    } else if (upload_begin(&u, path) == 0) {
      upload_feed_fail(&u, feed_body(req, gz, cap, octet_sink, &u), cap);
      upload_close(&u);
    }
  } else {
    const char *ct = wbd_req_header(req, "Content-Type");
    upload_fail(&u, 400, "unsupported content type '%s': use multipart/form-data or application/octet-stream",
                ct ? ct : "");
  }
  json_decref(meta);
  if (u.status) upload_undo(&u);
  for (size_t i = 0; i < u.nfiles; i++) free(u.files[i].jail);
  free(u.files);
  if (u.status) {
    json_decref(u.entries);
    return wbd_reply_error(req, u.status, "%s", u.msg);
  }
  return wbd_reply_json(req, 200, u.entries, NULL);
}

/* ------------------------------------------------------------------ */
/* filesystem.Filesystem                                               */
/* ------------------------------------------------------------------ */

/* The jail's mount points and what holds them stay, whoever asks. */
static enum MHD_Result skeleton_error(struct wbd_req *req, const char *jail) {
  return rpc_error(req, "permission_denied", "'%s' is part of the sandbox's filesystem skeleton: it cannot be "
                   "removed, renamed or replaced", jail);
}

static enum MHD_Result fs_entry_reply(struct wbd_req *req, const struct wbd_fspath *p) {
  json_t *e = wbd_fs_entry(p);
  return e ? rpc_ok(req, json_pack("{s:o}", "entry", e)) : rpc_fs_error(req, -errno, p->jail);
}

/* filesystem.Filesystem/Move: both ends resolved as the caller, neither a
 * part of the skeleton; answers the moved entry. */
static enum MHD_Result fs_move(struct wbd_req *req, struct wbd_sandbox *sb, const char *user, json_t *in) {
  const char *src = jstr(in, "source", NULL), *dst = jstr(in, "destination", NULL);
  if (!src || !dst) return rpc_error(req, "invalid_argument", "source and destination are required");
  struct wbd_fspath p, q;
  int rc;
  enum MHD_Result r;
  p.root = q.root = -1;
  if ((rc = wbd_fs_resolve_as(sb, src, user, &p)) < 0) {
    r = rpc_fs_error(req, rc, src);
  } else if ((rc = wbd_fs_resolve_as(sb, dst, user, &q)) < 0) {
    r = rpc_fs_error(req, rc, dst);
  } else if (wbd_rt_skeleton(p.jail) || wbd_rt_skeleton(q.jail)) {
    r = skeleton_error(req, wbd_rt_skeleton(p.jail) ? p.jail : q.jail);
  } else if ((rc = wbd_fs_move(&p, &q)) < 0) {
    r = rpc_fs_error(req, rc, rc == -ENOENT ? p.jail : q.jail);
  } else {
    r = fs_entry_reply(req, &q);
  }
  wbd_fs_release(&p);
  wbd_fs_release(&q);
  return r;
}

/* The single-path methods: each gets the request's path resolved as the
 * caller (and the request, for its other fields). */
static enum MHD_Result fs_stat(struct wbd_req *req, struct wbd_fspath *p, json_t *in) {
  (void)in;
  return fs_entry_reply(req, p);
}

/* MakeDir: the parents too; an existing directory is already_exists, an
 * existing file invalid_argument, as envd answers them. */
static enum MHD_Result fs_make_dir(struct wbd_req *req, struct wbd_fspath *p, json_t *in) {
  (void)in;
  int rc = wbd_fs_mkdirs(p, 1);
  json_t *e = (rc == 0 || rc == -EEXIST) ? wbd_fs_entry(p) : NULL;
  const char *etype = e ? jstr(e, "type", NULL) : NULL;
  enum MHD_Result r;
  if (rc == -EEXIST && etype && strcmp(etype, "FILE_TYPE_DIRECTORY") == 0)
    r = rpc_error(req, "already_exists", "directory '%s' already exists", p->jail);
  else if (rc == -EEXIST)
    r = rpc_error(req, "invalid_argument", "path '%s' already exists and is not a directory", p->jail);
  else if (rc == -ENOTDIR)
    r = rpc_error(req, "invalid_argument", "path '%s': a parent is not a directory", p->jail);
  else if (rc < 0)
    r = rpc_fs_error(req, rc, p->jail);
  else if (!e)
    r = rpc_fs_error(req, -errno, p->jail);
  else {
    r = rpc_ok(req, json_pack("{s:o}", "entry", e));
    e = NULL;
  }
  json_decref(e);
  return r;
}

/* ListDir: depth 0 lists one level, as 1 does; at most 1024 levels and
 * wbd_opt.max_list_entries entries. */
static enum MHD_Result fs_list_dir(struct wbd_req *req, struct wbd_fspath *p, json_t *in) {
  long long depth = jint(in, "depth", 1);
  if (depth < 0) return rpc_error(req, "invalid_argument", "depth should be at least one");
  int err = 0;
  json_t *res = wbd_fs_list(p, depth == 0 ? 1 : (int)(depth > 1024 ? 1024 : depth),
                            (size_t)wbd_opt.max_list_entries, &err);
  if (res) return rpc_ok(req, res);
  if (err == -ENOTDIR) return rpc_error(req, "invalid_argument", "path '%s' is not a directory", p->jail);
  if (err == -ENOENT) return rpc_error(req, "not_found", "directory '%s' does not exist", p->jail);
  if (err == -E2BIG)
    return rpc_error(req, "resource_exhausted", "directory '%s' has more than %d entries at depth %lld: "
                     "list a smaller depth or a subdirectory", p->jail, wbd_opt.max_list_entries, (long long)depth);
  return rpc_fs_error(req, err, p->jail);
}

static enum MHD_Result fs_remove(struct wbd_req *req, struct wbd_fspath *p, json_t *in) {
  (void)in;
  if (wbd_rt_skeleton(p->jail)) return skeleton_error(req, p->jail);
  int rc = wbd_fs_remove(p);
  return rc < 0 ? rpc_fs_error(req, rc, p->jail) : rpc_ok(req, NULL);
}

static const struct {
  const char *method;
  enum MHD_Result (*fn)(struct wbd_req *req, struct wbd_fspath *p, json_t *in);
} fs_methods[] = {
  { "Stat", fs_stat }, { "MakeDir", fs_make_dir }, { "ListDir", fs_list_dir }, { "Remove", fs_remove },
};

/* filesystem.Filesystem's unary methods: Move, or one of fs_methods on the
 * request's path resolved as the caller. */
static enum MHD_Result fs_rpc(struct wbd_req *req, struct wbd_sandbox *sb, const char *method, json_t *in) {
  char user[64];
  rpc_user(req, user, sizeof user);   /* checked by unary_rpc */
  if (strcmp(method, "Move") == 0) return fs_move(req, sb, user, in);
  size_t i = 0;
  while (i < sizeof fs_methods / sizeof *fs_methods && strcmp(method, fs_methods[i].method) != 0) i++;
  if (i == sizeof fs_methods / sizeof *fs_methods)
    return rpc_error(req, "unimplemented", "filesystem.Filesystem/%s is not implemented", method);
  const char *path = jstr(in, "path", NULL);
  if (!path) return rpc_error(req, "invalid_argument", "path is required");
  struct wbd_fspath p;
  p.root = -1;
  int rc = wbd_fs_resolve_as(sb, path, user, &p);
  if (rc < 0) {
    wbd_fs_release(&p);
    return rpc_fs_error(req, rc, path);
  }
  enum MHD_Result r = fs_methods[i].fn(req, &p, in);
  wbd_fs_release(&p);
  return r;
}

/* ------------------------------------------------------------------ */
/* process.Process                                                     */
/* ------------------------------------------------------------------ */

/* Processes started by Process.Start, as E2B's envd keeps them: a process
 * outlives the stream that started it (the client may leave and come back
 * with Connect), its output is read by a pump thread of its own and fanned
 * out to the streams attached to it (dropped while none is), and its end is
 * kept PROC_RETAIN_US after it exited for a late Connect. Lock order:
 * procs_mu, then a proc's mu; in_mu alone. */
#define PROC_QUEUE_MAX (256u << 10)    /* envelope bytes waiting per stream: then the pump (and the process) waits */
#define PROC_TAG_MAX 4096              /* bytes of a tag (kept with an ended process) */
#define PROC_LIVE_MAX 64               /* running processes per sandbox (WARMBOXD_PROCS_MAX) */
#define PROC_RETAINED_MAX 64           /* ended ones kept per sandbox */
#define PROC_RETAIN_US (30 * 1000000LL)
#define PROC_INPUT_WAIT_MS 30000       /* a process that reads no input fails the write after this */

struct sub {                           /* a stream attached to a process */
  struct sub *next;
  struct wbd_buf q;                    /* envelopes not yet taken by the stream, under proc.mu */
  int efd;                             /* eventfd: q grew, or the stream must end */
  int ended;                           /* q holds the end and the trailer: nothing follows */
  int dropped;                         /* the sandbox went away under the process: drop the stream */
};

struct proc {
  struct proc *next;                   /* procs, under procs_mu */
  int refs;                            /* under procs_mu: the list, the pump, each stream */
  char sbid[32];
  pid_t pid;
  json_t *config;                      /* ProcessConfig as received; NULL once ended */
  char *tag;
  int is_pty;
  int exited;                          /* under procs_mu and mu: the end is known */
  int64_t expire_us;                   /* ended: forgotten at this time */
  pthread_mutex_t mu;                  /* subs, end */
  pthread_cond_t cond;                 /* a stream took from its queue or left */
  struct sub *subs;
  json_t *end;                         /* the EndEvent, once exited (NULL: dropped) */
  pthread_mutex_t in_mu;               /* input, resize, CloseStdin */
  int in_fd;                           /* stdin's write end, or -1 (a pty: the master) */
  int pty_fd;                          /* pty master, or -1; closed when freed */
  /* the pump's own */
  struct wbd_sandbox *sb;              /* reference, held while the process runs */
  int out_fd, err_fd, pid_fd;
  int64_t deadline_us;                 /* Start's Connect-Timeout-Ms: then the process is killed */
  char boot[48];                       /* the sandbox's boot id when it started */
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
  long long want = jint(sel, "pid", 0);
  const char *tag = jstr(sel, "tag", NULL);
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
  const char *tag = jstr(sel, "tag", NULL);
  if (jint(sel, "pid", 0) <= 0 && tag) return rpc_error(req, "not_found", "process with tag %s not found", tag);
  return rpc_error(req, "not_found", "process with pid %lld not found", jint(sel, "pid", 0));
}

static void envelope_add(struct wbd_buf *b, unsigned char flag, json_t *msg /* stolen */) {
  char *s = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  size_t n = s ? strlen(s) : 0;
  unsigned char hdr[5] = { flag, (unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8),
                           (unsigned char)n };
  wbd_buf_add(b, hdr, 5);
  if (s) wbd_buf_add(b, s, n);
  free(s);
}

static json_t *trailer_error(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static json_t *trailer_error(const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  json_t *e = connect_error_json(code, fmt, ap);
  va_end(ap);
  return json_pack("{s:o}", "error", e);
}

/* A streaming RPC that failed before streaming: HTTP 200, only the trailer. */
static enum MHD_Result stream_fail(struct wbd_req *req, json_t *trailer) {
  struct wbd_buf b = { 0 };
  envelope_add(&b, 0x02, trailer);
  enum MHD_Result r = wbd_reply_raw(req, 200, "application/connect+json", b.data, b.len, NULL);
  wbd_buf_free(&b);
  return r;
}

static void sub_wake(struct sub *s) {
  uint64_t one = 1;
  if (write(s->efd, &one, sizeof one) < 0) {}   /* EAGAIN: already signalled */
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
  envelope_add(&s->q, 0, json_pack("{s:{s:{s:I}}}", "event", "start", "pid", (json_int_t)p->pid));
  pthread_mutex_lock(&p->mu);
  if (p->exited) {
    if (p->end) {
      envelope_add(&s->q, 0, json_pack("{s:{s:O}}", "event", "end", p->end));
      envelope_add(&s->q, 0x02, json_object());
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
  struct wbd_buf env = { 0 };
  envelope_add(&env, 0, msg);
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
    case SIGKILL: return "killed";
    case SIGTERM: return "terminated";
    case SIGINT: return "interrupt";
    case SIGHUP: return "hangup";
    case SIGQUIT: return "quit";
    case SIGPIPE: return "broken pipe";
    case SIGSEGV: return "segmentation fault";
    case SIGABRT: return "aborted";
    default: return strsignal(sig);
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
      envelope_add(&s->q, 0, json_pack("{s:{s:O}}", "event", "end", end));
      envelope_add(&s->q, 0x02, json_object());
      s->ended = 1;
    } else {
      s->dropped = 1;
    }
    sub_wake(s);
  }
  p->subs = NULL;   /* the streams unsubscribe from an empty list */
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
      { .fd = p->out_fd, .events = POLLIN },
      { .fd = p->err_fd, .events = POLLIN },
      { .fd = fds_open ? -1 : p->pid_fd, .events = POLLIN },
    };
    if (!fds_open && p->pid_fd < 0) break;   /* no pidfd: a blocking wait */
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
      if (r <= 0) {   /* EOF, or EIO: a pty's last slave end closed */
        if (fds[i].fd != p->pty_fd) close(fds[i].fd);
        if (i == 0) p->out_fd = -1; else p->err_fd = -1;
        fds_open--;
        continue;
      }
      pthread_mutex_lock(&p->mu);
      int attached = p->subs != NULL;
      pthread_mutex_unlock(&p->mu);
      if (!attached) continue;   /* nobody to send it to: not even encoded */
      char *b64 = wbd_b64_encode(chunk, (size_t)r);
      proc_publish(p, json_pack("{s:{s:{s:s}}}", "event", "data",
                                p->is_pty ? "pty" : i == 0 ? "stdout" : "stderr", b64 ? b64 : ""));
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

enum { PS_RUNNING, PS_DONE, PS_ABORT };

struct pstream {
  struct wbd_sandbox *sb;     /* our own reference */
  struct proc *p;             /* referenced */
  struct sub *s;
  struct MHD_Connection *conn;
  int phase;
  int64_t deadline_us;        /* this stream's Connect-Timeout-Ms; 0: none */
  int64_t keepalive_us;
  int64_t last_sent_us;
  struct wbd_buf buf;
};

/* Produce the next envelope(s) into ps->buf (or end the stream): 0; or,
 * with nothing to do yet, the milliseconds to wait (*wait_fds: the
 * descriptors that end the wait). Never blocks. */
static int ps_step(struct pstream *ps, int wait_fds[2]) {
  struct proc *p = ps->p;
  struct sub *s = ps->s;
  int64_t now = mono_us();
  if (ps->deadline_us && now >= ps->deadline_us) {
    envelope_add(&ps->buf, 0x02, trailer_error("deadline_exceeded", "the operation timed out"));
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
      envelope_add(&ps->buf, 0, json_pack("{s:{s:{}}}", "event", "keepalive"));
      ps->last_sent_us = now;
      return 0;
    }
    if (due - now < wait_us) wait_us = due - now;
  }
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(ps->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  struct pollfd fds[2] = { { .fd = s->efd, .events = POLLIN },
                           { .fd = ci ? ci->connect_fd : -1, .events = POLLRDHUP } };
  int n = poll(fds, 2, 0);
  if (n < 0 && errno != EINTR) {
    ps->phase = PS_ABORT;
    return 0;
  }
  if (n > 0 && (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
    ps->phase = PS_ABORT;   /* the client went away; the process goes on */
    return 0;
  }
  if (n > 0 && fds[0].revents) {
    uint64_t v;
    if (read(s->efd, &v, sizeof v) < 0) {}
    return 0;
  }
  wait_fds[0] = fds[0].fd;
  wait_fds[1] = fds[1].fd;
  return (int)((wait_us + 999) / 1000);
}

static ssize_t ps_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct pstream *ps = cls;
  (void)pos;
  for (;;) {
    size_t n = wbd_buf_take(&ps->buf, out, max);
    if (n) return (ssize_t)n;
    if (ps->phase == PS_DONE) return MHD_CONTENT_READER_END_OF_STREAM;
    if (ps->phase == PS_ABORT) return MHD_CONTENT_READER_END_WITH_ERROR;
    int fds[2], wait_ms = ps_step(ps, fds);
    if (wait_ms > 0) return wbd_park(ps->conn, fds[0], fds[1], wait_ms) == 0 ? 0 : MHD_CONTENT_READER_END_WITH_ERROR;
  }
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

/* A non-negative numeric header, saturated to [0, hi]; -1 when absent or
 * not a number. A huge value must not overflow into a negative interval. */
static int64_t header_num(struct wbd_req *req, const char *name, int64_t hi) {
  const char *v = wbd_req_header(req, name);
  long long n;
  if (!v || !isdigit((unsigned char)*v) || wbd_parse_ll(v, 0, hi, -1, &n) != 0) return -1;
  return n;
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
  sb->refcount++;            /* the stream outlives this handler */
  sb->runs_in_flight++;
  wbd_store_unlock();
  ps->sb = sb;
  ps->p = p;
  ps->s = s;
  ps->conn = req->conn;
  ps->phase = PS_RUNNING;
  ps->last_sent_us = mono_us();
  int64_t timeout_ms = header_num(req, "Connect-Timeout-Ms", TIMEOUT_MS_MAX);
  if (timeout_ms > 0) ps->deadline_us = mono_us() + timeout_ms * 1000;
  /* a day of seconds between pings at most */
  int64_t ka = header_num(req, "Keepalive-Ping-Interval", 86400);
  ps->keepalive_us = (ka > 0 ? ka : 50) * 1000000;
  return wbd_reply_stream(req, 200, "application/connect+json", ps_read, ps, ps_done, NULL);
}

/* The one request envelope of a server-streaming RPC, parsed; NULL after
 * replying (*r). */
static json_t *stream_request(struct wbd_req *req, const char *what, enum MHD_Result *r) {
  if (!content_type_is(req, "application/connect+json")) {
    *r = wbd_reply_error(req, 415, "process.Process/%s is a streaming RPC: use application/connect+json", what);
    return NULL;
  }
  char bad[128];
  if (rpc_user(req, bad, sizeof bad) != 0) {
    *r = stream_fail(req, trailer_error("unauthenticated", "invalid username: '%s'", bad));
    return NULL;
  }
  size_t len = 0;
  switch (wbd_connect_envelope(req->body, req->body_len, &len)) {
    case WBD_ENV_OK: break;
    case WBD_ENV_SHORT:
      *r = stream_fail(req, trailer_error("invalid_argument", "missing request envelope"));
      return NULL;
    case WBD_ENV_COMPRESSED:
      *r = stream_fail(req, trailer_error("internal", "compressed envelopes are not supported"));
      return NULL;
    default:
      *r = stream_fail(req, trailer_error("invalid_argument", "request envelope length %zu does not match the body",
                                          len));
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
  long long v = jint(size, name, 0);
  return v < 0 ? 0 : v > 65535 ? 65535 : (unsigned)v;
}

/* ---- process.Process/Start ---- */

/* What makes a Start request unusable before anything runs (no cmd, a tag
 * too long, a loader variable in envs): its trailer, or NULL. */
static json_t *start_refusal(json_t *in) {
  json_t *proc = json_object_get(in, "process");
  const char *cmd = jstr(proc, "cmd", NULL);
  if (!cmd || !*cmd) return trailer_error("invalid_argument", "process.cmd is required");
  const char *tag = jstr(in, "tag", NULL);
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
  rpc_user(req, user, sizeof user);   /* checked by stream_request */
  const char *home = strcmp(user, "root") == 0 && wbd_rt_isolated() ? "/root" : ENVD_HOME;
  if (strcmp(home, ENVD_HOME) != 0 && json_is_object(proc)) {
    json_t *envs = json_object_get(proc, "envs");
    if (!json_is_object(envs)) {
      envs = json_object();
      json_object_set_new(proc, "envs", envs);
    }
    if (!json_object_get(envs, "HOME")) json_object_set_new(envs, "HOME", json_string(home));
  }
  const char *in = jstr(proc, "cwd", NULL);
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
  const char *tag = jstr(in, "tag", NULL);
  snprintf(p->sbid, sizeof p->sbid, "%s", sb->id);
  p->config = json_object();
  static const char *const fields[] = { "cmd", "args", "envs", "cwd" };
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
    json_t *v = json_object_get(proc, fields[i]);
    if (v) json_object_set_new(p->config, fields[i], json_deep_copy(v));
  }
  p->tag = tag ? strdup(tag) : NULL;
  p->pid_fd = (int)syscall(SYS_pidfd_open, p->pid, 0);   /* -1 (ENOSYS...): a blocking wait at the end */
  wbd_rt_boot_id(sb, p->boot, sizeof p->boot);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cond, NULL);
  pthread_mutex_init(&p->in_mu, NULL);
  int64_t timeout_ms = header_num(req, "Connect-Timeout-Ms", TIMEOUT_MS_MAX);
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
  if (!started) p->refs--;   /* no pump */
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
static enum MHD_Result process_start(struct wbd_req *req, struct wbd_sandbox *sb) {
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
    return stream_fail(req, trailer_error("resource_exhausted", "too many running processes in this sandbox (%ld)",
                                          max));
  }
  const char *cmd = jstr(proc, "cmd", NULL);
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
    json_decref(in);   /* cmd is in it */
    return stream_fail(req, t);
  }
  proc_init(p, req, sb, in);
  json_decref(in);
  wbd_store_lock();
  sb->refcount++;   /* the pump's */
  wbd_store_unlock();
  p->sb = sb;
  p->refs = 3;      /* the list, the pump, this stream */
  struct sub *s = proc_subscribe(p);
  if (!proc_launch(p, s)) return start_unpumped(req, p, s);
  return proc_stream(req, sb, p, s);
}

/* process.Process/Connect: attach to a running process (by pid or tag): its
 * start event, then its further output and end. A process that ended less
 * than PROC_RETAIN_US ago answers its start and end. */
static enum MHD_Result process_connect(struct wbd_req *req, struct wbd_sandbox *sb) {
  enum MHD_Result r;
  json_t *in = stream_request(req, "Connect", &r);
  if (!in) return r;
  json_t *sel = json_object_get(in, "process");
  struct proc *p = proc_find(sb, sel, 0);
  if (!p) {
    const char *tag = jstr(sel, "tag", NULL);
    json_t *t = jint(sel, "pid", 0) <= 0 && tag
                    ? trailer_error("not_found", "process with tag %s not found", tag)
                    : trailer_error("not_found", "process with pid %lld not found", jint(sel, "pid", 0));
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
  const char *b64 = jstr(input, "stdin", NULL);
  int to_pty = 0;
  if (!b64 && (b64 = jstr(input, "pty", NULL))) to_pty = 1;
  *code = "internal";
  if (!b64) {
    *code = "unimplemented";
    snprintf(msg, msglen, "invalid input type: give input.stdin or input.pty");
    return -1;
  }
  if (to_pty != p->is_pty) {
    snprintf(msg, msglen, "%s", to_pty ? "tty not assigned to process — input should be written to the stdin, not the tty"
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
      struct pollfd pf = { .fd = p->in_fd, .events = POLLOUT };
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
static enum MHD_Result process_stream_input(struct wbd_req *req, struct wbd_sandbox *sb) {
  if (!content_type_is(req, "application/connect+json"))
    return wbd_reply_error(req, 415, "process.Process/StreamInput is a streaming RPC: use application/connect+json");
  char bad[128];
  if (rpc_user(req, bad, sizeof bad) != 0)
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
        const char *tag = jstr(sel, "tag", NULL);
        fail = jint(sel, "pid", 0) <= 0 && tag ? trailer_error("not_found", "process with tag %s not found", tag)
                                               : trailer_error("not_found", "process with pid %lld not found",
                                                               jint(sel, "pid", 0));
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
  struct wbd_buf out = { 0 };
  envelope_add(&out, 0, json_object());
  envelope_add(&out, 0x02, json_object());
  enum MHD_Result r = wbd_reply_raw(req, 200, "application/connect+json", out.data, out.len, NULL);
  wbd_buf_free(&out);
  return r;
}

static enum MHD_Result process_rpc(struct wbd_req *req, struct wbd_sandbox *sb, const char *method, json_t *in) {
  if (strcmp(method, "List") == 0) {
    json_t *arr = json_array();
    pthread_mutex_lock(&procs_mu);
    for (struct proc *p = procs; p; p = p->next) {
      if (p->exited || strcmp(p->sbid, sb->id) != 0) continue;
      json_t *o = json_pack("{s:o,s:I}", "config", p->config ? json_incref(p->config) : json_object(), "pid",
                            (json_int_t)p->pid);
      if (p->tag) json_object_set_new(o, "tag", json_string(p->tag));
      json_array_append_new(arr, o);
    }
    pthread_mutex_unlock(&procs_mu);
    json_t *res = json_object();
    if (json_array_size(arr)) json_object_set_new(res, "processes", arr); else json_decref(arr);
    return rpc_ok(req, res);
  }
  int is_signal = strcmp(method, "SendSignal") == 0, is_close = strcmp(method, "CloseStdin") == 0,
      is_input = strcmp(method, "SendInput") == 0, is_update = strcmp(method, "Update") == 0;
  if (!is_signal && !is_close && !is_input && !is_update)
    return rpc_error(req, "unimplemented", "process.Process/%s is not implemented", method);
  json_t *sel = json_object_get(in, "process");
  struct proc *p = proc_find(sb, sel, 1);
  if (!p) return proc_not_found(req, sel);
  enum MHD_Result r;
  if (is_close) {
    pthread_mutex_lock(&p->in_mu);
    if (p->is_pty) {
      pthread_mutex_unlock(&p->in_mu);
      r = rpc_error(req, "unknown", "cannot close stdin for PTY process — send Ctrl+D (0x04) instead");
    } else {
      if (p->in_fd >= 0) close(p->in_fd);
      p->in_fd = -1;
      pthread_mutex_unlock(&p->in_mu);
      r = rpc_ok(req, NULL);
    }
  } else if (is_input) {
    const char *code;
    char msg[256];
    r = proc_input(p, json_object_get(in, "input"), &code, msg, sizeof msg) == 0 ? rpc_ok(req, NULL)
                                                                                  : rpc_error(req, code, "%s", msg);
  } else if (is_update) {
    json_t *pty = json_object_get(in, "pty");
    if (!json_is_object(pty)) {
      r = rpc_ok(req, NULL);   /* nothing to change */
    } else if (!p->is_pty) {
      r = rpc_error(req, "internal", "error resizing tty: tty not assigned to process");
    } else {
      json_t *size = json_object_get(pty, "size");
      struct winsize ws = { .ws_row = (unsigned short)pty_dim(size, "rows"),
                            .ws_col = (unsigned short)pty_dim(size, "cols") };
      /* the master lives as long as p: the kernel signals SIGWINCH to the
       * terminal's foreground process group */
      r = ioctl(p->pty_fd, TIOCSWINSZ, &ws) == 0 ? rpc_ok(req, NULL)
                                                  : rpc_error(req, "internal", "error resizing tty: %s", strerror(errno));
    }
  } else {
    json_t *sv = json_object_get(in, "signal");
    int sig = 0;
    if (json_is_string(sv)) {
      const char *s = json_string_value(sv);
      if (strcmp(s, "SIGNAL_SIGKILL") == 0) sig = SIGKILL;
      else if (strcmp(s, "SIGNAL_SIGTERM") == 0) sig = SIGTERM;
    } else if (json_is_integer(sv)) {
      json_int_t n = json_integer_value(sv);
      if (n == SIGKILL || n == SIGTERM) sig = (int)n;
    }
    int rc = sig ? wbd_rt_signal(sb, p->pid, sig) : 0;
    if (!sig) r = rpc_error(req, "invalid_argument", "unsupported signal");
    else if (rc == -ESRCH) r = rpc_error(req, "not_found", "process with pid %d not found", (int)p->pid);
    else if (rc < 0) r = rpc_error(req, "internal", "signalling process %d: %s", (int)p->pid, strerror(-rc));
    else r = rpc_ok(req, NULL);
  }
  proc_unref(p);
  return r;
}

/* ------------------------------------------------------------------ */
/* Routing                                                             */
/* ------------------------------------------------------------------ */

static enum MHD_Result unary_rpc(struct wbd_req *req, struct wbd_sandbox *sb, const char *service,
                                 const char *method) {
  if (strcmp(req->method, "POST") != 0) return wbd_reply_error(req, 405, "method not allowed");
  if (!content_type_is(req, "application/json"))
    return wbd_reply_error(req, 415, "unsupported content type: envd's RPCs speak application/json here");
  char bad[128];
  if (rpc_user(req, bad, sizeof bad) != 0) return rpc_error(req, "unauthenticated", "invalid username: '%s'", bad);
  json_error_t jerr;
  json_t *in = req->body_len ? json_loadb(req->body, req->body_len, 0, &jerr) : json_object();
  if (!json_is_object(in)) {
    json_decref(in);
    return rpc_error(req, "invalid_argument", "request body is not a JSON object");
  }
  enum MHD_Result r = strcmp(service, "filesystem") == 0 ? fs_rpc(req, sb, method, in)
                                                         : process_rpc(req, sb, method, in);
  json_decref(in);
  return r;
}

static enum MHD_Result envs(struct wbd_req *req, struct wbd_sandbox *sb) {
  wbd_store_lock();
  json_t *e = json_deep_copy(sb->env_vars);
  wbd_store_unlock();
  return wbd_reply_json(req, 200, e ? e : json_object(), NULL);
}

enum MHD_Result wbd_envd_handle(struct wbd_req *req, struct wbd_sandbox *sb) {
  const char *path = req->path;
  int get = strcmp(req->method, "GET") == 0, post = strcmp(req->method, "POST") == 0;
  if (strcmp(path, "/health") == 0 && get) return wbd_reply_raw(req, 204, NULL, NULL, 0, NULL);
  if (strcmp(path, "/files") == 0 && get) return files_get(req, sb);
  if (strcmp(path, "/files") == 0 && post) return files_post(req, sb);
  if (strcmp(path, "/envs") == 0 && get) return envs(req, sb);
  if (strcmp(path, "/metrics") == 0 && get) return wbd_reply_json(req, 200, wbd_metrics_envd(sb), NULL);
  if (strcmp(path, "/process.Process/Start") == 0) {
    if (!post) return wbd_reply_error(req, 405, "method not allowed");
    return process_start(req, sb);
  }
  if (strcmp(path, "/process.Process/Connect") == 0 && post) return process_connect(req, sb);
  if (strcmp(path, "/process.Process/StreamInput") == 0 && post) return process_stream_input(req, sb);
  enum MHD_Result wr;
  if (wbd_envd_watch_route(req, sb, &wr)) return wr;   /* WatchDir and the polled watchers */
  static const char fs_prefix[] = "/filesystem.Filesystem/", proc_prefix[] = "/process.Process/";
  int is_rpc = strncmp(path, fs_prefix, sizeof fs_prefix - 1) == 0 || strncmp(path, proc_prefix, sizeof proc_prefix - 1) == 0;
  if (is_rpc && post && content_type_is(req, "application/connect+json"))   /* Connect, WatchDir, ... */
    return stream_fail(req, trailer_error("unimplemented", "%s is not implemented", path + 1));
  if (strncmp(path, fs_prefix, sizeof fs_prefix - 1) == 0)
    return unary_rpc(req, sb, "filesystem", path + sizeof fs_prefix - 1);
  if (strncmp(path, proc_prefix, sizeof proc_prefix - 1) == 0)
    return unary_rpc(req, sb, "process", path + sizeof proc_prefix - 1);
  return wbd_reply_error(req, 404, "no such envd route: %s %s", req->method, path);
}
