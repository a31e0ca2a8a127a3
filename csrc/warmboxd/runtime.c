/* Placeholder until the data plane lands: records only, no processes. */
#include "wbd.h"

int wbd_rt_init(void) { return 0; }

int wbd_rt_on_create(struct wbd_sandbox *sb) { (void)sb; return 0; }
int wbd_rt_on_pause(struct wbd_sandbox *sb, int memory) { (void)sb; (void)memory; return 0; }
int wbd_rt_on_resume(struct wbd_sandbox *sb) { (void)sb; return 0; }
void wbd_rt_on_kill(struct wbd_sandbox *sb) { (void)sb; }
void wbd_rt_shutdown(void) {}
