/*
 * snapshot.c: E2B's persistent snapshots. POST /sandboxes/{id}/snapshots
 * holds the running sandbox's processes still while its files are copied
 * to <data_dir>/.state/snapshots/<templateID>/ (it keeps running, with its
 * id and lease); GET /snapshots lists a team's (filters sandboxID and name,
 * pages with X-Next-Token); DELETE /templates/{id} deletes one; POST
 * /sandboxes with templateID = a snapshot's id or name starts a sandbox on
 * its files, and the source's size (cpuCount, memoryMB). Snapshots do not
 * expire (E2B's default) unless --snapshot-max-age says so: then one older
 * is deleted (its files, its place in the quota) when a snapshot call next
 * looks at the list. They outlive their sandbox and (with --data-dir) a
 * restart; a team keeps at most --max-snapshots of them, their bytes
 * counted toward its --max-state-mb (quota.c). Process memory is not in
 * them, the python namespace is (serialised): see state.h.
 */
#include "state.h"
#include "util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TAG_DEFAULT "default"

struct wbd_snapshot {
  char tid[32]; /* its template id: "s" + 20 [a-z0-9] */
  char team[64];
  char sandbox_id[32]; /* the sandbox it was taken from */
  char name[129];      /* "" when unnamed */
  char tag[65];
  char *template_id; /* the source sandbox's template */
  json_t *env;       /* the source's envVars */
  int64_t created_us;
  long long bytes;          /* what its copy holds (the team's quota) */
  int cpu_count, memory_mb; /* the source's size */
  int refs;                 /* under g_mu; the list holds one */
  int deleted;
  char dir[PATH_MAX + 400];
  struct wbd_snapshot *next;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct wbd_snapshot *g_list; /* newest first */

/* ------------------------------------------------------------------ */
/* Records                                                             */
/* ------------------------------------------------------------------ */

static void snap_free(struct wbd_snapshot *s) {
  if (s->deleted) {
    wbd_files_remove(s->dir);
    wbd_quota_end(s->team, 1, s->bytes);
  }
  free(s->template_id);
  json_decref(s->env);
  free(s);
}

void wbd_snapshot_put(struct wbd_snapshot *s) {
  if (!s) return;
  pthread_mutex_lock(&g_mu);
  int last = --s->refs == 0;
  pthread_mutex_unlock(&g_mu);
  if (last) snap_free(s);
}

const char *wbd_snapshot_template(const struct wbd_snapshot *s) {
  return s->tid;
}
void wbd_snapshot_env(const struct wbd_snapshot *s, json_t *env) {
  json_object_update(env, s->env);
}
void wbd_snapshot_size(const struct wbd_snapshot *s, struct wbd_sandbox *sb) {
  if (s->cpu_count > 0) sb->cpu_count = s->cpu_count;
  if (s->memory_mb > 0) sb->memory_mb = s->memory_mb;
}
int wbd_snapshot_fill(struct wbd_sandbox *sb, void *cls) {
  return wbd_files_load(sb, ((struct wbd_snapshot *)cls)->dir);
}

/* "base[:tag]" split; 0, or -1 when a part is empty or too long. */
static int split_ref(const char *ref, char *base, size_t blen, char *tag, size_t tlen) {
  const char *colon = strrchr(ref, ':');
  size_t n = colon ? (size_t)(colon - ref) : strlen(ref);
  if (n == 0 || n >= blen || (colon && (!colon[1] || strlen(colon + 1) >= tlen))) return -1;
  memcpy(base, ref, n);
  base[n] = 0;
  snprintf(tag, tlen, "%s", colon ? colon + 1 : TAG_DEFAULT);
  return 0;
}

static int snap_matches(const struct wbd_snapshot *s, const char *base, const char *tag) {
  if (strcmp(s->tid, base) == 0) return strcmp(tag, TAG_DEFAULT) == 0 || strcmp(tag, s->tag) == 0;
  return s->name[0] && strcmp(s->name, base) == 0 && strcmp(s->tag, tag) == 0;
}

/* Under g_mu: unlinks the snapshots older than --snapshot-max-age (by the
 * server's clock) and returns them, for put_expired once g_mu is released. */
static struct wbd_snapshot *expire_locked(void) {
  if (wbd_state_lim.snapshot_max_age_s <= 0) return NULL;
  int64_t cut = wbd_now_us() - (int64_t)wbd_state_lim.snapshot_max_age_s * 1000000;
  struct wbd_snapshot *gone = NULL, **pp = &g_list;
  while (*pp) {
    struct wbd_snapshot *s = *pp;
    if (s->created_us >= cut) {
      pp = &s->next;
      continue;
    }
    *pp = s->next;
    s->deleted = 1;
    s->next = gone;
    gone = s;
  }
  return gone;
}

/* The list's references of expired snapshots: the files go with the last. */
static void put_expired(struct wbd_snapshot *gone) {
  while (gone) {
    struct wbd_snapshot *n = gone->next;
    wbd_snapshot_put(gone);
    gone = n;
  }
}

static void expire(void) {
  pthread_mutex_lock(&g_mu);
  struct wbd_snapshot *gone = expire_locked();
  pthread_mutex_unlock(&g_mu);
  put_expired(gone);
}

/* Under g_mu. */
static struct wbd_snapshot *find_locked(const char *team, const char *ref) {
  char base[160], tag[80];
  if (split_ref(ref, base, sizeof base, tag, sizeof tag) != 0) return NULL;
  for (struct wbd_snapshot *s = g_list; s; s = s->next)
    if (strcmp(s->team, team) == 0 && snap_matches(s, base, tag)) return s;
  return NULL;
}

struct wbd_snapshot *wbd_snapshot_get(const char *team, const char *ref) {
  expire();
  pthread_mutex_lock(&g_mu);
  struct wbd_snapshot *s = find_locked(team, ref);
  if (s) s->refs++;
  pthread_mutex_unlock(&g_mu);
  return s;
}

static void snapshot_id(const struct wbd_snapshot *s, char *buf, size_t len) {
  snprintf(buf, len, "%s:%s", s->name[0] ? s->name : s->tid, s->tag);
}

static json_t *info_json(const struct wbd_snapshot *s) {
  char id[256];
  snapshot_id(s, id, sizeof id);
  json_t *names = json_array();
  if (s->name[0]) json_array_append_new(names, json_string(id));
  return json_pack("{s:s, s:o}", "snapshotID", id, "names", names);
}

static json_t *snap_json(const struct wbd_snapshot *s) {
  return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:O, s:I, s:I, s:i, s:i}", "templateID", s->tid, "team", s->team,
                   "sandboxID", s->sandbox_id, "name", s->name, "tag", s->tag, "sourceTemplateID", s->template_id,
                   "envVars", s->env, "createdAt", (json_int_t)s->created_us, "bytes", (json_int_t)s->bytes, "cpuCount",
                   s->cpu_count, "memoryMB", s->memory_mb);
}

