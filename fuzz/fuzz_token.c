/* fuzz_token: nextToken page cursors (base64url of "<RFC3339Nano>__<id>"). */
#include "control.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  char *s = malloc(size);
  if (!s) return 0;
  memcpy(s, data + 1, size - 1);
  s[size - 1] = 0;
  int64_t ts;
  char id[64];
  if (wbd_parse_token(s, data[0] & 1, &ts, id, sizeof id) == 0 && strlen(id) >= sizeof id) abort();
  free(s);
  return 0;
}
