"""Programmatic dependent launch: chains of 20 decode kernels in one CUDA graph, with and
without PDL (ROSE_AOT_PDL=1 / 0, each in its own process so nothing is shared).

    rose-aot build manifests -o build/bench-pdl.rosebundle                    # CPU
    python benchmarks/bench_pdl.py build/bench-pdl.rosebundle                 # GPU

Two chains, each five rounds of four kernels:
- `moe`, the decode kernels of one Qwen3-30B-A3B layer at 1 and 16 tokens: fused add +
  RMSNorm, QK norm, MoE dispatch (cooperative), MoE combine;
- `mlp`, DeepSeek-V3's norm and activation kernels at 1-128 tokens, where act_and_mul and the
  quantizers launch their `decode` (the next kernel launched at the top) and `mid` (after the
  stores) variants: fused add + RMSNorm (7168), FP8 group quant of its output (7168, column-major
  TMA scales), act_and_mul (SiLU, d 2048), act_and_mul + FP8 group quant (d 2048).
Reported: GPU time per graph replay (do_bench_cudagraph median) and per kernel, with the
variants the plan chose; output written to $OUT/pdl.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

H, E, K, QH, KH, D = 2048, 128, 8, 32, 4, 128

_MOE_CHILD = r"""
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
print(json.dumps({"graph_us": us, "kernels": 20, "variants": "-"}))
"""

_MLP_CHILD = r"""
import json, sys
import torch, triton.testing
import rose_aot
bundle = rose_aot.open_bundle(sys.argv[1])
H, D, G = 7168, 2048, 128
norm = bundle.kernel("rms_norm", hidden=H, eps=1e-6, fused_residual=True)
quant = bundle.kernel("fp8_group_quant", hidden=H, group=G, scale_layout="col_major_tma")
act = bundle.kernel("act_and_mul", d=D, activation="silu")
fused = bundle.kernel("act_and_mul_fp8_quant", d=D, activation="silu", group=G,
                      scale_layout="col_major_tma")
tokens = int(sys.argv[2])
dev, bf = "cuda", torch.bfloat16
def scales(groups):  # column-major, tokens padded to 4 (the TMA layout)
    return torch.empty(groups, -(-tokens // 4) * 4, device=dev).t()[:tokens]
x = torch.randn(tokens, H, device=dev, dtype=bf); res = torch.randn_like(x)
w = torch.ones(H, device=dev, dtype=bf); h = torch.empty_like(x)
q = torch.empty(tokens, H, device=dev, dtype=torch.float8_e4m3fn); s = scales(H // G)
g = torch.randn(tokens, 2 * D, device=dev, dtype=bf)
a = torch.empty(tokens, D, device=dev, dtype=bf)
q2 = torch.empty(tokens, D, device=dev, dtype=torch.float8_e4m3fn); s2 = scales(D // G)
def chain():
    for _ in range(5):
        norm(x, res, w, h)
        quant(h, q, s)
        act(g, a)
        fused(g, q2, s2)
chain(); torch.cuda.synchronize()
ref = torch.nn.functional.silu(g[:, :D].float()) * g[:, D:].float()
assert torch.allclose(a.float(), ref, rtol=1e-2, atol=1e-2), "act_and_mul result differs"
# the quantized norm output, dequantized, is the norm output (e4m3: 2^-4 relative)
deq = q.float().view(tokens, H // G, G) * s.unsqueeze(-1)
assert torch.allclose(deq.view(tokens, H), h.float(), rtol=0.07, atol=1e-3), "quant differs"
# the activation outputs read only g: every replay writes them again, equal
want = [t.clone() for t in (a, q2.view(torch.uint8), s2)]
us = triton.testing.do_bench_cudagraph(chain, rep=200, return_mode="median") * 1e3
got = (a, q2.view(torch.uint8), s2)
assert all(torch.equal(x0, x1) for x0, x1 in zip(want, got)), "replays differ"
names = [k.plan(*args)[0].variant for k, args in
         ((quant, (h, q, s)), (act, (g, a)), (fused, (g, q2, s2)))]
print(json.dumps({"graph_us": us, "kernels": 20, "variants": "/".join(names)}))
"""

CHAINS = {"moe": (_MOE_CHILD, (1, 16)), "mlp": (_MLP_CHILD, (1, 16, 64, 128))}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = []
    for chain, (child, token_counts) in CHAINS.items():
        for tokens in token_counts:
            for pdl in ("0", "1"):
                env = {**os.environ, "ROSE_AOT_PDL": pdl}
                done = subprocess.run([sys.executable, "-c", child, sys.argv[1], str(tokens)],
                                      env=env, capture_output=True, text=True)
                if done.returncode:
                    sys.exit(f"bench_pdl.py: chain {chain} at {tokens} tokens, PDL {pdl}: "
                             f"{done.stderr[-4000:]}")
                r = json.loads(done.stdout.strip().splitlines()[-1])
                rows.append({"chain": chain, "tokens": tokens, "pdl": pdl == "1",
                             "graph_us": round(r["graph_us"], 2),
                             "per_kernel_us": round(r["graph_us"] / r["kernels"], 3),
                             "variants": r["variants"]})
    out = os.environ.get("OUT", "benchmarks/results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "pdl.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print("| chain | tokens | PDL | 20-kernel graph µs | per kernel µs "
          "| variants (quant/act/fused) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['chain']} | {r['tokens']} | {'on' if r['pdl'] else 'off'} | "
              f"{r['graph_us']:.2f} | {r['per_kernel_us']:.3f} | {r['variants']} |")


if __name__ == "__main__":
    main()
