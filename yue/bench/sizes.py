"""`yue bench-sizes`: yue vs llama.cpp at real model sizes, on random-weight GGUFs of real shapes.

RANDOM WEIGHTS MEASURE SPEED AND MEMORY ONLY: the text they generate, and any acceptance rate on
them, mean nothing (`gguf_shapes.py`).

Design decisions:
- Every measurement runs in a fresh interpreter (`sizes_worker.py`): per shape and peer, one cold
  load (+ 8 tokens) first: the file's first load, for both peers. The GGUF's pages are evicted from the
  page cache beforehand (`posix_fadvise(DONTNEED)`: it touches only our file, unlike `drop_caches`,
  which would evict other users' pages on a shared machine; where it fails the report says "page cache
  warm"), and yue's cached index of the file is removed (`first_load`), so yue parses the header and
  builds the tokenizer as on a file it has never seen. Compiled kernels stay cached (built once per
  machine, not per file). Then `repeats` x threads speed runs, each its own process (warm
  load, load + 8 tokens, decode tokens/s, the row curve, peak RSS).
- Every speed is also a ratio yue / llama.cpp from this run: the ratio of the medians, and the spread
  min(yue)/max(llama.cpp) .. max(yue)/min(llama.cpp) over the repeats.
- The ceiling: this machine's bandwidth (torch.sum over 2 GiB, per thread count) / the bytes one
  decode step reads (`gguf_shapes.bytes_per_token`).
- A shape that will not fit in memory is refused by `yue.load` itself before it allocates
  (`gguf_load.check_memory`); the run reports the child's one-line error as that peer's skip.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from yue.bench import gguf_shapes
from yue.bench.sizes_worker import CURVE_ROWS, WorkerSpec, spec_json

NOTE = "random weights: these figures measure speed and memory only; the generated text means nothing"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle on the beach."
PEERS = ("yue", "llamacpp")


@dataclass(frozen=True)
class SizesConfig:
    """What `yue bench-sizes` runs.

    Attributes:
        shapes: `gguf_shapes.SHAPES` names. threads: thread counts for the speed runs.
        repeats: speed runs (processes) per thread count, for the spread. tokens: timed new tokens.
        ctx_size: KV cache length both peers allocate. peers: "yue" and/or "llamacpp".
        timeout_s: one child's limit.
    """

    shapes: tuple[str, ...] = ("llama-3.2-1b",)
    threads: tuple[int, ...] = (1, 2)
    repeats: int = 3
    tokens: int = 32
    ctx_size: int = 4096
    peers: tuple[str, ...] = PEERS
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        for s in self.shapes:
            if s not in gguf_shapes.SHAPES:
                raise ValueError(f"shapes: unknown shape {s!r} (known: {', '.join(gguf_shapes.SHAPES)})")
        if not self.threads or min(self.threads) < 1:
            raise ValueError("threads: at least one thread count, each >= 1")
        if self.repeats < 1 or self.tokens < 2 or self.ctx_size < 256:
            raise ValueError("repeats >= 1, tokens >= 2 and ctx_size >= 256 are required")
        for p in self.peers:
            if p not in PEERS:
                raise ValueError(f"peers: unknown peer {p!r} ({', '.join(PEERS)})")


def child(spec: WorkerSpec, timeout_s: float) -> dict:
    """Run one measurement in a fresh interpreter; {"error": ...} when it fails."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "yue.bench.sizes_worker", spec_json(spec)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return {"error": f"exit status {proc.returncode}: {tail[0][:300]}"}
    return json.loads(lines[-1])


