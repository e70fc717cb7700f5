#!/usr/bin/env bash
# The whole GPU job of a change, on the two-GPU machine kind, in one call (device time is
# scarce): the expert-parallel checks on both GPUs, then three lanes at once:
#   GPU 0: launch overhead, then the whole GPU suite (tests/gpu);
#   GPU 0: warmup (cold processes: host time, little GPU work);
#   GPU 1: the MoE, activation/quantization, combine-sweep and fused-FP8-dispatch benchmarks.
# Every step has its own time limit (env *_LIMIT, seconds) so a hang costs that step only.
#
#   OUT=... bash benchmarks/gpu_all.sh
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
step() {  # step SECONDS GPU NAME...: run_gpu.sh steps on one GPU, logs in $WORK/NAME
    local limit=$1 gpu=$2
    shift 2
    mkdir -p "$WORK/$1"
    OUT="$WORK/$1" CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" bash benchmarks/run_gpu.sh "$@" \
        > "$WORK/$1/console.log" 2>&1
    echo "== $* (GPU $gpu) exit $?" | tee -a "$WORK/lanes.txt"
}
mkdir -p "$WORK/ep"
OUT="$WORK/ep" timeout "${EP_LIMIT:-150}" bash benchmarks/run_gpu.sh ep > "$WORK/ep/console.log" 2>&1
echo "== ep (GPUs 0, 1) exit $?" | tee -a "$WORK/lanes.txt"
( step "${OVERHEAD_LIMIT:-60}" 0 overhead; step "${TESTS_LIMIT:-330}" 0 tests ) &
( ROSE_WARMUP_REPEATS="${WARMUP_REPEATS:-3}" step "${WARMUP_LIMIT:-300}" 0 warmup ) &
( step "${MOE_LIMIT:-110}" 1 moe
  ACT_QUANT_TOKENS="${ACT_QUANT_TOKENS:-1,128,8192,32768}" step "${ACT_LIMIT:-200}" 1 act_quant
  SWEEP_TOKENS="${SWEEP_TOKENS:-1,4,16,64,128}" step "${SWEEP_LIMIT:-60}" 1 moe_sweep
  step "${FP8_LIMIT:-40}" 1 moe_fp8 ) &
wait
tar czf "$OUT/results.tgz" -C "$WORK" .
cp "$WORK/lanes.txt" "$OUT/lanes.txt"
cat "$OUT/lanes.txt"
