# Expert-parallel decode through the whole cluster (supervisor, router, prefill, KV hand-off):
# `ep: N` decode instances form a group, each a whole worker with its own requests, KV pool and
# steps (attention data-parallel), every MoE layer exchanged over the group in lockstep, each rank
# holding only its experts. 8 requests at once land on every rank of a group of 2 and of 4 (checked
# per rank in troupe-top), and every greedy output equals the one-process troupe-generate output,
# for the MoE fixtures (qwen3-moe-f32, mixtral-f32, deepseek-v3-f32: MLA with DeepSeekMoE's
# group-limited routing and shared expert) and kjv-moe and kjv-deepseek from the shared models
# folder (TROUPE_MODELS; each skipped with a message when absent); kjv-deepseek in a group of 2
# with MTP speculation too (exact, drafts accepted on every rank). Placements from the balancer
# are switched to while serving, output still exact. Then kill -9 of one rank of a group of 2 and
# of 4 while 8 requests stream on every rank: every request ends with exactly one terminal reply (a
# retryable error or done with all its tokens), every rank is restarted (the survivors exit when
# their group fails) and they meet again, and requests on every rank are exact again. Every cluster must stop
# cleanly (the ranks drain together). BACKEND=cuda runs it all on GPU 0, every process sharing it
# (the reference is troupe-generate on the same GPU). Requests go through the C client
# (troupe-client, servelib.c_generate): no pyzmq needed (the GPU machine has none).
# EP_SIZES="1 2 4" also serves each model with one decode worker and no group (1): on a GPU, a
# difference from troupe-generate there too is the batch's rounding, not the group's. On CUDA a rank
# computes a peer's entries with the arithmetic of the peer's rows (moe_ffn_as, engine/ep.c): ranks
# of at most 8 rows a step round their experts as one process at batch 1 does (f32 activations), so
# the groups here must be exact with the defaults; before, 16 entries took bf16 activations and
# kjv-deepseek's prompt 2 flipped a routing near-tie at token 19 (H200, 2026-12-03).
# GPUS=N (BACKEND=cuda, NODE_GPUS >= N): rank r of every group on GPU r mod N (the prefill worker on
# GPU 0), so a group of at most N ranks has each rank on its own GPU and must run its dispatch and
# combine over NCCL, a larger one shares GPUs and keeps the unix sockets: every group's ranks'
# ep_transport_nccl is checked against that (on the CPU, and with one GPU, always the sockets).
# E.g. BACKEND=cuda GPUS=2 NODE_GPUS=2 EP_SIZES="2 4": the group of 2 over NCCL, of 4 over sockets.
. "$(dirname "$0")/lib.sh"
MODELS=${TROUPE_MODELS:-$ROOT/../shared/models}
GPUS=${GPUS:-1}
# ep_gpus N: the decode instances' GPUs for a group of N (exported as DECODE_GPUS for
# make_topology); with one GPU the topology's default (every worker on GPU 0), as before.
ep_gpus() {
  if [ "${BACKEND:-cpu}" = cuda ] && [ "$GPUS" -ge 2 ]; then
    local s="" r
    for ((r = 0; r < $1; r++)); do s+="${s:+, }$((r % GPUS))"; done
    export DECODE_GPUS="[$s]"
  else
    unset DECODE_GPUS
  fi
}
# ep_transport TOPO N: every rank of the group of N shows the transport it must have chosen
# (ep_transport_nccl 1 when each rank has its own GPU on CUDA, else 0), else fail, with the ranks'
# log lines saying what they chose and why.
ep_transport() {
  local want=0
  if [ "${BACKEND:-cpu}" = cuda ] && [ "$GPUS" -ge 2 ] && [ "$2" -le "$GPUS" ]; then want=1; fi
  PYTHONPATH="$ROOT/tests/scenario${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 - "$BIN" "$1" "$2" "$want" <<'PY' \
    || { grep -E "expert-parallel group .*(transport|NCCL)" "$WORK/supervisor.log" | tail -8; fail "ep_transport_nccl"; }
import subprocess, sys, time
from servelib import top, metric
bin_dir, topo, n, want = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
got = []
for _ in range(50):   # each rank's stats arrive every second
    try:
        d = top(bin_dir, topo)
        got = [int(metric(d[f"decode-{r}"], "ep_transport_nccl")) for r in range(n)]
        break
    except (KeyError, subprocess.CalledProcessError):
        time.sleep(0.2)
assert got == [want] * n, f"ep_transport_nccl per rank {got}, expected {[want] * n} ({'nccl' if want else 'sock'})"
print(f"ep_transport_nccl per rank: {got} ({'nccl' if want else 'sock'})")
PY
  grep -E "expert-parallel group .* transport (nccl|sock)" "$WORK/supervisor.log" | head -1 | sed 's/^.*\(expert-parallel group\)/\1/'
}
# ranks_served TOPO N: every decode-R (R < N; "decode" when N is 1) has finished a request
# (troupe-top), else fail.
ranks_served() {
  PYTHONPATH="$ROOT/tests/scenario${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 - "$BIN" "$1" "$2" <<'PY'
import subprocess, sys, time
from servelib import top, metric
bin_dir, topo, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(50):   # the requests' counts arrive with each rank's next stats
    try:
        d = top(bin_dir, topo)
    except subprocess.CalledProcessError as e:   # the monitor slow to answer on a loaded machine
        print(f"troupe-top: {e.stderr.strip()}")
        d = {}
    names = [f"decode-{r}" for r in range(n)] if n > 1 else ["decode"]   # one instance has no index
    done = [int(metric(d[a], "requests_finished_total") or 0) if a in d else 0 for a in names]
    if all(done):
        break
    time.sleep(0.2)
assert all(done), f"requests finished per rank {done}: a rank served none"
print(f"requests finished per rank: {done}")
PY
}
# ep_py ARGS...: python3 running the script on stdin with ARGS (sys.argv[1:]), after a prelude
# defining what the request checks share: generate_all(bin_dir, ep, prompts, indices) sends
# prompts[i] (comma-joined ids) for every i in indices all at once, one thread each (the decode
# batch mixes the requests), 24 greedy tokens through the C client, and returns ({i: tokens},
# [(i, error reply)]). A request whose troupe-client raises has no tokens (its thread prints the
# exception), so the caller's check of got[i] fails.
ep_py() {
  PYTHONPATH="$ROOT/tests/scenario${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 -c 'import threading
from servelib import c_generate
def generate_all(bin_dir, ep, prompts, indices):
    got, errors = {}, []
    def run(i):
        toks = []
        for m in c_generate(bin_dir, ep, list(map(int, prompts[i].split(","))), max_tokens=24, timeout_s=120):
            if m["type"] == "token":
                toks += m["tokens"]
            elif m["type"] == "error":
                errors.append((i, m))
        got[i] = toks
    ts = [threading.Thread(target=run, args=(i,)) for i in indices]
    for t in ts: t.start()
    for t in ts: t.join()
    return got, errors
'"$(cat)" "$@"
}
cases=("$ROOT/tests/fixtures/models/qwen3-moe-f32" "$ROOT/tests/fixtures/models/mixtral-f32"
       "$ROOT/tests/fixtures/models/deepseek-v3-f32")
