"""What `verified` ÷ `ar` bigger models would get with today's drafts: a SIMULATION, not a measurement
(issue 59, item 8; a development script, not part of the package).

    python docs/recipes/size_forecast.py [--curves SIZES.json] [--curve NAME=r1,...,r9[:draft]] ...
        [--models yue-smol,yue-code-mini,gemma-3-270m] [--prompts 20] [--tokens 64]
        [--traces-out T.json | --traces-in T.json]

1. Traces (real): each small model decodes its held-out prompts greedily in `verified` (chat models:
   `yue/assets/chat_test.jsonl`; yue-code-mini: `code_test.jsonl`; one thread), and every step is
   recorded as the engine ran it: the source of the drafts it verified (context copies, the corpus
   table, the NAR set, or none), drafted k, accepted, tokens written, and whether a drafting pass of
   the NAR set ran after it. The same prompts in `ar` are timed too, and their tokens checked equal.
2. Pricing (simulated): a step verifying k drafts costs curve[k + 1] (its k + 1 rows, as a ratio to one
   row); a step after which the NAR set drafted costs the drafting pass on top (as a fraction of an
   `ar` step: every pass that ran is charged, also one whose drafts were then declined). The prefill
   is left out of both modes. `ar` writes a token per curve[1] = 1, so the forecast is
       verified ÷ ar = tokens / sum of the steps' simulated costs.
3. Curves: `yue bench-sizes`'s JSON (`--curves`: per shape, per peer, the ratio of a step with 1..9
   rows to one row), `--curve` on the command line, and each traced model's own measured curve
   (`decode/costs.py`: a sanity check against its measured `verified` ÷ `ar`).

What it cannot know, stated in the output:
- the drafts are the small models' (their acceptance, their draft lengths, chosen by the router under
  the small model's own cost curve: at a bigger size the router would weigh the bigger curve);
- a drafting pass at a size no one has built a NAR set for is assumed to cost (the traced model's NAR
  layers / its layers) x (the size's layer share of the weights streamed) + the size's head share,
  times curve[K] for its K slots (a step streams its weights; the NAR set sits on the top layers and
  has the model's head: yue-smol's 4 of 30 layers; yue-code-mini's NAR set is all 4 of its 4);
- Python overhead per step is not priced (at 1B+ a step is tens of ms, the overhead well under 1 ms).
The last line is one JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from yue.bench import gguf_shapes

HEADER = (
    "SIMULATION, not a measurement: the acceptance traces are the small models' own (real `verified` "
    "runs on held-out prompts), the step costs are another model's cost curve; the forecast prices the "
    "one with the other."
)
TOP_NAR_SHARE = 4 / 30  # yue-smol's NAR set: its top 4 of 30 layers
ROWS = 9  # a verifying step's rows: 1 (a plain AR step) .. 9 (K = 8 drafts)

# Q4_K_M's bytes per weight (llama.cpp `llama_tensor_get_type`, as `yue/bench/gguf_shapes.py` writes
# the random-weight files): Q4_K 144 B / 256 weights, Q6_K 210 B / 256 for `output`, a tied head, and
# `attn_v` / `ffn_down` in the layers `use_more_bits` names.
Q4K, Q6K = 144 / 256, 210 / 256


def head_share(shape: str) -> float:
    """The head's share of the bytes a one-row step streams, for a `gguf_shapes` shape (its Q4_K_M-like
    file: `gguf_shapes.bytes_per_token`; an untied embedding table is read a row at a time)."""
    s = gguf_shapes.SHAPES[shape]
    head = "token_embd.weight" if s.tied else "output.weight"
    head_bytes = next(t.nbytes for t in gguf_shapes.tensor_specs(s) if t.name == head)
    return head_bytes / gguf_shapes.bytes_per_token(s)


@dataclass(frozen=True)
class Curve:
    """A cost curve: `rows[i]` = a step over i + 1 rows / a one-row step (rows[0] = 1), and the
    drafting pass as a fraction of an `ar` step (None: derived from `shape`, see `drafting_cost`).

    Attributes:
        name: how the table names it ("llama-3.2-1b/yue", "yue-smol (own, measured)").
        rows: ratios for 1..n rows; past n, extrapolated linearly from the last two (`row_cost`).
        draft: the drafting pass / an `ar` step, when known (measured, or given with `:draft`).
        shape: the model shape whose head share prices a derived drafting pass.
        note: how the curve was made (measured, interpolated), printed with the table.
    """

    name: str
    rows: tuple[float, ...]
    draft: float | None = None
    shape: str | None = None
    note: str = ""


def row_cost(rows: tuple[float, ...] | list[float], n: int) -> float:
    """The cost of a step over n rows (n >= 1): rows[n - 1], past the curve's end extrapolated linearly
    from its last two points."""
    if n <= len(rows):
        return rows[n - 1]
    slope = rows[-1] - rows[-2] if len(rows) > 1 else 0.0
    return rows[-1] + (n - len(rows)) * max(slope, 0.0)


def interpolate(points: dict[int, float], rows: int = ROWS) -> tuple[float, ...]:
    """Ratios for 1..rows rows from measured (rows -> ratio) points, 1 -> 1.0 added: linear between
    points, past the last extrapolated from the last two."""
    pts = sorted({1: 1.0, **points}.items())
    out = []
    for n in range(1, rows + 1):
        lo = max((p for p in pts if p[0] <= n), key=lambda p: p[0])
        hi = min((p for p in pts if p[0] >= n), key=lambda p: p[0], default=None)
        if hi is None:
            (r0, c0), (r1, c1) = pts[-2], pts[-1]
            out.append(c1 + (n - r1) * (c1 - c0) / (r1 - r0))
        elif hi[0] == lo[0]:
            out.append(lo[1])
        else:
            out.append(lo[1] + (n - lo[0]) * (hi[1] - lo[1]) / (hi[0] - lo[0]))
    return tuple(round(x, 4) for x in out)


def drafting_cost(curve: Curve, nar_share: float, slots: int) -> float | None:
    """The drafting pass / an `ar` step under `curve`: measured or given (`curve.draft`), else derived
    for the curve's shape: (nar_share x the layers' share of the bytes + the head's share) x
    curve[slots] (the pass feeds `slots` positions through the NAR layers and the head). None: neither
    known."""
    if curve.draft is not None:
        return curve.draft
    if curve.shape not in gguf_shapes.SHAPES:
        return None
    head = head_share(curve.shape)
    return (nar_share * (1 - head) + head) * row_cost(curve.rows, slots)


def price(steps: list[dict], rows: tuple[float, ...] | list[float], draft: float) -> dict:
    """Re-price a trace under a cost curve.

    Args:
        steps: per step {"drafted": k, "tokens": written, "draft_pass": bool, "prefill": bool}; a prefill
            step's forward is not priced (both modes pay it), its drafting pass is.
        rows: the curve (ratios to one row for 1.. rows).
        draft: a drafting pass's cost as a fraction of an `ar` step.
    Returns:
        {"tokens", "cost" (in `ar` steps), "verified_over_ar"}: tokens per unit of cost over `ar`'s one
        token per one-row step (rows[0]).
    """
    tokens, cost = 0, 0.0
    for s in steps:
        if not s.get("prefill"):
            tokens += s["tokens"]
            cost += row_cost(rows, s["drafted"] + 1)
        if s["draft_pass"]:
            cost += draft
    ratio = tokens / cost * rows[0] if cost else 0.0
    return {"tokens": tokens, "cost": round(cost, 3), "verified_over_ar": round(ratio, 3)}


def needed_acceptance(rows: tuple[float, ...], draft: float | None, target: float = 1.5) -> dict:
    """Per draft length k = 1..8, the accepted drafts a step needs on average for `target` x `ar`:
    (1 + a) / (curve[k + 1] + pass) >= target; free drafts pay no pass, NAR drafts one a step (None
    where even k accepted of k fall short)."""

    def need(k: int, extra: float) -> float | None:
        a = target * (row_cost(rows, k + 1) + extra) - 1
        return round(a, 2) if a <= k else None

    out = {"free": {k: need(k, 0.0) for k in range(1, ROWS)}}
    if draft is not None:
        out["nar"] = {k: need(k, draft) for k in range(1, ROWS)}
    return out


def without_nar(steps: list[dict]) -> list[dict]:
    """The trace with the NAR set taken out (a counterfactual, approximate): each step that verified
    NAR drafts becomes one `ar` step per token it wrote, and no drafting pass runs; the free drafts'
    steps stay as they ran (where the NAR set drafted, a free draft might have, which this ignores)."""
    out = []
    for s in steps:
        if s["source"] == "nar" and not s.get("prefill"):
            ar_step = {**s, "source": "", "drafted": 0, "accepted": 0, "tokens": 1, "draft_pass": False}
            out += [ar_step] * s["tokens"]
        else:
            out.append({**s, "draft_pass": False})
    return out


def by_source(steps: list[dict]) -> dict:
    """Per draft source: verifying steps, mean drafted, mean accepted, share of the tokens written."""
    tokens = sum(s["tokens"] for s in steps if not s.get("prefill")) or 1
    out = {}
    for name in ("copy", "corpus", "nar", ""):
        ss = [s for s in steps if s["source"] == name and not s.get("prefill")]
        if not ss:
            continue
        out[name or "none"] = {
            "steps": len(ss),
            "drafted": round(statistics.mean(s["drafted"] for s in ss), 2),
            "accepted": round(statistics.mean(s["accepted"] for s in ss), 2),
            "token_share": round(sum(s["tokens"] for s in ss) / tokens, 3),
        }
    return out


# --------------------------------------------------------------------------------------------------
# Curves from the command line and from `yue bench-sizes`'s JSON.


def parse_curve(arg: str) -> Curve:
    """NAME=r1,...,rn[:draft] -> a Curve (NAME "shape/peer" names a shape for a derived drafting pass)."""
    name, _, rest = arg.partition("=")
    ratios, _, draft = rest.partition(":")
    try:
        rows = tuple(float(x) for x in ratios.split(","))
        d = float(draft) if draft else None
    except ValueError as e:
        raise ValueError(f"--curve {arg!r}: expected NAME=r1,...,r9[:draft] ({e})") from None
    if not name or len(rows) < 2 or rows[0] <= 0:
        raise ValueError(f"--curve {arg!r}: expected NAME=r1,...,r9[:draft], r1 > 0")
    rows = tuple(r / rows[0] for r in rows)
    return Curve(name, rows, d, name.split("/")[0], "from the command line")


def _ratio_list(value) -> list[float] | None:
    """A list of row-cost ratios inside a peer's entry: the list itself, or under a key that holds it."""
    if isinstance(value, list) and len(value) >= 2 and all(isinstance(x, int | float) for x in value):
        return [float(x) for x in value]
    if isinstance(value, dict):
        for key in ("ratio_to_1_row", "row_cost", "row_costs", "rows_ratio", "ratios", "step_cost"):
            if key in value and (found := _ratio_list(value[key])) is not None:
                return found
    return None


