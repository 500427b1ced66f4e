# tests/gateway/lib.sh — helpers for the gateway scenarios (sourced after lib.sh).

# gateway_topology FILE [lines for limits:]: the demo model (Qwen3 tokenizer and chat template,
# dummy weights) with one decode worker, a gateway on a free port and four API keys: alpha and
# beta unlimited, "limited" at 2 requests a minute, "tokens" at 10 tokens a minute. Heartbeats
# every second: the floods of these tests load a 2-core machine, and a 200 ms heartbeat could
# have the supervisor kill a busy router as wedged.
gateway_topology() {
  local file=$1; shift
  MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-demo-shape LOAD_FORMAT=dummy N_DECODE=1 HEARTBEAT_MS=1000 \
    make_topology "$file" "limits:" "$@" "gateway:" "  max_body_bytes: 65536" "  idle_timeout_s: 2" \
    "  body_timeout_s: 5" "  api_keys:" \
    "    - key: sk-test-alpha-0001" "      tenant: alpha" \
    "    - key: sk-test-beta-0002" "      tenant: beta" \
    "    - key: sk-test-limited-03" "      tenant: limited" "      requests_per_minute: 2" \
    "    - key: sk-test-tokens-004" "      tenant: tokens" "      tokens_per_minute: 10"
  sed -i "s|^  load_format: dummy|  load_format: dummy\n  dtype: bf16\n  tokenizer: $ROOT/third_party/tokenizers/qwen3|" "$file"
  sed -i "s|^  - role: draft-scheduler|  - role: draft-scheduler\n  - role: gateway|" "$file"
  sed -i "s|^  run_dir: |  http: tcp://127.0.0.1:$(free_port)\n  run_dir: |" "$file"
}

# gw_url TOPOLOGY: http://host:port of the gateway
gw_url() { echo "http://$(grep '^  http:' "$1" | sed 's|.*tcp://||')"; }

# gw_wait_cancelled TOPOLOGY BEFORE: waits (30 s at most) until the router's requests_cancelled
# passes BEFORE; prints the new count, or fails the test.
gw_wait_cancelled() {
  local now
  for _ in $(seq 60); do
    sleep 0.5
    now=$(gw_router_metric "$1" requests_cancelled)
    if [ "$now" -gt "$2" ]; then echo "$now"; return 0; fi
  done
  fail "the router never saw the request cancelled (requests_cancelled $2 -> $now)"
}

# gw_router_metric TOPOLOGY NAME: the router's metric as the monitor reports it (0 if absent)
gw_router_metric() {
  top_json "$1" | $PY -c '
import json,sys
d=json.load(sys.stdin)
for a in d.get("actors", []):
    if a["role"]=="router":
        print(int(next((m["value"] for m in a.get("metrics", []) if m["name"] == sys.argv[1]), 0))); break
else: print(0)' "$2"
}
