"""act_and_mul, fp8_group_quant, act_and_mul_fp8_quant and block_scaled_quant from a CPU-built
bundle against torch eager, torch.compile of the same math (compiled for each shape: no
dynamic-shape kernels) and (where installed) Liger-Kernel's SiLU-mul. block_scaled_quant (with
nvfp4_quant) has a torch peer for MXFP8 with row-major scales only (no fp4 peer).

    python benchmarks/bench_act_quant.py BUNDLE [--family act_and_mul|fp8_group_quant|
        act_and_mul_fp8_quant|...|all, or several joined by commas] [--tokens 1,16,...]
        [--widths 2048,4096,...] [--no-peers] [--label NAME]

BUNDLE must hold the points of benchmarks/manifests/act_quant.toml
(`rose-aot build benchmarks/manifests/act_quant.toml -o build/bench-act-quant.rosebundle`).
Every implementation runs in this process, timed as a CUDA-graph replay (median); ours is timed
with the plan's choice and with each variant forced (data for act_and_mul/tuning.py). Before
timing, our output at the benchmarked shape is checked against the float64 reference on its
first rows (the GPU suite's tolerances); a failed check aborts the run. Bytes counted: input
read + outputs written, scales included. Writes act_quant-<family>.json and act_quant-<family>.md
to $OUT (or benchmarks/results), plus one PNG per family when matplotlib is installed.
--no-peers times only rose-aot (plan and forced variants: a sweep of experimental bundles, whose
peers the full run measures); --label NAME names the output files act_quant-NAME.*.
Published peer (other hardware): vLLM's CUDA per-token-group FP8 quant, group 128,
hidden 7168, 1 token on an H100: 3.8 µs (vllm PR #25427).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))

from common import (  # noqa: E402
    bench_us, compile_per_shape, copy_bandwidth_tbs, environment, file_label, int_list, out_dir,
    plot_families,
)

WIDTHS = [2048, 4096, 7168, 14336]
TOKENS = [1, 16, 128, 1024, 8192, 32768]
GROUP = 128
EPS = 1e-10
PEERS = True  # --no-peers: time rose-aot only
CHECK_ROWS = 64  # rows compared with the float64 reference (a CPU reference of all is too slow)
FAMILIES = ("act_and_mul", "fp8_group_quant", "act_and_mul_fp8_quant", "block_scaled_quant",  # + nvfp4_quant
            "fp8_token_quant", "fp8_tensor_quant")
# The bundle families each --family option looks up, and the config field --widths sets.
WIDTH_FIELDS = {
    "act_and_mul": (("act_and_mul", "d"),),
    "fp8_group_quant": (("fp8_group_quant", "hidden"),),
    "act_and_mul_fp8_quant": (("act_and_mul_fp8_quant", "d"),),
    "block_scaled_quant": (("block_scaled_quant", "hidden"), ("nvfp4_quant", "hidden")),
    "fp8_token_quant": (("fp8_token_quant", "hidden"),),
    "fp8_tensor_quant": (("fp8_tensor_quant", "hidden"),),
}


def missing_widths(index: dict, families, widths) -> list[str]:
    """One line per (bundle family, width) of the request that the bundle index has no point
    for, naming the widths it has: checked before any GPU work, so a typo costs no device time."""
    lines = []
    for option in families:
        for family, field in WIDTH_FIELDS[option]:
            have = sorted({p["config"][field] for p in index["points"] if p["family"] == family})
            lack = [w for w in widths if w not in have]
            if lack:
                lines.append(f"the bundle has no {family} point of {field} {lack} "
                             f"(it has {have or 'none'})")
    return lines


# ----------------------------------------------------------------------------- torch peers
def act_torch(x, out, activation):
    import torch.nn.functional as F

    d = out.shape[1]
    a, b = x[:, :d].float(), x[:, d:].float()
    act = F.silu(a) if activation == "silu" else F.gelu(a, approximate="tanh")
    out.copy_((act * b).to(out.dtype))


def quant_torch(y, q, scales, group, ue8m0):
    """Per-token-group e4m3 quantization of fp32/bf16 y in torch (scales: any [T, G] view)."""
    import torch

    t, h = y.shape
    g = y.float().view(t, h // group, group)
    scale = g.abs().amax(-1).clamp(min=EPS) / 448.0
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q.copy_((g / scale.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(t, h))
    scales.copy_(scale)


def fused_torch(x, q, scales, group, ue8m0):
    import torch.nn.functional as F

    d = q.shape[1]
    quant_torch(F.silu(x[:, :d].float()) * x[:, d:].float(), q, scales, group, ue8m0)


def _liger_silu_mul():
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError as exc:
        print(f"NOTE: Liger-Kernel not importable ({exc}); its SiLU-mul peer is left out",
              flush=True)
        return None
    return LigerSiLUMulFunction.apply


# ----------------------------------------------------------------------------- helpers
def _scales(tokens, groups, layout):
    import torch

    if layout == "row_major":
        return torch.empty(tokens, groups, device="cuda")
    padded = -(-tokens // 4) * 4
    return torch.empty(groups, padded, device="cuda").t()[:tokens]


def _check(family, config, x, outputs, label):
    """Our outputs' first rows against the float64 reference (tolerances of the GPU suite)."""
    from act_quant_cases import compare

    from rose_aot.kernels import get_family

    import torch

    rows = min(CHECK_ROWS, x.shape[0])
    xs = x[:rows].cpu().contiguous()
    if family == "act_and_mul":
        from rose_aot.kernels.act_and_mul.reference import act_and_mul64

        compare(family, config, {"out": act_and_mul64(xs, config.d, config.activation)},
                {"out": outputs[0][:rows]}, label)
        return
    q, s = outputs
    want_q = torch.empty(rows, q.shape[1], dtype=torch.float8_e4m3fn)
    want_s = torch.empty(rows, s.shape[1])
    get_family(family).reference(config, xs, want_q, want_s)
    compare(family, config, {"q": want_q, "scales": want_s},
            {"q": q[:rows], "scales": s[:rows], "padding": None}, label)


