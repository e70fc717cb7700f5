"""fp8_token_quant: dynamic per-token FP8 (e4m3) quantization.

x [tokens, hidden] (bf16/fp16, rows may be strided) -> q [tokens, hidden] float8_e4m3fn and
scales [tokens, 1] fp32, one per token:

    absmax = max |x| over the row (NaN elements ignored)
    scale  = fp32(max(absmax, fp32(eps)) / 448)
    q      = e4m3(fp32(x / scale))   nearest even, saturated to +-448

i.e. fp8_group_quant's definition (and non-finite policy) with one group per row. It is its
own family rather than ``group = hidden`` of fp8_group_quant because a row's absmax is a
reduction over whole warps and blocks, not over the lanes of one warp: one row is one block
chunk (the row split of chunked_rows.py with a single block column), reduced by a butterfly
max per warp and the warp maxima of the row in shared memory.

Variants (not measured; tuning of act_and_mul applies to the switch): decode = up to 1024
threads, the fewest vectors per thread, one row per block; prefill = around 4 vectors per
thread, several rows per block for narrow rows. Both hold the row in registers between the
reduction and the quantization (one read of x).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...archs import Arch
from ...errors import ConfigError
from ..act_and_mul.tuning import DECODE_WARPS_PER_SM
from ..base import KernelFamily, choice
from ..chunked_rows import ChunkSplit, chunked_plan, decode_variants
from ..fp8_group_quant.family import FP8_MAX, MIN_EPS
from ..rowwise import access_bytes, vector_width
from ..spec import DTYPES, Dim, Launch, TensorArg, Variant

__all__ = ["Fp8TokenQuantConfig", "Fp8TokenQuant", "row_split", "FP8_MAX"]

MAX_HIDDEN = 32768
DECODE_MAX_THREADS = 1024
DECODE_MAX_VECS = 4
PREFILL_MAX_THREADS = 512
PREFILL_MAX_VECS = 8
PREFILL_PREFERRED_VECS = 4
PREFILL_ROW_THREADS = 256  # narrow rows: pack rows until a block has this many threads


@dataclass(frozen=True)
class Fp8TokenQuantConfig:
    hidden: int
    dtype: str = choice("bfloat16", "float16", default="bfloat16", doc="input dtype")
    eps: float = 1e-10  # lower bound of the absmax (all-zero tokens)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def row_split(vectors: int, max_threads: int, max_vecs: int, prefer: int | None,
              block_threads: int) -> ChunkSplit:
    """A whole row of `vectors` accesses in one block chunk: row_threads (a multiple of 32) x
    vecs_per_thread >= vectors, exact (no predicated vector) where some per-thread count allows.
    Candidates in order: from the fewest vectors per thread up (prefer None), or nearest to
    `prefer`. Narrow rows are packed `block_threads // row_threads` to a block."""
    least = -(-vectors // max_threads)
    if vectors <= 0 or least > max_vecs:
        raise ValueError(f"a row of {vectors} vectors does not fit {max_threads} x {max_vecs}")
    counts = list(range(least, max_vecs + 1))
    if prefer is not None:
        counts.sort(key=lambda p: (abs(p - prefer), -p))
    chosen = None
    for per_thread in counts:
        row_threads, rest = divmod(vectors, per_thread)
        if not rest and row_threads % 32 == 0:
            chosen = (row_threads, per_thread)
            break
    if chosen is None:
        per_thread = counts[0]
        chosen = (32 * _ceil_div(_ceil_div(vectors, per_thread), 32), per_thread)
    row_threads, per_thread = chosen
    rows = max(1, block_threads // row_threads)
    return ChunkSplit(row_threads, per_thread, 1, rows, row_threads * per_thread == vectors)


def row_vec(c, arch: Arch) -> int:
    """Elements per access of the x rows (the arch's widest the row allows)."""
    return vector_width(c.dtype, access_bytes(arch, c.hidden * DTYPES[c.dtype].bits // 8))


def validate_rows(family: str, c, max_hidden: int) -> None:
    """hidden and eps of a whole-row fp8 quantizer (per-token and per-tensor alike)."""
    vec = vector_width(c.dtype, 16)
    if not 0 < c.hidden <= max_hidden or c.hidden % vec:
        raise ConfigError(family, "hidden",
                          f"{c.hidden} is not supported; use a multiple of {vec} up to "
                          f"{max_hidden}")
    if not MIN_EPS <= c.eps <= 1.0:
        raise ConfigError(family, "eps", f"must be in [{MIN_EPS}, 1] (got {c.eps})")


def row_args(c, arch: Arch) -> tuple[TensorArg, TensorArg]:
    """x [tokens, hidden] (strided rows) and q [tokens, hidden] e4m3."""
    tokens = Dim("tokens")
    vec = row_vec(c, arch)
    return (
        TensorArg("x", c.dtype, (tokens, c.hidden),
                  (Dim("x_row_stride", width=64, divisibility=vec), 1),
                  vec * DTYPES[c.dtype].bits // 8, role="input"),
        TensorArg("q", "float8_e4m3fn", (tokens, c.hidden),
                  (Dim("q_row_stride", width=64, divisibility=vec), 1), vec, role="output"),
    )


class Fp8TokenQuant(KernelFamily):
    name = "fp8_token_quant"
    Config = Fp8TokenQuantConfig
    plan_choices = ("decode", "mid", "prefill")
    device_module = "rose_aot.kernels.fp8_token_quant.device"
    shape_fields = ("hidden",)

    def _vec(self, c: Fp8TokenQuantConfig, arch: Arch) -> int:
        return row_vec(c, arch)

    def validate(self, c: Fp8TokenQuantConfig) -> None:
        validate_rows(self.name, c, MAX_HIDDEN)

    def args(self, c: Fp8TokenQuantConfig, arch: Arch) -> tuple[TensorArg, ...]:
        """x [tokens, hidden], q [tokens, hidden] e4m3, scales [tokens, 1] fp32."""
        return (
            *row_args(c, arch),
            TensorArg("scales", "float32", (Dim("tokens"), 1), (1, 1), 4, role="output",
                      layout="row_major"),
        )

    def variants(self, c: Fp8TokenQuantConfig, arch: Arch) -> tuple[Variant, ...]:
        vec = self._vec(c, arch)
        vectors = c.hidden // vec
        params = tuple(a.name for a in self.args(c, arch))
        out = []
        for name, split in (
            ("decode", row_split(vectors, DECODE_MAX_THREADS, DECODE_MAX_VECS, None, 0)),
            ("prefill", row_split(vectors, PREFILL_MAX_THREADS, PREFILL_MAX_VECS,
                                  PREFILL_PREFERRED_VECS, PREFILL_ROW_THREADS)),
        ):
            warps = split.threads // 32
            out.append(Variant(name, (split.threads, 1, 1), smem=4 * warps, params=params,
                               constants={**split.constants(), "vec": vec}))
        decode, mid = decode_variants(out[0], bulk=False)
        return (decode, out[1], mid)

    def plan(self, c, variants, sizes, sm_count, force=None) -> tuple[Launch, ...]:
        self.check_force(force)
        chosen = chunked_plan(variants, sizes["tokens"], sm_count, DECODE_WARPS_PER_SM, force)
        return () if chosen is None else (chosen,)
