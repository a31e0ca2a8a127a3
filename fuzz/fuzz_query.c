/* fuzz_query: the list's query parsers: E2B's metadata filter (twice
 * decoded), RFC 3339 times. */
#include "control.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) return 0;
  memcpy(s, data, size);
  s[size] = 0;
  const char *err = NULL;
  json_t *f = wbd_parse_metadata(s, &err);
  if (!f && !err) abort(); /* a NULL filter always says why */
  json_decref(f);
  int64_t us;
  (void)wbd_parse_time(s, &us);
  free(s);
  return 0;
}
