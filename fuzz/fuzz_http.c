/* fuzz_http: whole raw requests (request line, headers, body) to warmboxd:
 * routing, the admin gate, auth, body limits, every control-plane handler. */
#include "harness.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_send(NULL, 0, data, size);
  return 0;
}
