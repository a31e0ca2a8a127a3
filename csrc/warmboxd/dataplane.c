/*
 * dataplane.c: what E2B's proxy and envd do to a request before a handler
 * sees it, once the server has found the (running, referenced) sandbox:
 * port routing, the proxy's errors and traffic-token check, and envd's
 * access-token check.
 */
#include "envd.h"
#include "interp.h"
#include "util.h"

#include <string.h>

#define ENVD_PORT   49983
#define INTERP_PORT 49999

/* The proxy's error shape: {"sandboxId", "message", "code"} (+ "port"). */
static enum MHD_Result proxy_error(struct wbd_req *req, struct wbd_sandbox *sb, unsigned status, const char *message,
                                   int port) {
  json_t *b = json_object();
  json_object_set_new(b, "sandboxId", json_string(sb->id));
  json_object_set_new(b, "message", json_string(message));
  json_object_set_new(b, "code", json_integer(status));
  if (port) json_object_set_new(b, "port", json_integer(port));
  return wbd_reply_json(req, status, b, NULL);
}

/* envd routes the proxy keeps for the control plane. */
static int internal_route(const char *path) {
  static const char *const routes[] = {"/init", "/freeze", "/unfreeze", "/fsfreeze", "/fsthaw", "/collapse", NULL};
  for (int i = 0; routes[i]; i++) {
    size_t n = strlen(routes[i]);
    if (strncmp(path, routes[i], n) == 0 && (path[n] == 0 || path[n] == '/')) return 1;
  }
  return 0;
}

int wbd_dataplane_changes(const struct wbd_req *req, int port) {
  static const char *const reads[] = {
    "/filesystem.Filesystem/Stat",
    "/filesystem.Filesystem/ListDir",
    "/filesystem.Filesystem/WatchDir",
    "/filesystem.Filesystem/CreateWatcher",
    "/filesystem.Filesystem/GetWatcherEvents",
    "/filesystem.Filesystem/RemoveWatcher",
    "/process.Process/List",
    "/process.Process/Connect",
    NULL,
  };
  if (strcmp(req->method, "GET") == 0 || (port != ENVD_PORT && port != INTERP_PORT)) return 0;
  if (port == ENVD_PORT && strcmp(req->method, "POST") == 0)
    for (int i = 0; reads[i]; i++)
      if (strcmp(req->path, reads[i]) == 0) return 0;
  return 1;
}

#define TRAFFIC_HEADER "e2b-traffic-access-token"

static int token_ok(struct wbd_req *req, const char *header, const char *want) {
  const char *tok = wbd_req_header(req, header);
  return want[0] && tok && tok[0] && wbd_str_eq_ct(tok, want);
}

int wbd_dataplane_refused(struct wbd_req *req, struct wbd_sandbox *sb, int port, enum MHD_Result *r) {
  if (port == ENVD_PORT) return 0; /* envd checks its own token */
  if (sb->traffic_token[0]) {
    /* E2B's proxy: every other port, the interpreter's included, /health too */
    const char *tok = wbd_req_header(req, TRAFFIC_HEADER);
    if (tok && tok[0] && wbd_str_eq_ct(tok, sb->traffic_token)) return 0;
    wbd_stat_add("traffic_token_refused", 1);
    *r = proxy_error(req, sb, 403,
                     tok && tok[0]
                       ? "Sandbox is secured with traffic access token. Provided token in header '" TRAFFIC_HEADER
                         "' is invalid"
                       : "Sandbox is secured with traffic access token. Token header '" TRAFFIC_HEADER "' is missing",
                     0);
    return 1;
  }
  /* --secure-all (a server other local users reach): a sandbox's own
   * servers answer its owner only, not whoever learns its id. */
  if (wbd_opt.secure_all && port != INTERP_PORT && !token_ok(req, "X-Access-Token", sb->access_token)) {
    wbd_stat_add("port_token_refused", 1);
    *r = proxy_error(req, sb, 403,
                     "warmboxd --secure-all: the sandbox's ports need its X-Access-Token or its " TRAFFIC_HEADER, port);
    return 1;
  }
  return 0;
}

enum MHD_Result wbd_dataplane_handle(struct wbd_req *req, struct wbd_sandbox *sb, int port) {
  if (port == INTERP_PORT) {
    /* E2B's SDK sends the sandbox's envd token on /execute only (its
     * context calls send none): /execute needs it, /contexts* do not unless
     * --strict-tokens; /health never does. */
    int health = strcmp(req->method, "GET") == 0 && strcmp(req->path, "/health") == 0;
    int execute = strcmp(req->path, "/execute") == 0;
    if (sb->secure && sb->access_token[0] && !health && (execute || wbd_opt.strict_tokens)) {
      const char *tok = wbd_req_header(req, "X-Access-Token");
      if (!tok || !wbd_str_eq_ct(tok, sb->access_token))
        return wbd_reply_error(req, 401, "unauthorized access, please provide a valid access token");
    }
    return wbd_interp_handle(req, sb);
  }
  if (port != ENVD_PORT) {
    enum MHD_Result r;
    if (wbd_ports_forward(req, sb, port, &r) == 0) return r;
    return proxy_error(req, sb, 502, "The sandbox is running but port is not open", port);
  }
  if (internal_route(req->path))
    return proxy_error(req, sb, 404, "This endpoint is reserved for the E2B control plane", 0);

  if (sb->secure && sb->access_token[0]) {
    int is_get = strcmp(req->method, "GET") == 0, is_post = strcmp(req->method, "POST") == 0;
    /* envd's exceptions: /health needs nothing; /files checks the token or
     * a URL signature itself (envd.c). */
    int exempt =
      (is_get && strcmp(req->path, "/health") == 0) || ((is_get || is_post) && strcmp(req->path, "/files") == 0);
    if (!exempt) {
      const char *tok = wbd_req_header(req, "X-Access-Token");
      if (!tok || !wbd_str_eq_ct(tok, sb->access_token))
        return wbd_reply_error(req, 401,
                               "unauthorized access, please provide a valid access token or "
                               "method signing if supported");
    }
  }
  return wbd_envd_handle(req, sb);
}
