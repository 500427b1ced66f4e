# The gateway with the official OpenAI client for Node.js (the `openai` npm package, major
# version 6): tests/gateway/openai.test.mjs against a real cluster. The package is installed at
# test time into <build>/node (ignored, kept between runs: a second run installs nothing). Node
# and npm are part of the project's dependencies (tools/install-deps.sh); an npm registry that
# cannot be reached fails the test, loudly, rather than skipping it.
. "$(dirname "$0")/lib.sh"
[ -x "$BIN/troupe-gateway" ] || fail "troupe-gateway is not built (libmicrohttpd-dev missing? make deps)"
[ -f "$ROOT/third_party/tokenizers/qwen3/tokenizer.json" ] || { echo "SKIP: no Qwen3 tokenizer (make deps fetches it)"; exit 0; }
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed (tools/install-deps.sh installs them)"
NODE_DIR=$(cd "$BIN/.." && pwd)/node
if [ ! -f "$NODE_DIR/node_modules/openai/package.json" ]; then
  note "installing the openai npm package into $NODE_DIR"
  mkdir -p "$NODE_DIR"
  timeout 300 npm install --prefix "$NODE_DIR" --no-audit --no-fund --no-save openai@6 >"$WORK/npm.log" 2>&1 \
    || { cat "$WORK/npm.log"; fail "npm install openai@6 failed (is the npm registry reachable?)"; }
fi
echo "openai $(grep -m1 '"version"' "$NODE_DIR/node_modules/openai/package.json" | tr -dc '0-9.')"
. "$ROOT/tests/gateway/lib.sh"
gateway_topology "$WORK/t.yaml" "  admission_queue: 3"
start_cluster "$WORK/t.yaml"
# The test file is copied beside node_modules so `import 'openai'` resolves there.
cp "$ROOT/tests/gateway/openai.test.mjs" "$NODE_DIR/openai.test.mjs"
GW_URL=$(gw_url "$WORK/t.yaml") GW_TOPOLOGY="$WORK/t.yaml" GW_BIN="$BIN" GW_MODEL=qwen3-demo-shape \
  timeout 300 node --test --test-concurrency=1 "$NODE_DIR/openai.test.mjs" || fail "the openai client tests failed"
echo "PASS gateway_openai"
