"""`yue distill` and NAR-only self-distillation keep the AR path's logits unchanged."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

from tests.conftest import pattern_corpus
from yue.model import CheckpointError, load_model
from yue.model.hf import is_nar_or_router
from yue.train.distill import DistillConfig, distill, load_llama
from yue.train.router import RouterTrainConfig
from yue.train.selfdistill import NARFinetuneConfig, build_greedy_sequences, finetune_nar


def llama_tokenizer() -> Tokenizer:
    """A byte-level BPE with a Llama-style special token and no `<|mask|>`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(pattern_corpus(300), trainer=trainer)
    return tok


def save_tiny_llama(path, layers: int = 2, tied: bool = False, max_positions: int = 128):
    """A tiny random LlamaForCausalLM with its tokenizer.json, saved as safetensors to `path`."""
    tok = llama_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tied,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny random LlamaForCausalLM (untied head) with its tokenizer.json, saved as safetensors."""
    return save_tiny_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "code.jsonl"
    with path.open("w") as f:
        for i in range(8):
            f.write(json.dumps({"text": "".join(pattern_corpus(10, seed=i))}) + "\n")
    return path


def test_distill_keeps_the_ar_logits_of_the_base_unchanged(llama_dir, corpus_file, tmp_path):
    out = tmp_path / "distilled"
    cfg = DistillConfig(
        corpus=str(corpus_file),
        block_size=4,
        sequences=8,
        router_sequences=4,
        prompt_len=8,
        new_tokens=16,
        anchors_per_seq=8,
        nar=NARFinetuneConfig(steps=3, batch_size=4, anchors=4, warmup_steps=1),
        router=RouterTrainConfig(epochs=2),
    )
    report = distill(llama_dir, out, cfg)
    base = LlamaForCausalLM.from_pretrained(llama_dir, use_safetensors=True).eval()
    model = load_model(out)
    V = base.config.vocab_size
    # <|mask|> was added as a new token; the vocabulary grew by exactly one row.
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.token_to_id("<|mask|>") == V == model.config.mask_token_id == report["mask_token_id"]
    assert model.config.vocab_size == V + 1 and model.config.block_size == 4
    x = torch.tensor([tok.encode("def alpha_3(x):\n    return beta(x) + 3\n").ids])
    with torch.no_grad():
        ref = base(x).logits  # (1, T, V)
        got = model(x).logits  # (1, T, V + 1)
    torch.testing.assert_close(got[..., :V], ref, rtol=0, atol=1e-5)
    # The NAR set trained (it started as a copy of the AR set) and the router was fitted.
    sd = model.state_dict()
    nar = [k for k in sd if ".nar_" in k and "mlp" in k]
    assert any(not torch.equal(sd[k], sd[k.replace(".nar_", ".")]) for k in nar)
    assert "router_auc" in report["router"]
    assert (out / "distill_report.json").is_file() and not list(out.glob("*.bin"))


def test_nar_only_finetune_leaves_every_ar_parameter_bit_identical(trained_model_dir, tokenizer):
    model = load_model(trained_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    docs = [tokenizer.encode("".join(pattern_corpus(6, seed=s))) for s in range(2)]
    seqs = build_greedy_sequences(model, docs, 4, prompt_len=8, new_tokens=20, progress=False)
    history = finetune_nar(
        model, seqs, NARFinetuneConfig(steps=4, batch_size=2, anchors=4, warmup_steps=1), progress=False
    )
    assert len(history) == 4 and all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    after = model.state_dict()
    changed = [k for k in after if not torch.equal(before[k], after[k])]
    assert changed and all(".nar_" in k for k in changed)
    assert all(torch.equal(before[k], after[k]) for k in after if not is_nar_or_router(k))


def test_distill_refuses_pickle_only_and_non_llama_checkpoints(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="pickle"):
        load_llama(tmp_path)


def test_a_second_self_distillation_round_adds_the_first_rounds_training_rows(trained_model_dir, tmp_path):
    """`yue self-distill --extra-sequences`: earlier rows train, held-out rows are the new round's own."""
    from typer.testing import CliRunner

    from yue.cli import app
    from yue.train.selfdistill import GreedySequences

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(pattern_corpus(60, seed=3)))
    common = ["--corpus", str(corpus), "--sequences", "20", "--prompt-len", "8", "--new-tokens", "24"]
    common += ["--steps", "2", "--batch-size", "2", "--anchors", "2", "--threads", "1"]
    r1 = CliRunner().invoke(
        app, ["self-distill", "--model", trained_model_dir, "--out", str(tmp_path / "r1")] + common
    )
    assert r1.exit_code == 0, r1.output
    first = tmp_path / "r1" / "data" / "selfdistill_sequences.safetensors"
    args = ["self-distill", "--model", str(tmp_path / "r1"), "--out", str(tmp_path / "r2"), "--seed", "5"]
    args += ["--reveal-first", "1.0"]
    r2 = CliRunner().invoke(app, args + ["--extra-sequences", str(first)] + common)
    assert r2.exit_code == 0, r2.output
    report = json.loads((tmp_path / "r2" / "selfdistill_report.json").read_text())
    # 20 new rows, 1 held out; the first round's 19 training rows join the new 19.
    assert GreedySequences.load(first).seed == 0
    assert report["sequences"] == 20 and report["train_sequences"] == 19 + 19
    assert [p["model"] for p in report["previous"]] == [trained_model_dir]
    assert "--extra-sequences" in report["command"] and "--seed 5" in report["command"]
    # Slot 1 revealed: trained that way, and measured that way too (slot 1 itself is never predicted).
    assert report["config"]["reveal_first"] == 1.0 and report["previous"][0]["config"]["reveal_first"] is None
    revealed = report["held_out_nar_acc_slot1_revealed_after"]
    assert revealed[0] is None and all(0.0 <= a <= 1.0 for a in revealed[1:])
