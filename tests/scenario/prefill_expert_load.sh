# Prefill workers report their MoE load too: on the MoE fixture (qwen3-moe-f32) with one prefill
# and one decode worker and a window of one step, prompts of two prefill chunks each make the
# prefill worker send expert_load windows beside the decode worker's, so the expert-balancer's
# all-workers view counts two ranks (one without the prefill worker's windows), none refused.
. "$(dirname "$0")/lib.sh"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-moe-f32 N_PREFILL=1 N_DECODE=1 make_topology "$WORK/t.yaml" \
  "limits:" "  prefill_chunk_tokens: 8" "experts:" "  window_steps: 1" "  interval_steps: 1"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
PYTHONPATH="$ROOT/tools:$ROOT/tests/scenario${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 - "$ep" "$BIN" "$WORK/t.yaml" <<'PY'
import sys, time
from troupe_client import Client
from servelib import top, metric
ep, bin_dir, topo = sys.argv[1:4]
with Client(ep, timeout_s=60) as c:
    for p in ([2, 7, 7, 30, 11, 4, 19, 23, 8, 5, 6, 12, 13], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]):
        toks = [t for m in c.generate(tokens=p, max_tokens=4, temperature=0, ignore_eos=True)
                if m["type"] == "token" for t in m["tokens"]]
        assert len(toks) == 4, toks
ranks = refused = None
for _ in range(100):   # the balancer's stats come once a second
    d = top(bin_dir, topo)
    eb = d.get("expert-balancer", {})
    try:
        ranks, refused = metric(eb, "ranks"), metric(eb, "loads_refused")
        pf = metric(d["prefill"], "steps_total")
    except KeyError:
        time.sleep(0.1)
        continue
    if ranks >= 2:
        break
    time.sleep(0.1)
assert ranks == 2, f"the expert-balancer saw {ranks} workers' expert_load, expected 2 (prefill and decode)"
assert refused == 0, f"{refused} expert_load windows refused"
print(f"expert-balancer: expert_load from {int(ranks)} workers (prefill after {int(pf)} steps, and decode), none refused")
PY
echo "PASS"
