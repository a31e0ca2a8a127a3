/*
 * webhooks.c: E2B's lifecycle webhooks (control.h's events section). Registration as
 * E2B's API has it (POST /events/webhooks {name, url, enabled, events,
 * signatureSecret} -> 201; GET list; GET/PATCH/DELETE /events/webhooks/{id}),
 * loopback URLs only (http(s) to 127.0.0.0/8, ::1 or localhost: warmboxd
 * never sends a tenant's events off the machine). One delivery thread POSTs
 * each event's JSON with libcurl, with E2B's headers: e2b-webhook-id,
 * e2b-delivery-id (one per attempt), e2b-signature-version "v1" and
 * e2b-signature = unpadded URL-safe base64 of SHA-256(secret + body). A
 * delivery that does not answer 2xx within 5 s is retried
 * wbd_webhook_retries times, wbd_webhook_retry_ms apart; with
 * wbd_webhook_duplicates each delivered event is sent once more (E2B warns
 * that one may arrive twice); at most 10000 deliveries wait (more are
 * dropped and counted: webhook_dropped). Webhooks are kept in
 * <data_dir>/.state/events/webhooks.json with --data-dir.
 */
#include "control.h"
#include "state.h"
#include "util.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int wbd_webhook_retry_ms = 10000, wbd_webhook_retries = 3, wbd_webhook_duplicates = 0;

#define MAX_WEBHOOKS 100   /* per team */
#define MAX_QUEUED   10000 /* deliveries waiting (a receiver that never answers cannot grow memory without bound) */
#define ALL_TYPES    0x3fu

static const char *const type_names[] = {
  "sandbox.lifecycle.created", "sandbox.lifecycle.killed",  "sandbox.lifecycle.paused",
  "sandbox.lifecycle.resumed", "sandbox.lifecycle.updated", "sandbox.lifecycle.checkpointed",
};
#define N_TYPES (sizeof type_names / sizeof *type_names)

struct webhook {
  char id[37];
  char team[64];
  char *name, *url, *secret;
  int enabled;
  unsigned types;
  int64_t created_us;
  struct webhook *next;
};

struct delivery {
  char wid[37];
  char *url, *secret, *body;
  int attempt, dup;
  int64_t due_ms;
  struct delivery *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct webhook *hooks;
static struct delivery *queue; /* by due_ms */
static size_t queued;
static pthread_t thread;
static int started, stopping;

/* ------------------------------------------------------------------ */
/* Delivery                                                            */
/* ------------------------------------------------------------------ */

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* E2B's signature: SHA-256 of secret + body, base64 URL-safe, unpadded. */
static void sign(const char *secret, const char *body, char out[64]) {
  size_t ls = strlen(secret), lb = strlen(body);
  char *s = malloc(ls + lb + 1);
  if (!s) abort();
  memcpy(s, secret, ls);
  memcpy(s + ls, body, lb + 1);
  unsigned char d[32];
  wbd_sha256(s, ls + lb, d);
  free(s);
  char *b = wbd_b64_encode(d, sizeof d);
  if (!b) abort();
  size_t n = 0;
  for (char *p = b; *p && *p != '='; p++, n++) out[n] = *p == '+' ? '-' : *p == '/' ? '_' : *p;
  out[n] = 0;
  free(b);
}

static size_t discard(char *p, size_t size, size_t n, void *cls) {
  (void)p;
  (void)cls;
  return size * n;
}

/* One attempt: 1 when the receiver answered 2xx. */
static int post(const struct delivery *d) {
  CURL *c = curl_easy_init();
  if (!c) return 0;
  char sig[64], h1[80], h2[80], h3[96];
  char did[37];
  wbd_uuid4(did, sizeof did);
  sign(d->secret, d->body, sig);
  snprintf(h1, sizeof h1, "e2b-webhook-id: %s", d->wid);
  snprintf(h2, sizeof h2, "e2b-delivery-id: %s", did);
  snprintf(h3, sizeof h3, "e2b-signature: %s", sig);
  struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
  hl = curl_slist_append(hl, h1);
  hl = curl_slist_append(hl, h2);
  hl = curl_slist_append(hl, "e2b-signature-version: v1");
  hl = curl_slist_append(hl, h3);
  curl_easy_setopt(c, CURLOPT_URL, d->url);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, d->body);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
  long status = 0;
  CURLcode rc = curl_easy_perform(c);
  if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(hl);
  curl_easy_cleanup(c);
  return rc == CURLE_OK && status >= 200 && status < 300;
}

