"""What a verifying forward costs against its rows, and what a drafting pass costs, on the loaded model:
reported by `yue bench`, and the router's cost model (`StepCosts`, measured once per model shape and
machine and cached; issue 13: not the constants of one model on one CPU).

Design decisions:
- The decode loop's own calls, timed bare: `model.step` over n fed committed rows (no slots; the
  verifying forward of n - 1 drafts plus the bonus row), n = 1..9, and the drafting pass over 2..K
  slots (NAR set only, slot 1 revealed, as `decode/loop.py` runs it; `DecodeConfig.drafting_slots`).
- What an extra row costs depends on what its AR logits serve (`HeadUse`): a greedy step's rows need
  only their argmax (the head's integer screen, where the model has one), a hybrid step's their whole
  logits, a sampled step's their whole logits warped and sampled (the speculative rule reads every row's
  distribution; the timed sampled step runs the speculative rule over its drafts, and every timed
  drafting pass chooses its drafts from its slots, as the loop does). Each use has its own curve, so a sampled request weighs its drafts against what its
  rows cost, not against a greedy row's price. On a CPU a step's cost grows with its
  rows (docs/design.md §8; measured on AVX2 in float32: docs/results-log.md); this curve is what the router's draft
  length should follow, measured on the machine and model at hand.
- Each step runs on a cache already holding a context of ~200 committed tokens (attention over a real
  context, as mid-answer), and never advances it: every timed call writes the same scratch positions.
- Warm-up calls first, then a few rounds, each timing every row count and the drafting pass once
  (interleaved, so drift on a shared machine hits all of them alike); the median per call kind resists
  spikes. Ratios are to the 1-row step measured in the same rounds.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from yue.config import DecodeConfig
from yue.decode.sampling import sample_rows, speculative_accept, warp
from yue.model.masks import decode_mask
from yue.model.prepared import as_decoded
from yue.registry import cache_root

ROWS = tuple(range(1, 10))  # fed rows of a verifying forward: 1 = a plain AR step, 9 = K = 8 drafts
# Wider steps, for a batch's: a batch step's cost follows its fed positions (`StepCosts.for_batch`), and
# past 9 rows a curve extrapolated from its last two points misjudges them (a large batch's drafting
# pass feeds rows x slots positions), so the router's cost model measures these too.
WIDE_ROWS = (16, 32, 64, 128)

HeadUse = Literal["argmax", "logits", "sampled"]
SAMPLED = DecodeConfig(temperature=1.0)  # a sampled step's per-row work (warp, then a draw)


def head_use(cfg: DecodeConfig, argmax_only: bool) -> HeadUse:
    """What a request's AR rows serve: their argmax only (`Policy.argmax_only`), their logits (greedy
    with a tolerance, penalties or a trace), or a sample of their warped distribution."""
    if argmax_only:
        return "argmax"
    return "logits" if cfg.greedy else "sampled"


@dataclass(frozen=True)
class CostCurve:
    """Median seconds of one step per row count, and of a drafting pass by its slots (None: the model has
    no NAR set). `draft_slots`: the pass reported, the model's default (`YueConfig.drafting_slots`)."""

    context: int
    rows: tuple[int, ...]
    step_s: list[float]
    draft_slots: int | None = None
    pass_s: dict[int, float] | None = None  # slots (2..K) -> seconds

    @property
    def draft_s(self) -> float | None:
        """Seconds of the default drafting pass (`draft_slots` slots)."""
        return None if self.pass_s is None else self.pass_s[self.draft_slots]

    @property
    def ratios(self) -> list[float]:
        """Each row count's step time over the 1-row step's."""
        return [s / self.step_s[0] for s in self.step_s]

    def document(self) -> tuple[dict, dict | None]:
        """The JSON values: ("verify_cost_curve", "drafting_pass_cost")."""
        curve = {
            "context_tokens": self.context,
            "rows": list(self.rows),
            "step_ms": [round(s * 1e3, 4) for s in self.step_s],
            "ratio_to_1_row": [round(r, 4) for r in self.ratios],
        }
        if self.pass_s is None:
            return curve, None
        return curve, {
            "slots": self.draft_slots,
            "ms": round(self.draft_s * 1e3, 4),
            "ratio_to_ar_step": round(self.draft_s / self.step_s[0], 4),
            "ms_by_slots": {n: round(s * 1e3, 4) for n, s in self.pass_s.items()},
        }


