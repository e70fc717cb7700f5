"""Symmetric workspaces: one peer-visible allocation per (process group, size class).

Layout of every rank's allocation (torch symmetric memory, identical on every rank):

    [ flag region: FLAG_BYTES, int32 flags [phase][source rank][block] | data region: two halves ]

The kernels get this rank's data region as a tensor (``buffer``), every rank's data and flag
addresses in one int64 [2, world_size] device tensor (``ptrs``), local int32 call counters
(``state``, one per block) and the rank. Everything is allocated and exchanged once, at construction
(host syncs and collectives happen there, never in a call), so calls can be captured in CUDA
graphs and replayed: the flags carry the call epoch and never need a reset.
"""

from __future__ import annotations

import os
import threading
import warnings

from ..errors import RoseAotError
from ..kernels.all_reduce.family import ACCESS_BYTES, FLAG_BYTES, MAX_BLOCKS, MAX_RANKS

__all__ = [
    "NO_MULTICAST_ENV",
    "DistributedError",
    "check_no_multicast_env",
    "SymmetricWorkspace",
    "size_class",
    "workspace_for",
]

# Set in every process before torch.distributed / NCCL initialise (the launchers do it).
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

MIN_SIZE_CLASS = 1 << 20


class DistributedError(RoseAotError):
    """Multi-GPU setup is wrong: environment, process group, peers or sizes."""


def check_no_multicast_env() -> None:
    """Refuse to run unless NVLink multicast is switched off for NCCL and torch symmetric
    memory: multicast objects can take a shared host's GPUs out of service."""
    wrong = {k: os.environ.get(k) for k, v in NO_MULTICAST_ENV.items() if os.environ.get(k) != v}
    if wrong:
        want = " ".join(f"{k}={v}" for k, v in NO_MULTICAST_ENV.items())
        raise DistributedError(
            f"NVLink multicast must be off: set {want} in the environment of every process "
            f"before torch.distributed initialises (found {wrong})"
        )


def size_class(nbytes: int) -> int:
    """The power of two >= nbytes (at least 1 MiB) a workspace is allocated for."""
    if nbytes < 0:
        raise DistributedError(f"a message size must be >= 0 bytes (got {nbytes})")
    size = MIN_SIZE_CLASS
    while size < nbytes:
        size *= 2
    return size


