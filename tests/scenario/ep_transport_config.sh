# A transport an expert-parallel group cannot be told to use (TROUPE_EP_TRANSPORT other than auto,
# sock or nccl) is a configuration error: the group's decode workers refuse it before loading the
# model and exit as misconfigured (ACTOR_EXIT_CONFIG), so the supervisor stops the cluster with the
# variable named instead of restarting workers that would fail again at their group's meeting.
. "$(dirname "$0")/lib.sh"
MODEL_PATH=$ROOT/tests/fixtures/models/qwen3-moe-f32 N_PREFILL=1 N_DECODE=2 DECODE_EP=2 \
  make_topology "$WORK/t.yaml" "limits:" "  max_batch: 16"
set +e
TROUPE_EP_TRANSPORT=bogus timeout 60 "$BIN/troupe-supervisor" --topology "$WORK/t.yaml" >"$WORK/supervisor.log" 2>&1
rc=$?
set -e
[ "$rc" != 124 ] || fail "the supervisor was still running after 60 s (workers restarted?)"
[ "$rc" != 0 ] || fail "the supervisor exited 0 with TROUPE_EP_TRANSPORT=bogus"
grep -Eq "decode-[01] exited \(exit 78\)" "$WORK/supervisor.log" || fail "no decode worker exited as misconfigured (78)"
grep -q "TROUPE_EP_TRANSPORT=bogus" "$WORK/supervisor.log" || fail "the error does not name TROUPE_EP_TRANSPORT"
if grep -E "^ +decode-[01] +decode +[1-9]" "$WORK/supervisor.log"; then fail "a decode worker was restarted"; fi
echo "PASS ep_transport_config"
