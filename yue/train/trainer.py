"""What every training stage repeats, in one place: AdamW, the learning-rate schedule, gradient
clipping, atomic checkpoints and resume, and the `accelerate.Accelerator` that runs the stage on one
process or many (`accelerate launch --num_processes N`: gloo on CPUs, NCCL on GPUs; DDP, or FSDP when
the launch asks for it, applied by `sharding.py` for the stages that declare it).

A stage keeps its model, data and loss; it hands the trainer an *objective* module (its forward returns
the loss terms, so DDP's gradient hooks see the forward), the parameters it trains and the module a
checkpoint stores (often a small view of the trainable part), and calls `update` once per step.

Design decisions:
- The learning rate is a pure function of the step (`lr_at`: linear warm-up, then cosine decay to
  `lr * min_lr_ratio`), set before each update: no scheduler object whose state could drift from a
  checkpoint.
- Independent of the number of processes. A stage's batch size is the *global* batch. Step s's batch
  (which rows, which anchors, which reveals) is drawn for the whole global batch from a generator seeded
  by (seed, s) on every process, and each process takes its slice (`rows`). A loss is a sum over the
  global batch divided by a global count (`global_mean`): DDP averages the processes' gradients, so the
  update equals the one-process update up to the order of float additions.
- A checkpoint (`checkpoint.py`: safetensors and JSON, never pickle, written atomically) stores the
  step, the data position in global samples and the world size that wrote it. No per-process random
  state is needed (every draw comes from a generator seeded by the step), so a run saved by N processes
  resumes on M, as long as the global batch is the same.
- Under FSDP the trainer steps a sharded copy of the objective (`sharding.ShardedObjective`) and the
  stage's model is whole only inside `whole()` and after `close()`; a stage declares that it reads its
  model only there (`shardable`), and any other is refused under an FSDP launch. Its checkpoints hold
  whole tensors, as one process writes them.
- The small chores the stages share live here too: a run's `log.jsonl` (`append_jsonl`), the check
  that a resumed run keeps its settings (`check_resume_settings`), and the wall time of a stage's
  phases for its report (`StageTimer`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Protocol

import torch
from accelerate import Accelerator, InitProcessGroupKwargs
from torch import nn

from yue.train.checkpoint import latest_checkpoint, load_checkpoint, optimizer_tensors, save_checkpoint
from yue.train.sharding import ShardedObjective, fsdp_selected, full

log = logging.getLogger(__name__)

# Generous: the main process may write data (greedy answers, token caches) while the others wait.
PROCESS_GROUP_TIMEOUT = timedelta(hours=12)


class Schedule(Protocol):
    """The fields of a stage's config that the learning-rate schedule reads."""

    lr: float
    warmup_steps: int
    steps: int
    min_lr_ratio: float


class Optimization(Schedule, Protocol):
    """A schedule plus the optimizer's own knobs."""

    weight_decay: float
    grad_clip: float


