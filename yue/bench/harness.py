"""`yue bench`: our decode modes side by side with Hugging Face transformers on the same weights.

Design decisions (DESIGN §6, STYLE habit 12):
- Peers run our AR set exported to `LlamaForCausalLM` (same weights, float32, same torch thread
  count) and are fed the exact prompt ids our engine decodes from (`Engine.encode`).
- Warm-up first: every entry runs once on the first prompt (or batch), timed and reported apart.
- Entries are interleaved per prompt, in an order rotated every prompt, so drift on a shared machine
  hits all of them alike; speed is reported as medians with p10/p90, ratios from the same run.
- How each entry is run, timed and counted (TTFT, forwards, accept lengths): runners.py. Both sides
  stop at <|eos|> (DecodeConfig has no way to ignore it); tokens/s counts the tokens actually
  generated (EOS excluded) on each side.
- Peak memory is measured per mode in a fresh process (memory.py), after the timed runs.
"""

from __future__ import annotations

import logging
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from yue.bench import metrics
from yue.bench.runners import HFRunner, OurRunner, Prompt, Sample, load_peers
from yue.config import MODES

PEERS = ("hf-greedy", "hf-prompt-lookup")
ALL_MODES: tuple[str, ...] = PEERS + MODES
DEFAULT_THRESHOLDS = (0.3, 0.5, 0.65, 0.8)
BATCHED_MODES = ("ar", "verified")  # batch sizes > 1 report throughput for these
DEVSET = Path(__file__).resolve().parent.parent / "assets" / "devset.jsonl"
JSON_KEYS = (
    "tokens_per_s",
    "speedup_vs_hf_greedy",
    "ttft_ms",
    "forwards_per_token",
    "mean_accepted",
    "exact_match_vs_ar",
    "nll_ratio_vs_ar",
    "chrf",
    "chrf_ratio_vs_ar",
    "repetition",
    "peak_rss_mb",
)


@dataclass(frozen=True)
class BenchConfig:
    """What to benchmark. Validated once; bad values raise ValueError naming the field.

    Attributes:
        model: yue model folder; None = the shipped default model.
        prompts: JSONL file of {"prompt", "reference"?}; None = the shipped development set.
        max_new_tokens: tokens per generation (all entries alike).
        modes: entries to run, from ALL_MODES; "hybrid" runs at the model's default threshold.
        thresholds: the hybrid sweep; each adds a "hybrid@T" entry (only when "hybrid" is in modes).
        verified_thresholds: each adds a "verified@T" entry (only when "verified" is in modes); at 1
            every slot is drafted, which shows the drafts' acceptance apart from the router's choices.
        fused_drafts: add "verified+fused" entries (default threshold and each verified threshold):
            drafts computed in the verifying forward, a block per draft position
            (`DecodeConfig.drafting="fused"`; plain `verified` entries draft in a separate pass).
        batch_sizes: sizes > 1 add "ar@bN" / "verified@bN" throughput entries.
        repeats: timed passes over the prompts (medians pool all of them).
        limit: use only the first `limit` prompts.
        threads: torch intra-op threads for every entry (and every memory probe).
        memory: measure peak RSS per mode in separate processes (seconds per mode).
        device: "cpu" or "cuda[:N]" for ours and the peers alike.
    """

    model: str | None = None
    prompts: str | None = None
    max_new_tokens: int = 128
    modes: tuple[str, ...] = ALL_MODES
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    verified_thresholds: tuple[float, ...] = (1.0,)
    fused_drafts: bool = True
    batch_sizes: tuple[int, ...] = (1,)
    repeats: int = 1
    limit: int | None = None
    threads: int = 1
    memory: bool = True
    device: str = "cpu"

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in ALL_MODES]
        if bad or not self.modes:
            raise ValueError(f"modes must be a non-empty subset of {','.join(ALL_MODES)}; got {bad or '[]'}")
        if len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes: duplicate entries in {','.join(self.modes)}")
        if any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ValueError(f"thresholds must be in [0, 1], got {list(self.thresholds)}")
        if any(not 0.0 <= t <= 1.0 for t in self.verified_thresholds):
            raise ValueError(f"verified_thresholds must be in [0, 1], got {list(self.verified_thresholds)}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes must be integers >= 1, got {list(self.batch_sizes)}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


@dataclass(frozen=True)
class Entry:
    """One column of the comparison: a mode, at a threshold (sweeps) or a batch size."""

    name: str
    mode: str
    threshold: float | None = None
    batch: int = 1
    drafting: str = "separate"  # `DecodeConfig.drafting`


def entries(cfg: BenchConfig) -> list[Entry]:
    """The entries a config asks for, in report order."""
    out = []
    for m in cfg.modes:
        out.append(Entry(m, m))
        if m == "hybrid":
            out += [Entry(f"hybrid@{t:g}", "hybrid", t) for t in cfg.thresholds]
        if m == "verified":
            out += [Entry(f"verified@{t:g}", "verified", t) for t in cfg.verified_thresholds]
            if cfg.fused_drafts:
                out.append(Entry("verified+fused", "verified", None, drafting="fused"))
                out += [
                    Entry(f"verified+fused@{t:g}", "verified", t, drafting="fused")
                    for t in cfg.verified_thresholds
                ]
    for b in sorted(set(cfg.batch_sizes)):
        if b > 1:
            out += [Entry(f"{m}@b{b}", m, None, b) for m in BATCHED_MODES if m in cfg.modes]
    return out


def load_prompts(
    path: str | Path | None, encode: Callable[[str], list[int]], limit: int | None
) -> list[Prompt]:
    """Read a JSONL prompt file ({"prompt": str, "reference": str?} per line)."""
    import json

    path = Path(path) if path is not None else DEVSET
    if not path.is_file():
        raise FileNotFoundError(f"prompts file not found: {path}")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f'{path}:{n}: each line must be an object with a string "prompt"')
        out.append(Prompt(row["prompt"], row.get("reference"), encode(row["prompt"])))
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out[:limit]