def _median_times(calls: list, warmup: int, tries: int) -> list[float]:
    """Median seconds of each call over `tries` rounds that run every call once, after `warmup` rounds."""
    for _ in range(warmup):
        for fn in calls:
            fn()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(tries):
        for fn, ts in zip(calls, times, strict=True):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def _has_drafting_pass(config) -> bool:
    """False for a model without a NAR set (a plain Llama or GGUF loaded as an AR set)."""
    return config.nar_layers != 0 and config.mask_token_id is not None


@dataclass
class _Timed:
    """The calls `verify_cost_curve` times, as a request of `use` runs them, on a cache holding
    `context` tokens of `ids` (1, context + rows); `pos`: positions 0..capacity."""

    model: object
    cache: object
    ids: torch.Tensor
    pos: torch.Tensor
    context: int
    use: HeadUse
    draw: list

    def step(self, n: int):
        """A step feeding n rows (n - 1 drafts and the bonus row)."""
        c, device = self.context, self.model.device
        m = decode_mask(c, n, 0, self.cache.key_valid, device)

        def call():
            out = self.model.step(
                self.ids[:, c : c + n], self.pos[c : c + n], n, m, self.cache, n, top1=self.use == "argmax"
            )
            if self.use == "sampled" and n == 1:
                sample_rows(warp(out.ar_logits, SAMPLED), self.draw)
            elif (
                self.use == "sampled"
            ):  # the speculative rule over the n - 1 drafts fed (its own q: the cost)
                logp = warp(out.ar_logits, SAMPLED)[0]  # (n, V)
                speculative_accept(logp, logp[:-1], self.ids[0, c + 1 : c + n], self.draw[0])

        return call

    def draft(self, n: int, entry: torch.Tensor | None):
        """The drafting pass as decode/loop.py runs it: n slots after the last kept token, slot 1 revealed
        (a top-layer NAR set's slots enter from that token's hidden state, its `entry` row), and its
        drafts chosen from slots 2.., as `policies.draft_slots` chooses them."""
        c, device, cfg = self.context, self.model.device, self.model.config
        slots = torch.full((1, n), cfg.mask_token_id, dtype=torch.long, device=device)
        slots[0, 0] = self.ids[0, c]
        m = decode_mask(c, 0, n, self.cache.key_valid, device)

        def call():
            logits = self.model.step(slots, self.pos[c : c + n], 0, m, self.cache, 0, entry).slot_logits[
                :, 1:
            ]
            if self.use == "sampled":
                sample_rows(warp(logits, SAMPLED), self.draw)
            else:
                logits.argmax(-1)

        return call


@torch.inference_mode()
def verify_cost_curve(
    model,
    context: int = 200,
    rows: tuple[int, ...] = ROWS,
    warmup: int = 2,
    tries: int = 7,
    seed: int = 0,
    use: HeadUse = "argmax",
) -> CostCurve:
    """Time `model.step` over 1..9 fed rows and the drafting pass over 2..K slots, on a cache holding
    `context` tokens.

    Args:
        model: a PreparedModel (as `yue.load` returns it; a YueForCausalLM decodes as trained), batch 1.
        context: committed tokens in the cache before the timed steps (capped by the model's context).
        rows: the row counts to time.
        warmup, tries: untimed rounds, then timed rounds (each times every row count and the drafting
            pass once); the median per kind is reported.
        seed: for the context's random token ids (their values do not change a step's cost).
        use: what the timed steps' AR logits serve (`HeadUse`): their argmax (the head's screen, as a
            greedy request's steps ask), the whole logits, or those warped and sampled row by row.
    Returns:
        CostCurve with one median per row count (seconds) and per drafting pass's slots.
    """
    model = as_decoded(model)
    cfg, device = model.config, model.device
    K = cfg.block_size or 1
    context = max(1, min(context, cfg.max_position_embeddings - max(rows) - 2 * K - 2))
    cache = model.new_cache(1, context + max(max(rows), K) + 1)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(cfg.vocab_size, (1, context + max(rows)), generator=g).to(device)
    pos = torch.arange(cache.capacity, device=device)
    mask = decode_mask(0, context, 0, cache.key_valid, device)
    prefill = model.step(ids[:, :context], pos[:context], context, mask, cache, 1)
    cache.advance(context)

    draw = [torch.Generator(device=device).manual_seed(seed)]
    timed = _Timed(model, cache, ids, pos, context, use, draw)
    calls = [timed.step(n) for n in rows]
    slot_counts = range(2, K + 1) if _has_drafting_pass(cfg) and K >= 2 else range(0)
    entry = None if prefill.entry is None else prefill.entry[:, -1:]  # (1, 1, D)
    times = _median_times(calls + [timed.draft(n, entry) for n in slot_counts], warmup, tries)
    if not slot_counts:
        return CostCurve(context, tuple(rows), times)
    passes = dict(zip(slot_counts, times[len(rows) :], strict=True))
    default = min(cfg.drafting_slots or K, K)
    return CostCurve(context, tuple(rows), times[: len(rows)], default, passes)


