/*
 * persist.c: paused sandboxes outlive a restart of warmboxd. A pause writes
 * the record and a copy of the files to <data_dir>/.state/paused/<id>/
 * (record.json last, so a half-written one is recognised); a resume or a
 * kill forgets it. At start-up the records come back paused, without memory
 * (as after a filesystem-only pause: the next connect boots afresh on the
 * files), and what a killed warmboxd left behind is cleaned up first. A
 * graceful stop first pauses (files only) the running sandboxes whose
 * timeout would pause them.
 */
#include "state.h"
#include "jail.h"
#include "interp.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static int g_lock_fd = -1;

static const char *paused_dir(const char *id, char *buf, size_t len) {
  char top[PATH_MAX];
  if (!wbd_state_dir("paused", top, sizeof top)) return NULL;
  snprintf(buf, len, "%s/%s", top, id);
  return buf;
}

static json_t *record_json(const struct wbd_sandbox *sb) {
  return json_pack("{s:s, s:s, s:s, s:O, s:O, s:s, s:b, s:b, s:b, s:b, s:b, s:i, s:I, s:I}", "id", sb->id, "team",
                   sb->team, "templateID", sb->template_id ? sb->template_id : "", "metadata", sb->metadata, "envVars",
                   sb->env_vars, "envdAccessToken", sb->access_token, "secure", sb->secure, "allowInternet",
                   sb->allow_internet, "autoPause", sb->auto_pause, "autoPauseMemory", sb->auto_pause_memory,
                   "autoResume", sb->auto_resume, "timeout", sb->timeout_s, "startedAt", (json_int_t)sb->started_at_us,
                   "endAt", (json_int_t)sb->end_at_us);
}

/* The size a record carries (its source's, for a sandbox made from a
 * snapshot), else its template's. */
static void apply_size(struct wbd_sandbox *sb, json_t *o) {
  json_int_t cpu = json_integer_value(json_object_get(o, "cpuCount"));
  json_int_t mem = json_integer_value(json_object_get(o, "memoryMB"));
  if (cpu > 0 && cpu <= 1024) sb->cpu_count = (int)cpu;
  if (mem > 0 && mem < (1 << 20)) sb->memory_mb = (int)mem;
}

json_t *wbd_persist_record_json(const struct wbd_sandbox *sb) {
  json_t *o = record_json(sb);
  json_object_set_new(o, "cpuCount", json_integer(sb->cpu_count));
  json_object_set_new(o, "memoryMB", json_integer(sb->memory_mb));
  if (sb->traffic_token[0]) json_object_set_new(o, "trafficAccessToken", json_string(sb->traffic_token));
  return o;
}

static int valid_id(const char *s) {
  size_t n = strlen(s);
  if (n != 21 || s[0] != 'i') return 0;
  for (size_t i = 1; i < n; i++)
    if (!islower((unsigned char)s[i]) && !isdigit((unsigned char)s[i])) return 0;
  return 1;
}

int wbd_persist_record_apply(struct wbd_sandbox *sb, json_t *o, int identity) {
  const char *id, *team, *tmpl, *token;
  json_t *meta, *env;
  int secure, inet, ap, apm, ar, timeout;
  json_int_t started, end;
  if (json_unpack(o, "{s:s, s:s, s:s, s:o, s:o, s:s, s:b, s:b, s:b, s:b, s:b, s:i, s:I, s:I}", "id", &id, "team", &team,
                  "templateID", &tmpl, "metadata", &meta, "envVars", &env, "envdAccessToken", &token, "secure", &secure,
                  "allowInternet", &inet, "autoPause", &ap, "autoPauseMemory", &apm, "autoResume", &ar, "timeout",
                  &timeout, "startedAt", &started, "endAt", &end) != 0 ||
      !json_is_object(meta) || !json_is_object(env) || (identity && (!valid_id(id) || strlen(token) >= 72)))
    return -1;
  wbd_sandbox_set_template(sb, tmpl); /* and its size */
  apply_size(sb, o);
  json_object_update(sb->metadata, meta);
  json_object_update(sb->env_vars, env);
  sb->secure = secure;
  sb->allow_internet = inet;
  sb->auto_pause = ap;
  sb->auto_pause_memory = apm;
  sb->auto_resume = ar;
  sb->timeout_s = timeout;
  if (!identity && wbd_opt.secure_all) sb->secure = 1; /* a fork gets a token of its own */
  if (!sb->secure) sb->access_token[0] = 0;
  /* the traffic token: kept by a pause and a restart; a fork keeps the
   * private ingress with a token of its own (E2B's is derived from the id),
   * and so does a record whose token is too long: never public by mistake */
  const char *traffic = json_string_value(json_object_get(o, "trafficAccessToken"));
  sb->traffic_token[0] = 0;
  if (traffic && traffic[0] && identity && strlen(traffic) < sizeof sb->traffic_token)
    snprintf(sb->traffic_token, sizeof sb->traffic_token, "%s", traffic);
  else if (traffic && traffic[0])
    wbd_sandbox_traffic_token(sb);
  if (identity) {
    snprintf(sb->id, sizeof sb->id, "%s", id);
    snprintf(sb->team, sizeof sb->team, "%s", team);
    snprintf(sb->access_token, sizeof sb->access_token, "%s", token);
    sb->started_at_us = started;
    sb->end_at_us = end;
  }
  return 0;
}

