"""Programmatic dependent launch: a chain of 20 decode kernels in one CUDA graph, with and
without PDL (ROSE_AOT_PDL=1 / 0, each in its own process so nothing is shared).

    rose-aot build manifests -o build/bench-pdl.rosebundle                    # CPU
    python benchmarks/bench_pdl.py build/bench-pdl.rosebundle                 # GPU

The chain is five rounds of the decode kernels of one Qwen3-30B-A3B layer at 1 token: fused
add + RMSNorm, QK norm, MoE dispatch (cooperative), MoE combine. Reported: GPU time per graph
replay (do_bench_cudagraph median) and per kernel; output written to $OUT/pdl.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

H, E, K, QH, KH, D = 2048, 128, 8, 32, 4, 128

_CHILD = r"""
import json, sys
import torch, triton.testing
import rose_aot
bundle = rose_aot.open_bundle(sys.argv[1])
norm = bundle.kernel("rms_norm", hidden=2048, eps=1e-6, fused_residual=True)
qk = bundle.kernel("qk_norm", num_q_heads=32, num_k_heads=4, head_dim=128, eps=1e-6)
dispatch = bundle.kernel("moe_dispatch", num_experts=128, top_k=8, hidden=2048)
combine = bundle.kernel("moe_combine", top_k=8, hidden=2048)
tokens = int(sys.argv[2])
dev, bf = "cuda", torch.bfloat16
x = torch.randn(tokens, 2048, device=dev, dtype=bf); res = torch.randn_like(x); w = torch.ones(2048, device=dev, dtype=bf)
h = torch.empty_like(x); q = torch.randn(tokens, 32, 128, device=dev, dtype=bf); k = torch.randn(tokens, 4, 128, device=dev, dtype=bf)
qw = torch.ones(128, device=dev, dtype=bf)
ids = torch.stack([torch.randperm(128, device=dev)[:8] for _ in range(tokens)]).int()
routed = torch.empty(tokens * 8, 2048, device=dev, dtype=bf); offsets = torch.empty(129, device=dev, dtype=torch.int32)
positions = torch.empty(tokens, 8, device=dev, dtype=torch.int32); topw = torch.full((tokens, 8), 0.125, device=dev)
def chain():
    for _ in range(5):
        norm(x, res, w, h)
        qk(q, k, qw, qw)
        dispatch(h, ids, routed, offsets, positions)
        combine(routed, positions, topw, x)
chain(); torch.cuda.synchronize()
# correctness of the chain itself: the last combine of 8 equal-weight copies returns h
assert torch.equal(x, h), "chain result differs"
us = triton.testing.do_bench_cudagraph(chain, rep=200, return_mode="median") * 1e3
print(json.dumps({"graph_us": us, "kernels": 20, "pdl_attribute": [v.pdl for v in norm.record(0).variants]}))
"""


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = []
    for tokens in (1, 16):
        for pdl in ("0", "1"):
            env = {**os.environ, "ROSE_AOT_PDL": pdl}
            done = subprocess.run([sys.executable, "-c", _CHILD, sys.argv[1], str(tokens)], env=env,
                                  capture_output=True, text=True)
            if done.returncode:
                sys.exit(done.stderr[-4000:])
            r = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append({"tokens": tokens, "pdl": pdl == "1", "graph_us": round(r["graph_us"], 2),
                         "per_kernel_us": round(r["graph_us"] / r["kernels"], 3)})
    out = os.environ.get("OUT", "benchmarks/results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "pdl.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print("| tokens | PDL | 20-kernel graph µs | per kernel µs |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens']} | {'on' if r['pdl'] else 'off'} | {r['graph_us']:.2f} | {r['per_kernel_us']:.3f} |")


if __name__ == "__main__":
    main()