static void delivery_free(struct delivery *d) {
  free(d->url);
  free(d->secret);
  free(d->body);
  free(d);
}

/* Under mu. */
static void enqueue_locked(struct delivery *d) {
  if (queued >= MAX_QUEUED) {
    wbd_stat_add("webhook_dropped", 1);
    delivery_free(d);
    return;
  }
  queued++;
  struct delivery **pp = &queue;
  while (*pp && (*pp)->due_ms <= d->due_ms) pp = &(*pp)->next;
  d->next = *pp;
  *pp = d;
  pthread_cond_signal(&cv);
}

/* After an attempt: again later, once more (a duplicate), or done. Under mu. */
static void settle_locked(struct delivery *d, int ok) {
  wbd_stat_add(ok ? "webhook_delivered" : "webhook_failed", 1);
  if (!ok && d->attempt < wbd_knob(&wbd_webhook_retries)) {
    d->attempt++;
    d->due_ms = mono_ms() + wbd_knob(&wbd_webhook_retry_ms);
    enqueue_locked(d);
  } else if (ok && d->dup && wbd_knob(&wbd_webhook_duplicates)) {
    d->dup = 0;
    d->due_ms = mono_ms();
    enqueue_locked(d);
  } else {
    delivery_free(d);
  }
}

static void *deliver_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  while (!stopping) {
    if (!queue) {
      pthread_cond_wait(&cv, &mu);
      continue;
    }
    int64_t wait = queue->due_ms - mono_ms();
    if (wait > 0) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += wait / 1000;
      ts.tv_nsec += (wait % 1000) * 1000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&cv, &mu, &ts);
      continue;
    }
    struct delivery *d = queue;
    queue = d->next;
    queued--;
    pthread_mutex_unlock(&mu);
    int ok = post(d);
    pthread_mutex_lock(&mu);
    settle_locked(d, ok);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

void wbd_webhooks_publish(const char *team, const char *type, json_t *event) {
  unsigned bit = 0;
  for (size_t i = 0; i < N_TYPES; i++)
    if (strcmp(type_names[i], type) == 0) bit = 1u << i;
  char *body = NULL;
  pthread_mutex_lock(&mu);
  for (struct webhook *w = hooks; w && started; w = w->next) {
    if (!w->enabled || !(w->types & bit) || strcmp(w->team, team) != 0) continue;
    if (!body && !(body = json_dumps(event, JSON_COMPACT))) abort();
    struct delivery *d = calloc(1, sizeof *d);
    if (!d) abort();
    memcpy(d->wid, w->id, sizeof d->wid);
    d->url = strdup(w->url);
    d->secret = strdup(w->secret);
    d->body = strdup(body);
    if (!d->url || !d->secret || !d->body) abort();
    d->dup = 1;
    d->due_ms = mono_ms();
    enqueue_locked(d);
  }
  pthread_mutex_unlock(&mu);
  free(body);
}

/* ------------------------------------------------------------------ */
/* Keeping                                                             */
/* ------------------------------------------------------------------ */

static json_t *types_json(unsigned types) {
  json_t *a = json_array();
  for (size_t i = 0; i < N_TYPES; i++)
    if (types & (1u << i)) json_array_append_new(a, json_string(type_names[i]));
  return a;
}

/* E2B's webhook as its API answers (the secret never). Under mu. */
static json_t *hook_json(const struct webhook *w, int with_secret) {
  char team[37], created[48];
  wbd_uuid_of("team", w->team, team);
  wbd_format_time(w->created_us, created, sizeof created);
  json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:b,s:s,s:o}", "id", w->id, "teamID", team, "name", w->name, "createdAt",
                        created, "enabled", w->enabled, "url", w->url, "events", types_json(w->types));
  if (!o) abort();
  if (with_secret) {
    json_object_set_new(o, "team", json_string(w->team));
    json_object_set_new(o, "signatureSecret", json_string(w->secret));
  }
  return o;
}

static void save_locked(void) {
  char dir[PATH_MAX];
  if (!wbd_opt.keep_state || !wbd_state_dir("events", dir, sizeof dir)) return;
  json_t *a = json_array();
  for (struct webhook *w = hooks; w; w = w->next) json_array_append_new(a, hook_json(w, 1));
  if (wbd_state_write_json(dir, "webhooks.json", a) != 0) wbd_stat_add("events_write_failed", 1);
}

static void hook_free(struct webhook *w) {
  free(w->name);
  free(w->url);
  free(w->secret);
  free(w);
}

static unsigned parse_types(json_t *a, int *bad);
static int url_ok(const char *url);

