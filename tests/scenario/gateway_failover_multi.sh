# The gateway's failover between two routers (issue 21, item 4; actors/gateway.c through
# tools/lib/client.h): router-0 and router-1, each on its own client endpoint (endpoints.clients),
# one decode worker whose batch holds 4 (limits.max_batch). Every call goes to router-0 (the
# gateway's first router). A long non-streamed completion and three long streams fill the batch;
# then six more streams and four non-streamed completions (longer prompts) are sent: the prefill worker gets to some of them (a
# first token), the others wait with none. Once router-0 holds all fourteen (its stats say so) and
# at least one later stream has no token, router-0 gets kill -9. Checked:
#   - every HTTP request ends exactly once, none by its client's own timeout: a stream with
#     [DONE] after all its tokens, or with one error event (OpenAI's shape, server_error,
#     unavailable, "retry") as its last event and no [DONE]; a non-streamed one with 200 and all
#     its tokens, or 503 with Retry-After in OpenAI's shape;
#   - a stream that fails had streamed (tokens came before its error): the ones without were
#     sent again to router-1 and completed;
#   - every non-streamed request in flight at the kill completed with 200 (via router-1: router-0
#     is dead), those that had tokens at router-0 too: the gateway had sent none of them, so it
#     started them again there (requests_restarted_total);
#   - the gateway's counters agree with the outcomes: requests_moved_total is the number of calls
#     in flight at the kill that completed, requests_router_lost_total the number that failed;
#   - new requests right after (router-0 not yet back, or back) succeed at once, streamed and not.
# Prints submitted / completed / moved / failed-retryable.
# OLD_GATEWAY=PATH runs the cluster with that troupe-gateway binary (one built from 6c445b8, before
# the gateway failed over, talks to router-0 alone): every call in flight then fails with 503 and
# the test fails.
. "$(dirname "$0")/lib.sh"
[ -x "$BIN/troupe-gateway" ] || fail "troupe-gateway is not built (libmicrohttpd-dev missing? make deps)"
[ -f "$ROOT/third_party/tokenizers/qwen3/tokenizer.json" ] || { echo "SKIP: no Qwen3 tokenizer (make deps fetches it)"; exit 0; }
. "$ROOT/tests/gateway/lib.sh"
N_ROUTERS=2 gateway_topology "$WORK/t.yaml" "  max_batch: 4" "  max_model_len: 1024" "  prefill_chunk_tokens: 64" \
  "  admission_queue: 64"
sed -i 's|^  heartbeat_ms: .*|  heartbeat_ms: 200|' "$WORK/t.yaml"   # stats (router-0's requests) 5 times a second
sup_args=()
if [ -n "${OLD_GATEWAY:-}" ]; then
  mkdir -p "$WORK/bin"
  for b in "$BIN"/troupe-*; do ln -s "$b" "$WORK/bin/"; done
  ln -sf "$OLD_GATEWAY" "$WORK/bin/troupe-gateway"
  sup_args=(--bin-dir "$WORK/bin")
fi
start_cluster "$WORK/t.yaml" "${sup_args[@]}"
[ "$(client_endpoints "$WORK/t.yaml")" != "$(grep '^  client:' "$WORK/t.yaml" | awk '{print $2}')" ] \
  || fail "the topology has one client endpoint"
$PY - "$(gw_url "$WORK/t.yaml")" "$BIN" "$WORK/t.yaml" <<'PY' || fail "see above"
import http.client, json, os, signal, sys, threading, time, urllib.parse
from servelib import top, metric
url, bin_dir, topo = sys.argv[1], sys.argv[2], sys.argv[3]
host = urllib.parse.urlparse(url).netloc
KEY = {"Authorization": "Bearer sk-test-alpha-0001", "Content-Type": "application/json"}
LONG, SHORT = 600, 24          # the batch's four streams outlast the kill; the others are short
lock = threading.Lock()
reqs = []                      # {"kind", "max", "tokens", "events", "end", "t_end", ...}

