/*
 * net.c: a sandbox's network. Every isolated sandbox has a network
 * namespace of its own, made once for all its processes: only loopback,
 * with the host's own addresses unreachable; one that allows internet
 * access also gets slirp4netns on a tap0 in it (user-mode NAT, its DNS
 * forwarder at 10.0.2.3), which cannot reach the host's loopback either.
 */
#include "jail.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define SLIRP "/usr/bin/slirp4netns"
/* Without root: a sandbox's share of the user's inotify quota. */
#define USERNS_INOTIFY_INSTANCES 16
#define USERNS_INOTIFY_WATCHES   8192

static int g_root; /* warmboxd is host root: no user namespace of its own per sandbox */
static int g_have_slirp;

void wbd_net_init(int root) {
  g_root = root;
  g_have_slirp = access(SLIRP, X_OK) == 0;
  if (!g_have_slirp)
    fprintf(stderr,
            "warmboxd: %s not found (install Debian's slirp4netns): sandboxes that allow internet "
            "access cannot start\n",
            SLIRP);
}

void wbd_net_clear(struct wbd_net *n) {
  memset(n, 0, sizeof *n);
  n->net_fd = n->userns_fd = n->slirp_exit_fd = n->slirp_ready_fd = -1;
}

/* ------------------------------------------------------------------ */
/* The namespace, made by a child of the spawner                       */
/* ------------------------------------------------------------------ */

static int write_at(const char *path, const char *data) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, data, strlen(data));
  close(fd);
  return n < 0 ? -1 : 0;
}

/* The host's own IPv4 addresses (outside 127/8), read in warmboxd's network
 * namespace before the child leaves it. slirp4netns connects from the host,
 * so without more a jail would reach a host service bound to 0.0.0.0
 * through the host's LAN address; --disable-host-loopback covers only
 * 10.0.2.2 -> 127.0.0.1. Returns the count (at most max). */
static int host_ipv4_addrs(struct in_addr *out, int max) {
  struct ifaddrs *ifa, *p;
  int n = 0;
  if (getifaddrs(&ifa) != 0) return -1;
  for (p = ifa; p && n < max; p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET) continue;
    struct in_addr a = ((const struct sockaddr_in *)(const void *)p->ifa_addr)->sin_addr;
    if ((ntohl(a.s_addr) >> 24) == 127) continue;
    int dup = 0;
    for (int i = 0; i < n; i++) dup |= out[i].s_addr == a.s_addr;
    if (!dup) out[n++] = a;
  }
  freeifaddrs(ifa);
  return n;
}

/* An "unreachable" host route in the current network namespace: a jail's
 * packet to `a` fails at once (EHOSTUNREACH) instead of going out through
 * slirp4netns to the host. More specific than slirp's default route, and the
 * jail (no CAP_NET_ADMIN in this namespace) cannot remove it. */
static int reject_route(int s, struct in_addr a) {
  struct rtentry rt;
  struct sockaddr_in *dst = (struct sockaddr_in *)(void *)&rt.rt_dst;
  struct sockaddr_in *mask = (struct sockaddr_in *)(void *)&rt.rt_genmask;
  memset(&rt, 0, sizeof rt);
  dst->sin_family = AF_INET;
  dst->sin_addr = a;
  mask->sin_family = AF_INET;
  mask->sin_addr.s_addr = htonl(0xffffffffu);
  rt.rt_flags = RTF_UP | RTF_HOST | RTF_REJECT;
  rt.rt_dev = (char *)"lo";
  if (ioctl(s, SIOCADDRT, &rt) != 0 && errno != EEXIST) return -1;
  return 0;
}

/* In the child, without root: the user namespace it just made maps only
 * warmboxd's own uid and gid, with inotify limits of its own. */
static void child_userns(uid_t uid, gid_t gid, int errpipe) {
  char m[64];
  write_at("/proc/self/setgroups", "deny");
  snprintf(m, sizeof m, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
  if (write_at("/proc/self/uid_map", m) != 0) wbd_child_fail(errpipe, errno);
  snprintf(m, sizeof m, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
  if (write_at("/proc/self/gid_map", m) != 0) wbd_child_fail(errpipe, errno);
  /* Every sandbox runs as warmboxd's own uid here, so the kernel's per-uid
   * inotify quota (128 instances host-wide) would be one for all of them:
   * this namespace's own limits give each sandbox a share (the kernel
   * charges every level of nested user namespaces). */
  char lim[24];
  snprintf(lim, sizeof lim, "%d", USERNS_INOTIFY_INSTANCES);
  if (write_at("/proc/sys/user/max_inotify_instances", lim) != 0) wbd_child_fail(errpipe, errno);
  snprintf(lim, sizeof lim, "%d", USERNS_INOTIFY_WATCHES);
  if (write_at("/proc/sys/user/max_inotify_watches", lim) != 0) wbd_child_fail(errpipe, errno);
}

/* In the child: lo up, and an unreachable route to each host address. */
static void child_loopback(const struct in_addr *host, int nhost, int errpipe) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0) wbd_child_fail(errpipe, errno);
  ifr.ifr_flags |= IFF_UP;
  if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) wbd_child_fail(errpipe, errno);
  for (int i = 0; i < nhost; i++)
    if (reject_route(s, host[i]) != 0) wbd_child_fail(errpipe, errno);
  close(s);
}

