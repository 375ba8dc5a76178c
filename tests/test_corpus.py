"""Corpus drafts (decode/corpus.py): the n-gram table of a model's own answers, its file, and
`verified` drafting from it while staying `ar`."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from typer.testing import CliRunner

import yue
from tests.stubs import chain_stub
from tests.test_loop import _chi2_pvalue, _random_stub
from yue.cli import app
from yue.config import DecodeConfig
from yue.decode.corpus import CorpusNgrams, _hash_columns, context_hashes, load_ngrams
from yue.decode.costs import StepCosts
from yue.decode.lookup import NgramIndex
from yue.decode.loop import decode
from yue.decode.policies import VerifiedPolicy
from yue.decode.sources import AcceptanceRecord, ContextCopies, CorpusDrafts, DraftSources
from yue.decode.state import Advance, LoopState
from yue.errors import CheckpointError
from yue.model.hf import NGRAMS_FILE, weight_files
from yue.registry import ASSETS
from yue.train.topnar import ChatSequences

FLAT = StepCosts((1.0,) * 16, (0.0,))


def _table(**kw) -> CorpusNgrams:
    # Prompt [9, 9] then answers: after (5, 6) came 7 three times and 8 once; (1, 2) -> 3 once only.
    seqs = [([9, 9, 5, 6, 7, 1, 2, 3], 2), ([9, 9, 5, 6, 7], 2), ([9, 5, 6, 7], 1), ([9, 9, 5, 6, 8], 2)]
    return CorpusNgrams.build(seqs, vocab_size=10, **kw)


def test_build_keeps_the_most_frequent_continuation_where_it_repeats():
    t = _table(min_count=2, min_share=0.5)
    assert t.match([0, 5, 6], 1)[1] == [7]  # 3 of 4
    assert t.match([1, 2], 3)[1] == []  # seen once: below min_count
    assert _table(min_count=1, min_share=0.0).match([1, 2], 1)[1] == [3]
    assert _table(min_count=2, min_share=0.8).match([0, 5, 6], 1)[1] == []  # 3/4 < 0.8
    # Only answer tokens are predicted (from contexts that may reach into the prompt).
    t = CorpusNgrams.build([([9, 9, 4, 5, 6], 4)], vocab_size=10, min_count=1, min_share=0.0)
    assert t.match([9, 9], 1)[1] == [] and t.match([4, 5], 1)[1] == [6]


def test_drafts_chain_through_the_longest_known_context():
    # The answer 1 2 3 4 twice, and 7 2 5 twice: (2,) alone is ambiguous, (1, 2) and (7, 2) are not.
    seqs = [([0, 1, 2, 3, 4], 1), ([0, 1, 2, 3, 4], 1), ([0, 7, 2, 5], 1), ([0, 7, 2, 5], 1)]
    t = CorpusNgrams.build(seqs, vocab_size=10, min_order=1, max_order=3, min_count=2, min_share=0.0)
    assert t.match([1, 2], 5)[1] == [3, 4]  # chained: (1, 2) -> 3, then (1, 2, 3) -> 4, then nothing
    assert t.match([8, 7, 2], 5)[1] == [5]
    assert t.match([2], 1)[1] in ([3], [5])  # the unigram context: either continuation, once each
    assert t.match([1, 2], 5) == (2, [3, 4])  # the first draft came from a 2-token context
    assert t.match([8, 7, 2], 5) == (2, [5]) and t.match([9, 9], 3) == (0, [])


def test_extended_adds_only_the_contexts_the_table_lacks():
    old = CorpusNgrams.build([([0, 1, 2, 3], 1), ([0, 1, 2, 3], 1)], vocab_size=10, min_count=2)
    new = CorpusNgrams.build([([0, 1, 2, 4, 5], 1), ([0, 1, 2, 4, 5], 1)], vocab_size=10, min_count=2)
    both = old.extended(new)
    # Both know (1, 2) and (0, 1, 2), the old table with 3 after them, the new with 4: the old one's stays.
    assert both.match([1, 2], 1)[1] == [3] and both.match([0, 1, 2], 1)[1] == [3]
    assert both.match([2, 4], 1)[1] == [5]  # only the new one knows (2, 4): added
    assert len(both) == len(old) + 3  # new: (2, 4), (1, 2, 4) and (0, 1, 2, 4), each -> 5
    for k in both.keys:
        assert np.all(k[1:] > k[:-1])  # still sorted and distinct: binary search stays right
    with pytest.raises(ValueError, match="differ"):
        old.extended(CorpusNgrams.build([([0, 1, 2, 3], 1)], vocab_size=10, min_order=1, min_count=1))
    # New answers may bring a longer order than the old table has: it comes from them alone.
    longer = old.extended(CorpusNgrams.build([([8, 0, 1, 2, 4, 5], 1)] * 2, vocab_size=10, max_order=5))
    assert longer.max_order == 5 and longer.match([8, 0, 1, 2, 4], 1) == (5, [5])
    assert longer.match([0, 1, 2], 1)[1] == [3]  # the old table's entries still win


def test_long_contexts_of_a_large_vocabulary_hash_alike_in_a_build_and_a_lookup():
    """Contexts are hashed (any length, any vocabulary): the build's vectorised hash and a lookup's
    must agree, or nothing would ever match."""
    V = 2**20
    g = np.random.default_rng(0)
    answer = g.integers(0, V, 60).tolist()
    t = CorpusNgrams.build([([7, *answer], 1)] * 2, vocab_size=V, min_order=2, max_order=7)
    assert t.nexts[0].dtype == np.uint32 and t.keys[0].dtype == np.uint32
    assert t.match([7, *answer[:10]], 50) == (7, answer[10:60])
    for n in range(1, 8):  # the scalar hash of each trailing n-gram, as the build computed it
        columns = [np.array([x]) for x in answer[10 - n : 10]]
        assert context_hashes(answer[:10], 7)[n - 1] == int(_hash_columns(columns)[0])


def test_a_table_of_packed_contexts_loads_as_the_same_drafts(tmp_path):
    """Tables written before contexts were hashed (n tokens packed into a uint64, the oldest highest,
    `bits` in the metadata) still load, and draft what they drafted."""
    _, packed = _packed_table([([9, 9, 5, 6, 7, 1, 2, 3], 2), ([9, 9, 5, 6, 7], 2)], bits=16)
    save_file(
        packed, str(tmp_path / NGRAMS_FILE), metadata={"bits": "16", "min_order": "2", "vocab_size": "10"}
    )
    back = CorpusNgrams.load(tmp_path / NGRAMS_FILE, vocab_size=10)
    assert back.match([0, 5, 6], 3) == (2, [7, 1, 2]) and back.match([9, 5, 6, 7], 1) == (4, [1])


def _packed_table(seqs, bits):
    """The older file's tensors for `seqs` (min count 1): per order 2..4, packed contexts -> token."""
    table = {}
    for ids, p in seqs:
        for n in (2, 3, 4):
            for c in range(max(n, p), len(ids)):
                key = 0
                for t in ids[c - n : c]:
                    key = (key << bits) | t
                table.setdefault(n, {}).setdefault(key, ids[c])
    tensors = {}
    for n, entries in table.items():
        keys = sorted(entries)
        tensors[f"keys.{n}"] = np.array(keys, dtype=np.uint64)
        tensors[f"next.{n}"] = np.array([entries[k] for k in keys], dtype=np.uint16)
    return table, tensors


