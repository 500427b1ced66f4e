#!/usr/bin/env bash
# Speculation's sweep: output tokens/s of the whole cluster with a fixed verify length k against the
# draft-scheduler's policy, at several concurrencies, in the style of DSpark's table.
#
#   tools/bench-spec.sh [OUT_DIR]
#
# For each entry of KS (default "0 1 2 3 4 5 6 7 sched") it starts a cluster of its own (one
# prefill and one decode worker, the monitor, router, cache-manager and draft-scheduler) on the
# target model, runs troupe-bench over CONC (default 1,16,64,96) with prompts cut from a text file,
# and stops it:
#   k = 0      TROUPE_SPECULATION=off
#   k = 1..7   TROUPE_SPECULATION=METHOD:k with TROUPE_SPEC_POLICY=fixed (the policy is ignored)
#   sched      TROUPE_SPECULATION=METHOD:SCHED_K (the default until a policy is in force) with the
#              draft-scheduler's policy applied.
# Every entry's cluster first runs a warm-up (WARMUP_ROUNDS rounds of every level, other prompts):
# the scheduler measures acceptance and step costs there, and every cluster records its graphs.
# Then a table: one row per concurrency, output tokens/s for each k and scheduled, the best fixed k
# (the best verify length among the entries k = 1..7: k = 0 is no speculation, the baseline, as in
# the issue's "fixed verify length (k = 1..7) against scheduled"), and scheduled against k = 0 and
# against that best fixed k; acceptance and tokens per verify step of
# the scheduled run. Every run's troupe-bench JSON is kept in OUT_DIR (default build/bench-spec/<date-time>),
# and the scheduled run's draft-scheduler writes every policy computation to OUT_DIR/policy-sched.log
# (TROUPE_SPEC_POLICY_LOG: acceptance, cost cells with their emitted tokens, the tokens/s expected of
# each k per batch bucket, the choice); its last computation is printed after the table, through
# troupe-spec-policy-replay (which recomputes it with this build's policy). The table and that
# computation are also written to OUT_DIR/table.txt.
#
# Environment:
#   TROUPE_MODELS  the folder holding kjv-dense, kjv-draft and kjv-text (default ../shared/models)
#   TARGET         the target model directory (default $TROUPE_MODELS/kjv-dense)
#   DRAFT          the draft model directory for METHOD=draft (default $TROUPE_MODELS/kjv-draft)
#   TEXT           the prompt text (default $TROUPE_MODELS/kjv-text/valid.txt)
#   METHOD         ngram (default), draft (model.draft in the topology) or mtp (the target's own MTP
#                  layer: TARGET=$TROUPE_MODELS/kjv-deepseek)
#   KS, CONC       the entries and concurrencies above
#   IN_LEN OUT_LEN prompt tokens (about) and output tokens per request (default 64, 128)
#   ROUNDS         requests per level = ROUNDS x concurrency (default 3)
#   WARMUP_ROUNDS  every entry's warm-up rounds per level (default 2: on a GPU a level of one round
#                  is a fraction of a second, a few exploration steps per batch size)
#   WARMUP_MORE    the scheduled entry's further warm-ups, at most, while its workers have no policy
#                  yet (default 3): it is timed with its policy in force
#   BACKEND GPUS   cpu (default) or cuda; GPUS the node's GPU count (cuda: both workers on GPU 0)
#   MAX_BATCH      limits.max_batch (default 128)
#   HEARTBEAT_MS LIVENESS  supervision (default 1000 ms x 10 missed before a worker counts as wedged)
#   B              the build folder (default build)
#   REPEATS        N > 1: the whole sweep N times, OUT_DIR/r1 .. rN (each a sweep as above, its
#                  entries in KS's order, so every repeat has its own k = 0 beside its other
#                  entries), then OUT_DIR/summary.txt: per concurrency the median output tokens/s of
#                  each entry over the repeats, and scheduled against k = 0 and against the best
#                  fixed k as each repeat measured them (min / median / max of those ratios). A
#                  level lasts a fraction of a second on a GPU, so one sweep's ratios move by 10-20%;
#                  a claim of a few percent wants the spread of several.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
B=${B:-build}
MODELS=${TROUPE_MODELS:-../shared/models}
TARGET=${TARGET:-$MODELS/kjv-dense}
DRAFT=${DRAFT:-$MODELS/kjv-draft}
TEXT=${TEXT:-$MODELS/kjv-text/valid.txt}
METHOD=${METHOD:-ngram}
KS=${KS:-0 1 2 3 4 5 6 7 sched}
CONC=${CONC:-1,16,64,96}
IN_LEN=${IN_LEN:-64}
OUT_LEN=${OUT_LEN:-128}
ROUNDS=${ROUNDS:-3}
SCHED_K=${SCHED_K:-4}
BACKEND=${BACKEND:-cpu}
MAX_BATCH=${MAX_BATCH:-128}
OUT=${1:-build/bench-spec/$(date +%Y%m%d-%H%M%S)}   # topologies, logs and the table
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)          # absolute: run_dir and ready files use it
REPEATS=${REPEATS:-1}
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || { echo "bench-spec: REPEATS must be a count of 1 or more, not '$REPEATS'" >&2; exit 1; }
if [ "$REPEATS" -gt 1 ]; then
  for i in $(seq "$REPEATS"); do
    echo "bench-spec: repeat $i of $REPEATS into $OUT/r$i" >&2
    REPEATS=1 "$ROOT/tools/bench-spec.sh" "$OUT/r$i" >"$OUT/r$i.out" 2>&1 || { tail -20 "$OUT/r$i.out" >&2; echo "bench-spec: repeat $i failed" >&2; exit 1; }
  done
  python3 "$ROOT/tools/bench/spec_repeats.py" "$OUT" $KS | tee "$OUT/summary.txt"
  exit 0