/* Adds s (one reference: the list's) newest first; a name it takes from an
 * older snapshot is that one's no more (E2B: a new build of the template). */
static void list_add(struct wbd_snapshot *s) {
  pthread_mutex_lock(&g_mu);
  for (struct wbd_snapshot *o = g_list; o && s->name[0]; o = o->next)
    if (strcmp(o->team, s->team) == 0 && strcmp(o->name, s->name) == 0 && strcmp(o->tag, s->tag) == 0) {
      o->name[0] = 0;
      snprintf(o->tag, sizeof o->tag, "%s", TAG_DEFAULT);
      wbd_state_write_json(o->dir, "snapshot.json", snap_json(o));
    }
  struct wbd_snapshot **pp = &g_list;
  while (*pp &&
         ((*pp)->created_us > s->created_us || ((*pp)->created_us == s->created_us && strcmp((*pp)->tid, s->tid) > 0)))
    pp = &(*pp)->next;
  s->next = *pp;
  *pp = s;
  pthread_mutex_unlock(&g_mu);
}

static struct wbd_snapshot *snap_new(const char *team) {
  static const char alnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  struct wbd_snapshot *s = calloc(1, sizeof *s);
  if (!s) abort();
  s->tid[0] = 's';
  wbd_random_chars(s->tid + 1, 20, alnum, 36);
  snprintf(s->team, sizeof s->team, "%s", team);
  snprintf(s->tag, sizeof s->tag, "%s", TAG_DEFAULT);
  s->refs = 1;
  char top[PATH_MAX];
  if (wbd_state_dir("snapshots", top, sizeof top)) snprintf(s->dir, sizeof s->dir, "%s/%s", top, s->tid);
  return s;
}

