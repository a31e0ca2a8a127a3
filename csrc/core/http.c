/* Placeholder: the libcurl transport lands here. */
#include "warmbox_core.h"
void warmbox_http_register(lua_State *L) { (void)L; }
