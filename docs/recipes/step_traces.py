"""Token ids and step traces of `verified` and `hybrid` on a real model, as JSON, to compare two versions
of the decode code (a development script, not part of the package). Written for issue 44's draft
sources: run it under the old and the new code (`PYTHONPATH=<checkout>`) and `cmp` the two files.

    python docs/recipes/step_traces.py MODEL OUT.json [prompts] [tokens] [COSTS.json]

For the first `prompts` (default 3) prompts of the model's held-out set (chat for an instruct model,
else code), `tokens` (default 48) new tokens each: `verified` and `hybrid` at their defaults, `verified`
at router thresholds 0.6 and 1, without copies, seeded sampling in both modes, and the prompts as one
batch. Each run records its ids, per step (mode, drafted, accepted, p_ar, entropy; not the time) and
its counts. Draft lengths follow the step costs, and a fresh measurement differs from the last, so the
costs are read from COSTS.json (default /tmp/yue-step-costs-MODEL.json), measured into it if absent.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

import yue
from yue.bench.prompts import load_prompts
from yue.decode.costs import StepCosts, measured_costs
from yue.registry import ASSETS

RUNS = [
    ("verified", {}),
    ("hybrid", {}),
    ("verified", {"router_threshold": 0.6}),
    ("verified", {"router_threshold": 1.0}),
    ("verified", {"prompt_lookup": False}),
    ("verified", {"temperature": 0.8, "seed": 3}),
    ("hybrid", {"temperature": 0.8, "seed": 3}),
]


def fixed_costs(engine, path: Path) -> StepCosts:
    if not path.exists():
        c = measured_costs(engine.model)
        path.write_text(json.dumps({"step": c.step, "passes": c.passes}))
    d = json.loads(path.read_text())
    return StepCosts(tuple(d["step"]), tuple(d["passes"]))


def record(kind: str, mode: str, kw: dict, r) -> dict:
    steps = [{k: v for k, v in asdict(s).items() if k != "time_ms"} for s in r.trace]
    st = r.stats
    counts = dict(forwards=st.forwards, draft_passes=st.draft_passes, ar=st.ar_tokens, nar=st.nar_tokens)
    return dict(kind=kind, mode=mode, kw=kw, ids=r.token_ids, steps=steps, **counts)


def main(model: str, out: str, n_prompts: int = 3, tokens: int = 48, costs: str | None = None) -> None:
    torch.set_num_threads(1)
    engine = yue.load(model)
    engine.costs = fixed_costs(engine, Path(costs or f"/tmp/yue-step-costs-{model}.json"))
    split = "chat_test" if engine.instruct else "code_test"
    prompts = [p.text for p in load_prompts(ASSETS / f"{split}.jsonl", engine, n_prompts)]
    runs = []
    for mode, kw in RUNS:
        for i, p in enumerate(prompts):
            r = engine.generate(p, mode=mode, max_new_tokens=tokens, trace=True, **kw)
            runs.append(record(f"single{i}", mode, kw, r))
    for mode in ("verified", "hybrid"):
        for i, r in enumerate(engine.generate(prompts, mode=mode, max_new_tokens=tokens, trace=True)):
            runs.append(record(f"batch{i}", mode, {}, r))
    Path(out).write_text(json.dumps(runs))
    print(f"{len(runs)} runs, {sum(len(r['steps']) for r in runs)} steps -> {out}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], *(int(a) for a in args[2:4]), *args[4:5])
