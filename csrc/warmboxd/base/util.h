/*
 * util.h: small helpers any layer may use: a growable byte buffer,
 * standard base64, SHA-256 (warmboxd links no crypto library; the
 * signed-URL check needs one digest), random bytes, ids and UUIDs, and
 * checks of what comes from outside.
 */
#ifndef WBD_UTIL_H
#define WBD_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

struct wbd_buf {
  char *data;
  size_t len, cap, off; /* off: bytes already consumed by a reader */
};

int wbd_buf_add(struct wbd_buf *b, const void *data, size_t len); /* 0 or -1 (ENOMEM) */
void wbd_buf_free(struct wbd_buf *b);
/* Moves up to `max` unread bytes to `out` (a stream's reader); the buffer is
 * emptied once all is read. Returns how many (0: nothing unread). */
size_t wbd_buf_take(struct wbd_buf *b, char *out, size_t max);

/* Standard base64 with padding; returns a malloc'd NUL-terminated string. */
char *wbd_b64_encode(const void *data, size_t len);
/* Decodes standard base64 (padding optional); returns a malloc'd buffer
 * (NUL-terminated) and its length, or NULL on bad input. */
unsigned char *wbd_b64_decode(const char *s, size_t *out_len);

void wbd_sha256(const void *data, size_t len, unsigned char out[32]);
/* The same, a piece at a time; a copy of a context goes on from where it was. */
struct wbd_sha256 {
  uint32_t h[8];
  unsigned char buf[64];
  size_t n;     /* bytes in buf */
  uint64_t len; /* bytes hashed in all */
};
void wbd_sha256_init(struct wbd_sha256 *c);
void wbd_sha256_update(struct wbd_sha256 *c, const void *data, size_t len);
void wbd_sha256_final(struct wbd_sha256 *c, unsigned char out[32]);
/* wbd_files_signature in two steps: the part every token shares ("path:op:
 * user:"), once; then one token's signature from a copy of it. */
void wbd_files_sig_prefix(struct wbd_sha256 *c, const char *path, const char *op, const char *user);
void wbd_files_sig_finish(const struct wbd_sha256 *prefix, const char *token, const char *expiration, char out[64]);

/* The one source of randomness (ids, tokens, UUIDs, the admin token):
 * getrandom(2), retried when a signal interrupts it; warmboxd aborts when
 * the kernel cannot give random bytes, as it does when memory runs out (an
 * id or token must never be guessable). */
void wbd_random(void *buf, size_t len);
/* n characters drawn uniformly from `alphabet` (its length alen <= 256),
 * then a NUL: out gets n + 1 bytes. */
void wbd_random_chars(char *out, size_t n, const char *alphabet, size_t alen);
/* A random (version 4) UUID, lowercase, with dashes, no newline; buf >= 37. */
void wbd_uuid4(char *buf, size_t len);
/* A UUID derived from `kind` and `seed` (SHA-256 of "kind\nseed"), stable
 * across runs: the ids E2B's events give a team, a build, an execution. */
void wbd_uuid_of(const char *kind, const char *seed, char out[37]);

/* A JSON string for bytes that came from outside (paths, file names, header
 * values, messages that quote them): json_string() returns NULL for bytes
 * that are not UTF-8, so every invalid byte becomes U+FFFD (as Go's
 * encoding/json writes it) and the result is never NULL for a non-NULL `s`
 * (it aborts on out of memory, like the rest of warmboxd). */
json_t *wbd_json_str(const char *s);

/* Saturating arithmetic for numbers read from requests: the result is
 * clamped to [lo, hi] instead of overflowing. */
long long wbd_clamp_ll(long long v, long long lo, long long hi);
/* Parses a decimal integer (optional sign, surrounding blanks) from a header
 * or field, clamping to [lo, hi]; returns 0, or -1 when `s` is not a number
 * (then *out = def). Digits beyond the range saturate rather than overflow. */
int wbd_parse_ll(const char *s, long long lo, long long hi, long long def, long long *out);

/* A Connect streaming request body: exactly one envelope (flag byte, 4-byte
 * big-endian length, message). WBD_ENV_OK with *len = the message length
 * (it starts at body + 5); otherwise why not (*len is the announced length
 * for WBD_ENV_LENGTH). */
enum { WBD_ENV_OK = 0, WBD_ENV_SHORT, WBD_ENV_COMPRESSED, WBD_ENV_LENGTH };
int wbd_connect_envelope(const char *body, size_t body_len, size_t *len);

/* envd's URL signature for /files: "v1_" + unpadded base64 of
 * SHA-256("<path>:<op>:<user>:<token>[:<expiration>]"), op "read" or
 * "write", user "" when absent, expiration only when given. `out` gets at
 * least 48 bytes. */
void wbd_files_signature(const char *path, const char *op, const char *user, const char *token, const char *expiration,
                         char out[64]);

/* Constant-time string comparison (tokens). */
int wbd_str_eq_ct(const char *a, const char *b);

/* 1 when an environment variable's name is one the dynamic loader or libc
 * reads to load code or data from a path (LD_*, GCONV_PATH, ...): refused
 * at the API, for the sandbox's envVars and a process's envs alike, and
 * never given to bubblewrap or a jail. */
int wbd_env_refused(const char *name);

#endif