fi
for b in troupe-supervisor troupe-bench; do
  [ -x "$B/bin/$b" ] || { echo "bench-spec: $B/bin/$b is missing; build first (make B=$B)" >&2; exit 1; }
done
for f in "$TARGET/config.json" "$TEXT"; do
  [ -f "$f" ] || { echo "bench-spec: $f not found (set TROUPE_MODELS, TARGET or TEXT)" >&2; exit 1; }
done
[ "$METHOD" = ngram ] || [ "$METHOD" = draft ] || [ "$METHOD" = mtp ] ||
  { echo "bench-spec: METHOD must be ngram, draft or mtp" >&2; exit 1; }
[ "$METHOD" != draft ] || [ -f "$DRAFT/config.json" ] || { echo "bench-spec: $DRAFT/config.json not found" >&2; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

SUP=
stop() {
  if [ -n "$SUP" ] && kill -0 "$SUP" 2>/dev/null; then
    kill -TERM "$SUP"
    for _ in $(seq 100); do kill -0 "$SUP" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SUP" 2>/dev/null || true
  fi
  SUP=
}
trap stop EXIT

# topology NAME: a one-machine cluster on free ports
topology() {
  local f=$OUT/$1.yaml gpu_lines="" worker_gpu=""
  if [ "$BACKEND" = cuda ]; then gpu_lines=$'\n    gpus: '"${GPUS:-1}"; worker_gpu=$'\n    gpus: [0]'; fi
  local draft_line=""
  [ "$METHOD" = draft ] && draft_line=$'\n  draft: '"$(cd "$DRAFT" && pwd)"
  cat > "$f" <<YAML
name: bench-spec-$1-$$
model:
  path: $(cd "$TARGET" && pwd)
  backend: $BACKEND$draft_line
nodes:
  - name: local
    address: 127.0.0.1$gpu_lines
actors:
  - role: monitor
  - role: cache-manager
  - role: draft-scheduler
  - role: prefill$worker_gpu
  - role: decode$worker_gpu
  - role: router
endpoints:
  client: tcp://127.0.0.1:$(port)
  inspect: tcp://127.0.0.1:$(port)
  metrics: tcp://127.0.0.1:$(port)
  run_dir: $OUT/run-$1
limits:
  max_batch: $MAX_BATCH
  max_model_len: 1024
supervision:
  ready_timeout_s: 120
  heartbeat_ms: ${HEARTBEAT_MS:-1000}
  liveness: ${LIVENESS:-10}   # a busy shared machine must not get its workers killed as wedged
YAML
  echo "$f"
}

# policy_in_force TOPO: every decode worker has a policy of the draft-scheduler in force
# (spec_policy_active; the stats come every second, so this waits for the next).
policy_in_force() {
  sleep 1.5
  "$B/bin/troupe-top" --topology "$1" --json 2>/dev/null | python3 -c 'import json, sys
w = [a for a in json.load(sys.stdin).get("actors", []) if a.get("role") == "decode"]
ok = w and all(any(m["name"] == "spec_policy_active" and m["value"] >= 1 for m in a["metrics"]) for a in w)
sys.exit(0 if ok else 1)'
}

run() {   # run ENTRY: one cluster, one troupe-bench sweep
  local e=$1 spec policy=fixed
  case $e in
    0) spec=off ;;
    sched) spec=$METHOD:$SCHED_K; policy=scheduled ;;
    *) spec=$METHOD:$e ;;
  esac
  local topo
  topo=$(topology "$e")
  rm -f "$OUT/ready-$e"
  local log=
  [ "$e" = sched ] && log=$OUT/policy-$e.log && rm -f "$log"
  TROUPE_SPEC_POLICY_LOG=$log TROUPE_SPECULATION=$spec TROUPE_SPEC_POLICY=$policy "$B/bin/troupe-supervisor" --topology "$topo" \
    --ready-file "$OUT/ready-$e" >"$OUT/supervisor-$e.log" 2>&1 &
  SUP=$!
  for _ in $(seq 1200); do [ -s "$OUT/ready-$e" ] && break; sleep 0.1; done
  [ -s "$OUT/ready-$e" ] || { tail -20 "$OUT/supervisor-$e.log" >&2; echo "bench-spec: cluster $e not ready" >&2; exit 1; }
  local common=(--topology "$topo" --prompt-text "$TEXT" --input-len "$IN_LEN" --output-len "$OUT_LEN" --seed 7)
  # Every entry runs the same warm-up first: the scheduler measures there, and every cluster
  # records its CUDA graphs there (one per exact batch size and positions; a few milliseconds
  # each, a third of a 0.2 s level). With the warm-up for the scheduled entry only, its policy
  # off at every level gave 1.02-1.54x of k = 0 (one H200, KJV pair, 2026-12-02, b73d0f6),
  # which a policy that drafts nothing cannot earn.
  "$B/bin/troupe-bench" "${common[@]}" --concurrency "$CONC" --rounds "${WARMUP_ROUNDS:-2}" --warmup 0 --seed 99 \
    >"$OUT/warmup-$e.txt" 2>&1 || true
  # The scheduled entry is timed with its policy in force: until the first one comes its workers
  # draft the default k, a start-up cost and not what the policy does (on one H200, 2026-12-03,
  # 22dde92, the first policy came 6.5 s in, after the warm-up, and the timed run's concurrency
  # 64 / 96 levels paid 303 such drafting steps at 2.2 ms against 0.47 for a plain one). Up to
  # WARMUP_MORE (default 3) more warm-ups while a decode worker has received none.
  if [ "$e" = sched ]; then
    local more=0
    until policy_in_force "$topo"; do
      if [ "$more" -ge "${WARMUP_MORE:-3}" ]; then
        echo "bench-spec: sched: no policy in force after $more more warm-ups; timed all the same" >&2
        break
      fi
      more=$((more + 1))
      echo "bench-spec: sched: no policy in force yet; warm-up $more more" >&2
      "$B/bin/troupe-bench" "${common[@]}" --concurrency "$CONC" --rounds "${WARMUP_ROUNDS:-2}" --warmup 0 \
        --seed $((99 + more)) >>"$OUT/warmup-$e.txt" 2>&1 || true
    done
  fi
  # The workers' counters before the timed run: the table of the timed window is the difference
  # (the totals count the warm-up too, where a scheduled worker drafts the default k until its
  # first policy comes, so its steps and forwards there are no measure of the timed run). An actor
  # sends its stats every second (actors/runtime/actor.c STATS_MS), and a GPU's timed run is less
  # than that: each snapshot waits for the idle worker's next stats.
  sleep 1.5
  "$B/bin/troupe-top" --topology "$topo" --json >"$OUT/top0-$e.json" 2>/dev/null || true
  echo "--- $e: TROUPE_SPECULATION=$spec TROUPE_SPEC_POLICY=$policy" >&2
  "$B/bin/troupe-bench" "${common[@]}" --concurrency "$CONC" --rounds "$ROUNDS" --json "$OUT/$e.json" \
    >"$OUT/bench-$e.txt" 2>&1 || { cat "$OUT/bench-$e.txt" >&2; echo "bench-spec: troupe-bench failed for $e" >&2; exit 1; }
  sleep 1.5
  "$B/bin/troupe-top" --topology "$topo" --json >"$OUT/top-$e.json" 2>/dev/null || true   # the workers' counters
  stop
}

