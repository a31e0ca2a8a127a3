/*
 * ports.c: the proxy's other ports. E2B's proxy sends a request for
 * PORT-ID.<domain> to that port of the sandbox's VM (a server the user
 * started there: `python -m http.server 8000`); warmboxd sends it to that
 * port on the sandbox's own loopback, through a socket made in its network
 * namespace (wbd_rt_port_socket), with libcurl. Plain HTTP/1.1 requests
 * only: the answer is read whole (at most PORT_BODY_MAX) and replied with
 * its status and headers; no upgrade (WebSocket) and no streaming. Without
 * a namespace (--unisolated) nothing is forwarded: the host's ports are not
 * the sandbox's.
 */
#include "util.h"
#include "wbd.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define PORT_BODY_MAX    ((size_t)64 << 20)
#define PORT_HEADERS_MAX 64
#define PORT_TIMEOUT_S   120

/* Hop-by-hop headers and the ones warmboxd sets itself: never passed on,
 * either way; E2B's routing headers are not the server's either. */
static int skipped(const char *name) {
  static const char *const names[] = {"Connection",
                                      "Keep-Alive",
                                      "Transfer-Encoding",
                                      "TE",
                                      "Trailer",
                                      "Upgrade",
                                      "Proxy-Connection",
                                      "Proxy-Authorization",
                                      "Content-Length",
                                      "Expect",
                                      "Date",
                                      "E2b-Sandbox-Id",
                                      "E2b-Sandbox-Port",
                                      "E2b-Traffic-Access-Token",
                                      NULL};
  for (int i = 0; names[i]; i++)
    if (strcasecmp(name, names[i]) == 0) return 1;
  return 0;
}

struct fwd {
  int fd; /* the socket for libcurl's one connection, -1 once taken */
  char *body;
  size_t len, cap;
  int over;                            /* the answer ran past PORT_BODY_MAX */
  char *hdr[2 * PORT_HEADERS_MAX + 1]; /* "Name", "value" pairs of the answer, NULL-terminated */
  int nhdr;
  char *content_type;
};

static void headers_clear(struct fwd *f) {
  for (int i = 0; i < f->nhdr; i++) free(f->hdr[i]);
  f->nhdr = 0;
  f->hdr[0] = NULL;
  free(f->content_type);
  f->content_type = NULL;
}

static curl_socket_t open_socket(void *cls, curlsocktype purpose, struct curl_sockaddr *addr) {
  (void)purpose;
  (void)addr;
  struct fwd *f = cls;
  int fd = f->fd;
  f->fd = -1;
  return fd >= 0 ? fd : CURL_SOCKET_BAD;
}

static size_t on_header(char *p, size_t size, size_t n, void *cls) {
  struct fwd *f = cls;
  size_t len = size * n;
  if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) { /* a new answer (after a 100 Continue): its own */
    headers_clear(f);
    return len;
  }
  const char *colon = memchr(p, ':', len);
  if (!colon || colon == p) return len;
  size_t nl = (size_t)(colon - p);
  const char *v = colon + 1, *end = p + len;
  while (v < end && (*v == ' ' || *v == '\t')) v++;
  while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
  char *name = strndup(p, nl), *value = strndup(v, (size_t)(end - v));
  if (!name || !value || skipped(name) || f->nhdr >= 2 * PORT_HEADERS_MAX) {
    free(name);
    free(value);
    return len;
  }
  if (strcasecmp(name, "Content-Type") == 0) {
    free(f->content_type);
    f->content_type = value;
    free(name);
    return len;
  }
  f->hdr[f->nhdr++] = name;
  f->hdr[f->nhdr++] = value;
  f->hdr[f->nhdr] = NULL;
  return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *cls) {
  struct fwd *f = cls;
  size_t len = size * n;
  if (f->len + len > PORT_BODY_MAX) {
    f->over = 1;
    return 0; /* ends the transfer */
  }
  if (f->len + len > f->cap) {
    size_t nc = f->cap ? f->cap : 16384;
    while (nc < f->len + len) nc *= 2;
    char *nb = realloc(f->body, nc);
    if (!nb) return 0;
    f->body = nb;
    f->cap = nc;
  }
  memcpy(f->body + f->len, p, len);
  f->len += len;
  return len;
}

struct hdr_out {
  struct curl_slist *list;
};

static enum MHD_Result add_request_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  (void)kind;
  struct hdr_out *h = cls;
  if (!key || skipped(key)) return MHD_YES;
  size_t n = strlen(key) + strlen(value ? value : "") + 3;
  char *line = malloc(n);
  if (!line) return MHD_YES;
  /* "Name;" sends a header with an empty value ("Name:" would drop it) */
  if (value && *value)
    snprintf(line, n, "%s: %s", key, value);
  else
    snprintf(line, n, "%s;", key);
  struct curl_slist *l = curl_slist_append(h->list, line);
  free(line);
  if (l) h->list = l;
  return MHD_YES;
}

