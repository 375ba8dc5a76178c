"""`yue profile`: where a verifying step's wall time goes, as fractions of an `ar` step of the same run.

Design decisions:
- The decode loop books each step's phases by name when a profile is active (`decode/profile.py`:
  the step's inputs, the forward by its fed positions, acceptance, each draft source, the cache commit,
  the step's bookkeeping); this module runs the modes over one prompt set under a profile each and
  divides.
- The unit is the mean wall time of a decode step of `ar` in the same run, on the same prompts, loaded
  model and threads: a verifying step's phases read as "this much of an `ar` step", so a drafting cost
  of 0.15 means what the issue's target means, whatever the machine.
- Modes are interleaved per prompt (in an order rotated every prompt) after one warm-up request each,
  so drift on a shared machine hits them alike, as `yue bench` does.
- What the loop does not book (the engine's detokenizing and stop strings, the batch's own upkeep) is
  "other": a request's wall time less its profiled steps, per decode step.
- The prompts are `yue bench`'s default held-out set for the model (`prompts.default_files`), or a file.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from yue.bench.prompts import prompt_sets
from yue.decode.profile import PREFILL, profiling

FORWARD = "forward:"  # the prefix of a forward phase's name (`decode/profile.py`)


@dataclass(frozen=True)
class ProfileConfig:
    """What `yue profile` runs. Validated once; bad values raise ValueError naming the field.

    Attributes:
        model: a model name or path (None = the default model).
        dtype: its precision, as `yue.load` takes it ("float32", "int4", ...).
        prompts: a JSONL prompt file (as `yue bench --prompts`); None = the model's held-out set.
        modes: the decode modes to profile; the first must be "ar" (the unit).
        limit: use the first `limit` prompts.
        max_new_tokens: tokens generated per prompt.
        threads: torch intra-op threads.
        temperature: 0 = greedy; every mode alike.
        top_p: nucleus mass, every mode alike.
        seed: prompt i is sampled with seed + i.
        repeats: passes over the prompts.
    """

    model: str | None = None
    dtype: str = "float32"
    prompts: str | None = None
    modes: tuple[str, ...] = ("ar", "verified")
    limit: int = 12
    max_new_tokens: int = 128
    threads: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    repeats: int = 1

    def __post_init__(self) -> None:
        if not self.modes or self.modes[0] != "ar" or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes must start with ar (the unit) and repeat none, got {list(self.modes)}")
        for name in ("limit", "max_new_tokens", "threads", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class ModeTotals:
    """A mode's sums over the run: tokens, wall seconds, and its profile's phases and steps."""

    tokens: int = 0
    wall_s: float = 0.0
    steps: int = 0
    seconds: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)


def run_profile(cfg: ProfileConfig, log: Callable[[str], None] = lambda s: None) -> dict:
    """Run every mode over the prompts under a profile; returns the JSON document (`document`)."""
    import torch

    import yue

    torch.set_num_threads(cfg.threads)
    engine = yue.load(cfg.model, dtype=cfg.dtype)
    prompts = prompt_sets(engine, cfg.prompts, None, cfg.limit)[0]
    kw = dict(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
    for mode in cfg.modes:  # warm-up (the verified mode's step costs are measured here, once)
        engine.generate(prompts.prompts[0].text, mode=mode, seed=cfg.seed, **kw)
    totals = {m: ModeTotals() for m in cfg.modes}
    for r in range(cfg.repeats):
        for i, p in enumerate(prompts.prompts):
            log(f"repeat {r + 1}/{cfg.repeats} prompt {i + 1}/{len(prompts.prompts)}")
            k = (i + r) % len(cfg.modes)
            for mode in cfg.modes[k:] + cfg.modes[:k]:
                _profile_one(engine, p.text, mode, cfg.seed + i, kw, totals[mode])
    head = {"model": engine.name, "dtype": cfg.dtype, "threads": cfg.threads, "temperature": cfg.temperature}
    head |= {"prompt_set": prompts.name, "split": prompts.split, "prompts": len(prompts.prompts)}
    return head | {"repeats": cfg.repeats, "max_new_tokens": cfg.max_new_tokens} | document(totals)


def _profile_one(engine, text: str, mode: str, seed: int, kw: dict, into: ModeTotals) -> None:
    """One request of `mode` under a profile, added to `into`."""
    with profiling() as prof:
        t0 = time.perf_counter()
        result = engine.generate(text, mode=mode, seed=seed, **kw)
        wall = time.perf_counter() - t0
    into.tokens += len(result.token_ids)
    into.wall_s += wall
    into.steps += prof.steps
    into.seconds.update(prof.seconds)
    into.calls.update(prof.calls)
    # Not booked by the loop: the engine's text work and the batch's upkeep, over the request.
    into.seconds["other"] += wall - sum(prof.seconds.values())
    into.calls["other"] += prof.steps


def document(totals: dict[str, ModeTotals]) -> dict:
    """The profile as JSON values: per mode its speed and, per decode step, each phase's mean time as a
    fraction of an `ar` decode step (`of_ar_step`); forwards by fed positions; the summary the issue
    asks for (drafting's share of an `ar` step, a verifying step's cost, speed against `ar`)."""
    ar = totals["ar"]
    unit = _decode_seconds(ar) / max(ar.steps, 1)  # seconds of one ar decode step
    modes = {name: _mode_document(t, unit) for name, t in totals.items()}
    summary = {}
    for name, t in totals.items():
        if name == "ar" or not t.steps:
            continue
        drafting = sum(v for k, v in t.seconds.items() if k.startswith("draft:")) / t.steps
        summary[name] = {
            "drafting_of_ar_step": round(drafting / unit, 4),
            "step_of_ar_step": round(_decode_seconds(t) / t.steps / unit, 4),
            "tokens_per_step": round(modes[name]["tokens_per_step"], 4),
            "speed_vs_ar": round(modes[name]["tokens_per_s"] / modes["ar"]["tokens_per_s"], 4),
        }
    return {"ar_step_ms": round(unit * 1e3, 4), "modes": modes, "summary": summary}


def _decode_seconds(t: ModeTotals) -> float:
    """Seconds of a mode's decode steps: every booked phase but the prefill steps', "other" included."""
    return sum(v for k, v in t.seconds.items() if not k.startswith(PREFILL))


def _mode_document(t: ModeTotals, unit: float) -> dict:
    """One mode's figures (see `document`)."""
    steps = max(t.steps, 1)
    phases = {
        k: {
            "ms_per_step": round(v / steps * 1e3, 4),
            "of_ar_step": round(v / steps / unit, 4),
            "share_of_steps": round(t.calls[k] / steps, 4),
        }
        for k, v in sorted(t.seconds.items())
        if not k.startswith((PREFILL, FORWARD))
    }
    forwards = {
        int(k.removeprefix(FORWARD)): {
            "calls": t.calls[k],
            "share_of_steps": round(t.calls[k] / steps, 4),
            "ms": round(v / t.calls[k] * 1e3, 4),
            "of_ar_step": round(v / t.calls[k] / unit, 4),
        }
        for k, v in t.seconds.items()
        if k.startswith(FORWARD)
    }
    prefill = sum(v for k, v in t.seconds.items() if k.startswith(PREFILL))
    return {
        "tokens": t.tokens,
        "tokens_per_s": t.tokens / t.wall_s if t.wall_s else 0.0,
        "decode_steps": t.steps,
        "tokens_per_step": t.tokens / steps,
        "step_ms": round(_decode_seconds(t) / steps * 1e3, 4),
        "prefill_ms_total": round(prefill * 1e3, 2),
        "phases": phases,
        "forward_by_positions": dict(sorted(forwards.items())),
    }


