/*
 * config.c: warmboxd's settings, a leaf every layer reads: the command
 * line's options and limits (filled in by main.c before the server starts)
 * and the run-time knobs the admin API changes (knobs.c). Defining them
 * here rather than in main.c keeps every other file from calling up into
 * the top of the program.
 */
#include "wbd_int.h"

struct wbd_options wbd_opt = {
  .host = "127.0.0.1",
  .port = 0,
  .api_key = NULL,
  .max_length_hours = 24,
  .max_running = 20,
  .default_timeout_s = 15,
  .data_dir = NULL,
  .max_list_entries = 50000,
  .max_contexts = 128,
};

struct wbd_limits wbd_lim = {
  .admin_token = NULL,
  .conn_timeout_s = 30,
  .max_conns = 1024,
  .max_conns_per_ip = 128,
  .max_upload_mb = 100,
  .body_timeout_s = 120,
};

/* POST /_warmboxd/config {"loose_metadata": true}: read with wbd_knob(). */
int wbd_loose_metadata;
