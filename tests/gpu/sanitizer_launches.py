"""One decode and one prefill launch of every kernel family, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 tests/gpu/sanitizer_launches.py BUNDLE [FAMILY...]
    compute-sanitizer --tool racecheck python3 tests/gpu/sanitizer_launches.py BUNDLE [FAMILY...]

FAMILY names limit the run to those families (a re-check after changing one); by default every
family of the bundle runs.

Not a pytest module (the sanitizer wraps the whole process). Sizes are odd so that partial
blocks and predicated lanes are exercised; outputs are checked against the float64 reference.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from act_quant_cases import compare, make_case  # noqa: E402
import dispatch_fp8_cases  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fp8_extra_cases  # noqa: E402

# the activation / quantization families: their inputs and checks come from act_quant_cases
ACT_QUANT = ("act_and_mul", "fp8_group_quant", "act_and_mul_fp8_quant", "block_scaled_quant",
             "nvfp4_quant")


def _capacity(handle, config, variant) -> int:
    """The most tokens a small variant of moe_dispatch takes (its record's max_pairs)."""
    import torch

    record = handle.record(torch.cuda.current_device())
    return record.variant(variant).constants["max_pairs"] // config.top_k


def main(path: str, families: tuple[str, ...] = ()) -> None:
    import torch

    from rose_aot import open_bundle
    from rose_aot.kernels import get_family
    from rose_aot.kernels.spec import Dim

    from rose_aot.errors import RoseAotError

    try:
        bundle = open_bundle(path)
    except RoseAotError as exc:
        sys.exit(f"sanitizer_launches.py: {exc}")
    unknown = sorted(set(families) - {p["family"] for p in bundle.index["points"]})
    if unknown:  # a typo would otherwise check nothing and exit 0
        have = ", ".join(sorted({p["family"] for p in bundle.index["points"]}))
        sys.exit(f"sanitizer_launches.py: {path} has no family {', '.join(unknown)}; it has: {have}")
    if not torch.cuda.is_available():
        sys.exit("sanitizer_launches.py needs a CUDA GPU")
    device = torch.cuda.current_device()
    arch = bundle.arch_for_device(device)
    seen = set()
    for point in bundle.index["points"]:
        # one point per family and scale layout (the swizzled layouts index scales their own way)
        kind = (point["family"], point["config"].get("scale_layout"))
        if point["arch"] != arch or kind in seen:
            continue
        if families and point["family"] not in families:
            continue
        seen.add(kind)
        family = get_family(point["family"])
        if getattr(family, "collective", False):  # needs every rank: tests/multigpu
            continue
        config = family.make_config(**point["config"])
        handle = bundle.kernel(point["family"], **point["config"])
        if point["family"] in ("fp8_token_quant", "fp8_tensor_quant"):  # bit-exact cases
            runs = (("decode", 3), ("prefill", 1001))
            if point["family"] == "fp8_tensor_quant":
                runs += (("single", 3), ("single_small", 3), ("single_wide", 3))
            for variant, tokens in runs:
                args, want, views = fp8_extra_cases.make_case(point["family"], config, tokens,
                                                              seed=tokens)
                handle(*args, variant=variant)
                torch.cuda.synchronize()
                fp8_extra_cases.compare(want, views, f"{handle.key} {variant}")
                print(f"ok {handle.key} {variant} T={tokens}", flush=True)
            continue
        if point["family"] in ACT_QUANT:  # strided inputs, scale layouts, packed dtypes
            # the decode shape at 3 tokens; the prefill shape (act_and_mul and the fused family
            # have none) or the decode shape's bulk form at 1001
            runs = [("decode", 3)] + [(v, 1001) for v in ("prefill", "bulk")
                                      if v in family.plan_choices]
            for variant, tokens in runs:
                args, want, views = make_case(point["family"], config, tokens, seed=tokens)
                handle(*args, variant=variant)
                torch.cuda.synchronize()
                compare(point["family"], config, want, views, f"{handle.key} {variant}")
                print(f"ok {handle.key} {variant} T={tokens}", flush=True)
            continue
        if point["family"] == dispatch_fp8_cases.FAMILY:  # e4m3 rows, scale layouts
            # the small variants at their capacity too: every warp of their blocks ranks pairs
            for variant, tokens in (("small", 3), ("small", _capacity(handle, config, "small")),
                                    ("small_wide", _capacity(handle, config, "small_wide")),
                                    ("decode", 3), ("prefill", 301)):
                host, want = dispatch_fp8_cases.make_case(config, tokens, "out_of_range", tokens)
                dev = dispatch_fp8_cases.to_device(host)
                handle(*dev, variant=variant)
                torch.cuda.synchronize()
                dispatch_fp8_cases.check(config, host, dev, want, f"{handle.key} {variant}")
                print(f"ok {handle.key} {variant} T={tokens}", flush=True)
            continue
        args = handle.record(device).args  # the call arguments the handle checks, in order
        runs = [("decode", 3), ("prefill", 1001)]
        if "small" in family.plan_choices:  # moe_dispatch: redundant routing, no barrier
            runs[:0] = [("small", 3), ("small", _capacity(handle, config, "small"))]
        for name in ("split", "split_wide", "split_block"):  # moe_combine: a row over blocks
            if name in family.plan_choices:
                runs.insert(0, (name, 3))
        for variant, tokens in runs:
            if point["family"] == "moe_dispatch" and variant != "small" and tokens > 3:
                tokens = 301  # prefill route + copy
            gen = torch.Generator().manual_seed(tokens)
            host = []
            for arg in args:
                sizes = {"tokens": tokens}
                if hasattr(family, "max_rows"):
                    sizes["rows"] = family.max_rows(config, tokens)
                else:
                    sizes["rows"] = tokens * 2
                shape = [sizes[d.name] if isinstance(d, Dim) else d for d in arg.shape]
                dtype = getattr(torch, arg.dtype)
                if arg.name in ("topk_ids", "positions") and not arg.writes:
                    limit = config.num_experts if arg.name == "topk_ids" else sizes["rows"]
                    host.append(torch.randint(-1, limit, shape, generator=gen, dtype=dtype))
                else:
                    host.append(torch.randn(shape, generator=gen).to(dtype))
            expect = [t.clone() for t in host]
            family.reference(config, *expect)
            dev = [t.cuda() for t in host]
            handle(*dev, variant=variant)
            torch.cuda.synchronize()
            for arg, got, want in zip(args, dev, expect):
                # dispatch places rows in atomic order; its row checks live in test_moe_gpu.py
                order_dependent = arg.name in ("out", "out_scales", "positions")
                if arg.writes and not (point["family"] == "moe_dispatch" and order_dependent):
                    err = (got.cpu().double() - want.double()).abs().max().item()
                    scale = want.double().abs().max().item()
                    assert err <= 2**-6 * max(1.0, scale), (handle.key, variant, arg.name, err)
            print(f"ok {handle.key} {variant} T={tokens}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], tuple(sys.argv[2:]))
