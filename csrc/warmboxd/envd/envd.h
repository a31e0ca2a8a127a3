/*
 * envd.h: the envd layer (envd/): the in-sandbox daemon's API on port
 * 49983 (envd.c), the sandbox's filesystem as envd sees it, confined
 * (envd_fs.c), and directory watchers (envd_watch.c).
 *
 * envd serves the jail's filesystem as the sandbox's processes see it, tree
 * by tree, as jail_args mounts them (wbd_rt_locate): the sandbox's own
 * writable trees (/home/user, /tmp, and its root `/` for every other path:
 * <data_dir>/<id>/{home,tmp,root}), and the host trees the jail binds
 * read-only (/usr, /lib..., /etc's bound entries). The per-process /proc,
 * /dev and /sys are not served. Every path from a request is made absolute
 * (relative and "~" against the user's home), cleaned lexically, and mapped
 * to its tree; the rest is resolved by the kernel with openat2(RESOLVE_BENEATH
 * | RESOLVE_NO_SYMLINKS) from an fd of that tree's root, or, when a symlink or
 * a mount point is on the way, one component at a time with O_NOFOLLOW,
 * switching trees where the jail would: neither "..", nor a symlink planted by
 * the sandbox's own code, can reach a host file the jail does not show, or
 * write a read-only one (host trees are kernel-read-only clones when
 * warmboxd is root, and every change is refused in them first). Final
 * components that are modified (remove, move, mkdir) are never followed.
 */
#ifndef WBD_ENVD_H
#define WBD_ENVD_H

#include "wbd.h"
#include "util.h"
#include <dirent.h>
#include <limits.h>
#include <stdarg.h>
#include <sys/types.h>

struct wbd_fspath {
  struct wbd_sandbox *sb;
  int root;            /* O_PATH fd of the tree's root, -1 when not open */
  char jail[PATH_MAX]; /* the cleaned path as the sandbox sees it */
  char rel[PATH_MAX];  /* relative to root; "." for the root itself */
  int ro;              /* a host tree the jail has read-only: every change is -EROFS */
  uid_t uid;           /* the sandbox user's: new files get it */
  gid_t gid;
};

/* Errors are -errno; -EACCES: outside the sandbox's trees (or a symlink
 * that leads out); -EINVAL: empty or malformed. */
int wbd_fs_resolve(struct wbd_sandbox *sb, const char *path, struct wbd_fspath *p);
/* As wbd_fs_resolve, for envd's `user`: relative paths and "~" are from
 * its home (/root for "root" in a jail, else /home/user). */
int wbd_fs_resolve_as(struct wbd_sandbox *sb, const char *path, const char *user, struct wbd_fspath *p);
void wbd_fs_release(struct wbd_fspath *p);

/* openat2 beneath the root (follows symlinks only inside it); fd or -errno. */
int wbd_fs_open(const struct wbd_fspath *p, const char *rel, int flags, mode_t mode);
/* fd (O_PATH directory) of the parent of p->rel; *base = its last component.
 * -EPERM for the root itself. */
int wbd_fs_parent(const struct wbd_fspath *p, const char **base);
/* mkdir -p of p->rel's parents (and of p->rel itself when `self`); -errno. */
int wbd_fs_mkdirs(const struct wbd_fspath *p, int self);
/* Give a created file or directory the owner of the tree. */
void wbd_fs_chown(const struct wbd_fspath *p, int fd);

/* A directory stream on fd, or with `dup_fd` on a dup of it (which shares
 * fd's offset: rewinddir to walk it again); fd is the stream's, closed on
 * failure, unless dup_fd. NULL with *err = -errno. */
DIR *wbd_fs_dir(int fd, int dup_fd, int *err);
/* d's next entry but "." and ".."; NULL at the end. */
struct dirent *wbd_fs_next(DIR *d);

/* rm -rf of the last component of p (never follows it); missing is fine. */
int wbd_fs_remove(const struct wbd_fspath *p);
/* rename src to dst (creating dst's parents); -errno. */
int wbd_fs_move(const struct wbd_fspath *src, const struct wbd_fspath *dst);

/* protojson EntryInfo of p (lstat: a symlink is reported as one); NULL + errno. */
json_t *wbd_fs_entry(const struct wbd_fspath *p);
/* {"entries": [...]} of a directory, walking `depth` levels (never into
 * symlinks); NULL + *err = -errno; -E2BIG: more than `max` entries
 * (a recursive listing of /usr would be a 50 MB answer, held whole). A
 * first walk only counts (each entry made and dropped), so a listing over
 * the cap is refused without ever holding its entries. */
json_t *wbd_fs_list(const struct wbd_fspath *p, int depth, size_t max, int *err);

/* File metadata, as E2B's envd keeps it: `X-Metadata-<key>: <value>` upload
 * headers become `user.e2b.<key>` extended attributes (key lowercased),
 * surfaced as an EntryInfo's "metadata". */
#define WBD_META_XATTR_PREFIX "user.e2b."
/* The X-Metadata-* headers of a request as an object (empty when none; the
 * first of repeated headers wins), or NULL with why in err: a key or value
 * that is not printable ASCII, a key over 246 bytes, over 4096 bytes in all
 * (envd's limits). */
json_t *wbd_fs_meta_headers(struct wbd_req *req, char *err, size_t errlen);
/* Replaces the user.e2b.* attributes of an open file with `meta` (removing
 * those it lacks: an overwrite does not keep stale metadata); 0 or -errno
 * (-ENOTSUP/-EOPNOTSUPP: the filesystem keeps no user xattrs). */
