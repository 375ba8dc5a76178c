"""A verifying forward's cost against its rows (`costs.verify_cost_curve`, as `yue bench` reports it) on
yue-smol, with this checkout's row kernel and with the kernel source of another git revision, in one
process (a development script, not part of the package).

    python docs/recipes/row_cost_ab.py [revision] [dtype] [rounds] [clock]

- revision (default `main`): whose `yue/model/rowkernel.c` (or `yue/kernels/rowkernel.c`) to build as
  "before"; its matmul layouts must be this checkout's (the model is prepared once and each kernel
  runs on the same packed weights). Both builds first write a greedy `verified` answer, which must be
  the same tokens.
- dtype: int4 (default) or float32. rounds: curves per kernel, alternated (default 3).
- clock: `cpu` (default: the thread's CPU time, so that other processes on a shared machine do not
  count; the step is one thread) or `wall` (as `yue bench` measures).

Prints each kernel's median step per row count over its rounds and the ratios to its one-row step.
"""

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

revision = sys.argv[1] if len(sys.argv) > 1 else "main"
dtype = sys.argv[2] if len(sys.argv) > 2 else "int4"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
clock = sys.argv[4] if len(sys.argv) > 4 else "cpu"
if clock == "cpu":
    costs.time.perf_counter = time.thread_time  # the timer `costs._median_times` reads
torch.set_num_threads(1)

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
model = engine.model
answers = {}
for name in sources:
    use(name)
    answers[name] = engine.generate(
        "How does a bicycle stay upright?", mode="verified", max_new_tokens=48
    ).token_ids
print(f"{dtype}: the same greedy verified tokens before and after: {answers['before'] == answers['after']}")
steps = {name: [] for name in sources}
for _ in range(rounds):
    for name in sources:
        use(name)
        steps[name].append(costs.verify_cost_curve(model).step_s)
for name, curves in steps.items():
    med = [statistics.median(c[k] for c in curves) for k in range(len(costs.ROWS))]
    print(
        f"{name:6s} ({clock} time) ms: "
        + " ".join(f"{m * 1e3:.2f}" for m in med)
        + " | x1 row: "
        + " ".join(f"{m / med[0]:.2f}" for m in med)
    )
