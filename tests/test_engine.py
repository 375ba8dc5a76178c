"""Engine invariants: stream == generate, UTF-8 safe streaming, stop/EOS/length, bad input."""

from __future__ import annotations

import pytest

import yue
from yue.config import DecodeConfig
from yue.kernels import prepare_for_decoding


@pytest.fixture(scope="module")
def engine(trained_model_dir):
    return yue.load(trained_model_dir)


@pytest.mark.parametrize("mode", ["ar", "verified", "hybrid", "nar"])
def test_streamed_text_equals_generated_text(engine, mode):
    for prompt in ["def alpha_1(x):\n", "class "]:
        kw = dict(mode=mode, max_new_tokens=40, router_threshold=0.9)
        streamed = list(engine.stream(prompt, **kw))
        whole = engine.generate(prompt, **kw)
        assert "".join(e.delta for e in streamed) == whole.text
        assert [t for e in streamed for t in e.token_ids] == whole.token_ids
        assert streamed[-1].finish_reason == whole.finish_reason
        assert all(len(e.sources) == len(e.token_ids) for e in streamed)


def test_chinese_text_streams_without_broken_characters(tokenizer):
    text = "你好，世界！中文文本也可以。🎉"
    ids = tokenizer.encode(text)
    # Byte-level pieces: split the ids one by one so multi-byte characters straddle tokens.
    from yue.tokenizer import iter_deltas

    deltas = list(iter_deltas(tokenizer, [[i] for i in ids]))
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    byte_ids = [tokenizer.tokenizer.token_to_id(tok) for tok in tokenizer.tokenizer.encode(text).tokens]
    assert byte_ids == ids


def test_stream_of_multibyte_output_never_splits_a_character(engine):
    for ev in engine.stream("中文", mode="ar", max_new_tokens=30):
        assert "\ufffd" not in ev.delta


def test_max_new_tokens_ends_generation_exactly(engine):
    r = engine.generate("def alpha_1(x):\n", mode="verified", max_new_tokens=7, router_threshold=1.0)
    assert len(r.token_ids) <= 7
    assert r.finish_reason in ("length", "eos")
    if r.finish_reason == "length":
        assert len(r.token_ids) == 7


def test_stop_string_cuts_text_before_it(engine):
    full = engine.generate("def alpha_1(x):\n", mode="ar", max_new_tokens=40)
    assert "return" in full.text
    r = engine.generate("def alpha_1(x):\n", mode="ar", max_new_tokens=40, stop=("return",))
    assert r.finish_reason == "stop"
    assert r.text == full.text[: full.text.index("return")]
    streamed = "".join(
        e.delta for e in engine.stream("def alpha_1(x):\n", mode="ar", max_new_tokens=40, stop=("return",))
    )
    assert streamed == r.text


def test_eos_ends_generation_and_is_not_in_the_output(engine):
    # The pattern corpus separates functions with EOS; the model learns to emit it.
    ends = [
        engine.generate(p, mode="ar", max_new_tokens=60) for p in ["def alpha_1(x):\n", "def beta_2(x):\n"]
    ]
    eos_runs = [r for r in ends if r.finish_reason == "eos"]
    assert eos_runs, "the trained tiny model should emit EOS within 60 tokens"
    for r in eos_runs:
        assert engine.tokenizer.eos_id not in r.token_ids
        assert len(r.token_ids) < 60


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("router_threshold", 1.2),
        ("router_threshold", -0.1),
        ("max_new_tokens", 0),
        ("mode", "turbo"),
        ("top_k", -1),
        ("repetition_penalty", 0.0),
        ("drafting", "lazy"),
        # Wrong types are named too, not a TypeError from a comparison deep inside.
        ("block_size", 1.5),
        ("seed", "abc"),
        ("top_p", "x"),
        ("router_threshold", "x"),
        ("max_new_tokens", True),
        ("logprobs", 2.0),
    ],
)
def test_bad_decode_values_raise_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DecodeConfig(**{field: value})


def test_default_threshold_is_the_models_dial_for_the_mode(engine):
    """`router_threshold` means one thing per mode, its default the model's field of that meaning:
    `verified`'s router gate (`draft_gate`, 1 here: every slot), `hybrid`'s tolerance."""
    resolve = lambda **kw: DecodeConfig(**kw).resolved(engine.model.config).router_threshold  # noqa: E731
    t = engine.model.config.hybrid_tolerance
    assert engine.model.config.draft_gate == 1.0 and t != 1.0
    assert [resolve(mode=m) for m in ("verified", "hybrid", "nar")] == [1.0, t, t]
    assert resolve(mode="verified", router_threshold=0.3) == 0.3


def test_a_checkpoint_with_the_old_dial_names_loads_them_under_the_new():
    from yue.config import YueConfig

    config = YueConfig(router_threshold=0.25, verified_threshold=0.7)
    assert (config.hybrid_tolerance, config.draft_gate) == (0.25, 0.7)
    assert "router_threshold" not in config.to_dict() and "verified_threshold" not in config.to_dict()


def test_the_default_mode_is_decided_by_the_model_config_alone():
    from yue.config import YueConfig

    assert DecodeConfig().mode is None
    assert DecodeConfig().resolved(YueConfig(default_mode="verified")).mode == "verified"
    assert DecodeConfig().resolved(YueConfig(default_mode="verified", nar_layers=0)).mode == "ar"


