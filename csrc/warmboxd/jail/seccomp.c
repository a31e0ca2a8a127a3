/*
 * seccomp.c: the classic-BPF program every jail runs under (bubblewrap's
 * --seccomp). Syscalls a sandbox never needs that widen the kernel surface
 * it can reach (keyrings, eBPF, perf, userfaultfd, io_uring, handles,
 * modules, clocks, mounts and namespaces) fail with EPERM, and so does every
 * ABI but x86-64 (i386, x32). Sockets of the AF_VSOCK family fail with
 * EAFNOSUPPORT: vsock is not namespaced, and on a VM host it reaches the
 * hypervisor and other guests' services. Built once at start-up; each jail
 * gets it through a pipe.
 */
#include "jail.h"

#include <errno.h>
#include <linux/filter.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <linux/audit.h>
#include <linux/seccomp.h>

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif

/* Room for the whole program. */
#define SECCOMP_MAX 64
static struct sock_filter g_bpf[SECCOMP_MAX];
static size_t g_bpf_len;

#ifdef __x86_64__
static const int seccomp_deny[] = {
  SYS_keyctl,
  SYS_add_key,
  SYS_request_key,
  SYS_bpf,
  SYS_perf_event_open,
  SYS_userfaultfd,
  SYS_io_uring_setup,
  SYS_io_uring_enter,
  SYS_io_uring_register,
  SYS_open_by_handle_at,
  SYS_name_to_handle_at,
  SYS_kexec_load,
  SYS_kexec_file_load,
  SYS_init_module,
  SYS_finit_module,
  SYS_delete_module,
  SYS_acct,
  SYS_swapon,
  SYS_swapoff,
  SYS_reboot,
  SYS_settimeofday,
  SYS_clock_settime,
  SYS_clock_adjtime,
  SYS_adjtimex,
  SYS_quotactl,
  SYS_lookup_dcookie,
  SYS_mount,
  SYS_umount2,
  SYS_pivot_root,
  SYS_setns,
  SYS_unshare,
};
#define N_DENY (sizeof seccomp_deny / sizeof *seccomp_deny)
/* The two socket-creating calls whose first argument is the family. */
static const int family_calls[] = {SYS_socket, SYS_socketpair};
#define N_FAM (sizeof family_calls / sizeof *family_calls)

#define STMT(code, k)         ((struct sock_filter)BPF_STMT((code), (k)))
#define JUMP(code, k, jt, jf) ((struct sock_filter)BPF_JUMP((code), (k), (unsigned char)(jt), (unsigned char)(jf)))

/* Fills f (cap >= SECCOMP_MAX) with the jail's filter; its length, 0 where
 * there is none (not x86-64). */
static size_t seccomp_build(struct sock_filter *f, size_t cap) {
  if (cap < SECCOMP_MAX) return 0;
  size_t n = 0;
  f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
  f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
  f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
  /* Layout after this point (k = N_DENY, m = N_FAM):
   *   [x32 check] [k deny jumps] [m family jumps] ALLOW DENY
   *   FAMILY: load args[0]; == AF_VSOCK ? EAFNOSUPPORT : ALLOW */
  size_t allow = 1 + N_DENY + N_FAM;                               /* index of ALLOW, counted from the x32 check */
  f[n++] = JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, allow, 0); /* x32 (bit 30): deny */
  for (size_t i = 0; i < N_DENY; i++)
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)seccomp_deny[i], allow - 1 - i, 0);
  for (size_t i = 0; i < N_FAM; i++)
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)family_calls[i], N_FAM - i + 1, 0);
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
  /* The low 32 bits of the family argument (an int). */
  f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
  f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_VSOCK, 1, 0);
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAFNOSUPPORT);
  return n;
}
#else
static size_t seccomp_build(struct sock_filter *f, size_t cap) {
  (void)f;
  (void)cap;
  return 0;
}
#endif

void wbd_seccomp_init(void) {
  g_bpf_len = seccomp_build(g_bpf, SECCOMP_MAX);
}

int wbd_seccomp_pipe(int *fd) {
  *fd = g_bpf_len ? wbd_data_pipe(g_bpf, g_bpf_len * sizeof *g_bpf) : -1;
  return g_bpf_len && *fd < 0 ? -1 : 0;
}
