"""One decode and one prefill launch of every kernel family, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 tests/gpu/sanitizer_launches.py BUNDLE
    compute-sanitizer --tool racecheck python3 tests/gpu/sanitizer_launches.py BUNDLE

Not a pytest module (the sanitizer wraps the whole process). Sizes are odd so that partial
blocks and predicated lanes are exercised; outputs are checked against the float64 reference.
"""

from __future__ import annotations

import sys


def main(path: str) -> None:
    import torch

    from rose_aot import open_bundle
    from rose_aot.kernels import get_family
    from rose_aot.kernels.spec import DTYPES, Dim

    bundle = open_bundle(path)
    arch = bundle.arch_for_device(torch.cuda.current_device())
    seen = set()
    for point in bundle.index["points"]:
        if point["arch"] != arch or point["family"] in seen:
            continue
        seen.add(point["family"])
        family = get_family(point["family"])
        config = family.make_config(**point["config"])
        handle = bundle.kernel(point["family"], **point["config"])
        for variant, tokens in (("decode", 3), ("prefill", 1001)):
            gen = torch.Generator().manual_seed(tokens)
            host = []
            for arg in family.args(config):
                shape = [tokens if isinstance(d, Dim) else d for d in arg.shape]
                dtype = getattr(torch, DTYPES[arg.dtype][1])
                host.append(torch.randn(shape, generator=gen).to(dtype))
            expect = [t.clone() for t in host]
            family.reference(config, *expect)
            dev = [t.cuda() for t in host]
            handle(*dev, variant=variant)
            torch.cuda.synchronize()
            for arg, got, want in zip(family.args(config), dev, expect):
                if arg.writes:
                    err = (got.cpu().double() - want.double()).abs().max().item()
                    scale = want.double().abs().max().item()
                    assert err <= 2**-6 * max(1.0, scale), (handle.key, variant, arg.name, err)
            print(f"ok {handle.key} {variant} T={tokens}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
