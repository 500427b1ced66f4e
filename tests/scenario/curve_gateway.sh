# CURVE and the OpenAI gateway (docs/security.md, docs/gateway.md): with keys in the topology the
# gateway's DEALER to the router's client endpoint is a CURVE client with the gateway's own key,
# which the router admits; an HTTP completion is answered through it. A plaintext client at the
# same endpoint still gets nothing, so the answer proves the gateway went through CURVE.
. "$(dirname "$0")/lib.sh"
[ -x "$BIN/troupe-gateway" ] || { echo "SKIP: troupe-gateway is not built (libmicrohttpd-dev missing?)"; exit 0; }
[ -f "$ROOT/third_party/tokenizers/qwen3/tokenizer.json" ] || { echo "SKIP: no Qwen3 tokenizer (make deps fetches it)"; exit 0; }
command -v curl >/dev/null || fail "curl is needed"
. "$ROOT/tests/gateway/lib.sh"
mkdir -p "$WORK/keys"
for k in server alice; do "$BIN/troupe-keygen" "$WORK/keys/$k" >/dev/null; done
cp "$WORK/keys/alice.pub" "$WORK/keys/clients"
gateway_topology "$WORK/t.yaml" "  admission_queue: 16"
cat >> "$WORK/t.yaml" <<YAML
security:
  curve_server_public: $WORK/keys/server.pub
  curve_server_secret: $WORK/keys/server.key
  curve_clients: $WORK/keys/clients
YAML
start_cluster "$WORK/t.yaml"
U=$(gw_url "$WORK/t.yaml")
body='{"model":"qwen3-demo-shape","prompt":"Hello","max_tokens":4,"temperature":0}'
st=$(curl -s -o "$WORK/c.json" -w '%{http_code}' --max-time 60 -H "Authorization: Bearer sk-test-alpha-0001" \
  -d "$body" "$U/v1/completions") || true
note "completion through the gateway under CURVE: HTTP $st"
[ "$st" = 200 ] || { cat "$WORK/c.json"; echo; grep -i gateway "$WORK/supervisor.log" | tail -20; fail "the gateway under CURVE got HTTP $st"; }
$PY - "$WORK/c.json" <<'PY' || fail "the completion's body"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["object"] == "text_completion", j
assert j["usage"]["completion_tokens"] >= 1, j
PY
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
rc=0; timeout 30 "$BIN/troupe-client" --endpoint "$ep" --timeout-ms 3000 submit --ids 1,2,3 --max-tokens 2 \
  >"$WORK/nokey.out" 2>&1 || rc=$?
[ "$rc" -eq 3 ] || { cat "$WORK/nokey.out"; fail "a plaintext client at the CURVE endpoint got an answer (exit $rc)"; }
echo "PASS curve_gateway"
