/* harness.c: warmboxd's server in-process for the HTTP fuzz targets. */
#include "control.h"
#include "envd.h"
#include "harness.h"
#include "util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

extern char fuzz_scratch[512];

static int port;
static char sandbox_id[32];

/* The admin API without its clock: a fuzzed move of it would end the
 * lease of the sandbox the data-plane targets use. */
static enum MHD_Result fuzz_call(struct wbd_req *req, const struct wbd_route *row) {
  if (row->fn == wbd_admin_clock)
    return wbd_reply_error(req, 404, "unknown warmboxd knob %s %s", req->method, req->path);
  return wbd_route_call(req, row);
}

static struct wbd_routes routes = {
  .call = fuzz_call,
  .control_key_ok = wbd_control_key_ok,
  .dataplane = wbd_control_dataplane,
  .dataplane_body_ok = wbd_envd_body_authorized,
};

int fuzz_server(void) {
  if (port) return port;
  const char *tmp = getenv("TMPDIR");
  snprintf(fuzz_scratch, sizeof fuzz_scratch, "%s/wbd-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(fuzz_scratch)) abort();
  char d[600];
  snprintf(d, sizeof d, "%s/home", fuzz_scratch);
  mkdir(d, 0700);
  snprintf(d, sizeof d, "%s/tmp", fuzz_scratch);
  mkdir(d, 0700);
  fuzz_options();
  wbd_opt.data_dir = fuzz_scratch;
  routes.table = wbd_route_table;
  routes.n = wbd_route_count;
  wbd_server_routes(&routes);
  if (wbd_server_start() != 0) abort();
  port = wbd_server_port();
  struct wbd_sandbox *sb = wbd_store_alloc("e2b_fuzz");
  sb->template_id = strdup("base");
  sb->state = WBD_RUNNING;
  sb->secure = 0;
  sb->started_at_us = wbd_now_us();
  sb->end_at_us = sb->started_at_us + (int64_t)86400 * 1000000;
  wbd_store_lock();
  wbd_store_insert_locked(sb);
  snprintf(sandbox_id, sizeof sandbox_id, "%s", sb->id);
  wbd_store_unlock();
  return port;
}

const char *fuzz_sandbox_id(void) {
  return sandbox_id;
}

void fuzz_send(const char *prefix, size_t plen, const unsigned char *data, size_t len) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  struct timeval tv = {2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fuzz_server())};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
    if (plen) (void)!send(fd, prefix, plen, MSG_NOSIGNAL);
    if (len) (void)!send(fd, data, len, MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    char buf[65536];
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
  }
  close(fd);
}
