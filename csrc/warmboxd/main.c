/*
 * main.c: warmboxd's options, start-up and clean exit.
 */
#include "control.h"
#include "envd.h"
#include "jail.h"
#include "state.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The one place handlers are wired to the server: server.c calls through
 * this table, so it depends on no handler file (they depend on it). */
static struct wbd_routes routes = {
  .call = wbd_route_call,
  .control_key_ok = wbd_control_key_ok,
  .dataplane = wbd_control_dataplane,
  .dataplane_body_ok = wbd_envd_body_authorized,
  .upload_room = wbd_envd_upload_room,
};

/* A pidfd for `pid` (Linux 5.3 and later), or -1 with errno. */
static int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, pid, 0);
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

/* A signal handler may only write(2); the main thread waits on this pipe. */
static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  if (write(sig_pipe[1], &b, 1) < 0) {
  }
  errno = saved;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: warmboxd [options]\n"
          "A local E2B-compatible server (control plane, envd, code interpreter).\n\n"
          "  --port N              listen port (0: a free one; default 0)\n"
          "  --host ADDR           listen address (default 127.0.0.1)\n"
          "  --api-key KEY         accept only this key (default: any e2b_<hex>, one team per key)\n"
          "  --api-key-file PATH   accept only the key in PATH (a file of this user, mode 0600 or\n"
          "                        stricter); warmbox.server and `warmbox server start` use it\n"
          "  --max-length-hours H  maximum run length (default 24)\n"
          "  --max-running N       concurrent running sandboxes per team (default 20; 0: unlimited)\n"
          "  --default-timeout S   lease when create gives none (default 15)\n"
          "  --rtt-ms MS           delay added to every request (default 0)\n"
          "  --create-ms MS        delay added to create (default 0)\n"
          "  --resume-ms MS        delay added to resume, after the thaw: the sandbox's processes\n"
          "                        run meanwhile (default 0; 1000, about E2B's, for E2B's suites)\n"
          "  --data-dir DIR        where sandbox directories live (default a fresh temp dir)\n"
          "  --admin-token TOKEN   token for the admin API /_warmboxd/* (header X-Warmboxd-Token;\n"
          "                        default a random one, written to DATA-DIR/admin-token, mode 0600)\n"
          "  --conn-timeout S      close a connection idle this long, headers unfinished or\n"
          "                        between requests (default 30)\n"
          "  --max-conns N         connections in total (default 1024)\n"
          "  --max-conns-per-ip N  connections from one client address (default 128)\n"
          "  --max-upload-mb N     largest envd file upload body (default 100)\n"
          "  --body-timeout S      close a connection whose request body is not in S seconds\n"
          "                        after its head (default 120)\n"
          "  --max-list-entries N  most entries envd's ListDir answers (default 50000)\n"
          "  --max-contexts N      most code contexts a sandbox may have (default 128)\n"
          "  --max-snapshots N     snapshots a team keeps (default 100; 0: unlimited)\n"
          "  --snapshot-max-age S  delete a snapshot S seconds after it was taken (default 0:\n"
          "                        never, as E2B's)\n"
          "  --max-state-mb N      disk a team's snapshots and paused copies take (default 8192;\n"
          "                        0: unlimited)\n"
          "  --min-free-mb N       free space a snapshot, fork or pause copy leaves in the data\n"
          "                        directory (default 1024)\n"
          "  --max-spool-mb N      upload bodies held at once, all sandboxes (default 1024)\n"
          "  --pause-workers N     sandboxes paused at once at their timeout (default 4)\n"
          "  --tls-cert PATH, --tls-key PATH\n"
          "                        also serve HTTPS (the same API and data plane) with this PEM\n"
          "                        certificate and key, on --tls-port N (default 0: a free one)\n"
          "  --strict-tokens       a secure sandbox's token on every code interpreter call but\n"
          "                        /health (default: on /execute only, as E2B checks it);\n"
          "                        warmbox.server and `warmbox server start` use it\n"
          "  --secure-all          every sandbox gets an access token (as POST /v2/sandboxes\n"
          "                        gives; `secure: false` is not honoured): no data-plane call\n"
          "                        runs on a sandbox id alone; warmbox.server uses it\n"
          "  --max-team-memory-mb N  memoryMB of a team's running and paused-in-memory\n"
          "                        sandboxes together (default: the host's memory; 0: none)\n"
          "  --max-streams N       concurrent streamed calls per team (Process Start/Connect,\n"
          "                        WatchDir, /execute; default 64; 0: unlimited)\n"
          "  --unisolated          run sandboxes without bubblewrap (unsafe)\n"
          "  --exit-with PID       shut down (as on SIGTERM) when process PID ends: an embedded\n"
          "                        server does not outlive its host, even one killed by SIGKILL\n"
          "  --idle-exit S         shut down (as on SIGTERM) once no sandbox has been running for S\n"
          "                        seconds; the shared server of warmbox uses it\n"
          "  --verbose             log requests to stderr\n"
          "  --version             print the version\n"
          "  --help                this text\n\n"
          "Prints 'warmboxd listening on http://HOST:PORT' first on stdout (then\n"
          "'warmboxd listening on https://HOST:PORT' with --tls-cert).\n");
}

