# Expert-parallel decode through the whole cluster (supervisor, router, prefill, KV hand-off, a
# decode worker leading a group of `ep` processes: itself and ep - 1 troupe-expert-rank processes,
# each holding only its experts): greedy tokens of groups of 2 and of 4 equal the one-process
# troupe-generate output, for the MoE fixtures (qwen3-moe-f32, mixtral-f32) and kjv-moe from the
# shared models folder (TROUPE_MODELS; skipped with a message when absent). Then kill -9 of one
# expert rank while 8 requests stream: every request ends with exactly one terminal reply (a
# retryable error or done with all its tokens), the worker exits and is restarted with a fresh
# group, and a request after that is exact again.
. "$(dirname "$0")/lib.sh"
MODELS=${TROUPE_MODELS:-$ROOT/../shared/models}
# ranks_of NAME: the troupe-expert-rank processes under the instance's process.
ranks_of() {
  local pid=
  for _ in $(seq 100); do   # the monitor lists an actor after its first stats
    pid=$("$BIN/troupe-top" --topology "$1" --json | /usr/bin/python3 -c 'import json, sys
print(([a["pid"] for a in json.load(sys.stdin).get("actors", []) if a["name"] == sys.argv[1]] + [""])[0])' "$2")
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] || fail "$2 is not in troupe-top"
  ps --ppid "$pid" -o pid=,args= | awk '$2 ~ /troupe-expert-rank$/ {printf "%s ", $1}'
}
cases=("$ROOT/tests/fixtures/models/qwen3-moe-f32" "$ROOT/tests/fixtures/models/mixtral-f32")
if [ -f "$MODELS/kjv-moe/config.json" ]; then
  cases+=("$MODELS/kjv-moe")
else
  echo "SKIP kjv-moe: $MODELS/kjv-moe is absent (set TROUPE_MODELS)"
fi
PROMPTS="1,5,9,14,3 2,7,7,30,11,4,19,23,8 40,41,42"
stop_cluster() {
  kill -TERM "$SUP_PID" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$SUP_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$SUP_PID" 2>/dev/null || true
  SUP_PID=
}
for dir in "${cases[@]}"; do
  name=$(basename "$dir")
  : > "$WORK/$name.generate"
  for ids in $PROMPTS; do
    "$BIN/troupe-generate" "$dir" --ids "$ids" --chunk 8 --max-tokens 24 --temperature 0 --ignore-eos --json \
      | /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))' >> "$WORK/$name.generate"
  done
  for n in 2 4; do
    note "$name, expert-parallel group of $n"
    MODEL_PATH=$dir N_PREFILL=1 N_DECODE=1 DECODE_EP=$n make_topology "$WORK/$name-$n.yaml" "limits:" \
      "  prefill_chunk_tokens: 8" "  max_batch: 16"
    start_cluster "$WORK/$name-$n.yaml"
    ranks=$(ranks_of "$WORK/$name-$n.yaml" decode)
    [ "$(echo $ranks | wc -w)" = $((n - 1)) ] || fail "$name: decode has expert ranks '$ranks', want $((n - 1))"
    ep=$(grep 'client:' "$WORK/$name-$n.yaml" | awk '{print $2}')
    PYTHONPATH="$ROOT/tools" /usr/bin/python3 - "$ep" "$WORK/$name.generate" "$PROMPTS" <<'PY'
import sys, threading
from troupe_client import Client
ep, gen, prompts = sys.argv[1], open(sys.argv[2]).read().split(), sys.argv[3].split()
want = [list(map(int, g.split(","))) for g in gen]
got, errors = {}, []
def run(i):   # all at once: the decode batch mixes the requests
    try:
        with Client(ep, timeout_s=120) as c:
            toks = []
            for m in c.generate(tokens=list(map(int, prompts[i].split(","))), max_tokens=24, temperature=0,
                                ignore_eos=True):
                if m["type"] == "token":
                    toks += m["tokens"]
                elif m["type"] == "error":
                    errors.append((i, m))
            got[i] = toks
    except Exception as e:
        errors.append((i, repr(e)))
ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors
for i in range(len(prompts)):
    assert got[i] == want[i], f"prompt {i}: cluster {got[i]}, troupe-generate {want[i]}"
