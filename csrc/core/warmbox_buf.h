/* warmbox_buf.h: a growable byte buffer for libcurl callbacks. Plain C, no
 * Lua: callbacks run while libcurl is on the C stack, where a Lua error (a
 * longjmp) must never happen, so responses are collected here first. */
#ifndef WARMBOX_BUF_H
#define WARMBOX_BUF_H
#include <stddef.h>

typedef struct warmbox_buf {
  char *data;
  size_t len;
  size_t cap;
} warmbox_buf;

/* 0 on success, -1 when out of memory (the buffer is left unchanged). */
int warmbox_buf_append(warmbox_buf *b, const void *p, size_t n);
/* Drops the first n bytes. */
void warmbox_buf_consume(warmbox_buf *b, size_t n);
void warmbox_buf_reset(warmbox_buf *b);
void warmbox_buf_free(warmbox_buf *b);

#endif
