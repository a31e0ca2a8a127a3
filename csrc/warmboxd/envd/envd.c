/*
 * envd.c: the in-sandbox daemon's API (port 49983) as E2B's envd serves it:
 * its routing, the HTTP routes (/health, /envs, /metrics, /files) and the
 * Connect-RPC service filesystem.Filesystem with the JSON codec (process.c
 * holds process.Process, rpc.c what both share).
 *
 * Every path goes through envd_fs.c, which confines it to the sandbox's
 * /home/user and /tmp.
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

/* The Connect code for a filesystem errno. */
static const char *errno_code(int err) {
  switch (-err) {
    case ENOENT:
      return "not_found";
    case EACCES:
    case EPERM:
    case EROFS:
      return "permission_denied";
    case EEXIST:
    case ENOTEMPTY:
      return "already_exists";
    case ENOTDIR:
    case EISDIR:
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
    case EXDEV:
      return "invalid_argument";
    case ENOSPC:
    case EDQUOT:
      return "resource_exhausted";
    case ESTALE:
      return "unavailable";
    default:
      return "internal";
  }
}

static enum MHD_Result rpc_fs_error(struct wbd_req *req, int err, const char *path) {
  if (err == -ENOENT) return wbd_rpc_error(req, "not_found", "no such file or directory: '%s'", path);
  return wbd_rpc_error(req, errno_code(err), "'%s': %s", path, wbd_fs_strerror(err));
}

/* ------------------------------------------------------------------ */
/* GET /files, POST /files                                             */
/* ------------------------------------------------------------------ */