for shared in kjv-moe kjv-deepseek; do
  if [ -f "$MODELS/$shared/config.json" ]; then
    cases+=("$MODELS/$shared")
  else
    echo "SKIP $shared: $MODELS/$shared is absent (set TROUPE_MODELS)"
  fi
done
PROMPTS="1,5,9,14,3 2,7,7,30,11,4,19,23,8 40,41,42 3,3,8,1 17,2,29,6,12 9,9,4 33,21,5,7,1,2 6,28,14"
# stop_cluster: a graceful stop, the ranks of each group draining together: the supervisor exits
# 0 only when every actor exited 0 within the grace period.
stop_cluster() {
  local rc=0
  kill -TERM "$SUP_PID" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$SUP_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$SUP_PID" 2>/dev/null || true
  wait "$SUP_PID" || rc=$?
  SUP_PID=
  [ "$rc" = 0 ] || { grep -E " (WARN|ERROR) " "$WORK/supervisor.log" | tail -5; fail "the cluster did not stop cleanly (supervisor exit $rc)"; }
}
for dir in "${cases[@]}"; do
  name=$(basename "$dir")
  : > "$WORK/$name.generate"
  for ids in $PROMPTS; do
    "$BIN/troupe-generate" "$dir" --backend "${BACKEND:-cpu}" --ids "$ids" --chunk 8 --max-tokens 24 --temperature 0 \
      --ignore-eos --json \
      | /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))' >> "$WORK/$name.generate"
  done
  for n in ${EP_SIZES:-2 4}; do
    note "$name, expert-parallel group of $n"
    ep_gpus "$n"
    MODEL_PATH=$dir N_PREFILL=1 N_DECODE=$n DECODE_EP=$n make_topology "$WORK/$name-$n.yaml" "limits:" \
      "  prefill_chunk_tokens: 8" "  max_batch: 16"
    start_cluster "$WORK/$name-$n.yaml"
    [ "$n" -lt 2 ] || ep_transport "$WORK/$name-$n.yaml" "$n"
    ep=$(grep 'client:' "$WORK/$name-$n.yaml" | awk '{print $2}')
    ep_py "$ep" "$BIN" "$WORK/$name.generate" "$PROMPTS" <<'PY'