print(f"{len(prompts)} prompts x 24 tokens equal troupe-generate")
PY
    [ "$(ranks_of "$WORK/$name-$n.yaml" decode)" = "$ranks" ] || fail "$name: the expert ranks changed while serving"
    stop_cluster
  done
done

note "placements while serving (qwen3-moe-f32, group of 4, a window of 4 steps, a placement every 2 windows)"
dir=$ROOT/tests/fixtures/models/qwen3-moe-f32
MODEL_PATH=$dir N_PREFILL=1 N_DECODE=1 DECODE_EP=4 make_topology "$WORK/place.yaml" "limits:" \
  "  prefill_chunk_tokens: 8" "  max_batch: 16" "experts:" "  window_steps: 4" "  interval_steps: 8" \
  "  redundant_slots: 1"
start_cluster "$WORK/place.yaml"
ep=$(grep 'client:' "$WORK/place.yaml" | awk '{print $2}')
PYTHONPATH="$ROOT/tools:$ROOT/tests/scenario" /usr/bin/python3 - "$ep" "$BIN" "$WORK/place.yaml" \
  "$WORK/qwen3-moe-f32.generate" "$PROMPTS" <<'PY'
import sys, threading, time
from troupe_client import Client
from servelib import top, metric
ep, bin_dir, topo, gen, prompts = sys.argv[1], sys.argv[2], sys.argv[3], open(sys.argv[4]).read().split(), sys.argv[5].split()
want = [list(map(int, g.split(","))) for g in gen]
def ep_metric(name):
    # The monitor lists an actor once its stats arrived: between two of them (a placement being
    # switched to holds the worker's loop) it may be absent; the loop below asks again.
    d = top(bin_dir, topo)
    return (metric(d["decode"], name) or 0) if "decode" in d else 0, d
def round_once():
    got, errors = {}, []
    def run(i):
        with Client(ep, timeout_s=120) as c:
            toks = []
            for m in c.generate(tokens=list(map(int, prompts[i].split(","))), max_tokens=24, temperature=0,
                                ignore_eos=True):
                if m["type"] == "token":
                    toks += m["tokens"]
                elif m["type"] == "error":
                    errors.append((i, m))
            got[i] = toks
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in ts: t.start()
    for t in ts: t.join()
    assert not errors, errors
    for i in range(len(prompts)):
        assert got[i] == want[i], f"prompt {i}: cluster {got[i]}, troupe-generate {want[i]}"
rounds, t0 = 0, time.time()
switched = 0
while time.time() - t0 < 90:
    round_once()
    rounds += 1
    switched, d = ep_metric("ep_switches_total")
    if switched >= 2:
        break
assert switched >= 2, f"{switched} placements switched to after {rounds} rounds"
round_once()   # and after the last switch
for _ in range(50):   # the balancer's next stats carry the placement's ratios
    d = top(bin_dir, topo)
    eb = d.get("expert-balancer", {})
    if "decode" in d and any(m["name"] == "layer0_busiest_over_avg_placed" for m in eb.get("metrics", [])):
        break
    time.sleep(0.1)
print(f"{rounds + 1} rounds of {len(prompts)} prompts exact; the group switched placements {int(switched)} times "
      f"(epoch {int(metric(d['decode'], 'ep_epoch'))}, {int(metric(d['decode'], 'ep_experts_loaded_total'))} experts "
      f"loaded); the balancer pushed {int(metric(eb, 'placements_pushed'))}, layer 0 busiest/average "
      f"{metric(eb, 'layer0_busiest_over_avg_in_order'):.3f} in order -> {metric(eb, 'layer0_busiest_over_avg_placed'):.3f}")
PY
"$BIN/troupe-top" --topology "$WORK/place.yaml" --once > "$WORK/top.txt"
for want in "EXPERT GROUP" "EXPERT BALANCER" "load per expert" "placement (experts per rank)" "rank 3:"; do
  grep -q "$want" "$WORK/top.txt" || { cat "$WORK/top.txt"; fail "troupe-top has no '$want'"; }
