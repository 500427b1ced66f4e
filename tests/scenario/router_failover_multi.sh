# Client failover between two routers (issue 21, item 4): a topology with router-0 and router-1,
# each on its own client endpoint (endpoints.clients). 12 Python clients (tools/troupe_client.py,
# given both endpoints) and 4 troupe-client processes (the C library, both endpoints from
# --topology) submit at once; every request goes to router-0 (a client's first router). The
# decode batch holds 4 (limits.max_batch), so most requests wait without a token. Once some
# stream and some wait, router-0 gets kill -9. Checked: every request ends exactly once; each that
# had no token then is sent again to router-1 by its client (retried) and completes there, done
# with all its tokens and its seqs unbroken; a request that fails has streamed (tokens came before
# its error: a generation that cannot go on elsewhere), with the retryable unavailable error, and
# was not retried; no other ending. Then router-0 is restarted, every KV pool is idle, and new requests complete.
# Prints submitted / completed / retried / failed-retryable.
# FAILOVER=0 gives the clients router-0's endpoint alone (the behaviour before failover): the
# waiting requests then fail with unavailable too, and the test fails.
. "$(dirname "$0")/lib.sh"
N_ROUTERS=2 make_demo_topology "$WORK/t.yaml" "limits:
  max_batch: 4
  max_model_len: 1024
  prefill_chunk_tokens: 64"
start_cluster "$WORK/t.yaml"
eps=$(client_endpoints "$WORK/t.yaml")
first=${eps%%,*}
[ "$eps" != "$first" ] || fail "the topology has one client endpoint: $eps"
if [ "${FAILOVER:-1}" = 1 ]; then py_eps=$eps; c_args=(--topology "$WORK/t.yaml"); else py_eps=$first; c_args=(--endpoint "$first"); fi
N_C=4
pids=()
for i in $(seq 0 $((N_C - 1))); do
  "$BIN/troupe-client" "${c_args[@]}" --json --timeout-ms 120000 \
    submit --ids "$((500 + i)),$(seq -s, 1 40)" --max-tokens 64 --ignore-eos --temperature 0 \
    >"$WORK/c$i.out" 2>"$WORK/c$i.err" &
  pids+=($!)
done
$PY - "$py_eps" "$BIN" "$WORK/t.yaml" "$WORK" "$N_C" <<'PY' || fail "see above"
import json, os, signal, sys, threading, time
from troupe_client import Client
from servelib import top, wait_idle_pools, wait_restarted
eps, bin_dir, topo, work, n_c = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
N, MAX_TOKENS = 12, 64
lock = threading.Lock()
state = {}      # i -> {"tokens": n, "seq_ok": bool, "ends": [terminal...], "retried": n, "at_kill": tokens}
clients = [Client(eps, timeout_s=120) for _ in range(N)]

