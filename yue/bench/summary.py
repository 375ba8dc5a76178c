"""Summarising a bench run's samples: speed statistics per entry, quality relative to `ar`, speed
relative to the peers.

Design decisions:
- Every entry is scored the same way, ours and the peers alike: NLL under our float AR path
  (`metrics.ar_nll`, memoised per distinct output), exact match with `ar`'s tokens, chrF against the
  references, repetition. An entry's first output per prompt is the one scored (greedy outputs repeat).
- Speed is the median of per-call tokens/s (p10/p90 beside it); ratios divide medians of one run.
- Who wrote the output (`token_sources`): each source's share of all the entry's generated tokens
  (NAR set, context copies, corpus table, AR path), summed over its calls; none for a peer.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from yue.bench import metrics
from yue.bench.runners import Prompt, Sample

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
    "speedup_vs_llamacpp_greedy",
    "token_sources",
)


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


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def token_shares(samples: list[Sample]) -> dict[str, float] | None:
    """Each source's share of the samples' generated tokens, {"nar", "copy", "corpus", "ar"} summing to
    1 (None for a peer's samples, or no tokens)."""
    if not samples or any(s.token_sources is None for s in samples):
        return None
    written = Counter()
    for s in samples:
        written.update(s.token_sources)
    total = sum(written.values())
    return {w: round(n / total, 4) for w, n in written.items()} if total else None


def summarise(
    names: list[str],
    samples: dict[str, list[Sample]],
    warmup: dict[str, float],
    memory: dict[str, dict[str, float]],
    prompts: list[Prompt],
    model,
) -> dict[str, Summary]:
    """Speed statistics per entry, then quality relative to `ar` and speed relative to the peers.

    Args:
        names: the entries, in report order.
        samples: each entry's timed calls on `prompts`.
        warmup: seconds of each entry's warm-up call (entries without one: no value).
        memory: {"peak_rss_mb", "base_rss_mb"} per entry that was measured.
        prompts: the prompt set the samples index into.
        model: the YueForCausalLM whose AR path scores every output's NLL.
    """
    nll_memo: dict[tuple[int, tuple[int, ...]], tuple[float, int]] = {}

    def nll_of(i: int, toks: list[int]) -> tuple[float, int]:
        key = (i, tuple(toks))
        if key not in nll_memo:
            nll_memo[key] = metrics.ar_nll(model, prompts[i].ids, toks)
        return nll_memo[key]

    out: dict[str, Summary] = {}
    first: dict[str, dict[int, tuple[list[int], str]]] = {}
    for name in names:
        ss = samples[name]
        tps = [s.new_tokens / s.wall_s for s in ss if s.wall_s > 0]
        ttft = [s.ttft_s for s in ss if s.ttft_s is not None]
        tokens = sum(s.new_tokens for s in ss)
        lengths = [a for s in ss for a in s.accept_lengths]
        outputs: dict[int, tuple[list[int], str]] = {}
        for s in ss:
            for i, t, txt in s.rows:
                outputs.setdefault(i, (t, txt))
        first[name] = outputs
        nll = [nll_of(i, t) for i, (t, _) in outputs.items()]
        n_tok = sum(n for _, n in nll)
        order = sorted(outputs)
        mem = memory.get(name, {})
        out[name] = Summary(
            values={
                "tokens_per_s": statistics.median(tps) if tps else None,
                "ttft_ms": statistics.median(ttft) * 1e3 if ttft else None,
                # forwards per generated token of one row (a lockstep batch forward serves every row)
                "forwards_per_token": sum(s.forwards * len(s.rows) for s in ss) / tokens if tokens else None,
                "mean_accepted": statistics.fmean(lengths) if lengths else None,
                "chrf": metrics.chrf([outputs[i][1] for i in order], [prompts[i].reference for i in order]),
                "repetition": metrics.repetition_rate([outputs[i][0] for i in order]),
                "peak_rss_mb": mem.get("peak_rss_mb"),
                "token_sources": token_shares(ss),
            },
            tokens_per_s_p10=metrics.percentile(tps, 10),
            tokens_per_s_p90=metrics.percentile(tps, 90),
            accept_hist={a: lengths.count(a) for a in sorted(set(lengths))},
            warmup_s=warmup.get(name),
            base_rss_mb=mem.get("base_rss_mb"),
            nll=sum(x for x, _ in nll) / n_tok if n_tok else None,
        )
    ar, hf, lc = out.get("ar"), out.get("hf-greedy"), out.get("llamacpp-greedy")
    for name in names:
        s, v = out[name], out[name].values
        v["speedup_vs_hf_greedy"] = _ratio(v["tokens_per_s"], hf and hf.values["tokens_per_s"])
        v["speedup_vs_llamacpp_greedy"] = _ratio(v["tokens_per_s"], lc and lc.values["tokens_per_s"])
        ref = first.get("ar")
        mine = first[name]
        v["exact_match_vs_ar"] = (
            sum(mine[i][0] == ref[i][0] for i in mine if i in ref) / len(mine) if ref and mine else None
        )
        v["nll_ratio_vs_ar"] = _ratio(s.nll, ar and ar.nll)
        v["chrf_ratio_vs_ar"] = _ratio(v["chrf"], ar and ar.values["chrf"])
    return out
