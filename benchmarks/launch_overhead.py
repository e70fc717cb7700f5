"""Host overhead of one eager launch through the loader (no CUDA graph).

    python benchmarks/launch_overhead.py BUNDLE [--launches N]

Times N back-to-back launches of a tiny decode-sized kernel with the host clock, after a
synchronize; the GPU work per launch is far below the host cost, so the figure is host time.
A torch eager op of the same size is timed the same way as a peer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    import torch

    from rose_aot import open_bundle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--launches", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    bundle = open_bundle(args.bundle)
    bundle.preload()
    point = next(p for p in bundle.index["points"] if p["family"] == "qk_norm")
    cfg = point["config"]
    handle = bundle.kernel("qk_norm", **cfg)
    d = cfg["head_dim"]
    q = torch.randn(1, cfg["num_q_heads"], d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, cfg["num_k_heads"], d, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(d, device="cuda", dtype=torch.bfloat16)

    def per_call(fn):
        samples = []
        for _ in range(args.repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.launches):
                fn()
            elapsed = time.perf_counter() - start
            torch.cuda.synchronize()
            samples.append(elapsed / args.launches * 1e6)
        return statistics.median(samples)

    results = {
        "rose_aot_launch_us": per_call(lambda: handle(q, k, w, w)),
        "torch_eager_mul_us": per_call(lambda: q.mul_(1.0)),
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