def body(i, stream, n, prompt_len=40):
    b = {"model": "qwen3-demo-shape", "prompt": [600 + i] + list(range(1, prompt_len + 1)), "max_tokens": n,
         "ignore_eos": True, "temperature": 0, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    return json.dumps(b)

def run(r):
    c = http.client.HTTPConnection(host, timeout=120)
    try:
        c.request("POST", "/v1/completions", body(r["i"], r["kind"] == "stream", r["max"], r["prompt_len"]), KEY)
        resp = c.getresponse()
        r["status"] = resp.status
        if r["kind"] == "stream" and resp.status == 200:
            for line in resp:          # one SSE line at a time
                line = line.decode().rstrip("\n")
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                j = json.loads(data) if data.startswith("{") else {}
                with lock:
                    r["events"].append(data)
                    if j.get("choices") and j["choices"][0].get("finish_reason") is None:
                        r["tokens"] += 1          # token messages (chunks) so far
                    if j.get("usage"):
                        r["usage"] = j["usage"]
        else:
            r["body"], r["retry_after"] = resp.read().decode(), resp.getheader("Retry-After")
    except Exception as e:            # a timeout or a broken connection: not an ending we accept
        r["exc"] = repr(e)
    r["t_end"] = time.time()

def start(kind, n, prompt_len=40):
    r = {"i": len(reqs), "kind": kind, "max": n, "prompt_len": prompt_len, "tokens": 0, "events": [], "t_end": None,
         "at_kill": None}
    reqs.append(r)
    t = threading.Thread(target=run, args=(r,))
    t.start()
    r["thread"] = t
    return r

def wait_until(cond, what, limit_s=90):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        with lock:
            if cond():
                return
        time.sleep(0.02)
    raise AssertionError(f"never: {what}: {[(r['kind'], r['tokens']) for r in reqs]}")

# The batch: one non-streamed call first (its prompt is computed first: it is decoding at the kill,
# its tokens collected at the gateway, so it must start again), then three streams.
first = [start("whole", LONG)] + [start("stream", LONG) for _ in range(3)]
wait_until(lambda: all(r["tokens"] > 0 for r in first[1:]), "the batch's three streams streaming")
# The prefill worker goes on computing prompts (each gets its first token) while the batch is full:
# longer prompts for these, so that several still wait at the kill.
later = []
for k in range(6):
    later.append(start("stream", SHORT, 160))
    if k >= 2:
        later.append(start("whole", SHORT, 160))

def router0_requests():
    a = top(bin_dir, topo)["router-0"]
    return next((q["depth"] for q in a.get("queues", []) if q["name"] == "requests"), 0)

deadline = time.time() + 30   # every call is at router-0 (its stats come once a heartbeat)
while router0_requests() < len(reqs):
    assert time.time() < deadline, f"router-0 never held the {len(reqs)} requests: {router0_requests()}"
    time.sleep(0.1)
with lock:
    waiting = sum(r["kind"] == "stream" and r["tokens"] == 0 for r in later)
assert waiting >= 1, f"every later stream began before the kill: nothing to move: {[(r['kind'], r['tokens']) for r in reqs]}"
assert all(r["t_end"] is None for r in reqs), "a request ended before the kill"
pid = top(bin_dir, topo)["router-0"]["pid"]
os.kill(pid, signal.SIGKILL)
t_kill = time.time()
with lock:
    for r in reqs:
        r["at_kill"] = r["tokens"]
for r in reqs:
    r["thread"].join()

problems, completed, failed = [], 0, 0
for r in reqs:
    name = f"{r['kind']} {r['i']} ({r['at_kill']} tokens at the kill)"
    if "exc" in r:
        problems.append(f"{name}: {r['exc']}")
        continue
    if r["kind"] == "stream":
        ev = r["events"]
        errs = [e for e in ev if e.startswith("{") and "error" in json.loads(e)]
        done = ev.count("[DONE]")
        if r["status"] != 200:
            problems.append(f"{name}: HTTP {r['status']}")
        elif done == 1 and not errs and ev[-1] == "[DONE]":
            completed += 1
            n = r.get("usage", {}).get("completion_tokens")
            if n != r["max"]:
                problems.append(f"{name}: [DONE] after {n} tokens (usage)")
        elif done == 0 and len(errs) == 1 and ev[-1] == errs[0]:
            failed += 1
            e = json.loads(errs[0])["error"]
            if e["type"] != "server_error" or e["code"] != "unavailable" or "retry" not in e["message"]:
                problems.append(f"{name}: error event {e}")
            if r["tokens"] == 0:
                problems.append(f"{name}: failed without a token: it should have moved to router-1")
        else:
            problems.append(f"{name}: {done} [DONE] and {len(errs)} error events, last {ev[-1:]}")
    else:
        j = json.loads(r["body"])
        if r["status"] == 200:
            completed += 1
            if j["usage"]["completion_tokens"] != r["max"]:
                problems.append(f"{name}: 200 with {j['usage']['completion_tokens']} tokens")
            r["ok"] = True
        elif r["status"] == 503:
            failed += 1
            e = j["error"]
            if set(e) != {"message", "type", "param", "code"} or e["type"] != "server_error" or not r["retry_after"]:
                problems.append(f"{name}: 503 {e} Retry-After {r['retry_after']}")
        else:
            problems.append(f"{name}: HTTP {r['status']} {r['body'][:200]}")
whole_ok = sum(bool(r.get("ok")) for r in reqs)
print(f"kill -9 of router-0 with {sum(r['at_kill'] > 0 for r in reqs)} streams streaming, "
      f"{sum(r['kind'] == 'stream' and r['at_kill'] == 0 for r in reqs)} without a token and "
      f"{sum(r['kind'] == 'whole' for r in reqs)} non-streamed calls; all ended "
      f"{max(r['t_end'] for r in reqs) - t_kill:.1f} s after the kill")
n_whole = sum(r["kind"] == "whole" for r in reqs)
if whole_ok != n_whole:
    problems.append(f"{n_whole - whole_ok} of the {n_whole} non-streamed requests in flight at the kill did not "
                    "complete: nothing of them had been sent, so they should have moved or started again")
g = top(bin_dir, topo)["gateway"]
try:
    moved, lost = metric(g, "requests_moved_total"), metric(g, "requests_router_lost_total")
except KeyError as e:
    moved = lost = None
    problems.append(f"the gateway has no metric {e}")
if moved is not None:
    deadline = time.time() + 10   # its stats come once a heartbeat: wait for a report after the last ending
    while (moved, lost) != (completed, failed) and time.time() < deadline:
        time.sleep(0.3)
        g = top(bin_dir, topo)["gateway"]
        moved, lost = metric(g, "requests_moved_total"), metric(g, "requests_router_lost_total")
    if (moved, lost) != (completed, failed):
        problems.append(f"the gateway counts {moved} moved and {lost} lost; the HTTP clients saw {completed} "
                        f"complete and {failed} fail")
    restarted = metric(g, "requests_restarted_total")
    if restarted < 1:
        problems.append("the batch's non-streamed call was not started again (requests_restarted_total 0)")
    if restarted > n_whole:
        problems.append(f"the gateway restarted {restarted} calls, more than the {n_whole} non-streamed ones")
for p in problems:
    print("PROBLEM:", p)
assert not problems, f"{len(problems)} problems"

# New requests at once: the gateway sends them to router-1 (router-0 may be back by now, or not).
c = http.client.HTTPConnection(host, timeout=60)
c.request("POST", "/v1/completions", body(90, False, 4), KEY)
resp = c.getresponse()
assert resp.status == 200, (resp.status, resp.read())
resp.read()
c.request("POST", "/v1/completions", body(91, True, 4), KEY)
resp = c.getresponse()
text = resp.read().decode()
assert resp.status == 200 and text.rstrip().endswith("data: [DONE]"), (resp.status, text[-300:])
print(f"gateway failover: submitted {len(reqs)} / completed {completed} (non-streamed {whole_ok}, "
      f"{int(restarted)} of them started again) / moved {int(moved)} / failed-retryable {failed} (each ended once); "
      "new requests served")
PY
echo "PASS gateway_failover_multi"