def lr_at(step: int, cfg: Schedule) -> float:
    """Linear warm-up to `lr` over `warmup_steps`, then cosine decay to `lr * min_lr_ratio` at `steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of step `step`'s draws for the whole global batch (the same on every process)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def adamw(
    params: list[nn.Parameter], lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95)
) -> torch.optim.AdamW:
    """AdamW where matrices decay and norms/vectors do not. With no decay at all, one group in the
    parameters' own order (a checkpoint's optimizer state is indexed by that order)."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    if weight_decay and decay and no_decay:
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    else:
        groups = [{"params": list(params), "weight_decay": weight_decay if decay else 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=False)


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record to a JSONL log (a run's `log.jsonl`)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def check_resume_settings(saved_file: Path, now: dict, free: Iterable[str] = ()) -> None:
    """A resumed run must train with the settings it started with, or it would not reach the same
    weights: raise naming each field outside `free` where `now` differs from `saved_file`'s JSON (the
    settings the run wrote when it started; nothing to check when there is none)."""
    if not saved_file.is_file():
        return
    saved, free = json.loads(saved_file.read_text()), set(free)
    diff = [k for k in now if k not in free and saved.get(k) != now[k]]
    if diff:
        raise ValueError(
            f"--resume with settings that differ from the run in {saved_file.parent}: {', '.join(diff)}"
        )


@dataclass
class StageTimer:
    """Wall time of a stage's phases, for its report: `mark(name)` records the seconds (1 decimal)
    since the previous mark, or since the timer started."""

    marks: dict[str, float] = field(default_factory=dict)
    t: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.start = self.t

    def total(self) -> float:
        """Seconds (1 decimal) since the timer started."""
        return round(time.perf_counter() - self.start, 1)

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.marks[name] = round(now - self.t, 1)
        self.t = now

    def restart(self) -> None:
        """Leave the time since the previous mark out of the next one."""
        self.t = time.perf_counter()


def make_accelerator(cpu: bool | None = None) -> Accelerator:
    """The run's `Accelerator`: plain on one process; launched on N (`accelerate launch --multi_gpu`,
    `torchrun`), over gloo on CPUs or NCCL on GPUs (DDP, or FSDP as the `Trainer` applies it).

    Args:
        cpu: run on the CPU (gloo between processes); None: when no GPU is present. accelerate only
            sets up gloo between CPU processes when told `cpu`.
    """
    cpu = not torch.cuda.is_available() if cpu is None else cpu
    return Accelerator(cpu=cpu, kwargs_handlers=[InitProcessGroupKwargs(timeout=PROCESS_GROUP_TIMEOUT)])


class Trainer:
    """Optimizer + schedule + checkpoints + accelerate for one stage (see the module docstring).

    Args:
        objective: module whose forward computes the stage's loss terms; wrapped by accelerate.
        params: the trained parameters (the rest of the objective stays frozen).
        cfg: lr, warmup_steps, steps, min_lr_ratio, weight_decay, grad_clip.
        global_batch: rows per step over all processes (divisible by the number of processes).
        saved: the module a checkpoint stores (the trained part); default `objective`.
        run_dir: checkpoints go to `run_dir/checkpoints`; None keeps none.
        betas: AdamW's.
        keep: checkpoints kept.
        accelerator: an existing one (a run of several stages shares one); default `make_accelerator`,
            on the CPU when the parameters are there.
        shardable: the stage runs under FSDP when the launch selects it: it reads its model during
            training only inside `whole()` and calls `close()` when done. Without it an FSDP launch
            is refused.
    """

    def __init__(
        self,
        objective: nn.Module,
        params: list[nn.Parameter],
        cfg: Optimization,
        global_batch: int,
        saved: nn.Module | None = None,
        run_dir: str | Path | None = None,
        betas: tuple[float, float] = (0.9, 0.95),
        keep: int = 2,
        accelerator: Accelerator | None = None,
        shardable: bool = False,
    ) -> None:
        self.accelerator = accelerator or make_accelerator(cpu=params[0].device.type == "cpu")
        self.world, self.rank = self.accelerator.num_processes, self.accelerator.process_index
        if global_batch % self.world:
            raise ValueError(f"batch_size {global_batch} is not divisible by the {self.world} processes")
        self.cfg, self.global_batch, self.keep = cfg, global_batch, keep
        self.saved = saved if saved is not None else objective
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.sharding: ShardedObjective | None = None
        if fsdp_selected(self.accelerator):
            if not shardable:
                raise ValueError(
                    "this stage does not run under FSDP (the top-layer distillation and NAR "
                    "self-distillation do): launch it without --use_fsdp (DDP)"
                )
            # FSDP: the optimizer steps the shards; the objective itself is whole only on demand.
            self.sharding = ShardedObjective(objective, self.accelerator.device.type, self.world)
            self.params = self.sharding.sharded(params)
            self._optimizer = adamw(self.params, cfg.lr, cfg.weight_decay, betas)
            self.net, self.optimizer = self.sharding.net, self._optimizer
            return
        self._optimizer = adamw(params, cfg.lr, cfg.weight_decay, betas)
        self.net, self.optimizer = self.accelerator.prepare(objective, self._optimizer)
        # The parameters as prepared: what clipping must see.
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def rows(self) -> slice:
        """This process's slice of a global batch (contiguous, equal shares)."""
        per = self.global_batch // self.world
        return slice(self.rank * per, (self.rank + 1) * per)

    def global_mean(self, total: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(this process's loss to backpropagate, the global loss's value) for a loss that is
        sum(total over all processes) / sum(count over all processes).

        DDP averages gradients over the processes, so the local loss is scaled by `world`:
        mean_r grad(world * total_r / N) = grad(sum_r total_r) / N, the one-process gradient.
        """
        reduce = self.accelerator.reduce
        n = reduce(count.detach().float().reshape(1), "sum").clamp(min=1e-6)
        value = reduce(total.detach().float().reshape(1), "sum") / n
        return total * self.world / n[0], float(value[0])

    def update(self, loss: torch.Tensor, step: int) -> float:
        """Backward, clip, one AdamW step at step `step`'s learning rate; returns the gradient norm."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, self.cfg)
        self.accelerator.backward(loss)
        if self.sharding is not None:  # the shards' norm is the whole gradient's (a DTensor reduction)
            norm = full(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip))
        else:
            norm = self.accelerator.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def whole(self) -> AbstractContextManager:
        """A context where the stage's objective holds its whole, current weights (for an evaluation
        during training); under FSDP every process must enter it. Without FSDP it always does."""
        return self.sharding.whole() if self.sharding is not None else nullcontext()

    def close(self) -> None:
        """End of training: the stage's objective whole for good (every process must call it)."""
        if self.sharding is not None:
            self.net = self.sharding.original
            self.sharding.close()
            self.sharding = None

    def resume(self) -> dict:
        """Restore the newest complete checkpoint of `run_dir` (if any), whatever number of processes
        wrote it; returns its JSON state (`step`, `samples`, the stage's extras), or {"step": 0}."""
        ckpt = latest_checkpoint(self.run_dir) if self.run_dir is not None else None
        if ckpt is None:
            return {"step": 0}
        with self.whole():  # under FSDP: loaded whole, then spread into the shards
            state = load_checkpoint(ckpt, self.saved, self._optimizer)
            if self.sharding is not None:
                self.sharding.push()
        samples = state.get("samples", state["step"] * self.global_batch)  # older checkpoints: implied
        if samples != state["step"] * self.global_batch:
            raise ValueError(
                f"{ckpt} was written with a global batch of {samples // max(state['step'], 1)}, this run "
                f"uses {self.global_batch}: resume with the same global batch (any number of processes)"
            )
        log.info(
            "resumed from %s at step %d (written by %s processes)", ckpt, state["step"], state.get("world", 1)
        )
        return state

    def save(self, step: int, extra: dict | None = None) -> None:
        """Checkpoint after `step` steps (the main process writes; every process must call this)."""
        if self.run_dir is None:
            return
        self.accelerator.wait_for_everyone()
        with self.whole():  # under FSDP: every process gathers, the main one writes whole tensors
            optimizer = self._optimizer
            if self.sharding is not None:
                tensors, groups = optimizer_tensors(self._optimizer)
                optimizer = ({k: full(t) for k, t in tensors.items()}, groups)
            if self.is_main:
                position = {
                    "samples": step * self.global_batch,
                    "world": self.world,
                    "fsdp": self.sharding is not None,
                }
                extra = {**position, **(extra or {})}
                save_checkpoint(self.run_dir, step, self.saved, optimizer, extra, self.keep)
        self.accelerator.wait_for_everyone()
