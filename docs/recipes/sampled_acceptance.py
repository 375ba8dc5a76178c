"""How `verified`'s drafts fare under speculative sampling, by source and draft position, against what
the policy assumed when it chose them (a development script, not part of the package; issue 42).

    python docs/recipes/sampled_acceptance.py MODEL DTYPE PROMPTS.jsonl OUT.json [temperature] [limit]

`verified` answers each prompt (128 tokens, prompt i seeded with i, as `yue bench --seed 0` does) with
the decode policy's own choices; every verifying step records its drafts' source and match length
(the record's key), how many it verified and kept, the policy's assumed survival for them (the chosen
record's, or the router's scaled by its record: what `best_draft` weighed), and at each drafted
position the target's warped probability of the draft, p(x) (a point-mass draft is accepted with
exactly that), the NAR block's q(x), and whether x was the target's argmax (what greedy would have
kept). Also the step's cost against its rows as greedy steps pay it (the head's argmax screen) and as
sampled ones do (the whole head), on the row kernel, one thread, in thread CPU time. Never run it on the split the speed
is reported on.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict

import torch

import yue
import yue.decode.policies as pol
from yue.bench.prompts import load_prompts
from yue.decode.sampling import warp
from yue.model.masks import decode_mask
from yue.model.prepared import as_decoded

STEPS: list[dict] = []
_last_survival: list[float] | None = None


def _key(record) -> int:
    for src in (*_free_sources, _block):
        for key, rec in src.records.items():
            if rec is record:
                return key
    return -1


_free_sources: list = []
_block = None


def _patch() -> None:
    original_best, original_verify = pol.best_length, pol.VerifiedPolicy.verify
    original_copy, original_draft = pol.VerifiedPolicy.copy, pol.VerifiedPolicy.draft

    def best_length(st, survival, draft_pass=True):
        global _last_survival
        _last_survival = list(survival)
        return original_best(st, survival, draft_pass)

    def copy(self, model, st, adv):
        ok = original_copy(self, model, st, adv)
        if ok:
            st.assumed = st.drafts.in_flight.survival(adv.next_drafts[0])
        return ok

    def draft(self, model, st, adv, out, logits):
        global _last_survival
        _last_survival = None
        adv = original_draft(self, model, st, adv, out, logits)
        k = (adv.next_drafts or [0])[0]
        if k:
            st.assumed = (_last_survival or st.drafts.block.record().survival(k))[:k]
        return adv

    def verify(self, st, target):
        global _free_sources, _block
        k = st.max_drafts
        if st.cfg.greedy or k == 0:
            return original_verify(self, st, target)
        _free_sources, _block = st.drafts.free, st.drafts.block
        rec = st.drafts.verifying
        drafts = st.fed[0, -k:]
        logp = warp(target[0], st.cfg)  # (k + 1, V)
        idx = torch.arange(k)
        p_x = logp[idx, drafts].exp().tolist()
        q = st.draft_logprobs[0].exp()  # (k, V)
        row = dict(
            source=rec.source,
            key=_key(rec),
            k=k,
            assumed=list(getattr(st, "assumed", [])),
            p_x=p_x,
            q_x=q[idx, drafts].tolist(),
            is_argmax=(logp[:k].argmax(-1) == drafts).tolist(),
            p_max=logp[:k].max(-1).values.exp().tolist(),
        )
        if rec.source == "nar":  # position 1: sampled q against a point mass on q's argmax
            row["overlap_1"] = float(torch.minimum(logp[0].exp(), q[0]).sum())
            row["p_argmax_q_1"] = float(logp[0, q[0].argmax()].exp())
        n_acc, nxt = original_verify(self, st, target)
        row["accepted"] = n_acc[0]
        STEPS.append(row)
        return n_acc, nxt

    pol.best_length = best_length
    pol.VerifiedPolicy.copy, pol.VerifiedPolicy.draft, pol.VerifiedPolicy.verify = copy, draft, verify


def summarize(steps: list[dict], tokens: int, verifying_steps: int) -> dict:
    by = defaultdict(list)
    for s in steps:
        by[f"{s['source']}:{s['key']}"].append(s)
        by[s["source"]].append(s)
    out = {}
    for name, rows in sorted(by.items()):
        pos = []
        for j in range(max(r["k"] for r in rows)):
            judged = [r for r in rows if r["k"] > j and r["accepted"] >= j]
            if not judged:
                break
            assumed = [
                r["assumed"][j] / (r["assumed"][j - 1] if j else 1.0)
                for r in judged
                if len(r["assumed"]) > j and (j == 0 or r["assumed"][j - 1] > 0)
            ]
            pos.append(
                dict(
                    judged=len(judged),
                    held=round(sum(r["accepted"] > j for r in judged) / len(judged), 3),
                    mean_p_x=round(statistics.mean(r["p_x"][j] for r in judged), 3),
                    argmax=round(sum(r["is_argmax"][j] for r in judged) / len(judged), 3),
                    assumed=round(statistics.mean(assumed), 3) if assumed else None,
                )
            )
        entry = dict(
            steps=len(rows),
            mean_k=round(statistics.mean(r["k"] for r in rows), 3),
            accepted_per_step=round(statistics.mean(r["accepted"] for r in rows), 3),
            assumed_per_step=round(statistics.mean(sum(r["assumed"]) for r in rows), 3),
            positions=pos,
        )
        if "overlap_1" in rows[0]:
            entry["sampled_q_acceptance_1"] = round(statistics.mean(r["overlap_1"] for r in rows), 3)
            entry["point_mass_argmax_q_acceptance_1"] = round(
                statistics.mean(r["p_argmax_q_1"] for r in rows), 3
            )
        out[name] = entry
    drafted = [s for s in steps]
    return dict(
        tokens=tokens,
        verifying_steps=verifying_steps,
        drafting_steps=len(drafted),
        rows_verified=sum(s["k"] for s in drafted),
        accepted=sum(s["accepted"] for s in drafted),
        accepted_per_verifying_step=round(sum(s["accepted"] for s in drafted) / max(verifying_steps, 1), 3),
        by_source=out,
    )


@torch.inference_mode()
def row_costs(engine, context: int = 128, tries: int = 7) -> dict:
    """Median ms of a step over 1..9 fed rows, the head screened for its argmax (greedy) or whole."""
    model = as_decoded(engine.model)
    cfg = model.config
    cache = model.new_cache(1, context + 12)
    ids = torch.randint(cfg.vocab_size, (1, context + 10), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(cache.capacity)
    model.step(
        ids[:, :context], pos[:context], context, decode_mask(0, context, 0, cache.key_valid, "cpu"), cache, 1
    )
    cache.advance(context)
    out = {}
    for top1 in (True, False):
        times = defaultdict(list)
        for t in range(tries + 1):
            for n in range(1, 10):
                m = decode_mask(context, n, 0, cache.key_valid, "cpu")
                t0 = time.thread_time()
                model.step(
                    ids[:, context : context + n], pos[context : context + n], n, m, cache, n, top1=top1
                )
                if t:
                    times[n].append(time.thread_time() - t0)
        med = [statistics.median(times[n]) * 1e3 for n in range(1, 10)]
        out["greedy_screened" if top1 else "sampled_whole_head"] = dict(
            ms=[round(x, 3) for x in med], ratio=[round(x / med[0], 3) for x in med]
        )
    return out


def main(
    model: str,
    dtype: str,
    prompts: str,
    out: str,
    temperature: float = 0.7,
    limit: int | None = None,
    greedy_rates: bool = False,
) -> None:
    torch.set_num_threads(1)
    engine = yue.load(model, dtype=None if dtype == "float32" else dtype)
    _patch()
    if greedy_rates:  # the A/B's other arm: sampled requests primed with the greedy rates
        engine.model.config.sampled_draft_rates = None
    tokens = verifying = passes = 0
    for i, p in enumerate(load_prompts(prompts, engine, limit)):
        r = engine.generate(p.text, mode="verified", temperature=temperature, seed=i, max_new_tokens=128)
        tokens += len(r.token_ids)
        verifying += r.stats.forwards - r.stats.draft_passes
        passes += r.stats.draft_passes
    doc = dict(model=model, dtype=dtype, prompts=prompts, temperature=temperature, limit=limit)
    doc |= dict(greedy_rates=greedy_rates, drafting_passes=passes)
    doc |= summarize(STEPS, tokens, verifying)
    doc["row_costs"] = costs = row_costs(engine)
    # `verified`'s steps and drafting passes at the costs a sampled step pays (thread CPU time, the whole
    # head), against `ar`'s one-row step per token: load-independent, the decode loop's Python aside.
    step = costs["sampled_whole_head"]["ms"]
    rows = sum(step[s["k"]] for s in STEPS) + step[0] * (verifying - len(STEPS))
    doc["modelled_ar_over_verified"] = round(
        tokens * step[0] / (rows + passes * engine.costs.passes[2] / engine.costs.step[0] * step[0]), 3
    )
    doc["steps"] = STEPS
    with open(out, "w") as f:
        json.dump(doc, f)
    print(json.dumps({k: v for k, v in doc.items() if k != "steps"}, indent=1))


if __name__ == "__main__":
    a = sys.argv[1:]
    greedy_rates = "--greedy-rates" in a
    a = [x for x in a if x != "--greedy-rates"]
    main(
        a[0],
        a[1],
        a[2],
        a[3],
        float(a[4]) if len(a) > 4 else 0.7,
        int(a[5]) if len(a) > 5 else None,
        greedy_rates,
    )