static void load_locked(void) {
  char dir[PATH_MAX], path[PATH_MAX + 16];
  if (!wbd_opt.keep_state || !wbd_state_dir("events", dir, sizeof dir)) return;
  snprintf(path, sizeof path, "%s/webhooks.json", dir);
  json_t *a = json_load_file(path, 0, NULL);
  size_t i;
  json_t *o;
  json_array_foreach(a, i, o) {
    const char *id = json_string_value(json_object_get(o, "id")), *team = json_string_value(json_object_get(o, "team"));
    const char *url = json_string_value(json_object_get(o, "url"));
    const char *created = json_string_value(json_object_get(o, "createdAt"));
    int bad = 0;
    unsigned types = parse_types(json_object_get(o, "events"), &bad);
    if (!id || strlen(id) != 36 || !team || !url || !url_ok(url) || bad) continue;
    struct webhook *w = calloc(1, sizeof *w);
    if (!w) abort();
    snprintf(w->id, sizeof w->id, "%s", id);
    snprintf(w->team, sizeof w->team, "%s", team);
    const char *name = json_string_value(json_object_get(o, "name"));
    const char *secret = json_string_value(json_object_get(o, "signatureSecret"));
    w->name = strdup(name ? name : "");
    w->url = strdup(url);
    w->secret = strdup(secret ? secret : "");
    if (!w->name || !w->url || !w->secret) abort();
    w->enabled = json_is_true(json_object_get(o, "enabled"));
    w->types = types;
    if (!created || wbd_parse_time(created, &w->created_us) != 0) w->created_us = wbd_now_us();
    w->next = hooks;
    hooks = w;
  }
  json_decref(a);
}

int wbd_webhooks_start(void) {
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return -1;
  pthread_mutex_lock(&mu);
  load_locked();
  stopping = 0;
  int rc = pthread_create(&thread, NULL, deliver_main, NULL);
  started = rc == 0;
  pthread_mutex_unlock(&mu);
  return rc == 0 ? 0 : -1;
}

void wbd_webhooks_stop(void) {
  pthread_mutex_lock(&mu);
  int was = started;
  stopping = 1;
  started = 0;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  if (was) pthread_join(thread, NULL);
  pthread_mutex_lock(&mu);
  while (queue) {
    struct delivery *d = queue;
    queue = d->next;
    delivery_free(d);
  }
  queued = 0;
  while (hooks) {
    struct webhook *w = hooks;
    hooks = w->next;
    hook_free(w);
  }
  pthread_mutex_unlock(&mu);
  if (was) curl_global_cleanup();
}

/* ------------------------------------------------------------------ */
/* The API                                                             */
/* ------------------------------------------------------------------ */

/* http(s) to a loopback address only. */
static int url_ok(const char *url) {
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL;
  int ok = u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
           curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
           curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK;
  if (ok) ok = strcmp(scheme, "http") == 0 || strcmp(scheme, "https") == 0;
  if (ok) {
    struct in_addr a4;
    ok = strcmp(host, "localhost") == 0 || strcmp(host, "[::1]") == 0 ||
         (inet_pton(AF_INET, host, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127);
  }
  curl_free(scheme);
  curl_free(host);
  curl_url_cleanup(u);
  return ok;
}

static unsigned parse_types(json_t *a, int *bad) {
  if (!a) return ALL_TYPES;
  if (!json_is_array(a)) {
    *bad = 1;
    return 0;
  }
  unsigned t = 0;
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    unsigned bit = 0;
    for (size_t k = 0; k < N_TYPES; k++)
      if (json_is_string(v) && strcmp(json_string_value(v), type_names[k]) == 0) bit = 1u << k;
    if (!bit) *bad = 1;
    t |= bit;
  }
  return t;
}

/* Checks the fields a POST or PATCH may carry; NULL or the complaint. */
static const char *check_fields(json_t *o, int create) {
  json_t *url = json_object_get(o, "url"), *en = json_object_get(o, "enabled"), *ev = json_object_get(o, "events");
  json_t *name = json_object_get(o, "name"), *sec = json_object_get(o, "signatureSecret");
  if (create && !url) return "property \"url\" is missing";
  if (url && !json_is_string(url)) return "\"url\" must be a string";
  if (url && !url_ok(json_string_value(url)))
    return "\"url\" must be an http(s) URL on a loopback address (warmboxd delivers to this machine only)";
  if (en && !json_is_boolean(en)) return "\"enabled\" must be a boolean";
  if ((name && !json_is_string(name)) || (sec && !json_is_string(sec)))
    return "\"name\" and \"signatureSecret\" are strings";
  int bad = 0;
  if (ev && (parse_types(ev, &bad) == 0 || bad)) return "\"events\" must list sandbox.lifecycle.* event types";
  return NULL;
}

