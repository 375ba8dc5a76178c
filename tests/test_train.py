"""Training pipeline: corpora, joint loss, deterministic resume, atomic checkpoints, CLI, accelerate."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from tests.conftest import pattern_corpus, tiny_config
from yue.model import YueForCausalLM
from yue.train import checkpoint as ckpt_mod
from yue.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from yue.train.config import TrainConfig
from yue.train.data import (
    PackedSequences,
    is_test_path,
    read_corpus,
    read_stdlib,
    split_documents,
)
from yue.train.loop import lr_at, train
from yue.train.losses import LossWeights, joint_loss, sample_anchors, set_trainable
from yue.train.trainer import adamw

# ---------------------------------------------------------------------------------------------- helpers


def write_corpus(root: Path, n_files: int = 12) -> Path:
    """A folder of small code-like files (a tiny model learns them in seconds)."""
    root.mkdir(parents=True, exist_ok=True)
    texts = pattern_corpus(n_files * 8, seed=3)
    for i in range(n_files):
        (root / f"mod_{i:02d}.py").write_text("".join(texts[i * 8 : (i + 1) * 8]))
    return root


def tiny_train_config(tmp_path: Path, **kw) -> TrainConfig:
    base = dict(
        corpus=str(write_corpus(tmp_path / "corpus")),
        out=str(tmp_path / "run"),
        vocab_size=300,
        steps=10,
        seq_len=32,
        batch_size=4,
        block_size=4,
        anchors=2,
        hidden_size=32,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate_size=64,
        warmup_steps=3,
        eval_every=5,
        eval_batches=2,
        save_every=3,
        log_every=1,
        val_fraction=0.2,
        threads=1,
    )
    base.update(kw)
    return TrainConfig(**base)


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model" / "model.safetensors"))


# ---------------------------------------------------------------------------------------------- corpora


def test_jsonl_corpus_reads_one_document_per_line(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "a = 1\n"}) + "\n\n" + json.dumps({"text": "中文 🎉"}) + "\n")
    docs = read_corpus(f)
    assert [d.text for d in docs] == ["a = 1\n", "中文 🎉"]


def test_jsonl_corpus_with_a_bad_line_names_the_line(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(ValueError, match="c.jsonl:2"):
        read_corpus(f)


def test_text_file_corpus_is_one_document(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("hello\nworld\n")
    assert [(d.name, d.text) for d in read_corpus(f)] == [("a.txt", "hello\nworld\n")]


def test_folder_corpus_skips_undecodable_files_and_logs_the_count(tmp_path, caplog):
    root = write_corpus(tmp_path / "c", n_files=3)
    (root / "bad.py").write_bytes(b"\xff\xfe\x00 not utf-8 \xc3\x28")
    (root / "image.png").write_bytes(b"\x89PNG")
    with caplog.at_level(logging.WARNING):
        docs = read_corpus(root)
    assert sorted(d.name for d in docs) == ["mod_00.py", "mod_01.py", "mod_02.py"]
    assert "skipped 1 undecodable" in caplog.text


@pytest.mark.parametrize("kind", ["folder", "jsonl", "text", "missing"])
def test_empty_or_missing_corpus_is_a_clear_error(tmp_path, kind):
    path = {"folder": tmp_path / "empty", "jsonl": tmp_path / "e.jsonl", "text": tmp_path / "e.txt"}.get(
        kind, tmp_path / "nope"
    )
    if kind == "folder":
        path.mkdir()
    elif kind in ("jsonl", "text"):
        path.write_text("\n  \n")
    with pytest.raises(ValueError, match="empty|not found"):
        read_corpus(path)


def test_stdlib_recipe_excludes_test_folders_and_site_packages():
    docs = read_stdlib()
    names = [d.name for d in docs]
    assert len(docs) > 100 and "os.py" in names
    assert not any(is_test_path(Path(n)) for n in names)
    assert not any(
        part in ("test", "tests", "idle_test", "site-packages") for n in names for part in n.split("/")
    )


def test_split_is_by_file_deterministic_and_disjoint(tmp_path):
    docs = read_corpus(write_corpus(tmp_path / "c", n_files=40))
    train_a, val_a = split_documents(docs, 0.2)
    train_b, val_b = split_documents(list(reversed(docs)), 0.2)
    assert {d.name for d in val_a} == {d.name for d in val_b} and val_a
    assert not {d.name for d in train_a} & {d.name for d in val_a}
    assert len(train_a) + len(val_a) == len(docs)


def test_batches_are_a_pure_function_of_seed_and_step():
    tokens = np.arange(1000, dtype=np.int32)
    a, b = PackedSequences(tokens, 16, seed=1), PackedSequences(tokens, 16, seed=1)
    for step in (0, 5, 7, 3, 40):  # any order, past an epoch boundary (62 sequences / 4 per step)
        assert torch.equal(a.batch(step, 4), b.batch(step, 4))
    assert not torch.equal(a.batch(0, 4), PackedSequences(tokens, 16, seed=2).batch(0, 4))
    # DDP: the ranks of one global batch are disjoint and together equal the world=1 batch of size 8.
    both = torch.cat([a.batch(3, 4, rank=0, world=2), a.batch(3, 4, rank=1, world=2)])
    assert torch.equal(both, a.batch(3, 8))


# ---------------------------------------------------------------------------------------------- losses


def overfit(model, x, anchors, weights, steps=60):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    g = torch.Generator().manual_seed(0)
    first = joint_loss(model, x, anchors, 4, weights, reveal_prob=0.0, generator=g)
    for _ in range(steps):
        out = joint_loss(model, x, anchors, 4, weights, reveal_prob=0.1, generator=g)
        opt.zero_grad()
        out.total.backward()
        opt.step()
    last = joint_loss(model, x, anchors, 4, weights, reveal_prob=0.0, generator=g)
    return first, last


def test_ar_and_nar_losses_fall_when_overfitting_one_batch(tokenizer):
    torch.manual_seed(0)
    model = YueForCausalLM(tiny_config(tokenizer))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, tokenizer.vocab_size, (2, 24), generator=g)
    anchors = sample_anchors(2, 24, 3, 4, g)
    first, last = overfit(model, x, anchors, LossWeights())
    assert last.ar < 0.3 * first.ar
    assert last.nar < 0.3 * first.nar
    assert last.nar_acc_per_slot.mean() > first.nar_acc_per_slot.mean()
    assert last.nar_acc_per_slot.shape == (4,)


def test_nar_only_training_leaves_the_ar_path_unchanged(tokenizer):
    torch.manual_seed(0)
    model = YueForCausalLM(tiny_config(tokenizer))
    x = torch.randint(4, tokenizer.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    before = model(x).logits.detach().clone()
    set_trainable(model, "nar")
    first, last = overfit(model, x, sample_anchors(2, 24, 3, 4, torch.Generator()), LossWeights(ar=0.0), 20)
    assert torch.equal(model(x).logits, before)
    assert last.nar < first.nar


def test_kl_is_zero_when_slots_copy_the_ar_distribution(tokenizer, monkeypatch):
    """Slot i's KL target is the AR distribution at t+i-1: a net whose slot logits are exactly those
    AR logits must get KL = 0 (any off-by-one would give KL > 0)."""
    from yue.train import losses

    torch.manual_seed(0)
    model = YueForCausalLM(tiny_config(tokenizer))
    B, T, M, K = 2, 20, 3, 4
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, tokenizer.vocab_size, (B, T), generator=g)
    anchors = sample_anchors(B, T, M, K, g)
    ar_logits = torch.randn(B, T, tokenizer.vocab_size, generator=g)
    src = (anchors[:, :, None] + torch.arange(K)).flatten(1)  # t + i - 1 for i = 1..K

    class CopyNet(losses.TrainingForward):
        def forward(self, tokens, positions, n_committed, mask):
            slots = ar_logits.gather(1, src[..., None].expand(-1, -1, ar_logits.shape[-1]))
            return torch.cat([ar_logits, slots], dim=1)

    out = joint_loss(CopyNet(model), x, anchors, K, reveal_prob=0.0, generator=g)
    assert float(out.kl) == pytest.approx(0.0, abs=1e-5)


def test_reveal_first_sets_slot_ones_reveal_chance_alone(tokenizer):
    """Revealed slots carry no NAR loss (count 0): reveal_first=1 with reveal_prob=0 leaves only slot 1
    out; reveal_first=0 with reveal_prob=1 leaves only slot 1 in; None keeps slot 1 like the others."""
    torch.manual_seed(0)
    model = YueForCausalLM(tiny_config(tokenizer))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, tokenizer.vocab_size, (2, 24), generator=g)
    anchors = sample_anchors(2, 24, 3, 4, g)
    with torch.no_grad():
        first_only = joint_loss(model, x, anchors, 4, reveal_prob=0.0, generator=g, reveal_first=1.0)
        rest = joint_loss(model, x, anchors, 4, reveal_prob=1.0, generator=g, reveal_first=0.0)
        like_others = joint_loss(model, x, anchors, 4, reveal_prob=0.0, generator=g, reveal_first=None)
    assert first_only.nar_count_per_slot.tolist() == [0.0, 6.0, 6.0, 6.0]
    assert rest.nar_count_per_slot.tolist() == [6.0, 0.0, 0.0, 0.0]
    assert like_others.nar_count_per_slot.tolist() == [6.0] * 4


# ---------------------------------------------------------------------------------------------- loop


def test_resumed_run_reaches_bit_identical_weights(tmp_path):
    full = tiny_train_config(tmp_path / "a")
    train(full)
    cut = replace(full, out=str(tmp_path / "b" / "run"))
    train(cut, stop_at=7)  # "interrupted": checkpoints at 3, 6 and 7
    assert not (tmp_path / "b" / "run" / "model").exists()
    train(cut, resume=True)
    a, b = weights(tmp_path / "a" / "run"), weights(tmp_path / "b" / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_with_changed_settings_is_refused(tmp_path):
    cfg = tiny_train_config(tmp_path, warmup_steps=1)
    train(cfg, stop_at=3)
    with pytest.raises(ValueError, match="lr"):
        train(replace(cfg, lr=1e-2), resume=True)


def test_training_writes_eval_records_and_a_loadable_model(tmp_path):
    cfg = tiny_train_config(tmp_path)
    final = train(cfg)
    records = [json.loads(line) for line in (Path(cfg.out) / "log.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [5, 10] and len(evals[0]["nar_acc_per_slot"]) == 4
    from yue.model.hf import load_model

    model = load_model(final)
    assert model.config.loss_weights == {"ar": 1.0, "nar": 0.8, "kl": 0.2}
    assert (final / "tokenizer.json").is_file() and not list(final.glob("*.bin"))


def test_lr_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[9] == pytest.approx(1e-3) and lrs[0] < lrs[5] < lrs[9]
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lr_at(100, cfg) == pytest.approx(1e-4)


# ---------------------------------------------------------------------------------------------- checkpoints


def make_optimizer(model: YueForCausalLM, cfg: TrainConfig) -> torch.optim.AdamW:
    """The optimizer `train` builds for `cfg` (through `Trainer`)."""
    return adamw(set_trainable(model, cfg.train_set), cfg.lr, cfg.weight_decay, cfg.betas)


def small_model_and_optimizer(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = YueForCausalLM(tiny_config(tokenizer))
    cfg = tiny_train_config(tmp_path)
    opt = make_optimizer(model, cfg)
    x = torch.randint(4, tokenizer.vocab_size, (2, 16))
    joint_loss(model, x, sample_anchors(2, 16, 2, 4, torch.Generator()), 4).total.backward()
    opt.step()
    return model, opt


def test_checkpoint_cut_mid_write_is_never_the_one_loaded(tokenizer, tmp_path, monkeypatch):
    model, opt = small_model_and_optimizer(tokenizer, tmp_path)
    run = tmp_path / "run"
    good = save_checkpoint(run, 1, model, opt, {})
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    # 1. Killed mid-write: the optimizer file write dies after the model file is written.
    def die(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    monkeypatch.setattr(ckpt_mod, "save_file", die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(run, 2, model, opt, {})
    monkeypatch.undo()
    assert list((run / "checkpoints").glob(".tmp-*")) and latest_checkpoint(run) == good

    # 2. A published checkpoint whose weights file was truncated afterwards (disk trouble) is skipped.
    bad = save_checkpoint(run, 3, model, opt, {})
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert latest_checkpoint(run) == good

    fresh = YueForCausalLM(tiny_config(tokenizer))
    state = load_checkpoint(latest_checkpoint(run), fresh, make_optimizer(fresh, tiny_train_config(tmp_path)))
    assert state["step"] == 1
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in saved.items())


def test_checkpoint_holds_no_pickle(tokenizer, tmp_path):
    model, opt = small_model_and_optimizer(tokenizer, tmp_path)
    path = save_checkpoint(tmp_path / "run", 5, model, opt, {})
    assert sorted(p.name for p in path.iterdir()) == sorted(ckpt_mod.FILES)
    assert len(load_file(str(path / "optimizer.safetensors"))) > 0


# ---------------------------------------------------------------------------------------------- config and CLI


@pytest.mark.parametrize(
    "field, value",
    [
        ("steps", 0),
        ("lr", -1.0),
        ("reveal_prob", 1.5),
        ("kv_heads", 3),
        ("train_set", "router"),
        ("seq_len", 4),
    ],
)
def test_bad_train_config_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


def test_nar_only_needs_an_init_model():
    with pytest.raises(ValueError, match="init"):
        TrainConfig(train_set="nar")


def test_cli_train_bad_value_is_one_line_and_exit_2(tmp_path):
    from yue.cli import app

    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path), "--steps", "0"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "steps" in result.output


def test_cli_train_tokenizer_and_train_write_a_model(tmp_path):
    from yue.cli import app

    corpus = write_corpus(tmp_path / "c")
    runner = CliRunner()
    r = runner.invoke(
        app, ["train-tokenizer", "--corpus", str(corpus), "--vocab-size", "300", "--out", str(tmp_path)]
    )
    assert r.exit_code == 0, r.output
    args = ["train", "--corpus", str(corpus), "--out", str(tmp_path / "run"), "--tokenizer", str(tmp_path / "tokenizer.json"),
            "--steps", "4", "--seq-len", "32", "--batch-size", "2", "--block-size", "4", "--anchors", "2",
            "--hidden-size", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--intermediate-size", "32",
            "--eval-every", "4", "--save-every", "2", "--threads", "1"]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()
    # Stage 2 from that model: AR set frozen.
    stage2 = [
        *args[:3],
        "--out",
        str(tmp_path / "nar"),
        *args[5:],
        "--nar-only",
        "--init",
        str(tmp_path / "run" / "model"),
    ]
    r = runner.invoke(app, stage2)
    assert r.exit_code == 0, r.output
    a, b = weights(tmp_path / "run"), weights(tmp_path / "nar")
    assert all(torch.equal(a[k], b[k]) == (".nar_" not in k) for k in a)


@pytest.mark.slow
def test_same_entry_point_runs_under_accelerate_launch(tmp_path):
    corpus = write_corpus(tmp_path / "c")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu", "-m", "yue.cli",
           "train", "--corpus", str(corpus), "--out", str(tmp_path / "run"), "--vocab-size", "300", "--steps", "3",
           "--seq-len", "32", "--batch-size", "2", "--block-size", "4", "--anchors", "2", "--hidden-size", "32",
           "--layers", "1", "--heads", "2", "--kv-heads", "1", "--intermediate-size", "32", "--threads", "1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


def test_run_summary_reads_every_number_from_the_run_folder(tmp_path):
    from recipes.summary import summarize

    cfg = tiny_train_config(tmp_path)
    train(cfg, stop_at=4)
    train(cfg, resume=True)
    summary = summarize(Path(cfg.out))
    assert summary["steps"] == 10 and summary["segments"] == 2
    assert summary["final_eval"]["step"] == 10 and len(summary["final_eval"]["nar_acc_per_slot"]) == 4
    assert summary["params"]["ar"] > 0 and summary["params"]["nar"] > 0
    assert summary["command"].startswith("yue train --corpus") and "--steps 10" in summary["command"]


def test_steps_may_change_on_resume_only_inside_the_warmup(tmp_path):
    """Inside the warm-up the learning rates used so far do not depend on `steps`, so a run may be
    resized then; after it, resizing would change the schedule already applied, so it is refused."""
    cfg = tiny_train_config(tmp_path, warmup_steps=4)
    train(cfg, stop_at=3)
    train(replace(cfg, steps=6), resume=True)  # checkpoint 3 <= warm-up 4: allowed
    with pytest.raises(ValueError, match="steps"):
        train(replace(cfg, steps=8), resume=True)  # checkpoint 6 > warm-up 4: refused