/* --idle-exit: whether no sandbox has run for `idle_s` seconds (checked at
 * each turn of the main wait; `*since` is when the last running one was seen). */
static int idle_expired(int idle_s, struct timespec *since) {
  if (idle_s <= 0) return 0;
  long running, paused;
  wbd_store_lock();
  wbd_store_counts_locked(&running, &paused);
  wbd_store_unlock();
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  if (running > 0 || since->tv_sec == 0) {
    *since = now;
    return 0;
  }
  return now.tv_sec - since->tv_sec >= idle_s;
}

static int parse_int(const char *name, const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "warmboxd: %s expects an integer in %d..%d, got '%s'\n", name, lo, hi, s);
    return -1;
  }
  *out = (int)v;
  return 0;
}

/* Every connection is a descriptor (and a thread): lift the soft limit to
 * the hard one, and keep the connection cap below what is left. */
static void raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  long spare = rl.rlim_cur == RLIM_INFINITY ? 1L << 20 : (long)rl.rlim_cur - 256;
  if (spare < 16) spare = 16;
  if (wbd_lim.max_conns > spare) {
    fprintf(stderr, "warmboxd: --max-conns lowered to %ld (open file limit %ld)\n", spare, (long)rl.rlim_cur);
    wbd_lim.max_conns = (int)spare;
  }
}

/* The key of --api-key-file: a regular file of this user that no one else
 * may read or write, its first line (surrounding blanks dropped). */
static const char *read_key_file(const char *path) {
  static char key[257];
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
  struct stat st;
  const char *bad = NULL;
  if (fd < 0 || fstat(fd, &st) != 0)
    bad = strerror(errno);
  else if (!S_ISREG(st.st_mode))
    bad = "not a regular file";
  else if (st.st_uid != geteuid())
    bad = "owned by another user";
  else if (st.st_mode & 077)
    bad = "readable or writable by others (chmod 600 it)";
  ssize_t n = bad ? 0 : read(fd, key, sizeof key - 1);
  if (fd >= 0) close(fd);
  if (!bad && n < 0) bad = strerror(errno);
  if (!bad) {
    key[n] = 0;
    key[strcspn(key, "\r\n")] = 0;
    char *k = key + strspn(key, " \t");
    size_t len = strlen(k);
    while (len && (k[len - 1] == ' ' || k[len - 1] == '\t')) k[--len] = 0;
    if (len < 16 || len >= 128) bad = "the key must be 16 to 127 characters";
    for (size_t i = 0; !bad && i < len; i++)
      if ((unsigned char)k[i] <= ' ' || (unsigned char)k[i] >= 127) bad = "the key must be printable ASCII";
    if (!bad) return k;
  }
  fprintf(stderr, "warmboxd: --api-key-file %s: %s\n", path, bad);
  return NULL;
}

