"""One `yue bench-sizes` measurement, run in a fresh interpreter: `python -m yue.bench.sizes_worker SPEC`.

Design decisions:
- A process per measurement, so one peer's or one run's allocations never inflate another's peak RSS
  and each load starts from nothing in memory (`bench/memory.py`'s reasoning). The child imports
  torch, yue and llama_cpp before anything is timed, then resets the kernel's peak-RSS mark
  (`memory._reset_peak`), so the peak is the load's and the run's, beside the imports' floor.
- The same steps for both peers: load (timed), 8 greedy tokens (the "load + 8 tokens" wall time, and
  the warm-up), then `tokens` greedy new tokens timed per token: decode tokens/s = (n - 1) / (time
  from the first new token to the last), the prefill left out. EOS never stops a run (`ignore_eos`;
  llama.cpp's `generate` does not stop by itself).
- The row curve: one forward of 1..9 fed rows over a 200-token context, rolled back after each call,
  all rows' logits computed (as a verifying step needs): yue's `costs.verify_cost_curve` (argmax rows,
  the greedy path); llama.cpp's `llama_decode` of a batch of k tokens at position 200 with every row's
  logits requested, its KV cache cut back to 200 before each call. Interleaved rounds, medians
  (`costs._median_times`).
- The bandwidth probe: `torch.sum` over a 2 GiB float32 tensor at the given threads, best of 5.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Literal

from yue.bench.memory import _peak_mb, _reset_peak

CURVE_CONTEXT = 200
CURVE_ROWS = tuple(range(1, 10))
WARM_TOKENS = 8  # "load + 8 tokens", and the warm-up before the timed run


@dataclass(frozen=True)
class WorkerSpec:
    """What one child measures.

    Attributes:
        kind: "load" (load + 8 tokens only), "speed" (that, then the timed run and the row curve), or
            "bandwidth" (the memory probe; no model).
        peer: "yue" or "llamacpp". path: the GGUF file.
        threads, tokens, ctx_size: threads for every matmul, timed new tokens, the KV cache length.
        prompt: the fixed prompt text (each peer tokenizes it: the two share SmolLM2's tokenizer).
        extra_buffers: llama.cpp's extra CPU buffer types (`llamacpp.extra_buffers_work`, decided once).
        curve: measure the row curve too.
    """

    kind: Literal["load", "speed", "bandwidth"]
    peer: str = "yue"
    path: str = ""
    threads: int = 1
    tokens: int = 32
    ctx_size: int = 4096
    prompt: str = ""
    extra_buffers: bool | None = None
    curve: bool = True


def load_yue(path: str, threads: int, ctx_size: int):
    """`yue.load(path)` in its default precision (a lone GGUF: the file's own codes) with `ctx_size` and
    `threads`; a file that will not fit stops there, naming what it needs (`gguf_load.check_memory`)."""
    import yue

    return yue.load(path, ctx_size=ctx_size, threads=threads)


def _times_yue(engine, prompt: str, n: int) -> list[float]:
    """perf_counter stamps, one per new token, of a greedy `ar` run of exactly n tokens."""
    stamps: list[float] = []
    for ev in engine.stream(prompt, mode="ar", max_new_tokens=n, temperature=0.0, ignore_eos=True):
        now = time.perf_counter()
        stamps += [now] * len(ev.token_ids)
    return stamps[:n]


def _times_llamacpp(llm, prompt: str, n: int) -> list[float]:
    """perf_counter stamps, one per new token, of a greedy run of exactly n tokens from an empty context."""
    ids = llm.tokenize(prompt.encode(), add_bos=False)
    llm.reset()
    stamps: list[float] = []
    for _ in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, temp=0.0, repeat_penalty=1.0):
        stamps.append(time.perf_counter())
        if len(stamps) >= n:
            break
    return stamps


def _curve_yue(engine) -> list[float]:
    from yue.decode.costs import verify_cost_curve

    return verify_cost_curve(engine.model, context=CURVE_CONTEXT, rows=CURVE_ROWS, warmup=1, tries=5).step_s


def _curve_llamacpp(llm) -> list[float]:
    """Median seconds of one `llama_decode` of k rows (k = 1..9, every row's logits) at position 200."""
    from yue.decode.costs import _median_times

    n_vocab = min(llm.n_vocab(), 49152)  # real tokens of the shared tokenizer: values do not matter
    ids = [(7 * i + 11) % n_vocab for i in range(CURVE_CONTEXT + max(CURVE_ROWS))]
    llm.reset()
    llm.eval(ids[:CURVE_CONTEXT])

    def step(k: int):
        def call():
            llm._ctx.kv_cache_seq_rm(-1, CURVE_CONTEXT, -1)  # roll back: the cache holds the context only
            llm._batch.set_batch(
                batch=ids[CURVE_CONTEXT : CURVE_CONTEXT + k], n_past=CURVE_CONTEXT, logits_all=True
            )
            llm._ctx.decode(llm._batch)

        return call

    return _median_times([step(k) for k in CURVE_ROWS], warmup=1, tries=5)


def bandwidth(threads: int, gib: float = 2.0, tries: int = 5) -> float:
    """GB/s of `torch.sum` over a `gib` GiB float32 tensor at `threads` threads (best of `tries`)."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def run(spec: WorkerSpec) -> dict:
    """Measure `spec` in THIS process (see the module docstring)."""
    import torch  # noqa: F401  (imported before the peak mark is reset, for both peers alike)

    import yue  # noqa: F401

    if spec.kind == "bandwidth":
        return {"bandwidth_gb_s": bandwidth(spec.threads)}
    if spec.peer == "llamacpp":
        from yue.bench import llamacpp

        load = lambda: llamacpp.load(spec.path, spec.ctx_size, spec.threads, spec.extra_buffers)  # noqa: E731
        times, curve = _times_llamacpp, _curve_llamacpp
    else:
        load = lambda: load_yue(spec.path, spec.threads, spec.ctx_size)  # noqa: E731
        times, curve = _times_yue, _curve_yue
    reset = _reset_peak()
    base = _peak_mb(reset)
    t0 = time.perf_counter()
    model = load()
    load_s = time.perf_counter() - t0
    warm = times(model, spec.prompt, WARM_TOKENS)
    out = {"load_s": load_s, "load_plus_8_s": warm[-1] - t0, "base_rss_mb": base}
    if spec.kind == "speed":
        stamps = times(model, spec.prompt, spec.tokens)
        out["tok_s"] = (len(stamps) - 1) / (stamps[-1] - stamps[0])
        out["new_tokens"] = len(stamps)
        if spec.curve:
            out["step_s"] = curve(model)
    out["peak_rss_mb"] = _peak_mb(reset)
    return out


def spec_json(spec: WorkerSpec) -> str:
    return json.dumps(asdict(spec))


if __name__ == "__main__":
    print(json.dumps(run(WorkerSpec(**json.loads(sys.argv[1])))))
