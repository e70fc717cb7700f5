"""Inputs and checks of moe_dispatch_fp8_quant for the GPU suite and the sanitizer script.

A case: tokens with group magnitudes spread over many binades (and some all-zero groups), a
routing kind, outputs poisoned (e4m3 code 0x7F = NaN, fp32 NaN, int32 -7) so an unwritten element
fails and a stray write past the used rows is caught; the scale buffer of the column-major
layout is allocated padded, as a GEMM would, and passed as its transposed view.
"""

from __future__ import annotations

FAMILY = "moe_dispatch_fp8_quant"
ROUTINGS = ("random", "skewed", "sparse", "out_of_range")


def routing_ids(kind, tokens, c, gen):
    import torch

    if kind == "skewed":  # every token to the same k experts of this rank
        return (torch.arange(c.top_k, dtype=torch.int32) + c.expert_start).repeat(tokens, 1)
    if kind == "sparse":  # two experts in use
        return torch.randint(0, 2, (tokens, c.top_k), generator=gen, dtype=torch.int32) + c.expert_start
    ids = torch.argsort(torch.rand(tokens, c.num_experts, generator=gen), dim=1)[:, : c.top_k]
    ids = ids.to(torch.int32)
    if kind == "out_of_range":
        ids[::3, 0] = -1
        ids[1::5, -1] = c.num_experts + 5
    return ids


def make_case(c, tokens, routing, seed, strided_x=False):
    """(host args in call order, expected outputs (reference), the scale buffer's shape or
    None). For col_major_tma the host `out_scales` is a view of a padded buffer."""
    import torch

    from rose_aot.kernels import get_family

    family = get_family(FAMILY)
    gen = torch.Generator().manual_seed(seed)
    h, groups = c.hidden, c.hidden // c.group
    magnitude = torch.logspace(-6, 4, groups, base=2.0)[torch.randperm(groups, generator=gen)]
    x = torch.randn(tokens, h, generator=gen) * magnitude.repeat_interleave(c.group)
    x[::4, : c.group] = 0  # all-zero groups: the eps floor
    dtype = getattr(torch, c.dtype)
    if strided_x:  # rows of a wider buffer (x_row_stride > hidden)
        wide = torch.zeros(tokens, h + 64, dtype=dtype)
        wide[:, :h] = x.to(dtype)
        x = wide[:, :h]
    else:
        x = x.to(dtype)
    ids = routing_ids(routing, tokens, c, gen)
    rows = family.max_rows(c, tokens) + 5
    out = torch.full((rows, h), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
    if c.scale_layout == "row_major":
        scales = torch.full((rows, groups), float("nan"))
    else:
        padded = -(-rows // 4) * 4 + 4  # one spare column: never written
        scales = torch.full((groups, padded), float("nan")).t()[:rows]
    offsets = torch.full((family.local(c) + 1,), -7, dtype=torch.int32)
    positions = torch.full((tokens, c.top_k), -7, dtype=torch.int32)
    host = [x, ids, out, scales, offsets, positions]
    expect = [t.clone() for t in host]
    family.reference(c, *expect)
    return host, expect


def to_device(host):
    """Device copies with the same strides (the scale view stays a view of a padded buffer)."""
    import torch

    dev = []
    for t in host:
        if t.is_contiguous():
            dev.append(t.cuda())
        else:
            base = t._base if t._base is not None else t
            dev_base = base.cuda()
            dev.append(torch.as_strided(dev_base, t.shape, t.stride(), t.storage_offset()))
    return dev


def _bits(t):
    import torch

    return t.contiguous().view({1: torch.uint8, 4: torch.int32}[t.element_size()])


def check(c, host, got, expect, where, exact_rows=False):
    """Compare a launch's outputs with the reference through positions (rows inside an
    expert may come in any order); `exact_rows`: also in the reference's order (the small
    variant). Raises AssertionError naming the first bad element."""
    import torch

    ids = host[1]
    out, scales, offsets, positions = (t.cpu() for t in got[2:])
    e_out, e_scales, e_offsets, e_positions = expect[2:]
    assert torch.equal(offsets, e_offsets), f"{where}: expert_offsets {offsets.tolist()} vs {e_offsets.tolist()}"
    assert torch.equal(positions < 0, e_positions < 0), f"{where}: skipped pairs differ"
    valid = positions >= 0
    rows_used = positions[valid].long()
    assert rows_used.unique().numel() == rows_used.numel(), f"{where}: two copies share a row"
    local = ids.long() - c.expert_start
    lo, hi = offsets.long()[local[valid]], offsets.long()[local[valid] + 1]
    assert ((rows_used >= lo) & (rows_used < hi)).all(), f"{where}: a row outside its expert"
    ref_rows = e_positions[valid].long()
    for name, a, b in (("out", out, e_out), ("out_scales", scales, e_scales)):
        bad = (_bits(a[rows_used]) != _bits(b[ref_rows])).nonzero()
        if bad.numel():
            i, col = (int(v) for v in bad[0])
            raise AssertionError(
                f"{where}: {name} of copy {i} (row {int(rows_used[i])}) differs at column {col}: "
                f"got {a[rows_used[i], col].float().item()!r}, want {b[ref_rows[i], col].float().item()!r} "
                f"({bad.shape[0]} elements differ)"
            )
    total = int(offsets[-1])
    used = torch.zeros(out.shape[0], dtype=torch.bool)
    used[rows_used] = True
    pad = (~used[:total]).nonzero().view(-1)
    if pad.numel():  # quantized zero rows: codes 0, the all-zero group's scale
        codes = _bits(out[pad])
        if (codes != 0).any():
            r, col = (int(v) for v in (codes != 0).nonzero()[0])
            raise AssertionError(
                f"{where}: padding codes not zero: row {int(pad[r])} column {col} is "
                f"{int(codes[r, col]) & 0xFF:#04x}; codes seen {sorted(set(codes.view(-1).tolist()))[:8]}"
            )
        from rose_aot.kernels.fp8_group_quant.reference import quantize_groups

        _, zero = quantize_groups(torch.zeros(1, c.hidden, dtype=torch.float64), c.group, c.eps,
                                  c.ue8m0)
        assert (_bits(scales[pad]) == _bits(zero)).all(), f"{where}: padding scales"
    assert (_bits(out[total:]) == 0x7F).all(), f"{where}: wrote codes past the used rows"
    assert scales[total:].isnan().all(), f"{where}: wrote scales past the used rows"
    if c.scale_layout == "col_major_tma":  # the buffer's columns past the rows untouched
        buf = got[3]._base
        assert buf.cpu()[:, scales.shape[0]:].isnan().all(), f"{where}: wrote into the scale padding"
    if exact_rows:
        for name, a, b in (("out", out, e_out), ("out_scales", scales, e_scales),
                           ("positions", positions, e_positions)):
            assert torch.equal(_bits(a), _bits(b)), f"{where}: {name} not in the reference's order"