/* A random admin token (32 bytes, hex) in DATA-DIR/admin-token, mode 0600. */
static int make_admin_token(char out[65]) {
  unsigned char raw[32];
  wbd_random(raw, sizeof raw);
  for (size_t i = 0; i < sizeof raw; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
  size_t n = strlen(wbd_opt.data_dir) + 16;
  char *path = malloc(n);
  if (!path) return -1;
  snprintf(path, n, "%s/admin-token", wbd_opt.data_dir);
  unlink(path); /* never write through a planted link or into someone's file */
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  int ok = fd >= 0 && fchmod(fd, 0600) == 0 && write(fd, out, 64) == 64;
  if (fd >= 0 && close(fd) != 0) ok = 0;
  if (!ok) fprintf(stderr, "warmboxd: cannot write the admin token to %s: %s\n", path, strerror(errno));
  free(path);
  return ok ? 0 : -1;
}

/* What main keeps of the command line beside wbd_opt and wbd_lim. */
struct run_opts {
  int exit_with; /* --exit-with PID, 0 */
  int idle_exit; /* --idle-exit S, 0 */
};

/* The server's own options (limits, the TLS listener), out of parse_args.
 * 0, 1 when the value is bad (said on stderr), -1 for an unknown option. */
static int parse_limit(const char *name, const char *s, int lo, int hi, int *out) {
  return parse_int(name, s, lo, hi, out) ? 1 : 0;
}
enum { O_CONNTO = 512, O_MAXCONN, O_MAXCONNIP, O_MAXUP, O_MAXSPOOL, O_TLSCERT, O_TLSKEY, O_TLSPORT };
static int parse_server_opt(int c, const char *arg) {
  switch (c) {
    case O_CONNTO:
      return parse_limit("--conn-timeout", arg, 1, 3600, &wbd_lim.conn_timeout_s);
    case O_MAXCONN:
      return parse_limit("--max-conns", arg, 1, 1 << 20, &wbd_lim.max_conns);
    case O_MAXCONNIP:
      return parse_limit("--max-conns-per-ip", arg, 1, 1 << 20, &wbd_lim.max_conns_per_ip);
    case O_MAXUP:
      return parse_limit("--max-upload-mb", arg, 1, 1 << 20, &wbd_lim.max_upload_mb);
    case O_MAXSPOOL:
      return parse_limit("--max-spool-mb", arg, 1, 1 << 30, &wbd_lim.max_spool_mb);
    case O_TLSCERT:
      wbd_lim.tls_cert = arg;
      return 0;
    case O_TLSKEY:
      wbd_lim.tls_key = arg;
      return 0;
    case O_TLSPORT:
      return parse_limit("--tls-port", arg, 0, 65535, &wbd_lim.tls_port);
    default:
      return -1;
  }
}

/* The command line into wbd_opt, wbd_lim and *run: -1 to go on, else the
 * exit code (0 after --help or --version, 2 for a bad option). */
static int parse_args(int argc, char **argv, struct run_opts *run) {
  enum {
    O_PORT = 256,
    O_HOST,
    O_KEY,
    O_MAXLEN,
    O_MAXRUN,
    O_DEFTO,
    O_RTT,
    O_CREATE,
    O_RESUME,
    O_DATA,
    O_UNISO,
    O_VERBOSE,
    O_VERSION,
    O_HELP,
    O_ADMIN,
    O_EXITWITH,
    O_KEYFILE,
    O_BODYTO,
    O_MAXLIST,
    O_MAXCTX,
    O_IDLEEXIT,
    O_STRICT,
    O_SECALL,
    O_TEAMMEM,
    O_MAXSTREAMS,
    O_MAXSNAP,
    O_MAXSTATE,
    O_MINFREE,
    O_PAUSEW,
    O_SNAPAGE
  };
  static const struct option longopts[] = {
    {"port", required_argument, 0, O_PORT},
    {"host", required_argument, 0, O_HOST},
    {"api-key", required_argument, 0, O_KEY},
    {"api-key-file", required_argument, 0, O_KEYFILE},
    {"body-timeout", required_argument, 0, O_BODYTO},
    {"max-length-hours", required_argument, 0, O_MAXLEN},
    {"max-running", required_argument, 0, O_MAXRUN},
    {"default-timeout", required_argument, 0, O_DEFTO},
    {"rtt-ms", required_argument, 0, O_RTT},
    {"create-ms", required_argument, 0, O_CREATE},
    {"resume-ms", required_argument, 0, O_RESUME},
    {"data-dir", required_argument, 0, O_DATA},
    {"unisolated", no_argument, 0, O_UNISO},
    {"strict-tokens", no_argument, 0, O_STRICT},
    {"secure-all", no_argument, 0, O_SECALL},
    {"max-team-memory-mb", required_argument, 0, O_TEAMMEM},
    {"max-streams", required_argument, 0, O_MAXSTREAMS},
    {"admin-token", required_argument, 0, O_ADMIN},
    {"conn-timeout", required_argument, 0, O_CONNTO},
    {"max-conns", required_argument, 0, O_MAXCONN},
    {"max-conns-per-ip", required_argument, 0, O_MAXCONNIP},
    {"max-upload-mb", required_argument, 0, O_MAXUP},
    {"exit-with", required_argument, 0, O_EXITWITH},
    {"max-list-entries", required_argument, 0, O_MAXLIST},
    {"max-contexts", required_argument, 0, O_MAXCTX},
    {"idle-exit", required_argument, 0, O_IDLEEXIT},
    {"max-snapshots", required_argument, 0, O_MAXSNAP},
    {"snapshot-max-age", required_argument, 0, O_SNAPAGE},
    {"max-state-mb", required_argument, 0, O_MAXSTATE},
    {"min-free-mb", required_argument, 0, O_MINFREE},
    {"max-spool-mb", required_argument, 0, O_MAXSPOOL},
    {"pause-workers", required_argument, 0, O_PAUSEW},
    {"tls-cert", required_argument, 0, O_TLSCERT},
    {"tls-key", required_argument, 0, O_TLSKEY},
    {"tls-port", required_argument, 0, O_TLSPORT},
    {"verbose", no_argument, 0, O_VERBOSE},
    {"version", no_argument, 0, O_VERSION},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
  };
  int c, rc = 0;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
      case O_PORT:
        rc = parse_int("--port", optarg, 0, 65535, &wbd_opt.port);
        break;
      case O_HOST:
        wbd_opt.host = optarg;
        break;
      case O_KEY:
        wbd_opt.api_key = optarg;
        break;
      case O_KEYFILE:
        if (!(wbd_opt.api_key = read_key_file(optarg))) return 2;
        break;
      case O_BODYTO:
        rc = parse_int("--body-timeout", optarg, 1, 86400, &wbd_lim.body_timeout_s);
        break;
      case O_MAXLEN:
        rc = parse_int("--max-length-hours", optarg, 1, 24 * 365, &wbd_opt.max_length_hours);
        break;
      case O_MAXRUN:
        rc = parse_int("--max-running", optarg, 0, 1 << 30, &wbd_opt.max_running);
        break;
      case O_DEFTO:
        rc = parse_int("--default-timeout", optarg, 1, 1 << 30, &wbd_opt.default_timeout_s);
        break;
      case O_RTT:
        rc = parse_int("--rtt-ms", optarg, 0, 600000, &wbd_opt.rtt_ms);
        break;
      case O_CREATE:
        rc = parse_int("--create-ms", optarg, 0, 600000, &wbd_opt.create_ms);
        break;
      case O_RESUME:
        rc = parse_int("--resume-ms", optarg, 0, 600000, &wbd_opt.resume_ms);
        break;
      case O_DATA:
        wbd_opt.data_dir = optarg;
        break;
      case O_UNISO:
        wbd_opt.unisolated = 1;
        break;
      case O_STRICT:
        wbd_opt.strict_tokens = 1;
        break;
      case O_SECALL:
        wbd_opt.secure_all = 1;
        break;
      case O_TEAMMEM:
        rc = parse_int("--max-team-memory-mb", optarg, 0, INT_MAX, &wbd_opt.max_team_memory_mb);
        break;
      case O_MAXSTREAMS:
        rc = parse_int("--max-streams", optarg, 0, 1 << 20, &wbd_opt.max_streams);
        break;
      case O_ADMIN:
        if (strlen(optarg) < 16) {
          fprintf(stderr, "warmboxd: --admin-token must be at least 16 characters\n");
          return 2;
        }
        wbd_lim.admin_token = optarg;
        break;
      case O_MAXLIST:
        rc = parse_int("--max-list-entries", optarg, 1, 1 << 24, &wbd_opt.max_list_entries);
        break;
      case O_MAXCTX:
        rc = parse_int("--max-contexts", optarg, 2, 1 << 20, &wbd_opt.max_contexts);
        break;
      case O_EXITWITH:
        rc = parse_int("--exit-with", optarg, 1, INT_MAX, &run->exit_with);
        break;
      case O_IDLEEXIT:
        rc = parse_int("--idle-exit", optarg, 1, INT_MAX, &run->idle_exit);
        break;
      case O_MAXSNAP:
        rc = parse_int("--max-snapshots", optarg, 0, 1 << 20, &wbd_state_lim.max_snapshots);
        break;
      case O_SNAPAGE:
        rc = parse_int("--snapshot-max-age", optarg, 0, INT_MAX, &wbd_state_lim.snapshot_max_age_s);
        break;
      case O_MAXSTATE:
        rc = parse_int("--max-state-mb", optarg, 0, 1 << 30, &wbd_state_lim.max_state_mb);
        break;
      case O_MINFREE:
        rc = parse_int("--min-free-mb", optarg, 0, 1 << 30, &wbd_state_lim.min_free_mb);
        break;
      case O_PAUSEW:
        rc = parse_int("--pause-workers", optarg, 1, 256, &wbd_state_lim.pause_workers);
        break;
      case O_VERBOSE:
        wbd_opt.verbose = 1;
        break;
      case O_VERSION:
        printf("warmboxd %s\n", WARMBOX_VERSION);
        return 0;
      case O_HELP:
        usage(stdout);
        return 0;
      default:
        if ((rc = parse_server_opt(c, optarg)) < 0) {
          usage(stderr);
          return 2;
        }
    }
    if (rc) return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "warmboxd: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  return -1;
}

