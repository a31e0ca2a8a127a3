/* warmbox_clock.h: the one monotonic clock and sleep of warmbox.core
 * (core.now/core.sleep, retry backoff, lock waits, the Redis keeper, the
 * engine's timers all read the same clock). */
#ifndef WARMBOX_CLOCK_H
#define WARMBOX_CLOCK_H

/* Seconds on CLOCK_MONOTONIC. */
double warmbox_clock_now(void);

/* Sleeps `seconds` (nothing for <= 0 or NaN; at most 1e9 s), resuming after
 * a signal interrupts it. */
void warmbox_clock_sleep(double seconds);

#endif
