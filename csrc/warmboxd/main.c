/*
 * main.c: warmboxd's options, start-up and clean exit.
 */
#include "wbd_int.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct wbd_options wbd_opt = {
  .host = "127.0.0.1",
  .port = 0,
  .api_key = NULL,
  .max_length_hours = 24,
  .max_running = 0,
  .default_timeout_s = 15,
  .data_dir = NULL,
};

/* A signal handler may only write(2); the main thread waits on this pipe. */
static int sig_pipe[2] = { -1, -1 };

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
          "  --max-length-hours H  maximum run length (default 24)\n"
          "  --max-running N       concurrent running sandboxes per team (default unlimited)\n"
          "  --default-timeout S   lease when create gives none (default 15)\n"
          "  --rtt-ms MS           delay added to every request (default 0)\n"
          "  --create-ms MS        delay added to create (default 0)\n"
          "  --resume-ms MS        delay added to resume (default 0)\n"
          "  --data-dir DIR        where sandbox directories live (default a fresh temp dir)\n"
          "  --unisolated          run sandboxes without bubblewrap (unsafe)\n"
          "  --verbose             log requests to stderr\n"
          "  --version             print the version\n"
          "  --help                this text\n\n"
          "Prints 'warmboxd listening on http://HOST:PORT' first on stdout.\n");
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

int main(int argc, char **argv) {
  enum { O_PORT = 256, O_HOST, O_KEY, O_MAXLEN, O_MAXRUN, O_DEFTO, O_RTT, O_CREATE, O_RESUME, O_DATA,
         O_UNISO, O_VERBOSE, O_VERSION, O_HELP };
  static const struct option longopts[] = {
    { "port", required_argument, 0, O_PORT },
    { "host", required_argument, 0, O_HOST },
    { "api-key", required_argument, 0, O_KEY },
    { "max-length-hours", required_argument, 0, O_MAXLEN },
    { "max-running", required_argument, 0, O_MAXRUN },
    { "default-timeout", required_argument, 0, O_DEFTO },
    { "rtt-ms", required_argument, 0, O_RTT },
    { "create-ms", required_argument, 0, O_CREATE },
    { "resume-ms", required_argument, 0, O_RESUME },
    { "data-dir", required_argument, 0, O_DATA },
    { "unisolated", no_argument, 0, O_UNISO },
    { "verbose", no_argument, 0, O_VERBOSE },
    { "version", no_argument, 0, O_VERSION },
    { "help", no_argument, 0, O_HELP },
    { 0, 0, 0, 0 },
  };
  int c, rc = 0;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case O_PORT: rc = parse_int("--port", optarg, 0, 65535, &wbd_opt.port); break;
    case O_HOST: wbd_opt.host = optarg; break;
    case O_KEY: wbd_opt.api_key = optarg; break;
    case O_MAXLEN: rc = parse_int("--max-length-hours", optarg, 1, 24 * 365, &wbd_opt.max_length_hours); break;
    case O_MAXRUN: rc = parse_int("--max-running", optarg, 0, 1 << 30, &wbd_opt.max_running); break;
    case O_DEFTO: rc = parse_int("--default-timeout", optarg, 1, 1 << 30, &wbd_opt.default_timeout_s); break;
    case O_RTT: rc = parse_int("--rtt-ms", optarg, 0, 600000, &wbd_opt.rtt_ms); break;
    case O_CREATE: rc = parse_int("--create-ms", optarg, 0, 600000, &wbd_opt.create_ms); break;
    case O_RESUME: rc = parse_int("--resume-ms", optarg, 0, 600000, &wbd_opt.resume_ms); break;
    case O_DATA: wbd_opt.data_dir = optarg; break;
    case O_UNISO: wbd_opt.unisolated = 1; break;
    case O_VERBOSE: wbd_opt.verbose = 1; break;
    case O_VERSION: printf("warmboxd %s\n", WARMBOX_VERSION); return 0;
    case O_HELP: usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
    if (rc) return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "warmboxd: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }

  char *made_dir = NULL;
  if (!wbd_opt.data_dir) {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    size_t n = strlen(tmp) + 32;
    made_dir = malloc(n);
    if (!made_dir) return 1;
    snprintf(made_dir, n, "%s/warmboxd-XXXXXX", tmp);
    if (!mkdtemp(made_dir)) {
      fprintf(stderr, "warmboxd: cannot create a data directory under %s: %s\n", tmp, strerror(errno));
      free(made_dir);
      return 1;
    }
    wbd_opt.data_dir = made_dir;
  }

  if (pipe(sig_pipe) != 0) {
    perror("warmboxd: pipe");
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (wbd_rt_init() != 0) {
    fprintf(stderr, "warmboxd: the sandbox runtime could not start\n");
    free(made_dir);
    return 1;
  }
  if (wbd_server_start() != 0) {
    wbd_rt_shutdown();
    free(made_dir);
    return 1;
  }
  if (wbd_lifecycle_start() != 0) {
    fprintf(stderr, "warmboxd: cannot start the lifecycle thread\n");
    wbd_server_stop();
    wbd_rt_shutdown();
    free(made_dir);
    return 1;
  }
  printf("warmboxd listening on http://%s:%d\n", strcmp(wbd_opt.host, "localhost") == 0 ? "127.0.0.1" : wbd_opt.host,
         wbd_server_port());
  fflush(stdout);
  if (!wbd_opt.api_key && wbd_opt.verbose)
    fprintf(stderr, "warmboxd: accepting any e2b_<hex> API key, one team per key\n");

  /* A timed poll rather than a blocking read: sanitizers that defer signal
   * handlers to the next intercepted call still see the signal. */
  unsigned char b = 0;
  for (;;) {
    struct pollfd pfd = { .fd = sig_pipe[0], .events = POLLIN };
    int n = poll(&pfd, 1, 250);
    if (n < 0 && errno != EINTR) break;
    if (n > 0 && read(sig_pipe[0], &b, 1) == 1) break;
  }
  if (wbd_opt.verbose) fprintf(stderr, "warmboxd: signal %d, shutting down\n", b);

  /* Stop accepting, stop expiring leases, let the runtime end every
   * sandbox's processes (so streams that wait on them finish), then join the
   * connection threads and free the records. */
  wbd_server_quiesce();
  wbd_lifecycle_stop();
  wbd_rt_shutdown();
  wbd_server_stop();
  wbd_store_free_all();
  wbd_stats_free();
  if (made_dir) {
    rmdir(made_dir);
    free(made_dir);
  }
  close(sig_pipe[0]);
  close(sig_pipe[1]);
  return 0;
}
