# The MoE load statistics and the expert placement on a real MoE model (kjv-moe: Qwen3-MoE, 16
# experts, top-2) over held-out text: troupe-expert-load counts the routed tokens in the MoE
# kernels, then places the experts on 4 ranks with 4 redundant slots.
#   1. every MoE layer routes exactly top-k = 2 experts per token (the counts sum to 2 x tokens);
#   2. the routing is skewed (some expert above twice the average), as a trained model's is;
#   3. one placement brings every layer's busiest rank to at most 1.09 x the average rank, and
#      below the in-order placement (4 experts per rank, no redundancy).
. "$(dirname "$0")/lib.sh"
MODELS="$ROOT/../shared/models"
if [ ! -f "$MODELS/kjv-moe/model.safetensors" ] || [ ! -f "$MODELS/kjv-text/valid.txt" ]; then
    echo "SKIP: kjv-moe or kjv-text not found next to the repository"
    exit 0
fi
"$BIN/troupe-expert-load" "$MODELS/kjv-moe" --text "$MODELS/kjv-text/valid.txt" --max-windows 40 \
    --ranks 4 --redundant 4 > "$WORK/load.txt" || fail "troupe-expert-load failed"
/usr/bin/python3 - "$WORK/load.txt" <<'PY' || fail "expert load figures wrong (see above)"
import sys
lines = open(sys.argv[1]).read().split("\n")
tokens = int(next(l.split()[1] for l in lines if l.startswith("tokens ")))
layers = 0
for l in lines:
    w = l.split()
    if len(w) > 2 and w[0] == "layer" and w[2] == "tokens":
        counts = [int(x) for x in w[3:]]
        assert sum(counts) == 2 * tokens, f"layer {w[1]}: {sum(counts)} routed, expected {2 * tokens}"
        assert max(counts) > 2 * sum(counts) / len(counts), f"layer {w[1]}: no skew: {counts}"
        layers += 1
    if len(w) > 2 and w[2] == "rank_busiest_over_avg":
        before, after = float(w[4]), float(w[6])
        print(f"layer {w[1]}: busiest/average {before:.3f} without the balancer, {after:.3f} after")
        assert after <= 1.09 and after < before, f"layer {w[1]}: {after} after, {before} before"
assert layers == 4, f"{layers} MoE layers reported, expected 4"
PY
echo "PASS"
