/* util.c: byte buffer, base64, SHA-256, randomness and checks (util.h). */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ------------------------------------------------------------------ */
/* Buffer                                                              */
/* ------------------------------------------------------------------ */

int wbd_buf_add(struct wbd_buf *b, const void *data, size_t len) {
  if (b->len + len + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + len + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
  }
  if (len) memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = 0;
  return 0;
}

size_t wbd_buf_take(struct wbd_buf *b, char *out, size_t max) {
  size_t n = b->len - b->off;
  if (n > max) n = max;
  if (n == 0) return 0;
  memcpy(out, b->data + b->off, n);
  b->off += n;
  if (b->off == b->len) b->off = b->len = 0;
  return n;
}

void wbd_buf_free(struct wbd_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------------ */
/* JSON strings from raw bytes, numbers from raw text                  */
/* ------------------------------------------------------------------ */

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlongs, no
 * surrogates, <= U+10FFFF), or 0 when the byte at s does not start one. */
static size_t utf8_seq(const unsigned char *s) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t n;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else
    return 0;
  if (s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return n;
}

json_t *wbd_json_str(const char *s) {
  if (!s) return NULL;
  json_t *j = json_string(s);
  if (j) return j;
  size_t len = strlen(s);
  char *out = malloc(len * 3 + 1), *o = out;
  if (!out) abort();
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    size_t n = utf8_seq(p);
    if (n) {
      memcpy(o, p, n);
      o += n;
      p += n;
    } else {
      memcpy(o, "\xEF\xBF\xBD", 3);
      o += 3;
      p++;
    }
  }
  *o = 0;
  j = json_stringn_nocheck(out, (size_t)(o - out));
  free(out);
  if (!j) abort();
  return j;
}

long long wbd_clamp_ll(long long v, long long lo, long long hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

int wbd_parse_ll(const char *s, long long lo, long long hi, long long def, long long *out) {
  *out = def;
  if (!s) return -1;
  while (*s == ' ' || *s == '\t') s++;
  int neg = 0;
  if (*s == '+' || *s == '-') neg = *s++ == '-';
  if (!isdigit((unsigned char)*s)) return -1;
  /* Saturate at 10^18 (below LLONG_MAX): v * 10 + 9 never overflows. */
  const unsigned long long cap = 1000000000000000000ULL;
  unsigned long long v = 0;
  for (; isdigit((unsigned char)*s); s++) v = v < cap ? v * 10 + (unsigned)(*s - '0') : cap;
  if (v > cap) v = cap;
  while (*s == ' ' || *s == '\t') s++;
  if (*s) return -1;
  long long r = neg ? -(long long)v : (long long)v;
  *out = wbd_clamp_ll(r, lo, hi);
  return 0;
}

int wbd_connect_envelope(const char *body, size_t body_len, size_t *len) {
  const unsigned char *b = (const unsigned char *)body;
  *len = 0;
  if (body_len < 5) return WBD_ENV_SHORT;
  *len = (size_t)b[1] << 24 | (size_t)b[2] << 16 | (size_t)b[3] << 8 | b[4];
  if (b[0] & 0x01) return WBD_ENV_COMPRESSED;
  if (*len != body_len - 5) return WBD_ENV_LENGTH;
  return WBD_ENV_OK;
}

/* ------------------------------------------------------------------ */
/* Base64                                                              */
/* ------------------------------------------------------------------ */

static const char b64_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *wbd_b64_encode(const void *data, size_t len) {
  const unsigned char *s = data;
  char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
  if (!out) return NULL;
  size_t i = 0;
  for (; i + 2 < len; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
    *o++ = b64_chars[v >> 18 & 63];
    *o++ = b64_chars[v >> 12 & 63];
    *o++ = b64_chars[v >> 6 & 63];
    *o++ = b64_chars[v & 63];
  }
  if (i < len) {
    uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < len ? (uint32_t)s[i + 1] << 8 : 0);
    *o++ = b64_chars[v >> 18 & 63];
    *o++ = b64_chars[v >> 12 & 63];
    *o++ = i + 1 < len ? b64_chars[v >> 6 & 63] : '=';
    *o++ = '=';
  }
  *o = 0;
  return out;
}

static int b64_val(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

unsigned char *wbd_b64_decode(const char *s, size_t *out_len) {
  size_t n = strlen(s);
  while (n && s[n - 1] == '=') n--;
  if (n % 4 == 1) return NULL;
  unsigned char *out = malloc(n / 4 * 3 + 4), *o = out;
  if (!out) return NULL;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; i++) {
    int v = b64_val((unsigned char)s[i]);
    if (v < 0) {
      free(out);
      return NULL;
    }
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      *o++ = (unsigned char)(acc >> bits & 0xff);
    }
  }
  *o = 0;
  *out_len = (size_t)(o - out);
  return out;
}

/* ------------------------------------------------------------------ */
/* SHA-256 (FIPS 180-4)                                                */
/* ------------------------------------------------------------------ */

static const uint32_t sha_k[64] = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR(x, n) ((x) >> (n) | (x) << (32 - (n)))

static void sha_block(uint32_t h[8], const unsigned char *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
    uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

void wbd_sha256_init(struct wbd_sha256 *c) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->h, h0, sizeof h0);
  c->n = 0;
  c->len = 0;
}

