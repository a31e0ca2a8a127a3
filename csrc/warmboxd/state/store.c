/*
 * store.c: sandbox records. One mutex guards everything here; records are
 * found by id through a hash table and listed through a per-team array kept
 * in listing order, so a page is a binary search plus a short walk whatever
 * the total. Running records are also in a min-heap on their lease end, so
 * the lease timer finds the expired ones without scanning the others.
 */
#include "state.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

static pthread_mutex_t store_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t store_cv = PTHREAD_COND_INITIALIZER;

static struct wbd_rec **buckets;
static size_t nbuckets, nrecs;
static struct wbd_team *teams;
static long total_running, total_paused;

void wbd_store_lock(void) {
  pthread_mutex_lock(&store_mu);
}
void wbd_store_unlock(void) {
  pthread_mutex_unlock(&store_mu);
}

/* ------------------------------------------------------------------ */
/* Ids and tokens                                                      */
/* ------------------------------------------------------------------ */

static uint64_t hash_id(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 1099511628211ULL;
  }
  return h;
}

/* ------------------------------------------------------------------ */
/* Hash table                                                          */
/* ------------------------------------------------------------------ */

static void hash_grow(void) {
  size_t nb = nbuckets ? nbuckets * 2 : 1024;
  struct wbd_rec **nbk = calloc(nb, sizeof *nbk);
  if (!nbk) abort();
  for (size_t i = 0; i < nbuckets; i++) {
    struct wbd_rec *r = buckets[i];
    while (r) {
      struct wbd_rec *next = r->hnext;
      size_t k = hash_id(r->sb.id) & (nb - 1);
      r->hnext = nbk[k];
      nbk[k] = r;
      r = next;
    }
  }
  free(buckets);
  buckets = nbk;
  nbuckets = nb;
}

struct wbd_sandbox *wbd_store_lookup_locked(const char *id) {
  if (!nbuckets) return NULL;
  for (struct wbd_rec *r = buckets[hash_id(id) & (nbuckets - 1)]; r; r = r->hnext)
    if (strcmp(r->sb.id, id) == 0) return &r->sb;
  return NULL;
}

static void hash_add(struct wbd_rec *r) {
  if (nrecs + 1 > nbuckets) hash_grow();
  size_t k = hash_id(r->sb.id) & (nbuckets - 1);
  r->hnext = buckets[k];
  buckets[k] = r;
  nrecs++;
}

static void hash_del(struct wbd_rec *r) {
  struct wbd_rec **pp = &buckets[hash_id(r->sb.id) & (nbuckets - 1)];
  while (*pp && *pp != r) pp = &(*pp)->hnext;
  if (*pp) {
    *pp = r->hnext;
    nrecs--;
  }
  r->hnext = NULL;
}

/* ------------------------------------------------------------------ */
/* Teams and their ordered index                                       */
/* ------------------------------------------------------------------ */

struct wbd_team *wbd_store_teams_locked(void) {
  return teams;
}

struct wbd_team *wbd_store_team_locked(const char *name, int create) {
  for (struct wbd_team *t = teams; t; t = t->next)
    if (strcmp(t->name, name) == 0) return t;
  if (!create) return NULL;
  struct wbd_team *t = calloc(1, sizeof *t);
  if (!t) abort();
  snprintf(t->name, sizeof t->name, "%s", name);
  t->next = teams;
  teams = t;
  return t;
}

/* Asc listing order: startedAt ascending, then id descending (E2B's desc
 * order is startedAt desc, id asc, and asc is its exact reverse). */
static int key_cmp(int64_t sa, const char *ia, int64_t sb, const char *ib) {
  if (sa != sb) return sa < sb ? -1 : 1;
  return -strcmp(ia, ib);
}

