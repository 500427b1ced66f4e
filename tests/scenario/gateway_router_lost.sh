# The gateway when the router dies (actors/gateway.c, s_peer_event): kill -9 of the router with a
# non-streamed and a streamed completion in flight. Neither HTTP client hangs: the non-streamed one
# gets a 503 in OpenAI's error shape (type server_error, a message saying to retry) with
# Retry-After, the stream gets an SSE error event and is closed; curl's own 60 s limit is not what
# ends either (its exit status says). After the supervisor restarts the router, the gateway serves
# a new request. Then a router that stops (SIGSTOP) with a stream in flight: the supervisor's
# liveness is set past curl's 60 s limit here (3 x 30 s), so the gateway's own heartbeats on its
# router connection are what end the stream (its log names the reason); after SIGCONT the
# gateway serves again.
. "$(dirname "$0")/lib.sh"
[ -x "$BIN/troupe-gateway" ] || fail "troupe-gateway is not built (libmicrohttpd-dev missing? make deps)"
[ -f "$ROOT/third_party/tokenizers/qwen3/tokenizer.json" ] || { echo "SKIP: no Qwen3 tokenizer (make deps fetches it)"; exit 0; }
command -v curl >/dev/null || fail "curl is needed"
. "$ROOT/tests/gateway/lib.sh"
gateway_topology "$WORK/t.yaml" "  admission_queue: 64"
sed -i 's|^  heartbeat_ms: .*|  heartbeat_ms: 30000|' "$WORK/t.yaml"
start_cluster "$WORK/t.yaml"
U=$(gw_url "$WORK/t.yaml")
K="Authorization: Bearer sk-test-alpha-0001"
MODEL=qwen3-demo-shape
long='"max_tokens":2000,"ignore_eos":true,"temperature":0'
curl -s -o "$WORK/whole" -D "$WORK/whole.h" -w '%{http_code}' --max-time 60 -H "$K" \
  -d '{"model":"'$MODEL'","prompt":[5,6,7],'"$long"'}' "$U/v1/completions" >"$WORK/whole.code" &
whole=$!
curl -sN --max-time 60 -H "$K" -d '{"model":"'$MODEL'","prompt":[9,8,7],'"$long"',"stream":true}' \
  "$U/v1/completions" >"$WORK/stream" &
stream=$!
for _ in $(seq 600); do grep -q '^data: {' "$WORK/stream" 2>/dev/null && break; sleep 0.1; done
grep -q '^data: {' "$WORK/stream" || fail "the stream never began"
sleep 0.3   # a few tokens more: both requests are at the decode worker
kill -0 "$whole" 2>/dev/null || fail "the non-streamed request ended before the router was killed: $(cat "$WORK/whole")"
router=$(pgrep -f -- "troupe-router --topology $WORK/t.yaml" | head -1)
kill -9 "$router"
rc_whole=0; wait "$whole" || rc_whole=$?
rc_stream=0; wait "$stream" || rc_stream=$?
note "non-streamed: curl exit $rc_whole, HTTP $(cat "$WORK/whole.code"): $(cat "$WORK/whole")"
note "stream: curl exit $rc_stream, last event: $(grep '^data:' "$WORK/stream" | tail -1 | head -c 300)"
[ "$rc_whole" -ne 28 ] && [ "$rc_stream" -ne 28 ] || fail "an HTTP client waited for its own timeout"
[ "$(cat "$WORK/whole.code")" = 503 ] || fail "the non-streamed request did not get a 503"
grep -qi '^Retry-After: [0-9]' "$WORK/whole.h" || fail "503 without Retry-After"
$PY - "$WORK/whole" "$WORK/stream" <<'PY' || fail "see above"
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert set(e) == {"message", "type", "param", "code"} and e["type"] == "server_error", e
assert "router was lost" in e["message"] and "retry" in e["message"], e
events = [l[6:] for l in open(sys.argv[2]) if l.startswith("data: ")]
errs = [json.loads(x)["error"] for x in events if x.startswith("{") and "error" in json.loads(x)]
assert len(errs) == 1, f"{len(errs)} error events in the stream"
assert errs[0]["type"] == "server_error" and "router was lost" in errs[0]["message"], errs[0]
assert events[-1].startswith("{") and "error" in json.loads(events[-1]), "the error is not the stream's last event"
print(f"stream: {len(events) - 1} chunks, then the error event")
PY
wait_for grep -q "router ready in .*restarted" "$WORK/supervisor.log" || fail "router not restarted"
ok=0
for _ in $(seq 50); do
  c=$(curl -s -o "$WORK/after" -w '%{http_code}' --max-time 60 -H "$K" \
    -d '{"model":"'$MODEL'","prompt":[1,2,3],"max_tokens":3}' "$U/v1/completions")
  [ "$c" = 200 ] && { ok=1; break; }
  sleep 0.2
done
[ "$ok" = 1 ] || fail "the gateway does not serve after the router's restart: $c $(cat "$WORK/after")"

note "a stopped router: the gateway's heartbeats"
curl -sN --max-time 60 -H "$K" -d '{"model":"'$MODEL'","prompt":[4,4,4],'"$long"',"stream":true}' \
  "$U/v1/completions" >"$WORK/stream2" &
stream=$!
for _ in $(seq 600); do grep -q '^data: {' "$WORK/stream2" 2>/dev/null && break; sleep 0.1; done
grep -q '^data: {' "$WORK/stream2" || fail "the second stream never began"
router=$(pgrep -f -- "troupe-router --topology $WORK/t.yaml" | head -1)
kill -STOP "$router"
rc_stream=0; wait "$stream" || rc_stream=$?
kill -CONT "$router"
note "stream: curl exit $rc_stream, last event: $(grep '^data:' "$WORK/stream2" | tail -1 | head -c 300)"
[ "$rc_stream" -ne 28 ] || fail "the stream waited for curl's own timeout"
grep '^data:' "$WORK/stream2" | tail -1 | grep -q 'the router was lost' || fail "the stream did not end with the error event"
grep -q "gateway .* was lost (its client connection dropped)" "$WORK/supervisor.log" \
  || { grep "lost" "$WORK/supervisor.log"; fail "not the gateway's heartbeats that ended it"; }
ok=0
for _ in $(seq 100); do
  c=$(curl -s -o "$WORK/after" -w '%{http_code}' --max-time 60 -H "$K" \
    -d '{"model":"'$MODEL'","prompt":[1,2,3],"max_tokens":3}' "$U/v1/completions")
  [ "$c" = 200 ] && { ok=1; break; }
  sleep 0.3
done
[ "$ok" = 1 ] || fail "the gateway does not serve after the router resumed: $c $(cat "$WORK/after")"
echo "PASS gateway_router_lost"
