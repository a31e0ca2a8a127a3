/* redis_topo.c: opening a Redis connection where the configuration points
 * (see warmbox_redis_topo.h): AUTH (ACL user or password alone) and SELECT
 * on every connection; in sentinel mode the primary is asked of the
 * sentinels in turn (SENTINEL GET-MASTER-ADDR-BY-NAME) and checked with ROLE
 * before use, so a sentinel that has not yet seen a failover is not
 * believed; in cluster mode a dead node is replaced by the first seed that
 * answers (which redirects with MOVED). hiredis builds and parses every
 * command; no protocol code here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "warmbox_redis_topo.h"

struct timeval warmbox_redis_tv(double s) {
  struct timeval tv;
  if (!(s > 0)) s = 0.001;
  tv.tv_sec = (time_t)s;
  tv.tv_usec = (suseconds_t)((s - (double)tv.tv_sec) * 1e6);
  return tv;
}

static char *topo_dup(const char *s) {
  size_t n;
  char *d;
  if (!s) return NULL;
  n = strlen(s);
  d = (char *)malloc(n + 1);
  if (d) memcpy(d, s, n + 1);
  return d;
}

int warmbox_redis_split(const char *s, char **host, int *port) {
  const char *colon = strrchr(s, ':');
  char *end;
  long p;
  size_t n;
  if (!colon || colon == s) return -1;
  p = strtol(colon + 1, &end, 10);
  if (*end != '\0' || end == colon + 1 || p <= 0 || p > 65535) return -1;
  n = (size_t)(colon - s);
  if (s[0] == '[' && n > 2 && s[n - 1] == ']') { /* [v6]:port */
    s++;
    n -= 2;
  }
  *host = (char *)malloc(n + 1);
  if (!*host) return -1;
  memcpy(*host, s, n);
  (*host)[n] = '\0';
  *port = (int)p;
  return 0;
}

void warmbox_redis_conf_free(warmbox_redis_conf *c) {
  int i;
  if (!c) return;
  free(c->host);
  free(c->username);
  free(c->password);
  free(c->master);
  for (i = 0; i < c->naddrs; i++) free(c->addr_host[i]);
  free(c->addr_host);
  free(c->addr_port);
  free(c);
}

warmbox_redis_conf *warmbox_redis_conf_dup(const warmbox_redis_conf *c) {
  warmbox_redis_conf *d = (warmbox_redis_conf *)calloc(1, sizeof *d);
  int i, bad = 0;
  if (!d) return NULL;
  *d = *c;
  d->host = topo_dup(c->host);
  d->username = topo_dup(c->username);
  d->password = topo_dup(c->password);
  d->master = topo_dup(c->master);
  d->addr_host = NULL;
  d->addr_port = NULL;
  d->naddrs = 0;
  if (c->naddrs > 0) {
    d->addr_host = (char **)calloc((size_t)c->naddrs, sizeof *d->addr_host);
    d->addr_port = (int *)calloc((size_t)c->naddrs, sizeof *d->addr_port);
    if (!d->addr_host || !d->addr_port) bad = 1;
    for (i = 0; !bad && i < c->naddrs; i++) {
      d->addr_host[i] = topo_dup(c->addr_host[i]);
      d->addr_port[i] = c->addr_port[i];
      d->naddrs = i + 1;
      if (!d->addr_host[i]) bad = 1;
    }
  }
  if (bad || !d->host || (c->username && !d->username) || (c->password && !d->password) || (c->master && !d->master)) {
    warmbox_redis_conf_free(d);
    return NULL;
  }
  return d;
}

/* Runs one command on ctx; 0 when its reply is not an error (*out gets it
 * when out is not NULL), -1 with err filled. */
static int topo_call(redisContext *ctx, int argc, const char **argv, redisReply **out, const char *what, char *err,
                     size_t errlen) {
  redisReply *rep = (redisReply *)redisCommandArgv(ctx, argc, argv, NULL);
  if (!rep) {
    snprintf(err, errlen, "%s: %s", what, ctx->err ? ctx->errstr : "no reply");
    return -1;
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    snprintf(err, errlen, "%s: %.*s", what, (int)(rep->len > 200 ? 200 : rep->len), rep->str);
    freeReplyObject(rep);
    return -1;
  }
  if (out)
    *out = rep;
  else
    freeReplyObject(rep);
  return 0;
}

static redisContext *topo_dial(const char *host, int port, double timeout, char *err, size_t errlen) {
  struct timeval tv = warmbox_redis_tv(timeout);
  redisContext *ctx = host[0] == '/' ? redisConnectUnixWithTimeout(host, tv) : redisConnectWithTimeout(host, port, tv);
  if (ctx == NULL || ctx->err || redisSetTimeout(ctx, tv) != REDIS_OK) {
    snprintf(err, errlen, "redis %s:%d: %s", host, port, ctx && ctx->err ? ctx->errstr : "cannot connect");
    if (ctx) redisFree(ctx);
    return NULL;
  }
  return ctx;
}

