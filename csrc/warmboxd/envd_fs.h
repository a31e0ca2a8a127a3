/*
 * envd_fs.h: the sandbox's filesystem as envd sees it, confined.
 *
 * A sandbox sees two writable trees: /home/user (<data_dir>/<id>/home) and
 * /tmp (<data_dir>/<id>/tmp). Every path from a request is made absolute
 * (relative and "~" against /home/user), cleaned lexically, and must fall in
 * one of them; everything after that is resolved by the kernel with
 * openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) from an fd of that root,
 * so neither "..", nor a symlink planted by the sandbox's own code, can reach
 * a host file. An absolute symlink is followed only when it points into one
 * of the two trees (resolved again from that tree's root, component by
 * component with O_NOFOLLOW). Final components that are modified (remove,
 * move, mkdir) are never followed.
 */
#ifndef WBD_ENVD_FS_H
#define WBD_ENVD_FS_H

#include "wbd.h"
#include <limits.h>
#include <sys/types.h>

struct wbd_fspath {
  struct wbd_sandbox *sb;
  int root;              /* O_PATH fd of the tree's root, -1 when not open */
  char jail[PATH_MAX];   /* the cleaned path as the sandbox sees it */
  char rel[PATH_MAX];    /* relative to root; "." for the root itself */
  uid_t uid;             /* owner of the root: new files get it */
  gid_t gid;
};

/* Errors are -errno; -EACCES: outside the sandbox's trees (or a symlink
 * that leads out); -EINVAL: empty or malformed. */
int  wbd_fs_resolve(struct wbd_sandbox *sb, const char *path, struct wbd_fspath *p);
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

/* rm -rf of the last component of p (never follows it); missing is fine. */
int wbd_fs_remove(const struct wbd_fspath *p);
/* rename src to dst (creating dst's parents); -errno. */
int wbd_fs_move(const struct wbd_fspath *src, const struct wbd_fspath *dst);

/* protojson EntryInfo of p (lstat: a symlink is reported as one); NULL + errno. */
json_t *wbd_fs_entry(const struct wbd_fspath *p);
/* {"entries": [...]} of a directory, walking `depth` levels (never into
 * symlinks); NULL + *err = -errno. */
json_t *wbd_fs_list(const struct wbd_fspath *p, int depth, int *err);

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

#endif