/* envd's /files auth: the token when sent, else a URL signature. */
static int files_auth(struct wbd_req *req, struct wbd_sandbox *sb, const char *op, const char *path, const char *user,
                      const char **why) {
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
    case ENOENT:
      return wbd_reply_error(req, 404, "path '%s' does not exist", shown);
    case EISDIR:
      return wbd_reply_error(req, 400, "path '%s' is a directory", shown);
    case ENOTDIR:
      return wbd_reply_error(req, 400, "path '%s': a parent is not a directory", shown);
    case EACCES:
    case EPERM:
    case ELOOP:
    case ENAMETOOLONG:
    case EINVAL:
      return wbd_reply_error(req, 400, "invalid path '%s': %s", shown, wbd_fs_strerror(err));
    case ENOSPC:
    case EDQUOT:
      return wbd_reply_error(req, 507, "not enough disk space for '%s'", shown);
    default:
      return wbd_reply_error(req, 500, "'%s': %s", shown, wbd_fs_strerror(err));
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
  z_stream z = {0};
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

#define FEED_CORRUPT   (-1) /* not a gzip stream, or a truncated one */
#define FEED_OVER_CAP  (-2) /* inflates to more than the cap: a decompression bomb */
#define FEED_NO_MEMORY (-3)
#define FEED_READ      (-4) /* the spooled body could not be read */
#define FEED_SINK      (-5) /* the sink stopped */

/* A gzip (or zlib) stream inflated on the way to the sink, at most cap bytes. */
struct inflater {
  z_stream z;
  size_t out, cap;
  int ended, err; /* err: the FEED_* error that stopped it */
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
    if (n == 0 && (len == 0 || rc == Z_BUF_ERROR)) break; /* needs more input */
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
  struct inflater f = {.cap = cap, .sink = sink, .cls = cls};
  if (inflateInit2(&f.z, 32 + MAX_WBITS) != Z_OK) return FEED_NO_MEMORY; /* 32: gzip or zlib header */
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
  if (!wbd_known_user(user)) return wbd_reply_error(req, 401, "error looking up user '%s': unknown user", user);

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
  const char *headers[] = {"Content-Disposition", disp, "Vary", "Accept-Encoding", NULL};
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
  struct wbd_buf data = {0};
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
  struct wbd_buf gz = {0};
  if (failed) {
    r = wbd_reply_error(req, 500, "reading '%s': %s", p.jail, strerror(failed));
  } else if (accepts_gzip(wbd_req_header(req, "Accept-Encoding")) &&
             gzip_buf(data.data ? data.data : "", data.len, &gz) == 0) {
    /* As envd: gzip when asked (files up to FILES_INLINE_MAX; larger ones
     * stream uncompressed, which Accept-Encoding allows). */
    const char *gzh[] = {"Content-Disposition", disp, "Vary", "Accept-Encoding", "Content-Encoding", "gzip", NULL};
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
  const char *user;  /* the username query parameter: whose home a relative path is in */
  const char *qpath; /* the `path` query parameter, or NULL */
  int fd;            /* file being written, -1 */
  size_t expect;     /* bytes a file may get (the body's size), 0: unknown (gzip) */
  json_t *entries;   /* [EntryInfo] answered */
  struct upfile {    /* the files written so far: the jail path (raw bytes: the
                      * JSON copies may have U+FFFD where a path is not UTF-8) */
    char *jail;
    dev_t dev;
    ino_t ino;
  } * files;
  size_t nfiles;
  json_t *meta;    /* X-Metadata-* headers: each file's user.e2b.* xattrs */
  unsigned status; /* error to answer, 0 while fine */
  char msg[PATH_MAX + 128];
};

static void upload_fail(struct upload *u, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
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
    case EISDIR:
      upload_fail(u, 400, "path '%s' is a directory", shown);
      break;
    case ENOTDIR:
      upload_fail(u, 400, "path '%s': a parent is not a directory", shown);
      break;
    case EACCES:
    case EPERM:
    case ELOOP:
    case ENAMETOOLONG:
    case EINVAL:
    case ENOENT:
      upload_fail(u, 400, "invalid path '%s': %s", shown, wbd_fs_strerror(err));
      break;
    case ENOSPC:
    case EDQUOT:
      upload_fail(u, 507, "not enough disk space for '%s'", shown);
      break;
    default:
      upload_fail(u, 500, "'%s': %s", shown, wbd_fs_strerror(err));
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
  (void)kind;
  (void)content_type;
  (void)transfer_encoding;
  if (u->status) return MHD_NO;
  if (!key || strcmp(key, "file") != 0) return MHD_YES; /* other fields are ignored, as envd does */
  /* MHD calls once with off == 0 at the start of every part, even an empty one. */
  if (off == 0 && upload_begin(u, u->qpath && *u->qpath ? u->qpath : filename) != 0) return MHD_NO;
  if (u->fd < 0) return MHD_NO;
  return upload_write(u, data, size) == 0 ? MHD_YES : MHD_NO;
}

static int multipart_sink(void *cls, const char *data, size_t len) {
  return MHD_post_process(cls, data, len) == MHD_YES ? 0 : -1;
}

static int octet_sink(void *cls, const char *data, size_t len) {
  return upload_write(cls, data, len);
}

/* The status of a body that could not be fed (FEED_SINK: the sink's own). */
static void upload_feed_fail(struct upload *u, int rc, size_t cap) {
  if (rc == FEED_OVER_CAP)
    upload_fail(u, 413, "the decompressed body exceeds the upload limit (%zu bytes)", cap);
  else if (rc == FEED_CORRUPT)
    upload_fail(u, 400, "invalid gzip body");
  else if (rc == FEED_NO_MEMORY)
    upload_fail(u, 500, "out of memory");
  else if (rc == FEED_READ)
    upload_fail(u, 500, "reading the spooled upload failed");
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
  if (!wbd_known_user(user)) return wbd_reply_error(req, 401, "error looking up user '%s': unknown user", user);

  const char *enc = wbd_req_header(req, "Content-Encoding");
  int gz = enc && *enc && strcasecmp(enc, "identity") != 0;
  if (gz && strcasecmp(enc, "gzip") != 0 && strcasecmp(enc, "x-gzip") != 0)
    return wbd_reply_error(req, 400, "unsupported Content-Encoding '%s'", enc);
  size_t cap = (size_t)wbd_lim.max_upload_mb << 20;
  char merr[256];
  json_t *meta = wbd_fs_meta_headers(req, merr, sizeof merr);
  if (!meta) return wbd_reply_error(req, 400, "invalid metadata: %s", merr);
  struct upload u = {.sb = sb,
                     .user = user,
                     .qpath = path,
                     .fd = -1,
                     .expect = gz ? 0 : req->body_len,
                     .entries = json_array(),
                     .meta = meta};
  if (wbd_content_type_is(req, "multipart/form-data")) {
    upload_multipart(req, &u, gz, cap);
  } else if (wbd_content_type_is(req, "application/octet-stream")) {
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
  return wbd_rpc_error(req, "permission_denied",
                       "'%s' is part of the sandbox's filesystem skeleton: it cannot be "
                       "removed, renamed or replaced",
                       jail);
}

static enum MHD_Result fs_entry_reply(struct wbd_req *req, const struct wbd_fspath *p) {
  json_t *e = wbd_fs_entry(p);
  return e ? wbd_rpc_ok(req, json_pack("{s:o}", "entry", e)) : rpc_fs_error(req, -errno, p->jail);
}

/* filesystem.Filesystem/Move: both ends resolved as the caller, neither a
 * part of the skeleton; answers the moved entry. */
static enum MHD_Result fs_move(struct wbd_req *req, struct wbd_sandbox *sb, const char *user, json_t *in) {
  const char *src = wbd_jstr(in, "source", NULL), *dst = wbd_jstr(in, "destination", NULL);
  if (!src || !dst) return wbd_rpc_error(req, "invalid_argument", "source and destination are required");
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
  const char *etype = e ? wbd_jstr(e, "type", NULL) : NULL;
  enum MHD_Result r;
  if (rc == -EEXIST && etype && strcmp(etype, "FILE_TYPE_DIRECTORY") == 0)
    r = wbd_rpc_error(req, "already_exists", "directory '%s' already exists", p->jail);
  else if (rc == -EEXIST)
    r = wbd_rpc_error(req, "invalid_argument", "path '%s' already exists and is not a directory", p->jail);
  else if (rc == -ENOTDIR)
    r = wbd_rpc_error(req, "invalid_argument", "path '%s': a parent is not a directory", p->jail);
  else if (rc < 0)
    r = rpc_fs_error(req, rc, p->jail);
  else if (!e)
    r = rpc_fs_error(req, -errno, p->jail);
  else {
    r = wbd_rpc_ok(req, json_pack("{s:o}", "entry", e));
    e = NULL;
  }
  json_decref(e);
  return r;
}

/* ListDir: depth 0 lists one level, as 1 does; at most 1024 levels and
 * wbd_opt.max_list_entries entries. */
static enum MHD_Result fs_list_dir(struct wbd_req *req, struct wbd_fspath *p, json_t *in) {
  long long depth = wbd_jint(in, "depth", 1);
  if (depth < 0) return wbd_rpc_error(req, "invalid_argument", "depth should be at least one");
  int err = 0;
  json_t *res =
    wbd_fs_list(p, depth == 0 ? 1 : (int)(depth > 1024 ? 1024 : depth), (size_t)wbd_opt.max_list_entries, &err);
  if (res) return wbd_rpc_ok(req, res);
  if (err == -ENOTDIR) return wbd_rpc_error(req, "invalid_argument", "path '%s' is not a directory", p->jail);
  if (err == -ENOENT) return wbd_rpc_error(req, "not_found", "directory '%s' does not exist", p->jail);
  if (err == -E2BIG)
    return wbd_rpc_error(req, "resource_exhausted",
                         "directory '%s' has more than %d entries at depth %lld: "
                         "list a smaller depth or a subdirectory",
                         p->jail, wbd_opt.max_list_entries, (long long)depth);
  return rpc_fs_error(req, err, p->jail);
}

static enum MHD_Result fs_remove(struct wbd_req *req, struct wbd_fspath *p, json_t *in) {
  (void)in;
  if (wbd_rt_skeleton(p->jail)) return skeleton_error(req, p->jail);
  int rc = wbd_fs_remove(p);
  return rc < 0 ? rpc_fs_error(req, rc, p->jail) : wbd_rpc_ok(req, NULL);
}

static const struct {
  const char *method;
  enum MHD_Result (*fn)(struct wbd_req *req, struct wbd_fspath *p, json_t *in);
} fs_methods[] = {
  {"Stat", fs_stat},
  {"MakeDir", fs_make_dir},
  {"ListDir", fs_list_dir},
  {"Remove", fs_remove},
};

/* filesystem.Filesystem's unary methods: Move, or one of fs_methods on the
 * request's path resolved as the caller. */
static enum MHD_Result fs_rpc(struct wbd_req *req, struct wbd_sandbox *sb, const char *method, json_t *in) {
  char user[64];
  wbd_rpc_user(req, user, sizeof user); /* checked by unary_rpc */
  if (strcmp(method, "Move") == 0) return fs_move(req, sb, user, in);
  size_t i = 0;
  while (i < sizeof fs_methods / sizeof *fs_methods && strcmp(method, fs_methods[i].method) != 0) i++;
  if (i == sizeof fs_methods / sizeof *fs_methods)
    return wbd_rpc_error(req, "unimplemented", "filesystem.Filesystem/%s is not implemented", method);
  const char *path = wbd_jstr(in, "path", NULL);
  if (!path) return wbd_rpc_error(req, "invalid_argument", "path is required");
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
/* Routing                                                             */
/* ------------------------------------------------------------------ */

static enum MHD_Result unary_rpc(struct wbd_req *req, struct wbd_sandbox *sb, const char *service, const char *method) {
  if (strcmp(req->method, "POST") != 0) return wbd_reply_error(req, 405, "method not allowed");
  if (!wbd_content_type_is(req, "application/json"))
    return wbd_reply_error(req, 415, "unsupported content type: envd's RPCs speak application/json here");
  char bad[128];
  if (wbd_rpc_user(req, bad, sizeof bad) != 0)
    return wbd_rpc_error(req, "unauthenticated", "invalid username: '%s'", bad);
  json_error_t jerr;
  json_t *in = req->body_len ? json_loadb(req->body, req->body_len, 0, &jerr) : json_object();
  if (!json_is_object(in)) {
    json_decref(in);
    return wbd_rpc_error(req, "invalid_argument", "request body is not a JSON object");
  }
  enum MHD_Result r =
    strcmp(service, "filesystem") == 0 ? fs_rpc(req, sb, method, in) : wbd_process_rpc(req, sb, method, in);
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
    return wbd_process_start(req, sb);
  }
  if (strcmp(path, "/process.Process/Connect") == 0 && post) return wbd_process_connect(req, sb);
  if (strcmp(path, "/process.Process/StreamInput") == 0 && post) return wbd_process_stream_input(req, sb);
  enum MHD_Result wr;
  if (wbd_envd_watch_route(req, sb, &wr)) return wr; /* WatchDir and the polled watchers */
  static const char fs_prefix[] = "/filesystem.Filesystem/", proc_prefix[] = "/process.Process/";
  int is_rpc =
    strncmp(path, fs_prefix, sizeof fs_prefix - 1) == 0 || strncmp(path, proc_prefix, sizeof proc_prefix - 1) == 0;
  if (is_rpc && post && wbd_content_type_is(req, "application/connect+json")) /* Connect, WatchDir, ... */
    return wbd_envd_stream_error(req, "unimplemented", "%s is not implemented", path + 1);
  if (strncmp(path, fs_prefix, sizeof fs_prefix - 1) == 0)
    return unary_rpc(req, sb, "filesystem", path + sizeof fs_prefix - 1);
  if (strncmp(path, proc_prefix, sizeof proc_prefix - 1) == 0)
    return unary_rpc(req, sb, "process", path + sizeof proc_prefix - 1);
  return wbd_reply_error(req, 404, "no such envd route: %s %s", req->method, path);
}
