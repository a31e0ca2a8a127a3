/*
 * config.c: warmboxd's settings, a leaf every layer reads: the command
 * line's options and limits (filled in by main.c before the server starts)
 * and the run-time knobs the admin API changes (knobs.c). Defining them
 * here rather than in main.c keeps every other file from calling up into
 * the top of the program.
 */
#include "wbd.h"

#include <stdlib.h>
#include <string.h>

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
  .max_team_memory_mb = -1, /* main.c: the host's memory */
  .max_streams = 64,
};

struct wbd_limits wbd_lim = {
  .admin_token = NULL,
  .conn_timeout_s = 30,
  .max_conns = 1024,
  .max_conns_per_ip = 128,
  .max_upload_mb = 100,
  .body_timeout_s = 120,
  .max_spool_mb = 1024,
};

/* POST /_warmboxd/config {"loose_metadata": true}: read with wbd_knob(). */
int wbd_loose_metadata;

/* Templates by size: E2B's code-interpreter template is built with
 * cpu_count=2, memory_mb=2048 (e2b-dev/code-interpreter template/build_prod.py);
 * E2B's default for a template is 2 vCPU and 512 MB. */
static const struct {
  const char *id;
  int cpu_count, memory_mb;
} template_sizes[] = {
  {"code-interpreter-v1", 2, 2048},
  {"code-interpreter", 2, 2048},
};

void wbd_sandbox_set_template(struct wbd_sandbox *sb, const char *template_id) {
  free(sb->template_id);
  sb->template_id = strdup(template_id);
  if (!sb->template_id) abort();
  sb->cpu_count = WBD_CPU_COUNT;
  sb->memory_mb = WBD_MEMORY_MB;
  for (size_t i = 0; i < sizeof template_sizes / sizeof *template_sizes; i++)
    if (strcmp(template_id, template_sizes[i].id) == 0) {
      sb->cpu_count = template_sizes[i].cpu_count;
      sb->memory_mb = template_sizes[i].memory_mb;
    }
  const char *e = getenv("WARMBOXD_MEMORY_MB");
  if (e && atol(e) > 0 && atol(e) < (1L << 20)) sb->memory_mb = (int)atol(e);
}