static void send_fd(int chan, int fd);

/* In the hold child: a socket listening on port 49999 of the new namespace
 * (every address, IPv6 and IPv4), sent over chan for health.c (the code
 * interpreter's port, where a process of the sandbox asks its /health).
 * Without it the sandbox has no such port: no error. */
static void send_listener(int chan) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int off = 0, on = 1;
  if (fd >= 0) {
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(49999), .sin6_addr = IN6ADDR_ANY_INIT};
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(fd, (struct sockaddr *)&a6, sizeof a6) != 0) {
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) { /* no IPv6 in this kernel */
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(49999), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a4, sizeof a4) != 0) {
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0 || listen(fd, 16) != 0) return;
  send_fd(chan, fd);
  close(fd);
}

/* Sends fd over the datagram socket chan (SCM_RIGHTS); the caller closes it. */
static void send_fd(int chan, int fd) {
  char ctl[CMSG_SPACE(sizeof(int))];
  memset(ctl, 0, sizeof ctl);
  char b = 0;
  struct iovec iov = {&b, 1};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if (sendmsg(chan, &m, MSG_NOSIGNAL) < 0) {
  }
}

/* The listener send_listener sent over chan, or -1. */
static int recv_listener(int chan) {
  char ctl[CMSG_SPACE(sizeof(int))];
  char b;
  struct iovec iov = {&b, 1};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  if (recvmsg(chan, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) != 1) return -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int)))
    return -1;
  int fd;
  memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

/* The spawn job's hold: a fresh network namespace (owned by a fresh user
 * namespace mapping only our own ids, when warmboxd is not root) with lo up
 * and an unreachable route to each of the host's own addresses and the
 * interpreter's port (send_listener over chan), reported ready through
 * errpipe (a 0), then kept until the parent has opened it. */
static void child_netns(pid_t parent, int errpipe, int chan) {
  uid_t uid = geteuid();
  gid_t gid = getegid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  struct in_addr host[64];
  int nhost = host_ipv4_addrs(host, (int)(sizeof host / sizeof host[0]));
  if (nhost < 0) wbd_child_fail(errpipe, errno);
  int flags = CLONE_NEWNET | (g_root ? 0 : CLONE_NEWUSER);
  if (unshare(flags) != 0) wbd_child_fail(errpipe, errno);
  if (!g_root) child_userns(uid, gid, errpipe);
  child_loopback(host, nhost, errpipe);
  /* The jail's "root" may listen on port 80 in its own namespace. */
  write_at("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0");
  if (chan >= 0) send_listener(chan);
  int zero = 0;
  if (write(errpipe, &zero, sizeof zero) < 0) {
  }
  for (;;) pause();
}

/* The namespaces child_netns made, opened from its /proc, before it is
 * reaped. 0 or -errno. */
static int netns_open(struct wbd_net *n) {
  struct spawn_job j;
  wbd_job_init(&j);
  j.hold = child_netns;
  int chan[2] = {-1, -1};
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, chan) == 0) j.hold_fd = chan[1];
  int rc = wbd_spawn(&j);
  if (chan[1] >= 0) close(chan[1]);
  int lfd = !rc && chan[0] >= 0 ? recv_listener(chan[0]) : -1;
  if (chan[0] >= 0) close(chan[0]);
  if (lfd >= 0 && !(n->health = wbd_health_add(lfd))) close(lfd);
  if (rc) return rc;
  char p[64];
  snprintf(p, sizeof p, "/proc/%d/ns/net", (int)j.pid);
  int net = open(p, O_RDONLY | O_CLOEXEC), userns = -1;
  if (!g_root) {
    snprintf(p, sizeof p, "/proc/%d/ns/user", (int)j.pid);
    userns = open(p, O_RDONLY | O_CLOEXEC);
  }
  if (net < 0 || (!g_root && userns < 0)) rc = -errno;
  wbd_spawn_reap(j.pid);
  if (rc) {
    if (net >= 0) close(net);
    if (userns >= 0) close(userns);
    return rc;
  }
  n->net_fd = net;
  n->userns_fd = userns;
  return 0;
}

/* ------------------------------------------------------------------ */
/* slirp4netns                                                         */
/* ------------------------------------------------------------------ */

