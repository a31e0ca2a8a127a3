/* lock_internal.h: shared between lock.c and redis.c (the lock primitives). */
#ifndef WARMBOX_LOCK_INTERNAL_H
#define WARMBOX_LOCK_INTERNAL_H
#include <lua.h>

double warmbox_lock_monotonic(void);
void warmbox_lock_sleep(double seconds);

#endif
