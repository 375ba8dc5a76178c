"""FSDP for the training stages: torch's FSDP2 (`torch.distributed.fsdp.fully_shard`) over the launch's
process group, gloo between CPU processes and NCCL between GPUs.

Selected the accelerate way (`accelerate launch --use_fsdp ...`, or an `accelerate config` file that
asks for FSDP) on more than one process. yue applies `fully_shard` itself: accelerate (1.16) ignores
its FSDP plugin on CPU processes, and one code path for CPUs and GPUs is the one the tests exercise.

Design decisions:
- A sharded copy, the stage's model kept whole around it. `ShardedObjective` builds a structural copy
  of the stage's objective whose modules start out holding the same parameter tensors, shards the copy
  (each layer of the stack one FSDP unit, everything else the root unit: embedding, tied head, final
  norm, slot entry), then releases the originals' storage. Between steps each process holds only its
  shard of every parameter (frozen AR set and trained NAR set alike) and of the AdamW moments; during
  one it also holds a layer's whole weights while that layer runs forward or backward (FSDP2's
  defaults: a layer is resharded after its forward, the root unit only after the backward), and its
  shard of the gradients. The stage's own model is an
  ordinary module again inside `whole()` (every parameter gathered into it, e.g. for an evaluation) and
  after `close()` (for what follows training). No module of the stage's model is ever wrapped, so the
  rest of yue (saving, decoding, the router) never sees a sharded tensor.
- Checkpoints stay what one process writes: full tensors in the same safetensors files, gathered from
  the shards (`full`), and spread back into shards on resume (`shard_like`). So a run saved under FSDP
  resumes with or without it, on any number of processes.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from accelerate import Accelerator, DistributedType
from accelerate.utils import parse_flag_from_env
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

log = logging.getLogger(__name__)


def fsdp_selected(accelerator: Accelerator) -> bool:
    """True when the launch asks for FSDP (accelerate's flag or config) on more than one process."""
    asked = accelerator.distributed_type == DistributedType.FSDP or parse_flag_from_env("ACCELERATE_USE_FSDP")
    return asked and accelerator.num_processes > 1


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (an all-gather: every process must call it, in the same order)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`value` (a whole tensor, the same on every process) as a shard placed as `like`, when `like` is
    one; this process keeps its own part, no communication."""
    if not isinstance(like, DTensor) or value.shape != like.shape:
        return value
    return distribute_tensor(value.to(like.dtype), like.device_mesh, like.placements, src_data_rank=None)


def stack_layers(module: nn.Module) -> list[nn.Module]:
    """The FSDP units below the root: each layer of every stack (an `nn.ModuleList` named `layers`)."""
    return [
        layer
        for name, child in module.named_modules()
        if name.rsplit(".", 1)[-1] == "layers" and isinstance(child, nn.ModuleList)
        for layer in child
    ]


class ShardedObjective:
    """A stage's objective sharded over the processes, its original kept whole on demand (see the
    module docstring).

    Args:
        objective: the stage's loss module; its parameters' storage is released here and comes back
            in `whole()` and after `close()`.
        device_type: "cpu" (gloo) or "cuda" (NCCL): the mesh's device type.
        world: number of processes.
    """

    def __init__(self, objective: nn.Module, device_type: str, world: int) -> None:
        self.original = objective
        # 1. A copy of every module that holds the same parameter and buffer tensors (memo: deepcopy
        # keeps them): fully_shard copies each process's shard out of them.
        shared = {id(t): t for t in [*objective.parameters(), *objective.buffers()]}
        self.net = copy.deepcopy(objective, shared)
        mesh = init_device_mesh(device_type, (world,))
        for layer in stack_layers(self.net):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)
        # The copy's modules take the originals' train/eval mode at each forward (dropout and the like).
        self.net.register_forward_pre_hook(lambda *_: self._sync_modes())
        # 2. Each original parameter and its sharded counterpart (the same names, the same order).
        sharded = dict(self.net.named_parameters())
        self.pairs = [(p, sharded[name]) for name, p in objective.named_parameters()]
        self._depth = 0  # nested `whole()`s gather once
        self._release()
        log.info(
            "FSDP: %d parameter tensors in %d units sharded over %d processes",
            len(self.pairs), len(stack_layers(self.net)) + 1, world,
        )  # fmt: skip

    def sharded(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """The sharded counterparts of original parameters, in their order (what the optimizer steps)."""
        by_id = {id(p): s for p, s in self.pairs}
        return [by_id[id(p)] for p in params]

    def _sync_modes(self) -> None:
        for a, b in zip(self.original.modules(), self.net.modules(), strict=True):
            b.training = a.training

    def _gather(self) -> None:
        """Every original parameter gets its whole value from the shards (an all-gather each)."""
        with torch.no_grad():
            for p, s in self.pairs:
                p.data = full(s.detach())

    def _release(self) -> None:
        for p, _ in self.pairs:
            p.data = p.data.new_empty(0)

    def push(self) -> None:
        """The originals' whole values into the shards (after a checkpoint was loaded into them)."""
        with torch.no_grad():
            for p, s in self.pairs:
                s.to_local().copy_(shard_like(p.data, s).to_local())

    @contextmanager
    def whole(self) -> Iterator[None]:
        """The original objective whole (every process must enter), released again on exit."""
        if self._depth == 0:
            self._gather()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._release()

    def close(self) -> None:
        """The original objective whole for good (every process must call it); the copy is dropped."""
        self._gather()
        self.pairs, self.net = [], None