def _measure(family, shape, tokens, nbytes, impls, handle_variants):
    if not PEERS:
        impls = {k: v for k, v in impls.items() if k.startswith("rose_aot")}
    row = {"family": family, "shape": shape, "tokens": tokens, "bytes": nbytes, "us": {},
           "errors": {}}
    for i, (name, fn) in enumerate(impls.items()):
        try:
            fn()  # warm up: compile, autotune, module load
            if i == 0:
                # one discarded replay, so that a row's first timing does not start on a GPU
                # left idle by the CPU-side reference check
                bench_us(fn, rep_ms=20)
            row["us"][name] = bench_us(fn)
        except Exception as exc:  # a peer that cannot run is reported, ours is not
            if name.startswith("rose_aot"):
                raise
            row["errors"][name] = f"{type(exc).__name__}: {exc}"
            print(f"  !! {name} failed: {row['errors'][name]}", flush=True)
    row["plan"] = handle_variants
    print(
        f"  {family:22} {shape:22} T={tokens:<6} "
        + " ".join(f"{k}={v:8.2f}" for k, v in row["us"].items()),
        flush=True,
    )
    return row


# ----------------------------------------------------------------------------- families
def bench_act_and_mul(bundle, tokens_list, widths, rows):
    import torch

    liger = _liger_silu_mul()
    compiled = compile_per_shape(act_torch)
    for activation in ("silu", "gelu_tanh"):
        for d in widths:
            values = dict(d=d, activation=activation)
            ours = bundle.kernel("act_and_mul", **values)
            config = ours.config
            for t in tokens_list:
                gen = torch.Generator(device="cuda").manual_seed(t + d)
                x = torch.randn(t, 2 * d, device="cuda", dtype=torch.bfloat16, generator=gen)
                out = torch.full((t, d), float("nan"), device="cuda", dtype=torch.bfloat16)
                for variant in (None, *ours.family.plan_choices):
                    out.fill_(float("nan"))
                    ours(x, out, variant=variant)
                    torch.cuda.synchronize()
                    _check("act_and_mul", config, x, (out,), f"act_and_mul {values} T={t} {variant}")
                impls = {
                    "rose_aot": lambda: ours(x, out),
                    "rose_aot_decode": lambda: ours(x, out, variant="decode"),
                    "rose_aot_bulk": lambda: ours(x, out, variant="bulk"),
                    "torch_eager": lambda: act_torch(x, out, activation),
                    "torch_compile": lambda: compiled(x, out, activation),
                }
                if liger is not None and activation == "silu":
                    a, b = x[:, :d].contiguous(), x[:, d:].contiguous()  # its API: two tensors
                    impls["liger_silu_mul"] = lambda: liger(a, b)
                nbytes = t * 2 * d * 2 + t * d * 2
                plan = ours.plan(x, out)[0].variant
                rows.append(_measure("act_and_mul", f"{activation}/{d}", t, nbytes, impls, plan))