def test_save_and_load_round_trip_with_checks(tmp_path):
    t = _table(min_count=1, min_share=0.0)
    path = tmp_path / NGRAMS_FILE
    t.save(path, source="test")
    back = CorpusNgrams.load(path, vocab_size=10)
    assert len(back) == len(t) and back.match([0, 5, 6], 3)[1] == t.match([0, 5, 6], 3)[1]
    with pytest.raises(CheckpointError, match="vocabulary of 10, not 11"):
        CorpusNgrams.load(path, vocab_size=11)
    path.write_bytes(path.read_bytes()[:-5])  # truncated
    with pytest.raises(CheckpointError, match="not a readable n-gram table"):
        CorpusNgrams.load(path, vocab_size=10)


def test_a_table_with_unsorted_keys_is_refused(tmp_path):
    t = _table(min_count=1, min_share=0.0)
    t.keys[0] = t.keys[0][::-1].copy()
    t.save(tmp_path / NGRAMS_FILE)
    with pytest.raises(CheckpointError, match="corrupt n-gram table"):
        CorpusNgrams.load(tmp_path / NGRAMS_FILE, vocab_size=10)


def _walk(V: int, n: int, start: int = 1) -> list[int]:
    """chain_stub's greedy AR walk after `start`: t -> t + 1 (mod V - 1)."""
    return [(start + i) % (V - 1) for i in range(1, n + 1)]