redisContext *warmbox_redis_open(const warmbox_redis_conf *c, const char *host, int port, char *err, size_t errlen) {
  redisContext *ctx = topo_dial(host, port, c->timeout, err, errlen);
  if (!ctx) return NULL;
  if (c->password) {
    const char *argv[3] = {"AUTH", c->username ? c->username : c->password, c->password};
    if (topo_call(ctx, c->username ? 3 : 2, argv, NULL, "redis AUTH", err, errlen) != 0) {
      redisFree(ctx);
      return NULL;
    }
  }
  if (c->db != 0 && !c->cluster) {
    char db[32];
    const char *argv[2] = {"SELECT", db};
    snprintf(db, sizeof db, "%lld", c->db);
    if (topo_call(ctx, 2, argv, NULL, "redis SELECT", err, errlen) != 0) {
      redisFree(ctx);
      return NULL;
    }
  }
  return ctx;
}

/* Asks sentinel i for the master's address: 0 and *host (malloc'd), *port. */
static int topo_ask_sentinel(const warmbox_redis_conf *c, int i, char **host, int *port, char *err, size_t errlen) {
  const char *argv[3] = {"SENTINEL", "GET-MASTER-ADDR-BY-NAME", c->master};
  redisReply *rep = NULL;
  redisContext *s = topo_dial(c->addr_host[i], c->addr_port[i], c->timeout, err, errlen);
  int rc = -1;
  if (!s) return -1;
  if (topo_call(s, 3, argv, &rep, "sentinel", err, errlen) == 0) {
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 && rep->element[0]->type == REDIS_REPLY_STRING &&
        rep->element[1]->type == REDIS_REPLY_STRING) {
      *host = topo_dup(rep->element[0]->str);
      *port = atoi(rep->element[1]->str);
      rc = *host ? 0 : -1;
    } else {
      snprintf(err, errlen, "sentinel %s:%d does not know master '%s'", c->addr_host[i], c->addr_port[i], c->master);
    }
    freeReplyObject(rep);
  }
  redisFree(s);
  return rc;
}

/* Whether ctx's node says it is a primary (ROLE's first element "master"). */
static int topo_is_primary(redisContext *ctx, char *err, size_t errlen) {
  const char *argv[1] = {"ROLE"};
  redisReply *rep = NULL;
  int ok;
  if (topo_call(ctx, 1, argv, &rep, "redis ROLE", err, errlen) != 0) return 0;
  ok = rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 && rep->element[0]->type == REDIS_REPLY_STRING &&
       strcmp(rep->element[0]->str, "master") == 0;
  if (!ok) snprintf(err, errlen, "the node the sentinels name is not a primary (yet)");
  freeReplyObject(rep);
  return ok;
}

static redisContext *topo_sentinel_connect(warmbox_redis_conf *c, char *err, size_t errlen) {
  int i;
  for (i = 0; i < c->naddrs; i++) {
    char *host = NULL;
    int port = 0;
    redisContext *ctx;
    if (topo_ask_sentinel(c, i, &host, &port, err, errlen) != 0) continue;
    ctx = warmbox_redis_open(c, host, port, err, errlen);
    if (ctx && topo_is_primary(ctx, err, errlen)) {
      free(c->host);
      c->host = host;
      c->port = port;
      return ctx;
    }
    if (ctx) redisFree(ctx);
    free(host);
  }
  return NULL;
}

redisContext *warmbox_redis_connect(warmbox_redis_conf *c, char *err, size_t errlen) {
  redisContext *ctx;
  int i;
  if (c->master) return topo_sentinel_connect(c, err, errlen);
  ctx = warmbox_redis_open(c, c->host, c->port, err, errlen);
  if (ctx || !c->cluster) return ctx;
  for (i = 0; i < c->naddrs; i++) {
    char *h;
    if (strcmp(c->addr_host[i], c->host) == 0 && c->addr_port[i] == c->port) continue;
    ctx = warmbox_redis_open(c, c->addr_host[i], c->addr_port[i], err, errlen);
    if (!ctx) continue;
    h = topo_dup(c->addr_host[i]);
    if (!h) {
      redisFree(ctx);
      return NULL;
    }
    free(c->host);
    c->host = h;
    c->port = c->addr_port[i];
    return ctx;
  }
  return NULL;
}

static int topo_prefix(const redisReply *rep, const char *p) {
  size_t n = strlen(p);
  return rep->type == REDIS_REPLY_ERROR && rep->len >= n && memcmp(rep->str, p, n) == 0;
}

int warmbox_redis_failover_reply(const redisReply *rep) {
  return topo_prefix(rep, "READONLY") || topo_prefix(rep, "MASTERDOWN") || topo_prefix(rep, "LOADING") ||
         topo_prefix(rep, "UNBLOCKED") || topo_prefix(rep, "CLUSTERDOWN") || topo_prefix(rep, "TRYAGAIN") ||
         topo_prefix(rep, "NOREPLICAS");
}

int warmbox_redis_redirect(const redisReply *rep, char **host, int *port) {
  int kind = topo_prefix(rep, "MOVED ") ? 1 : topo_prefix(rep, "ASK ") ? 2 : 0;
  char buf[300];
  const char *sp;
  if (!kind) return 0;
  snprintf(buf, sizeof buf, "%.*s", (int)(rep->len < 299 ? rep->len : 299), rep->str);
  sp = strrchr(buf, ' ');
  if (!sp || warmbox_redis_split(sp + 1, host, port) != 0) return 0;
  return kind;
}
