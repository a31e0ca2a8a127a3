/*
 * envd_util.h: small helpers for envd (envd.c, envd_fs.c, dataplane.c):
 * a growable byte buffer, standard base64 and SHA-256 (warmboxd links no
 * crypto library; the signed-URL check needs one digest).
 */
#ifndef WBD_ENVD_UTIL_H
#define WBD_ENVD_UTIL_H

#include <stddef.h>
#include <stdint.h>

struct wbd_buf {
  char *data;
  size_t len, cap, off;   /* off: bytes already consumed by a reader */
};

int  wbd_buf_add(struct wbd_buf *b, const void *data, size_t len);   /* 0 or -1 (ENOMEM) */
void wbd_buf_free(struct wbd_buf *b);

/* Standard base64 with padding; returns a malloc'd NUL-terminated string. */
char *wbd_b64_encode(const void *data, size_t len);
/* Decodes standard base64 (padding optional); returns a malloc'd buffer
 * (NUL-terminated) and its length, or NULL on bad input. */
unsigned char *wbd_b64_decode(const char *s, size_t *out_len);

void wbd_sha256(const void *data, size_t len, unsigned char out[32]);

/* Constant-time string comparison (tokens). */
int wbd_str_eq_ct(const char *a, const char *b);

#endif
