#!/usr/bin/env bash
# The GPU job, run on the H200 machine over a checkout with CPU-built bundles in build/ and the
# wheels CuTeDSL-free serving needs in .whl/ (zstandard; liger-kernel as a benchmark peer):
#
#   rose-aot build manifests tests/manifests -o build/test.rosebundle                 # CPU
#   rose-aot build benchmarks/manifests/norms.toml -o build/bench-norms.rosebundle    # CPU
#   rose-aot build benchmarks/manifests/norms-wide.toml -o build/bench-norms-wide.rosebundle
#   rose-aot build benchmarks/manifests/moe.toml -o build/bench-moe.rosebundle        # CPU
#   rose-aot build benchmarks/manifests/moe_fp8.toml -o build/bench-moe-fp8.rosebundle  # CPU
#   rose-aot build benchmarks/manifests/act_quant.toml -o build/bench-act-quant.rosebundle  # CPU
#   python benchmarks/warmup.py build-side build/models manifests/*.toml              # CPU
#   bash benchmarks/build_native.sh 3.12   # the C extensions for the GPU's CPython          # CPU
#   bash benchmarks/run_gpu.sh STEP...                                                 # GPU
#
# STEP: tests | concurrency | sanitizer | norms | norms_wide | moe | moe_sweep | moe_fp8 | act_quant |
# act_quant:FAMILY,FAMILY |
# overhead | pdl | warmup | preload_probe | merged_load | ep | ep_bench (ep, ep_bench: two GPUs, torchrun) | ncu (Nsight
# Compute on one point, NCU_POINT). Logs go to $OUT
# (or benchmarks/results). GPU_TESTS narrows the tests step to some files, SANITIZER_FAMILIES
# (space-separated) the sanitizer step to some families; ACT_QUANT_FAMILIES
# (space-separated) the act_quant families; ACT_QUANT_TOKENS and SWEEP_TOKENS set the token
# counts of act_quant and moe_sweep, SWEEP_TOP_K (comma-separated) moe_sweep's top_k values. NVLink multicast stays off in
# every process started here.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# Step names are checked before anything is installed or run (`--check STEP...` checks only).
STEPS=" tests concurrency sanitizer norms norms_wide moe moe_sweep moe_fp8 act_quant overhead pdl warmup preload_probe merged_load ep ep_bench ncu "
check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi
for step in "$@"; do
    case "$STEPS" in *" ${step%%:*} "*) ;; *) echo "run_gpu.sh: unknown step '$step'; steps:$STEPS" >&2; exit 2 ;; esac
    if [ "${step%%:*}" = act_quant ] && [ "$step" != act_quant ] && [ -z "${step#act_quant:}" ]; then
        echo "run_gpu.sh: step '$step' names no family" >&2; exit 2
    fi
done
[ "$check_only" = 1 ] && exit 0
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
# Installed once per machine (benchmarks/gpu_all.sh runs several of these jobs at once).
if [ ! -f /tmp/site/.rose-aot-wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    touch /tmp/site/.rose-aot-wheels
fi
export PYTHONPATH="/tmp/site:$PWD"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# Which hot path the loader runs here: C (rose_aot/loader/_native.c, carried as a built .so)
# or the generated Python; and which index and cubin reader (rose_aot/bundle/_fastread.c).
python3 -c "from rose_aot.loader import driver; print('loader hot path:', 'C' if driver.native()
else 'Python (no rose_aot.loader._native for this CPython)', driver.launch_api())
from rose_aot.bundle import cubin; print('index and cubin reader:', 'C' if cubin._fastread
else 'Python (no rose_aot.bundle._fastread for this CPython)')" \
    | tee -a "$OUT/gpu.txt"
