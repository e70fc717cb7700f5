"""Host overhead of one eager launch through the loader (no CUDA graph), where it goes, and
every driver API the loader can launch through, side by side.

    python benchmarks/launch_overhead.py BUNDLE [--launches N]

Times N back-to-back launches of a decode-sized qk_norm (1 token; a launch without attributes)
with the host clock; the GPU work per launch is far below the host cost, so the figure is host
time. The same loop is timed for the pieces of a launch (the generated hot path without the
handle's __call__; the argument checks alone; the generated launcher alone; the driver call with
packed parameters), for a torch eager op as a peer (before and after the rest, to show drift),
and for the floors: the same prepacked launch through the plain cuLaunchKernel entry point
(ctypes, 11 converted arguments) and through cuda.bindings' wrapper with prebuilt handles.

`apis` repeats the whole call and its bare driver call for each driver API
(rose_aot.loader.driver.LAUNCH_APIS): for the qk_norm launch (no attributes) and, when the
bundle has one, a one-token rms_norm launch with programmatic dependent launch (the
attributed launches; "bindings" cannot make those). The loader's default is
`driver.launch_api()` (printed as `default_api`); `rose_aot_call_us` and `ratio_to_torch_mul`
are for it. With the C extension built, the checks of every API's call run in C;
`python_loader_call_us` is the call with the extension hidden (generated Python checks and
launchers), and `argument_checks_c_us` / `argument_checks_python_us` the two checks alone.
`side_by_side_us` times the rose-aot call, the Python-hot-path call and torch's `mul_` / `add_`
in turns (101 rounds of 256 launches each, order rotating; `side_by_side_ratio_to_torch_mul` is
the goal's ratio).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _batch_us(fn, launches: int) -> float:
    """Host µs per call of `launches` back-to-back calls of `fn` (the GPU drained before and
    after, outside the clock)."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(launches):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / launches * 1e6


def _per_call(launches: int, repeats: int):
    def per_call(fn):
        return statistics.median(_batch_us(fn, launches) for _ in range(repeats))

    return per_call


def _interleaved(launches: int, repeats: int, fns: dict) -> dict:
    """Median µs per call of each of `fns`, timed in turns (one batch of each per round, the
    order rotating), so that a host's drift during the run weighs on all of them alike: the
    side-by-side figures the ratio to torch is taken from."""
    samples: dict = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(_batch_us(fns[name], launches))
    return {name: statistics.median(values) for name, values in samples.items()}


def _driver_call(prepared, params: int, stream: int):
    """The driver call of `prepared` exactly as the generated launcher makes it (see
    driver.PreparedLaunch), as a function of no arguments."""
    from rose_aot.loader import driver

    call, config = prepared.bind(params), prepared.config
    if prepared.api in ("native", "ctypes-ex"):  # a native PreparedLaunch calls as ctypes-ex
        def launch():
            config.hStream = stream
            return call()
    elif prepared.api == "bindings-ex":
        stream_object = driver.stream_object(stream)

        def launch():
            config.hStream = stream_object
            return call()[0]
    else:
        stream_object = driver.stream_object(stream)

        def launch():
            return call(stream_object, params, 0)[0]
    return launch


def _api_figures(per_call, handle, args, packer, prepared) -> dict:
    """The whole call through `prepared`'s API, and its driver call alone: prepacked for the
    Python APIs, the C launcher with the call's atoms (its pack included) for "native"."""
    dev = args[0].get_device()
    stream = handle._raw_stream(dev)
    if prepared.api == "native":
        go = handle._launchers[handle._fast_arch][(dev, 1)]
        atoms = handle._state(dev)[1].fast_bind(args)[2]
        driver_call = per_call(lambda: go(stream, *atoms))
    else:
        driver_call = per_call(_driver_call(prepared, packer.address, stream))
    return {"call_us": per_call(lambda: handle(*args)), "driver_call_us": driver_call}


def _resolved_launch(handle, args, sizes):
    """Resolve the call anew (with the current driver API) and return its one launch."""
    handle._forget_resolved()
    handle(*args)
    dev = args[0].get_device()
    (launch,) = handle._resolved[(dev, sizes, None)]
    return launch


def _pdl_point(bundle):
    """A one-token rms_norm call whose launch has attributes (PDL), or None."""
    import torch

    for point in bundle.index["points"]:
        cfg = point["config"]
        if point["family"] != "rms_norm" or cfg.get("fused_residual"):
            continue
        handle = bundle.kernel("rms_norm", **cfg)
        h = cfg["hidden"]
        args = (torch.randn(1, h, device="cuda", dtype=torch.bfloat16),
                torch.ones(h, device="cuda", dtype=torch.bfloat16),
                torch.empty(1, h, device="cuda", dtype=torch.bfloat16))
        try:
            _packer, _name, prepared = _resolved_launch(handle, args, (1,))
        except Exception:  # noqa: BLE001 - a point this arg shape does not fit: try another
            continue
        if prepared.attributes:
            return handle, args
    return None