def bench_quant(bundle, tokens_list, widths, rows, fused):
    import torch

    family = "act_and_mul_fp8_quant" if fused else "fp8_group_quant"
    peer = fused_torch if fused else quant_torch
    compiled = compile_per_shape(peer)
    layouts = ("col_major_tma",) if fused else ("row_major", "col_major_tma")
    # timed forced next to decode: the fused family has no prefill shape (act_and_mul/tuning.py)
    other = "bulk" if fused else "prefill"
    for layout in layouts:
        for h in widths:
            if fused:
                values = dict(d=h, activation="silu", group=GROUP, scale_layout=layout)
            else:
                values = dict(hidden=h, group=GROUP, scale_layout=layout)
            ours = bundle.kernel(family, **values)
            config = ours.config
            groups = h // GROUP
            for t in tokens_list:
                gen = torch.Generator(device="cuda").manual_seed(t + h)
                x = torch.randn(t, 2 * h if fused else h, device="cuda", dtype=torch.bfloat16,
                                generator=gen)
                q = torch.empty(t, h, device="cuda", dtype=torch.float8_e4m3fn)
                s = _scales(t, groups, layout)
                for variant in (None, *ours.family.plan_choices):
                    q.view(torch.uint8).fill_(0x7F)
                    s.fill_(float("nan"))
                    ours(x, q, s, variant=variant)
                    torch.cuda.synchronize()
                    _check(family, config, x, (q, s), f"{family} {values} T={t} {variant}")
                impls = {
                    "rose_aot": lambda: ours(x, q, s),
                    "rose_aot_decode": lambda: ours(x, q, s, variant="decode"),
                    f"rose_aot_{other}": lambda: ours(x, q, s, variant=other),
                    "torch_eager": lambda: peer(x, q, s, GROUP, False),
                    "torch_compile": lambda: compiled(x, q, s, GROUP, False),
                }
                nbytes = x.numel() * 2 + t * h + t * groups * 4
                plan = ours.plan(x, q, s)[0].variant
                rows.append(_measure(family, f"{layout}/{h}", t, nbytes, impls, plan))


def token_quant_torch(x, q, scales):
    """Dynamic per-token e4m3 quantization in torch (scales [T, 1])."""
    scale = x.float().abs().amax(-1, keepdim=True).clamp(min=EPS) / 448.0
    q.copy_((x.float() / scale).clamp(-448.0, 448.0).to(q.dtype))
    scales.copy_(scale)


def tensor_quant_torch(x, q, scale):
    """Dynamic per-tensor e4m3 quantization in torch (scale [1])."""
    s = x.float().abs().amax().clamp(min=EPS) / 448.0
    q.copy_((x.float() / s).clamp(-448.0, 448.0).to(q.dtype))
    scale.copy_(s.reshape(1))


def bench_token_tensor(bundle, tokens_list, widths, rows, per_tensor):
    import torch

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from fp8_extra_cases import compare  # bit-exact codes and scales

    from rose_aot.kernels import get_family

    family = "fp8_tensor_quant" if per_tensor else "fp8_token_quant"
    peer = tensor_quant_torch if per_tensor else token_quant_torch
    compiled = compile_per_shape(peer)
    for h in widths:
        ours = bundle.kernel(family, hidden=h)
        config = ours.config
        for t in tokens_list:
            gen = torch.Generator(device="cuda").manual_seed(t + h)
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, generator=gen)
            q = torch.empty(t, h, device="cuda", dtype=torch.float8_e4m3fn)
            s = torch.empty(1 if per_tensor else t, *(() if per_tensor else (1,)), device="cuda")
            # Per-token: the first rows against the float64 reference; per-tensor: the whole
            # tensor (its scale depends on every row), each plan variant.
            # The reference is plain torch; it runs in float64 on the GPU here (a CPU pass over
            # 32768 x 14336 elements would take minutes).
            rows_checked = t if per_tensor else min(CHECK_ROWS, t)
            want_q = torch.empty(rows_checked, h, dtype=torch.float8_e4m3fn, device="cuda")
            want_s = torch.empty(s.shape if per_tensor else (rows_checked, 1), device="cuda")
            get_family(family).reference(config, x[:rows_checked], want_q, want_s)
            want_q, want_s = want_q.cpu(), want_s.cpu()
            # per-tensor: the one-block variants forced too where one block is not absurd
            singles = (("single", "single_small", "single_wide")
                       if per_tensor and t * h <= 1 << 20 else ())
            for variant in (None, "decode", "prefill", *singles):
                q.view(torch.uint8).fill_(0x7F)
                s.fill_(float("nan"))
                ours(x, q, s, variant=variant)
                torch.cuda.synchronize()
                compare({"q": want_q, "scales": want_s},
                        {"q": q[:rows_checked], "scales": s if per_tensor else s[:rows_checked]},
                        f"{family} hidden={h} T={t} {variant}")
            impls = {
                "rose_aot": lambda: ours(x, q, s),
                "rose_aot_decode": lambda: ours(x, q, s, variant="decode"),
                "rose_aot_prefill": lambda: ours(x, q, s, variant="prefill"),
                "torch_eager": lambda: peer(x, q, s),
                "torch_compile": lambda: compiled(x, q, s),
            }
            for name in singles:
                impls[f"rose_aot_{name}"] = lambda name=name: ours(x, q, s, variant=name)
            # Bytes: x read once, q written, scales written (per-tensor: the prefill plan
            # reads x twice, but the goal counts the minimum traffic).
            nbytes = x.numel() * 2 + q.numel() + s.numel() * 4
            plan = "+".join(launch.variant for launch in ours.plan(x, q, s))
            rows.append(_measure(family, f"{h}", t, nbytes, impls, plan))


