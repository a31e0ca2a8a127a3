/* fuzz_connect: Connect streaming envelopes and the JSON inside them, and
 * the JSON strings warmboxd writes from raw bytes. */
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t len;
  if (wbd_connect_envelope((const char *)data, size, &len) == WBD_ENV_OK) {
    if (len + 5 != size) abort();
    json_error_t err;
    json_t *in = json_loadb((const char *)data + 5, len, 0, &err);
    json_decref(in);
  }
  char *s = malloc(size + 1);
  if (!s) return 0;
  memcpy(s, data, size);
  s[size] = 0;
  json_t *j = wbd_json_str(s);
  if (!j) abort(); /* never NULL, whatever the bytes */
  char *out = json_dumps(j, JSON_ENCODE_ANY);
  if (!out) abort();
  free(out);
  json_decref(j);
  long long v;
  (void)wbd_parse_ll(s, -1000, 1000, 0, &v);
  if (v < -1000 || v > 1000) abort();
  free(s);
  return 0;
}