def measure(bundle, launches: int = 20000, repeats: int = 5) -> dict:
    import torch

    from rose_aot.loader import driver

    per_call = _per_call(launches, repeats)
    point = next(p for p in bundle.index["points"] if p["family"] == "qk_norm")
    cfg = point["config"]
    handle = bundle.kernel("qk_norm", **cfg)
    d = cfg["head_dim"]
    q = torch.randn(1, cfg["num_q_heads"], d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, cfg["num_k_heads"], d, device="cuda", dtype=torch.bfloat16)
    wq = torch.ones(d, device="cuda", dtype=torch.bfloat16)
    wk = torch.ones(d, device="cuda", dtype=torch.bfloat16)  # two weights, as a model has
    args = (q, k, wq, wk)
    handle(*args)
    torch.cuda.synchronize()

    out = {"default_api": driver.launch_api(), "torch_eager_mul_us": per_call(lambda: q.mul_(1.0))}
    default = driver.launch_api()
    apis: dict = {"no_attributes": {}, "attributed": {}}
    pdl = _pdl_point(bundle)
    built = [api for api in driver.LAUNCH_APIS if api != "native" or driver.native()]
    try:
        for api in built:
            driver.set_launch_api(plain=api)
            # resolving runs the call once: the buffer holds its parameters
            packer, _name, prepared = _resolved_launch(handle, args, (1,))
            assert prepared.api == api and not prepared.attributes
            apis["no_attributes"][api] = _api_figures(per_call, handle, args, packer, prepared)
        if pdl is not None:
            pdl_handle, pdl_args = pdl
            for api in [a for a in built if a != "bindings"]:
                driver.set_launch_api(attributed=api)
                packer, _name, prepared = _resolved_launch(pdl_handle, pdl_args, (1,))
                assert prepared.api == api and prepared.attributes
                apis["attributed"][api] = {
                    **_api_figures(per_call, pdl_handle, pdl_args, packer, prepared),
                    "attributes": list(prepared.attributes)}
    finally:
        driver.set_launch_api(**default)
    out["apis"] = apis
    # The loader without its C extension (generated Python checks and launchers), as every
    # call ran before it: a fresh handle made while driver.native() answers None.
    real_native = driver.native
    try:
        driver.native = lambda: None
        driver.set_launch_api(plain="bindings", attributed="ctypes-ex")
        python_handle = bundle.kernel("qk_norm", **cfg)
        python_handle(*args)
    finally:
        driver.native = real_native
        driver._launch_api.clear()
        driver.set_launch_api(**default)
    # The comparison the goal is about, in turns: the rose-aot call (default API), the same
    # call through the Python hot path, and torch's eager elementwise ops on the same tensor.
    # Batches of 256 launches, fewer than the launch queue holds: the host never waits for the
    # GPU to drain it, so each batch times the host alone (20000 back-to-back launches can run
    # at the GPU's rate for tiny kernels instead).
    side = _interleaved(256, 101, {
        "rose_aot": lambda: handle(*args), "python_loader": lambda: python_handle(*args),
        "torch_mul": lambda: q.mul_(1.0), "torch_add": lambda: q.add_(1)})
    out["side_by_side_us"] = side
    out["side_by_side_ratio_to_torch_mul"] = side["rose_aot"] / side["torch_mul"]
    out["side_by_side_ratio_to_torch_add"] = side["rose_aot"] / side["torch_add"]
    out["python_loader_call_us"] = side["python_loader"]

    # The pieces, with the default API.
    packer, name, prepared = _resolved_launch(handle, args, (1,))
    dev = q.get_device()
    binder = handle._state(dev)[1]  # the ArgBinder of this device's arch (its record's args)
    variant = handle.record(dev).variant(name)  # block and shared memory come from the record
    assert (prepared.block, prepared.smem) == (variant.block, variant.smem)
    raw_stream = handle._raw_stream
    stream = raw_stream(dev)
    atoms = binder.fast_bind(args)[2]
    go = handle._launchers[handle._fast_arch][(dev, 1)]
    handle(*args)
    params = packer.address

    # The floors: the same cubin function and prepacked parameters through the plain
    # cuLaunchKernel entry point (ctypes) and through cuda.bindings' own wrapper.
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
    checker = binder.native_checker()
    if checker is not None:
        native_bind = driver.native().bind
        out["argument_checks_c_us"] = per_call(lambda: native_bind(checker, args))
    out.update({
        "rose_aot_call_us": per_call(lambda: handle(*args)),
        "hot_path_us": per_call(lambda: handle._fast_launch(args)),  # all but __call__ itself
        "argument_checks_python_us": per_call(lambda: binder.fast_bind(args)),
        "launcher_us": per_call(lambda: go(stream, *atoms)),  # packs + driver call
        "launch_attributes": list(prepared.attributes),
        "current_stream_us": per_call(lambda: raw_stream(dev)),
        "driver_call_us": per_call(_driver_call(prepared, params, stream)),
        "driver_launch_plain_ctypes_us": per_call(
            lambda: plain(function, gx, gy, gz, bx, by, bz, smem, stream, params, None)),
        "driver_launch_cuda_bindings_us": per_call(bindings_launch),
        "torch_eager_add_us": per_call(lambda: q.add_(1)),
        "torch_eager_mul_again_us": per_call(lambda: q.mul_(1.0)),
    })
    if ops is not None:
        out["torch_op_call_us"] = per_call(lambda: ops.call(handle, *args))
    torch_mul = (out["torch_eager_mul_us"] + out["torch_eager_mul_again_us"]) / 2
    out["ratio_to_torch_mul"] = out["rose_aot_call_us"] / torch_mul
    return out


def main() -> None:
    from rose_aot import open_bundle

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--launches", type=int, default=20000)
    args = parser.parse_args()
    bundle = open_bundle(args.bundle)
    bundle.preload()
    print(json.dumps(measure(bundle, args.launches), indent=2))


if __name__ == "__main__":
    main()
