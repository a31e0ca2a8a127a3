/* Placeholder until the control plane lands. */
#include "wbd.h"
#include <stdio.h>
int main(void) { puts("warmboxd " WARMBOX_VERSION ": not implemented yet"); return 1; }