/* The query string as it came, rebuilt from libmicrohttpd's decoded pairs. */
struct query_out {
  CURL *c;
  char *s;
  size_t len;
};

static enum MHD_Result add_query_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  (void)kind;
  struct query_out *q = cls;
  char *k = curl_easy_escape(q->c, key ? key : "", 0);
  char *v = value ? curl_easy_escape(q->c, value, 0) : NULL;
  size_t add = (k ? strlen(k) : 0) + (v ? strlen(v) + 1 : 0) + 2;
  char *ns = realloc(q->s, q->len + add);
  if (ns && k) {
    q->s = ns;
    q->len += (size_t)snprintf(q->s + q->len, add, "%s%s%s%s", q->len ? "&" : "?", k, v ? "=" : "", v ? v : "");
  }
  curl_free(k);
  curl_free(v);
  return MHD_YES;
}

/* The URL of req's path and query on 127.0.0.1:port (malloc'd), or NULL.
 * libmicrohttpd hands the path decoded: what a path may not hold as it is
 * (a space, '?', '#', '%', controls, bytes past ASCII) is encoded again. */
static char *target_url(int port, const char *path, const char *query) {
  static const char ok[] = "-._~!$&'()*+,;=:@/";
  size_t n = strlen(path);
  char *u = malloc(32 + 3 * n + (query ? strlen(query) : 0) + 1);
  if (!u) return NULL;
  size_t len = (size_t)sprintf(u, "http://127.0.0.1:%d", port);
  for (const unsigned char *c = (const unsigned char *)path; *c; c++) {
    if (isalnum(*c) || (*c < 0x80 && strchr(ok, *c)))
      u[len++] = (char)*c;
    else
      len += (size_t)sprintf(u + len, "%%%02X", *c);
  }
  strcpy(u + len, query ? query : "");
  return u;
}

/* Sets c up for req on 127.0.0.1:port; the caller frees *headers and *url.
 * 0, or -1 without memory. */
static int setup(CURL *c, struct wbd_req *req, int port, struct fwd *f, struct curl_slist **headers, char **url) {
  struct query_out q = {c, NULL, 0};
  MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, add_query_arg, &q);
  *url = target_url(port, req->path, q.s);
  free(q.s);
  if (!*url) return -1;
  struct hdr_out h = {NULL};
  MHD_get_connection_values(req->conn, MHD_HEADER_KIND, add_request_header, &h);
  struct curl_slist *l = curl_slist_append(h.list, "Expect:");
  if (l) h.list = l;
  *headers = h.list;
  curl_easy_setopt(c, CURLOPT_URL, *url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h.list);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, f);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, f);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(c, CURLOPT_FORBID_REUSE, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 5L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)PORT_TIMEOUT_S);
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  if (strcmp(req->method, "HEAD") == 0) {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (strcmp(req->method, "GET") != 0 || req->body_len) {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req->body_fd >= 0 ? "" : req->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(req->body_fd >= 0 ? 0 : req->body_len));
  }
  return 0;
}

int wbd_ports_forward(struct wbd_req *req, struct wbd_sandbox *sb, int port, enum MHD_Result *r) {
  if (req->body_fd >= 0) return 502; /* only envd's uploads are spooled */
  struct fwd f = {.fd = wbd_rt_port_socket(sb)};
  if (f.fd < 0) return 502;
  CURL *c = curl_easy_init();
  if (!c) {
    close(f.fd);
    return 502;
  }
  struct curl_slist *headers = NULL;
  char *url = NULL;
  CURLcode cc = setup(c, req, port, &f, &headers, &url) == 0 ? curl_easy_perform(c) : CURLE_OUT_OF_MEMORY;
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c); /* closes the socket it took */
  if (f.fd >= 0) close(f.fd);
  curl_slist_free_all(headers);
  free(url);
  int rc;
  if (cc == CURLE_OK && status >= 100 && status <= 599) {
    wbd_stat_add("port_forwarded", 1);
    *r = wbd_reply_raw(req, (unsigned)status, f.content_type, f.body ? f.body : "", f.len, (const char *const *)f.hdr);
    rc = 0;
  } else if (cc == CURLE_COULDNT_CONNECT) {
    rc = 502;
  } else {
    wbd_stat_add(f.over ? "port_answer_too_large" : "port_failed", 1);
    *r = wbd_reply_error(req, 502, "the sandbox's port %d did not answer in full (%s)", port,
                         f.over ? "over 64 MiB" : curl_easy_strerror(cc));
    rc = 0;
  }
  headers_clear(&f);
  free(f.body);
  return rc;
}