static void set_str(char **dst, json_t *v) {
  if (!v) return;
  free(*dst);
  if (!(*dst = strdup(json_string_value(v)))) abort();
}

/* Applies checked fields. Under mu. */
static void apply(struct webhook *w, json_t *o) {
  set_str(&w->url, json_object_get(o, "url"));
  set_str(&w->name, json_object_get(o, "name"));
  set_str(&w->secret, json_object_get(o, "signatureSecret"));
  json_t *en = json_object_get(o, "enabled"), *ev = json_object_get(o, "events");
  if (en) w->enabled = json_is_true(en);
  int bad = 0;
  if (ev) w->types = parse_types(ev, &bad);
}

static struct webhook **find_locked(const char *team, const char *id) {
  struct webhook **pp = &hooks;
  while (*pp && (strcmp((*pp)->id, id) != 0 || strcmp((*pp)->team, team) != 0)) pp = &(*pp)->next;
  return pp;
}

static enum MHD_Result h_create(struct wbd_req *req, const char *team, json_t *o) {
  struct webhook *w = calloc(1, sizeof *w);
  if (!w) abort();
  wbd_uuid4(w->id, sizeof w->id);
  snprintf(w->team, sizeof w->team, "%s", team);
  w->name = strdup("");
  w->url = strdup("");
  w->secret = strdup("");
  if (!w->name || !w->url || !w->secret) abort();
  w->enabled = 1;
  w->types = ALL_TYPES;
  w->created_us = wbd_now_us();
  pthread_mutex_lock(&mu);
  int n = 0;
  for (struct webhook *x = hooks; x; x = x->next) n += strcmp(x->team, team) == 0;
  if (n >= MAX_WEBHOOKS) {
    pthread_mutex_unlock(&mu);
    hook_free(w);
    return wbd_reply_error(req, 400, "A team can have at most %d webhooks", MAX_WEBHOOKS);
  }
  apply(w, o);
  w->next = hooks;
  hooks = w;
  save_locked();
  json_t *out = hook_json(w, 0);
  pthread_mutex_unlock(&mu);
  return wbd_reply_json(req, 201, out, NULL);
}

static enum MHD_Result h_list(struct wbd_req *req, const char *team) {
  json_t *a = json_array();
  pthread_mutex_lock(&mu);
  for (struct webhook *w = hooks; w; w = w->next)
    if (strcmp(w->team, team) == 0) json_array_append_new(a, hook_json(w, 0));
  pthread_mutex_unlock(&mu);
  return wbd_reply_json(req, 200, a, NULL);
}

/* GET, PATCH or DELETE /events/webhooks/{id}; o: PATCH's checked body. */
static enum MHD_Result h_one(struct wbd_req *req, const char *team, json_t *o) {
  const char *id = req->path + strlen("/events/webhooks/");
  pthread_mutex_lock(&mu);
  struct webhook **pp = find_locked(team, id), *w = *pp;
  if (!w) {
    pthread_mutex_unlock(&mu);
    return wbd_reply_error(req, 404, "Webhook '%s' not found", id);
  }
  json_t *out = NULL;
  if (strcmp(req->method, "DELETE") == 0) {
    *pp = w->next;
    hook_free(w);
    save_locked();
  } else {
    if (o) {
      apply(w, o);
      save_locked();
    }
    out = hook_json(w, 0);
  }
  pthread_mutex_unlock(&mu);
  return wbd_reply_json(req, 200, out, NULL);
}

enum MHD_Result wbd_webhooks_handle(struct wbd_req *req, const char *team) {
  int post = strcmp(req->method, "POST") == 0, patch = strcmp(req->method, "PATCH") == 0;
  if (!post && !patch) {
    if (strcmp(req->path, "/events/webhooks") == 0) return h_list(req, team);
    return h_one(req, team, NULL);
  }
  enum MHD_Result r = MHD_NO;
  json_t *o = wbd_ctl_body_object(req, 1, &r);
  if (!o) return r;
  const char *why = check_fields(o, post);
  if (why) {
    json_decref(o);
    return wbd_reply_error(req, 400, VERR "%s", why);
  }
  r = post ? h_create(req, team, o) : h_one(req, team, o);
  json_decref(o);
  return r;
}