status=0
for step in "$@"; do
    case "$step" in
        tests) ROSE_AOT_TEST_BUNDLE=build/test.rosebundle python3 -m pytest ${GPU_TESTS:-tests/gpu} \
                   -q -rs -p no:cacheprovider --durations=15 2>&1 | tee "$OUT/gpu-tests.log" ;;
        concurrency)  # one bundle on every visible GPU and 8 threads (run with two GPUs)
            ROSE_AOT_TEST_BUNDLE=build/test.rosebundle python3 -m pytest tests/gpu/test_concurrency_gpu.py \
                -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests-concurrency.log" ;;
        sanitizer)
            compute-sanitizer --tool memcheck python3 tests/gpu/sanitizer_launches.py \
                build/test.rosebundle ${SANITIZER_FAMILIES:-} 2>&1 | tee "$OUT/sanitizer-memcheck.log"
            compute-sanitizer --tool racecheck python3 tests/gpu/sanitizer_launches.py \
                build/test.rosebundle ${SANITIZER_FAMILIES:-} 2>&1 | tee "$OUT/sanitizer-racecheck.log" ;;
        norms) python3 benchmarks/bench_norms.py build/bench-norms.rosebundle 2>&1 \
                   | tee "$OUT/bench-norms.log" ;;
        norms_wide) python3 benchmarks/bench_norms.py build/bench-norms-wide.rosebundle \
                        --family rms_norm --hidden 5120,6144,7168,8192 \
                        --tokens 1,16,128,512,1024,2048,8192,32768 --name wide 2>&1 \
                        | tee "$OUT/bench-norms-wide.log" ;;
        moe) python3 benchmarks/bench_moe.py build/bench-moe.rosebundle 2>&1 | tee "$OUT/bench-moe.log" ;;
        moe_sweep) python3 benchmarks/bench_moe.py build/bench-moe.rosebundle --combine-sweep \
                       ${SWEEP_TOKENS:+--sweep-tokens "$SWEEP_TOKENS"} \
                       ${SWEEP_TOP_K:+--sweep-top-k "$SWEEP_TOP_K"} 2>&1 \
                       | tee "$OUT/bench-moe-combine-sweep.log" ;;
        moe_fp8) python3 benchmarks/bench_dispatch_fp8.py build/bench-moe-fp8.rosebundle 2>&1 \
                     | tee "$OUT/bench-moe-fp8.log" ;;
        act_quant|act_quant:*)  # one process per family: each family's tables survive a timeout
            families="${ACT_QUANT_FAMILIES:-act_and_mul fp8_group_quant act_and_mul_fp8_quant \
                      block_scaled_quant fp8_token_quant fp8_tensor_quant}"
            [ "$step" = act_quant ] || families="${step#act_quant:}"
            for family in ${families//,/ }; do
                python3 benchmarks/bench_act_quant.py build/bench-act-quant.rosebundle \
                    --family "$family" ${ACT_QUANT_TOKENS:+--tokens "$ACT_QUANT_TOKENS"} 2>&1 \
                    | tee -a "$OUT/bench-act-quant.log"
            done ;;
        overhead) python3 benchmarks/launch_overhead.py build/bench-norms.rosebundle 2>&1 \
                      | tee "$OUT/overhead.log" ;;
        pdl) python3 benchmarks/bench_pdl.py build/test.rosebundle 2>&1 | tee "$OUT/pdl.log" ;;
        warmup) python3 benchmarks/warmup.py gpu-side build/models 2>&1 | tee "$OUT/warmup.log" ;;
        preload_probe)  # where DeepSeek-V3's preload time goes, per way of loading
            python3 benchmarks/preload_probe.py build/models/deepseek-v3.rosebundle \
                --out "$OUT/preload-probe.json" 2>&1 | tee "$OUT/preload-probe.log" ;;
        merged_load)  # the driver's part of a preload, a module per variant vs one per bundle
            # (build/merged from `python benchmarks/merge_probe.py ... --write build/merged`)
            python3 benchmarks/merged_load_probe.py build/merged \
                --out "$OUT/merged-load.json" 2>&1 | tee "$OUT/merged-load.log" ;;
        ncu)  # Nsight Compute on one act_quant point: NCU_POINT="FAMILY TOKENS FIELD=VALUE..."
            # shellcheck disable=SC2086  # NCU_POINT is a list of arguments
            ncu --set full --kernel-name regex:cutlass --launch-skip 2 --launch-count 1 --csv \
                --page details \
                python3 benchmarks/ncu_point.py build/bench-act-quant.rosebundle \
                ${NCU_POINT:-nvfp4_quant 8192 hidden=7168 scale_layout=swizzled_128x4} \
                > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
            ncu_rc=$?; tail -3 "$OUT/ncu.err"; (exit $ncu_rc) ;;
        ep) ROSE_AOT_TEST_BUNDLE=build/test.rosebundle NPROC="${NPROC:-2}" PYTHON=python3 \
                bash tests/multigpu/run.sh --ep 2>&1 | tee "$OUT/ep-checks.log" ;;
        ep_bench) ROSE_AOT_TEST_BUNDLE=build/test.rosebundle NPROC="${NPROC:-2}" PYTHON=python3 \
                      bash tests/multigpu/run.sh --bench-ep --out "$OUT" 2>&1 | tee "$OUT/ep-bench.log" ;;
        *) echo "unknown step $step"; exit 2 ;;
    esac
    rc=${PIPESTATUS[0]}
    echo "== step $step exit $rc" | tee -a "$OUT/steps.txt"
    [ "$rc" -eq 0 ] || status=1
done
exit $status