int wbd_fs_meta_write(int fd, json_t *meta);
/* The user.e2b.* attributes of an open file (any fd, O_PATH too) as an
 * object, NULL when it has none (entries that are not UTF-8 are skipped,
 * as envd skips them). */
json_t *wbd_fs_meta_read(int fd);

/* Message for a resolution error, e.g. "path '/etc' is outside the sandbox". */
const char *wbd_fs_strerror(int err);

/* ---- envd.c ---- */
/* The routes of port 49983. Must reply. */
enum MHD_Result wbd_envd_handle(struct wbd_req *req, struct wbd_sandbox *sb);
/* Whether a data-plane request carries what lets its body in: the
 * sandbox's access token, or for an upload a valid URL signature; always
 * for a sandbox without a token. The server asks before reading a body. */
int wbd_envd_body_authorized(struct wbd_req *req, struct wbd_sandbox *sb);
/* The free bytes of the sandbox's disk (its home's filesystem): what an
 * upload may bring at most; -1 when unknown. */
long long wbd_envd_upload_room(struct wbd_sandbox *sb);

/* ---- rpc.c: what the Connect-RPC services share (envd.c, process.c) ---- */
#define ENVD_HOME "/home/user"
/* E2B's Connect error object {"code", "message"}. */
json_t *wbd_connect_error_json(const char *code, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* A unary Connect error: non-200 status, {"code":"<connect code>","message"}. */
enum MHD_Result wbd_rpc_error(struct wbd_req *req, const char *code, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
enum MHD_Result wbd_rpc_ok(struct wbd_req *req, json_t *body);
/* The request's envd user (Authorization: Basic <user>:): 0, or -1 with
 * the bad name in `name`. */
int wbd_rpc_user(struct wbd_req *req, char *name, size_t len);
/* envd's users: "user", "root", or none given. */
int wbd_known_user(const char *u);
int wbd_content_type_is(struct wbd_req *req, const char *want);
/* A string field, accepting protojson's lowerCamelCase or the proto name;
 * an integer field (number or numeric string), or def. */
const char *wbd_jstr(json_t *o, const char *camel, const char *snake);
long long wbd_jint(json_t *o, const char *name, long long def);
/* Appends a Connect envelope to b: flag (0, or 0x02 for the end-of-stream
 * trailer), the 4-byte length, msg (stolen) as compact JSON. */
void wbd_connect_frame(struct wbd_buf *b, unsigned char flag, json_t *msg);
/* A non-negative numeric header (Connect-Timeout-Ms, ...), saturated to
 * [0, hi]; -1 when absent or not a number (a sign, a huge value: it must
 * not overflow into a negative interval). */
int64_t wbd_rpc_header_num(struct wbd_req *req, const char *name, int64_t hi);
/* A Connect server stream's phases (envd_watch.c's WatchDir, process.c's
 * Start/Connect) and its content reader: hands out what `buf` holds; once
 * that is empty, ends the stream at WBD_STREAM_DONE (cleanly) or
 * WBD_STREAM_ABORT (cut), else asks step(cls, fds) for the next envelopes
 * (0) or how many milliseconds to wait on fds, and parks the connection. */
enum { WBD_STREAM_START, WBD_STREAM_RUNNING, WBD_STREAM_DONE, WBD_STREAM_ABORT };
ssize_t wbd_rpc_stream_read(struct MHD_Connection *conn, struct wbd_buf *buf, const int *phase,
                            int (*step)(void *cls, int wait_fds[2]), void *cls, char *out, size_t max);

/* ---- process.c: process.Process ---- */
enum MHD_Result wbd_process_start(struct wbd_req *req, struct wbd_sandbox *sb);
enum MHD_Result wbd_process_connect(struct wbd_req *req, struct wbd_sandbox *sb);
enum MHD_Result wbd_process_stream_input(struct wbd_req *req, struct wbd_sandbox *sb);
/* The unary process RPCs, `in` the request's JSON object. */
enum MHD_Result wbd_process_rpc(struct wbd_req *req, struct wbd_sandbox *sb, const char *method, json_t *in);
/* A streaming RPC that failed before streaming: HTTP 200, only the trailer. */
enum MHD_Result wbd_envd_stream_error(struct wbd_req *req, const char *code, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));

/* ---- envd_watch.c: envd's directory watchers (filesystem.Filesystem/WatchDir,
 * a server stream, and the polled CreateWatcher / GetWatcherEvents /
 * RemoveWatcher), on inotify in warmboxd over the sandbox's own trees.
 *
 * Watchers belong to their sandbox: at most WBD_WATCH_MAX per sandbox
 * (streams and polled ones together), at most WBD_WATCH_MAX_DIRS watched
 * directories each (a recursive watch) and WBD_WATCH_SANDBOX_DIRS for all
 * of a sandbox's watchers together, and all of them end when the
 * sandbox stops running (kill or pause): a stream is dropped as a process
 * stream is, a polled watcher is freed (its id is then not found). */
#define WBD_WATCH_MAX          32
#define WBD_WATCH_MAX_DIRS     4096
#define WBD_WATCH_SANDBOX_DIRS 8192

/* Serves the request when its path is one of the four watcher RPCs:
 * returns 1 with *r set; 0 (nothing sent) for any other path. The access
 * token was checked by the data plane. */
int wbd_envd_watch_route(struct wbd_req *req, struct wbd_sandbox *sb, enum MHD_Result *r);

#endif
