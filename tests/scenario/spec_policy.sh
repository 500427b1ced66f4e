# The draft-scheduler's policy in a running cluster: the decode workers' chosen verify length
# follows the policy the draft-scheduler pushes (pinned through TROUPE_DRAFT_POLICY_FILE: 6, then
# 2 drafts per row); after kill -9 of the draft-scheduler (whose restart is told to push nothing)
# the workers go back to their default (TROUPE_SPECULATION=ngram:3) once the last policy expires,
# and keep speculating; set to "auto", the restarted scheduler computes a policy from the workers'
# spec_report windows and pushes it. Throughout, requests stream (prompts that repeat, so rows
# carry drafts), and every one ends with exactly one terminal reply: done, with all its tokens.
# The model is the repository's kjv-tiny (real weights, its own tokenizer): its greedy KJV text
# repeats itself, so the n-gram proposer has drafts to offer.
. "$(dirname "$0")/lib.sh"
export TROUPE_SPECULATION=ngram:3
export TROUPE_DRAFT_POLICY_FILE=$WORK/policy
export TROUPE_DRAFT_POLICY_VALID_MS=2500
echo "1024:6" > "$TROUPE_DRAFT_POLICY_FILE"
MODEL_PATH=$ROOT/models/kjv-tiny N_DECODE=1 make_topology "$WORK/t.yaml" "limits:" "  max_batch: 32" \
  "  max_model_len: 512"
start_cluster "$WORK/t.yaml"
ep=$(grep 'client:' "$WORK/t.yaml" | awk '{print $2}')
$PY - "$ep" "$BIN" "$WORK/t.yaml" "$TROUPE_DRAFT_POLICY_FILE" <<'PY'
import os, random, signal, sys, threading, time
from troupe_client import Client
from servelib import top, metric, wait_restarted
ep, bin_dir, topo, policy_file = sys.argv[1:5]
stop, results, lock = threading.Event(), [], threading.Lock()
PROMPTS = ["And God said", "In the beginning", "And it came to pass", "The LORD is my shepherd",
           "And the children of Israel", "Blessed are the"]

def load(i, n_tokens):
    with Client(ep, timeout_s=120) as c:
        while not stop.is_set():
            toks, n_final, last = 0, 0, None
            for m in c.generate(prompt=PROMPTS[i % len(PROMPTS)], max_tokens=n_tokens, temperature=0,
                                ignore_eos=True):
                if m["type"] == "token":
                    toks += len(m["tokens"])
                else:
                    n_final += 1
                last = m
            with lock:
                results.append((toks, last, n_final))

def workers():
    return [a for a in top(bin_dir, topo).values() if a["role"] == "decode"]

def wait_for(what, cond, timeout_s=40):
    deadline = time.time() + timeout_s
    seen = None
    while time.time() < deadline:
        seen = [(a["name"], metric(a, "spec_policy_active"), metric(a, "spec_chosen_verify_len"),
                 metric(a, "spec_policy_epoch")) for a in workers()]
        if any(cond(active, chosen) for _, active, chosen, _ in seen):
            print(f"{what}: {seen}")
            return seen
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout_s} s; workers (name, active, chosen, epoch): {seen}")

def pin(text):
    with open(policy_file + ".tmp", "w") as f:
        f.write(text)
    os.replace(policy_file + ".tmp", policy_file)

ts = [threading.Thread(target=load, args=(i, 40)) for i in range(6)]
for t in ts: t.start()
try:
    wait_for("pinned 6", lambda active, chosen: active == 1 and chosen == 6)
    pin("1024:2\n")
    wait_for("pinned 2", lambda active, chosen: active == 1 and chosen == 2)
    # The scheduler away: killed, and its restart pushes nothing. The workers' last policy
    # expires after its valid_ms and they speculate with their default again.
    pin("none\n")
    steps0 = sum(metric(a, "spec_verify_steps_total") or 0 for a in workers())
    ds = top(bin_dir, topo)["draft-scheduler"]
    os.kill(ds["pid"], signal.SIGKILL)
    wait_for("default after the kill", lambda active, chosen: active == 0 and chosen == 3)
    wait_restarted(bin_dir, topo, "draft-scheduler", ds["pid"], timeout_s=15)
    time.sleep(1.5)
    steps1 = sum(metric(a, "spec_verify_steps_total") or 0 for a in workers())
    assert steps1 > steps0, f"no verify steps without the scheduler ({steps0} -> {steps1})"
    # Computed from the reports.
    pin("auto\n")
    deadline = time.time() + 60
    while time.time() < deadline:
        d = top(bin_dir, topo)["draft-scheduler"]
        if metric(d, "policy_source") == 1 and any(metric(a, "spec_policy_active") == 1 for a in workers()):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"no computed policy in force within 60 s: {d}")
    print("computed policy:", {k: metric(d, k) for k in ("reports_total", "policy_epoch", "spec_acceptance_rate",
                                                        "survival_pos0", "verify_len_batch1", "verify_len_batch16",
                                                        "min_confidence_batch1")})
    # The exploration budget is in force at every worker (engine/spec_policy.h SPEC_EXPLORE_SHARE).
    for a in workers():
        assert metric(a, "spec_explore_share") == 0.01, f"{a['name']}: no exploration budget of 0.01: {a}"
        print(a["name"], "exploration:", {k: metric(a, k) for k in (
            "spec_explore_steps_total", "spec_explore_seconds_total", "decode_only_cycle_seconds_total",
            "spec_explore_held_total")})
finally:
    stop.set()
    for t in ts: t.join()
assert results, "no request finished"
bad = [r for r in results if r[2] != 1 or r[1]["type"] != "done" or r[0] != 40 or
       r[1]["usage"]["completion_tokens"] != 40]
assert not bad, f"{len(bad)} of {len(results)} requests did not end with one done and 40 tokens: {bad[:3]}"
print(f"{len(results)} requests, each one done with 40 tokens")
PY
echo "PASS spec_policy"
