"""Host overhead of one eager launch through the loader (no CUDA graph), and where it goes.

    python benchmarks/launch_overhead.py BUNDLE [--launches N]

Times N back-to-back launches of a decode-sized qk_norm (1 token) with the host clock; the GPU
work per launch is far below the host cost, so the figure is host time. The same loop is timed
for the pieces of a launch (argument checks; the driver call with packed parameters) and for a
torch eager op as a peer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def measure(bundle, launches: int = 20000, repeats: int = 5) -> dict:
    import torch

    point = next(p for p in bundle.index["points"] if p["family"] == "qk_norm")
    cfg = point["config"]
    handle = bundle.kernel("qk_norm", **cfg)
    d = cfg["head_dim"]
    q = torch.randn(1, cfg["num_q_heads"], d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, cfg["num_k_heads"], d, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(d, device="cuda", dtype=torch.bfloat16)
    handle(q, k, w, w)
    torch.cuda.synchronize()

    def per_call(fn):
        samples = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(launches):
                fn()
            elapsed = time.perf_counter() - start
            torch.cuda.synchronize()
            samples.append(elapsed / launches * 1e6)
        return statistics.median(samples)

    args = (q, k, w, w)
    dev = q.get_device()
    binder = handle._state(dev)[1]  # the ArgBinder of this device's arch (its record's args)
    (launch,) = handle._resolved[(dev, (1,), None)]
    kernel, gx, gy, gz, bx, by, bz, smem, packer, name, cooperative, ex = launch
    variant = handle.record(dev).variant(name)  # block and shared memory come from the record
    assert (bx, by, bz, smem) == (*variant.block, variant.smem)
    assert not cooperative
    stream = handle._raw_stream(q.get_device())
    params = packer.pack(packer.fast_values(*binder.fast_bind(args)[:3]))
    if ex is not None:  # launch attributes (programmatic dependent launch): cuLaunchKernelEx
        def driver_launch():
            return ex(kernel, gx, gy, gz, bx, by, bz, smem, stream, params)
    else:
        launch_fn = handle._launch

        def driver_launch():
            return launch_fn(kernel, gx, gy, gz, bx, by, bz, smem, stream, params, None)
    raw_stream = handle._raw_stream
    return {
        "rose_aot_call_us": per_call(lambda: handle(*args)),
        "argument_checks_us": per_call(lambda: binder.fast_bind(args)),
        "checks_and_pack_us": per_call(lambda: packer.pack(packer.fast_values(*binder.fast_bind(args)[:3])))
        ,
        "launch_path": "cuLaunchKernelEx (pdl)" if ex is not None else "cuLaunchKernel",
        "current_stream_us": per_call(lambda: raw_stream(dev)),
        "driver_launch_us": per_call(driver_launch),
        "torch_eager_mul_us": per_call(lambda: q.mul_(1.0)),
    }


def main() -> None:
    from rose_aot import open_bundle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--launches", type=int, default=20000)
    args = parser.parse_args()
    bundle = open_bundle(args.bundle)
    bundle.preload()
    print(json.dumps(measure(bundle, args.launches), indent=2))


if __name__ == "__main__":
    main()