def load_curves(path: str | Path) -> list[Curve]:
    """Curves from `yue bench-sizes`'s JSON: {shape: {peer: ratios or {..., ratios, "drafting_pass"?,
    "note"?}}}, optionally under a top-level "shapes" or "row_costs" key; the example file's form too
    (`size_curves_example.json`). A peer entry may name its measured points instead ({"points":
    {"2": 1.15, ...}}), which are interpolated (and say so)."""
    doc = json.loads(Path(path).read_text())
    for key in ("shapes", "row_costs", "curves"):
        if isinstance(doc.get(key), dict):
            doc = doc[key]
            break
    curves = []
    for shape, peers in doc.items():
        if not isinstance(peers, dict) or shape.startswith("_"):
            continue
        for peer, entry in peers.items():
            note, draft = "", None
            if isinstance(entry, dict):
                note, draft = entry.get("note", ""), entry.get("drafting_pass")
            rows = _ratio_list(entry)
            if rows is None and isinstance(entry, dict) and isinstance(entry.get("points"), dict):
                rows = list(interpolate({int(k): float(v) for k, v in entry["points"].items()}))
                note = note or "measured points, linearly interpolated between"
            if rows is None:
                continue
            rows = [r / rows[0] for r in rows]
            curves.append(Curve(f"{shape}/{peer}", tuple(round(r, 4) for r in rows), draft, shape, note))
    if not curves:
        raise ValueError(f"{path}: no row-cost curves found (expected shape -> peer -> ratios)")
    return curves


