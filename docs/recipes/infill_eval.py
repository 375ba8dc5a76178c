"""Infill (fill-in-the-middle) against left-to-right on held-out third-party code, cut at run time, and
the left-to-right task before and after a FIM fine-tune (issue 63; a measurement script, not part of the
package).

    python docs/recipes/infill_eval.py --fim runs/yue-code-mini-fim/model --base yue-code-mini \\
        [--n 400] [--per-file 3] [--seed 0] [--repeats 3] [--out docs/results/infill-yue-code-mini-2026-12-07.json]

Run timings under `flock /tmp/yue-bench.lock` (the whole script: its quality part is deterministic).

What it measures:
- Source: files of the bench's held-out packages (`yue.bench.devset.HELD_OUT_PACKAGES`: click, jinja2,
  rich, starlette, prometheus_client), found without importing them, up to three cuts per file (distinct
  lines), the packages taking turns, every choice from `random.Random(seed)`. The FIM fine-tune trains on the standard
  library (`recipes/yue_code_mini_fim.py`), so none of this text was trained on.
- A cut: a non-blank line i (4-100 characters, no tab) is the middle line. The prefix is the whole lines
  of up to PREFIX_CHARS before it, ending at the end of line i-1 (before its newline, the cut the bench's code prompts
  use); the suffix is the newline after line i and up to SUFFIX_CHARS after. The middle is "\\n" + line i.
- Infill: the fine-tuned model on its PSM prompt (`Engine.infill`), greedy. Baseline: `ar` on the
  prefix alone (the suffix ignored), greedy, of the base model and of the fine-tuned one. A
  prediction's middle line is its text after one leading newline, up to the next newline.
- Exact-line match (the line equal to the truth, trailing whitespace aside) and corpus chrF of the
  predicted lines against the true lines (sacrebleu, as the bench's chrF).
- `verified` ÷ `ar` speed on the infill prompts (tokens per second over the whole set, `repeats`
  runs, each ratio from one run's pair), and whether `verified` wrote `ar`'s tokens.
- Left-to-right before and after: the AR path's teacher-forced NLL (nats/token) of the held-out
  code prompts' references (`yue/assets/code_test.jsonl`), and `verified` ÷ `ar` speed on those
  prompts, for the base and the fine-tuned model.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import statistics
import time
from pathlib import Path

import torch

import yue
from yue.bench.devset import HELD_OUT, HELD_OUT_PACKAGES, build_held_out
from yue.bench.metrics import ar_nll, chrf
from yue.model.hf import load_model
from yue.registry import resolve

# Context kept on each side, in characters: about 170 and 90 tokens, so a prompt is about as long as the
# 256-token rows yue-code-mini and its FIM fine-tune trained on.
PREFIX_CHARS, SUFFIX_CHARS = 480, 260
_CLEAN = re.compile(r"[\x00-\x08\x0b-\x1f]")


def cut_infill(text: str, rng: random.Random) -> dict[str, str] | None:
    """One {"prefix", "suffix", "line"} cut of a file (module docstring), or None if it has no clean line."""
    lines = text.split("\n")
    ok = [
        i
        for i in range(3, len(lines) - 1)
        if 4 <= len(lines[i].strip())
        and len(lines[i]) <= 100
        and "\t" not in lines[i]
        and not _CLEAN.search(lines[i])
    ]
    if not ok:
        return None
    i = rng.choice(ok)
    prefix = "\n".join(lines[max(0, i - 60) : i])
    if len(prefix) > PREFIX_CHARS:  # whole lines, the training rows' share of 256 tokens
        prefix = prefix[-PREFIX_CHARS:].split("\n", 1)[-1]
    suffix = "\n" + "\n".join(lines[i + 1 : i + 31])
    return {"prefix": prefix, "suffix": suffix[:SUFFIX_CHARS], "line": lines[i]}


def held_out_cuts(n: int, seed: int, per_file: int = 1) -> list[dict[str, str]]:
    """`n` cuts, up to `per_file` from each file of the held-out packages (distinct lines), deterministic
    given `seed` and the packages' versions (`devset.build_held_out`'s rotation over the packages)."""

    def cuts_of(text: str, rng: random.Random) -> list[dict[str, str]]:
        first = cut_infill(text, rng)
        if first is None:
            return []
        more = [cut_infill(text, rng) for _ in range(per_file - 1)]
        return list({(c["prefix"], c["line"]): c for c in [first, *more] if c is not None}.values())

    return build_held_out(n, seed, HELD_OUT_PACKAGES, cut=cuts_of)


def middle_line(text: str) -> str:
    """A generation's middle line: after one leading newline, up to the next one."""
    return (text[1:] if text.startswith("\n") else text).split("\n", 1)[0]


