"""A verifying forward's cost against its rows (`costs.verify_cost_curve`, as `yue bench` reports it) on
yue-smol, with this checkout's code and with another git revision's, measured alternately (a development
script, not part of the package).

    python docs/recipes/row_cost_ab.py [revision] [dtype] [rounds] [clock] [swap]

- revision (default `main`): the "before" side.
- dtype: int4 (default) or float32. rounds: curves per side, alternated (default 3).
- clock: `cpu` (default: the thread's CPU time, so that other processes on a shared machine do not
  count; the step is one thread) or `wall` (as `yue bench` measures).
- swap: `kernel` (default) builds the revision's `yue/kernels/rowkernel.c` (or `yue/model/rowkernel.c`)
  in this process and runs it on the same prepared model: its matmul layouts and C signatures must be
  this checkout's. `package` runs each side's whole `yue/` package (the revision's from `git archive`)
  in its own process, one per round: for a change of layouts or signatures (the integer head screen).
  Each side first writes a greedy `verified` answer, which must be the same tokens.

Prints each side's median step per row count over its rounds and the ratios to its one-row step.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import yue
from yue.decode import costs
from yue.kernels import rowkernel

PROMPT = "How does a bicycle stay upright?"


def set_clock(clock: str) -> None:
    if clock == "cpu":
        costs.time.perf_counter = time.thread_time  # the timer `costs._median_times` reads
    torch.set_num_threads(1)


def answer(engine) -> list[int]:
    return engine.generate(PROMPT, mode="verified", max_new_tokens=48).token_ids


def report(dtype: str, clock: str, answers: dict, steps: dict) -> None:
    print(
        f"{dtype}: the same greedy verified tokens before and after: {answers['before'] == answers['after']}"
    )
    for name, curves in steps.items():
        med = [statistics.median(c[k] for c in curves) for k in range(len(costs.ROWS))]
        print(
            f"{name:6s} ({clock} time) ms: "
            + " ".join(f"{m * 1e3:.2f}" for m in med)
            + " | x1 row: "
            + " ".join(f"{m / med[0]:.2f}" for m in med)
        )


def swap_kernel(revision: str, dtype: str, rounds: int) -> tuple[dict, dict]:
    old = Path(tempfile.mkdtemp()) / "rowkernel.c"
    for path in ("yue/model/rowkernel.c", "yue/kernels/rowkernel.c"):
        shown = subprocess.run(["git", "show", f"{revision}:{path}"], capture_output=True, text=True)
        if shown.returncode == 0:
            old.write_text(shown.stdout)
            break
    else:
        sys.exit(f"no rowkernel.c at {revision}")
    sources = {"before": old, "after": rowkernel.SOURCE}

    def use(name: str) -> None:
        rowkernel.SOURCE = sources[name]
        rowkernel.library.cache_clear()  # the next call builds (or finds cached) this source's library

    engine = yue.load("yue-smol", dtype=dtype)
    answers = {}
    for name in sources:
        use(name)
        answers[name] = answer(engine)
    steps = {name: [] for name in sources}
    for _ in range(rounds):
        for name in sources:
            use(name)
            steps[name].append(costs.verify_cost_curve(engine.model).step_s)
    return answers, steps


def swap_package(revision: str, dtype: str, rounds: int, clock: str) -> tuple[dict, dict]:
    old = Path(tempfile.mkdtemp())
    archive = subprocess.run(["git", "archive", revision, "yue"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    roots = {"before": str(old), "after": str(Path(__file__).resolve().parents[2])}
    answers, steps = {}, {name: [] for name in roots}
    for _ in range(rounds):
        for name, root in roots.items():
            env = {**os.environ, "PYTHONPATH": root}
            run = subprocess.run(
                [sys.executable, __file__, "--child", dtype, clock], env=env, capture_output=True, text=True
            )
            if run.returncode != 0:
                sys.exit(f"{name}: {run.stderr[-2000:]}")
            got = json.loads(run.stdout.strip().splitlines()[-1])
            answers[name] = got["tokens"]
            steps[name].append(got["steps"])
    return answers, steps


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:  # one side's round, in its own process
    set_clock(sys.argv[3])
    engine = yue.load("yue-smol", dtype=sys.argv[2])
    tokens = answer(engine)
    print(json.dumps({"tokens": tokens, "steps": list(costs.verify_cost_curve(engine.model).step_s)}))
elif __name__ == "__main__":
    revision = sys.argv[1] if len(sys.argv) > 1 else "main"
    dtype = sys.argv[2] if len(sys.argv) > 2 else "int4"
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    clock = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    swap = sys.argv[5] if len(sys.argv) > 5 else "kernel"
    set_clock(clock)
    if swap == "package":
        answers, steps = swap_package(revision, dtype, rounds, clock)
    else:
        answers, steps = swap_kernel(revision, dtype, rounds)
    report(dtype, clock, answers, steps)
