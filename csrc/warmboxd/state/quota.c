/*
 * quota.c: what a team may keep on warmboxd's disk (state.h). Every copy a
 * snapshot, a fork or a pause makes is bounded twice: by the data
 * directory's free space (less --min-free-mb, checked before the copy and
 * held to while it runs) and by the team's stored bytes (its snapshots and
 * paused copies together, --max-state-mb), counted as the copy writes them;
 * a team also keeps at most --max-snapshots snapshots. Snapshots do not
 * expire (as E2B's: a snapshot is a template); deleting one gives its bytes
 * back.
 */
#include "state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

struct wbd_state_limits wbd_state_lim = {
  .max_snapshots = 100,
  .max_state_mb = 8192,
  .min_free_mb = 1024,
  .pause_workers = 4,
};

struct team_use {
  char team[64];
  long long bytes;       /* snapshots and paused copies, atomically */
  int snapshots;         /* under g_mu, those being taken included */
  struct team_use *next; /* never freed: wbd_copy.pool points into it */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct team_use *g_teams;

static struct team_use *use_locked(const char *team) {
  for (struct team_use *t = g_teams; t; t = t->next)
    if (strcmp(t->team, team) == 0) return t;
  struct team_use *t = calloc(1, sizeof *t);
  if (!t) abort();
  snprintf(t->team, sizeof t->team, "%s", team);
  t->next = g_teams;
  g_teams = t;
  return t;
}

int wbd_quota_begin(const char *team, int snapshot, struct wbd_copy *c) {
  long long limit = (long long)wbd_state_lim.max_state_mb << 20;
  pthread_mutex_lock(&g_mu);
  struct team_use *t = use_locked(team);
  int status = 0;
  if (snapshot && wbd_state_lim.max_snapshots > 0 && t->snapshots >= wbd_state_lim.max_snapshots) {
    status = 429;
    snprintf(c->msg, sizeof c->msg,
             "you have reached the maximum number of snapshots (%d) of your team: "
             "delete one (DELETE /templates/{id}) first",
             wbd_state_lim.max_snapshots);
  } else if (limit > 0 && __atomic_load_n(&t->bytes, __ATOMIC_RELAXED) >= limit) {
    status = 429;
    snprintf(c->msg, sizeof c->msg,
             "you have reached the storage limit of your team's snapshots and paused "
             "sandboxes (%d MB): delete a snapshot or kill a paused sandbox first",
             wbd_state_lim.max_state_mb);
  } else if (snapshot) {
    t->snapshots++;
  }
  pthread_mutex_unlock(&g_mu);
  if (status) return status;
  struct statvfs vfs;
  long long reserve = (long long)wbd_state_lim.min_free_mb << 20;
  long long avail = statvfs(wbd_opt.data_dir, &vfs) == 0 ? (long long)vfs.f_bavail * (long long)vfs.f_frsize : -1;
  if (avail >= 0 && avail <= reserve) {
    if (snapshot) wbd_quota_end(team, 1, 0);
    snprintf(c->msg, sizeof c->msg, "not enough disk space: %lld MB free in the data directory, %d MB are kept free",
             avail >> 20, wbd_state_lim.min_free_mb);
    return 507;
  }
  c->budget = avail >= 0 ? avail - reserve : -1;
  c->pool = &t->bytes;
  c->pool_limit = limit > 0 ? limit : -1;
  return 0;
}

void wbd_quota_end(const char *team, int snapshot, long long bytes) {
  pthread_mutex_lock(&g_mu);
  struct team_use *t = use_locked(team);
  if (snapshot && t->snapshots > 0) t->snapshots--;
  __atomic_sub_fetch(&t->bytes, bytes, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&g_mu);
}

void wbd_quota_add(const char *team, int snapshot, long long bytes) {
  pthread_mutex_lock(&g_mu);
  struct team_use *t = use_locked(team);
  if (snapshot) t->snapshots++;
  __atomic_add_fetch(&t->bytes, bytes, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&g_mu);
}

void wbd_quota_free_all(void) {
  pthread_mutex_lock(&g_mu);
  while (g_teams) {
    struct team_use *n = g_teams->next;
    free(g_teams);
    g_teams = n;
  }
  pthread_mutex_unlock(&g_mu);
}