def mxfp8_torch(x, q, scales):
    """MXFP8 (scale rounded up to a power of two) with row-major E8M0 scales, in torch."""
    import torch

    t, h = x.shape
    g = x.float().view(t, h // 32, 32)
    amax = g.abs().amax(-1).clamp(min=2.0**-126)
    e = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
    q.copy_((g * torch.exp2(-e).unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(t, h))
    scales.view(torch.uint8).copy_((e + 127).to(torch.uint8))


def bench_block_scaled(bundle, tokens_list, widths, rows):
    import torch

    from act_quant_cases import compare, make_case

    compiled = compile_per_shape(mxfp8_torch)
    for fmt in ("mxfp8", "mxfp4", "nvfp4"):
        family = "nvfp4_quant" if fmt == "nvfp4" else "block_scaled_quant"
        for h in widths:
            values = dict(hidden=h, scale_layout="swizzled_128x4")
            if fmt != "nvfp4":
                values["format"] = fmt
            ours = bundle.kernel(family, **values)
            config = ours.config
            for t in tokens_list:
                args, want, views = make_case(family, config, min(t, CHECK_ROWS), seed=t + h)
                ours(*args)
                torch.cuda.synchronize()
                compare(family, config, want, views, f"{family} {values} T={t}")
                gen = torch.Generator(device="cuda").manual_seed(t + h)
                x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, generator=gen)
                block = 16 if fmt == "nvfp4" else 32
                groups = h // block
                qdt = torch.float8_e4m3fn if fmt == "mxfp8" else torch.float4_e2m1fn_x2
                sdt = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu
                q = torch.empty(t, h if fmt == "mxfp8" else h // 2, device="cuda", dtype=torch.uint8).view(qdt)
                s = torch.zeros(-(-t // 128) * 128, -(-groups // 4) * 4, device="cuda",
                                dtype=torch.uint8).view(sdt)
                call = [x, q, s]
                if fmt == "nvfp4":
                    call.insert(1, torch.tensor([448.0 * 6.0 / 4.0], device="cuda"))
                impls = {
                    "rose_aot": lambda: ours(*call),
                    "rose_aot_decode": lambda: ours(*call, variant="decode"),
                    "rose_aot_prefill": lambda: ours(*call, variant="prefill"),
                }
                if fmt == "mxfp8":
                    s_lin = torch.empty(t, groups, device="cuda", dtype=torch.uint8).view(sdt)
                    impls["torch_eager_rowmajor"] = lambda: mxfp8_torch(x, q, s_lin)
                    impls["torch_compile_rowmajor"] = lambda: compiled(x, q, s_lin)
                nbytes = x.numel() * 2 + q.numel() + t * groups
                plan = ours.plan(*call)[0].variant
                rows.append(_measure(family, f"{fmt}/{h}", t, nbytes, impls, plan))


# ----------------------------------------------------------------------------- output
def _families(text: str) -> str:
    """--family: `all`, or family names joined by commas (argparse's error otherwise)."""
    names = text.split(",")
    if text != "all" and (not all(names) or set(names) - set(FAMILIES)):
        raise argparse.ArgumentTypeError(
            f"{text!r}: use all, or some of {', '.join(FAMILIES)} joined by commas")
    return text


_label = file_label("act_quant")  # --label: the outputs are act_quant-LABEL.* in the output folder


def report(rows, copy_tbs, env, out, name):
    lines = [
        f"GPU {env['gpu']}, driver {env['driver']}, torch {env['torch']}, {env['date']}; "
        f"copy bandwidth {copy_tbs:.2f} TB/s (read + write). Times: µs per call, CUDA-graph "
        f"replay, median. Bytes: input read + outputs written (scales included). "
        f"rose-aot = the plan's choice (variant in brackets).",
        "",
        "| kernel | shape | tokens | rose-aot µs | TB/s | % copy | variants forced µs "
        "| peers µs (speed-up of rose-aot) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours = r["us"]["rose_aot"]
        tbs = r["bytes"] / (ours * 1e-6) / 1e12
        forced = ", ".join(f"{k[len('rose_aot_'):]} {v:.2f}" for k, v in r["us"].items()
                           if k.startswith("rose_aot_"))
        peers = ", ".join(
            f"{k} {v:.2f} ({v / ours:.2f}x)" for k, v in r["us"].items()
            if not k.startswith("rose_aot")
        )
        peers += "".join(f", {k} failed" for k in r["errors"])
        lines.append(
            f"| {r['family']} | {r['shape']} | {r['tokens']} | {ours:.2f} [{r['plan']}] | "
            f"{tbs:.2f} | {100 * tbs / copy_tbs:.0f}% | {forced} | {peers} |"
        )
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, f"act_quant-{name}.md"), "w") as f:
        f.write(text + "\n")


def main() -> None:
    import torch

    from rose_aot import open_bundle
    from rose_aot.errors import RoseAotError

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="a bundle with benchmarks/manifests/act_quant.toml's points")
    parser.add_argument("--family", type=_families, default="all",
                        help=f"one of {', '.join(FAMILIES)}, several joined by commas, or all")
    parser.add_argument("--tokens", type=int_list, default=TOKENS,
                        help=f"token counts, comma-separated (default {','.join(map(str, TOKENS))})")
    parser.add_argument("--widths", type=int_list, default=WIDTHS,
                        help="hidden sizes / d, comma-separated; each must be in the bundle "
                             f"(default {','.join(map(str, WIDTHS))})")
    parser.add_argument("--no-peers", action="store_true",
                        help="time rose-aot only (its plan and each variant forced)")
    parser.add_argument("--label", type=_label,
                        help="name of the output files (default: the --family value)")
    args = parser.parse_args()
    tokens, widths = args.tokens, args.widths
    families = FAMILIES if args.family == "all" else args.family.split(",")
    name = args.label or args.family
    try:
        bundle = open_bundle(args.bundle)
    except RoseAotError as exc:
        parser.error(str(exc))
    missing = missing_widths(bundle.index, families, widths)
    if missing:
        parser.error("; ".join(missing))
    if not torch.cuda.is_available():
        sys.exit("bench_act_quant.py needs a CUDA GPU")
    global PEERS
    PEERS = not args.no_peers

    torch.manual_seed(0)
    out = out_dir(os.path.join(HERE, "results"))
    env = environment()
    copy_tbs = copy_bandwidth_tbs()
    print(f"{env} copy {copy_tbs:.3f} TB/s", flush=True)
    bundle.preload()
    rows = []
    if "act_and_mul" in families:
        bench_act_and_mul(bundle, tokens, widths, rows)
    if "fp8_group_quant" in families:
        bench_quant(bundle, tokens, widths, rows, fused=False)
    if "act_and_mul_fp8_quant" in families:
        bench_quant(bundle, tokens, widths, rows, fused=True)
    if "block_scaled_quant" in families:
        bench_block_scaled(bundle, tokens, widths, rows)
    if "fp8_token_quant" in families:
        bench_token_tensor(bundle, tokens, widths, rows, per_tensor=False)
    if "fp8_tensor_quant" in families:
        bench_token_tensor(bundle, tokens, widths, rows, per_tensor=True)
    with open(os.path.join(out, f"act_quant-{name}.json"), "w") as f:
        json.dump({"environment": env, "copy_tbs": copy_tbs, "rows": rows}, f, indent=1)
    report(rows, copy_tbs, env, out, name)
    plot_families(rows, out)


if __name__ == "__main__":
    main()
