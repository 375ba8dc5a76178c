"""A NAR set on the top layers only: decoding stays exact, training sees what decoding sees, the recipe
runs end to end and resumes."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_distill import save_tiny_llama
from yue.config import DecodeConfig, YueConfig
from yue.decode.loop import decode
from yue.kernels import prepare_for_decoding
from yue.model.hf import is_nar_or_router
from yue.model.masks import decode_mask
from yue.model.mot import YueForCausalLM
from yue.train import topnar as tn
from yue.train.router import RouterTrainConfig
from yue.train.topnar_run import TopNARRecipe, distill_top_nar


def top_model(nar_layers: int = 2, draft_vocab: int | None = 48, seed: int = 0) -> YueForCausalLM:
    """A random 4-layer model with a NAR set on its top `nar_layers`, weights large enough to vary."""
    torch.manual_seed(seed)
    cfg = YueConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        block_size=4,
        nar_layers=nar_layers,
        draft_vocab_size=draft_vocab,
        max_position_embeddings=256,
        eos_token_id=2,
        mask_token_id=3,
    )
    model = YueForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.4)
        if draft_vocab:
            model.draft_vocab.copy_(
                torch.randperm(96, generator=torch.Generator().manual_seed(seed))[:draft_vocab]
            )
    return model


def test_only_the_top_layers_hold_a_nar_set_and_export_skips_it():
    model = top_model(nar_layers=2)
    assert [layer.has_nar for layer in model.model.layers] == [False, False, True, True]
    extra = [k for k in model.state_dict() if is_nar_or_router(k)]
    assert any(k.startswith("model.slot_entry.") for k in extra) and "draft_vocab" in extra
    assert not any(".layers.0.nar_" in k or ".layers.1.nar_" in k for k in model.state_dict())


def test_training_forward_sees_what_the_drafting_pass_sees():
    """Slot logits of a block at anchor t: training-style forward from entry features == decode pass."""
    model = top_model()
    x = torch.randint(4, 96, (1, 20), generator=torch.Generator().manual_seed(1))
    t, K = 9, model.config.block_size
    with torch.no_grad():
        entry = model.model.run_to_entry(x)
        batch = tn.Batch(entry, x, torch.tensor([[t]]), x[:, t + 1 : t + 1 + K][:, None, :])
        _, slots = tn.block_forward(model, batch)
        trained = model.slot_logits(slots[:, 0])
        cache = model.new_cache(1, 64)
        out = model.step(x[:, : t + 1], torch.arange(t + 1), t + 1, decode_mask(0, t + 1, 0), cache)
        cache.advance(t + 1)
        inputs = torch.full((1, K), model.config.mask_token_id)
        inputs[0, 0] = x[0, t + 1]
        pos = torch.arange(t + 1, t + 1 + K)
        draft = model.step(inputs, pos, 0, decode_mask(t + 1, 0, K), cache, 0, out.entry[:, t : t + 1])
    torch.testing.assert_close(out.entry, entry[:, : t + 1], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(draft.slot_logits, trained, atol=1e-3, rtol=1e-4)
    outside = torch.ones(96, dtype=torch.bool)
    outside[model.draft_vocab] = False
    assert bool((draft.slot_logits[..., outside] < -1e8).all())  # never drafted


def test_entry_features_beyond_float16s_range_stay_finite():
    """Gemma 3's residual stream passes float16's 65,504: such a sequence's features are kept in bfloat16
    (finite, within its rounding), the others in float16 as before; a batch of both is finite."""
    model = top_model()
    with torch.no_grad():
        model.model.embed_tokens.weight[5] *= 1e6  # token 5's residual row ~4e5
    seqs = tn.ChatSequences([[7, 8, 9, 10, 11], [7, 5, 9, 10, 11, 12]], [2, 2])
    feats = tn.entry_features(model, seqs, progress=False)
    assert feats[0].dtype == torch.float16 and feats[1].dtype == torch.bfloat16
    with torch.no_grad():
        exact = model.model.run_to_entry(torch.tensor([seqs.ids[1]]))[0]
    assert exact.abs().max() > torch.finfo(torch.float16).max
    torch.testing.assert_close(feats[1].float(), exact, rtol=2**-8, atol=1e-3)
    batch = tn.make_batch(seqs, feats, [0, 1], torch.tensor([[2], [2]]), model.config.block_size, "cpu")
    assert batch.entry.dtype == torch.float32 and bool(batch.entry.isfinite().all())
    with torch.no_grad():
        _, slots = tn.block_forward(model, batch)
    assert bool(slots.isfinite().all())


def test_a_non_finite_training_loss_stops_before_it_reaches_the_weights():
    model = top_model()
    seqs = tn.ChatSequences([[7, 8, 9, 10, 11, 12, 13, 14]] * 2, [2, 2])
    feats = tn.entry_features(model, seqs, progress=False)
    feats[0][3] = float("inf")  # what float16 features of Gemma 3 held
    feats[1][3] = float("inf")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = tn.TopNARConfig(steps=2, batch_size=2, anchors=4, warmup_steps=1, eval_every=2)
    with pytest.raises(ValueError, match="loss is nan at step 1"):
        tn.train_top_nar(model, seqs, feats, seqs, feats, cfg, progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 50),
    nar_layers=st.sampled_from([1, 2, 3]),
    mode=st.sampled_from(["verified"]),
    threshold=st.sampled_from([0.3, 0.7, 1.0]),
    prepared=st.booleans(),
)
def test_top_layer_nar_keeps_verified_equal_to_ar(seed, nar_layers, mode, threshold, prepared):
    model = top_model(nar_layers, seed=seed)
    if prepared:
        model = prepare_for_decoding(model, torch.qint8)
    prompt = torch.randint(4, 96, (7,), generator=torch.Generator().manual_seed(seed)).tolist()

    def run(m: str, th: float | None) -> list[int]:
        cfg = DecodeConfig(mode=m, max_new_tokens=24, ignore_eos=True, router_threshold=th).resolved(
            model.config
        )
        return [t for em in decode(model, [prompt], cfg) for t in em.tokens[0]]

    assert run(mode, threshold) == run("ar", None)


def test_ar_only_and_fused_are_refused_with_the_reason():
    ar_only = top_model(nar_layers=0, draft_vocab=None).config
    for mode in ("hybrid", "nar"):
        with pytest.raises(ValueError, match="needs a NAR set"):
            DecodeConfig(mode=mode).resolved(ar_only)
    with pytest.raises(ValueError, match="fused"):
        DecodeConfig(mode="verified", drafting="fused").resolved(ar_only)
    with pytest.raises(ValueError, match="fused"):
        DecodeConfig(mode="verified", drafting="fused").resolved(top_model().config)


@pytest.mark.parametrize("prepared", [False, True])
def test_verified_on_an_ar_only_model_copies_from_the_context_and_equals_ar(prepared):
    """Without a NAR set, `verified` verifies drafts copied from the context (prompt lookup) and runs
    no drafting pass: its output is still `ar`'s, and where `ar`'s text repeats itself (a 3-gram seen
    before: its first two tokens match, the copy drafts the third), copies write some of it."""
    model = top_model(nar_layers=0, draft_vocab=None, seed=3)
    if prepared:
        model = prepare_for_decoding(model, torch.qint8)

    def run(mode: str, prompt: list[int]) -> tuple[list[int], list[str]]:
        cfg = DecodeConfig(mode=mode, max_new_tokens=64, ignore_eos=True).resolved(model.config)
        assert cfg.draft_block == 1  # no NAR block to draft from
        steps = list(decode(model, [prompt], cfg))
        return [t for em in steps for t in em.tokens[0]], [w for em in steps for w in em.writers[0]]

    def repeats(text: list[int]) -> bool:
        grams = [tuple(text[i : i + 3]) for i in range(len(text) - 2)]
        return len(set(grams)) < len(grams)

    rng = torch.Generator().manual_seed(0)
    for _ in range(40):  # a prompt whose `ar` answer repeats itself (a tiny random model's often loop)
        prompt = torch.randint(4, 96, (6,), generator=rng).tolist()
        ar_tokens, ar_writers = run("ar", prompt)
        if repeats(prompt + ar_tokens):
            break
    else:
        pytest.fail("no prompt of 40 gave a repeating answer")
    assert set(ar_writers) == {"ar"}
    tokens, writers = run("verified", prompt)
    assert tokens == ar_tokens
    assert "copy" in writers and "nar" not in writers


def test_drafting_vocabulary_ranks_answer_tokens_by_frequency():
    seqs = tn.ChatSequences([[9, 9, 5, 5, 5, 7], [9, 5, 6]], [2, 1])
    vocab = tn.drafting_vocabulary(seqs, 3, always=[2])
    assert vocab.tolist() == [2, 5, 6] or vocab.tolist() == [2, 5, 7]  # 5 thrice, then ties
    assert tn.vocabulary_coverage(seqs, vocab) == pytest.approx(5 / 6)


@pytest.fixture(scope="module")
def chat_llama_dir(tmp_path_factory):
    """A tiny random Llama (tied head) with a tokenizer.json and a chat template."""
    path = save_tiny_llama(tmp_path_factory.mktemp("chat-llama"), layers=3, tied=True, max_positions=256)
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}a:"
    )
    return path


def test_recipe_runs_end_to_end_learns_and_resumes(chat_llama_dir, tmp_path):
    chats = [[{"role": "user", "content": f"def f{i}(x): return x + {i}"}] for i in range(14)]
    recipe = TopNARRecipe(
        nar_layers=1,
        block_size=4,
        draft_vocab_size=64,
        max_new_tokens=24,
        gen_batch_size=7,
        held_out=4,
        train=tn.TopNARConfig(steps=40, batch_size=4, anchors=8, eval_every=20, warmup_steps=4, lr=3e-3),
        router=RouterTrainConfig(epochs=3),
    )
    out = tmp_path / "smol"
    report = distill_top_nar(chat_llama_dir, chats, out, recipe, progress=False)
    history = report["history"]
    assert [h["step"] for h in history] == [20, 40]
    assert history[-1]["loss"] < history[0]["loss"]
    assert report["sequences"] == {"train": 10, "held_out": 4}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["nar_layers"] == 1 and cfg["draft_vocab_size"] == 64
    assert (out / "ar_source.json").is_file() and (out / "model.safetensors").is_file()
    # A rerun finds the greedy answers and the last checkpoint: nothing is retrained, same history.
    again = distill_top_nar(chat_llama_dir, chats, out, recipe, progress=False)
    assert again["history"] == history


@pytest.fixture
def top_gguf_model(tiny_gguf, gguf_cache, tmp_path):
    """`yue distill-recipe --base X.gguf --nar-layers 1` run from the CLI: (its output folder, the GGUF)."""
    from typer.testing import CliRunner

    from yue.cli import app

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {w}"}) + "\n" for w in "abcdefghij"))
    out = tmp_path / "top"
    args = ["distill-recipe", "--base", str(tiny_gguf.path), "--out", str(out), "--nar-layers", "1"]
    args += ["--prompts", str(prompts), "--steps", "6", "--batch-size", "2", "--anchors", "4"]
    args += ["--held-out", "3", "--draft-vocab", "64", "--new-tokens", "12", "--block-size", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, tiny_gguf


def test_cli_distills_a_top_layer_nar_set_onto_a_gguf_and_the_result_loads(top_gguf_model):
    """The folder holds only yue's tensors + ar_source.json; `yue.load` assembles it with the GGUF's AR
    set; verified == ar on it."""
    import yue

    out, tiny_gguf = top_gguf_model
    source = json.loads((out / "ar_source.json").read_text())
    assert source["gguf_path"] == str(tiny_gguf.path.resolve()) and len(source["sha256"]) == 64
    engine = yue.load(str(out))
    assert engine.model.config.nar_layers == 1
    prompt = engine.chat_prompt([{"role": "user", "content": "say a"}])
    ar = engine.generate(prompt, mode="ar", max_new_tokens=12, ignore_eos=True).token_ids
    assert engine.generate(prompt, mode="verified", max_new_tokens=12, ignore_eos=True).token_ids == ar


def test_lora_finetune_refreshes_a_top_layer_nar_set_and_stays_exact(top_gguf_model, tmp_path):
    import yue
    from tests.test_finetune import small_config
    from yue.train.finetune import finetune

    out, _ = top_gguf_model
    data = tmp_path / "domain.txt"
    data.write_text("".join(f"say {w} then {w}{w}\n" for w in "abcdefgh") * 4)
    report = finetune(str(out), data, tmp_path / "adapter", small_config(steps=6), progress=False)
    assert {"held_out_tau_before", "held_out_tau_after"} <= set(report["refresh"])
    engine = yue.load(str(out), adapter=tmp_path / "adapter")
    prompt = engine.chat_prompt([{"role": "user", "content": "say b"}])
    ar = engine.generate(prompt, mode="ar", max_new_tokens=12, ignore_eos=True).token_ids
    assert engine.generate(prompt, mode="verified", max_new_tokens=12, ignore_eos=True).token_ids == ar