size_t wbd_store_upper_locked(struct wbd_team *t, int64_t started_us, const char *id) {
  size_t lo = 0, hi = t->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (key_cmp(t->v[mid]->sb.started_at_us, t->v[mid]->sb.id, started_us, id) <= 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

size_t wbd_store_lower_locked(struct wbd_team *t, int64_t started_us, const char *id) {
  size_t lo = 0, hi = t->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (key_cmp(t->v[mid]->sb.started_at_us, t->v[mid]->sb.id, started_us, id) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void index_reserve(struct wbd_team *t, size_t extra) {
  if (t->n + extra <= t->cap) return;
  size_t nc = t->cap ? t->cap : 64;
  while (nc < t->n + extra) nc *= 2;
  struct wbd_rec **nv = realloc(t->v, nc * sizeof *nv);
  if (!nv) abort();
  t->v = nv;
  t->cap = nc;
}

static void index_add(struct wbd_team *t, struct wbd_rec *r) {
  index_reserve(t, 1);
  size_t pos = wbd_store_upper_locked(t, r->sb.started_at_us, r->sb.id);
  memmove(t->v + pos + 1, t->v + pos, (t->n - pos) * sizeof *t->v);
  t->v[pos] = r;
  t->n++;
}

static void index_del(struct wbd_team *t, struct wbd_rec *r) {
  size_t pos = wbd_store_lower_locked(t, r->sb.started_at_us, r->sb.id);
  if (pos < t->n && t->v[pos] == r) {
    memmove(t->v + pos, t->v + pos + 1, (t->n - pos - 1) * sizeof *t->v);
    t->n--;
  }
}

/* ------------------------------------------------------------------ */
/* The lease heap: every running record, by end_at_us                  */
/* ------------------------------------------------------------------ */

static struct wbd_rec **heap;
static size_t heap_n, heap_cap;

static int heap_less(size_t a, size_t b) {
  return heap[a]->sb.end_at_us < heap[b]->sb.end_at_us;
}

static void heap_swap(size_t a, size_t b) {
  struct wbd_rec *x = heap[a];
  heap[a] = heap[b];
  heap[b] = x;
  heap[a]->hidx = a + 1;
  heap[b]->hidx = b + 1;
}

static void heap_up(size_t i) {
  while (i && heap_less(i, (i - 1) / 2)) {
    heap_swap(i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
}

static void heap_down(size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < heap_n && heap_less(l, m)) m = l;
    if (r < heap_n && heap_less(r, m)) m = r;
    if (m == i) return;
    heap_swap(i, m);
    i = m;
  }
}

static void heap_push(struct wbd_rec *r) {
  if (r->hidx) return;
  if (heap_n == heap_cap) {
    size_t nc = heap_cap ? heap_cap * 2 : 256;
    struct wbd_rec **nh = realloc(heap, nc * sizeof *nh);
    if (!nh) abort();
    heap = nh;
    heap_cap = nc;
  }
  heap[heap_n] = r;
  r->hidx = ++heap_n;
  heap_up(heap_n - 1);
}

static void heap_remove(struct wbd_rec *r) {
  if (!r->hidx) return;
  size_t i = r->hidx - 1;
  r->hidx = 0;
  if (i != --heap_n) {
    heap[i] = heap[heap_n];
    heap[i]->hidx = i + 1;
    heap_up(i);
    heap_down(heap[i]->hidx - 1);
  }
}

void wbd_store_set_end_locked(struct wbd_sandbox *sb, int64_t end_at_us) {
  struct wbd_rec *r = WBD_REC(sb);
  sb->end_at_us = end_at_us;
  if (!r->hidx) return;
  heap_up(r->hidx - 1);
  heap_down(r->hidx - 1);
}

struct wbd_sandbox **wbd_store_expired_locked(int64_t now, size_t *n) {
  *n = 0;
  if (!heap_n || heap[0]->sb.end_at_us > now) return NULL;
  /* Depth-first over the part of the heap that ended: a node's children
   * end no earlier than it does, so the walk stops at the first live ones. */
  size_t sn = 0, scap = 64, cap = 0;
  size_t *stack = malloc(scap * sizeof *stack);
  struct wbd_sandbox **out = NULL;
  if (!stack) abort();
  stack[sn++] = 0;
  while (sn) {
    size_t i = stack[--sn];
    struct wbd_rec *r = heap[i];
    if (r->sb.end_at_us > now) continue;
    if (!r->busy) {
      if (*n == cap) {
        cap = cap ? cap * 2 : 64;
        struct wbd_sandbox **no = realloc(out, cap * sizeof *no);
        if (!no) abort();
        out = no;
      }
      r->sb.refcount++;
      out[(*n)++] = &r->sb;
    }
    for (size_t c = 2 * i + 1; c <= 2 * i + 2 && c < heap_n; c++) {
      if (sn == scap) {
        scap *= 2;
        size_t *ns = realloc(stack, scap * sizeof *ns);
        if (!ns) abort();
        stack = ns;
      }
      stack[sn++] = c;
    }
  }
  free(stack);
  return out;
}

/* ------------------------------------------------------------------ */
/* The signing index: the running records that have an access token   */
/* ------------------------------------------------------------------ */

static struct wbd_rec **signv;
static size_t sign_n, sign_cap;

static void sign_add(struct wbd_rec *r) {
  if (r->sidx || !r->sb.secure || !r->sb.access_token[0]) return;
  if (sign_n == sign_cap) {
    size_t nc = sign_cap ? sign_cap * 2 : 256;
    struct wbd_rec **nv = realloc(signv, nc * sizeof *nv);
    if (!nv) abort();
    signv = nv;
    sign_cap = nc;
  }
  signv[sign_n] = r;
  r->sidx = ++sign_n;
}

/* The last record takes the removed one's place. */
static void sign_del(struct wbd_rec *r) {
  if (!r->sidx) return;
  size_t i = r->sidx - 1;
  r->sidx = 0;
  if (i != --sign_n) {
    signv[i] = signv[sign_n];
    signv[i]->sidx = i + 1;
  }
}

int wbd_store_find_signed(int (*match)(const char *token, void *cls), void *cls, char *id, size_t idlen) {
  enum { BATCH = 256 };
  struct cand {
    char id[32];
    char token[72];
  };
  struct cand *c = malloc(BATCH * sizeof *c);
  if (!c) abort();
  int found = 0;
  wbd_store_lock();
  size_t pos = sign_n;
  wbd_store_unlock();
  /* From the end down: a removal moves the last record into the hole, so a
   * record not yet tested only ever moves to a place not yet reached. */
  while (pos > 0 && !found) {
    size_t n = 0;
    wbd_store_lock();
    if (pos > sign_n) pos = sign_n;
    while (pos > 0 && n < BATCH) {
      struct wbd_rec *r = signv[--pos];
      memcpy(c[n].id, r->sb.id, sizeof c[n].id);
      memcpy(c[n].token, r->sb.access_token, sizeof c[n].token);
      n++;
    }
    wbd_store_unlock();
    for (size_t i = 0; i < n && !found; i++) {
      if (!match(c[i].token, cls)) continue;
      snprintf(id, idlen, "%s", c[i].id);
      found = 1;
    }
  }
  explicit_bzero(c, BATCH * sizeof *c);
  free(c);
  return found;
}

static void (*leave_hook)(struct wbd_sandbox *sb);

void wbd_store_set_leave_hook(void (*hook)(struct wbd_sandbox *sb)) {
  wbd_store_lock();
  leave_hook = hook;
  wbd_store_unlock();
}

static void run_link(struct wbd_team *t, struct wbd_rec *r) {
  r->rprev = NULL;
  r->rnext = t->run_head;
  if (t->run_head) t->run_head->rprev = r;
  t->run_head = r;
  t->running++;
  total_running++;
  heap_push(r);
  sign_add(r);
}

static void run_unlink(struct wbd_team *t, struct wbd_rec *r) {
  if (r->rprev)
    r->rprev->rnext = r->rnext;
  else
    t->run_head = r->rnext;
  if (r->rnext) r->rnext->rprev = r->rprev;
  r->rprev = r->rnext = NULL;
  t->running--;
  total_running--;
  heap_remove(r);
  sign_del(r);
  if (leave_hook) leave_hook(&r->sb);
}

long wbd_store_rec_mb(const struct wbd_sandbox *sb) {
  return sb->memory_mb > 0 ? sb->memory_mb : WBD_MEMORY_MB;
}

/* What a record in its present state holds of its team's memory budget:
 * all of its size running, or paused with its runtime in RAM. */
static void count_held(struct wbd_team *t, struct wbd_rec *r, int add) {
  if (add) {
    int held = r->sb.state == WBD_RUNNING || (r->sb.state == WBD_PAUSED && r->sb.paused_ram);
    r->held_mb = held ? wbd_store_rec_mb(&r->sb) : 0;
    t->held_mb += r->held_mb;
  } else {
    t->held_mb -= r->held_mb;
    r->held_mb = 0;
  }
}

static void count_state(struct wbd_team *t, struct wbd_rec *r, int add) {
  count_held(t, r, add);
  if (r->sb.state == WBD_RUNNING) {
    if (add)
      run_link(t, r);
    else
      run_unlink(t, r);
  } else if (r->sb.state == WBD_PAUSED) {
    t->paused += add ? 1 : -1;
    total_paused += add ? 1 : -1;
  }
}

/* ------------------------------------------------------------------ */
/* Records                                                             */
/* ------------------------------------------------------------------ */

struct wbd_sandbox *wbd_store_alloc(const char *team) {
  static const char alnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  static const char hex[] = "0123456789abcdef";
  struct wbd_rec *r = calloc(1, sizeof *r);
  if (!r) abort();
  struct wbd_sandbox *sb = &r->sb;
  sb->id[0] = 'i';
  wbd_random_chars(sb->id + 1, 20, alnum, 36);
  snprintf(sb->team, sizeof sb->team, "%s", team);
  sb->metadata = json_object();
  sb->env_vars = json_object();
  memcpy(sb->access_token, "ea_", 3); /* token prefix; the rest random hex */
  wbd_random_chars(sb->access_token + 3, 64, hex, 16);
  sb->allow_internet = 1;
  sb->auto_pause_memory = 1;
  sb->paused_with_memory = 1;
  sb->refcount = 1;
  return sb;
}

void wbd_sandbox_traffic_token(struct wbd_sandbox *sb) {
  memcpy(sb->traffic_token, "ta_", 3);
  wbd_random_chars(sb->traffic_token + 3, 64, "0123456789abcdef", 16);
  sb->traffic_token[67] = 0;
}

static void rec_free(struct wbd_rec *r) {
  free(r->sb.template_id);
  free(r->sb.metrics);
  json_decref(r->sb.metadata);
  json_decref(r->sb.env_vars);
  free(r);
}

void wbd_store_discard(struct wbd_sandbox *sb) {
  rec_free(WBD_REC(sb));
}

void wbd_store_insert_locked(struct wbd_sandbox *sb) {
  struct wbd_rec *r = WBD_REC(sb);
  /* ids are random; a clash among 36^20 is a bug elsewhere, but be safe */
  while (wbd_store_lookup_locked(sb->id)) {
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    wbd_random_chars(sb->id + 1, 20, alnum, 36);
  }
  r->team = wbd_store_team_locked(sb->team, 1);
  hash_add(r);
  index_add(r->team, r);
  count_state(r->team, r, 1);
  r->indexed = 1;
}

static int rec_sort_cmp(const void *a, const void *b) {
  const struct wbd_rec *x = *(struct wbd_rec *const *)a, *y = *(struct wbd_rec *const *)b;
  return key_cmp(x->sb.started_at_us, x->sb.id, y->sb.started_at_us, y->sb.id);
}

void wbd_store_insert_many_locked(struct wbd_sandbox **v, size_t n) {
  if (!n) return;
  struct wbd_team *t = wbd_store_team_locked(v[0]->team, 1);
  index_reserve(t, n);
  for (size_t i = 0; i < n; i++) {
    struct wbd_rec *r = WBD_REC(v[i]);
    while (wbd_store_lookup_locked(r->sb.id)) {
      static const char alnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
      wbd_random_chars(r->sb.id + 1, 20, alnum, 36);
    }
    r->team = t;
    hash_add(r);
    t->v[t->n++] = r;
    count_state(t, r, 1);
    r->indexed = 1;
  }
  qsort(t->v, t->n, sizeof *t->v, rec_sort_cmp);
}

void wbd_store_remove_locked(struct wbd_sandbox *sb) {
  struct wbd_rec *r = WBD_REC(sb);
  if (!r->indexed) return;
  hash_del(r);
  index_del(r->team, r);
  count_state(r->team, r, 0);
  r->indexed = 0;
}

void wbd_store_update_locked(struct wbd_sandbox *sb, int64_t started_at_us, enum wbd_state st) {
  struct wbd_rec *r = WBD_REC(sb);
  if (!r->indexed) {
    sb->started_at_us = started_at_us;
    sb->state = st;
    return;
  }
  if (started_at_us != sb->started_at_us) {
    index_del(r->team, r);
    sb->started_at_us = started_at_us;
    index_add(r->team, r);
  }
  if (st != sb->state) {
    count_state(r->team, r, 0);
    sb->state = st;
    count_state(r->team, r, 1);
  }
}

void wbd_store_ref_locked(struct wbd_sandbox *sb) {
  sb->refcount++;
}

void wbd_store_unref_locked(struct wbd_sandbox *sb) {
  if (--sb->refcount == 0) {
    wbd_store_remove_locked(sb);
    rec_free(WBD_REC(sb));
  }
}

void wbd_store_wait_idle_locked(struct wbd_sandbox *sb) {
  while (WBD_REC(sb)->busy) pthread_cond_wait(&store_cv, &store_mu);
}

void wbd_store_set_busy_locked(struct wbd_sandbox *sb, int busy) {
  WBD_REC(sb)->busy = busy;
  if (!busy) pthread_cond_broadcast(&store_cv);
}

void wbd_store_set_paused_ram_locked(struct wbd_sandbox *sb, int in_ram) {
  struct wbd_rec *r = WBD_REC(sb);
  if (r->indexed) count_held(r->team, r, 0);
  sb->paused_ram = in_ram;
  if (r->indexed) count_held(r->team, r, 1);
}

int wbd_store_change_begin_locked(struct wbd_sandbox *sb) {
  struct wbd_rec *r = WBD_REC(sb);
  if (r->busy) return r->busy;
  if (sb->state != WBD_RUNNING) return -1;
  r->changing++;
  return 0;
}

void wbd_store_change_end_locked(struct wbd_sandbox *sb) {
  if (--WBD_REC(sb)->changing == 0) pthread_cond_broadcast(&store_cv);
}

void wbd_store_wait_changes_locked(struct wbd_sandbox *sb) {
  while (WBD_REC(sb)->changing) pthread_cond_wait(&store_cv, &store_mu);
}

void wbd_store_counts_locked(long *running, long *paused) {
  *running = total_running;
  *paused = total_paused;
}

struct wbd_sandbox *wbd_sandbox_get(const char *id) {
  wbd_store_lock();
  struct wbd_sandbox *sb = wbd_store_lookup_locked(id);
  if (sb && sb->state != WBD_KILLED)
    wbd_store_ref_locked(sb);
  else
    sb = NULL;
  wbd_store_unlock();
  return sb;
}

void wbd_sandbox_unref(struct wbd_sandbox *sb) {
  if (!sb) return;
  wbd_store_lock();
  wbd_store_unref_locked(sb);
  wbd_store_unlock();
}

/* ------------------------------------------------------------------ */
/* Shutdown                                                            */
/* ------------------------------------------------------------------ */

void wbd_store_free_all(void) {
  wbd_store_lock();
  while (teams) {
    struct wbd_team *t = teams;
    teams = t->next;
    for (size_t k = 0; k < t->n; k++) rec_free(t->v[k]);
    free(t->v);
    free(t);
  }
  free(buckets);
  buckets = NULL;
  nbuckets = nrecs = 0;
  free(heap);
  heap = NULL;
  heap_n = heap_cap = 0;
  free(signv);
  signv = NULL;
  sign_n = sign_cap = 0;
  total_running = total_paused = 0;
  wbd_store_unlock();
}

struct wbd_sandbox *wbd_store_team_ref(const char *team, const char *id) {
  wbd_store_lock();
  struct wbd_sandbox *sb = wbd_store_lookup_locked(id);
  if (sb && (sb->state == WBD_KILLED || strcmp(sb->team, team) != 0)) sb = NULL;
  if (sb) wbd_store_ref_locked(sb);
  wbd_store_unlock();
  return sb;
}
