/*
 * envd.c: the in-sandbox daemon's API (port 49983) as E2B's envd serves it:
 * the HTTP routes (/health, /envs, /metrics, /files) and the Connect-RPC
 * services filesystem.Filesystem and process.Process with the JSON codec.
 *
 * Every path goes through envd_fs.c, which confines it to the sandbox's
 * /home/user and /tmp. Process.Start is a server stream: one envelope per
 * event, written by a blocking reader on the connection's own thread.
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
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

/* RPCs carry the user as Authorization: Basic base64("<user>:"). Returns 0,
 * or -1 with the user's name in `bad`. */
static int rpc_user(struct wbd_req *req, char *bad, size_t badlen) {
  const char *auth = wbd_req_header(req, "Authorization");
  if (!auth || strncasecmp(auth, "Basic ", 6) != 0) return 0;
  size_t n;
  unsigned char *dec = wbd_b64_decode(auth + 6, &n);
  if (!dec) {
    snprintf(bad, badlen, "%s", "(malformed)");
    return -1;
  }
  char *colon = strchr((char *)dec, ':');
  if (colon) *colon = 0;
  int ok = known_user((char *)dec);
  if (!ok) snprintf(bad, badlen, "%s", (char *)dec);
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

/* Inflates a gzip (or zlib) body into out, refusing more than cap bytes of
 * output (a decompression bomb): 0, -1 corrupt, -2 over the cap, -3 no memory. */
static int gunzip_buf(const char *data, size_t len, size_t cap, struct wbd_buf *out) {
  z_stream z = { 0 };
  if (inflateInit2(&z, 32 + MAX_WBITS) != Z_OK) return -3;   /* 32: gzip or zlib header */
  z.next_in = (Bytef *)(uintptr_t)data;
  z.avail_in = (uInt)len;
  char chunk[65536];
  int rc = Z_OK, res = 0;
  while (rc != Z_STREAM_END) {
    z.next_out = (Bytef *)chunk;
    z.avail_out = sizeof chunk;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      res = rc == Z_MEM_ERROR ? -3 : -1;
      break;
    }
    size_t n = sizeof chunk - z.avail_out;
    if (out->len + n > cap) {
      res = -2;
      break;
    }
    if (n && wbd_buf_add(out, chunk, n) != 0) {
      res = -3;
      break;
    }
    if (rc == Z_OK && n == 0 && z.avail_in == 0) {   /* truncated stream */
      res = -1;
      break;
    }
  }
  inflateEnd(&z);
  return res;
}

static enum MHD_Result files_get(struct wbd_req *req, struct wbd_sandbox *sb) {
  const char *path = wbd_req_query(req, "path");
  const char *user = wbd_req_query(req, "username");
  const char *why = NULL;
  if (!path) path = "";
  if (files_auth(req, sb, "read", path, user, &why) != 0) return wbd_reply_error(req, 401, "%s", why);
  if (!known_user(user)) return wbd_reply_error(req, 401, "error looking up user '%s': unknown user", user);

