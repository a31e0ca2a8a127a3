/* clock.c: the one monotonic clock and sleep (see warmbox_clock.h). */
#include "warmbox_clock.h"

#include <errno.h>
#include <time.h>

double warmbox_clock_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void warmbox_clock_sleep(double seconds) {
  struct timespec req, rem;
  if (!(seconds > 0)) return; /* also NaN */
  if (seconds > 1e9) seconds = 1e9;
  req.tv_sec = (time_t)seconds;
  req.tv_nsec = (long)((seconds - (double)req.tv_sec) * 1e9);
  if (req.tv_nsec > 999999999L) req.tv_nsec = 999999999L;
  while (nanosleep(&req, &rem) != 0 && errno == EINTR) req = rem;
}