@dataclass
class Summary:
    """One entry's results: the JSON fields (JSON_KEYS) plus what only the table shows."""

    values: dict[str, float | None]
    tokens_per_s_p10: float | None = None
    tokens_per_s_p90: float | None = None
    accept_hist: dict[int, int] = field(default_factory=dict)
    warmup_s: float | None = None
    base_rss_mb: float | None = None
    nll: float | None = None


@dataclass
class BenchResult:
    model: str
    prompts: int
    max_new_tokens: int
    summaries: dict[str, Summary]
    entries: list[Entry]
    settings: dict[str, str]

    def document(self) -> dict:
        """The JSON document of the issue: exactly these keys, per mode exactly JSON_KEYS."""

        def clean(v):
            return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v

        return {
            "model": self.model,
            "prompts": self.prompts,
            "max_new_tokens": self.max_new_tokens,
            "modes": {
                name: {k: clean(s.values.get(k)) for k in JSON_KEYS} for name, s in self.summaries.items()
            },
        }


def _batches(n_prompts: int, b: int) -> list[list[int]]:
    """ceil(n / b) groups of b prompt indices, cycling through the prompts to fill the last group."""
    return [[(g * b + j) % n_prompts for j in range(b)] for g in range(math.ceil(n_prompts / b))]


class _Once(logging.Filter):
    """Let each distinct log message through once (the engine's router-collapse warning fires per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        new = msg not in self.seen
        self.seen.add(msg)
        return new


def run_bench(cfg: BenchConfig, log: Callable[[str], None] = lambda s: None) -> BenchResult:
    """Run the whole benchmark and summarise it. `log` receives progress lines."""
    once = _Once()
    logging.getLogger("yue").addFilter(once)
    try:
        return _run(cfg, log)
    finally:
        logging.getLogger("yue").removeFilter(once)


def _run(cfg: BenchConfig, log: Callable[[str], None]) -> BenchResult:
    import transformers

    import yue

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(cfg.threads)
    engine = yue.load(cfg.model, device=cfg.device, dtype=torch.float32)
    prompts = load_prompts(cfg.prompts, engine.encode, cfg.limit)
    todo = entries(cfg)
    with tempfile.TemporaryDirectory(prefix="yue-bench-") as tmp:
        runners: dict[str, Callable] = {}
        if any(e.mode in PEERS for e in todo):
            llama, rec = load_peers(engine, cfg.device, tmp)
        for e in todo:
            if e.mode in PEERS:
                runners[e.name] = HFRunner(
                    llama, rec, engine.tokenizer, e.mode == "hf-prompt-lookup", cfg.max_new_tokens
                )
            else:
                runners[e.name] = OurRunner(engine, e.mode, e.threshold, cfg.max_new_tokens, e.drafting)
        samples, warmup = _timed_runs(todo, runners, prompts, cfg, log)
        memory = _memory(todo, prompts, cfg, tmp, log) if cfg.memory else {}
    log("scoring outputs")
    summaries = _summarise(todo, samples, warmup, memory, prompts, engine)
    settings = {
        "threads": str(cfg.threads),
        "device": cfg.device,
        "dtype": "float32",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "repeats": str(cfg.repeats),
        "ttft_hf": "streamer: first put after the prompt",
    }
    return BenchResult(engine.name, len(prompts), cfg.max_new_tokens, summaries, todo, settings)


def _timed_runs(todo, runners, prompts, cfg, log):
    """Warm-up, then interleaved timed runs. Returns samples per entry and warm-up seconds."""
    batch = {e.name: ([[0]] if e.batch == 1 else _batches(len(prompts), e.batch)) for e in todo}
    warmup = {}
    for e in todo:
        t0 = time.perf_counter()
        runners[e.name]([(i, prompts[i]) for i in batch[e.name][0]])
        warmup[e.name] = time.perf_counter() - t0
    log("warm-up done: " + ", ".join(f"{k} {v:.2f}s" for k, v in warmup.items()))
    samples: dict[str, list[Sample]] = {e.name: [] for e in todo}
    single = [e for e in todo if e.batch == 1]
    for r in range(cfg.repeats):
        for i in range(len(prompts)):
            log(f"repeat {r + 1}/{cfg.repeats} prompt {i + 1}/{len(prompts)}")
            k = (i + r) % len(single)
            for e in single[k:] + single[:k]:  # rotated so no entry always runs first
                samples[e.name].append(runners[e.name]([(i, prompts[i])]))
        for b in sorted({e.batch for e in todo if e.batch > 1}):
            group = [e for e in todo if e.batch == b]
            for g, idx in enumerate(_batches(len(prompts), b)):
                log(f"repeat {r + 1}/{cfg.repeats} batch {b} group {g + 1}")
                k = (g + r) % len(group)
                for e in group[k:] + group[:k]:
                    samples[e.name].append(runners[e.name]([(i, prompts[i]) for i in idx]))
    return samples, warmup


def _memory(todo, prompts, cfg, llama_dir, log) -> dict[str, dict[str, float]]:
    """Peak RSS per mode (batch 1, default threshold), each in its own process, on the longest prompt."""
    from yue.bench.memory import MemorySpec, measure

    p = max(prompts, key=lambda q: len(q.ids))
    out = {}
    for e in todo:
        if e.batch != 1 or e.threshold is not None:
            continue
        log(f"peak memory: {e.name}")
        spec = MemorySpec(e.mode, cfg.model, llama_dir, p.text, p.ids, cfg.max_new_tokens, cfg.threads)
        out[e.name] = measure(spec)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _summarise(todo, samples, warmup, memory, prompts, engine) -> dict[str, Summary]:
    """Speed statistics per entry, then quality relative to `ar` and speed relative to `hf-greedy`."""
    nll_memo: dict[tuple[int, tuple[int, ...]], tuple[float, int]] = {}

    def nll_of(i: int, toks: list[int]) -> tuple[float, int]:
        key = (i, tuple(toks))
        if key not in nll_memo:
            nll_memo[key] = metrics.ar_nll(engine.model, prompts[i].ids, toks)
        return nll_memo[key]

    out: dict[str, Summary] = {}
    first: dict[str, dict[int, tuple[list[int], str]]] = {}
    for e in todo:
        ss = samples[e.name]
        tps = [s.new_tokens / s.wall_s for s in ss if s.wall_s > 0]
        ttft = [s.ttft_s for s in ss if s.ttft_s is not None]
        tokens = sum(s.new_tokens for s in ss)
        lengths = [a for s in ss for a in s.accept_lengths]
        outputs: dict[int, tuple[list[int], str]] = {}
        for s in ss:
            for i, t, txt in s.rows:
                outputs.setdefault(i, (t, txt))
        first[e.name] = outputs
        nll = [nll_of(i, t) for i, (t, _) in outputs.items()]
        n_tok = sum(n for _, n in nll)
        order = sorted(outputs)
        mem = memory.get(e.name, {})
        out[e.name] = Summary(
            values={
                "tokens_per_s": statistics.median(tps) if tps else None,
                "ttft_ms": statistics.median(ttft) * 1e3 if ttft else None,
                # forwards per generated token of one row (a lockstep batch forward serves every row)
                "forwards_per_token": sum(s.forwards * len(s.rows) for s in ss) / tokens if tokens else None,
                "mean_accepted": statistics.fmean(lengths) if lengths else None,
                "chrf": metrics.chrf([outputs[i][1] for i in order], [prompts[i].reference for i in order]),
                "repetition": metrics.repetition_rate([outputs[i][0] for i in order]),
                "peak_rss_mb": mem.get("peak_rss_mb"),
            },
            tokens_per_s_p10=metrics.percentile(tps, 10),
            tokens_per_s_p90=metrics.percentile(tps, 90),
            accept_hist={a: lengths.count(a) for a in sorted(set(lengths))},
            warmup_s=warmup.get(e.name),
            base_rss_mb=mem.get("base_rss_mb"),
            nll=sum(x for x, _ in nll) / n_tok if n_tok else None,
        )
    ar, hf = out.get("ar"), out.get("hf-greedy")
    for e in todo:
        s, v = out[e.name], out[e.name].values
        v["speedup_vs_hf_greedy"] = _ratio(v["tokens_per_s"], hf and hf.values["tokens_per_s"])
        ref = first.get("ar")
        mine = first[e.name]
        v["exact_match_vs_ar"] = (
            sum(mine[i][0] == ref[i][0] for i in mine if i in ref) / len(mine) if ref and mine else None
        )
        v["nll_ratio_vs_ar"] = _ratio(s.nll, ar and ar.nll)
        v["chrf_ratio_vs_ar"] = _ratio(v["chrf"], ar and ar.values["chrf"])
    return out
