/* fuzz_multipart: envd's POST /files multipart/form-data uploads (the
 * parser of the NULL strcmp crash). Input: the boundary, a newline, the
 * body; the query path is the second line when the first starts with '?'. */
#include "harness.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nl = memchr(data, '\n', size < 128 ? size : 128);
  if (!nl) return 0;
  size_t blen = (size_t)(nl - data);
  char boundary[130], query[300] = "";
  memcpy(boundary, data, blen);
  boundary[blen] = 0;
  if (memchr(boundary, '\r', blen) || memchr(boundary, 0, blen)) return 0;
  const uint8_t *body = nl + 1;
  size_t blen2 = size - blen - 1;
  if (blen2 && body[0] == '?') {
    const uint8_t *nl2 = memchr(body, '\n', blen2 < 256 ? blen2 : 256);
    if (nl2) {
      size_t ql = (size_t)(nl2 - body);
      if (memchr(body, '\r', ql) || memchr(body, ' ', ql) || memchr(body, 0, ql)) return 0;
      memcpy(query, body, ql);
      query[ql] = 0;
      blen2 -= ql + 1;
      body = nl2 + 1;
    }
  }
  fuzz_server();
  char head[1024];
  int n = snprintf(head, sizeof head,
                   "POST /files%s HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 49983\r\n"
                   "Content-Type: multipart/form-data; boundary=%s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                   query, fuzz_sandbox_id(), boundary, blen2);
  if (n < 0 || (size_t)n >= sizeof head) return 0;
  fuzz_send(head, (size_t)n, body, blen2);
  return 0;
}