def evict(paths: list[Path]) -> bool:
    """Drop these files' pages from the page cache (posix_fadvise DONTNEED); False where it cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return True
    except OSError:
        return False


def first_load(path: Path) -> None:
    """Remove `path`'s cached index (metadata, tensor table, tokenizer), so yue's next load of it is its
    first: the header parsed, the tokenizer built (the index is rebuilt by that load)."""
    import shutil

    from yue.model.gguf_file import index_folder

    shutil.rmtree(index_folder(path), ignore_errors=True)


@dataclass
class PeerResult:
    """One peer on one shape: the cold load, then the speed runs keyed by thread count."""

    cold: dict = field(default_factory=dict)
    page_cache: str = "warm"
    runs: dict[int, list[dict]] = field(default_factory=dict)
    skipped: str | None = None
    extra_buffers: bool | None = None  # llama.cpp's extra CPU buffer types (off where they crash)

    def values(self, threads: int, key: str) -> list[float]:
        return [r[key] for r in self.runs.get(threads, []) if key in r]


def measure_peer(peer: str, path: Path, cfg: SizesConfig, extra: bool | None, log: Callable) -> PeerResult:
    out = PeerResult(extra_buffers=extra)
    base = dict(peer=peer, path=str(path), ctx_size=cfg.ctx_size, prompt=PROMPT, extra_buffers=extra)
    if peer == "yue":
        first_load(path)
    out.page_cache = "evicted (posix_fadvise DONTNEED)" if evict([path]) else "page cache warm"
    out.cold = child(WorkerSpec("load", threads=max(cfg.threads), **base), cfg.timeout_s)
    log(f"{peer} {path.name}: cold load {out.cold}")
    if "error" in out.cold:
        out.skipped = out.cold["error"]
        return out
    for r in range(cfg.repeats):
        for t in cfg.threads:
            res = child(WorkerSpec("speed", threads=t, tokens=cfg.tokens, **base), cfg.timeout_s)
            log(f"{peer} {path.name} threads={t} run {r + 1}: {_brief(res)}")
            out.runs.setdefault(t, []).append(res)
    return out


def _brief(res: dict) -> str:
    if "error" in res:
        return res["error"]
    return f"{res['tok_s']:.1f} tok/s, load {res['load_s']:.2f} s, peak {res['peak_rss_mb']:.0f} MB"


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def ratio(yue: list[float], llama: list[float]) -> dict | None:
    """yue / llama.cpp: ratio of medians, spread min/max .. max/min over the repeats."""
    if not yue or not llama:
        return None
    return {
        "median": _med(yue) / _med(llama),
        "min": min(yue) / max(llama),
        "max": max(yue) / min(llama),
    }


def _curve(runs: list[dict]) -> list[float] | None:
    """The row curve as ratios to one row: medians over the runs of each row count's seconds."""
    steps = [r["step_s"] for r in runs if "step_s" in r]
    if not steps:
        return None
    med = [statistics.median(s[i] for s in steps) for i in range(len(CURVE_ROWS))]
    return [m / med[0] for m in med]


def shape_document(shape, path: Path, peers: dict[str, PeerResult], bw: dict[int, float], cfg) -> dict:
    per_token = gguf_shapes.bytes_per_token(shape)
    doc = {
        "file": str(path),
        "file_gb": round(path.stat().st_size / 1e9, 3),
        "bytes_per_token_gb": round(per_token / 1e9, 3),
        "ceiling_tok_s": {t: round(b * 1e9 / per_token, 2) for t, b in bw.items()},
        "vocab_note": gguf_shapes.vocab_note(shape),
        "peers": {},
        "yue_over_llamacpp": {},
    }
    for name, p in peers.items():
        d = {"skipped": p.skipped, "page_cache": p.page_cache, "load_cold_s": p.cold.get("load_s")}
        if name == "llamacpp":
            d["extra_buffers"] = p.extra_buffers
        d["load_plus_8_cold_s"] = p.cold.get("load_plus_8_s")
        d["peak_rss_mb"] = max((r.get("peak_rss_mb", 0) for rs in p.runs.values() for r in rs), default=None)
        for t in cfg.threads:
            d[f"tok_s@{t}"] = p.values(t, "tok_s")
            d[f"row_cost_ratio@{t}"] = _curve(p.runs.get(t, []))
            errors = [r["error"] for r in p.runs.get(t, []) if "error" in r]
            if errors:
                d[f"errors@{t}"] = errors
        t1 = min(cfg.threads)
        d["load_warm_s"] = p.values(t1, "load_s")
        d["load_plus_8_warm_s"] = p.values(t1, "load_plus_8_s")
        doc["peers"][name] = d
    if "yue" in peers and "llamacpp" in peers:
        y, ll = peers["yue"], peers["llamacpp"]
        for t in cfg.threads:
            doc["yue_over_llamacpp"][f"tok_s@{t}"] = ratio(y.values(t, "tok_s"), ll.values(t, "tok_s"))
        t1 = min(cfg.threads)
        for key in ("load_s", "load_plus_8_s"):  # times: above 1 means yue is slower
            doc["yue_over_llamacpp"][f"{key}_warm"] = ratio(y.values(t1, key), ll.values(t1, key))
            cold = [p.cold.get(key) for p in (y, ll)]
            doc["yue_over_llamacpp"][f"{key}_cold"] = cold[0] / cold[1] if None not in cold else None
    return doc