/* slirp4netns on the namespace's tap0, as a child of the spawner. */
static int slirp_start(struct wbd_net *n) {
  int ex[2], rd[2];
  if (pipe2(ex, O_CLOEXEC) != 0) return -errno;
  if (pipe2(rd, O_CLOEXEC) != 0) {
    int rc = -errno;
    close(ex[0]);
    close(ex[1]);
    return rc;
  }
  /* fds in slirp4netns: 3 the netns, 4 exit, 5 ready, 6 the userns */
  struct wbd_sv av = {0};
  wbd_sv_add(&av, SLIRP);
  wbd_sv_add(&av, "--netns-type=path");
  wbd_sv_add(&av, "--configure");
  wbd_sv_add(&av, "--mtu=65520");
  /* 10.0.2.2 does not lead to the host's 127.0.0.1 */
  wbd_sv_add(&av, "--disable-host-loopback");
  /* It parses the jail's packets as root: an empty root, no capabilities,
   * a syscall filter. */
  wbd_sv_add(&av, "--enable-sandbox");
  wbd_sv_add(&av, "--enable-seccomp");
  wbd_sv_add(&av, "--exit-fd=4");
  wbd_sv_add(&av, "--ready-fd=5");
  if (n->userns_fd >= 0) wbd_sv_add(&av, "--userns-path=/proc/self/fd/6");
  wbd_sv_add(&av, "/proc/self/fd/3");
  wbd_sv_add(&av, "tap0");
  char *envp[] = {"PATH=" JAIL_PATH, NULL};
  struct spawn_job j;
  wbd_job_init(&j);
  j.argv = av.v;
  j.envp = envp;
  j.pass[j.npass++] = n->net_fd;
  j.pass[j.npass++] = ex[0];
  j.pass[j.npass++] = rd[1];
  if (n->userns_fd >= 0) j.pass[j.npass++] = n->userns_fd;
  int rc = wbd_spawn(&j);
  wbd_sv_free(&av);
  close(ex[0]);
  close(rd[1]);
  if (rc) {
    close(ex[1]);
    close(rd[0]);
    return rc;
  }
  n->slirp_pid = j.pid;
  n->slirp_exit_fd = ex[1];
  n->slirp_ready_fd = rd[0];
  return 0;
}

int wbd_net_make(struct wbd_net *n, int internet) {
  int rc = netns_open(n);
  if (rc) return rc;
  if (!internet) return 0;
  if (!g_have_slirp) return -ENOENT;
  return slirp_start(n);
}

void wbd_net_wait_ready(struct wbd_net *n, const char *id) {
  if (n->slirp_ready_fd < 0 || n->checked) return;
  /* slirp4netns is usually ready long before the first process. */
  struct pollfd pf = {n->slirp_ready_fd, POLLIN, 0};
  int pr;
  while ((pr = poll(&pf, 1, 2000)) < 0 && errno == EINTR) {
  }
  char b;
  if (pr <= 0 || read(n->slirp_ready_fd, &b, 1) != 1)
    fprintf(stderr, "warmboxd: slirp4netns did not start for %s: it has no internet access\n", id);
  n->checked = 1;
}

void wbd_net_end(struct wbd_net *n) {
  wbd_health_remove(n->health);
  n->health = NULL;
  if (n->slirp_exit_fd >= 0) close(n->slirp_exit_fd);
  n->slirp_exit_fd = -1;
  if (n->slirp_pid > 0) {
    wbd_spawn_reap(n->slirp_pid);
    n->slirp_pid = 0;
  }
}

void wbd_net_close(struct wbd_net *n) {
  int *fds[] = {&n->net_fd, &n->userns_fd, &n->slirp_exit_fd, &n->slirp_ready_fd};
  for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
    if (*fds[i] >= 0) {
      close(*fds[i]);
      *fds[i] = -1;
    }
}

/* ------------------------------------------------------------------ */
/* A socket in the namespace                                           */
/* ------------------------------------------------------------------ */

/* What sock_child joins: the spawner forks one job at a time, and these
 * are set for it under g_sock_mu until wbd_spawn has returned. */
static pthread_mutex_t g_sock_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_sock_net = -1, g_sock_userns = -1;

/* The hold child: joins the namespace, sends a fresh socket over chan. */
static void sock_child(pid_t parent, int errpipe, int chan) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  if (g_sock_userns >= 0 && setns(g_sock_userns, CLONE_NEWUSER) != 0) wbd_child_fail(errpipe, errno);
  if (setns(g_sock_net, CLONE_NEWNET) != 0) wbd_child_fail(errpipe, errno);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) wbd_child_fail(errpipe, errno);
  send_fd(chan, fd);
  int zero = 0;
  if (write(errpipe, &zero, sizeof zero) < 0) {
  }
  for (;;) pause();
}

int wbd_net_socket(int net_fd, int userns_fd) {
  if (net_fd < 0) return -ENOENT;
  int chan[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, chan) != 0) return -errno;
  struct spawn_job j;
  wbd_job_init(&j);
  j.hold = sock_child;
  j.hold_fd = chan[1];
  pthread_mutex_lock(&g_sock_mu);
  g_sock_net = net_fd;
  g_sock_userns = userns_fd;
  int rc = wbd_spawn(&j);
  g_sock_net = g_sock_userns = -1;
  pthread_mutex_unlock(&g_sock_mu);
  close(chan[1]);
  int fd = rc == 0 ? recv_listener(chan[0]) : -1;
  close(chan[0]);
  if (rc == 0) wbd_spawn_reap(j.pid);
  if (rc) return rc;
  return fd >= 0 ? fd : -EIO;
}
