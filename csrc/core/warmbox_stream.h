/* warmbox_stream.h: splits a streamed response body into frames as bytes
 * arrive: NDJSON lines, or Connect envelopes (1 flag byte + 4-byte big-endian
 * length + payload). Frames, and even an envelope's 5-byte prefix, may be
 * split across reads at any byte. Plain C: it runs inside libcurl callbacks. */
#ifndef WARMBOX_STREAM_H
#define WARMBOX_STREAM_H
#include <stddef.h>
#include "warmbox_buf.h"

enum { WARMBOX_STREAM_NONE = 0, WARMBOX_STREAM_LINES = 1, WARMBOX_STREAM_CONNECT = 2 };

/* Results of feed/finish. */
enum {
  WARMBOX_STREAM_OK = 0,
  WARMBOX_STREAM_STOPPED = 1, /* the frame function asked to stop */
  WARMBOX_STREAM_NOMEM = -1,
  WARMBOX_STREAM_TOOBIG = -2,   /* an envelope longer than the limit */
  WARMBOX_STREAM_TRUNCATED = -3 /* the body ended inside an envelope */
};

/* The flags of a line longer than max_frame, delivered cut to max_frame bytes
 * (lines mode; its remaining bytes are dropped). */
#define WARMBOX_FRAME_CUT 1

/* Called per frame; returns nonzero to stop. flags: the envelope's flag byte
 * (0 for lines). */
typedef int (*warmbox_frame_fn)(void *ud, const char *data, size_t len, int flags);

typedef struct warmbox_stream {
  int mode;
  size_t max_frame;
  int skipping; /* lines mode: dropping the rest of a line that was too long */
  warmbox_buf pending;
} warmbox_stream;

void warmbox_stream_init(warmbox_stream *s, int mode, size_t max_frame);
int warmbox_stream_feed(warmbox_stream *s, const char *p, size_t n, warmbox_frame_fn fn, void *ud);
/* End of body: delivers a last unterminated line; a partial envelope is
 * WARMBOX_STREAM_TRUNCATED. */
int warmbox_stream_finish(warmbox_stream *s, warmbox_frame_fn fn, void *ud);
void warmbox_stream_free(warmbox_stream *s);

#endif
