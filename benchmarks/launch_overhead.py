"""Host overhead of one eager launch through the loader (no CUDA graph), and where it goes.

    python benchmarks/launch_overhead.py BUNDLE [--launches N]

Times N back-to-back launches of a decode-sized qk_norm (1 token) with the host clock; the GPU
work per launch is far below the host cost, so the figure is host time. The same loop is timed
for the pieces of a launch (the generated hot path without the handle's __call__; the argument
checks alone; the driver call with packed parameters) and for a torch eager op as a peer, and
for the floors: the same prepacked launch through the plain cuLaunchKernel entry point and
through cuda.bindings' wrapper.
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
    config, call, pack, packer, name, prepared = launch
    variant = handle.record(dev).variant(name)  # block and shared memory come from the record
    assert (prepared.block, prepared.smem) == (variant.block, variant.smem)
    raw_stream = handle._raw_stream
    stream = raw_stream(dev)
    atoms = binder.fast_bind(args)[2]
    params = pack(atoms, ())
    config.hStream = stream

    # The floors: the same cubin function and prepacked parameters through the plain
    # cuLaunchKernel entry point (ctypes) and through cuda.bindings' own wrapper.
    from rose_aot.loader import driver

    plain = driver.launcher()
    function = prepared.function
    (gx, gy, gz), (bx, by, bz), smem = prepared.grid, prepared.block, prepared.smem
    cu = driver.driver()
    cu_function = cu.CUfunction(function)
    cu_stream = cu.CUstream(stream)

    def bindings_launch():
        return cu.cuLaunchKernel(cu_function, gx, gy, gz, bx, by, bz, smem, cu_stream, params, 0)

    ops = None
    try:
        from rose_aot import torch_ops

        ops = torch_ops.register(bundle)
    except Exception as exc:  # reported, not fatal: the eager handle is the figure asked for
        print(f"torch ops not measured: {exc}")
    out = {
        "rose_aot_call_us": per_call(lambda: handle(*args)),
        "hot_path_us": per_call(lambda: handle._fast_launch(args)),  # all but __call__ itself
        "argument_checks_us": per_call(lambda: binder.fast_bind(args)),
        "checks_and_pack_us": per_call(lambda: pack(binder.fast_bind(args)[2], ())),
        "launch_attributes": list(prepared.attributes),
        "current_stream_us": per_call(lambda: raw_stream(dev)),
        "driver_launch_ex_us": per_call(lambda: call(params, None)),
        "driver_launch_plain_ctypes_us": per_call(
            lambda: plain(function, gx, gy, gz, bx, by, bz, smem, stream, params, None)),
        "driver_launch_cuda_bindings_us": per_call(bindings_launch),
        "torch_eager_mul_us": per_call(lambda: q.mul_(1.0)),
        "torch_eager_add_us": per_call(lambda: q.add_(1)),
    }
    if ops is not None:
        out["torch_op_call_us"] = per_call(lambda: ops.call(handle, *args))
    out["ratio_to_torch_mul"] = out["rose_aot_call_us"] / out["torch_eager_mul_us"]
    return out


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
