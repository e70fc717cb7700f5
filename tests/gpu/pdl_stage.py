"""How a launch uses programmatic dependent launch, read off the plan and the record: shared by
the GPU suites' chain tests (a kernel that reads its predecessor's output at every PDL stage)."""

from __future__ import annotations


def pdl_stage(handle, args, device):
    """How the launch a call with `args` makes uses PDL: "early" (the next kernel launched at
    its top), "late" (after its stores: the variant's `pdl_late`) or None (no attribute)."""
    (launch,) = handle.plan(*args)
    v = handle.record(device).variant(launch.variant)
    threads = launch.grid[0] * launch.grid[1] * launch.grid[2] * v.threads
    if not 0 < threads <= v.pdl:
        return None
    return "late" if v.constants.get("pdl_late") else "early"
