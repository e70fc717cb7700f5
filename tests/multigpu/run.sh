#!/usr/bin/env bash
# The two-GPU checks (and, with --bench, the benchmark), one process per GPU via torchrun.
#   ROSE_AOT_TEST_BUNDLE=build/test.rosebundle tests/multigpu/run.sh [--quick]
#   ROSE_AOT_TEST_BUNDLE=build/test.rosebundle tests/multigpu/run.sh --bench [bench args]
#   ROSE_AOT_TEST_BUNDLE=build/test.rosebundle tests/multigpu/run.sh --ep [--quick]
#   ROSE_AOT_TEST_BUNDLE=build/test.rosebundle tests/multigpu/run.sh --bench-ep [bench args]
# NPROC (default 2) sets the number of processes; PYTHON the interpreter.
set -euo pipefail
cd "$(dirname "$0")/../.."
# NVLink multicast must never run on the lent machines (the scripts set these too).
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-python3}"
NPROC="${NPROC:-2}"
: "${ROSE_AOT_TEST_BUNDLE:?set ROSE_AOT_TEST_BUNDLE to the bundle built from tests/manifests (rose-aot build tests/manifests -o build/test.rosebundle)}"
script=tests/multigpu/check_all_reduce.py
case "${1:-}" in
  --bench) shift; script=benchmarks/bench_multigpu.py; set -- "$ROSE_AOT_TEST_BUNDLE" "$@" ;;
  --ep) shift; script=tests/multigpu/check_ep.py ;;
  --bench-ep) shift; script=benchmarks/bench_ep.py; set -- "$ROSE_AOT_TEST_BUNDLE" "$@" ;;
esac
exec "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" "$script" "$@"