def run(i):
    c, s = clients[i], state[i]
    before = c.requests_retried
    rid = c.send("submit", tokens=[600 + i] + list(range(1, 41)), stream=True,
                 sampling={"max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0})
    deadline = time.time() + 120
    while time.time() < deadline and not s["ends"]:
        m = c.recv(max(0.01, deadline - time.time()))
        if m is None:
            break
        assert m.get("id") == rid, m
        with lock:
            if m["type"] == "token":
                s["seq_ok"] &= m.get("seq") == s["tokens"]
                s["tokens"] += len(m["tokens"])
            else:
                s["ends"].append(m)
    while c.recv(0.5) is not None:   # a second terminal reply, or anything else, would show here
        s["ends"].append("extra")
    s["retried"] = c.requests_retried - before

for i in range(N):
    state[i] = {"tokens": 0, "seq_ok": True, "ends": [], "retried": 0, "at_kill": None}
ts = [threading.Thread(target=run, args=(i,)) for i in range(N)]
for t in ts: t.start()

def c_tokens(i):
    """Tokens a troupe-client has printed so far (its --json stream: one object after another)."""
    try:
        text = open(f"{work}/c{i}.out").read()
    except OSError:
        return 0
    dec, pos, n = json.JSONDecoder(), 0, 0
    while pos < len(text):
        while pos < len(text) and text[pos].isspace(): pos += 1
        if pos >= len(text): break
        try:
            m, pos = dec.raw_decode(text, pos)
        except ValueError:
            break
        n += len(m.get("tokens", [])) if m.get("type") == "token" else 0
    return n

# Kill once some requests stream and some wait (no token yet), none finished.
deadline = time.time() + 90
while time.time() < deadline:
    with lock:
        toks = [state[i]["tokens"] for i in range(N)]
    streaming, waiting = sum(t > 0 for t in toks), sum(t == 0 for t in toks)
    if streaming >= 2 and waiting >= 2:
        break
    time.sleep(0.02)
else:
    raise AssertionError(f"no moment with streaming and waiting requests: {toks}")
router = top(bin_dir, topo)["router-0"]["pid"]
os.kill(router, signal.SIGKILL)
with lock:
    for i in range(N):
        state[i]["at_kill"] = state[i]["tokens"]
c_at_kill = [c_tokens(i) for i in range(n_c)]
t_kill = time.time()
for t in ts: t.join()

problems = []
counts = {"submitted": N, "completed": 0, "retried": 0, "failed-retryable": 0}
for i in range(N):
    s = state[i]
    if len(s["ends"]) != 1:
        problems.append(f"python {i}: {len(s['ends'])} terminal replies: {s['ends']}")
        continue
    e = s["ends"][0]
    counts["retried"] += s["retried"]
    if e["type"] == "done":
        counts["completed"] += 1
        if s["tokens"] != MAX_TOKENS or not s["seq_ok"] or e["usage"]["completion_tokens"] != MAX_TOKENS:
            problems.append(f"python {i}: done with {s['tokens']} tokens (seqs in order: {s['seq_ok']})")
        if s["at_kill"] == 0 and s["retried"] != 1:
            problems.append(f"python {i}: no token at the kill, done, but retried {s['retried']} times")
    elif e["type"] == "error" and e.get("code_name") == "unavailable" and e.get("retryable"):
        counts["failed-retryable"] += 1
        if s["tokens"] == 0 or s["retried"]:
            problems.append(f"python {i}: failed with {s['tokens']} tokens streamed, retried {s['retried']} "
                            f"times: {e.get('message')}")
    else:
        problems.append(f"python {i}: ended with {e}")
with open(f"{work}/py.counts", "w") as f:
    json.dump({"counts": counts}, f)
print(f"kill -9 of router-0 with {sum(state[i]['at_kill'] > 0 for i in range(N))} Python requests streaming "
      f"and {sum(state[i]['at_kill'] == 0 for i in range(N))} waiting (C: {c_at_kill} tokens each); all ended "
      f"{time.time() - t_kill:.1f} s after the kill")
for p in problems:
    print("PROBLEM:", p)
assert not problems, f"{len(problems)} problems"
assert counts["retried"] >= 1 and counts["failed-retryable"] >= 1, counts

wait_restarted(bin_dir, topo, "router-0", router)
wait_idle_pools(bin_dir, topo, timeout_s=30)
for i, c in enumerate(clients):   # the same clients serve again
    last = list(c.generate(tokens=[1, 2, 3, 4], max_tokens=4))[-1]
    assert last["type"] == "done", (i, last)
    c.close()
with Client(eps.split(",")[0], timeout_s=60) as c:   # router-0, restarted, serves too
    last = list(c.generate(tokens=[5, 6, 7, 8], max_tokens=4))[-1]
    assert last["type"] == "done", last
print("router-0 restarted, every KV pool idle, every client served again (router-0 too)")
PY
# The troupe-client processes: exactly one terminal reply each; done with every token, or failed
# (retryable) after some tokens and never sent again; one that was sent again (it says so) completed.
c_done=0; c_failed=0; c_retried=0
for i in $(seq 0 $((N_C - 1))); do
  rc=0; wait "${pids[$i]}" || rc=$?
  read -r n_term final n_tok < <($PY -c '
import json, sys
text, dec, pos, ms = open(sys.argv[1]).read(), json.JSONDecoder(), 0, []
while pos < len(text):
    while pos < len(text) and text[pos].isspace(): pos += 1
    if pos >= len(text): break
    m, pos = dec.raw_decode(text, pos); ms.append(m)
ends = [m for m in ms if m.get("type") in ("done", "error")]
last = ends[-1] if ends else {}
kind = "done" if last.get("type") == "done" else "unavailable" if last.get("code_name", last.get("code")) in ("unavailable", 3) and last.get("retryable") else "other"
print(len(ends), kind, sum(len(m.get("tokens", [])) for m in ms if m.get("type") == "token"))' "$WORK/c$i.out")
  retried=$(grep -c "was sent again to another router" "$WORK/c$i.err" || true)
  [ "$n_term" = 1 ] || fail "troupe-client $i: $n_term terminal replies (rc $rc): $(cat "$WORK/c$i.err")"
  case $final in
    done) [ "$rc" = 0 ] && [ "$n_tok" = 64 ] || fail "troupe-client $i: done with $n_tok tokens, rc $rc"
          c_done=$((c_done + 1)) ;;
    unavailable) [ "$n_tok" -gt 0 ] && [ "$retried" = 0 ] || \
            fail "troupe-client $i: failed after $n_tok tokens, sent again $retried times: $(tail -c 300 "$WORK/c$i.out")"
          c_failed=$((c_failed + 1)) ;;
    *) fail "troupe-client $i: ended with $(tail -c 300 "$WORK/c$i.out")" ;;
  esac
  c_retried=$((c_retried + retried))
done
$PY - "$WORK/py.counts" "$N_C" "$c_done" "$c_retried" "$c_failed" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["counts"]
n_c, done, retried, failed = map(int, sys.argv[2:])
tot = {"submitted": c["submitted"] + n_c, "completed": c["completed"] + done, "retried": c["retried"] + retried,
       "failed-retryable": c["failed-retryable"] + failed}
assert tot["completed"] + tot["failed-retryable"] == tot["submitted"], tot
assert tot["retried"] >= 1 and tot["failed-retryable"] >= 1, tot
print("router failover: submitted %(submitted)d / completed %(completed)d / retried %(retried)d / "
      "failed-retryable %(failed-retryable)d (each ended once)" % tot)
PY
echo "PASS router_failover_multi"