void wbd_sha256_update(struct wbd_sha256 *c, const void *data, size_t len) {
  const unsigned char *p = data;
  c->len += len;
  if (c->n) {
    size_t take = 64 - c->n < len ? 64 - c->n : len;
    memcpy(c->buf + c->n, p, take);
    c->n += take;
    p += take;
    len -= take;
    if (c->n < 64) return;
    sha_block(c->h, c->buf);
    c->n = 0;
  }
  for (; len >= 64; len -= 64, p += 64) sha_block(c->h, p);
  memcpy(c->buf, p, len);
  c->n = len;
}

void wbd_sha256_final(struct wbd_sha256 *c, unsigned char out[32]) {
  unsigned char tail[128] = {0};
  size_t n = c->n;
  memcpy(tail, c->buf, n);
  tail[n] = 0x80;
  size_t tl = n + 1 + 8 <= 64 ? 64 : 128;
  uint64_t bits = c->len * 8;
  for (int i = 0; i < 8; i++) tail[tl - 1 - i] = (unsigned char)(bits >> (8 * i));
  sha_block(c->h, tail);
  if (tl == 128) sha_block(c->h, tail + 64);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (unsigned char)(c->h[i] >> 24);
    out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
    out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
    out[4 * i + 3] = (unsigned char)c->h[i];
  }
}

void wbd_sha256(const void *data, size_t len, unsigned char out[32]) {
  struct wbd_sha256 c;
  wbd_sha256_init(&c);
  wbd_sha256_update(&c, data, len);
  wbd_sha256_final(&c, out);
}

/* The signature's input is "path:op:user:token[:expiration]": the part
 * before the token is hashed once (wbd_files_sig_prefix), then each
 * candidate token costs only its own few blocks (wbd_files_sig_finish). */
void wbd_files_sig_prefix(struct wbd_sha256 *c, const char *path, const char *op, const char *user) {
  wbd_sha256_init(c);
  const char *parts[] = {path ? path : "", ":", op, ":", user ? user : "", ":"};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) wbd_sha256_update(c, parts[i], strlen(parts[i]));
}

void wbd_files_sig_finish(const struct wbd_sha256 *prefix, const char *token, const char *expiration, char out[64]) {
  struct wbd_sha256 c = *prefix;
  wbd_sha256_update(&c, token, strlen(token));
  if (expiration) {
    wbd_sha256_update(&c, ":", 1);
    wbd_sha256_update(&c, expiration, strlen(expiration));
  }
  unsigned char digest[32];
  wbd_sha256_final(&c, digest);
  char *b64 = wbd_b64_encode(digest, sizeof digest);
  if (!b64) abort();
  size_t bl = strlen(b64);
  while (bl && b64[bl - 1] == '=') b64[--bl] = 0;
  snprintf(out, 64, "v1_%s", b64);
  free(b64);
}

void wbd_files_signature(const char *path, const char *op, const char *user, const char *token, const char *expiration,
                         char out[64]) {
  struct wbd_sha256 c;
  wbd_files_sig_prefix(&c, path, op, user);
  wbd_files_sig_finish(&c, token, expiration, out);
}

int wbd_str_eq_ct(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  unsigned char d = la != lb;
  for (size_t i = 0; i < la; i++) d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
  return d == 0;
}

int wbd_env_refused(const char *name) {
  /* glibc's unsecure-envvars list (what ld.so drops for setuid programs),
   * plus GLIBC_TUNABLES and every LD_ name. */
  static const char *const names[] = {"GCONV_PATH",   "GETCONF_DIR", "GLIBC_TUNABLES",   "HOSTALIASES",
                                      "LOCALDOMAIN",  "LOCPATH",     "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST",
                                      "MALLOC_TRACE", "NIS_PATH",    "NLSPATH",          "RESOLV_HOST_CONF",
                                      "RES_OPTIONS"};
  if (strncmp(name, "LD_", 3) == 0) return 1;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strcmp(name, names[i]) == 0) return 1;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Randomness                                                          */
/* ------------------------------------------------------------------ */

void wbd_random(void *buf, size_t len) {
  unsigned char *p = buf;
  size_t got = 0;
  while (got < len) {
    ssize_t r = getrandom(p + got, len - got, 0);
    if (r > 0)
      got += (size_t)r;
    else if (r < 0 && errno != EINTR) {
      fprintf(stderr, "warmboxd: getrandom: %s\n", strerror(errno));
      abort();
    }
  }
}

void wbd_random_chars(char *out, size_t n, const char *alphabet, size_t alen) {
  unsigned char b[128];
  size_t i = 0;
  while (i < n) {
    wbd_random(b, sizeof b);
    for (size_t j = 0; j < sizeof b && i < n; j++) {
      /* rejection sampling keeps the characters uniform */
      if (b[j] >= 256 - (256 % alen)) continue;
      out[i++] = alphabet[b[j] % alen];
    }
  }
  out[n] = 0;
}

/* 16 bytes as a version-4-marked UUID string (the one formatter). */
static void uuid_format(unsigned char b[16], char *buf, size_t len) {
  b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
  b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
  snprintf(buf, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
           b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

void wbd_uuid4(char *buf, size_t len) {
  unsigned char b[16];
  wbd_random(b, sizeof b);
  uuid_format(b, buf, len);
}

void wbd_uuid_of(const char *kind, const char *seed, char out[37]) {
  size_t lk = strlen(kind), ls = strlen(seed);
  char *s = malloc(lk + ls + 2);
  if (!s) abort();
  memcpy(s, kind, lk);
  s[lk] = '\n';
  memcpy(s + lk + 1, seed, ls + 1);
  unsigned char d[32];
  wbd_sha256(s, lk + ls + 1, d);
  free(s);
  uuid_format(d, out, 37);
}
