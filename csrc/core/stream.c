/* stream.c: the frame splitter for streamed responses (see warmbox_stream.h). */
#include <string.h>
#include "warmbox_stream.h"

void warmbox_stream_init(warmbox_stream *s, int mode, size_t max_frame) {
  s->mode = mode;
  s->max_frame = max_frame;
  s->skipping = 0;
  s->pending.data = NULL;
  s->pending.len = s->pending.cap = 0;
}

void warmbox_stream_free(warmbox_stream *s) {
  warmbox_buf_free(&s->pending);
}

static int warmbox_emit_line(const char *p, size_t n, warmbox_frame_fn fn, void *ud) {
  if (n > 0 && p[n - 1] == '\r') n--;
  if (n == 0) return 0; /* blank lines carry nothing in NDJSON */
  return fn(ud, p, n, 0);
}

/* A whole line: longer than max_frame, it goes out cut, flagged. */
static int warmbox_emit_bounded(const warmbox_stream *s, const char *p, size_t n, warmbox_frame_fn fn, void *ud) {
  if (n > s->max_frame) return fn(ud, p, s->max_frame, WARMBOX_FRAME_CUT);
  return warmbox_emit_line(p, n, fn, ud);
}

static int warmbox_feed_lines(warmbox_stream *s, const char *p, size_t n, warmbox_frame_fn fn, void *ud) {
  /* Lines wholly inside this chunk are delivered straight from it; only a
   * trailing partial line is copied, so memory stays bounded by one line. A
   * line longer than max_frame is delivered cut to its first max_frame bytes
   * with WARMBOX_FRAME_CUT; the rest of it is read and dropped. */
  size_t start = 0, i;
  for (i = 0; i < n; i++) {
    if (p[i] != '\n') continue;
    if (s->skipping) {
      s->skipping = 0;
    } else if (s->pending.len > 0) {
      int r;
      size_t add = i - start;
      if (add > s->max_frame - s->pending.len) add = s->max_frame - s->pending.len;
      if (warmbox_buf_append(&s->pending, p + start, add)) return WARMBOX_STREAM_NOMEM;
      r = add < i - start ? fn(ud, s->pending.data, s->pending.len, WARMBOX_FRAME_CUT)
                          : warmbox_emit_line(s->pending.data, s->pending.len, fn, ud);
      s->pending.len = 0;
      if (r) return WARMBOX_STREAM_STOPPED;
    } else if (warmbox_emit_bounded(s, p + start, i - start, fn, ud)) {
      return WARMBOX_STREAM_STOPPED;
    }
    start = i + 1;
  }
  if (start < n && !s->skipping) {
    size_t add = n - start;
    if (add > s->max_frame - s->pending.len) {
      int r;
      add = s->max_frame - s->pending.len;
      if (warmbox_buf_append(&s->pending, p + start, add)) return WARMBOX_STREAM_NOMEM;
      r = fn(ud, s->pending.data, s->pending.len, WARMBOX_FRAME_CUT);
      s->pending.len = 0;
      s->skipping = 1;
      return r ? WARMBOX_STREAM_STOPPED : WARMBOX_STREAM_OK;
    }
    if (warmbox_buf_append(&s->pending, p + start, add)) return WARMBOX_STREAM_NOMEM;
  }
  return WARMBOX_STREAM_OK;
}

static size_t warmbox_be32(const unsigned char *b) {
  return ((size_t)b[0] << 24) | ((size_t)b[1] << 16) | ((size_t)b[2] << 8) | (size_t)b[3];
}

static int warmbox_feed_connect(warmbox_stream *s, const char *p, size_t n, warmbox_frame_fn fn, void *ud) {
  const char *d;
  size_t len, off = 0;
  if (warmbox_buf_append(&s->pending, p, n)) return WARMBOX_STREAM_NOMEM;
  d = s->pending.data;
  len = s->pending.len;
  while (len - off >= 5) {
    size_t flen = warmbox_be32((const unsigned char *)d + off + 1);
    int flags = (unsigned char)d[off];
    if (flen > s->max_frame) return WARMBOX_STREAM_TOOBIG;
    if (len - off - 5 < flen) break;
    if (fn(ud, d + off + 5, flen, flags)) {
      warmbox_buf_consume(&s->pending, off + 5 + flen);
      return WARMBOX_STREAM_STOPPED;
    }
    off += 5 + flen;
  }
  warmbox_buf_consume(&s->pending, off);
  return WARMBOX_STREAM_OK;
}

int warmbox_stream_feed(warmbox_stream *s, const char *p, size_t n, warmbox_frame_fn fn, void *ud) {
  if (s->mode == WARMBOX_STREAM_LINES) return warmbox_feed_lines(s, p, n, fn, ud);
  return warmbox_feed_connect(s, p, n, fn, ud);
}

int warmbox_stream_finish(warmbox_stream *s, warmbox_frame_fn fn, void *ud) {
  int r = WARMBOX_STREAM_OK;
  if (s->pending.len == 0) return r;
  if (s->mode == WARMBOX_STREAM_LINES) {
    if (warmbox_emit_line(s->pending.data, s->pending.len, fn, ud)) r = WARMBOX_STREAM_STOPPED;
  } else {
    r = WARMBOX_STREAM_TRUNCATED;
  }
  s->pending.len = 0;
  s->skipping = 0;
  return r;
}
