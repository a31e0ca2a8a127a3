/* Placeholder: the lock primitives land here. */
#include "warmbox_core.h"
void warmbox_lock_register(lua_State *L) { (void)L; }
