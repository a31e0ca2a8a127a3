/* fuzz_headers: header blocks after a fixed request line: Host and the E2B
 * routing headers, Content-Length, the admin gate, numeric headers. */
#include "harness.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char line[] = "GET /health HTTP/1.1\r\n";
  fuzz_send(line, sizeof line - 1, data, size);
  return 0;
}
