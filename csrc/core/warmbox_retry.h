/* warmbox_retry.h: the retry decision of warmbox.core's transport, one pure
 * function shared by h:request, h:batch and the engine (engine.c). It reads
 * only the facts it is given (no clock, no randomness, no libcurl), so the
 * rules can be tested on their own (core._retry_decide). */
#ifndef WARMBOX_RETRY_H
#define WARMBOX_RETRY_H
#include <lua.h>

typedef struct warmbox_retry_facts {
  int attempts; /* attempts made so far (>= 1) */
  int max_attempts;
  int idempotent;       /* GET/DELETE/HEAD, or retry.idempotent */
  int delivered;        /* stream frames already handed out: never re-sent */
  int local_failure;    /* aborted by the caller, out of memory, bad stream */
  int completed;        /* the attempt got a whole response (CURLE_OK) */
  long status;          /* its status, when completed */
  const long *statuses; /* retried statuses (idempotent requests) */
  int nstatuses;
  const long *refused; /* statuses that say the server did not act (E2B's
                        * 429 on create): retried for any request */
  int nrefused;
  double retry_after;     /* Retry-After in seconds, < 0 when absent/invalid */
  double retry_after_max; /* the longest Retry-After honoured (a longer one
                           * waits this long), < 0 for no cap */
  int connection_error;   /* the connection failed (refused, reset, cut...) */
  int before_send;        /* ... before any byte of the request was sent */
  int timed_out;          /* the attempt timed out */
  double base, cap;       /* backoff: base * 2^(attempts-1), capped */
  double budget;          /* seconds from the first attempt */
  double elapsed;         /* seconds since the first attempt */
  double jitter;          /* a random number in [0, 1) */
} warmbox_retry_facts;

/* Seconds to wait before the next attempt, or -1 for no retry. */
double warmbox_retry_decide(const warmbox_retry_facts *f);

#endif
