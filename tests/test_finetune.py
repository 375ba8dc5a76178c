"""`yue finetune`: LoRA on the AR set only, adapters that round-trip, merge, decode losslessly and
refuse a base model they were not trained on."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from typer.testing import CliRunner

import yue
from tests.conftest import tiny_config
from yue.chat import ChatTemplate
from yue.model import YueForCausalLM, load_model
from yue.model.adapters import (
    DRAFTS_FILE,
    AdapterError,
    apply_adapter,
    ar_target_regex,
    base_identity,
)
from yue.train.finetune import (
    FinetuneConfig,
    finetune,
    masked_loss,
    merge_to_folder,
    save_adapter,
    train_lora,
    wrap_lora,
)
from yue.train.finetune_data import TokenStream, read_finetune_data

DOMAIN = "".join(f"def zeta_{k}(x):\n    return omega(x) * {k}{k}\n\n" for k in range(10)) * 3


def small_config(**kw) -> FinetuneConfig:
    base = dict(
        steps=40,
        lr=1e-2,
        batch_size=4,
        seq_len=48,
        warmup_steps=2,
        lora_r=4,
        lora_alpha=8.0,
        refresh_steps=3,
        refresh_sequences=8,
        prompt_len=8,
        new_tokens=24,
        router_epochs=2,
        measure_prompts=2,
        measure_tokens=16,
        save_every=4,
        threads=1,
    )
    base.update(kw)
    return FinetuneConfig(**base)


@pytest.fixture(scope="module")
def domain_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("domain") / "domain.txt"
    path.write_text(DOMAIN)
    return path


@pytest.fixture(scope="module")
def adapter_run(trained_model_dir, domain_file, tmp_path_factory):
    """One fine-tune of the trained tiny model on the domain file: (adapter folder, report)."""
    out = tmp_path_factory.mktemp("adapter")
    report = finetune(trained_model_dir, domain_file, out, small_config(), progress=False)
    return out, report


def logits(model: YueForCausalLM, text_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([text_ids])).logits


# --------------------------------------------------------------------------------------------- targets


def test_default_targets_hit_every_ar_projection_and_no_nar_module(tiny_model_dir):
    import re

    pattern = ar_target_regex()
    names = [n for n, m in load_model(tiny_model_dir).named_modules() if isinstance(m, torch.nn.Linear)]
    hit = [n for n in names if re.fullmatch(pattern, n)]
    assert hit and not any("nar_" in n for n in hit)
    assert len(hit) == 2 * 7  # 2 layers x q, k, v, o, gate, up, down
    with pytest.raises(ValueError, match="target_modules"):
        ar_target_regex(["nar_self_attn.q_proj"])


# --------------------------------------------------------------------------------------------- data


def test_chat_data_carries_loss_on_the_assistant_turns_only(tokenizer, tmp_path):
    f = tmp_path / "chat.jsonl"
    chat = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "return zeta"}]
    f.write_text(json.dumps({"messages": chat}) + "\n" + json.dumps({"text": "x = 1\n"}) + "\n")
    docs = read_finetune_data(f, ChatTemplate())
    stream = TokenStream.build(docs, tokenizer)
    n_chat = len(stream.documents[0]) + 1  # its <|eos|> separator, then its tokens
    chat_targets = tokenizer.decode(stream.tokens[:n_chat][stream.target[:n_chat]].tolist())
    assert chat_targets.strip() == "return zeta"
    # The <|eos|> after an assistant turn is learned (the model learns to stop); the text is all target.
    assert bool(stream.target[n_chat]) and bool(stream.target[n_chat + 1 :].all())


def test_a_bad_data_line_names_the_line(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "ok"}\n{"messages": [{"role": "user", "content": "no reply"}]}\n')
    with pytest.raises(ValueError, match="d.jsonl:2"):
        read_finetune_data(f, ChatTemplate())


# --------------------------------------------------------------------------------------------- training


def test_lora_loss_falls_and_only_lora_tensors_are_saved(adapter_run):
    out, report = adapter_run
    assert report["loss_after"] < report["loss_before"] - 0.1
    keys = load_file(str(out / "adapter_model.safetensors"))
    assert keys and all("lora_" in k and "nar_" not in k for k in keys)
    drafts = load_file(str(out / DRAFTS_FILE))
    assert drafts and all(".nar_" in k or k.startswith("router.") for k in drafts)
    acc = report["accepted_drafts"]
    assert {"base", "adapter_no_refresh", "adapter_refreshed"} <= set(acc)
    assert (out / "finetune_report.json").is_file()


def test_a_resumed_lora_run_reaches_the_uninterrupted_adapter(
    trained_model_dir, domain_file, tmp_path, tokenizer
):
    cfg = small_config(steps=8, save_every=4)
    stream = TokenStream.build(read_finetune_data(domain_file, ChatTemplate()), tokenizer)
    full = wrap_lora(load_model(trained_model_dir), cfg)
    train_lora(full, stream, cfg, tmp_path / "run", resume=False, progress=False)
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-000008")  # "killed" after step 4's save
    resumed = wrap_lora(load_model(trained_model_dir), cfg)
    history = train_lora(resumed, stream, cfg, tmp_path / "run", resume=True, progress=False)
    assert [h["step"] for h in history] == [5, 6, 7, 8]
    a = {k: v for k, v in full.state_dict().items() if "lora_" in k}
    b = {k: v for k, v in resumed.state_dict().items() if "lora_" in k}
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------------------------- adapters


def test_adapter_save_load_round_trip_gives_identical_logits(
    trained_model_dir, domain_file, tmp_path, tokenizer
):
    from peft import PeftModel

    cfg = small_config(steps=4)
    stream = TokenStream.build(read_finetune_data(domain_file, ChatTemplate()), tokenizer)
    base = load_model(trained_model_dir)
    identity = base_identity(base, "trained")
    trained = wrap_lora(base, cfg)
    train_lora(trained, stream, cfg, tmp_path / "run", resume=False, progress=False)
    save_adapter(trained, tmp_path, identity)
    ids = tokenizer.encode("def zeta_3(x):\n    return")
    ref = logits(trained.get_base_model(), ids)
    loaded = PeftModel.from_pretrained(load_model(trained_model_dir), str(tmp_path)).get_base_model()
    assert torch.equal(logits(loaded, ids), ref)
    # Merged at load (as yue.load does): the same function up to float rounding.
    merged = apply_adapter(load_model(trained_model_dir), tmp_path)
    torch.testing.assert_close(logits(merged, ids), ref, rtol=0, atol=1e-5)
    assert (
        masked_loss(merged, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool))[1] == len(ids) - 1
    )


def test_merged_model_equals_the_adapter_on_model(adapter_run, trained_model_dir, tmp_path, tokenizer):
    out, _ = adapter_run
    merged_dir = merge_to_folder(trained_model_dir, out, tmp_path / "merged")
    merged = load_model(merged_dir)
    on = apply_adapter(load_model(trained_model_dir), out)
    a, b = merged.state_dict(), on.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    prompt = "def zeta_4(x):\n"
    got = yue.load(merged_dir).generate(prompt, mode="verified", max_new_tokens=24)
    want = yue.load(trained_model_dir, adapter=out).generate(prompt, mode="verified", max_new_tokens=24)
    assert got.token_ids == want.token_ids


def test_the_adapter_makes_the_taught_text_likelier_and_changes_what_the_model_writes(
    adapter_run, trained_model_dir, tokenizer
):
    """A tiny model learns the domain only partly in 40 steps: its text changes and the taught
    continuation becomes much likelier (the exact text is checked on yue-code-mini, README)."""
    out, _ = adapter_run
    base, tuned = yue.load(trained_model_dir), yue.load(trained_model_dir, adapter=out)
    prompt, taught = "def zeta_7(x):\n", "    return omega(x) * 77\n"
    ids = tuned.encode(prompt + taught)
    n_prompt = len(tuned.encode(prompt))
    x, target = torch.tensor([ids]), torch.zeros(1, len(ids), dtype=torch.bool)
    target[0, n_prompt:] = True
    nll_base, _ = masked_loss(base.model, x, target)
    nll_tuned, _ = masked_loss(tuned.model, x, target)
    assert float(nll_tuned) < float(nll_base) - 1.0
    assert (
        tuned.generate(prompt, mode="ar", max_new_tokens=12).text
        != base.generate(prompt, mode="ar", max_new_tokens=12).text
    )


@pytest.fixture(scope="module")
def tuned_engine(adapter_run, trained_model_dir):
    return yue.load(trained_model_dir, adapter=adapter_run[0])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.sampled_from(["", "def zeta_", "def alpha_3(x):\n", "    return omega(x)", "中文"]),
    threshold=st.sampled_from([0.0, 0.65, 1.0]),
    drafting=st.sampled_from(["separate", "fused"]),
)
def test_verified_greedy_equals_ar_with_an_adapter(tuned_engine, prompt, threshold, drafting):
    ar = tuned_engine.generate(prompt, mode="ar", max_new_tokens=32)
    ver = tuned_engine.generate(
        prompt, mode="verified", max_new_tokens=32, router_threshold=threshold, drafting=drafting
    )
    assert ver.token_ids == ar.token_ids


# --------------------------------------------------------------------------------------------- wrong adapters


def test_an_adapter_for_another_base_is_rejected_naming_the_mismatch(
    adapter_run, tiny_model_dir, tokenizer, tmp_path
):
    out, _ = adapter_run
    # Same shapes, other weights (another training run).
    with pytest.raises(AdapterError, match="AR weights differ from it, first at model.embed_tokens.weight"):
        yue.load(tiny_model_dir, adapter=out)
    # Other shapes.
    wide = tmp_path / "wide"
    YueForCausalLM(
        tiny_config(tokenizer, hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    ).save_pretrained(wide)
    tokenizer.save(wide)
    with pytest.raises(AdapterError, match="differs in hidden_size: 32"):
        yue.load(wide, adapter=out)


@pytest.mark.parametrize("damage", ["truncated", "missing_identity", "not_a_folder"])
def test_a_damaged_adapter_is_a_clear_error(adapter_run, trained_model_dir, tmp_path, damage):
    bad = tmp_path / "bad"
    shutil.copytree(adapter_run[0], bad)
    if damage == "truncated":
        data = (bad / "adapter_model.safetensors").read_bytes()
        (bad / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
        match = "corrupt or truncated adapter file .*adapter_model.safetensors"
    elif damage == "missing_identity":
        (bad / "base_model.json").unlink()
        match = "base_model.json is missing"
    else:
        bad = tmp_path / "nope"
        match = "adapter folder not found"
    with pytest.raises(AdapterError, match=match):
        yue.load(trained_model_dir, adapter=bad)
    from yue.cli import app

    result = CliRunner().invoke(app, ["generate", "x", "--model", trained_model_dir, "--adapter", str(bad)])
    assert result.exit_code == 2 and "error:" in result.output


def test_cli_finetune_then_merge(trained_model_dir, domain_file, tmp_path):
    from yue.cli import app

    args = [
        "finetune",
        "--model",
        trained_model_dir,
        "--data",
        str(domain_file),
        "--out",
        str(tmp_path / "a"),
    ]
    args += ["--steps", "2", "--seq-len", "32", "--batch-size", "2", "--refresh-steps", "0", "--threads", "1"]
    args += ["--target-modules", "q_proj", "--target-modules", "v_proj", "--lora-r", "2"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["accepted_drafts"]["adapter_refreshed"] is None  # --refresh-steps 0
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert (
        config["r"] == 2 and "v_proj" in config["target_modules"] and "gate" not in config["target_modules"]
    )
    r = CliRunner().invoke(
        app,
        [
            "merge",
            "--model",
            trained_model_dir,
            "--adapter",
            str(tmp_path / "a"),
            "--out",
            str(tmp_path / "m"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "m" / "model.safetensors").is_file() and (tmp_path / "m" / "tokenizer.json").is_file()


def test_base_probes_stay_inside_large_tensors():
    from yue.model.adapters import probe_indices

    for numel in (1, 7, 28_311_552, 49_152 * 576 + 3):
        idx = probe_indices(numel, 8)
        assert int(idx[0]) == 0 and int(idx[-1]) == numel - 1 and bool((idx[1:] >= idx[:-1]).all())