def line_scores(predicted: list[str], truth: list[str]) -> dict:
    """Exact-line matches (trailing whitespace aside) and corpus chrF of predicted against true lines."""
    hits = sum(p.rstrip() == t.rstrip() for p, t in zip(predicted, truth, strict=True))
    return {
        "exact": hits,
        "n": len(truth),
        "exact_rate": round(hits / len(truth), 4),
        "chrf": round(chrf(predicted, truth), 2),
    }


def run_set(engine, prompts: list, mode: str, tokens: int) -> tuple[list, float, int]:
    """Greedy generations of every prompt: (results, seconds, new tokens)."""
    t0 = time.perf_counter()
    results = [engine.generate(p, mode=mode, max_new_tokens=tokens) for p in prompts]
    return results, time.perf_counter() - t0, sum(len(r.token_ids) for r in results)


def speed(engine, prompts: list, tokens: int, repeats: int) -> dict:
    """`verified` ÷ `ar` tokens per second over the set, per repeat (each ratio from one run's pair)."""
    ratios, ar_tps, ver_tps, exact, accepted = [], [], [], None, []
    for mode in ("ar", "verified"):  # warm-up, not timed: each engine's first call measures its costs
        run_set(engine, prompts[:2], mode, tokens)
    for _ in range(repeats):
        ar, t_ar, n_ar = run_set(engine, prompts, "ar", tokens)
        ver, t_ver, n_ver = run_set(engine, prompts, "verified", tokens)
        ar_tps.append(n_ar / t_ar)
        ver_tps.append(n_ver / t_ver)
        ratios.append(ver_tps[-1] / ar_tps[-1])
        exact = sum(a.token_ids == v.token_ids for a, v in zip(ar, ver, strict=True))
        steps = sum(v.stats.forwards - v.stats.draft_passes for v in ver)
        accepted.append(sum(v.stats.new_tokens for v in ver) / max(1, steps))
    return {
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "ar_tok_s": [round(x, 1) for x in ar_tps],
        "verified_tok_s": [round(x, 1) for x in ver_tps],
        "tokens_per_verifying_step": round(statistics.median(accepted), 3),
        "verified_equals_ar": exact,
        "prompts": len(prompts),
        "max_new_tokens": tokens,
        "repeats": repeats,
    }


def infill_quality(fim, base, cuts: list[dict], tokens: int) -> tuple[dict, list, list]:
    """Exact-line match and chrF: the fine-tune's infill, its `ar` on the prefix, the base's `ar` on it."""
    truth = [c["line"] for c in cuts]
    fim_prompts = [fim.infill(c["prefix"], c["suffix"]) for c in cuts]
    infill = [middle_line(r.text) for r in run_set(fim, fim_prompts, "ar", tokens)[0]]
    rows = {"fim_infill": line_scores(infill, truth)}
    for name, engine in (("base_ar_prefix_only", base), ("fim_ar_prefix_only", fim)):
        out = run_set(engine, [engine.encode(c["prefix"]) for c in cuts], "ar", tokens)[0]
        rows[name] = line_scores([middle_line(r.text) for r in out], truth)
    samples = [
        {"source": c["source"], "truth": c["line"], "infill": p} for c, p in zip(cuts, infill, strict=True)
    ]
    return rows, fim_prompts, samples