class SymmetricWorkspace:
    """Peer-visible buffers of one process group for messages of up to ``max_bytes`` (per half
    of the data region). Construction is collective: every rank of the group must construct
    it, in the same order relative to other collectives."""

    def __init__(self, group=None, max_bytes: int = MIN_SIZE_CLASS, device: int | None = None):
        import torch
        import torch.distributed as dist

        check_no_multicast_env()
        if not dist.is_available() or not dist.is_initialized():
            raise DistributedError(
                "torch.distributed is not initialised: launch with torchrun and call "
                "dist.init_process_group('nccl') first"
            )
        group = group if group is not None else dist.group.WORLD
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if not 2 <= self.world_size <= MAX_RANKS:
            raise DistributedError(
                f"the all_reduce kernels serve 2..{MAX_RANKS} ranks of one node; this group has "
                f"{self.world_size}"
            )
        if max_bytes <= 0:
            raise DistributedError(f"max_bytes must be > 0 (got {max_bytes})")
        self.device = torch.cuda.current_device() if device is None else device
        self.max_bytes = -(-max_bytes // ACCESS_BYTES) * ACCESS_BYTES
        self.data_bytes = 2 * self.max_bytes
        total = FLAG_BYTES + self.data_bytes

        props = torch.cuda.get_device_properties(self.device)
        mine = (props.multi_processor_count, tuple(torch.cuda.get_device_capability(self.device)))
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=group)
        if any(e != mine for e in everyone):
            raise DistributedError(
                f"every rank needs the same GPU (SM count, capability): the grid of a call "
                f"depends on the SM count and block b of every rank must handle the same "
                f"elements; got {everyone}"
            )

        import torch.distributed._symmetric_memory as symm_mem

        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed before torch 2.9-ish; a deprecated no-op later
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                enable(group.group_name)
        with torch.cuda.device(self.device):
            self.tensor = symm_mem.empty(total, dtype=torch.uint8, device=f"cuda:{self.device}")
            # Flags start below every epoch (epochs start at 1); zeroed before any peer can
            # write into them: peers write only in calls, after the barrier below.
            self.tensor.zero_()
            self.handle = symm_mem.rendezvous(self.tensor, group.group_name)
            multicast = getattr(self.handle, "multicast_ptr", 0)
            if multicast:
                raise DistributedError(
                    "torch symmetric memory created a multicast object despite "
                    "TORCH_SYMM_MEM_DISABLE_MULTICAST=1; refusing to continue"
                )
            bases = [int(p) for p in self.handle.buffer_ptrs]
            if len(bases) != self.world_size or self.handle.world_size != self.world_size:
                raise DistributedError(
                    f"the symmetric-memory handle has {len(bases)} buffers for a group of "
                    f"{self.world_size}"
                )
            # The tensor may sit at an offset inside a larger symmetric allocation (torch's
            # implicit pool); the offset is the same on every rank, which is checked.
            offset = self.tensor.data_ptr() - bases[self.rank]
            size = getattr(self.handle, "buffer_size", None)
            if offset < 0 or (size is not None and offset + total > size):
                raise DistributedError(
                    f"the workspace tensor (0x{self.tensor.data_ptr():x}, {total} bytes) is not "
                    f"inside this rank's symmetric buffer (0x{bases[self.rank]:x}, {size} bytes)"
                )
            offsets = [None] * self.world_size
            dist.all_gather_object(offsets, offset, group=group)
            if any(o != offset for o in offsets):
                raise DistributedError(f"symmetric tensor offsets differ across ranks: {offsets}")
            flags = [b + offset for b in bases]
            data = [f + FLAG_BYTES for f in flags]
            self.peer_data = tuple(data)
            self.peer_flags = tuple(flags)
            self.ptrs = torch.tensor([data, flags], dtype=torch.int64, device=f"cuda:{self.device}")
            self.state = torch.zeros(MAX_BLOCKS, dtype=torch.int32, device=f"cuda:{self.device}")
            self._data = self.tensor[FLAG_BYTES:]
            self._views: dict = {}
            torch.cuda.synchronize(self.device)
        dist.barrier(group=group)

    def buffer(self, dtype):
        """This rank's data region as a 1-D tensor of `dtype` (both halves). Views are made
        once per dtype: take them before capturing a CUDA graph (``warm``)."""
        view = self._views.get(dtype)
        if view is None:
            view = self._data.view(dtype)
            self._views[dtype] = view
        return view

    def args(self, dtype) -> tuple:
        """(buffer, ptrs, state, rank): the trailing arguments of every all_reduce kernel."""
        return (self.buffer(dtype), self.ptrs, self.state, self.rank)

    def epoch(self) -> int:
        """Calls made on this workspace so far (reads the device counter: a host sync)."""
        return int(self.state[0].item())

    def __repr__(self) -> str:
        return (f"SymmetricWorkspace(rank={self.rank}/{self.world_size}, "
                f"max_bytes={self.max_bytes}, device=cuda:{self.device})")


_workspaces: dict[tuple, SymmetricWorkspace] = {}
_lock = threading.Lock()


def workspace_for(group, nbytes: int, device: int | None = None) -> SymmetricWorkspace:
    """The workspace of (group, size class of `nbytes`, device), created on first use
    (collective: every rank must ask for the same sizes in the same order)."""
    import torch
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    device = torch.cuda.current_device() if device is None else device
    key = (group.group_name, size_class(nbytes), device)
    with _lock:
        ws = _workspaces.get(key)
        if ws is None:
            ws = SymmetricWorkspace(group, key[1], device)
            _workspaces[key] = ws
        return ws