import sys
ep, bin_dir, gen, prompts = sys.argv[1], sys.argv[2], open(sys.argv[3]).read().split(), sys.argv[4].split()
want = [list(map(int, g.split(","))) for g in gen]
# Alone first: one rank steps, the others only join its steps.
got, errors = generate_all(bin_dir, ep, prompts, [1])
assert not errors and got[1] == want[1], (errors, got.get(1), want[1])
got, errors = generate_all(bin_dir, ep, prompts, range(len(prompts)))
assert not errors, errors
for i in range(len(prompts)):
    assert got[i] == want[i], f"prompt {i}: cluster {got[i]}, troupe-generate {want[i]}"
print(f"1 prompt alone, then {len(prompts)} at once, x 24 tokens equal troupe-generate")
PY
    ranks_served "$WORK/$name-$n.yaml" "$n"
    ! grep -E "decode-[0-9]+ exited" "$WORK/supervisor.log" || fail "$name: a rank exited while serving"
    stop_cluster
  done
done

if [ -f "$MODELS/kjv-deepseek/config.json" ]; then
  # DeepSeek's MTP layer runs on each rank alone (its experts loaded whole, engine/mla_load.c); the
  # verify steps are ordinary group steps. Lossless: the same greedy tokens, and drafts accepted.
  note "MTP speculation in a group (kjv-deepseek, group of 2, TROUPE_SPECULATION=mtp:3)"
  ep_gpus 2
  MODEL_PATH=$MODELS/kjv-deepseek N_PREFILL=1 N_DECODE=2 DECODE_EP=2 make_topology "$WORK/mtp.yaml" "limits:" \
    "  prefill_chunk_tokens: 8" "  max_batch: 16"
  # fixed: the draft-scheduler's policy would turn speculation off where it does not pay (spec_mtp_exact.sh)
  # On CUDA a verify step is 4 rows a request, and from 9 rows bf16 experts take moe_ffn's grouped
  # path (bf16 activations) where the reference's one-row steps take the FMA path (f32): one process
  # verifying the same batch rounds so too, and on kjv-deepseek that flips a routing near-tie (prompt
  # 2, token 19: the last layer's 4th and 5th experts 1.9e-4 apart, then a 0.48 logit gap). The FMA
  # path up to 64 rows (max_batch 16 x 4) here, so the check compares like arithmetic with like;
  # the groups above, whose ranks have at most 8 rows a step, run the defaults. (The CPU ignores it.)
  TROUPE_CUDA_MOE_GROUPED_MIN_M=65 TROUPE_SPECULATION=mtp:3 TROUPE_SPEC_POLICY=fixed start_cluster "$WORK/mtp.yaml"
  ep_transport "$WORK/mtp.yaml" 2
  ep=$(grep 'client:' "$WORK/mtp.yaml" | awk '{print $2}')
  ep_py "$ep" "$BIN" "$WORK/mtp.yaml" "$WORK/kjv-deepseek.generate" "$PROMPTS" <<'PY'
import sys, time
from servelib import top, metric
ep, bin_dir, topo, gen, prompts = sys.argv[1], sys.argv[2], sys.argv[3], open(sys.argv[4]).read().split(), sys.argv[5].split()
want = [list(map(int, g.split(","))) for g in gen]
got, errors = generate_all(bin_dir, ep, prompts, range(len(prompts)))
assert not errors, errors
for i in range(len(prompts)):
    assert got[i] == want[i], f"prompt {i}: cluster with MTP {got[i]}, troupe-generate {want[i]}"