/* ------------------------------------------------------------------ */
/* Taking one                                                          */
/* ------------------------------------------------------------------ */

int wbd_snapshot_take(const char *team, const char *id, const char *name, struct wbd_snapshot **out, char *msg,
                      size_t len) {
  expire(); /* expired ones count toward no quota */
  struct wbd_snapshot *s = snap_new(team);
  json_t *rec = NULL;
  struct wbd_copy c = {.budget = -1, .pool_limit = -1};
  int rc = s->dir[0] ? wbd_quota_begin(team, 1, &c) : 500;
  if (rc != 0) {
    snprintf(msg, len, "%s", s->dir[0] ? c.msg : "cannot make the state directory");
    free(s);
    return rc;
  }
  rc = wbd_state_capture(team, id, s->dir, 404, &rec, &c);
  s->bytes = c.bytes;
  if (rc == 0) {
    if (name) split_ref(name, s->name, sizeof s->name, s->tag, sizeof s->tag);
    snprintf(s->sandbox_id, sizeof s->sandbox_id, "%s", id);
    s->template_id = strdup(json_string_value(json_object_get(rec, "templateID")));
    s->env = json_incref(json_object_get(rec, "envVars"));
    s->cpu_count = (int)json_integer_value(json_object_get(rec, "cpuCount"));
    s->memory_mb = (int)json_integer_value(json_object_get(rec, "memoryMB"));
    s->created_us = wbd_now_us();
    if (wbd_state_write_json(s->dir, "snapshot.json", snap_json(s)) != 0) {
      snprintf(c.msg, sizeof c.msg, "cannot write its record");
      rc = 500;
    }
  }
  json_decref(rec);
  if (rc != 0) {
    snprintf(msg, len, "%s", c.msg);
    s->deleted = 1; /* its files and its place in the quota go */
    snap_free(s);
    return rc;
  }
  s->refs++;
  list_add(s);
  *out = s;
  return 0;
}

/* ------------------------------------------------------------------ */
/* On disk                                                             */
/* ------------------------------------------------------------------ */

static void load_one(const char *dir, const char *tid) {
  char path[PATH_MAX + 400];
  snprintf(path, sizeof path, "%s/snapshot.json", dir);
  json_t *o = json_load_file(path, 0, NULL);
  const char *t, *team, *sid, *name, *tag, *src;
  json_t *env;
  json_int_t created;
  if (!o ||
      json_unpack(o, "{s:s, s:s, s:s, s:s, s:s, s:s, s:o, s:I}", "templateID", &t, "team", &team, "sandboxID", &sid,
                  "name", &name, "tag", &tag, "sourceTemplateID", &src, "envVars", &env, "createdAt", &created) != 0 ||
      strcmp(t, tid) != 0 || !json_is_object(env)) {
    fprintf(stderr, "warmboxd: dropping the incomplete snapshot in %s\n", dir);
    json_decref(o);
    wbd_files_remove(dir);
    return;
  }
  struct wbd_snapshot *s = snap_new(team);
  snprintf(s->tid, sizeof s->tid, "%s", t);
  snprintf(s->dir, sizeof s->dir, "%s", dir);
  snprintf(s->sandbox_id, sizeof s->sandbox_id, "%s", sid);
  snprintf(s->name, sizeof s->name, "%s", name);
  snprintf(s->tag, sizeof s->tag, "%s", tag);
  s->template_id = strdup(src);
  s->env = json_incref(env);
  s->created_us = created;
  s->bytes = json_integer_value(json_object_get(o, "bytes"));
  s->cpu_count = (int)json_integer_value(json_object_get(o, "cpuCount"));
  s->memory_mb = (int)json_integer_value(json_object_get(o, "memoryMB"));
  json_decref(o);
  wbd_quota_add(s->team, 1, s->bytes);
  list_add(s);
}