def middle_nll(fim_path: str, base_path: str, cuts: list[dict]) -> dict:
    """Teacher-forced NLL (nats/token) of the true middle ("\\n" + line): the fine-tune given its FIM
    prompt (prefix and suffix), and each model given the prefix alone."""
    out = {}
    for name, path, with_suffix in (
        ("fim_infill", fim_path, True),
        ("base_prefix_only", base_path, False),
        ("fim_prefix_only", fim_path, False),
    ):
        engine, model = yue.load(path), load_model(resolve(path)).eval()
        tok, total, count = engine.tokenizer, 0.0, 0
        for c in cuts:
            ids = engine.infill(c["prefix"], c["suffix"]) if with_suffix else tok.encode_prompt(c["prefix"])
            nll, n = ar_nll(model, ids, tok.encode("\n" + c["line"]))
            total, count = total + nll, count + n
        out[name] = {"nll_per_token": round(total / count, 4), "tokens": count}
    return out


def left_to_right_nll(model_path: str, records: list[dict]) -> dict:
    """The AR path's teacher-forced NLL (nats/token) of the held-out references after their prompts."""
    tok = yue.load(model_path).tokenizer
    model = load_model(resolve(model_path)).eval()
    total = count = 0.0
    for r in records:
        nll, n = ar_nll(model, tok.encode_prompt(r["prompt"]), tok.encode(r["reference"]))
        total, count = total + nll, count + n
    return {"nll_per_token": round(total / count, 4), "tokens": int(count), "prompts": len(records)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fim", required=True, help="the FIM fine-tuned model folder")
    ap.add_argument("--base", default="yue-code-mini", help="the left-to-right model it was tuned from")
    ap.add_argument("--n", type=int, default=400, help="held-out cuts")
    ap.add_argument("--per-file", type=int, default=3, help="cuts per file (distinct lines)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=48, help="max new tokens of an infill")
    ap.add_argument("--speed-prompts", type=int, default=40, help="infill prompts timed (the first ones)")
    ap.add_argument("--l2r-prompts", type=int, default=16)
    ap.add_argument("--l2r-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quality-only", action="store_true", help="skip the timings and the NLL")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    fim, base = yue.load(a.fim, threads=a.threads), yue.load(a.base, threads=a.threads)
    cuts = held_out_cuts(a.n, a.seed, a.per_file)
    quality, fim_prompts, samples = infill_quality(fim, base, cuts, a.tokens)
    quality["middle_nll"] = middle_nll(a.fim, a.base, cuts)
    if a.quality_only:
        print(json.dumps(quality, indent=2))
        return
    records = [json.loads(ln) for ln in HELD_OUT.read_text().splitlines() if ln.strip()]
    l2r = records[: a.l2r_prompts]
    report = {
        "what": "infill on held-out third-party code cut at run time (docs/recipes/infill_eval.py)",
        "fim_model": a.fim,
        "base_model": a.base,
        "seed": a.seed,
        "cuts": len(cuts),
        "held_out_packages": list(HELD_OUT_PACKAGES),
        "training_source": "stdlib (Lib minus test folders)",
        "threads": a.threads,
        "machine": platform.processor() or platform.machine(),
        "infill_quality": quality,
        "infill_speed_fim": speed(fim, fim_prompts[: a.speed_prompts], a.tokens, a.repeats),
        "left_to_right": {
            "nll_code_test": {
                "base": left_to_right_nll(a.base, records),
                "fim": left_to_right_nll(a.fim, records),
            },
            "speed_code_test": {
                "base": speed(base, [base.encode(r["prompt"]) for r in l2r], a.l2r_tokens, a.repeats),
                "fim": speed(fim, [fim.encode(r["prompt"]) for r in l2r], a.l2r_tokens, a.repeats),
            },
        },
        "samples": samples[:12],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