done
sed -n '/^EXPERT GROUP/,$p' "$WORK/top.txt" | head -20
stop_cluster

note "kill -9 of an expert rank while 8 requests stream (qwen3-moe-f32, group of 2)"
dir=$ROOT/tests/fixtures/models/qwen3-moe-f32
MODEL_PATH=$dir N_PREFILL=1 N_DECODE=1 DECODE_EP=2 make_topology "$WORK/kill.yaml" "limits:" "  max_batch: 16"
start_cluster "$WORK/kill.yaml"
rank=$(ranks_of "$WORK/kill.yaml" decode)
ep=$(grep 'client:' "$WORK/kill.yaml" | awk '{print $2}')
PYTHONPATH="$ROOT/tools:$ROOT/tests/scenario" /usr/bin/python3 - "$ep" "$BIN" "$WORK/kill.yaml" "$rank" \
  "$(sed -n 1p "$WORK/qwen3-moe-f32.generate")" <<'PY'
import os, signal, sys, threading, time
from troupe_client import Client
from servelib import top, wait_restarted
ep, bin_dir, topo, rank, want0 = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
streaming, results = set(), {}
def stream(key, n_tokens):
    with Client(ep, timeout_s=120) as c:
        toks, last, n_final = 0, None, 0
        for m in c.generate(tokens=[1 + key, 5, 9, 14, 3], max_tokens=n_tokens, temperature=0, ignore_eos=True):
            if m["type"] == "token":
                toks += len(m["tokens"])
                streaming.add(key)
            else:
                n_final += 1
            last = m
        results[key] = (toks, last, n_final)
ts = [threading.Thread(target=stream, args=(i, 400)) for i in range(8)]
for t in ts: t.start()
deadline = time.time() + 60
while len(streaming) < 8 and time.time() < deadline:
    time.sleep(0.05)
assert len(streaming) == 8, f"only {len(streaming)} of 8 streams started"
pid = top(bin_dir, topo)["decode"]["pid"]
os.kill(rank, signal.SIGKILL)
t0 = time.time()
for t in ts: t.join(timeout=90)
assert all(not t.is_alive() for t in ts), "a request hangs after the expert rank died"
assert len(results) == 8, "a request got no terminal reply"
failed = [r for r in results.values() if r[1]["type"] == "error"]
done = [r for r in results.values() if r[1]["type"] == "done"]
assert len(failed) + len(done) == 8 and all(r[2] == 1 for r in results.values()), results
for toks, m, _ in failed:
    assert m["retryable"], m
for toks, m, _ in done:
    assert toks == 400, (toks, m)
print(f"kill -9 of expert rank {rank}: {len(failed)} ended with a retryable error "
      f"({sorted(set(m['code_name'] for _, m, _ in failed))}), {len(done)} completed, in {time.time() - t0:.1f} s")
# The worker learns at its next MoE layer that its group is gone and exits; a request now ends
# (worker_lost, retryable) or, once the worker is back, completes. Then it is exact again.
ok = None
for attempt in range(40):
    with Client(ep, timeout_s=60) as c:
        toks, last = [], None
        for m in c.generate(tokens=[1, 5, 9, 14, 3], max_tokens=24, temperature=0, ignore_eos=True):
            if m["type"] == "token":
                toks += m["tokens"]
            last = m
    if last["type"] == "done":
        ok = toks
        break
    assert last["type"] == "error" and last["retryable"], last
    time.sleep(0.5)
assert ok is not None, "no request completed after the rank died"
assert ",".join(map(str, ok)) == want0, (ok, want0)
wait_restarted(bin_dir, topo, "decode", pid, restarts=1, timeout_s=30)
print(f"decode restarted with a fresh group after {attempt + 1} request(s); output exact again")
PY
[ -n "$(ranks_of "$WORK/kill.yaml" decode)" ] || fail "the restarted decode worker has no expert rank"
echo "PASS ep_exact"
