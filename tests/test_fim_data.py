"""FIM training rows (`yue.train.fim_data`): FIM tokens added to a vocabulary without them, the embedding
grown, the cuts, the PSM/SPM rows, the batches' determinism, and a tiny model built here whose infill
prompt uses the added tokens and whose joint loss trains their rows."""

from __future__ import annotations

import random

import numpy as np
import torch

import yue
from tests.conftest import tiny_config
from yue.infill import find_fim_tokens
from yue.model import YueForCausalLM
from yue.tokenizer import YueTokenizer
from yue.train.data import PackedSequences
from yue.train.fim_data import (
    FimBatches,
    FimCut,
    FimSettings,
    add_fim_tokens,
    cut_document,
    fim_row,
    grow_vocab,
)
from yue.train.losses import joint_loss, sample_anchors

CODE = "\n".join(
    f"def f{i}(x):\n    y = x + {i}\n    if y > {i * 2}:\n        return y\n    return x * {i}\n"
    for i in range(40)
)


def _fim_tokenizer(tokenizer: YueTokenizer, tmp_path) -> YueTokenizer:
    tok = YueTokenizer.load(tokenizer.save(tmp_path / "tok"))
    add_fim_tokens(tok)
    return tok


def test_fim_tokens_are_added_at_the_end_and_leave_every_encoding_alone(tokenizer, tmp_path):
    before = tokenizer.vocab_size
    text = "def g(a):\n    return a <fim_middle> 1\n"
    old_ids = tokenizer.encode(text)
    tok = _fim_tokenizer(tokenizer, tmp_path)
    fim = find_fim_tokens(tok)
    assert fim is not None and fim.style == "starcoder" and fim.file_sep is None
    assert [fim.prefix, fim.suffix, fim.middle] == [before, before + 1, before + 2]
    assert tok.vocab_size == before + 3
    assert tok.encode("def g(a):\n    return a") == tokenizer.encode("def g(a):\n    return a")
    assert fim.middle not in tok.encode(text)  # FIM-token text in a file stays text
    assert len(old_ids) > 0
    assert add_fim_tokens(tok) == fim and tok.vocab_size == before + 3  # a second call adds nothing


def test_cuts_rejoin_to_the_document_and_start_the_middle_at_a_line(tokenizer):
    rng = random.Random(0)
    settings = FimSettings(char_cut_rate=0.0)
    for _ in range(200):
        cut = cut_document(CODE, rng, settings)
        assert cut.prefix + cut.middle + cut.suffix == CODE
        assert cut.prefix.endswith("\n") or cut.middle.startswith("\n")
        assert cut.middle.strip()
    assert cut_document("one line", rng, settings) is None


def test_psm_and_spm_rows_put_the_middle_last_and_close_it_with_eos(tokenizer, tmp_path):
    tok = _fim_tokenizer(tokenizer, tmp_path)
    fim = find_fim_tokens(tok)
    cut = FimCut("def f(x):\n", "    return x\n", "\nprint(f(1))\n")
    p, m, s = (tok.encode(t) for t in (cut.prefix, cut.middle, cut.suffix))
    eos = tok.eos_id
    psm = fim_row(cut, tok, fim, 256, spm=False, rng=random.Random(0))
    assert psm == [eos, fim.prefix, *p, fim.suffix, *s, fim.middle, *m, eos]
    spm = fim_row(cut, tok, fim, 256, spm=True, rng=random.Random(0))
    assert spm == [eos, fim.prefix, fim.suffix, *s, fim.middle, *p, *m, eos]
    long = FimCut(CODE, "    return x\n", CODE)  # contexts cut to fit, the middle kept whole
    row = fim_row(long, tok, fim, 64, spm=False, rng=random.Random(0))
    assert len(row) <= 64 and row[-len(m) - 2 :] == [fim.middle, *m, eos]


def _batches(tok: YueTokenizer, seq_len: int = 64) -> FimBatches:
    stream_ids = np.asarray(tok.encode(CODE * 3), dtype=np.int32)
    stream = PackedSequences(stream_ids, seq_len, seed=0)
    return FimBatches([CODE], stream, tok, find_fim_tokens(tok), seed=5)


def test_batches_are_a_function_of_the_step_with_fim_rows_first(tokenizer, tmp_path):
    tok = _fim_tokenizer(tokenizer, tmp_path)
    fim = find_fim_tokens(tok)
    batches = _batches(tok)
    x, n_fim = batches.batch(3, 8)
    again, n_again = _batches(tok).batch(3, 8)
    assert torch.equal(x, again) and n_fim == n_again
    assert x.shape == (8, 64) and 0 < n_fim < 8
    for r, row in enumerate(x.tolist()):
        assert (fim.middle in row) == (r < n_fim)
    assert not torch.equal(x, batches.batch(4, 8)[0])


def test_a_tiny_model_grown_for_fim_infills_with_its_tokens_and_trains_their_rows(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = YueForCausalLM(tiny_config(tokenizer))
    old = model.model.embed_tokens.weight.detach().clone()
    tok = _fim_tokenizer(tokenizer, tmp_path)
    assert grow_vocab(model, tok.vocab_size) == 3
    emb = model.model.embed_tokens.weight
    assert torch.equal(emb[: old.shape[0]], old) and model.lm_head.weight is emb
    assert torch.allclose(emb[-1], old.mean(0))
    # The joint loss on FIM rows reaches the new rows (inputs and tied outputs).
    x, _ = _batches(tok).batch(0, 4)
    anchors = sample_anchors(4, 64, 2, model.config.block_size, torch.Generator().manual_seed(0))
    joint_loss(model, x, anchors, model.config.block_size).total.backward()
    assert emb.grad[-3:].abs().sum() > 0
    model.save_pretrained(tmp_path / "model")
    tok.save(tmp_path / "model")
    engine = yue.load(str(tmp_path / "model"))
    fim = find_fim_tokens(engine.tokenizer)
    ids = engine.infill("def f(x):\n", "\nprint(f(1))\n")
    assert [i for i in ids if i >= old.shape[0]] == [fim.prefix, fim.suffix, fim.middle]
    ar = engine.generate(ids, mode="ar", max_new_tokens=8)
    assert engine.generate(ids, mode="verified", max_new_tokens=8).token_ids == ar.token_ids
