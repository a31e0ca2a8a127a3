/* fuzz_json: JSON bodies of the control plane: create (v1 and v2), connect,
 * timeout and the admin seed, chosen by the first byte. */
#include "harness.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static const char *const paths[] = {"/sandboxes",
                                      "/v2/sandboxes",
                                      "/sandboxes/inosuchsandbox/connect",
                                      "/sandboxes/inosuchsandbox/timeout",
                                      "/_warmboxd/seed",
                                      "/sandboxes/inosuchsandbox/resume"};
  const char *path = paths[data[0] % (sizeof paths / sizeof *paths)];
  char head[512];
  int n = snprintf(head, sizeof head,
                   "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: " FUZZ_API_KEY
                   "\r\n"
                   "X-Warmboxd-Token: " FUZZ_ADMIN_TOKEN
                   "\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   path, size - 1);
  fuzz_send(head, (size_t)n, data + 1, size - 1);
  return 0;
}
