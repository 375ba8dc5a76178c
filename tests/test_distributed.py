"""Training across processes (accelerate, gloo on the CPU): 2 processes train what 1 does at the same
global batch (top-layer distillation, the drafts refresh's self-distillation, the joint loop), under
DDP and under FSDP, and a checkpoint resumes on a different number of processes, with or without FSDP,
equal to the run that was never interrupted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests import dist_stages
from tests.test_topnar import top_model
from yue.train.checkpoint import latest_checkpoint
from yue.train.topnar import NARParts

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8
# Float tolerance: the processes' gradients are summed by gloo in another order than one backward sums
# them (seen: losses within 3e-6, weights within 7e-6 after 8 steps; docs/results-log.md).
LOSS_TOL = 1e-4
WEIGHT_TOL = 1e-4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two(run_dir: Path, stop_at: int | None = None, fsdp: bool = False) -> list[dict]:
    """`accelerate launch` 2 processes of `tests.dist_stages` (torchrun; gloo: no GPU is asked for), DDP
    or FSDP."""
    mode = ["--use_fsdp", "--fsdp_version", "2"] if fsdp else ["--multi_gpu"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
           str(free_port()), "-m", "tests.dist_stages", str(run_dir), str(STEPS), *([str(stop_at)] if stop_at else [])]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((run_dir / "history.json").read_text())


def worlds(run_dir: Path) -> dict[int, tuple[int, bool]]:
    """{step: (number of processes that wrote it, whether under FSDP)} of the run's kept checkpoints."""
    states = [json.loads(p.read_text()) for p in (run_dir / "checkpoints").glob("step-*/state.json")]
    return {s["step"]: (s["world"], s.get("fsdp", False)) for s in states}


def final_tensors(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))


def assert_same_run(history: list[dict], reference: list[dict]) -> None:
    assert [h["step"] for h in history] == [h["step"] for h in reference]
    for h, r in zip(history, reference, strict=True):
        assert h["loss"] == pytest.approx(r["loss"], abs=LOSS_TOL), (h["step"], h["loss"], r["loss"])
        assert h["answer_tokens_seen"] == r["answer_tokens_seen"]  # the same global batches


@pytest.mark.slow
def test_two_processes_train_what_one_does_and_resume_across_process_counts(tmp_path):
    # 1. The reference: one process, uninterrupted.
    one = dist_stages.run(tmp_path / "one", STEPS)
    # 2. Two processes, interrupted after step 4: the same losses so far.
    run = tmp_path / "moved"
    two = launch_two(run, stop_at=4)
    assert worlds(run)[4] == (2, False)
    assert_same_run(two, one[:4])
    # The same launch ran the drafts refresh's NAR self-distillation: the same per-step losses as one
    # process.
    assert_same_refresh(run)
    # And `yue train`'s joint loop: the same model after 8 steps.
    joint_one = load_file(str(dist_stages.run_joint(tmp_path / "joint") / "model.safetensors"))
    joint_two = load_file(str(run / "joint" / "run" / "model" / "model.safetensors"))
    assert joint_one.keys() == joint_two.keys()
    for k in joint_one:
        torch.testing.assert_close(joint_two[k], joint_one[k], atol=WEIGHT_TOL, rtol=0)
    # 3. Resumed on one process to step 6, then on two to the end: the uninterrupted run's losses and
    # weights.
    dist_stages.run(run, STEPS, stop_at=6)
    assert worlds(run)[6] == (1, False)
    resumed = launch_two(run)
    assert worlds(run)[STEPS] == (2, False)
    assert_same_run(resumed, one)
    assert_same_weights(final_tensors(run), final_tensors(tmp_path / "one"))


@pytest.mark.slow
def test_fsdp_trains_what_one_process_does_and_resumes_with_or_without_it(tmp_path):
    # 1. The reference: one process, uninterrupted.
    one = dist_stages.run(tmp_path / "one", STEPS)
    # 2. Two processes under FSDP (FSDP2 over gloo), interrupted after step 4: the same losses so far,
    # and the drafts refresh's self-distillation too; the joint loop is refused, naming DDP.
    run = tmp_path / "fsdp"
    two = launch_two(run, stop_at=4, fsdp=True)
    assert worlds(run)[4] == (2, True)
    assert_same_run(two, one[:4])
    assert_same_refresh(run)
    assert "without --use_fsdp" in json.loads((run / "joint_refused.json").read_text())
    # 3. Resumed without FSDP on one process to step 6, then under FSDP on two to the end: the
    # uninterrupted run's losses and weights (the checkpoints hold whole tensors either way).
    dist_stages.run(run, STEPS, stop_at=6)
    assert worlds(run)[6] == (1, False)
    resumed = launch_two(run, fsdp=True)
    assert worlds(run)[STEPS] == (2, True)
    assert_same_run(resumed, one)
    assert_same_weights(final_tensors(run), final_tensors(tmp_path / "one"))


def assert_same_refresh(run: Path) -> None:
    """The launch's drafts-refresh log (`refresh.json`) has one process's per-step losses."""
    refresh_two = json.loads((run / "refresh.json").read_text())
    refresh_one = dist_stages.run_refresh(STEPS)
    assert [r["step"] for r in refresh_two] == [r["step"] for r in refresh_one] == list(range(1, STEPS + 1))
    for r2, r1 in zip(refresh_two, refresh_one, strict=True):
        assert r2["loss"] == pytest.approx(r1["loss"], abs=LOSS_TOL), (r2["step"], r2["loss"], r1["loss"])


def assert_same_weights(b: dict[str, torch.Tensor], a: dict[str, torch.Tensor]) -> None:
    """Final checkpoint weights b equal a's within float tolerance, and training changed them."""
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=WEIGHT_TOL, rtol=0)
    start = NARParts(top_model()).state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a)  # it did train


def test_resume_with_another_global_batch_is_refused(tmp_path):
    dist_stages.run(tmp_path / "run", STEPS, stop_at=2)
    with pytest.raises(ValueError, match="global batch of 4, this run uses 2"):
        dist_stages.run(tmp_path / "run", STEPS, batch=2)
