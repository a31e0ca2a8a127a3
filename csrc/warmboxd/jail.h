/*
 * jail.h: pieces of the jail runtime kept out of runtime.c (its only user):
 * the seccomp program (seccomp.c) and the host uid range of a root
 * warmboxd (uidmap.c).
 */
#ifndef WBD_JAIL_H
#define WBD_JAIL_H

#include <stddef.h>
#include <sys/types.h>
#include <linux/filter.h>

/* Room for the whole program. */
#define WBD_SECCOMP_MAX 64
/* Fills f (cap >= WBD_SECCOMP_MAX) with the jail's filter; its length, 0
 * where there is none (not x86-64). */
size_t wbd_seccomp_build(struct sock_filter *f, size_t cap);

/* A host uid range of `slots` uids for this instance's jails (warmboxd is
 * root): `want` exactly when nonzero, else the first free one of the
 * default ranges from `base`. Free: no account of /etc/passwd or group in
 * it, no process running as one of its uids, and no other warmboxd holding
 * its lock (an flock on <lock_dir>/uids-<first>.lock, kept until exit).
 * Returns the first uid, or 0 with why filled. */
uid_t wbd_uid_range_take(const char *lock_dir, uid_t base, uid_t want, unsigned slots, char *why, size_t len);

/* Without root: moves the (still single-threaded) process into a user
 * namespace of its own that maps only its uid and gid to themselves, where
 * it may make a mount namespace and size-limited tmpfs mounts. 0 or -1
 * (errno). */
int wbd_userns_enter(void);

#endif
