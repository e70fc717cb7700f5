"""Expert-parallel (data-parallel) MoE over NVLink: the peer-visible workspace and the calls
that launch a bundle's moe_ep_dispatch / moe_ep_combine points on it.

    bundle = open_bundle("serving.rosebundle")
    moe = ExpertParallelMoe(bundle, num_experts=256, top_k=8, hidden=7168, max_tokens=128)
    buf = moe.outputs()                                # once: out, expert_offsets, send_slots
    moe.dispatch(x, topk_ids, buf)                     # x: this rank's tokens
    y = grouped_gemm(buf.out, buf.expert_offsets)      # this rank's experts (yours)
    moe.combine(y, buf, topk_weights, result)          # result[t]: sum_k w[t,k] * expert_k(x[t])

Rank r owns experts [r * E / W, (r + 1) * E / W). Calls only launch (no host sync, no
allocation) and can be captured in CUDA graphs (call once before capturing). Every rank must
make the same calls in the same order, each dispatch followed by its combine, on one stream
per rank; token counts may differ between ranks (0 included). Protocol and layout:
rose_aot/kernels/moe_ep_dispatch/protocol.py and docs/expert-parallel-moe.md.
Plain Python + torch; never imports cutlass; never uses NVLink multicast.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

from ..kernels.moe_ep_dispatch.protocol import (
    MAX_RANKS,
    STATE_WORDS,
    region_bytes,
    slots_for,
)
from .workspace import DistributedError, check_no_multicast_env

__all__ = ["EpWorkspace", "EpBuffers", "ExpertParallelMoe", "ep_workspace_for"]

_ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


class EpWorkspace:
    """The peer-visible region of one process group for one MoE shape (experts, top-k,
    hidden, token dtype) and up to ``max_tokens`` tokens per rank, plus this rank's local
    state. Construction is collective (every rank, same order relative to other collectives);
    everything is allocated, zeroed and exchanged here, never in a call."""

    def __init__(self, group=None, *, num_experts: int, top_k: int, hidden: int,
                 max_tokens: int, dtype: str = "bfloat16", scale_group: int = 0,
                 device: int | None = None):
        import torch
        import torch.distributed as dist

        _check_request(num_experts, top_k, hidden, max_tokens)
        group = group if group is not None else dist.group.WORLD
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = W = dist.get_world_size(group)
        if not 2 <= W <= MAX_RANKS:
            raise DistributedError(
                f"expert parallelism over NVLink serves 2..{MAX_RANKS} ranks of one node; this "
                f"group has {W}"
            )
        dtype = _dtype_name(dtype)
        if dtype not in _ELEM_BYTES:
            raise DistributedError(f"token dtype {dtype} is not one of {', '.join(_ELEM_BYTES)}")
        if num_experts % W:
            raise DistributedError(f"{num_experts} experts do not split over {W} ranks")
        self.num_experts, self.top_k, self.hidden = num_experts, top_k, hidden
        self.local_experts = num_experts // W
        self.dtype, self.scale_group = dtype, scale_group
        self.max_tokens = max_tokens
        self.slots = slots_for(max_tokens, top_k)  # per sender
        groups = hidden // scale_group if scale_group else 0
        self.region_bytes = region_bytes(W, self.slots, hidden, self.local_experts,
                                         _ELEM_BYTES[dtype], groups)
        self.device = torch.cuda.current_device() if device is None else device
        dev = f"cuda:{self.device}"

        import torch.distributed._symmetric_memory as symm_mem

        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed before torch 2.9-ish; a deprecated no-op later
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                enable(group.group_name)
        with torch.cuda.device(self.device):
            self.tensor = symm_mem.empty(self.region_bytes, dtype=torch.uint8, device=dev)
            # Flags start below every epoch (epochs start at 1); zeroed before any peer can
            # write: peers write only in calls, after the barrier below.
            self.tensor.zero_()
            self.handle = symm_mem.rendezvous(self.tensor, group.group_name)
            if getattr(self.handle, "multicast_ptr", 0):
                raise DistributedError(
                    "torch symmetric memory created a multicast object despite "
                    "TORCH_SYMM_MEM_DISABLE_MULTICAST=1; refusing to continue"
                )
            bases = [int(p) for p in self.handle.buffer_ptrs]
            if len(bases) != W:
                raise DistributedError(
                    f"the symmetric-memory handle has {len(bases)} buffers for a group of {W}"
                )
            offset = self.tensor.data_ptr() - bases[self.rank]
            size = getattr(self.handle, "buffer_size", None)
            if offset < 0 or (size is not None and offset + self.region_bytes > size):
                raise DistributedError(
                    f"the workspace tensor (0x{self.tensor.data_ptr():x}, {self.region_bytes} "
                    f"bytes) is not inside this rank's symmetric buffer (0x{bases[self.rank]:x}, "
                    f"{size} bytes)"
                )
            offsets = [None] * W
            dist.all_gather_object(offsets, offset, group=group)
            if any(o != offset for o in offsets):
                raise DistributedError(f"symmetric tensor offsets differ across ranks: {offsets}")
            self.peer_regions = tuple(b + offset for b in bases)
            if any(p % 16 for p in self.peer_regions):
                raise DistributedError(f"peer regions are not 16-byte aligned: {self.peer_regions}")
            self.ptrs = torch.tensor(self.peer_regions, dtype=torch.int64, device=dev)
            self.state = torch.zeros(STATE_WORDS, dtype=torch.int32, device=dev)
            self.counters = torch.zeros(2 * num_experts, dtype=torch.int32, device=dev)
            self.recv_pos = torch.zeros(W * self.slots, dtype=torch.int32, device=dev)
            torch.cuda.synchronize(self.device)
        dist.barrier(group=group)

    def tail_dispatch(self) -> tuple:
        """(recv_pos, ptrs, state, counters, rank): the trailing arguments of moe_ep_dispatch."""
        return (self.recv_pos, self.ptrs, self.state, self.counters, self.rank)

    def tail_combine(self) -> tuple:
        """(recv_pos, ptrs, state, rank): the trailing arguments of moe_ep_combine."""
        return (self.recv_pos, self.ptrs, self.state, self.rank)

    def epoch(self) -> int:
        """Steps (dispatch + combine) made on this workspace so far (a host sync)."""
        return int(self.state[0].item())

    def __repr__(self) -> str:
        return (f"EpWorkspace(rank={self.rank}/{self.world_size}, experts={self.num_experts}, "
                f"top_k={self.top_k}, hidden={self.hidden}, dtype={self.dtype}, "
                f"max_tokens={self.max_tokens}, {self.region_bytes / 2**20:.1f} MiB per rank)")


_workspaces: dict[tuple, EpWorkspace] = {}
_lock = threading.Lock()


def _check_request(num_experts, top_k, hidden, max_tokens) -> None:
    """What every entry point checks before touching the process group or a device: multicast
    off, torch.distributed initialised, positive integer sizes."""
    import torch.distributed as dist

    check_no_multicast_env()
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedError(
            "torch.distributed is not initialised: launch with torchrun and call "
            "dist.init_process_group('nccl') first"
        )
    import torch

    values = {"num_experts": num_experts, "top_k": top_k, "hidden": hidden,
              "max_tokens": max_tokens}
    bad = {k: v for k, v in values.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
    if bad:
        raise DistributedError(
            "expert-parallel sizes must be positive integers: "
            + ", ".join(f"{k}={v!r}" for k, v in bad.items())
        )
    if not torch.cuda.is_available():
        raise DistributedError("expert parallelism needs a CUDA device per rank; none is usable")


def ep_workspace_for(group, *, num_experts: int, top_k: int, hidden: int, max_tokens: int,
                     dtype: str = "bfloat16", scale_group: int = 0,
                     device: int | None = None) -> EpWorkspace:
    """The workspace of (group, MoE shape, size class of max_tokens: the power of two >= it,
    device), created on first use (collective: every rank asks in the same order)."""
    import torch
    import torch.distributed as dist

    _check_request(num_experts, top_k, hidden, max_tokens)
    group = group if group is not None else dist.group.WORLD
    device = torch.cuda.current_device() if device is None else device
    size = 1
    while size < max_tokens:
        size *= 2
    key = (group.group_name, num_experts, top_k, hidden, _dtype_name(dtype), scale_group, size,
           device)
    with _lock:
        ws = _workspaces.get(key)
        if ws is None:
            ws = EpWorkspace(group, num_experts=num_experts, top_k=top_k, hidden=hidden,
                             max_tokens=size, dtype=_dtype_name(dtype), scale_group=scale_group,
                             device=device)
            _workspaces[key] = ws
        return ws


@dataclass
class EpBuffers:
    """A dispatch's outputs, read by the grouped GEMM (out, out_scales, expert_offsets) and by
    the combine (send_slots). Allocate once (``ExpertParallelMoe.outputs``) and reuse."""

    out: object  # [max_rows, hidden]: this rank's experts' rows, grouped by expert
    expert_offsets: object  # int32 [local_experts + 1]
    send_slots: object  # int32 [tokens, top_k]: where each copy went (destination * slots + slot)
    out_scales: object = None  # fp32 [max_rows, groups] for float8 tokens


class ExpertParallelMoe:
    """moe_ep_dispatch + moe_ep_combine of one MoE layer shape over a process group."""

    def __init__(self, bundle, *, num_experts: int, top_k: int, hidden: int, max_tokens: int,
                 dtype="bfloat16", combine_dtype="bfloat16", scale_group: int = 0,
                 expert_alignment: int = 1, group=None, workspace: EpWorkspace | None = None):
        dtype, combine_dtype = _dtype_name(dtype), _dtype_name(combine_dtype)
        if dtype == "float8_e4m3fn" and not scale_group:
            scale_group = 128
        self.workspace = ws = workspace or ep_workspace_for(
            group, num_experts=num_experts, top_k=top_k, hidden=hidden, max_tokens=max_tokens,
            dtype=dtype, scale_group=scale_group,
        )
        if (ws.num_experts, ws.top_k, ws.hidden, ws.dtype, ws.scale_group) != (
                num_experts, top_k, hidden, dtype, scale_group) or ws.max_tokens < max_tokens:
            raise DistributedError(f"{ws!r} does not serve this MoE shape / {max_tokens} tokens")
        config = {"world_size": ws.world_size, "num_experts": num_experts, "top_k": top_k,
                  "hidden": hidden, "dtype": dtype, "expert_alignment": expert_alignment}
        if scale_group:
            config["scale_group"] = scale_group
        self.dispatch_handle = bundle.kernel("moe_ep_dispatch", **config)
        self.combine_handle = bundle.kernel("moe_ep_combine", world_size=ws.world_size,
                                            top_k=top_k, hidden=hidden, dtype=combine_dtype)
        self.scaled = bool(scale_group)
        self.groups = hidden // scale_group if scale_group else 0
        self.dtype, self.combine_dtype = dtype, combine_dtype
        self.max_rows = (ws.world_size * ws.slots
                         + ws.local_experts * (expert_alignment - 1))
        self._dispatch_tail = ws.tail_dispatch()
        self._combine_tail = ws.tail_combine()

    @property
    def local_experts(self) -> int:
        return self.workspace.local_experts

    def outputs(self, tokens: int | None = None) -> EpBuffers:
        """Output tensors of a dispatch of `tokens` tokens (default: max_tokens); `out` holds
        the worst case (every copy of every rank on this rank)."""
        import torch

        ws = self.workspace
        tokens = ws.max_tokens if tokens is None else tokens
        dev = f"cuda:{ws.device}"
        out = torch.empty(self.max_rows, ws.hidden, dtype=getattr(torch, self.dtype), device=dev)
        scales = None
        if self.scaled:
            scales = torch.empty(self.max_rows, self.groups, dtype=torch.float32, device=dev)
        return EpBuffers(out, torch.empty(ws.local_experts + 1, dtype=torch.int32, device=dev),
                         torch.empty(tokens, ws.top_k, dtype=torch.int32, device=dev), scales)

    def dispatch(self, x, topk_ids, buffers: EpBuffers, x_scales=None, *, send_slots=None):
        """Send this rank's tokens x [tokens, hidden] (topk_ids int32 [tokens, top_k]; float8:
        x_scales fp32 [tokens, groups]) to their experts' ranks; fills buffers.out (rows
        [0, expert_offsets[-1]) of this rank's experts), expert_offsets, send_slots (its first
        `tokens` rows unless `send_slots` is given)."""
        tokens = x.shape[0]
        slots = buffers.send_slots[:tokens] if send_slots is None else send_slots
        if self.scaled:
            if x_scales is None:
                raise DistributedError("float8 dispatch needs x_scales")
            self.dispatch_handle(x, topk_ids, x_scales, buffers.out, buffers.out_scales,
                                 buffers.expert_offsets, slots, *self._dispatch_tail)
        else:
            self.dispatch_handle(x, topk_ids, buffers.out, buffers.expert_offsets, slots,
                                 *self._dispatch_tail)
        return buffers

    def combine(self, y, buffers: EpBuffers, weights, out, *, send_slots=None):
        """out [tokens, hidden] = sum over k of weights[t, k] * the expert output of copy
        (t, k); y: this rank's expert outputs, row for row of buffers.out."""
        tokens = out.shape[0]
        slots = buffers.send_slots[:tokens] if send_slots is None else send_slots
        self.combine_handle(y, slots, weights, out, *self._combine_tail)
        return out
