/* buf.c: the growable byte buffer (see warmbox_buf.h). */
#include <stdlib.h>
#include <string.h>
#include "warmbox_buf.h"

int warmbox_buf_append(warmbox_buf *b, const void *p, size_t n) {
  if (n == 0) return 0;
  if (b->len + n < b->len) return -1; /* overflow */
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    char *d;
    while (cap < b->len + n) {
      if (cap > ((size_t)-1) / 2) return -1;
      cap *= 2;
    }
    d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  return 0;
}

void warmbox_buf_consume(warmbox_buf *b, size_t n) {
  if (n >= b->len) {
    b->len = 0;
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
}

void warmbox_buf_reset(warmbox_buf *b) {
  b->len = 0;
}

void warmbox_buf_free(warmbox_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}
