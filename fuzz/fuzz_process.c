/* fuzz_process: the bodies of envd's process RPCs (process.Process/...): the
 * StreamInput client stream (any number of envelopes), the Connect and Start
 * request envelopes, the unary JSON ones. Input: a method byte, then the
 * body. The runtime is stubbed (fuzz/stubs.c): nothing is ever started, so
 * the process registry stays empty and every selector misses. */
#include "harness.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const struct {
    const char *method, *ctype;
  } rpc[] = {
    {"StreamInput", "application/connect+json"},
    {"Connect", "application/connect+json"},
    {"Start", "application/connect+json"},
    {"SendInput", "application/json"},
    {"Update", "application/json"},
    {"CloseStdin", "application/json"},
  };
  if (size < 1) return 0;
  size_t m = data[0] % (sizeof rpc / sizeof rpc[0]);
  fuzz_server();
  char head[512];
  int n = snprintf(head, sizeof head,
                   "POST /process.Process/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: %s\r\n"
                   "E2b-Sandbox-Port: 49983\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                   rpc[m].method, fuzz_sandbox_id(), rpc[m].ctype, size - 1);
  if (n < 0 || (size_t)n >= sizeof head) return 0;
  fuzz_send(head, (size_t)n, data + 1, size - 1);
  return 0;
}