def run_sizes(cfg: SizesConfig, log: Callable[[str], None] = lambda s: None) -> dict:
    """Measure every shape and peer in `cfg`; return the JSON document."""
    from yue.bench import llamacpp

    bw = {}
    for t in cfg.threads:
        res = child(WorkerSpec("bandwidth", threads=t), cfg.timeout_s)
        bw[t] = res.get("bandwidth_gb_s")
        log(f"bandwidth at {t} thread(s): {res}")
    bw = {t: b for t, b in bw.items() if b}
    doc = {"bench": "sizes", "note": NOTE, "prompt": PROMPT, "settings": asdict(cfg), "bandwidth_gb_s": bw}
    doc["shapes"], doc["skipped"] = {}, {}
    for name in cfg.shapes:
        shape = gguf_shapes.SHAPES[name]
        path = gguf_shapes.ensure_gguf(name, log=log)
        peers: dict[str, PeerResult] = {}
        for peer in cfg.peers:
            why = None if peer == "yue" else llamacpp.unavailable(str(path))
            if why is not None:
                doc["skipped"][f"{peer}/{name}"] = why
                log(f"{peer} skipped on {name}: {why}")
                continue
            extra = llamacpp.extra_buffers_work(path) if peer == "llamacpp" else None
            peers[peer] = measure_peer(peer, path, cfg, extra, log)
            if peers[peer].skipped:
                doc["skipped"][f"{peer}/{name}"] = peers[peer].skipped
        doc["shapes"][name] = shape_document(shape, path, peers, bw, cfg)
    return doc


def _fmt(v, spec: str = ".2f") -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return "-" if not v else f"{statistics.median(v):{spec}} ({min(v):{spec}}-{max(v):{spec}})"
    if isinstance(v, dict):
        return f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"
    return format(v, spec)


def print_report(doc: dict) -> str:
    """The table (rich), the skipped entries, then the JSON document as the last stdout line."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=200, soft_wrap=False)
    console.print(f"yue bench-sizes: {NOTE}", markup=False)
    console.print(f"bandwidth GB/s by threads: {doc['bandwidth_gb_s']}", markup=False)
    threads = doc["settings"]["threads"]
    for name, s in doc["shapes"].items():
        t = Table(
            title=f"{name}: {s['file_gb']} GB file, {s['bytes_per_token_gb']} GB read per token, "
            f"ceiling tok/s {s['ceiling_tok_s']}",
            title_justify="left",
        )
        cols = list(s["peers"]) + (["yue / llama.cpp"] if s["yue_over_llamacpp"] else [])
        t.add_column("metric: median (min-max)")
        for c in cols:
            t.add_column(c, justify="right")
        ratios = s["yue_over_llamacpp"]
        rows = [
            ("load cold s", "load_cold_s", None),
            ("load+8 cold s", "load_plus_8_cold_s", "load_plus_8_s_cold"),
            ("load warm s", "load_warm_s", "load_s_warm"),
            ("load+8 warm s", "load_plus_8_warm_s", "load_plus_8_s_warm"),
            ("peak RSS MB", "peak_rss_mb", None),
        ]
        rows += [(f"decode tok/s @{n}", f"tok_s@{n}", f"tok_s@{n}") for n in threads]
        for label, key, rkey in rows:
            cells = [_fmt(p.get(key), ".0f" if "MB" in label else ".2f") for p in s["peers"].values()]
            t.add_row(label, *cells, *([_fmt(ratios.get(rkey))] if ratios else []))
        for n in threads:
            t.add_row(
                f"row cost 1..9 @{n}",
                *[
                    " ".join(f"{r:.2f}" for r in p[f"row_cost_ratio@{n}"])
                    if p.get(f"row_cost_ratio@{n}")
                    else "-"
                    for p in s["peers"].values()
                ],
                *([""] if ratios else []),
            )
        t.add_row(
            "page cache at cold load",
            *[p["page_cache"] for p in s["peers"].values()],
            *([""] if ratios else []),
        )
        console.print(t)
        console.print(s["vocab_note"], markup=False)
    for k, why in doc["skipped"].items():
        console.print(f"{k} skipped: {why}", markup=False)
    console.file.flush()
    line = json.dumps(doc)
    print(line, flush=True)
    return line