def test_corpus_drafts_follow_the_models_answers_and_stay_exact():
    """The NAR drafts never match and the context has no copies (prompt lookup off); a corpus of the
    model's own walk makes most steps verify several tokens, no drafting pass; a corpus of junk is
    rejected. Either way the output is `ar`'s."""
    N, K, V = 60, 8, 12
    cfg = DecodeConfig(
        mode="verified",
        max_new_tokens=N,
        router_threshold=1.0,
        block_size=K,
        reeval_every=5,
        prompt_lookup=False,
    )
    ar = _walk(V, N)
    walk = CorpusNgrams.build([([0, *ar], 1)], V, min_count=1, min_share=0.0)
    stub = chain_stub(V, K, slots_match=False)
    out = [t for em in decode(stub, [[1]], cfg, costs=None, corpus=walk) for t in em.tokens[0]]
    assert out == ar
    assert stub.forwards - stub.draft_passes < N / 3 and stub.draft_passes < N / 8
    g = np.random.default_rng(0)
    junk = CorpusNgrams.build([([0, *g.integers(0, V - 1, 400).tolist()], 1)], V, min_count=1, min_share=0.0)
    stub = chain_stub(V, K, slots_match=False)
    assert [t for em in decode(stub, [[1]], cfg, costs=None, corpus=junk) for t in em.tokens[0]] == ar
    off = chain_stub(V, K, slots_match=False)  # the same config without a corpus: a token a step
    cfg_off = DecodeConfig(**{**cfg.__dict__, "corpus_drafts": False})
    assert [t for em in decode(off, [[1]], cfg_off, costs=None, corpus=walk) for t in em.tokens[0]] == ar
    assert off.forwards - off.draft_passes > N - 2


def test_verified_sampling_with_corpus_drafts_matches_ar_distribution():
    """Corpus drafts are certain proposals (q one-hot), as copies are: the speculative rule keeps the
    distribution. Tokens 6-8, where a corpus over the 4 emitted tokens always has a draft."""
    g = np.random.default_rng(1)
    table = CorpusNgrams.build([([0, *g.integers(0, 4, 2000).tolist()], 1)], 5, min_count=1, min_share=0.0)

    def joint(mode: str, seed: int) -> Counter:
        cfg = DecodeConfig(
            mode=mode, max_new_tokens=8, temperature=1.0, seed=seed, router_threshold=1.0, block_size=4,
            reeval_every=5, prompt_lookup=False,
        )  # fmt: skip
        rows: list[list[int]] = [[] for _ in range(6000)]
        for em in decode(_random_stub(0), [[1]] * 6000, cfg, costs=FLAT, corpus=table):
            for r, t in zip(rows, em.tokens, strict=True):
                r.extend(t)
        return Counter(tuple(r[5:8]) for r in rows)

    assert _chi2_pvalue(joint("ar", 1), joint("verified", 2)) > 1e-3


def test_a_model_folder_table_is_loaded_and_never_read_as_weights(tiny_model_dir, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model_dir, folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    CorpusNgrams.build([([0, 1, 2, 3, 1, 2, 3], 1)], vocab, min_count=1).save(folder / NGRAMS_FILE)
    assert NGRAMS_FILE not in [p.name for p in weight_files(folder)]
    engine = yue.load(folder)
    assert engine.corpus is not None and engine.corpus.match([1, 2], 1)[1] == [3]
    with pytest.raises(CheckpointError, match="vocabulary"):
        load_ngrams(folder, vocab + 1)
    (folder / NGRAMS_FILE).write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="n-gram table"):
        yue.load(folder)
    (folder / NGRAMS_FILE).unlink()
    assert yue.load(folder).corpus is None