# --------------------------------------------------------------------------------------------------
# The router's cost model: the curve above, measured once per model shape and machine, cached.


@dataclass(frozen=True)
class StepCosts:
    """What `VerifiedPolicy.draft_length` weighs: the cost of a step by its fed rows (index 0: a plain AR
    step, i: i drafts verified), and of one drafting pass by its slots (`passes[n - 2]`: n = 2..K slots).
    Any unit; only ratios matter."""

    step: tuple[float, ...]
    passes: tuple[float, ...]
    # Steps over more rows than `step` holds, measured: (rows, cost) pairs, rows increasing (`WIDE_ROWS`).
    wide: tuple[tuple[int, float], ...] = ()

    def draft_pass(self, slots: int) -> float:
        """A drafting pass over `slots` slots (clamped to the measured 2..K)."""
        return self.passes[min(max(slots - 2, 0), len(self.passes) - 1)]

    def verify(self, drafts: int) -> float:
        """A step feeding `drafts` drafts (plus the bonus row); past the rows of `step`, interpolated
        linearly between the measured wider steps (`wide`), and past those extrapolated from the last
        two points."""
        rows = drafts + 1
        if rows <= len(self.step):
            return self.step[rows - 1]
        points = [(len(self.step) - 1, self.step[-2] if len(self.step) > 1 else self.step[-1])]
        points += [(len(self.step), self.step[-1]), *self.wide]
        for (r0, c0), (r1, c1) in itertools.pairwise(points):
            if rows <= r1:
                return c0 + (rows - r0) * (c1 - c0) / (r1 - r0)
        (r0, c0), (r1, c1) = points[-2], points[-1]
        return c1 + (rows - r1) * max(c1 - c0, 0.0) / (r1 - r0)

    # Asked up to twice a step; the answer changes only with the batch's rows. Bounded: the cache keeps
    # its (small, frozen) StepCosts alive.
    @functools.lru_cache(maxsize=256)  # noqa: B019
    def for_batch(self, rows: int, block_size: int) -> StepCosts:
        """The costs of a step of `rows` batch rows, in the same unit: a step's cost follows its fed
        positions (docs/design.md §7), so a batch step feeding k drafts costs what one row feeding rows * (k + 1)
        positions would (the curve, extrapolated past its rows), and the drafting pass grows by the same
        ratio as a step of its rows * n positions (n: its slots). rows 1: these costs."""
        if rows == 1:
            return self
        positions = lambda n: self.verify(n - 1)  # noqa: E731  cost of a step over n positions
        step = tuple(positions(rows * (k + 1)) for k in range(block_size + 1))
        passes = tuple(p * positions(rows * n) / positions(n) for n, p in enumerate(self.passes, start=2))
        return StepCosts(step, passes)

    @classmethod
    @functools.cache
    def default(cls, block_size: int) -> StepCosts:
        """yue-code-mini's costs on the 2-core CPU (docs/design.md §7), for when nothing was measured: the
        constants are that measurement, in units of 0.1 ms (an AR step; verifying, plus a term a draft; a
        drafting pass, plus a term a slot; the figures: docs/results-log.md)."""
        step = (24.0,) + tuple(31.0 + 0.9 * k for k in range(1, block_size + 1))
        return cls(step, tuple(19.0 + 0.5 * n for n in range(2, max(block_size, 2) + 1)))

    @classmethod
    def from_curve(cls, curve: CostCurve) -> StepCosts:
        dense = [i for i, n in enumerate(curve.rows) if n <= len(ROWS)]  # 1..9 rows, then the wider steps
        return cls(
            tuple(curve.step_s[i] for i in dense),
            tuple(curve.pass_s[n] for n in sorted(curve.pass_s or {})),  # none without a NAR set
            tuple((n, s) for n, s in zip(curve.rows, curve.step_s, strict=True) if n > len(ROWS)),
        ).monotone()

    def monotone(self) -> StepCosts:
        """These costs with each step and pass at least the cost of one over fewer rows or slots (a
        running maximum): more rows never cost less, and a median measured on a shared CPU that says so
        (a 2-row step under a 1-row one) would have the router draft on noise."""
        step = tuple(itertools.accumulate(self.step, max))
        wide_costs = itertools.accumulate((max(c, step[-1]) for _, c in self.wide), max)
        wide = tuple(zip((n for n, _ in self.wide), wide_costs, strict=True))
        return StepCosts(step, tuple(itertools.accumulate(self.passes, max)), wide)


