"""`yue bench`: our decode modes side by side with the tools users would pick, on the same weights.

Design decisions (docs/design.md §6, docs/style.md habit 12):
- Peers: Hugging Face `generate` (greedy, and prompt lookup) on our AR set as its family's transformers
  model (`runners.load_peers`; same float32 weights, same torch thread count), and llama.cpp
  (llama-cpp-python, `llamacpp.py`) on the GGUF file the AR set comes from, at the same thread count.
  Every entry is fed the exact prompt ids our engine decodes from (`prompts.py`: chat messages go
  through the chat template once, then `Engine.encode`).
- Several prompt sets in one run, the held-out set first and the development (calibration) set
  labelled as such; each set gets its own summary. The entries, runners and warm-up are shared.
- Warm-up first: every entry runs once on the first set's first prompt (or batch), timed and reported
  apart.
- Sampling (`--temperature`, `--top-p`, `--seed`) is every entry's and every peer's alike: ours sample
  through the request's settings (speculative sampling for the drafting modes), transformers and
  llama.cpp with the same temperature and nucleus and no other filter; prompt i is seeded with seed + i
  on every side, so a run repeats its outputs (`runners.Sampling`).
- Entries are interleaved per prompt, in an order rotated every prompt, so drift on a shared machine
  hits all of them alike; speed is reported as medians with p10/p90, ratios from the same run.
- How each entry is run, timed and counted (TTFT, forwards, accept lengths): runners.py. Every side
  stops at the model's EOS; tokens/s counts the tokens actually generated (EOS excluded).
- An entry that cannot run here (llama.cpp not installed, a model without a GGUF source or without a
  NAR set) is left out with a one-line reason in the report, never a traceback.
- The cost of a verifying forward against its rows and of a drafting pass (`costs.py`) is measured on
  the loaded model after the timed runs; peak memory per mode in a fresh process (memory.py), last.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from yue.bench import llamacpp, metrics
from yue.bench.prompts import PromptSet, prompt_sets
from yue.bench.runners import HFRunner, OurRunner, Sample, Sampling, load_peers
from yue.bench.summary import JSON_KEYS, Summary, summarise
from yue.config import EXACT_MODES, EXPERIMENTAL_MODES, MODES
from yue.decode.costs import CostCurve, verify_cost_curve
from yue.kernels import probe
from yue.kernels.prepare import resolve_dtype
from yue.settings import AR_SET_MODES

HF_PEERS = ("hf-greedy", "hf-prompt-lookup")
PEERS = (*HF_PEERS, llamacpp.NAME)
ALL_MODES: tuple[str, ...] = PEERS + MODES
DEFAULT_MODES: tuple[str, ...] = tuple(m for m in ALL_MODES if m not in EXPERIMENTAL_MODES)
DEFAULT_THRESHOLDS = (0.05, 0.1, 0.2, 0.4)  # hybrid tolerances: a ratio bound, so small values
BATCHED_MODES = ("ar", "verified")  # batch sizes > 1 report throughput for these
__all__ = ["JSON_KEYS", "BenchConfig", "BenchResult", "Entry", "entries", "run_bench"]


@dataclass(frozen=True)
class BenchConfig:
    """What to benchmark (`yue bench`'s options). Validated once; bad values raise ValueError naming the field.

    Attributes:
        model: a model name (`yue-smol`, `yue-code-mini`) or path; None = the default model.
        prompts: held-out prompts, reported first: JSONL of {"prompt": ...} or {"messages": [{"role",
            "content"}]} (+ "reference"?); messages go through the model's chat template for every entry
            alike (`prompts.py`). Default: a chat model's shipped chat_test + chat_calibration sets;
            gemma-3-270m (base) the held-out text_test set, raw; else the held-out code_test set
            (third-party packages) + the code development set (`prompts.default_files`).
        dev_prompts: a development (calibration) prompt set, reported after the held-out one and labelled dev.
        max_new_tokens: tokens generated per prompt, by every entry alike.
        modes: entries to compare, from ALL_MODES; "hybrid" runs at the model's default threshold.
            llamacpp-greedy needs a model with a GGUF source and llama-cpp-python (the `llamacpp`
            extra); else it is skipped, saying why.
        thresholds: the hybrid sweep (tolerances); each adds a "hybrid@T" entry (only when "hybrid" is in modes).
        verified_thresholds: each adds a "verified@T" entry (only when "verified" is in modes); at 1
            the router is not asked (draft lengths follow the request's acceptance record); empty: none.
        fused_drafts: add "verified+fused" entries (default threshold and each verified threshold):
            drafts computed in the verifying forward, a block per draft position
            (`DecodeConfig.drafting="fused"`; plain `verified` entries draft in a separate pass).
        batch_sizes: sizes > 1 add "ar@bN" / "verified@bN" throughput entries.
        repeats: timed passes over the prompts (medians pool all of them).
        limit: use only the first `limit` prompts.
        threads: torch intra-op threads, the same for every entry (and every memory probe).
        memory: measure peak RSS per mode, each in its own process (seconds per mode).
        device: "cpu" or "cuda[:N]" for ours and the transformers peers (llama.cpp: CPU only).
        cost_curve: time a verifying forward over 1..9 rows and a drafting pass, as ratios to a 1-row
            step (`costs.py`).
        dtype: the precision of ours and the transformers peers ("float32" or "bfloat16",
            `prepare.resolve_dtype`; "int4" is ours only, the peers run float32, the values it
            quantizes); llama.cpp runs the GGUF's own. Below float32, every set also gets
            a float32 reference (`float32_reference`): our float32 `ar` on the same prompts (untimed),
            and the float32 AR path's NLL of `ar`'s outputs in this precision against its own.
        low_memory: ours (not the peers) hold each float32 layer weight once (`yue.load(low_memory=True)`).
        temperature: 0 = greedy; every entry and peer alike (`Sampling`; ours: speculative sampling in
            the drafting modes).
        top_p: nucleus mass in (0, 1], every entry and peer alike.
        seed: prompt i is sampled with seed + i on every side, so runs repeat.
    """

    model: str | None = None
    prompts: str | None = None
    dev_prompts: str | None = None
    max_new_tokens: int = 128
    modes: tuple[str, ...] = DEFAULT_MODES
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    verified_thresholds: tuple[float, ...] = (1.0,)
    fused_drafts: bool = True
    batch_sizes: tuple[int, ...] = (1,)
    repeats: int = 1
    limit: int | None = None
    threads: int = 1
    memory: bool = True
    device: str = "cpu"
    cost_curve: bool = True
    dtype: str = "float32"
    low_memory: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

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
        resolve_dtype(self.dtype)  # an unknown name raises, naming the precisions
        Sampling(self.temperature, self.top_p, self.seed)  # checked there, naming the field

    @property
    def sampling(self) -> Sampling:
        """The sampling every entry and peer runs with."""
        return Sampling(self.temperature, self.top_p, self.seed)

    @property
    def torch_dtype(self) -> torch.dtype:
        """`dtype` as the torch dtype ours and the transformers peers load in."""
        return resolve_dtype(self.dtype) or torch.float32


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


@dataclass
class SetResult:
    """One prompt set's summaries. split: "held-out" or "dev" (`prompts.SPLIT_LABELS`)."""

    name: str
    split: str
    file: str
    prompts: int
    summaries: dict[str, Summary]
    float32_reference: dict | None = None


@dataclass
class BenchResult:
    """A run: per prompt set (held-out first) the entries' summaries; what was skipped and why; costs."""

    model: str
    max_new_tokens: int
    sets: list[SetResult]
    entries: list[Entry]
    settings: dict[str, str]
    skipped: dict[str, str] = field(default_factory=dict)
    costs: CostCurve | None = None
    sampling: Sampling = field(default_factory=Sampling)

    @property
    def prompts(self) -> int:
        """The first (held-out) set's prompt count."""
        return self.sets[0].prompts

    @property
    def summaries(self) -> dict[str, Summary]:
        """The first (held-out) set's summaries."""
        return self.sets[0].summaries

    def document(self) -> dict:
        """The JSON document. "prompts" and "modes" are the first set's, per mode exactly JSON_KEYS (as
        before several sets were run); "prompt_sets" holds every set, held-out first."""

        def clean(v):
            return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v

        def modes(summaries: dict[str, Summary]) -> dict:
            return {name: {k: clean(s.values.get(k)) for k in JSON_KEYS} for name, s in summaries.items()}

        curve, draft = self.costs.document() if self.costs is not None else (None, None)
        return {
            "model": self.model,
            "prompts": self.prompts,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "seed": self.sampling.seed,
            "modes": modes(self.summaries),
            "prompt_sets": [
                {
                    "name": s.name,
                    "split": s.split,
                    "file": s.file,
                    "prompts": s.prompts,
                    "modes": modes(s.summaries),
                    "float32_reference": s.float32_reference,
                }
                for s in self.sets
            ],
            "skipped": dict(self.skipped),
            "verify_cost_curve": curve,
            "drafting_pass_cost": draft,
            "settings": dict(self.settings),
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


def _skips(todo: list[Entry], cfg: BenchConfig, engine) -> dict[str, str]:
    """Entries that cannot run here, each with its one-line reason."""
    out = {}
    if any(e.mode == llamacpp.NAME for e in todo):
        why = llamacpp.unavailable(cfg.model)
        if why is None and cfg.device != "cpu":
            why = f"llama.cpp runs on the CPU in this bench (device is {cfg.device})"
        if why is not None:
            out[llamacpp.NAME] = why
    if not engine.has_nar_set:  # a plain Llama or GGUF loaded as an AR set: verified copies drafts
        for e in todo:
            if e.mode in MODES and (e.mode not in AR_SET_MODES or e.drafting == "fused"):
                out[e.name] = (
                    f"model {engine.name} has no NAR set: only ar and verified (drafts copied from the "
                    "context) run"
                )
    elif engine.model_config.nar_start > 0:  # a top-layer NAR set (yue-smol): slots enter at its depth
        for e in todo:
            if e.drafting == "fused":
                out[e.name] = (
                    f"fused drafting needs a NAR set in every layer; {engine.name}'s starts at layer "
                    f"{engine.model_config.nar_start} (its verified drafts in a separate pass)"
                )
    return out


def _runners(
    todo: list[Entry], engine, sets: list[PromptSet], cfg: BenchConfig, tmp: str
) -> tuple[dict, dict, str | None]:
    """A callable per entry (batch of (index, Prompt) -> Sample), settings they add to the report, and
    the folder the transformers peers load (None without them): the model's AR set as stored, loaded
    in `cfg.dtype`."""
    runners: dict[str, Callable] = {}
    settings: dict[str, str] = {}
    peer_dir = None
    if any(e.mode in HF_PEERS for e in todo):
        llama, rec, peer_dir = load_peers(cfg.model, cfg.device, tmp, cfg.torch_dtype)
    if any(e.mode == llamacpp.NAME for e in todo):
        gguf, _ = llamacpp.gguf_source(cfg.model)
        longest = max(len(p.ids) for s in sets for p in s.prompts)
        llm = llamacpp.load(gguf, longest + cfg.max_new_tokens + 1, cfg.threads)
        eos = engine.model_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        settings["llamacpp"] = llamacpp.precision(llm, gguf)
    for e in todo:
        if e.mode in HF_PEERS:
            runners[e.name] = HFRunner(
                llama, rec, engine.tokenizer, e.mode == "hf-prompt-lookup", cfg.max_new_tokens, cfg.sampling
            )
        elif e.mode == llamacpp.NAME:
            runners[e.name] = llamacpp.LlamaCppRunner(
                llm, engine.tokenizer, eos_ids, cfg.max_new_tokens, cfg.sampling
            )
        else:
            runners[e.name] = OurRunner(
                engine, e.mode, e.threshold, cfg.max_new_tokens, e.drafting, cfg.sampling
            )
    return runners, settings, None if peer_dir is None else str(peer_dir)


def _run(cfg: BenchConfig, log: Callable[[str], None]) -> BenchResult:
    import transformers

    import yue

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(cfg.threads)
    engine = yue.load(cfg.model, device=cfg.device, dtype=cfg.dtype, low_memory=cfg.low_memory)
    # Below float32: a float32 engine is the reference the precision's outputs are scored against.
    reference = (
        engine if cfg.dtype == "float32" else yue.load(cfg.model, device=cfg.device, dtype=torch.float32)
    )
    sets = prompt_sets(engine, cfg.prompts, cfg.dev_prompts, cfg.limit)
    todo = entries(cfg)
    skipped = _skips(todo, cfg, engine)
    for name, why in skipped.items():
        log(f"{name} skipped: {why}")
    todo = [e for e in todo if e.name not in skipped]
    costs = None
    with tempfile.TemporaryDirectory(prefix="yue-bench-") as tmp:
        runners, extra, peer_dir = _runners(todo, engine, sets, cfg, tmp)
        warmup = _warm_up(todo, runners, sets[0].prompts, log)
        samples = []
        for s in sets:
            log(f"prompt set {s.name} ({s.split}, {len(s.prompts)} prompts)")
            samples.append(_timed_runs(todo, runners, s.prompts, cfg, log))
        if cfg.cost_curve:
            log("cost of a verifying forward over 1..9 rows, and of a drafting pass")
            costs = verify_cost_curve(engine.model)
        memory = _memory(todo, sets[0].prompts, cfg, peer_dir, log) if cfg.memory else {}
    log("scoring outputs")
    results = [
        SetResult(
            s.name,
            s.split,
            s.path.name,
            len(s.prompts),
            summarise([e.name for e in todo], ss, warmup if k == 0 else {}, memory, s.prompts, engine.model),
            None if reference is engine else _float32_reference(reference, s.prompts, ss.get("ar"), cfg, log),
        )
        for k, (s, ss) in enumerate(zip(sets, samples, strict=True))
    ]
    if cfg.sampling.greedy:  # sampled, `verified` keeps `ar`'s distribution, not its tokens
        for r in results:
            _warn_if_verified_parts(todo, r, log)
    settings = {
        "threads": str(cfg.threads),
        "device": cfg.device,
        "dtype": f"{cfg.dtype} (ours), {str(cfg.torch_dtype).removeprefix('torch.')} (hf peers)",
        "low_memory": str(cfg.low_memory).lower(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "repeats": str(cfg.repeats),
        "sampling": cfg.sampling.describe(),
        "ttft_hf": "streamer: first put after the prompt",
        **extra,
    }
    if engine.model.device.type == "cpu":  # which kernels ours ran (`model/kernels.py`), as in the log
        settings["kernels"] = probe.describe()
    return BenchResult(engine.name, cfg.max_new_tokens, results, todo, settings, skipped, costs, cfg.sampling)


def _warn_if_verified_parts(todo: list[Entry], result: SetResult, log: Callable[[str], None]) -> None:
    """Say so loudly where a lone `verified` entry wrote other tokens than `ar`: it is exact by
    construction, so that is a bug, not noise (one such line found the bfloat16 key-padding bug; the
    measurement log, "A bfloat16 exactness miss")."""
    for e in todo:
        exact = result.summaries[e.name].values.get("exact_match_vs_ar")
        if e.mode in EXACT_MODES and e.batch == 1 and exact is not None and exact < 1.0:
            log(
                f"WARNING {e.name} differs from ar on {round((1 - exact) * result.prompts)} of "
                f"{result.prompts} prompts of {result.name}: {e.mode} is exact by construction, so this "
                "is a bug; docs/recipes/verified_random_drafts.py searches for the step that parts"
            )


def _warm_up(todo, runners, prompts, log) -> dict[str, float]:
    """Each entry once on the first prompt (or batch); seconds per entry."""
    warmup = {}
    for e in todo:
        first = [0] if e.batch == 1 else _batches(len(prompts), e.batch)[0]
        t0 = time.perf_counter()
        runners[e.name]([(i, prompts[i]) for i in first])
        warmup[e.name] = time.perf_counter() - t0
    log("warm-up done: " + ", ".join(f"{k} {v:.2f}s" for k, v in warmup.items()))
    return warmup


def _timed_runs(todo, runners, prompts, cfg, log) -> dict[str, list[Sample]]:
    """Interleaved timed runs over one prompt set. Returns samples per entry."""
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
    return samples


def _float32_reference(reference, prompts, ar_samples, cfg, log) -> dict | None:
    """How `ar` in the bench's precision compares with `ar` in float32 on one prompt set: the float32
    AR path's NLL of each side's greedy output (summed over the set), their ratio, how many outputs are
    identical, and their speeds (tokens over wall time, each side's prompts one after another in this
    process: float32 runs after the timed entries, not interleaved with them). None without `ar`
    samples."""
    if not ar_samples:
        return None
    log("float32 reference: ar in float32 on the same prompts (untimed)")
    ours = {i: toks for s in ar_samples for i, toks, _ in s.rows}
    runner = OurRunner(reference, "ar", None, cfg.max_new_tokens, "separate", cfg.sampling)
    nll = {"ours": [0.0, 0], "float32": [0.0, 0]}
    same, ref_tokens, ref_wall = 0, 0, 0.0
    for i, toks in sorted(ours.items()):
        sample = runner([(i, prompts[i])])
        ref = sample.rows[0][1]
        ref_tokens, ref_wall = ref_tokens + len(ref), ref_wall + sample.wall_s
        same += ref == toks
        scored = metrics.ar_nll(reference.model, prompts[i].ids, toks)
        for side, (total, n) in (
            ("ours", scored),
            ("float32", scored if ref == toks else metrics.ar_nll(reference.model, prompts[i].ids, ref)),
        ):
            nll[side][0] += total
            nll[side][1] += n
    per_token = {k: v[0] / max(v[1], 1) for k, v in nll.items()}
    ours_tps = sum(s.new_tokens for s in ar_samples) / sum(s.wall_s for s in ar_samples)
    return {
        "ar_tokens_per_s": {"ours": round(ours_tps, 2), "float32": round(ref_tokens / ref_wall, 2)},
        "ar_speedup_vs_float32": round(ours_tps / (ref_tokens / ref_wall), 3),
        "precision": cfg.dtype,
        "prompts": len(ours),
        "identical_to_float32_ar": same,
        "nll_per_token": {k: round(v, 4) for k, v in per_token.items()},
        "nll_ratio": round(per_token["ours"] / per_token["float32"], 4) if per_token["float32"] else None,
    }


def _memory(todo, prompts, cfg, peer_dir, log) -> dict[str, dict[str, float]]:
    """Peak RSS per mode (batch 1, default threshold), each in its own process, on the longest prompt
    of the first set (memory is a mode's, not a set's: every set's summary shows the same figure)."""
    from yue.bench.memory import MemorySpec, measure

    p = max(prompts, key=lambda q: len(q.ids))
    gguf = str(llamacpp.gguf_source(cfg.model)[0]) if any(e.mode == llamacpp.NAME for e in todo) else None
    out = {}
    for e in todo:
        if e.batch != 1 or e.threshold is not None or e.drafting != "separate":
            continue
        log(f"peak memory: {e.name}")
        spec = MemorySpec(
            e.mode,
            cfg.model,
            peer_dir,
            p.text,
            p.ids,
            cfg.max_new_tokens,
            cfg.threads,
            gguf=gguf,
            llamacpp_extra_buffers=llamacpp.extra_buffers_work(gguf) if e.mode == llamacpp.NAME else None,
            dtype=cfg.dtype,
            low_memory=cfg.low_memory,
        )
        out[e.name] = measure(spec)
    return out