def test_build_ngrams_command_writes_the_table_from_sequences(tiny_model_dir, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model_dir, folder)
    seq = ChatSequences([[5, 1, 2, 3, 1, 2, 3], [5, 1, 2, 3, 1, 2, 3], [6, 1, 2, 3]], [1, 1, 1])
    seq.save(tmp_path / "sequences.json")
    result = CliRunner().invoke(
        app,
        ["build-ngrams", str(folder), "--sequences", str(tmp_path / "sequences.json"), "--min-count", "2"],
    )
    assert result.exit_code == 0, result.output
    assert "from 2 answers" in result.output  # the repeated prompt counts once
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    # (1, 2) -> 3 three times; (2, 3) -> 1 once (twice had the repeated prompt counted): pruned.
    assert CorpusNgrams.load(folder / NGRAMS_FILE, vocab).match([0, 1, 2], 2)[1] == [3]
    more = ChatSequences([[7, 4, 4, 5], [8, 4, 4, 5]], [1, 1])
    more.save(tmp_path / "more.json")
    args = ["build-ngrams", str(folder), "--sequences", str(tmp_path / "more.json"), "--extend"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = CorpusNgrams.load(folder / NGRAMS_FILE, vocab)
    assert table.match([0, 1, 2], 1)[1] == [3] and table.match([4, 4], 1)[1] == [5]  # old kept, new added
    assert "extended with 2 answers" in table.source
    (folder / NGRAMS_FILE).unlink()
    nothing = CliRunner().invoke(app, args)
    assert nothing.exit_code != 0 and "no ngrams.safetensors to extend" in nothing.output
    missing = CliRunner().invoke(app, ["build-ngrams", str(tmp_path / "nope"), "--sequences", "x.json"])
    assert missing.exit_code == 2 and "no config.json" in missing.output


def test_shipped_yue_smol_table_matches_its_vocabulary():
    """The table shipped beside yue-smol's NAR set reads back, for the model's vocabulary."""
    config = json.loads((ASSETS / "yue-smol" / "config.json").read_text())
    table = CorpusNgrams.load(ASSETS / "yue-smol" / NGRAMS_FILE, vocab_size=config["vocab_size"])
    assert len(table) > 100_000 and all(k.dtype == np.uint32 for k in table.keys)


def test_batched_rows_draft_from_the_corpus_and_stay_exact(tiny_model_dir):
    """A batch (the server's path: `Engine.decode_batch` under `generate` of a list) drafts from the
    engine's table: built from the model's own answers, it saves forwards; the output stays `ar`'s."""
    engine = yue.load(tiny_model_dir)
    prompts = ["def alpha(x):\n", "class Point:\n"]
    ar = [engine.generate(p, mode="ar", max_new_tokens=32) for p in prompts]
    answers = [
        (engine.encode(p) + r.token_ids, len(engine.encode(p))) for p, r in zip(prompts, ar, strict=True)
    ]
    engine.corpus = CorpusNgrams.build(answers, engine.model.config.vocab_size, min_count=1, min_share=0.0)
    kw = dict(mode="verified", max_new_tokens=32, router_threshold=1.0, prompt_lookup=False)
    with_corpus = engine.generate(prompts, **kw)
    assert [r.token_ids for r in with_corpus] == [r.token_ids for r in ar]
    engine.corpus = None
    without = engine.generate(prompts, **kw)
    assert [r.token_ids for r in without] == [r.token_ids for r in ar]
    forwards = lambda runs: sum(r.stats.forwards - r.stats.draft_passes for r in runs)  # noqa: E731
    assert forwards(with_corpus) < forwards(without)


def test_free_drafts_come_from_the_source_whose_record_for_its_match_promises_more():
    """The context repeats a 2-gram (copy [7, 1, 5]); the corpus knows the trailing 4-gram (draft
    [9, 9, 9]). Each (source, match length) keeps its own record, and the better one is drafted."""
    cfg = DecodeConfig(mode="verified", router_threshold=1.0, block_size=4)
    corpus = CorpusNgrams.build([([0, 7, 1, 5, 6, 9, 9, 9, 9], 1)], 10, min_count=1, min_share=0.0)

    def drafted(records: dict) -> tuple[list[int], AcceptanceRecord]:
        sources = [ContextCopies(), CorpusDrafts(corpus)]
        for (name, key), record in records.items():  # (source, match length) -> its record
            next(s for s in sources if s.name == name).records[key] = record
        st = LoopState(cfg, [None], torch.tensor([[6]]), costs=FLAT)
        st.drafts = DraftSources(free=sources, contexts=[NgramIndex([5, 6, 7, 1, 5, 6])])
        st.drafts.block.ar_stretch = 1  # no NAR pass competes
        adv = Advance([1], [[6]], [["ar"]], [["ar"]], torch.tensor([[6]]))
        assert VerifiedPolicy().copy(None, st, adv)
        records.update({(s.name, key): r for s in sources for key, r in s.records.items()})
        assert set(records) == {("copy", 2), ("corpus", 4)}  # one record per source and match length
        return adv.next_fed[0, 1:].tolist(), st.drafts.in_flight

    failing = AcceptanceRecord()
    for _ in range(20):
        failing.observe(3, 0)
    records = {("copy", 2): failing}
    assert drafted(records) == ([9, 9, 9], records[("corpus", 4)])  # the copies keep failing here
    records = {("corpus", 4): failing}
    assert drafted(records) == ([7, 1, 5], records[("copy", 2)])  # the corpus drafts do
