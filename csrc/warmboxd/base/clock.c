/*
 * clock.c: the server's clock (what every lease, auto-pause, endAt and
 * listing reads, and what the admin API moves: knobs.c), its RFC 3339
 * format and a sleep that outlasts signals.
 */
#include "wbd.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

/* The server's clock: the wall clock plus what the admin API moved it
 * forward (POST /_warmboxd/clock), so a test can make leases, auto-pause and
 * endAt pass without waiting for them; frozen, it stands still between two
 * moves. Only ever moves forward. Read on every request and lifecycle pass,
 * so reading takes no lock: a sequence count (odd while a writer changes the
 * two words) lets a reader retry the rare read that overlapped a move;
 * writers, as rare, take clock_mu among themselves. */
static pthread_mutex_t clock_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint clock_seq;
static _Atomic int64_t clock_offset_us, clock_frozen_us; /* frozen: the time it stands at, else 0 */

static int64_t wall_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* One consistent reading of the clock's two words (no lock); returns the
 * time it shows. The wall clock is read inside the check, so a reading never
 * runs ahead of a freeze that follows it. */
static int64_t clock_read(int64_t *offset, int64_t *frozen) {
  for (;;) {
    unsigned seq = atomic_load(&clock_seq);
    if (seq & 1u) continue; /* a move under way */
    *offset = atomic_load(&clock_offset_us);
    *frozen = atomic_load(&clock_frozen_us);
    int64_t now = *frozen ? *frozen : wall_us() + *offset;
    if (atomic_load(&clock_seq) == seq) return now;
  }
}

int64_t wbd_now_us(void) {
  int64_t off, fz;
  return clock_read(&off, &fz);
}

void wbd_clock_state(int64_t *offset_us, int *frozen) {
  int64_t off, fz;
  clock_read(&off, &fz);
  if (offset_us) *offset_us = off;
  if (frozen) *frozen = fz != 0;
}

void wbd_clock_advance(int64_t us, int freeze) {
  pthread_mutex_lock(&clock_mu);
  int64_t off = atomic_load(&clock_offset_us), fz = atomic_load(&clock_frozen_us);
  if (freeze == 1 && !fz) fz = wall_us() + off;
  if (us > 0) {
    off += us;
    if (fz) fz += us;
  }
  if (freeze == 0 && fz) { /* thawed: goes on from where it stood */
    int64_t w = wall_us();
    if (fz > w + off) off = fz - w;
    fz = 0;
  }
  atomic_fetch_add(&clock_seq, 1u); /* odd: readers wait */
  atomic_store(&clock_offset_us, off);
  atomic_store(&clock_frozen_us, fz);
  atomic_fetch_add(&clock_seq, 1u);
  pthread_mutex_unlock(&clock_mu);
}

void wbd_format_time(int64_t us, char *buf, size_t len) {
  time_t s = (time_t)(us / 1000000);
  int64_t frac = us % 1000000;
  if (frac < 0) {
    frac += 1000000;
    s -= 1;
  }
  struct tm tm;
  gmtime_r(&s, &tm);
  snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%06lld000Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
           tm.tm_hour, tm.tm_min, tm.tm_sec, (long long)frac);
}

void wbd_sleep_ms(int ms) {
  if (ms <= 0) return;
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}
