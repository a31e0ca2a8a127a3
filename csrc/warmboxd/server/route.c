/*
 * route.c: matching a request against the route table (server.h's struct
 * wbd_route; the table itself is control/routes.c). A row's route is
 * "METHOD /pattern": the method, or "*" for any, then the path, in which a
 * {name} matches one non-empty segment and every other byte itself.
 */
#include "server.h"

#include <string.h>

static int method_match(const char *route, const char *method, const char **pattern) {
  const char *sp = strchr(route, ' ');
  if (!sp) return 0;
  *pattern = sp + 1;
  size_t n = (size_t)(sp - route);
  if (n == 1 && route[0] == '*') return 1;
  return strlen(method) == n && strncmp(route, method, n) == 0;
}

static int path_match(const char *pat, const char *path) {
  while (*pat) {
    if (*pat == '{') {
      const char *close = strchr(pat, '}');
      if (!close) return 0;
      size_t seg = strcspn(path, "/");
      if (seg == 0) return 0;
      pat = close + 1;
      path += seg;
    } else if (*pat++ != *path++) {
      return 0;
    }
  }
  return *path == 0;
}

const struct wbd_route *wbd_route_match(const struct wbd_route *table, size_t n, const char *method, const char *path,
                                        int admin) {
  for (size_t i = 0; i < n; i++) {
    const char *pattern;
    if ((table[i].auth == WBD_AUTH_ADMIN) != (admin != 0)) continue;
    if (method_match(table[i].route, method, &pattern) && path_match(pattern, path))
      return table[i].fn ? &table[i] : NULL; /* a row without a handler: no route */
  }
  return NULL;
}
