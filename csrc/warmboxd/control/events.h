/*
 * events.h: E2B's sandbox lifecycle events (events.c) and the webhooks that
 * deliver them (webhooks.c).
 *
 *   events.c    records one event per lifecycle change (the control plane's
 *               hooks call wbd_event_locked under the store lock), keeps them
 *               (memory, and <data_dir>/.state/events/ with --data-dir) for
 *               the retention, serves GET /events/sandboxes[/{id}] and routes
 *               /events/webhooks* to webhooks.c, in front of main.c's table
 *   webhooks.c  POST/GET/PATCH/DELETE /events/webhooks[/{id}] and one
 *               delivery thread: signed POSTs (libcurl) to loopback URLs,
 *               retried, optionally duplicated (a knob)
 *
 * Lock order: the store lock, then the events lock, then the webhooks lock;
 * none of these files takes the store lock.
 */
#ifndef WBD_EVENTS_H
#define WBD_EVENTS_H

#include "wbd.h"

enum wbd_event_type {
  WBD_EV_CREATED = 0,
  WBD_EV_KILLED,
  WBD_EV_PAUSED,
  WBD_EV_RESUMED,
  WBD_EV_UPDATED,
  WBD_EV_CHECKPOINTED,
};

/* Records an event of sb, which the caller holds the store lock on, at
 * at_us (0: now). Call it before a pause or kill changes sb's state: a
 * paused or killed event of a running sandbox carries its execution
 * (started_at, vcpu_count, memory_mb, execution_time up to at_us); an
 * updated event carries set_timeout (sb's lease end). */
void wbd_event_locked(const struct wbd_sandbox *sb, enum wbd_event_type type, int64_t at_us);

/* Start-up (after the data directory is taken) and the end (after the last
 * lifecycle change). 0 or -1. */
int wbd_events_start(void);
void wbd_events_stop(void);

/* main.c's route table: these routes in front of `next`'s. */
const char *wbd_events_route(const char *method, const char *path);
enum MHD_Result wbd_events_control(struct wbd_req *req, const char *route);

/* Knobs (POST /_warmboxd/config, read atomically): the pause between two
 * attempts of a delivery (ms, E2B's 10 s), how many retries after the first
 * attempt (E2B's 3), and whether each delivery that succeeded is sent once
 * more (E2B warns that an event may arrive twice). */
extern int wbd_webhook_retry_ms, wbd_webhook_retries, wbd_webhook_duplicates;
/* Event retention in days (E2B's default 7). */
extern int wbd_events_ttl_days;

/* ---- webhooks.c (events.c calls these) ---- */
int wbd_webhooks_start(void);
void wbd_webhooks_stop(void);
/* Queues the event (its API JSON, borrowed) for the team's webhooks that
 * want its type. Takes the webhooks lock only. */
void wbd_webhooks_publish(const char *team, const char *type, json_t *event);
enum MHD_Result wbd_webhooks_handle(struct wbd_req *req, const char *team);
/* A UUID string (36 chars + NUL): random, or derived from `seed`. */
void wbd_uuid_random(char out[37]);
void wbd_uuid_of(const char *kind, const char *seed, char out[37]);

#endif
