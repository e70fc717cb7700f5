"""Work split of the element-wise row families (act_and_mul, fp8_group_quant): plain Python.

A row of ``vectors`` full-width accesses is cut into ``col_blocks`` equal chunks, one per block
column of the grid (grid y); inside a chunk, thread ``t`` of the row handles the vectors
``chunk_start + t + i * row_threads`` for ``i < vecs_per_thread`` (so the lanes of a warp touch
consecutive vectors, and the lanes of one quantization group are consecutive lanes of one warp).
When one chunk covers the whole row, a block holds ``rows_per_block`` rows (grid x = row blocks).

Element-wise rows need no reduction over the row, so the row may be spread over as many blocks
as the latency of one token wants (decode) or packed into few wide blocks (prefill).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChunkSplit", "chunk_split", "chunked_plan", "access_bytes", "vector_elems"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def access_bytes(arch) -> int:
    """Bytes of one vector access on `arch` (an Arch fact once main's Arch carries it)."""
    value = getattr(arch, "access_bytes", None)
    if value is not None:
        return int(value)
    return 32 if arch.capability[0] >= 10 else 16


def vector_elems(bits: int, arch, row_elems: int) -> int:
    """Elements per vector access of a `bits`-wide dtype on `arch`, narrowed to 16 bytes when a
    row of `row_elems` elements is not a multiple of the wide vector."""
    width = access_bytes(arch)
    while width > 16 and row_elems % (width * 8 // bits):
        width //= 2
    return width * 8 // bits


@dataclass(frozen=True)
class ChunkSplit:
    row_threads: int  # threads of one row chunk (a multiple of 32)
    vecs_per_thread: int
    col_blocks: int  # blocks along the row (grid y)
    rows_per_block: int  # rows of one block (only > 1 when col_blocks == 1)
    exact: bool  # every (thread, i) vector lies inside the row: no predicates

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
        }


def chunk_split(vectors: int, max_threads: int, max_vecs: int) -> ChunkSplit:
    """Split a row of `vectors` accesses over blocks of at most `max_threads` threads, each
    thread holding at most `max_vecs` vectors.

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
                return ChunkSplit(row_threads, per_thread, col_blocks, rows, True)
    col_blocks = fewest
    per_block = _ceil_div(vectors, col_blocks)
    row_threads = min(max_threads, 32 * _ceil_div(_ceil_div(per_block, max_vecs), 32))
    per_thread = _ceil_div(per_block, row_threads)
    col_blocks = _ceil_div(vectors, row_threads * per_thread)
    rows = max(1, max_threads // row_threads) if col_blocks == 1 else 1
    exact = col_blocks * row_threads * per_thread == vectors
    return ChunkSplit(row_threads, per_thread, col_blocks, rows, exact)
