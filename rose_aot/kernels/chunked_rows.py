"""Work split of the element-wise row families (act_and_mul, fp8_group_quant): plain Python.

A row of ``vectors`` full-width accesses is cut into ``col_blocks`` equal chunks, one per block
column; inside a chunk, thread ``t`` of the row handles the vectors
``chunk_start + t + i * row_threads`` for ``i < vecs_per_thread`` (so the lanes of a warp touch
consecutive vectors, and the lanes of one quantization group are consecutive lanes of one warp).
When one chunk covers the whole row, a block holds ``rows_per_block`` rows (grid x = row blocks).
Otherwise the grid is (row blocks, chunks), or with ``chunks_in_x`` (chunks, rows) so that the
blocks, which start in linear order, sweep memory in address order (chunk_grid).

Element-wise rows need no reduction over the row, so the row may be spread over as many blocks
as the latency of one token wants (decode) or packed into few wide blocks (prefill).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .act_and_mul.tuning import DECODE_LATE_PDL_MAX_THREADS, DECODE_PDL_MAX_THREADS
from .spec import Launch, Variant

__all__ = ["MAX_GRID_Y", "ChunkSplit", "bulk_variant", "chunk_grid", "chunk_split", "chunked_plan",
           "decode_variants"]

MAX_GRID_Y = 65535  # CUDA's limit on grid y and grid z


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ChunkSplit:
    row_threads: int  # threads of one row chunk (a multiple of 32)
    vecs_per_thread: int
    col_blocks: int  # blocks along the row (where they sit in the grid: chunk_grid)
    rows_per_block: int  # rows of one block (only > 1 when col_blocks == 1)
    exact: bool  # every (thread, i) vector lies inside the row: no predicates
    chunks_in_x: bool = False  # the grid's order (chunk_grid)

    @property
    def threads(self) -> int:
        return self.row_threads * self.rows_per_block

    @property
    def chunk_vectors(self) -> int:
        return self.row_threads * self.vecs_per_thread

    def constants(self) -> dict:
        return {
            "row_threads": self.row_threads,
            "vecs_per_thread": self.vecs_per_thread,
            "col_blocks": self.col_blocks,
            "rows_per_block": self.rows_per_block,
            "exact": self.exact,
            "chunks_in_x": self.chunks_in_x,
        }


def chunk_split(vectors: int, max_threads: int, max_vecs: int,
                chunks_in_x: bool = False) -> ChunkSplit:
    """Split a row of `vectors` accesses over blocks of at most `max_threads` threads, each
    thread holding at most `max_vecs` vectors; `chunks_in_x` picks the grid order (chunk_grid).

    Prefers an exact split (no predicated vectors): the fewest block columns, then the most
    vectors per thread; otherwise chunks as equal as possible with the tail predicated."""
    if vectors <= 0 or max_threads % 32 or max_vecs <= 0:
        raise ValueError(f"bad split request: vectors={vectors} threads={max_threads} vecs={max_vecs}")
    fewest = _ceil_div(vectors, max_threads * max_vecs)
    for col_blocks in range(fewest, 2 * fewest + 1):
        if vectors % col_blocks:
            continue
        per_block = vectors // col_blocks
        for per_thread in range(max_vecs, 0, -1):
            row_threads, rest = divmod(per_block, per_thread)
            if not rest and row_threads % 32 == 0 and row_threads <= max_threads:
                rows = max(1, max_threads // row_threads) if col_blocks == 1 else 1
                return ChunkSplit(row_threads, per_thread, col_blocks, rows, True, chunks_in_x)
    col_blocks = fewest
    per_block = _ceil_div(vectors, col_blocks)
    row_threads = min(max_threads, 32 * _ceil_div(_ceil_div(per_block, max_vecs), 32))
    per_thread = _ceil_div(per_block, row_threads)
    col_blocks = _ceil_div(vectors, row_threads * per_thread)
    rows = max(1, max_threads // row_threads) if col_blocks == 1 else 1
    exact = col_blocks * row_threads * per_thread == vectors
    return ChunkSplit(row_threads, per_thread, col_blocks, rows, exact, chunks_in_x)


def chunk_grid(row_blocks: int, col_blocks: int, chunks_in_x: bool) -> tuple[int, int, int]:
    """The grid of a chunked-row launch, read back by device_utils.chunk_coords: (row blocks,
    col_blocks, 1), or with `chunks_in_x` and more than one chunk (chunk, row % MAX_GRID_Y,
    row // MAX_GRID_Y).

    Blocks start in linear order (x fastest). With the chunks in x, consecutive blocks take
    consecutive chunks of one row, then of the next: the launch streams through memory in
    address order, as a flat element-wise kernel does; act_and_mul measured 2.4-4.5% faster so
    from 8192 tokens on the H200. With the rows in x, consecutive blocks take the same chunk of
    consecutive rows, a row stride apart (and write neighbouring column-major scales, for
    fp8_group_quant's col_major_tma): the quantizers measured level to 3.5% slower with the
    chunks in x, so they keep this order (act_and_mul/tuning.py)."""
    if not chunks_in_x or col_blocks == 1:
        return (row_blocks, col_blocks, 1)
    y = min(row_blocks, MAX_GRID_Y)
    return (col_blocks, y, _ceil_div(row_blocks, y))


def decode_variants(shape: Variant, *, bulk: bool) -> tuple[Variant, ...]:
    """The variants of a chunked-row family's decode shape (one compile unit each), by launch
    size (chunked_plan; measured: act_and_mul/tuning.py):
    - `decode`, to DECODE_PDL_MAX_THREADS threads: programmatic dependent launch, the next
      kernel launched at the top of this one (device_utils.pdl_prologue);
    - `mid`, to DECODE_LATE_PDL_MAX_THREADS: PDL too, but the next kernel launched after this
      one's stores (device_utils.pdl_epilogue): launched at the top, its blocks would take the
      SMs this larger grid still needs;
    - beyond, `bulk` where the family has it (bulk_variant), else `decode` (the loader launches
      it without the attribute)."""
    decode = dataclasses.replace(shape, name="decode", pdl=DECODE_PDL_MAX_THREADS)
    mid = dataclasses.replace(shape, name="mid", pdl=DECODE_LATE_PDL_MAX_THREADS,
                              constants={**shape.constants, "pdl_late": 1})
    return (decode, mid, bulk_variant(shape)) if bulk else (decode, mid)


def bulk_variant(decode: Variant) -> Variant:
    """The decode shape without the programmatic-dependent-launch instructions, for
    decode-shaped launches too large for the PDL attribute: there the griddepcontrol
    instructions do nothing but still cost every block (measured: act_and_mul/tuning.py)."""
    return dataclasses.replace(decode, name="bulk", pdl=0)


def chunked_plan(variants, tokens: int, sm_count: int, decode_warps_per_sm: int | None,
                 force: str | None = None) -> Launch | None:
    """The one launch of a chunked-row family (None for no tokens).

    Decode while the batch, at one vector per thread, is at most `decode_warps_per_sm` warps
    per SM (None: at every size); the row's vector count is read from the decode variant's
    constants. A decode-shaped launch of more threads than the decode variant's PDL limit takes
    the `mid` variant while it has at most mid's, then `bulk` where the family has it
    (decode_variants); forcing a variant keeps it."""
    if tokens == 0:
        return None
    k = variants["decode"].constants
    vectors = k["row_threads"] * k["vecs_per_thread"] * k["col_blocks"]
    use_decode = (decode_warps_per_sm is None
                  or tokens * vectors <= 32 * decode_warps_per_sm * sm_count)
    if force is not None:
        use_decode = force in ("decode", "mid", "bulk")
    name = "decode" if use_decode else "prefill"
    v = variants[name]
    k = v.constants
    grid = chunk_grid(_ceil_div(tokens, k["rows_per_block"]), k["col_blocks"], k["chunks_in_x"])
    if use_decode and force is None:
        threads = grid[0] * grid[1] * grid[2] * v.threads
        if threads > v.pdl:
            if "mid" in variants and threads <= variants["mid"].pdl:
                name = "mid"
            elif "bulk" in variants:
                name = "bulk"
    elif use_decode:
        name = force
    return Launch(name, grid)