# --------------------------------------------------------------------------------------------------
# Traces: real `verified` runs of the small models.


def collect(name: str, n_prompts: int, tokens: int) -> dict:
    """Decode `n_prompts` held-out prompts of model `name` greedily in `verified` and in `ar`; per
    verified step its source, drafted, accepted, tokens and drafting pass; both modes' decode seconds
    (prefill excluded); the model's own measured cost curve."""
    import torch

    import yue
    from yue.bench.prompts import load_prompts
    from yue.errors import ModelNotInstalledError
    from yue.registry import ASSETS

    torch.set_num_threads(1)
    try:
        engine = yue.load(name)
    except ModelNotInstalledError as e:
        return {"model": name, "skipped": str(e)}
    if not engine.has_nar_set:
        return {"model": name, "skipped": f"{name} loads as an AR set only: `verified` needs a NAR set"}
    split = "code_test" if name == "yue-code-mini" or not engine.instruct else "chat_test"
    prompts = [p.ids for p in load_prompts(ASSETS / f"{split}.jsonl", engine, n_prompts)]
    _, cfg = engine.request(prompts[0], None, {"mode": "verified", "max_new_tokens": tokens})
    _, ar_cfg = engine.request(prompts[0], None, {"mode": "ar", "max_new_tokens": tokens})
    costs = engine._costs(cfg)  # the model's measured curve, as its router weighs it
    run(engine, prompts[0], cfg), run(engine, prompts[0], ar_cfg)  # warm-up
    runs = []
    for ids in prompts:
        v, a = run(engine, ids, cfg), run(engine, ids, ar_cfg)
        runs.append(
            {"steps": v["steps"], "equal": v["ids"] == a["ids"], "verified_s": v["s"], "ar_s": a["s"]}
        )
    config = engine.model.config
    nar_layers = config.num_hidden_layers if config.nar_layers is None else config.nar_layers
    own = Curve(
        f"{name} (own, measured)",
        tuple(round(costs.verify(k) / costs.verify(0), 4) for k in range(ROWS)),
        round(costs.draft_pass(cfg.draft_block) / costs.verify(0), 4),
        note="this model's measured curve (decode/costs.py), this machine",
    )
    return {
        "model": name,
        "prompts": f"{split}.jsonl, first {len(prompts)}, {tokens} new tokens, greedy, 1 thread",
        "nar_share": nar_layers / config.num_hidden_layers,
        "slots": cfg.draft_block,
        "own_curve": own.__dict__,
        "runs": runs,
    }