names = ("spec_verify_steps_total", "spec_draft_tokens_total", "spec_accepted_tokens_total")
for _ in range(50):   # the counts arrive with each rank's next stats
    d = top(bin_dir, topo)
    per = [[int(metric(d[f"decode-{r}"], n) or 0) if f"decode-{r}" in d else 0 for n in names] for r in range(2)]
    if all(p[2] > 0 for p in per):
        break
    time.sleep(0.2)
assert all(p[2] > 0 for p in per), f"[verify steps, drafts, accepted] per rank {per}: a rank accepted no MTP draft"
print(f"{len(prompts)} prompts at once equal troupe-generate; [verify steps, drafts, accepted] per rank {per}")
PY
  stop_cluster
fi

note "placements while serving (qwen3-moe-f32, group of 4, a window of 4 steps, a placement every 2 windows)"
dir=$ROOT/tests/fixtures/models/qwen3-moe-f32
ep_gpus 4
MODEL_PATH=$dir N_PREFILL=1 N_DECODE=4 DECODE_EP=4 make_topology "$WORK/place.yaml" "limits:" \
  "  prefill_chunk_tokens: 8" "  max_batch: 16" "experts:" "  window_steps: 4" "  interval_steps: 8" \
  "  redundant_slots: 1"
start_cluster "$WORK/place.yaml"
ep_transport "$WORK/place.yaml" 4
ep=$(grep 'client:' "$WORK/place.yaml" | awk '{print $2}')
ep_py "$ep" "$BIN" "$WORK/place.yaml" "$WORK/qwen3-moe-f32.generate" "$PROMPTS" <<'PY'
import sys, time
from servelib import top, metric
ep, bin_dir, topo, gen, prompts = sys.argv[1], sys.argv[2], sys.argv[3], open(sys.argv[4]).read().split(), sys.argv[5].split()
want = [list(map(int, g.split(","))) for g in gen]
def ep_metric(name):
    # The monitor lists an actor once its stats arrived: between two of them (a placement being
    # switched to holds the worker's loop) it may be absent; the loop below asks again.
    d = top(bin_dir, topo)
    return min((metric(d[f"decode-{r}"], name) or 0) if f"decode-{r}" in d else 0 for r in range(4)), d
def round_once():
    got, errors = generate_all(bin_dir, ep, prompts, range(len(prompts)))
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
    if "decode-0" in d and any(m["name"] == "layer0_busiest_over_avg_placed" for m in eb.get("metrics", [])):
        break
    time.sleep(0.1)
print(f"{rounds + 1} rounds of {len(prompts)} prompts exact; every rank switched placements {int(switched)} times "
      f"(epoch {int(metric(d['decode-0'], 'ep_epoch'))}, rank 0 loaded {int(metric(d['decode-0'], 'ep_experts_loaded_total'))} experts "
      f"loaded); the balancer pushed {int(metric(eb, 'placements_pushed'))}, layer 0 busiest/average "
      f"{metric(eb, 'layer0_busiest_over_avg_in_order'):.3f} in order -> {metric(eb, 'layer0_busiest_over_avg_placed'):.3f}")
PY
"$BIN/troupe-top" --topology "$WORK/place.yaml" --once > "$WORK/top.txt"
for want in "EXPERT GROUP" "EXPERT BALANCER" "load per expert" "placement (experts per rank)" "rank 3:"; do
  grep -q "$want" "$WORK/top.txt" || { cat "$WORK/top.txt"; fail "troupe-top has no '$want'"; }
done
sed -n '/^EXPERT GROUP/,$p' "$WORK/top.txt" | head -20

ranks_served "$WORK/place.yaml" 4
stop_cluster

dir=$ROOT/tests/fixtures/models/qwen3-moe-f32
for n in 2 4; do
note "kill -9 of one rank while 8 requests stream on every rank (qwen3-moe-f32, group of $n)"
ep_gpus "$n"
MAX_RESTARTS=10 MODEL_PATH=$dir N_PREFILL=1 N_DECODE=$n DECODE_EP=$n make_topology "$WORK/kill-$n.yaml" "limits:" \
  "  max_batch: 16"
