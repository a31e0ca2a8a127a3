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

#endif