def run(engine, ids: list[int], cfg) -> dict:
    """One request through the engine's decode batch: its ids, decode seconds after the prefill step,
    and per step (source of the drafts it verified, read from the loop's state after the step before)."""
    batch = engine.decode_batch(cfg)
    batch.add(ids, cfg)
    out, steps, source, seconds = [], [], "", 0.0
    while len(batch):
        t0 = time.perf_counter()
        emissions = batch.step()
        dt = time.perf_counter() - t0
        for em in emissions:
            seconds += dt if steps else 0.0
            drafted = em.drafted[0]
            steps.append(
                {
                    "source": source if drafted else "",
                    "drafted": drafted,
                    "accepted": em.accepted[0],
                    "tokens": len(em.tokens[0]),
                    "draft_pass": em.forwards == 2,
                    "prefill": not steps,
                }
            )
            out += em.tokens[0]
        g = batch.running  # the drafts fed to the next step: free ones' record, else the NAR block's
        source = g.st.drafts.verifying.source if g is not None and g.st.max_drafts else ""
    return {"ids": out, "steps": steps, "s": seconds}


# --------------------------------------------------------------------------------------------------
# The report.


def forecast(trace: dict, curves: list[Curve], nar_share: float | None = None) -> list[dict]:
    """One row per curve (the model's own first): the priced trace, the drafting pass it assumed.

    Args:
        trace: `collect`'s record of one model.
        curves: the bigger models' curves.
        nar_share: the NAR set's share of the layers that prices a derived drafting pass; None = the
            traced model's own (yue-smol 4/30, yue-code-mini 4/4).
    """
    steps = [s for r in trace["runs"] for s in r["steps"]]
    own = Curve(**{**trace["own_curve"], "rows": tuple(trace["own_curve"]["rows"])})
    share = trace["nar_share"] if nar_share is None else nar_share
    rows = []
    for curve in [own, *curves]:
        draft = drafting_cost(curve, share, trace["slots"])
        if draft is None:
            rows.append({"curve": curve.name, "skipped": "no drafting pass cost: give NAME=...:draft"})
            continue
        priced = price(steps, curve.rows, draft)
        free = price(without_nar(steps), curve.rows, draft)
        rows.append(
            {
                "curve": curve.name,
                "rows_2_3_5_9": [round(row_cost(curve.rows, n), 2) for n in (2, 3, 5, 9)],
                "draft_pass": round(draft, 3),
                **priced,
                "without_nar": free["verified_over_ar"],
                "needed_for_1.5x": needed_acceptance(curve.rows, draft),
                "note": curve.note,
            }
        )
    return rows


