/* actors/gateway/gw_sse_client.h — a small blocking HTTP/1.1 client for the gateway's streamed
 * completions: what troupe-bench --http drives the gateway with (one keep-alive connection per
 * client thread, so TTFT and tokens/s compare with the ZeroMQ client's on the same cluster).
 *
 * It POSTs a JSON body, reads the chunked Server-Sent Events reply and calls back once per
 * `data:` event with the parsed JSON (and once with NULL for `data: [DONE]`). Loopback or a
 * trusted gateway only: it is a measuring tool, not a general HTTP client. */
#ifndef TROUPE_GW_SSE_CLIENT_H
#define TROUPE_GW_SSE_CLIENT_H

#include <jansson.h>
#include <stddef.h>

typedef struct gw_sse_client gw_sse_client_t;

/* url: "http://host:port" (no path). NULL with err set on failure. */
gw_sse_client_t *gw_sse_connect(const char *url, char *err, size_t errlen);
void gw_sse_destroy(gw_sse_client_t **self_p);

/* Called per event; return 0 to go on, -1 to stop (the connection is then closed). */
typedef int (*gw_sse_event_fn)(void *arg, json_t *event);

/* POSTs body to path and streams the reply through fn. 0 when the stream ended with [DONE];
 * -1 with err (an HTTP status other than 200 carries the error body's message). Reconnects once
 * when a kept-alive connection turns out to be closed before the request. */
int gw_sse_post(gw_sse_client_t *c, const char *path, const char *body, gw_sse_event_fn fn, void *arg, char *err,
                size_t errlen);

#endif