  struct wbd_fspath p;
  int rc = wbd_fs_resolve(sb, path, &p);
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
  const char *qpath;         /* the `path` query parameter, or NULL */
  int fd;                    /* file being written, -1 */
  json_t *entries;           /* [EntryInfo] answered */
  char **paths;              /* the jail paths written so far (raw bytes: the JSON
                              * copies may have U+FFFD where a path is not UTF-8) */
  size_t npaths;
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

/* Opens (truncating) the destination of one uploaded file; 0 or -1 with u->status set. */
static int upload_begin(struct upload *u, const char *dest) {
  upload_close(u);
  if (!dest || !*dest) {
    upload_fail(u, 400, "a file part needs a filename when the path query parameter is absent");
    return -1;
  }
  struct wbd_fspath p;
  int rc = wbd_fs_resolve(u->sb, dest, &p);
  if (rc < 0) {
    wbd_fs_release(&p);
    upload_path_fail(u, rc, dest);
    return -1;
  }
  for (size_t i = 0; i < u->npaths; i++) {
    if (strcmp(u->paths[i], p.jail) == 0) {
      wbd_fs_release(&p);
      upload_fail(u, 400, "you cannot upload multiple files to the same path '%s' in one upload request", p.jail);
      return -1;
    }
  }
  if (strcmp(p.rel, ".") == 0) rc = -EISDIR;
  if (rc == 0) rc = wbd_fs_mkdirs(&p, 0);
  if (rc == 0) {
    rc = wbd_fs_open(&p, p.rel, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_NOCTTY, 0644);
    if (rc >= 0) {
      struct stat st;
      if (fstat(rc, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(rc);
        rc = -EINVAL;
      }
    }
  }
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
  char **np = realloc(u->paths, (u->npaths + 1) * sizeof *np);
  if (!np || !(np[u->npaths] = strdup(p.jail))) abort();
  u->paths = np;
  u->npaths++;
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

static enum MHD_Result files_post(struct wbd_req *req, struct wbd_sandbox *sb) {
  const char *path = wbd_req_query(req, "path");
  const char *user = wbd_req_query(req, "username");
  const char *why = NULL;
  if (files_auth(req, sb, "write", path ? path : "", user, &why) != 0) return wbd_reply_error(req, 401, "%s", why);
  if (!known_user(user)) return wbd_reply_error(req, 401, "error looking up user '%s': unknown user", user);

  /* Content-Encoding: gzip: the body is inflated first (at most the upload
   * limit's bytes, as for a plain body); the stored bytes are the inflated ones. */
  const char *enc = wbd_req_header(req, "Content-Encoding");
  const char *body = req->body ? req->body : "";
  size_t body_len = req->body_len;
  struct wbd_buf plain = { 0 };
  if (enc && *enc && strcasecmp(enc, "identity") != 0) {
    if (strcasecmp(enc, "gzip") != 0 && strcasecmp(enc, "x-gzip") != 0)
      return wbd_reply_error(req, 400, "unsupported Content-Encoding '%s'", enc);
    size_t cap = (size_t)wbd_lim.max_upload_mb << 20;
    int zrc = gunzip_buf(body, body_len, cap, &plain);
    if (zrc != 0) {
      wbd_buf_free(&plain);
      if (zrc == -2) return wbd_reply_error(req, 413, "the decompressed body exceeds the upload limit (%zu bytes)", cap);
      if (zrc == -3) return wbd_reply_error(req, 500, "out of memory");
      return wbd_reply_error(req, 400, "invalid gzip body");
    }
    body = plain.data ? plain.data : "";
    body_len = plain.len;
  }
  char merr[256];
  json_t *meta = wbd_fs_meta_headers(req, merr, sizeof merr);
  if (!meta) {
    wbd_buf_free(&plain);
    return wbd_reply_error(req, 400, "invalid metadata: %s", merr);
  }
  struct upload u = { .sb = sb, .qpath = path, .fd = -1, .entries = json_array(), .meta = meta };
  if (content_type_is(req, "multipart/form-data")) {
    struct MHD_PostProcessor *pp = MHD_create_post_processor(req->conn, 64 * 1024, upload_part, &u);
    if (!pp) {
      json_decref(u.entries);
      json_decref(meta);
      wbd_buf_free(&plain);
      return wbd_reply_error(req, 400, "invalid multipart/form-data request (no boundary?)");
    }
    enum MHD_Result ok = MHD_post_process(pp, body, body_len);
    if (MHD_destroy_post_processor(pp) != MHD_YES) ok = MHD_NO;
    upload_close(&u);
    if (!u.status && ok != MHD_YES) upload_fail(&u, 400, "malformed multipart/form-data body");
    if (!u.status && json_array_size(u.entries) == 0) upload_fail(&u, 400, "no file part named 'file' in the request");
  } else if (content_type_is(req, "application/octet-stream")) {
    if (!path || !*path) {
      upload_fail(&u, 400, "path query parameter is required for raw body upload");
    } else if (upload_begin(&u, path) == 0) {
      upload_write(&u, body, body_len);
      upload_close(&u);
    }
  } else {
    const char *ct = wbd_req_header(req, "Content-Type");
    upload_fail(&u, 400, "unsupported content type '%s': use multipart/form-data or application/octet-stream",
                ct ? ct : "");
  }
  wbd_buf_free(&plain);
  json_decref(meta);
  for (size_t i = 0; i < u.npaths; i++) free(u.paths[i]);
  free(u.paths);
  if (u.status) {
    json_decref(u.entries);
    return wbd_reply_error(req, u.status, "%s", u.msg);
  }
  return wbd_reply_json(req, 200, u.entries, NULL);
}

/* ------------------------------------------------------------------ */
/* filesystem.Filesystem                                               */
/* ------------------------------------------------------------------ */

static enum MHD_Result fs_rpc(struct wbd_req *req, struct wbd_sandbox *sb, const char *method, json_t *in) {
  const char *path = jstr(in, "path", NULL);
  struct wbd_fspath p, q;
  int rc;
  enum MHD_Result r;
  p.root = q.root = -1;

  if (strcmp(method, "Move") == 0) {
    const char *src = jstr(in, "source", NULL), *dst = jstr(in, "destination", NULL);
    if (!src || !dst) return rpc_error(req, "invalid_argument", "source and destination are required");
    if ((rc = wbd_fs_resolve(sb, src, &p)) < 0) {
      r = rpc_fs_error(req, rc, src);
    } else if ((rc = wbd_fs_resolve(sb, dst, &q)) < 0) {
      r = rpc_fs_error(req, rc, dst);
    } else if ((rc = wbd_fs_move(&p, &q)) < 0) {
      r = rpc_fs_error(req, rc, rc == -ENOENT ? p.jail : q.jail);
    } else {
      json_t *e = wbd_fs_entry(&q);
      r = e ? rpc_ok(req, json_pack("{s:o}", "entry", e)) : rpc_fs_error(req, -errno, q.jail);
    }
    wbd_fs_release(&p);
    wbd_fs_release(&q);
    return r;
  }

  int known = strcmp(method, "Stat") == 0 || strcmp(method, "MakeDir") == 0 ||
              strcmp(method, "ListDir") == 0 || strcmp(method, "Remove") == 0;
  if (!known) return rpc_error(req, "unimplemented", "filesystem.Filesystem/%s is not implemented", method);
  if (!path) return rpc_error(req, "invalid_argument", "path is required");
  if ((rc = wbd_fs_resolve(sb, path, &p)) < 0) {
    wbd_fs_release(&p);
    return rpc_fs_error(req, rc, path);
  }

  if (strcmp(method, "Stat") == 0) {
    json_t *e = wbd_fs_entry(&p);
    r = e ? rpc_ok(req, json_pack("{s:o}", "entry", e)) : rpc_fs_error(req, -errno, p.jail);
  } else if (strcmp(method, "MakeDir") == 0) {
    rc = wbd_fs_mkdirs(&p, 1);
    json_t *e = (rc == 0 || rc == -EEXIST) ? wbd_fs_entry(&p) : NULL;
    const char *etype = e ? jstr(e, "type", NULL) : NULL;
    if (rc == -EEXIST && etype && strcmp(etype, "FILE_TYPE_DIRECTORY") == 0)
      r = rpc_error(req, "already_exists", "directory '%s' already exists", p.jail);
    else if (rc == -EEXIST)
      r = rpc_error(req, "invalid_argument", "path '%s' already exists and is not a directory", p.jail);
    else if (rc == -ENOTDIR)
      r = rpc_error(req, "invalid_argument", "path '%s': a parent is not a directory", p.jail);
    else if (rc < 0)
      r = rpc_fs_error(req, rc, p.jail);
    else if (!e)
      r = rpc_fs_error(req, -errno, p.jail);
    else {
      r = rpc_ok(req, json_pack("{s:o}", "entry", e));
      e = NULL;
    }
    json_decref(e);
  } else if (strcmp(method, "ListDir") == 0) {
    long long depth = jint(in, "depth", 1);
    if (depth < 0) {
      r = rpc_error(req, "invalid_argument", "depth should be at least one");
    } else {
      int err = 0;
      json_t *res = wbd_fs_list(&p, depth == 0 ? 1 : (int)(depth > 1024 ? 1024 : depth), &err);
      if (res)
        r = rpc_ok(req, res);
      else if (err == -ENOTDIR)
        r = rpc_error(req, "invalid_argument", "path '%s' is not a directory", p.jail);
      else if (err == -ENOENT)
        r = rpc_error(req, "not_found", "directory '%s' does not exist", p.jail);
      else
        r = rpc_fs_error(req, err, p.jail);
    }
  } else {   /* Remove */
    rc = wbd_fs_remove(&p);
    r = rc < 0 ? rpc_fs_error(req, rc, p.jail) : rpc_ok(req, NULL);
  }
  wbd_fs_release(&p);
  return r;
}

/* ------------------------------------------------------------------ */
/* process.Process                                                     */
/* ------------------------------------------------------------------ */

/* Processes started by Process.Start, for List and SendSignal. */
struct proc {
  struct proc *next;
  char sbid[32];
  pid_t pid;
  json_t *config;   /* ProcessConfig as received */
  char *tag;
  int stdin_fd;     /* write end of its stdin when started with "stdin": true, else -1 */
};
static pthread_mutex_t procs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct proc *procs;

static void proc_register(struct wbd_sandbox *sb, pid_t pid, json_t *config, const char *tag, int stdin_fd) {
  struct proc *p = calloc(1, sizeof *p);
  if (!p) {
    if (stdin_fd >= 0) close(stdin_fd);
    return;
  }
  p->stdin_fd = stdin_fd;
  snprintf(p->sbid, sizeof p->sbid, "%s", sb->id);
  p->pid = pid;
  p->config = json_deep_copy(config);
  p->tag = tag ? strdup(tag) : NULL;
  pthread_mutex_lock(&procs_mu);
  p->next = procs;
  procs = p;
  pthread_mutex_unlock(&procs_mu);
}

static void proc_unregister(struct wbd_sandbox *sb, pid_t pid) {
  pthread_mutex_lock(&procs_mu);
  for (struct proc **pp = &procs; *pp; pp = &(*pp)->next) {
    struct proc *p = *pp;
    if (p->pid == pid && strcmp(p->sbid, sb->id) == 0) {
      *pp = p->next;
      if (p->stdin_fd >= 0) close(p->stdin_fd);
      json_decref(p->config);
      free(p->tag);
      free(p);
      break;
    }
  }
  pthread_mutex_unlock(&procs_mu);
}

/* pid of the process a ProcessSelector names, or 0. stdin_op: 0 none,
 * 1 *stdin_dup = a dup of its stdin (-1 if none), 2 close its stdin. */
static pid_t proc_find(struct wbd_sandbox *sb, json_t *sel, int stdin_op, int *stdin_dup) {
  long long want = jint(sel, "pid", 0);
  const char *tag = jstr(sel, "tag", NULL);
  pid_t found = 0;
  pthread_mutex_lock(&procs_mu);
  for (struct proc *p = procs; p; p = p->next) {
    if (strcmp(p->sbid, sb->id) != 0) continue;
    if ((want && p->pid == want) || (!want && tag && p->tag && strcmp(tag, p->tag) == 0)) {
      found = p->pid;
      if (stdin_op == 1) *stdin_dup = p->stdin_fd >= 0 ? fcntl(p->stdin_fd, F_DUPFD_CLOEXEC, 0) : -1;
      if (stdin_op == 2 && p->stdin_fd >= 0) {
        close(p->stdin_fd);
        p->stdin_fd = -1;
      }
      break;
    }
  }
  pthread_mutex_unlock(&procs_mu);
  return found;
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

enum { PS_START, PS_RUNNING, PS_DONE, PS_ABORT };

struct pstream {
  struct wbd_sandbox *sb;     /* our own reference */
  struct MHD_Connection *conn;
  pid_t pid;
  int out_fd, err_fd;
  int pid_fd;                 /* pidfd: readable once the process exited; -1 if unsupported */
  int reaped;
  int phase;
  int64_t deadline_us;        /* 0: none */
  int64_t keepalive_us;       /* 0: none */
  int64_t last_sent_us;
  struct wbd_buf buf;
};

static int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
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

static void ps_reap(struct pstream *ps, int *status) {
  *status = wbd_rt_wait(ps->sb, ps->pid);
  ps->reaped = 1;
}

static void ps_end(struct pstream *ps) {
  int st;
  ps_reap(ps, &st);
  /* The sandbox was killed (or paused) under the process: as E2B's VM going
   * away, the stream is dropped, not ended, so that the SDK finds the sandbox
   * gone ("The sandbox was killed ...") instead of a "signal: killed" end. */
  wbd_store_lock();
  int gone = ps->sb->state != WBD_RUNNING;
  wbd_store_unlock();
  if (gone) {
    ps->phase = PS_ABORT;
    return;
  }
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
  envelope_add(&ps->buf, 0, json_pack("{s:{s:o}}", "event", "end", end));
  envelope_add(&ps->buf, 0x02, json_object());
  ps->phase = PS_DONE;
}

/* Produce the next envelope(s) into ps->buf; may block. */
static void ps_step(struct pstream *ps) {
  if (ps->phase == PS_START) {
    envelope_add(&ps->buf, 0, json_pack("{s:{s:{s:I}}}", "event", "start", "pid", (json_int_t)ps->pid));
    ps->phase = PS_RUNNING;
    ps->last_sent_us = mono_us();
    return;
  }
  /* Like Go's exec.Cmd, the end comes when both pipes are at EOF and the
   * process has exited; waiting for the exit still honours the deadline and
   * a client that goes away. */
  int pipes_open = ps->out_fd >= 0 || ps->err_fd >= 0;
  if (!pipes_open && ps->pid_fd < 0) {
    ps_end(ps);
    return;
  }
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(ps->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  struct pollfd fds[4] = {
    { .fd = ps->out_fd, .events = POLLIN }, { .fd = ps->err_fd, .events = POLLIN },
    { .fd = ci ? ci->connect_fd : -1, .events = POLLRDHUP },
    { .fd = pipes_open ? -1 : ps->pid_fd, .events = POLLIN },
  };
  for (;;) {
    int64_t now = mono_us(), wait_us = 1000000;
    if (ps->deadline_us) {
      if (now >= ps->deadline_us) {
        /* Connect-Timeout-Ms ran out: envd kills the process; the stream fails. */
        wbd_rt_signal(ps->sb, ps->pid, SIGKILL);
        int st;
        ps_reap(ps, &st);
        envelope_add(&ps->buf, 0x02, trailer_error("deadline_exceeded", "the operation timed out"));
        ps->phase = PS_DONE;
        return;
      }
      if (ps->deadline_us - now < wait_us) wait_us = ps->deadline_us - now;
    }
    if (ps->keepalive_us) {
      int64_t due = ps->last_sent_us + ps->keepalive_us;
      if (now >= due) {
        envelope_add(&ps->buf, 0, json_pack("{s:{s:{}}}", "event", "keepalive"));
        ps->last_sent_us = now;
        return;
      }
      if (due - now < wait_us) wait_us = due - now;
    }
    int n = poll(fds, 4, (int)((wait_us + 999) / 1000));
    if (n < 0 && errno != EINTR) {
      ps->phase = PS_ABORT;
      return;
    }
    if (n <= 0) continue;
    if (fds[2].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
      ps->phase = PS_ABORT;   /* the client went away: `done` kills the process */
      return;
    }
    if (fds[3].revents) {
      ps_end(ps);
      return;
    }
    for (int i = 0; i < 2; i++) {
      if (!fds[i].revents) continue;
      char chunk[32768];
      ssize_t r = read(fds[i].fd, chunk, sizeof chunk);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) {
        close(fds[i].fd);
        if (i == 0) ps->out_fd = -1; else ps->err_fd = -1;
        return;
      }
      char *b64 = wbd_b64_encode(chunk, (size_t)r);
      envelope_add(&ps->buf, 0, json_pack("{s:{s:{s:s}}}", "event", "data", i == 0 ? "stdout" : "stderr",
                                          b64 ? b64 : ""));
      free(b64);
      ps->last_sent_us = mono_us();
      return;
    }
  }
}

static ssize_t ps_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct pstream *ps = cls;
  (void)pos;
  for (;;) {
    if (ps->buf.off < ps->buf.len) {
      size_t n = ps->buf.len - ps->buf.off;
      if (n > max) n = max;
      memcpy(out, ps->buf.data + ps->buf.off, n);
      ps->buf.off += n;
      if (ps->buf.off == ps->buf.len) ps->buf.off = ps->buf.len = 0;
      return (ssize_t)n;
    }
    if (ps->phase == PS_DONE) return MHD_CONTENT_READER_END_OF_STREAM;
    if (ps->phase == PS_ABORT) return MHD_CONTENT_READER_END_WITH_ERROR;
    ps_step(ps);
  }
}

static void ps_done(void *cls) {
  struct pstream *ps = cls;
  if (!ps->reaped) {
    wbd_rt_signal(ps->sb, ps->pid, SIGKILL);
    int st;
    ps_reap(ps, &st);
  }
  if (ps->out_fd >= 0) close(ps->out_fd);
  if (ps->err_fd >= 0) close(ps->err_fd);
  if (ps->pid_fd >= 0) close(ps->pid_fd);
  proc_unregister(ps->sb, ps->pid);
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

static enum MHD_Result process_start(struct wbd_req *req, struct wbd_sandbox *sb) {
  if (!content_type_is(req, "application/connect+json"))
    return wbd_reply_error(req, 415, "process.Process/Start is a streaming RPC: use application/connect+json");
  char bad[128];
  if (rpc_user(req, bad, sizeof bad) != 0)
    return stream_fail(req, trailer_error("unauthenticated", "invalid username: '%s'", bad));
  size_t len = 0;
  switch (wbd_connect_envelope(req->body, req->body_len, &len)) {
    case WBD_ENV_OK: break;
    case WBD_ENV_SHORT: return stream_fail(req, trailer_error("invalid_argument", "missing request envelope"));
    case WBD_ENV_COMPRESSED:
      return stream_fail(req, trailer_error("internal", "compressed envelopes are not supported"));
    default:
      return stream_fail(req, trailer_error("invalid_argument", "request envelope length %zu does not match the body",
                                            len));
  }
  json_error_t jerr;
  json_t *in = json_loadb(req->body + 5, len, 0, &jerr);
  json_t *proc = json_object_get(in, "process");
  const char *cmd = jstr(proc, "cmd", NULL);
  if (!json_is_object(in) || !cmd || !*cmd) {
    json_decref(in);
    return stream_fail(req, trailer_error("invalid_argument", "process.cmd is required"));
  }
  json_t *args = json_object_get(proc, "args"), *envs = json_object_get(proc, "envs");
  const char *cwd_in = jstr(proc, "cwd", NULL);
  char cwd[PATH_MAX + 16];
  if (!cwd_in || !*cwd_in)
    snprintf(cwd, sizeof cwd, "%s", ENVD_HOME);
  else if (cwd_in[0] == '~' && (cwd_in[1] == 0 || cwd_in[1] == '/'))
    snprintf(cwd, sizeof cwd, ENVD_HOME "%s", cwd_in + 1);
  else if (cwd_in[0] != '/')
    snprintf(cwd, sizeof cwd, ENVD_HOME "/%s", cwd_in);
  else
    snprintf(cwd, sizeof cwd, "%s", cwd_in);

  size_t nargs = json_is_array(args) ? json_array_size(args) : 0;
  char **argv = calloc(nargs + 2, sizeof *argv);
  if (!argv) {
    json_decref(in);
    return stream_fail(req, trailer_error("internal", "out of memory"));
  }
  argv[0] = strdup(cmd);
  for (size_t i = 0; i < nargs; i++) {
    const char *a = json_string_value(json_array_get(args, i));
    argv[i + 1] = strdup(a ? a : "");
  }
  pid_t pid = 0;
  int out_fd = -1, err_fd = -1, in_fd = -1;
  int want_stdin = json_is_true(json_object_get(in, "stdin"));
  int rc = wbd_rt_spawn(sb, argv, json_is_object(envs) ? envs : NULL, cwd, &pid, want_stdin ? &in_fd : NULL,
                        &out_fd, &err_fd);
  for (size_t i = 0; i < nargs + 1; i++) free(argv[i]);
  free(argv);
  if (rc != 0) {
    json_decref(in);
    return stream_fail(req, trailer_error(rc == -ENOENT || rc == -ENOTDIR ? "invalid_argument" : "internal",
                                          "failed to start process '%s': %s", cmd, strerror(-rc)));
  }

  struct pstream *ps = calloc(1, sizeof *ps);
  if (!ps) {
    wbd_rt_signal(sb, pid, SIGKILL);
    wbd_rt_wait(sb, pid);
    if (out_fd >= 0) close(out_fd);
    if (err_fd >= 0) close(err_fd);
    if (in_fd >= 0) close(in_fd);
    json_decref(in);
    return stream_fail(req, trailer_error("internal", "out of memory"));
  }
  proc_register(sb, pid, proc, jstr(in, "tag", NULL), in_fd);
  json_decref(in);
  wbd_store_lock();
  sb->refcount++;            /* the stream outlives this handler */
  sb->runs_in_flight++;
  wbd_store_unlock();
  ps->sb = sb;
  ps->conn = req->conn;
  ps->pid = pid;
  ps->out_fd = out_fd;
  ps->err_fd = err_fd;
  ps->pid_fd = (int)syscall(SYS_pidfd_open, pid, 0);   /* -1 (ENOSYS...): a blocking wait at the end */
  ps->phase = PS_START;
  /* Saturated: ~31 years of milliseconds, a day of seconds between pings. */
  int64_t timeout_ms = header_num(req, "Connect-Timeout-Ms", (int64_t)1 << 40);
  if (timeout_ms > 0) ps->deadline_us = mono_us() + timeout_ms * 1000;
  int64_t ka = header_num(req, "Keepalive-Ping-Interval", 86400);
  ps->keepalive_us = (ka > 0 ? ka : 50) * 1000000;
  return wbd_reply_stream(req, 200, "application/connect+json", ps_read, ps, ps_done, NULL);
}

static enum MHD_Result process_rpc(struct wbd_req *req, struct wbd_sandbox *sb, const char *method, json_t *in) {
  if (strcmp(method, "List") == 0) {
    json_t *arr = json_array();
    pthread_mutex_lock(&procs_mu);
    for (struct proc *p = procs; p; p = p->next) {
      if (strcmp(p->sbid, sb->id) != 0) continue;
      json_t *o = json_pack("{s:O,s:I}", "config", p->config ? p->config : json_object(), "pid",
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
      is_input = strcmp(method, "SendInput") == 0;
  if (!is_signal && !is_close && !is_input)
    return rpc_error(req, "unimplemented", "process.Process/%s is not implemented", method);
  json_t *sel = json_object_get(in, "process");
  int in_fd = -1;
  pid_t pid = proc_find(sb, sel, is_input ? 1 : is_close ? 2 : 0, &in_fd);
  if (!pid) {
    const char *tag = jstr(sel, "tag", NULL);
    if (tag) return rpc_error(req, "not_found", "process with tag '%s' not found", tag);
    return rpc_error(req, "not_found", "process with pid %lld not found", jint(sel, "pid", 0));
  }
  if (is_close) return rpc_ok(req, NULL);
  if (is_input) {
    const char *b64 = jstr(json_object_get(in, "input"), "stdin", NULL);
    if (!b64) b64 = jstr(json_object_get(in, "input"), "pty", NULL);
    size_t n = 0;
    unsigned char *data = b64 ? wbd_b64_decode(b64, &n) : NULL;
    enum MHD_Result r;
    if (in_fd < 0)
      r = rpc_error(req, "failed_precondition", "process %d was not started with stdin", (int)pid);
    else if (!data)
      r = rpc_error(req, "invalid_argument", "input.stdin must be base64");
    else {
      size_t off = 0;
      while (off < n) {
        ssize_t w = write(in_fd, data + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) break;
        off += (size_t)w;
      }
      r = off == n ? rpc_ok(req, NULL) : rpc_error(req, "failed_precondition", "stdin of process %d is closed",
                                                    (int)pid);
    }
    free(data);
    if (in_fd >= 0) close(in_fd);
    return r;
  }
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
  if (!sig) return rpc_error(req, "invalid_argument", "unsupported signal");
  int rc = wbd_rt_signal(sb, pid, sig);
  if (rc == -ESRCH) return rpc_error(req, "not_found", "process with pid %d not found", (int)pid);
  if (rc < 0) return rpc_error(req, "internal", "signalling process %d: %s", (int)pid, strerror(-rc));
  return rpc_ok(req, NULL);
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

static enum MHD_Result metrics(struct wbd_req *req) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
  long psz = sysconf(_SC_PAGESIZE);
  long long total = (long long)pages * psz, used = (long long)(pages - avail) * psz;
  return wbd_reply_json(req, 200,
                        json_pack("{s:I,s:I,s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "ts", (json_int_t)time(NULL),
                                  "cpu_count", (json_int_t)cpus, "cpu_used_pct", 0.0, "mem_total",
                                  (json_int_t)total, "mem_used", (json_int_t)used, "mem_cache", (json_int_t)0,
                                  "mem_total_mib", (json_int_t)(total >> 20), "mem_used_mib",
                                  (json_int_t)(used >> 20), "disk_used", (json_int_t)0, "disk_total",
                                  (json_int_t)0),
                        NULL);
}

enum MHD_Result wbd_envd_handle(struct wbd_req *req, struct wbd_sandbox *sb) {
  const char *path = req->path;
  int get = strcmp(req->method, "GET") == 0, post = strcmp(req->method, "POST") == 0;
  if (strcmp(path, "/health") == 0 && get) return wbd_reply_raw(req, 204, NULL, NULL, 0, NULL);
  if (strcmp(path, "/files") == 0 && get) return files_get(req, sb);
  if (strcmp(path, "/files") == 0 && post) return files_post(req, sb);
  if (strcmp(path, "/envs") == 0 && get) return envs(req, sb);
  if (strcmp(path, "/metrics") == 0 && get) return metrics(req);
  if (strcmp(path, "/process.Process/Start") == 0) {
    if (!post) return wbd_reply_error(req, 405, "method not allowed");
    return process_start(req, sb);
  }
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
