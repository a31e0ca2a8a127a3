/* warmbox_http.h: what http.c lends the engine (engine.c): a request table
 * turned into a libcurl easy handle with the same rules as h:request
 * (headers, body, timeouts, secrets scrubbing, stream framing, retries), on
 * the client's connection pool. Plain C apart from the Lua-facing calls,
 * which must not run while libcurl is on the C stack. */
#ifndef WARMBOX_HTTP_H
#define WARMBOX_HTTP_H
#include <stddef.h>
#include <curl/curl.h>
#include <lua.h>
#include "warmbox_stream.h"

#define WARMBOX_HTTP_MT "warmbox.Http"

typedef struct warmbox_http warmbox_http;
typedef struct warmbox_xfer warmbox_xfer;

/* How warmbox_http_check_request treats `stream` / `on_chunk`. */
enum { WARMBOX_REQ_BATCH = 0, WARMBOX_REQ_CALLBACK = 1, WARMBOX_REQ_FRAMES = 2 };

/* The open client at idx (raises when it is not one, or closed). */
warmbox_http *warmbox_http_check(lua_State *L, int idx);
/* Raises on a malformed request table; allocates nothing. */
void warmbox_http_check_request(lua_State *L, int idx, int mode);

/* A transfer on its own easy handle that shares h's pool (NULL when out of
 * memory). The share stays alive until warmbox_xfer_destroy, even across
 * h:close(). */
warmbox_xfer *warmbox_xfer_new(warmbox_http *h);
/* Sets it up for the validated request at idx (may raise on a Lua memory
 * error: keep x where a finalizer destroys it first); stream frames go to
 * sink(owner, ...). Nonzero when the handle could not be set up (then
 * warmbox_xfer_push_outcome reports it). */
int warmbox_xfer_setup(lua_State *L, int idx, warmbox_xfer *x, warmbox_frame_fn sink, void *owner);
CURL *warmbox_xfer_easy(warmbox_xfer *x);
/* Before each attempt: clears the last response, counts the attempt. */
void warmbox_xfer_begin(warmbox_xfer *x);
/* After each attempt: its result, status, connections; flushes the stream. */
void warmbox_xfer_end(warmbox_xfer *x, CURLcode rc);
/* Seconds before the next attempt, or -1 for none (retry.c's rules). */
double warmbox_xfer_retry_delay(warmbox_xfer *x);
/* The write callback h:request uses (collect the body or split frames). */
size_t warmbox_xfer_write(char *p, size_t size, size_t n, void *x);
/* This attempt's response is a 2xx streamed body being split into frames. */
int warmbox_xfer_streaming(const warmbox_xfer *x);
/* res, or nil, msg, code: exactly what h:request returns. */
int warmbox_xfer_push_outcome(lua_State *L, warmbox_xfer *x);
/* nil, "<what> (METHOD url, attempt n)" (secrets scrubbed), code. */
int warmbox_xfer_push_error(lua_State *L, warmbox_xfer *x, const char *what, const char *code);
void warmbox_xfer_destroy(warmbox_xfer *x);

#endif