/* --exit-with: the host to end with, as a pidfd when the kernel has them
 * (no pid reuse; *fd), else *fd = -1 and the wait polls kill(pid, 0). 0, or
 * -1 when there is no such process (said on stderr). */
static int host_watch_open(int pid, int *fd) {
  *fd = open_pidfd((pid_t)pid);
  if ((*fd < 0 && errno == ESRCH) || (*fd < 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)) {
    fprintf(stderr, "warmboxd: --exit-with %d: no such process\n", pid);
    return -1;
  }
  return 0;
}

/* Without --data-dir: a fresh data directory under TMPDIR, *made (malloc'd;
 * removed at exit when empty). wbd_opt.keep_state says whether one was
 * given. 0 or -1. */
static int data_dir_default(char **made) {
  *made = NULL;
  wbd_opt.keep_state = wbd_opt.data_dir != NULL;
  if (wbd_opt.data_dir) return 0;
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp) tmp = "/tmp";
  size_t n = strlen(tmp) + 32;
  char *dir = malloc(n);
  if (!dir) return -1;
  snprintf(dir, n, "%s/warmboxd-XXXXXX", tmp);
  if (!mkdtemp(dir)) {
    fprintf(stderr, "warmboxd: cannot create a data directory under %s: %s\n", tmp, strerror(errno));
    free(dir);
    return -1;
  }
  wbd_opt.data_dir = *made = dir;
  return 0;
}