for e in $KS; do run "$e"; done

# The table and the policy's last computation, on stdout and in OUT_DIR/table.txt.
{
python3 - "$OUT" $KS <<'PY'
import json, os, sys
out, entries = sys.argv[1], sys.argv[2:]
runs = {e: json.load(open(os.path.join(out, f"{e}.json"))) for e in entries}
conc = [l["concurrency"] for l in runs[entries[0]]["levels"]]
def level(e, c):
    return next(l for l in runs[e]["levels"] if l["concurrency"] == c)
fixed = [e for e in entries if e not in ("sched", "0")]   # verify lengths k >= 1; k = 0 is no speculation
head = "conc " + "".join(f"{('k=' + e) if e != 'sched' else 'sched':>9}" for e in entries)
extra = "  best-k" + ("  sched/k0 sched/best  accept  tok/step  verify" if "sched" in entries else "")
print(head + extra)
for c in conc:
    tps = {e: level(e, c)["output_tokens_per_s"] for e in entries}
    row = f"{c:4d} " + "".join(f"{tps[e]:9.1f}" for e in entries)
    best = max(fixed, key=lambda e: tps[e]) if fixed else None
    row += f"  {('k=' + best) if best else '-':>6}"
    if "sched" in entries:
        s = level("sched", c)
        k0 = tps.get("0")
        row += f"  {tps['sched'] / k0:8.3f}" if k0 else f"  {'-':>8}"
        row += f" {tps['sched'] / tps[best]:10.3f}" if best else f" {'-':>10}"
        if "spec_acceptance_rate" in s:
            row += f"  {100 * s['spec_acceptance_rate']:5.1f}% {s['spec_tokens_per_verify_step']:9.2f} {s['spec_chosen_verify_len']:7.2f}"
        else:
            row += "       -         -       -"
    print(row)
print(f"(output tokens/s of the cluster; troupe-bench JSON and logs in {out})")
# The decode worker's counters over the whole run (warm-up included): where a step's time goes.
def actors(e, name):   # the actors of a troupe-top snapshot (top0-E.json: before the timed run; top-E.json: after)
    try:
        return {a["name"]: a for a in json.load(open(os.path.join(out, f"{name}-{e}.json"))).get("actors", [])}
    except (OSError, ValueError):
        return {}
def decode_metrics(e, name="top"):
    m = {}
    for a in actors(e, name).values():
        if a.get("role") == "decode":
            for x in a.get("metrics", []):
                m[x["name"]] = m.get(x["name"], 0) + x["value"]
    return m or None
print("entry    steps  forward ms/step  rows verified  padded steps  steps held (outbox)  graphs recorded (stale) / in the timed run")
for e in entries:
    m = decode_metrics(e)
    if not m:
        print(f"{e:>5}  (no troupe-top counters)")
        continue
    steps = m.get("steps_total", 0)
    fwd = 1e3 * m.get("forward_seconds_total", 0) / steps if steps else 0
    m0 = decode_metrics(e, "top0") or {}
    rec, stale = int(m.get("graph_records_total", 0)), int(m.get("graph_rerecords_total", 0))
    timed = rec - int(m0.get("graph_records_total", 0))
    print(f"{e:>5} {int(steps):8d} {fwd:16.3f} {int(m.get('spec_verify_steps_total', 0)):14d} "
          f"{int(m.get('spec_padded_steps_total', 0)):13d} {int(m.get('steps_held_outbox_total', 0)):20d}"
          f"  {rec:9d} ({stale}) / {timed}")
# The timed run alone (the counters after it less those before it): cycles of decode-only steps
# (start to the next step's start) beside the forward, and a speculating worker's steps by kind:
# off (no row asked: what k = 0 runs), explore (an exploration's one draft), drafting; upkeep is
# the proposer's time in steps the policy asked nothing of, host the speculation code's own.
def window(e):
    a, b = decode_metrics(e, "top0"), decode_metrics(e)
    if not a or not b:
        return None
    return {k: b[k] - a.get(k, 0) for k in b}
print("timed run: entry  steps  tok/step  fwd ms/step  decode-only cycles  ms/cycle  off steps (ms)  explore steps (ms)  "
      "drafting steps (ms)  upkeep s  host ms/step  held")
def ms(w, kind):
    n = w.get(f"spec_{kind}_steps_total", 0)
    return f"{int(n):6d} ({1e3 * w.get(f'spec_{kind}_seconds_total', 0) / n:.3f})" if n else f"{0:6d} (    -)"
for e in entries:
    w = window(e)
    if not w:
        print(f"{e:>16}  (no troupe-top counters before and after)")
        continue
    steps, cyc = w.get("steps_total", 0), w.get("decode_only_cycles_total", 0)
    print(f"{e:>16} {int(steps):6d} {w.get('generation_tokens_total', 0) / max(steps, 1):9.2f} "
          f"{1e3 * w.get('forward_seconds_total', 0) / max(steps, 1):12.3f} "
          f"{int(cyc):19d} {1e3 * w.get('decode_only_cycle_seconds_total', 0) / max(cyc, 1):9.3f} "
          f"{ms(w, 'off'):>15} {ms(w, 'explore'):>19} {ms(w, 'drafting'):>20} {w.get('spec_upkeep_seconds_total', 0):9.4f} "
          f"{1e3 * w.get('spec_host_seconds_total', 0) / max(steps, 1):13.4f} {int(w.get('steps_held_outbox_total', 0)):5d}")
# Each actor's CPU in the timed run (cpu_seconds_total between the two reports, over the levels'
# wall time; the idle seconds around them add a little), in % of one core: a process near 100% (a
# router relaying every token, a decode worker's host loop) bounds the cluster whatever the GPU
# does. Processes restarted in between are left out.
def cpu(a):
    return next((m["value"] for m in a.get("metrics", []) if m["name"] == "cpu_seconds_total"), None)
print("timed run CPU, % of one core (cpu_seconds_total): entry  actor  ...")
for e in entries:
    a0, a1 = actors(e, "top0"), actors(e, "top")
    cells = []
    for n, b in sorted(a1.items()):
        a = a0.get(n)
        if not a or a.get("pid") != b.get("pid") or b.get("role") not in ("router", "decode", "prefill", "gateway"):
            continue
        c0, c1, dt = cpu(a), cpu(b), sum(l.get("wall_s", 0) for l in runs[e]["levels"])
        if c0 is not None and c1 is not None and dt > 0:
            cells.append(f"{n} {100 * (c1 - c0) / dt:.0f}%")
    print(f"{e:>16}  " + ("  ".join(cells) if cells else "(no cpu_seconds_total in the reports)"))
# Per level: how long requests waited for their first token and between tokens (a closed loop's
# batch is only as full as its requests come back: fewer tokens a step at the same step cost).
print("level  entry  ttft p50 ms (queue / prefill / rest)  itl p50 ms  e2e p50 ms")
for c in conc:
    for e in entries:
        l = level(e, c)
        print(f"{c:5d} {e:>6} {l.get('ttft_ms_p50', 0):12.2f} ({l.get('ttft_queue_ms_p50', 0):.2f} / "
              f"{l.get('ttft_prefill_ms_p50', 0):.2f} / {l.get('ttft_rest_ms_p50', 0):.2f}) {l.get('itl_ms_p50', 0):11.3f} "
              f"{l.get('e2e_ms_p50', 0):11.1f}")
# One-row plain steps of the scheduled run: the cycle right after a drafting step (left out of the
# cost table with a draft model or MTP) against the one inside a plain stretch (what k = 0 costs).
m = decode_metrics("sched") if "sched" in entries else None
if m:
    print("sched: one-row plain steps after a drafting step %d (%.3f ms a cycle), inside a plain stretch %d "
          "(%.3f ms); one-row cycles over 1 ms: plain %d, drafting %d; cost-table steps left out %d; explorations that "
          "backed off %d" % (
              m.get("spec_plain1_after_draft_steps_total", 0), m.get("spec_plain1_after_draft_ms", 0),
              m.get("spec_plain1_in_stretch_steps_total", 0), m.get("spec_plain1_in_stretch_ms", 0),
              m.get("spec_plain1_slow_steps_total", 0), m.get("spec_draft1_slow_steps_total", 0),
              m.get("spec_cost_steps_skipped_total", 0), m.get("spec_explore_backoffs_total", 0)))
    # The exploration budget (engine/spec_policy.h SPEC_EXPLORE_SHARE): its share of the timed
    # run's decode-only time against the budget's, and the pairs that waited for it (whole run).
    w = window("sched")
    if w and w.get("decode_only_cycle_seconds_total", 0) > 0:
        print("sched: exploration %.2f%% of the timed run's decode-only time (budget %.2f%%); pairs held for the "
              "budget %d" % (100 * w.get("spec_explore_seconds_total", 0) / w["decode_only_cycle_seconds_total"],
                             100 * m.get("spec_explore_share", 0), m.get("spec_explore_held_total", 0)))
PY
if [ -s "$OUT/policy-sched.log" ] && [ -x "$B/bin/troupe-spec-policy-replay" ]; then
  echo "the draft-scheduler's last policy computation ($OUT/policy-sched.log):"
  "$B/bin/troupe-spec-policy-replay" "$OUT/policy-sched.log" || true
fi
} 2>&1 | tee "$OUT/table.txt"
