"""`yue distill`'s closing report: `verified` against `ar` on the run's own test split, and tau against
training tokens, as JSON, a PNG and a few printed lines.

Design decisions:
- Speed is a ratio measured in one run on the same weights and prompts (docs/design.md §6): the folder
  just written is loaded as a user would (`yue.load`), both modes decode each test prompt greedily,
  alternating which goes first, after one untimed warm-up of each; tokens/s are totals over the
  prompts. `verified` must give `ar`'s tokens: the count of identical outputs is reported, not assumed.
- Accepted drafts per verifying step: accepted draft tokens over the steps that verified drafts
  (`GenerationStats.accept_lengths`), over the test prompts.
- The plot needs matplotlib (the `bench` extra); without it the JSON is written and the log says why.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from yue.engine import load as load_engine

log = logging.getLogger(__name__)

BENCH_NEW_TOKENS = 96
MIN_PROMPTS = 2
MIN_NEW_TOKENS = 16


def bench_heldout(
    folder: str | Path,
    chats: list[list[dict]],
    instruct: bool,
    device: str,
    seconds: float,
    max_new_tokens: int = BENCH_NEW_TOKENS,
) -> dict:
    """Greedy `ar` and `verified` on the test prompts (chat turns, or texts to continue for a base
    model) within about `seconds` (at least `MIN_PROMPTS` prompts)."""
    engine = load_engine(str(folder), device=device)
    prompts = [engine.chat_prompt(m) if instruct else _fit(engine, m[-1]["content"]) for m in chats]
    for mode in ("ar", "verified"):  # warm-up: kernels, the step-cost measurement, caches
        engine.generate(min(prompts, key=len), mode=mode, max_new_tokens=MIN_NEW_TOKENS, temperature=0.0)
    totals = {m: {"tokens": 0, "s": 0.0} for m in ("ar", "verified")}
    identical = accepted = verifying_steps = forwards = 0
    histogram: dict[int, int] = {}
    deadline, done = time.perf_counter() + seconds, 0
    for i, prompt in enumerate(prompts):
        if done >= MIN_PROMPTS and time.perf_counter() > deadline:
            break
        new_tokens = min(max_new_tokens, engine.context_length - engine.count_tokens(prompt))
        if new_tokens < MIN_NEW_TOKENS:  # a long text in a short context (a tiny test model's)
            continue
        out = {}
        for mode in ("ar", "verified") if i % 2 == 0 else ("verified", "ar"):
            t0 = time.perf_counter()
            out[mode] = engine.generate(prompt, mode=mode, max_new_tokens=new_tokens, temperature=0.0)
            totals[mode]["s"] += time.perf_counter() - t0
            totals[mode]["tokens"] += len(out[mode].token_ids)
        identical += out["ar"].token_ids == out["verified"].token_ids
        stats = out["verified"].stats
        accepted += stats.accepted
        verifying_steps += len(stats.accept_lengths)
        forwards += stats.forwards
        for n in stats.accept_lengths:
            histogram[n] = histogram.get(n, 0) + 1
        done += 1
    if not done:
        raise ValueError(
            f"no test prompt leaves {MIN_NEW_TOKENS} tokens in a {engine.context_length}-token context"
        )
    speed = {m: t["tokens"] / max(t["s"], 1e-9) for m, t in totals.items()}
    return {
        "split": "test (held out: never trained on, nothing chosen on it)",
        "prompts": done,
        "max_new_tokens": max_new_tokens,
        "identical_to_ar": identical,
        "ar_tok_s": round(speed["ar"], 2),
        "verified_tok_s": round(speed["verified"], 2),
        "verified_over_ar": round(speed["verified"] / max(speed["ar"], 1e-9), 3),
        "accepted_per_verifying_step": round(accepted / max(verifying_steps, 1), 3),
        "verifying_steps": verifying_steps,
        "tokens_per_forward_verified": round(totals["verified"]["tokens"] / max(forwards, 1), 3),
        "accept_length_histogram": dict(sorted(histogram.items())),
    }


def _fit(engine, text: str) -> str:
    """A text to continue, cut to half the context as the training texts are (`DistillCampaign._encode`)."""
    ids, cap = engine.encode(text), engine.context_length // 2
    if len(ids) <= cap:
        return text
    return engine.tokenizer.decode(ids[len(engine.tokenizer.prompt_prefix) : cap])


def format_report(report: dict) -> str:
    """The lines `yue distill` prints at the end."""
    b, plan, curve = report["heldout_bench"], report["plan"], report["tau_curve"]
    last = curve[-1] if curve else {}
    lines = [
        f"yue distill {report['model']} -> {report['out']} ({report['kind']}, {report['device']})",
        f"  NAR set: top {plan['nar_layers']} layers, K = {plan['block_size']}, drafting vocabulary "
        f"{plan['draft_vocab_size']:,} (calibration coverage {report['drafting_vocabulary']['coverage_calibration']:.1%})",
        f"  data: {report['data']['prompts']} prompts, {report['data']['answer_tokens']:,} answer tokens; "
        f"spent {', '.join(f'{k} {v:.0f} s' for k, v in report['spent_s'].items())}",
        f"  tau (teacher-forced, test split): {curve[0].get('tau_test', float('nan')):.3f} untrained -> "
        f"{last.get('tau_test', float('nan')):.3f} after {last.get('tokens_seen', 0):,} training tokens",
        f"  test split, {b['prompts']} prompts: verified {b['verified_tok_s']} tok/s / ar {b['ar_tok_s']} tok/s "
        f"= {b['verified_over_ar']}x; accepted drafts per verifying step {b['accepted_per_verifying_step']}; "
        f"identical to ar {b['identical_to_ar']}/{b['prompts']}",
    ]
    return "\n".join(lines)


def write_report(report: dict, out: str | Path) -> str:
    """OUT/distill_report.json, OUT/distill_report.png (if matplotlib is there); returns the text."""
    out = Path(out)
    (out / "distill_report.json").write_text(json.dumps(report, indent=2) + "\n")
    try:
        plot_report(report, out / "distill_report.png")
    except ImportError:
        log.warning("no plot: matplotlib is missing (pip install 'yue-mot[bench]')")
    return format_report(report)


def plot_report(report: dict, path: Path) -> None:
    """tau on both held-out splits against training tokens; the bench's ratio in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve, b = report["tau_curve"], report["heldout_bench"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for split, style in (("test", "o-"), ("calibration", "s--")):
        points = [(r["tokens_seen"], r[f"tau_{split}"]) for r in curve if f"tau_{split}" in r]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=f"{split} split")
    ax.set_xlabel("training answer tokens")
    ax.set_ylabel("tau (tokens per verifying step, full block)")
    ax.set_title(
        f"{Path(report['model']).name}: verified / ar = {b['verified_over_ar']}x, "
        f"{b['accepted_per_verifying_step']} accepted per verifying step",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
