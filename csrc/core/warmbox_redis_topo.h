/* warmbox_redis_topo.h: where a Redis connection goes and how it is opened
 * (csrc/core/redis_topo.c), shared by warmbox.Redis and its keeper thread:
 * one node, a primary found through Redis Sentinel, or a Redis Cluster node
 * (MOVED/ASK followed by the keeper). Plain C: no Lua state. */
#ifndef WARMBOX_REDIS_TOPO_H
#define WARMBOX_REDIS_TOPO_H

#include <stddef.h>

#include <hiredis/hiredis.h>

typedef struct {
  char *host; /* the node (single, cluster) or the primary last found (sentinel) */
  int port;
  char *username, *password; /* NULL: no AUTH (password alone: AUTH password) */
  long long db;              /* SELECT when not 0 (never on a cluster) */
  double timeout;
  char *master; /* sentinel mode when not NULL: the monitored master's name */
  int cluster;  /* cluster mode: addrs are the seed nodes */
  int naddrs;   /* sentinels (sentinel mode) or cluster seeds */
  char **addr_host;
  int *addr_port;
} warmbox_redis_conf;

struct timeval warmbox_redis_tv(double s);

/* Splits "host:port" (the last ':'); 0 on success. host is malloc'd. */
int warmbox_redis_split(const char *s, char **host, int *port);

warmbox_redis_conf *warmbox_redis_conf_dup(const warmbox_redis_conf *c);
void warmbox_redis_conf_free(warmbox_redis_conf *c);

/* Opens a connection to host:port (a unix socket when host starts with
 * '/'), with c's timeout, AUTH and SELECT. NULL with err filled on failure. */
redisContext *warmbox_redis_open(const warmbox_redis_conf *c, const char *host, int port, char *err, size_t errlen);

/* Connects where c points: the node; in sentinel mode the primary the
 * sentinels name (checked with ROLE; c->host/port updated); in cluster
 * mode c's node, else the first seed that answers (c->host/port updated). */
redisContext *warmbox_redis_connect(warmbox_redis_conf *c, char *err, size_t errlen);

/* Whether an error reply says the command was not run because the node is
 * not (or no longer) the primary: READONLY, MASTERDOWN, LOADING, UNBLOCKED
 * (a blocked client released by a role change), CLUSTERDOWN, TRYAGAIN,
 * NOREPLICAS (min-replicas-to-write: a primary cut off from its replicas). */
int warmbox_redis_failover_reply(const redisReply *rep);

/* "MOVED <slot> <host>:<port>" / "ASK <slot> <host>:<port>": 1 MOVED, 2 ASK,
 * 0 neither; host malloc'd on 1 and 2. */
int warmbox_redis_redirect(const redisReply *rep, char **host, int *port);

#endif