void wbd_snapshot_load_all(void) {
  char top[PATH_MAX];
  if (!wbd_opt.keep_state || !wbd_state_dir("snapshots", top, sizeof top)) return;
  DIR *d = opendir(top);
  if (!d) return;
  struct dirent *e;
  char path[PATH_MAX + 300];
  while ((e = readdir(d)))
    if (e->d_name[0] == 's' && strlen(e->d_name) == 21) {
      snprintf(path, sizeof path, "%s/%s", top, e->d_name);
      load_one(path, e->d_name);
    }
  closedir(d);
}

void wbd_snapshot_free_all(void) {
  pthread_mutex_lock(&g_mu);
  struct wbd_snapshot *s = g_list;
  g_list = NULL;
  pthread_mutex_unlock(&g_mu);
  while (s) {
    struct wbd_snapshot *next = s->next;
    wbd_snapshot_put(s);
    s = next;
  }
}

/* ------------------------------------------------------------------ */
/* Listing and deleting (snapshot_api.c answers the requests)          */
/* ------------------------------------------------------------------ */

json_t *wbd_snapshot_info(struct wbd_snapshot *s) {
  pthread_mutex_lock(&g_mu);
  json_t *o = info_json(s);
  pthread_mutex_unlock(&g_mu);
  return o;
}

json_t *wbd_snapshot_page(const char *team, const char *sid, const char *name, long long after_us, const char *after_id,
                          long limit, char *next, size_t nlen) {
  char base[160], tag[80];
  json_t *arr = json_array();
  next[0] = 0;
  if (name && split_ref(name, base, sizeof base, tag, sizeof tag) != 0) return arr;
  char last[80] = "";
  expire();
  pthread_mutex_lock(&g_mu);
  for (struct wbd_snapshot *s = g_list; s; s = s->next) {
    if (strcmp(s->team, team) != 0 || (sid && strcmp(s->sandbox_id, sid) != 0)) continue;
    if (name && !snap_matches(s, base, tag)) continue;
    if (after_id && (s->created_us > after_us || (s->created_us == after_us && strcmp(s->tid, after_id) >= 0)))
      continue;
    if ((long)json_array_size(arr) == limit) {
      snprintf(next, nlen, "%s", last); /* one more exists */
      break;
    }
    json_array_append_new(arr, info_json(s));
    snprintf(last, sizeof last, "%lld.%s", (long long)s->created_us, s->tid);
  }
  pthread_mutex_unlock(&g_mu);
  return arr;
}

int wbd_snapshot_delete(const char *team, const char *ref) {
  expire();
  pthread_mutex_lock(&g_mu);
  struct wbd_snapshot *s = find_locked(team, ref), **pp = &g_list;
  if (s) {
    while (*pp != s) pp = &(*pp)->next;
    *pp = s->next;
    s->deleted = 1;
  }
  pthread_mutex_unlock(&g_mu);
  if (!s) return -1;
  wbd_snapshot_put(s); /* the list's reference: the files go with the last one */
  return 0;
}

int wbd_snapshot_name_ok(const char *n) {
  if (!*n || strlen(n) > 128 + 1 + 64) return 0;
  const char *colon = strchr(n, ':');
  if (colon && strchr(colon + 1, ':')) return 0;
  for (const char *p = n; *p; p++)
    if (!isalnum((unsigned char)*p) && !strchr("-_.:", *p)) return 0;
  char base[160], tag[80];
  return split_ref(n, base, sizeof base, tag, sizeof tag) == 0 && strlen(base) <= 128 && strlen(tag) <= 64;
}
