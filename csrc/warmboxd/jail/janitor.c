/*
 * janitor.c: a small child forked at start-up that outlives a killed
 * warmboxd. A SIGKILL skips warmboxd's clean-up, so its sandboxes' cgroups
 * (and whatever still runs in them) would stay until the next warmboxd
 * starts. The janitor waits for warmboxd's end (a pidfd; without one, its
 * parent changing), then ends what is left in warmboxd's groups, removes
 * them and exits. After a normal exit there is nothing left for it to do.
 *
 * It is forked before any thread, descriptor, lock or port of warmboxd's
 * exists, and keeps none: its 0/1/2 are /dev/null, every other descriptor
 * is closed, so it holds neither the data directory's lock nor a port nor
 * a pipe someone reads to its end. Signals sent to warmboxd's process group
 * (a terminal's ^C) do not stop it; it has no other work.
 */
#include "jail.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Waits until process `parent` has ended. */
static void wait_parent(pid_t parent) {
  int fd = -1;
#ifdef SYS_pidfd_open
  fd = (int)syscall(SYS_pidfd_open, parent, 0);
#endif
  if (fd >= 0) {
    struct pollfd p = {fd, POLLIN, 0};
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    close(fd);
    return;
  }
  /* No pidfd (or the parent is already gone): reparented once it ends. */
  while (getppid() == parent) {
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* Its command line names it, not warmboxd's flags: `ps` shows one
 * warmboxd serving the data directory (and a janitor of it), and nothing
 * that looks for the server by its arguments finds two. argv's strings
 * after argv[0] are rewritten in place (the kernel reads the command line
 * from that memory), as far as they are contiguous. */
static void janitor_title(int argc, char **argv, pid_t parent) {
  if (argc < 2 || !argv) return;
  char *start = argv[1], *end = argv[1] + strlen(argv[1]);
  for (int i = 2; i < argc && argv[i] == end + 1; i++) end = argv[i] + strlen(argv[i]);
  memset(start, 0, (size_t)(end - start));
  snprintf(start, (size_t)(end - start) + 1, "--janitor-of=%ld", (long)parent);
}

/* The child's life: detached from what warmboxd holds, waits, cleans up. */
static void janitor_main(pid_t parent, int argc, char **argv) {
  prctl(PR_SET_NAME, "wbd-janitor");
  janitor_title(argc, argv, parent);
  static const int ignored[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2};
  for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) signal(ignored[i], SIG_IGN);
  int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (nul >= 0) {
    dup2(nul, 0);
    dup2(nul, 1);
    dup2(nul, 2);
  }
  long max = sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > 65536) max = 65536;
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
#endif
    for (long fd = 3; fd < max; fd++) close((int)fd);
  wait_parent(parent);
  wbd_cgroups_reap(parent);
}

int wbd_janitor_start(int argc, char **argv) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid > 0) return 0;
  janitor_main(parent, argc, argv);
  _exit(0);
}
