"""The processes of a corpus run under ``torchrun`` / ``accelerate launch`` (``WORLD_SIZE`` > 1): this one's rank,
the process group (created here when the launcher did not), and the barriers between the run's steps."""

from __future__ import annotations

import os


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): from torch.distributed when initialised, else from torchrun's environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def join(model) -> bool:
    """Under torchrun / accelerate launch (WORLD_SIZE > 1) without a process group yet: create one (gloo for a
    model on CPU, nccl on CUDA); True if this call created it (and so destroys it at the end)."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", 1)) <= 1 or not dist.is_available() or dist.is_initialized():
        return False
    device = next(model.parameters()).device
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return True


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def leave() -> None:
    """Destroy the process group :func:`join` created."""
    import torch.distributed as dist

    dist.destroy_process_group()
