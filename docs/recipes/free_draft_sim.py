"""How far `verified`'s free drafts can take greedy decoding, simulated on the model's own answers (a
development script, not part of the package).

    python docs/recipes/free_draft_sim.py HELD_OUT.jsonl CALIBRATION.jsonl [...] [--dtype int4]

The model's greedy answers (128 tokens) to the prompt files are the truth a greedy `verified` request
meets: at each step the free sources (`decode/sources.py`: context copies, the corpus table) propose
their drafts from the context so far, and the draft that is verified is the one `verified` would pick
(`policies.best_draft` under each source's `AcceptanceRecord`, its priors measured on the calibration
answers as `free_draft_rates` does); it holds as far as it equals the answer. Each step costs what the
model's cost curve (`costs.measured_costs`, as the router weighs it) says for its rows. Printed, as JSON,
for the held-out answers:
- `coverage`: the share of answer positions where each source proposes, and where its first draft is
  right (what no policy can exceed: a position no source has right writes one token a step);
- `policy`: tokens per unit of step cost over `ar`'s (the simulated `verified` ÷ `ar`, drafting passes
  of the NAR set left out: on chat it writes ~0.1% of the tokens), tokens per step, accepted drafts per
  verifying step;
- `oracle`: the same drafts, each step verifying exactly as many as hold (a bound on any draft-length
  rule);
- `cheaper_rows`: the policy where each extra verifying row costs 25% / 50% less than measured (what a
  faster multi-row kernel would bring with these drafts).
The NAR set is not simulated, and a step's Python overhead is not counted: the measured speed is lower.
"""

import argparse
import json
from types import SimpleNamespace

import torch

import yue
from yue.bench.prompts import load_prompts
from yue.decode.costs import StepCosts, measured_costs
from yue.decode.lookup import NgramIndex
from yue.decode.policies import best_draft
from yue.decode.sources import ContextCopies, CorpusDrafts, common_prefix
from yue.train.free_drafts import free_draft_rates
from yue.train.topnar import greedy_answers

parser = argparse.ArgumentParser()
parser.add_argument("held_out")
parser.add_argument("calibration", nargs="+")
parser.add_argument("--dtype", default="int4")
args = parser.parse_args()
torch.set_num_threads(1)
engine = yue.load("yue-smol", dtype=None if args.dtype == "float32" else args.dtype)
n = engine.model.config.block_size - 1  # drafts a step verifies at most


def answers(files: list[str]) -> list[tuple[list[int], int]]:
    prompts = [p.ids for f in files for p in load_prompts(f, engine)]
    return list(greedy_answers(engine.model, prompts, max_new_tokens=128, batch_size=8).pairs())


def simulate(pairs, rates, costs: StepCosts, oracle: bool = False) -> dict:
    st = SimpleNamespace(
        costs=costs,
        cfg=SimpleNamespace(block_size=n + 1, draft_block=n + 1, drafting="separate"),
        fed=torch.zeros(1, 1),
    )
    tokens = cost = steps = verifying = accepted = 0
    for ids, p in pairs:
        sources = [ContextCopies(rates), CorpusDrafts(engine.corpus, rates)]
        context, c = NgramIndex(ids[: p + 1]), p + 1  # the first token comes with the prefill
        tokens, cost, steps = tokens + 1, cost + costs.verify(0), steps + 1
        while c < len(ids):
            best = None  # (rate, source, key, drafts)
            for source in sources:
                key, drafts = source.match(context, n)
                if not drafts:
                    continue
                if oracle:
                    k = common_prefix(drafts, ids[c:])
                    rate = (1 + k) / costs.verify(k) if k else 0.0
                else:
                    k, rate = best_draft(st, source.record(key).survival(len(drafts)), draft_pass=False)
                if k and (best is None or rate > best[0]):
                    best = (rate, source, key, drafts[:k])
            if best is None:
                emitted, step_cost = ids[c : c + 1], costs.verify(0)
            else:
                _, source, key, drafts = best
                a = common_prefix(drafts, ids[c:])
                source.record(key).observe(len(drafts), a)
                emitted, step_cost = ids[c : c + a + 1], costs.verify(len(drafts))
                verifying, accepted = verifying + 1, accepted + a
            tokens, cost, steps = tokens + len(emitted), cost + step_cost, steps + 1
            context.extend(emitted)
            c += len(emitted)
    return {
        "speed_over_ar": round(tokens / cost * costs.verify(0), 3),
        "tokens_per_step": round(tokens / steps, 3),
        "accepted_per_verifying_step": round(accepted / max(verifying, 1), 3),
    }


def coverage(pairs) -> dict:
    counts = dict.fromkeys(["copy", "copy_right", "corpus", "corpus_right", "any_right"], 0)
    positions = 0
    for ids, p in pairs:
        context = NgramIndex(ids[:p])
        for c in range(p, len(ids)):
            right = False
            for name, (_, drafts) in (
                ("copy", context.match(n)),
                ("corpus", engine.corpus.match(context.tokens, n)),
            ):
                counts[name] += bool(drafts)
                counts[f"{name}_right"] += bool(drafts) and drafts[0] == ids[c]
                right |= bool(drafts) and drafts[0] == ids[c]
            counts["any_right"] += right
            positions += 1
            context.extend([ids[c]])
    return {k: round(v / positions, 3) for k, v in counts.items()} | {"positions": positions}


held_out, calibration = answers([args.held_out]), answers(args.calibration)
rates = free_draft_rates(SimpleNamespace(pairs=lambda: calibration), engine.corpus, n)
costs = measured_costs(engine.model)


def cheaper(cut: float) -> StepCosts:
    return StepCosts(tuple(costs.step[0] + (s - costs.step[0]) * (1 - cut) for s in costs.step), costs.passes)


print(
    json.dumps(
        {
            "held_out": args.held_out,
            "calibration": args.calibration,
            "dtype": args.dtype,
            "cost_curve_over_one_row": [round(s / costs.step[0], 3) for s in costs.step],
            "coverage": coverage(held_out),
            "policy": simulate(held_out, rates, costs),
            "oracle": simulate(held_out, rates, costs, oracle=True),
            "cheaper_rows": {cut: simulate(held_out, rates, cheaper(cut)) for cut in (0.25, 0.5)},
        },
        indent=1,
    )
)