def table(trace: dict, rows: list[dict]) -> str:
    runs = trace["runs"]
    steps = [s for r in runs for s in r["steps"] if not s["prefill"]]
    measured = sum(r["ar_s"] for r in runs) / sum(r["verified_s"] for r in runs)
    lines = [
        f"## {trace['model']}: {trace['prompts']}; {len(steps)} steps, "
        f"{sum(s['tokens'] for s in steps) / len(steps):.2f} tokens/step; verified == ar on "
        f"{sum(r['equal'] for r in runs)}/{len(runs)} prompts; measured verified ÷ ar here {measured:.2f}",
        "by source: "
        + "; ".join(
            f"{k}: {v['steps']} steps, drafted {v['drafted']}, accepted {v['accepted']}, {v['token_share']:.0%} of tokens"
            for k, v in by_source([s for r in runs for s in r["steps"]]).items()
        ),
        "| curve | rows 2/3/5/9 | drafting pass | verified ÷ ar | without the NAR set |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['curve']} | {r['skipped']} | | | |")
            continue
        costs = "/".join(f"{c:.2f}" for c in r["rows_2_3_5_9"])
        lines.append(
            f"| {r['curve']} | {costs} | {r['draft_pass']:.3f} | **{r['verified_over_ar']:.2f}** | {r['without_nar']:.2f} |"
        )
    return "\n".join(lines)


def example_curves() -> list[Curve]:
    here = Path(__file__).with_name("size_curves_example.json")
    return load_curves(here)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--curves", action="append", default=[], help="yue bench-sizes JSON (repeatable)")
    p.add_argument("--curve", action="append", default=[], help="NAME=r1,...,r9[:draft] (repeatable)")
    p.add_argument("--models", default="yue-smol,yue-code-mini,gemma-3-270m")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--traces-out", help="save the traces (JSON) to price them again without decoding")
    p.add_argument("--traces-in", help="traces saved by --traces-out: no decoding")
    p.add_argument(
        "--nar-share",
        type=float,
        default=TOP_NAR_SHARE,
        help="the NAR set's share of a bigger model's layers, pricing its drafting pass (default: yue-smol's "
        "top 4 of 30, the design a 1B NAR set would follow; 0 = the traced model's own share)",
    )
    args = p.parse_args()
    curves = [c for f in args.curves for c in load_curves(f)] + [parse_curve(a) for a in args.curve]
    if not curves:
        curves = example_curves()
        print("no --curves / --curve given: using docs/recipes/size_curves_example.json (issue 59's figures)")
    if args.traces_in:
        traces = json.loads(Path(args.traces_in).read_text())
    else:
        traces = [collect(m, args.prompts, args.tokens) for m in args.models.split(",")]
        if args.traces_out:
            Path(args.traces_out).write_text(json.dumps(traces))
    print(HEADER)
    assumptions = [
        f"drafting pass at a size: (NAR share {args.nar_share or 'of the traced model'} of the layers) x the "
        "layers' share of the bytes + the head's share, x curve[K slots]; the traced model's own curve "
        "uses its measured pass",
        "draft lengths are the small model's router's, chosen under its own curve",
        "curves with missing row counts are interpolated linearly (see each curve's note)",
    ]
    print("assumptions: " + "; ".join(assumptions))
    for c in curves:
        if c.note:
            print(f"curve {c.name}: {c.note}")
    for name in ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-1.5b", "gemma-3-1b"):
        print(f"head share of a step's bytes, {name} (Q4_K_M-like): {head_share(name):.3f}")
    report = {"header": HEADER, "assumptions": assumptions, "models": []}
    for trace in traces:
        if "skipped" in trace:
            print(f"## {trace['model']}: skipped: {trace['skipped']}")
            report["models"].append(trace)
            continue
        rows = forecast(trace, curves, args.nar_share or None)
        print(table(trace, rows))
        runs = trace["runs"]
        report["models"].append(
            {
                "model": trace["model"],
                "prompts": trace["prompts"],
                "by_source": by_source([s for r in runs for s in r["steps"]]),
                "verified_equals_ar": [r["equal"] for r in runs],
                "measured_verified_over_ar": round(
                    sum(r["ar_s"] for r in runs) / sum(r["verified_s"] for r in runs), 3
                ),
                "forecast": rows,
            }
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
