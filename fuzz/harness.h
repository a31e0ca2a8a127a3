/*
 * harness.h: what the libFuzzer targets share. The HTTP targets run
 * warmboxd's own server (server.c, control.c, list.c, knobs.c, store.c,
 * envd.c) in-process on a loopback port, with the runtime stubbed
 * (stubs.c): no sandbox process is ever started, envd's files live in a
 * scratch directory.
 */
#ifndef WBD_FUZZ_HARNESS_H
#define WBD_FUZZ_HARNESS_H

#include <stddef.h>

#define FUZZ_ADMIN_TOKEN "fuzz-admin-token-0123456789abcdef"
#define FUZZ_API_KEY     "e2b_0123456789abcdef0123456789abcdef01234567"

/* Sets warmboxd's options as the targets want them (stubs.c). */
void fuzz_options(void);
/* Starts the server once (idempotent); returns its port. */
int fuzz_server(void);
/* The id of a sandbox record that exists (created at start, not secure). */
const char *fuzz_sandbox_id(void);
/* Sends prefix + data to the server over a fresh loopback connection, half
 * closes it, and reads the answer until the server closes (bounded). */
void fuzz_send(const char *prefix, size_t plen, const unsigned char *data, size_t len);

#endif