def table(doc: dict) -> str:
    """The profile as plain text: per mode, each phase per decode step as a fraction of an `ar` step."""
    lines = [
        f"yue profile: {doc['model']} {doc['dtype']}, {doc['prompt_set']} ({doc['split']}, {doc['prompts']} "
        f"prompts), {doc['max_new_tokens']} tokens, threads={doc['threads']}, T={doc['temperature']}; "
        f"unit: one ar decode step = {doc['ar_step_ms']:.3f} ms"
    ]
    for name, m in doc["modes"].items():
        lines.append(
            f"{name}: {m['tokens_per_s']:.1f} tok/s, {m['tokens_per_step']:.2f} tokens/step, "
            f"step = {m['step_ms'] / doc['ar_step_ms']:.3f} ar steps"
        )
        for phase, v in m["phases"].items():
            share = v["share_of_steps"]
            runs = (
                ""
                if share >= 1.0 or phase == "other"
                else f" a step ({v['of_ar_step'] / share:.3f} a call, in {share:.2f} of steps)"
            )
            lines.append(f"  {phase:<22} {v['of_ar_step']:7.3f}{runs}")
        for n, v in m["forward_by_positions"].items():
            lines.append(
                f"  forward {n:>3} positions  {v['of_ar_step']:7.3f} a call, in {v['share_of_steps']:.2f} of steps"
            )
    for name, s in doc["summary"].items():
        lines.append(
            f"{name}: drafting {s['drafting_of_ar_step']:.3f} of an ar step; a step {s['step_of_ar_step']:.3f}; "
            f"{s['tokens_per_step']:.2f} tokens a step; {s['speed_vs_ar']:.3f}x ar"
        )
    return "\n".join(lines)
