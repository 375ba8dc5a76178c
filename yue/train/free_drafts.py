"""How a model's free drafts fare on its own answers: the measured priors `YueConfig.free_draft_rates`.

At every position of greedy answers, each free source (`decode/sources.py`) proposes its drafts as
`verified` finds them there: tokens copied from the context so far (`ContextCopies`), tokens chained
from the model's n-gram table (`CorpusDrafts`). Grouped by source and by the length of the context the
first draft matched ("copy:2" ... "corpus:4"), c_j is the share of positions whose draft j was judged
(it was proposed, and drafts 1..j-1 held) where it held: what the source's `AcceptanceRecord` for that
match counts as a request decodes, so its prior starts where such drafts have stood. Measure on a
calibration split's answers, and report speed on another split.
"""

from __future__ import annotations

from yue.decode.corpus import CorpusNgrams
from yue.decode.lookup import NgramIndex
from yue.decode.sources import ContextCopies, CorpusDrafts, FreeSource, common_prefix
from yue.train.topnar import ChatSequences

# A rate judged fewer times than this is left out (the record then carries its predecessor's on).
MIN_JUDGED = 20


def free_draft_rates(
    answers: ChatSequences, corpus: CorpusNgrams | None, n: int, min_judged: int = MIN_JUDGED
) -> dict[str, list[float]]:
    """Per free source and match length, c_1..c_m (each judged at least `min_judged` times).

    Args:
        answers: prompts and the model's greedy answers to them (the answers' positions are measured).
        corpus: the model's n-gram table, or None (copies only).
        n: drafts proposed at most (the model's block size - 1, as `verified` drafts).
    """
    # Sources without priors: their records count what a request's would, over every position.
    sources: list[FreeSource] = [ContextCopies()] + ([CorpusDrafts(corpus)] if corpus is not None else [])
    for ids, p in answers.pairs():
        context = NgramIndex(ids[:p])
        for c in range(p, len(ids)):
            for source in sources:
                order, drafts = source.match(context, n)
                if drafts:
                    source.record(order).observe(len(drafts), common_prefix(drafts, ids[c:]))
            context.extend([ids[c]])
    records = {f"{s.name}:{order}": r for s in sources for order, r in s.records.items()}
    rates = {}
    for kind in sorted(records):
        r = records[kind]
        m = next((j for j, judged in enumerate(r.reached) if judged < min_judged), len(r.reached))
        if m:
            rates[kind] = [round(h / j, 3) for h, j in zip(r.held[:m], r.reached[:m], strict=True)]
    return rates
