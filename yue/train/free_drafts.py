"""How a model's free drafts fare on its own answers: the measured priors `YueConfig.free_draft_rates`.

At every position of greedy answers, each free source (`decode.policies.VerifiedPolicy.copy`) proposes its
drafts as `verified` finds them there: tokens copied from the context so far (`decode/lookup.py`),
tokens chained from the model's n-gram table (`decode/corpus.py`). Grouped by source and by the length
of the context the first draft matched ("copy:2" ... "corpus:4"), c_j is the share of positions whose
draft j was judged (it was proposed, and drafts 1..j-1 held) where it held: what an `AcceptanceRecord`
counts as a request decodes, so its prior starts where such drafts have stood. Measure on a calibration
split's answers, and report speed on another split.
"""

from __future__ import annotations

from yue.decode.corpus import CorpusNgrams
from yue.decode.lookup import NgramIndex
from yue.decode.policies import AcceptanceRecord
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
    records: dict[str, AcceptanceRecord] = {}  # what a request's records count, over every position
    for ids, p in answers.pairs():
        context = NgramIndex(ids[:p])
        for c in range(p, len(ids)):
            found = [("copy", context.match(n))]
            if corpus is not None:
                found.append(("corpus", corpus.match(ids[max(c - corpus.max_order, 0) : c], n)))
            for name, (order, drafts) in found:
                if drafts:
                    truth = ids[c : c + len(drafts)]  # shorter at the answer's end: a miss there
                    pairs = zip(drafts, truth, strict=False)
                    held = next((j for j, (d, t) in enumerate(pairs) if d != t), len(truth))
                    records.setdefault(f"{name}:{order}", AcceptanceRecord()).observe(len(drafts), held)
            context.extend([ids[c]])
    rates = {}
    for kind in sorted(records):
        r = records[kind]
        m = next((j for j, judged in enumerate(r.reached) if judged < min_judged), len(r.reached))
        if m:
            rates[kind] = [round(h / j, 3) for h, j in zip(r.held[:m], r.reached[:m], strict=True)]
    return rates