/* SIGTERM and SIGINT to sig_pipe, SIGPIPE ignored. 0 or -1. */
static int signals_install(void) {
  if (pipe(sig_pipe) != 0) {
    perror("warmboxd: pipe");
    return -1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

/* The runtime, the kept records and snapshots, the admin token, the server
 * and the lease timer, in that order; then the "listening" line. 0, or -1
 * once what had started is stopped. */
static int start_all(void) {
  if (wbd_rt_init() != 0) {
    fprintf(stderr, "warmboxd: the sandbox runtime could not start\n");
    return -1;
  }
  if (wbd_persist_load_all() != 0) {
    wbd_rt_shutdown();
    return -1;
  }
  wbd_snapshot_load_all();
  if (wbd_events_start() != 0) {
    fprintf(stderr, "warmboxd: cannot start the lifecycle events\n");
    wbd_rt_shutdown();
    return -1;
  }
  raise_fd_limit();
  static char token_buf[65];
  if (!wbd_lim.admin_token) {
    if (make_admin_token(token_buf) != 0) {
      wbd_rt_shutdown();
      return -1;
    }
    wbd_lim.admin_token = token_buf;
  }
  routes.table = wbd_route_table;
  routes.n = wbd_route_count;
  wbd_server_routes(&routes);
  if (wbd_server_start() != 0) {
    wbd_rt_shutdown();
    return -1;
  }
  if (wbd_lifecycle_start() != 0) {
    fprintf(stderr, "warmboxd: cannot start the lifecycle thread\n");
    wbd_server_stop();
    wbd_rt_shutdown();
    return -1;
  }
  printf("warmboxd listening on http://%s:%d\n", strcmp(wbd_opt.host, "localhost") == 0 ? "127.0.0.1" : wbd_opt.host,
         wbd_server_port());
  if (wbd_server_tls_port() > 0)
    printf("warmboxd listening on https://%s:%d\n", strcmp(wbd_opt.host, "localhost") == 0 ? "127.0.0.1" : wbd_opt.host,
           wbd_server_tls_port());
  fflush(stdout);
  if (!wbd_opt.api_key && wbd_opt.verbose)
    fprintf(stderr, "warmboxd: accepting any e2b_<hex> API key, one team per key\n");
  return 0;
}

/* Blocks until SIGTERM or SIGINT (returns it), the host's end or
 * --idle-exit (returns 0). A timed poll rather than a blocking read:
 * sanitizers that defer signal handlers to the next intercepted call still
 * see the signal. */
static int wait_for_exit(int host_fd, const struct run_opts *run) {
  unsigned char b = 0;
  struct timespec busy_at = {0, 0};
  for (;;) {
    struct pollfd pfd[2] = {{.fd = sig_pipe[0], .events = POLLIN}, {.fd = host_fd, .events = POLLIN}};
    int n = poll(pfd, host_fd >= 0 ? 2 : 1, 250);
    if (n < 0 && errno != EINTR) break;
    if (n > 0 && (pfd[0].revents & POLLIN) && read(sig_pipe[0], &b, 1) == 1) break;
    if (n > 0 && host_fd >= 0 && pfd[1].revents) break; /* the host ended */
    if (run->exit_with > 0 && host_fd < 0 && kill((pid_t)run->exit_with, 0) != 0 && errno == ESRCH) break;
    if (idle_expired(run->idle_exit, &busy_at)) {
      fprintf(stderr, "warmboxd: no sandbox ran for %d s (--idle-exit), shutting down\n", run->idle_exit);
      break;
    }
  }
  return b;
}

/* Stop accepting, stop expiring leases, let the runtime end every
 * sandbox's processes (so streams that wait on them finish), then join the
 * connection threads and free the records. */
static void stop_all(void) {
  wbd_server_quiesce();
  wbd_lifecycle_stop();
  wbd_state_shutdown();
  wbd_events_stop();
  wbd_rt_shutdown();
  wbd_server_stop();
  wbd_store_free_all();
  wbd_snapshot_free_all();
  wbd_stats_free();
}

int main(int argc, char **argv) {
  struct run_opts run = {0, 0};
  int rc = parse_args(argc, argv, &run);
  if (rc >= 0) return rc;
  if (wbd_opt.max_team_memory_mb < 0) {
    /* a team's sandboxes may together be as large as the host, no larger */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    long long mb = pages > 0 && psz > 0 ? (long long)pages * psz / (1 << 20) : 0;
    wbd_opt.max_team_memory_mb = mb > INT_MAX ? INT_MAX : (int)mb;
  }
  int host_fd = -1;
  if (run.exit_with > 0 && host_watch_open(run.exit_with, &host_fd) != 0) return 2;
  char *made_dir;
  if (data_dir_default(&made_dir) != 0) return 1;
  /* The sandboxes' files are made with the modes a kernel expects, whatever
   * umask the host that started warmboxd runs under (Prosody's is 027). */
  umask(022);
  /* Before any thread, descriptor or port: a SIGKILL still has its cgroups removed. */
  if (wbd_janitor_start(argc, argv) != 0)
    fprintf(stderr, "warmboxd: no janitor (%s): a kill leaves cgroups\n", strerror(errno));
  if (signals_install() != 0 || start_all() != 0) {
    free(made_dir);
    return 1;
  }
  int sig = wait_for_exit(host_fd, &run);
  if (wbd_opt.verbose) {
    if (sig)
      fprintf(stderr, "warmboxd: signal %d, shutting down\n", sig);
    else if (run.exit_with > 0)
      fprintf(stderr, "warmboxd: process %d ended, shutting down\n", run.exit_with);
  }
  if (host_fd >= 0) close(host_fd);
  stop_all();
  if (made_dir) {
    rmdir(made_dir);
    free(made_dir);
  }
  close(sig_pipe[0]);
  close(sig_pipe[1]);
  return 0;
}