# What the timed calls hold (bumped when they change, so a cached curve timed otherwise is measured anew):
# 2 = a sampled step with drafts runs the speculative rule, a drafting pass chooses its drafts;
# 3 = the row kernel streams several column blocks a call (its step costs changed).
COSTS_VERSION = "3"

# Config fields that prime the free drafts' records (`sources.draft_rates`) and change no step's cost.
RECORD_PRIORS = ("free_draft_rates", "sampled_draft_rates")


def cost_cache_key(model) -> str:
    """Same model shape and precision, device kind, CPU capability and kernels, threads and torch: same
    costs."""
    model = as_decoded(model)
    on_cpu = model.device.type == "cpu"
    capability = torch.backends.cpu.get_cpu_capability() if on_cpu else ""
    name = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else platform.machine()
    # The config, less the fields that only prime the drafts' records (`RECORD_PRIORS`): they change what
    # a request drafts, never what a step costs.
    config = {k: v for k, v in model.config.to_dict().items() if k not in RECORD_PRIORS}
    parts = [json.dumps(config, sort_keys=True), str(model.device.type), name, capability]
    # The decode path's kernels, named by `yue.kernels.prepare_for_decoding` (CPU kernels probed, matmul
    # kinds, attention form): a cost measured on one is not another's.
    parts += [str(model.dtype), str(model.paths.cache_dtype), model.paths.layout]
    parts += [str(torch.get_num_threads()), torch.__version__, COSTS_VERSION]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def measured_costs(
    model, cache_dir: str | Path | None = None, tries: int = 5, use: HeadUse = "argmax"
) -> StepCosts:
    """The model's step costs on this machine for rows that serve `use` (`HeadUse`): measured (a few
    seconds for SmolLM2 on a CPU) the first time, then read from `cache_dir` (default
    `$YUE_CACHE_DIR/costs` or ~/.cache/yue/costs). A cache file that does not parse is measured anew,
    never trusted."""
    root = cache_root(cache_dir) / "costs"
    suffix = "" if use == "argmax" else f"-{use}"
    file = root / f"{cost_cache_key(model)}{suffix}.json"
    try:
        data = json.loads(file.read_text())
        return StepCosts(
            tuple(float(x) for x in data["step_s"]),
            tuple(float(x) for x in data["pass_s"]),
            tuple((int(n), float(x)) for n, x in data["wide_s"]),
        ).monotone()
    except (OSError, ValueError, KeyError, TypeError):
        pass
    # The wider steps that fit the model's context beside the measuring context (a tiny model's may not).
    wide = tuple(n for n in WIDE_ROWS if n <= as_decoded(model).config.max_position_embeddings // 2)
    curve = verify_cost_curve(model, context=128, rows=ROWS + wide, warmup=1, tries=tries, use=use)
    costs = StepCosts.from_curve(curve)
    root.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(f".tmp{os.getpid()}")
    record = {
        "step_s": list(costs.step),
        "pass_s": list(costs.passes),
        "wide_s": [list(p) for p in costs.wide],
    }
    tmp.write_text(json.dumps(record))
    os.replace(tmp, file)
    return costs