@pytest.mark.parametrize("mode", ["verified", "hybrid", "ar"])
def test_a_call_naming_no_mode_runs_the_models_default_mode(engine, monkeypatch, mode):
    monkeypatch.setattr(engine.model.config, "default_mode", mode)
    assert engine.request("x", None, {})[1].mode == mode  # as generate, stream and a batch resolve it
    assert engine.request("x", None, {"mode": "nar"})[1].mode == "nar"  # a named mode wins
    trace = engine.generate("def f(x):\n", max_new_tokens=16, trace=True).trace
    assert any(s.drafted for s in trace) == (mode != "ar")


def test_a_batch_returns_each_rows_logprobs(engine):
    kw = dict(mode="verified", max_new_tokens=8, logprobs=2)
    batch = engine.generate(["def f(x):\n", "class "], **kw)
    for prompt, result in zip(["def f(x):\n", "class "], batch, strict=True):
        alone = engine.generate(prompt, **kw)
        assert result.token_ids == alone.token_ids
        assert [e.token for e in result.logprobs] == result.token_ids
        assert [e.logprob for e in result.logprobs] == pytest.approx(
            [e.logprob for e in alone.logprobs], abs=1e-4
        )
    # A list of token ids is one prompt (infill builds its prompt as ids), not a batch.
    assert not isinstance(engine.generate([1, 2, 3], max_new_tokens=2), list)


def test_prompt_longer_than_the_context_is_a_value_error(engine):
    with pytest.raises(ValueError, match="context"):
        engine.generate("x " * 400, max_new_tokens=8)


def test_unknown_option_is_a_value_error(engine):
    with pytest.raises(ValueError, match="temprature"):
        engine.generate("x", temprature=0.5)


def test_cancel_ends_the_stream(engine):
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 3

    events = list(engine.stream("def alpha", mode="ar", max_new_tokens=50, cancel=cancel))
    assert events[-1].finish_reason == "cancelled"
    assert sum(len(e.token_ids) for e in events) == 3


def test_trace_records_one_step_per_verifying_forward(engine):
    r = engine.generate(
        "def alpha_1(x):\n", mode="verified", max_new_tokens=30, router_threshold=1.0, trace=True
    )
    assert r.stats.draft_passes > 0  # a step's drafting pass is its second forward, in the same Step
    assert len(r.trace) == r.stats.forwards - r.stats.draft_passes
    assert all(s.format().startswith("[router] step") for s in r.trace)


def test_ignore_eos_writes_exactly_max_new_tokens(engine):
    stopped = engine.generate("def alpha_1(x):\n", mode="ar", max_new_tokens=60)
    assert stopped.finish_reason == "eos"
    full = engine.generate("def alpha_1(x):\n", mode="ar", max_new_tokens=60, ignore_eos=True)
    assert full.finish_reason == "length" and len(full.token_ids) == 60
    assert full.token_ids[: len(stopped.token_ids)] == stopped.token_ids


def test_cli_generate_takes_drafting_options_and_names_bad_ones(trained_model_dir):
    from typer.testing import CliRunner

    from yue.cli import app

    base = [
        "generate",
        "def alpha",
        "--model",
        trained_model_dir,
        "--mode",
        "verified",
        "--max-new-tokens",
        "12",
    ]
    outs = []
    options = (
        ["--drafting", "fused"],
        ["--draft-dtype", "float32"],
        ["--draft-dtype", "bfloat16"],
        ["--low-memory"],
    )
    for extra in options:
        res = CliRunner().invoke(app, [*base, *extra])
        assert res.exit_code == 0, res.output
        outs.append(res.output)
    assert len(set(outs)) == 1  # verified: the same text however it drafts, with one weight copy or two
    for bad in (["--drafting", "lazy"], ["--draft-dtype", "int4"]):
        res = CliRunner().invoke(app, [*base, *bad])
        assert res.exit_code == 2 and bad[1] in res.output


def test_a_model_is_prepared_for_decoding_once(trained_model_dir):
    from yue.model import load_model

    model = prepare_for_decoding(load_model(trained_model_dir))
    with pytest.raises(ValueError, match="already prepared"):
        prepare_for_decoding(model)


def test_preparing_consumes_the_trained_model_and_registers_nothing_on_it(trained_model_dir, tmp_path):
    """`prepare_for_decoding` returns a PreparedModel holding the trained model and its decode paths: the
    trained modules gain no state (the same state-dict names as loaded), and the consumed model refuses
    to run alone, be saved, trained or adapted, while the prepared one computes the loaded model's
    logits."""
    import torch

    from yue.model import PreparedModel, load_model
    from yue.model.adapters import apply_adapter

    loaded, trained = load_model(trained_model_dir), load_model(trained_model_dir)
    prepared = prepare_for_decoding(trained)
    assert isinstance(prepared, PreparedModel) and prepared.trained is trained and trained.consumed
    assert len(prepared.paths.layers) == trained.config.num_hidden_layers
    assert set(trained.state_dict()) == set(loaded.state_dict())
    ids = torch.tensor([[5, 6, 7, 8]])
    for refused in (
        lambda: trained(ids),
        lambda: trained.save_pretrained(tmp_path),
        lambda: trained.train(),
        lambda: trained.generate(ids, max_new_tokens=2),
    ):
        with pytest.raises(ValueError, match="consumed by prepare_for_decoding"):
            refused()
    for model in (trained, prepared):
        with pytest.raises(ValueError, match="before prepare_for_decoding"):
            apply_adapter(model, tmp_path)
    with torch.inference_mode():
        assert torch.allclose(prepared(ids).logits, loaded(ids).logits, atol=1e-4)