/* The bytes a kept copy holds (its record's copyBytes), given back to its team. */
static void copy_release(const char *dir) {
  char path[PATH_MAX + 400];
  snprintf(path, sizeof path, "%s/record.json", dir);
  json_t *o = json_load_file(path, 0, NULL);
  const char *team = json_string_value(json_object_get(o, "team"));
  json_int_t n = json_integer_value(json_object_get(o, "copyBytes"));
  if (team && n > 0) wbd_quota_end(team, 0, n);
  json_decref(o);
}

/* The record and a copy of the files in .state/paused/<id>: 0, or the HTTP
 * status it fails with (msg says why). */
static int save_copy(struct wbd_sandbox *sb, char *msg, size_t len) {
  char dir[PATH_MAX + 64];
  if (!paused_dir(sb->id, dir, sizeof dir)) {
    snprintf(msg, len, "cannot make the state directory");
    return 500;
  }
  copy_release(dir);
  wbd_files_remove(dir);
  struct wbd_copy c = {.budget = -1, .pool_limit = -1};
  int status = wbd_quota_begin(sb->team, 0, &c);
  if (status) {
    snprintf(msg, len, "%s", c.msg);
    return status;
  }
  wbd_store_lock();
  json_t *rec = wbd_persist_record_json(sb);
  wbd_store_unlock();
  /* a paused sandbox's endAt is when it was paused (E2B's listing) */
  json_object_set_new(rec, "endAt", json_integer((json_int_t)wbd_now_us()));
  if (wbd_files_save(sb, dir, 0, &c) != 0) status = wbd_copy_status(&c);
  json_object_set_new(rec, "copyBytes", json_integer(c.bytes));
  if (!status && wbd_state_write_json(dir, "record.json", rec) != 0) {
    snprintf(c.msg, sizeof c.msg, "cannot write %.400s/record.json", dir);
    status = 500;
  } else if (status) {
    json_decref(rec);
  }
  if (status) {
    fprintf(stderr, "warmboxd: cannot keep the paused sandbox %s in %s: %s\n", sb->id, dir, c.msg);
    snprintf(msg, len, "cannot keep its files: %s", c.msg);
    wbd_quota_end(sb->team, 0, c.bytes);
    wbd_files_remove(dir);
  }
  return status;
}

int wbd_persist_save(struct wbd_sandbox *sb, char *msg, size_t len) {
  return wbd_opt.keep_state ? save_copy(sb, msg, len) : 0;
}

int wbd_persist_release(struct wbd_sandbox *sb) {
  /* with --data-dir wbd_persist_save made the copy already */
  char why[800];
  if (!wbd_opt.keep_state && save_copy(sb, why, sizeof why) != 0) return -1;
  return wbd_rt_release(sb);
}

int wbd_persist_restore(struct wbd_sandbox *sb) {
  wbd_store_lock();
  int on_disk = sb->files_on_disk;
  wbd_store_unlock();
  if (!on_disk) return 0;
  char dir[PATH_MAX + 64];
  if (!paused_dir(sb->id, dir, sizeof dir) || wbd_files_load(sb, dir) != 0) return -1;
  wbd_store_lock();
  sb->files_on_disk = 0;
  wbd_store_unlock();
  return 0;
}

static void *remove_main(void *arg) {
  wbd_files_remove(arg);
  free(arg);
  return NULL;
}

/* The copy is renamed out of the way at once (a resume does not wait for
 * it to be removed) and removed by a thread of its own. */
void wbd_persist_drop(struct wbd_sandbox *sb) {
  char dir[PATH_MAX + 64], trash[PATH_MAX], *gone;
  struct stat st;
  static long seq;
  if (!paused_dir(sb->id, dir, sizeof dir) || lstat(dir, &st) != 0) return;
  copy_release(dir);
  if (!wbd_state_dir("trash", trash, sizeof trash) ||
      asprintf(&gone, "%s/%s-%ld", trash, sb->id, __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED)) < 0) {
    wbd_files_remove(dir);
    return;
  }
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  if (rename(dir, gone) != 0) {
    wbd_files_remove(dir);
    free(gone);
  } else if (pthread_create(&t, &a, remove_main, gone) != 0) {
    remove_main(gone);
  }
  pthread_attr_destroy(&a);
}

