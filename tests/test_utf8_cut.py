"""Where `max_new_tokens` stops inside a multi-byte character, nothing prints U+FFFD: the Python
iterator, `generate`'s text, the CLI and the server's SSE all end before the cut character, and the
final text is the streamed deltas joined."""

from __future__ import annotations

import httpx
import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import tiny_config
from tests.serve_utils import LiveServer, parse_sse
from yue.cli import app
from yue.engine import Engine
from yue.model import YueForCausalLM
from yue.tokenizer import IncrementalDetokenizer

PROMPT = "Sea:"
ANSWER = "ok \U0001f30a!"  # an emoji its tokenizer never saw: four byte tokens


def _walker(tokenizer, path: list[int]) -> YueForCausalLM:
    """A tiny model whose greedy AR step goes path[i] -> path[i + 1]: attention and MLPs write nothing,
    so the last hidden state is the token's own embedding, a one-hot the LM head maps to its successor."""
    torch.manual_seed(0)
    model = YueForCausalLM(tiny_config(tokenizer, tie_word_embeddings=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for i, (a, b) in enumerate(zip(path, path[1:], strict=False)):
            model.model.embed_tokens.weight[a, i] = 10.0
            model.lm_head.weight[b, i] = 5.0
    return model


@pytest.fixture(scope="module")
def cut(tokenizer, tmp_path_factory):
    """(model folder, engine, tokens to generate, the text before the cut character)."""
    prompt_ids, answer_ids = tokenizer.encode(PROMPT), tokenizer.encode(ANSWER)
    path = [prompt_ids[-1], *answer_ids]
    assert len(set(path)) == len(path), "the walk needs distinct tokens"
    emoji_start = len(tokenizer.encode("ok "))
    n = emoji_start + 2  # two of the emoji's four bytes
    folder = tmp_path_factory.mktemp("walker")
    _walker(tokenizer, path).save_pretrained(folder)
    tokenizer.save(folder)
    engine = Engine(_walker(tokenizer, path), tokenizer, name="walker")
    assert engine.generate(PROMPT, mode="ar", max_new_tokens=len(answer_ids)).text == ANSWER
    return str(folder), engine, n, "ok "


def test_the_detokenizer_drops_a_character_cut_at_the_end(tokenizer):
    ids = tokenizer.encode(ANSWER)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push([i]) for i in ids[:-3]] + [detok.flush()]  # "!" and two emoji bytes cut
    assert "".join(deltas) == detok.text == "ok " and "\ufffd" not in detok.text


def test_stream_and_generate_end_before_a_cut_character(cut):
    _, engine, n, before = cut
    deltas = [ev.delta for ev in engine.stream(PROMPT, mode="ar", max_new_tokens=n)]
    assert all("\ufffd" not in d for d in deltas)
    text = engine.generate(PROMPT, mode="ar", max_new_tokens=n).text
    assert "".join(deltas) == text == before


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_the_cli_prints_no_cut_character(cut, stream):
    folder, _, n, before = cut
    res = CliRunner().invoke(
        app, ["generate", PROMPT, "--model", folder, "--mode", "ar", "-n", str(n), stream]
    )
    assert res.exit_code == 0, res.output
    assert res.stdout == before + "\n"


def test_the_servers_sse_ends_before_a_cut_character(cut):
    _, engine, n, before = cut
    body = {"model": "walker", "prompt": PROMPT, "max_tokens": n, "temperature": 0, "mode": "ar"}
    with LiveServer(engine) as srv:
        streamed = httpx.post(f"{srv.url}/v1/completions", json={**body, "stream": True}, timeout=30)
        whole = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=30).json()
    events = [e for e in parse_sse(streamed.text) if e != "[DONE]"]
    pieces = [e["choices"][0]["text"] for e in events if e.get("choices")]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == whole["choices"][0]["text"] == before
