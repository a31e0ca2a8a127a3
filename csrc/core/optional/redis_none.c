/* redis_none.c: stands in for redis.c when warmbox.core is built without
 * hiredis (CMake's WARMBOX_REDIS=OFF, or hiredis not found). The module then
 * has no `redis` function, and lua/warmbox/lock/redis.lua (the Redis backend) answers
 * that it is not built. */
#include "warmbox_core.h"

void warmbox_redis_register(lua_State *L) {
  (void)L;
}