/* One paused record back from dir/record.json, or the dir removed. */
static void load_one(const char *dir) {
  char path[PATH_MAX + 400];
  snprintf(path, sizeof path, "%s/record.json", dir);
  json_t *o = json_load_file(path, 0, NULL);
  struct wbd_sandbox *sb = o ? wbd_store_alloc("") : NULL;
  if (!sb || wbd_persist_record_apply(sb, o, 1) != 0) {
    fprintf(stderr, "warmboxd: dropping the incomplete paused sandbox in %s\n", dir);
    if (sb) wbd_store_discard(sb);
    json_decref(o);
    wbd_files_remove(dir);
    return;
  }
  json_int_t bytes = json_integer_value(json_object_get(o, "copyBytes"));
  json_decref(o);
  sb->state = WBD_PAUSED;
  sb->paused_with_memory = 0;
  sb->files_on_disk = 1;
  wbd_store_lock();
  int clash = wbd_store_lookup_locked(sb->id) != NULL;
  if (!clash) wbd_store_insert_locked(sb);
  wbd_store_unlock();
  if (clash)
    wbd_store_discard(sb);
  else if (bytes > 0)
    wbd_quota_add(sb->team, 0, bytes);
}

/* Sandbox directories (<data_dir>/r..., wbd_rt_name; <data_dir>/i... from
 * older servers) a killed warmboxd left: its runtimes, never anyone's state
 * (that is under .state). */
static void remove_stale_runtimes(void) {
  DIR *d = opendir(wbd_opt.data_dir);
  if (!d) return;
  struct dirent *e;
  char path[PATH_MAX + 300];
  while ((e = readdir(d)))
    if (valid_id(e->d_name) || wbd_rt_is_name(e->d_name)) {
      snprintf(path, sizeof path, "%s/%s", wbd_opt.data_dir, e->d_name);
      wbd_files_remove(path);
    }
  closedir(d);
}

static int lock_data_dir(void) {
  char top[PATH_MAX], path[PATH_MAX + 16];
  if (!wbd_state_dir("paused", top, sizeof top)) return -1;
  snprintf(path, sizeof path, "%s/.state/lock", wbd_opt.data_dir);
  g_lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (g_lock_fd < 0 || flock(g_lock_fd, LOCK_EX | LOCK_NB) != 0) {
    fprintf(stderr, "warmboxd: the data directory %s is in use by another warmboxd\n", wbd_opt.data_dir);
    return -1;
  }
  return 0;
}

int wbd_persist_load_all(void) {
  if (lock_data_dir() != 0) return -1;
  remove_stale_runtimes();
  char trash[PATH_MAX];
  if (wbd_state_dir("trash", trash, sizeof trash)) wbd_files_remove(trash);
  char top[PATH_MAX];
  if (!wbd_opt.keep_state || !wbd_state_dir("paused", top, sizeof top)) return 0;
  DIR *d = opendir(top);
  if (!d) return 0;
  struct dirent *e;
  long n = 0;
  char path[PATH_MAX + 300];
  while ((e = readdir(d)))
    if (valid_id(e->d_name)) {
      snprintf(path, sizeof path, "%s/%s", top, e->d_name);
      load_one(path);
      n++;
    }
  closedir(d);
  if (n && wbd_opt.verbose) fprintf(stderr, "warmboxd: %ld paused sandboxes back from %s\n", n, top);
  return 0;
}

void wbd_persist_close(void) {
  if (g_lock_fd >= 0) close(g_lock_fd);
  g_lock_fd = -1;
}

/* ------------------------------------------------------------------ */
/* A copy of a running sandbox (snapshots, forks)                      */
/* ------------------------------------------------------------------ */

int wbd_state_capture(const char *team, const char *id, const char *dir, int paused_status, json_t **rec,
                      struct wbd_copy *c) {
  wbd_store_lock();
  struct wbd_sandbox *sb = wbd_store_lookup_locked(id);
  if (!sb || sb->state == WBD_KILLED || strcmp(sb->team, team) != 0) {
    wbd_store_unlock();
    return 404;
  }
  if (WBD_REC(sb)->busy == WBD_BUSY_SNAPSHOT) {
    wbd_store_unlock();
    return 409;
  }
  wbd_store_ref_locked(sb);
  wbd_store_wait_idle_locked(sb);
  int rc = sb->state == WBD_KILLED ? 404 : sb->state == WBD_PAUSED ? paused_status : 0;
  if (rc == 0) {
    wbd_store_set_busy_locked(sb, WBD_BUSY_SNAPSHOT);
    /* envd's changes already under way end before the copy; new ones are refused */
    wbd_store_wait_changes_locked(sb);
    *rec = wbd_persist_record_json(sb);
  }
  wbd_store_unlock();
  if (rc == 0) wbd_sleep_ms(wbd_knob(&wbd_state_lim.copy_ms));
  char *dump = rc == 0 ? wbd_interp_dump(sb) : NULL;
  if (rc == 0 && wbd_files_save(sb, dir, 1, c) != 0) {
    rc = wbd_copy_status(c);
  } else if (rc == 0 && dump && wbd_state_write_json(dir, KERNEL_DUMP, json_loads(dump, 0, NULL)) != 0) {
    snprintf(c->msg, sizeof c->msg, "cannot write the python namespace");
    rc = 500;
  }
  if (rc != 0 && *rec) {
    json_decref(*rec);
    *rec = NULL;
  }
  free(dump);
  wbd_store_lock();
  if (WBD_REC(sb)->busy == WBD_BUSY_SNAPSHOT) wbd_store_set_busy_locked(sb, 0);
  wbd_store_unlock();
  wbd_sandbox_unref(sb);
  return rc;
}