start_cluster "$WORK/kill-$n.yaml"
ep_transport "$WORK/kill-$n.yaml" "$n"
ep=$(grep 'client:' "$WORK/kill-$n.yaml" | awk '{print $2}')
ep_py "$ep" "$BIN" "$WORK/kill-$n.yaml" "$WORK/qwen3-moe-f32.generate" "$PROMPTS" "$n" <<'PY'
import os, signal, sys, threading, time
from servelib import c_generate, top, metric, wait_restarted
ep, bin_dir, topo, gen, prompts = sys.argv[1], sys.argv[2], sys.argv[3], open(sys.argv[4]).read().split(), sys.argv[5].split()
n = int(sys.argv[6])
want = [list(map(int, g.split(","))) for g in gen]
streaming, results = set(), {}
def stream(key, n_tokens):
    toks, last, n_final = 0, None, 0
    for m in c_generate(bin_dir, ep, [1 + key, 5, 9, 14, 3], max_tokens=n_tokens, timeout_s=120):
        if m["type"] == "token":
            toks += len(m["tokens"])
            streaming.add(key)
        else:
            n_final += 1
        last = m
    results[key] = (toks, last, n_final)
# The streams last a fraction of a second on this model and the ranks' stats come every second:
# a batch whose streams end before the stats show them running on both ranks is let finish, and
# another batch starts. Each request stays on its rank, so streams all unfinished at the kill and
# seen running on both ranks means both ranks held some.
killed = False
for attempt in range(20):
    streaming.clear()
    results.clear()
    ts = [threading.Thread(target=stream, args=(i, 480)) for i in range(8)]
    for t in ts: t.start()
    deadline = time.time() + 60
    while len(streaming) < 8 and time.time() < deadline:
        time.sleep(0.01)
    assert len(streaming) == 8, f"only {len(streaming)} of 8 streams started"
    while not results:
        d = top(bin_dir, topo)
        running = [int(metric(d[f"decode-{r}"], "requests_running") or 0) if f"decode-{r}" in d else 0
                   for r in range(n)]
        if all(running) and not results:
            pids = [d[f"decode-{r}"]["pid"] for r in range(n)]
            os.kill(pids[1], signal.SIGKILL)
            killed = True
            break
    if killed:
        break
    for t in ts: t.join(timeout=90)
    assert all(r[1]["type"] == "done" for r in results.values()), results
assert killed, "the streams never showed running on both ranks"
t0 = time.time()
for t in ts: t.join(timeout=90)
assert all(not t.is_alive() for t in ts), "a request hangs after a rank died"
assert len(results) == 8, "a request got no terminal reply"
failed = [r for r in results.values() if r[1]["type"] == "error"]
done = [r for r in results.values() if r[1]["type"] == "done"]
assert len(failed) + len(done) == 8 and all(r[2] == 1 for r in results.values()), results
for toks, m, _ in failed:
    assert m["retryable"], m
for toks, m, _ in done:
    assert toks == 480, (toks, m)
print(f"kill -9 of decode-1 (batch {attempt + 1}, running per rank before: {running}): {len(failed)} ended with a retryable error "
      f"({sorted(set(m['code_name'] for _, m, _ in failed))}), {len(done)} completed, in {time.time() - t0:.1f} s")
# Every rank comes back (the survivors exit when they find their group gone) and they meet again.
for r in range(n):
    wait_restarted(bin_dir, topo, f"decode-{r}", pids[r], restarts=1, timeout_s=60)
for attempt in range(20):   # the router may still be learning that the new incarnations are up
    got, errors = generate_all(bin_dir, ep, prompts, range(len(prompts)))
    if not errors:
        break
    assert all(m["retryable"] for _, m in errors), errors
    time.sleep(0.5)
assert not errors, errors
for i in range(len(prompts)):
    assert got[i] == want[i], f"after the restart, prompt {i}: cluster {got[i]}, troupe-generate {want[i]}"
print(f"all {n} ranks restarted and met again; {len(prompts)} prompts exact after {attempt + 1} round(s)")
PY
ranks_served "$WORK/kill-$n.yaml" "$n"
stop_cluster
done
echo "PASS ep_exact"
