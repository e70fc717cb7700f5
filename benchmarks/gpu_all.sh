#!/usr/bin/env bash
# The whole GPU job of a change, on the two-GPU machine kind, in one call (device time is
# scarce): the expert-parallel checks on both GPUs, then three lanes at once, each a list of
# benchmarks/run_gpu.sh steps run in order:
#   LANE_A, GPU 0 (default: launch overhead, then the whole GPU suite);
#   LANE_B, GPU 0 (default: warmup: cold processes, host time, little GPU work);
#   LANE_C, GPU 1 (default: the MoE, activation/quantization, combine-sweep and fused-FP8
#   dispatch benchmarks).
# EP_STEP= (empty) skips the expert-parallel checks; EP_STEP=concurrency runs the two-GPU loader
# test in that slot instead; a list runs each in turn there (the limit EP_LIMIT covers them all). Every step has its own time limit
# (env <STEP>_LIMIT in seconds, e.g. TESTS_LIMIT=330) so a hang costs that step only.
#
#   OUT=... bash benchmarks/gpu_all.sh
#   OUT=... EP_STEP= LANE_A="tests sanitizer" LANE_B= LANE_C="warmup act_quant" bash benchmarks/gpu_all.sh
#
# Everything lands in ONE archive, $OUT/results.tgz (plus $OUT/lanes.txt, the exit status of
# every step): the device tool brings back only a few files per call, so logs written as many
# files under $OUT were lost once. Unpack with `tar xzf results.tgz`.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
WORK=$(mktemp -d)
bash benchmarks/run_gpu.sh > /dev/null 2>&1  # installs the carried wheels once, before the lanes
limit() {  # the time limit of a step: $<STEP>_LIMIT (act_quant:... reads ACT_QUANT_LIMIT), else its default
    local base="${1%%:*}" default
    local var="${base^^}"
    var="${var//[^A-Z0-9_]/_}_LIMIT"
    case "$base" in
        tests) default=330 ;; overhead) default=60 ;; warmup) default=300 ;; moe) default=110 ;;
        act_quant) default=200 ;; moe_sweep) default=60 ;; moe_fp8) default=300 ;;
        ep) default=150 ;; *) default=300 ;;
    esac
    echo "${!var:-$default}"
}
lane() {  # lane GPU STEP...: each step on one GPU, logs in $WORK/STEP
    local gpu=$1 step
    shift
    for step in "$@"; do
        local dir="$WORK/${step//[:,]/-}"
        mkdir -p "$dir"
        OUT="$dir" CUDA_VISIBLE_DEVICES=$gpu timeout "$(limit "$step")" \
            bash benchmarks/run_gpu.sh "$step" > "$dir/console.log" 2>&1
        echo "== $step (GPU $gpu) exit $?" | tee -a "$WORK/lanes.txt"
    done
}
EP_STEP="${EP_STEP-ep}"
# Every step's name and limit are checked before anything runs: a typo must not cost a device
# call.
bash benchmarks/run_gpu.sh --check $EP_STEP ${LANE_A-overhead tests} ${LANE_B-warmup} \
    ${LANE_C-moe act_quant moe_sweep moe_fp8} || exit 2
for step in $EP_STEP ${LANE_A-overhead tests} ${LANE_B-warmup} ${LANE_C-moe act_quant moe_sweep moe_fp8}; do
    value="$(limit "$step")"
    if ! [[ "$value" =~ ^[0-9]+$ ]] || [ "$value" -eq 0 ]; then
        echo "gpu_all.sh: the time limit of step $step is '$value'; set a positive number of seconds" >&2
        exit 2
    fi
done
if [ -n "$EP_STEP" ]; then
    mkdir -p "$WORK/ep"
    # Unquoted: EP_STEP may list several steps, run in order alone on the machine (the quiet
    # slot: e.g. EP_STEP="overhead concurrency" for host timings nothing else disturbs).
    OUT="$WORK/ep" timeout "$(limit ep)" bash benchmarks/run_gpu.sh $EP_STEP > "$WORK/ep/console.log" 2>&1
    echo "== $EP_STEP (GPUs 0, 1) exit $?" | tee -a "$WORK/lanes.txt"
fi
# Unquoted on purpose: each lane is a space-separated list of steps.
ROSE_WARMUP_REPEATS="${WARMUP_REPEATS:-3}" lane 0 ${LANE_A-overhead tests} &
ROSE_WARMUP_REPEATS="${WARMUP_REPEATS:-3}" lane 0 ${LANE_B-warmup} &
ACT_QUANT_TOKENS="${ACT_QUANT_TOKENS:-1,128,8192,32768}" SWEEP_TOKENS="${SWEEP_TOKENS:-1,4,16,64,128}" \
    lane 1 ${LANE_C-moe act_quant moe_sweep moe_fp8} &
wait
tar czf "$OUT/results.tgz" -C "$WORK" .
touch "$WORK/lanes.txt"
cp "$WORK/lanes.txt" "$OUT/lanes.txt"
cat "$OUT/lanes.txt"
