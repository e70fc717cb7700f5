"""Shared plain-Python helpers of the row-wise families (rms_norm, moe_combine, activations):
the per-arch vector width, how a row is split over warps, and the one-launch row plan."""

from __future__ import annotations

from ..archs import Arch
from .spec import DTYPES, Launch

__all__ = ["access_bytes", "vector_width", "row_split", "row_plan", "row_align"]


def access_bytes(arch: Arch, *row_bytes: int) -> int:
    """Bytes per global access: the arch's widest where every row given divides it, else 16."""
    widest = arch.max_access_bytes
    return widest if all(r % widest == 0 for r in row_bytes) else 16


def vector_width(dtype: str, nbytes: int) -> int:
    """Elements of `dtype` per access of `nbytes`."""
    return DTYPES[dtype].elements_per_access(nbytes)


def row_split(vectors: int, max_vecs: int) -> tuple[int, int]:
    """(warps per row, vectors per thread) for a row of `vectors` accesses.

    Prefers the fewest warps whose threads cover the row exactly with at most `max_vecs`
    vectors each, so no thread needs a bounds check; otherwise the last vectors of a row are
    predicated.
    """
    for warps in range(1, 33):
        per_thread = vectors // (32 * warps)
        if vectors % (32 * warps) == 0 and per_thread <= max_vecs:
            return warps, per_thread
    warps = min(32, -(-vectors // (32 * max_vecs)))
    return warps, -(-vectors // (32 * warps))


def row_plan(variants, tokens: int, name: str) -> tuple[Launch, ...]:
    """The one launch of a row-wise family, of the variant `name` (the forced one, else the
    family's rule's choice): a grid of blocks of its `rows_per_block` rows covering every
    token."""
    if tokens == 0:
        return ()
    rows = variants[name].constants["rows_per_block"]
    return (Launch(name, (-(-tokens // rows), 1, 1)),)


def row_align(dtype: str, vec: int, nbytes: int) -> int:
    """Pointer alignment a row tensor of `dtype` needs when accessed `vec` elements at a time
    with accesses of up to `nbytes`."""
    return min(nbytes, vec * DTYPES[dtype].bits // 8)
