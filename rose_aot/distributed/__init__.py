"""Several GPUs: peer-visible buffers from torch symmetric memory and the collective calls
that launch the all_reduce kernels of a bundle on them. Plain Python + torch; never imports
cutlass. Processes and the process group come from torch.distributed (NCCL), never from here.

NVLink multicast (NVLS) is never used: :func:`check_no_multicast_env` refuses to set up
unless NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are in the environment.
"""

from .collectives import AllReduce, FusedAllReduceRmsNorm, FusedMoeCombineAllReduce
from .ep import EpBuffers, EpWorkspace, ExpertParallelMoe, ep_workspace_for
from .workspace import (
    NO_MULTICAST_ENV,
    DistributedError,
    SymmetricWorkspace,
    check_no_multicast_env,
    size_class,
    workspace_for,
)

__all__ = [
    "NO_MULTICAST_ENV",
    "DistributedError",
    "SymmetricWorkspace",
    "check_no_multicast_env",
    "size_class",
    "workspace_for",
    "AllReduce",
    "FusedAllReduceRmsNorm",
    "FusedMoeCombineAllReduce",
    "EpWorkspace",
    "EpBuffers",
    "ExpertParallelMoe",
    "ep_workspace_for",
]
