"""The server's continuous batching and what it makes natural in the OpenAI API: concurrent answers
equal lone ones, `n` > 1, lists of prompts, token-id prompts, log-probs from the AR path."""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from fastapi.testclient import TestClient

import yue
from tests.serve_utils import LiveServer, parse_sse
from tests.test_serve import _wait_ready, metric
from yue.config import DecodeConfig
from yue.serve import ServeConfig, create_app
from yue.serve.scheduler import Overloaded, Scheduler

PROMPTS = ["def add(a, b):", "class Point:\n    def ", "x", "    return gamma(x) + 4\n\ndef ", "import os\n"]
GREEDY = {"max_tokens": 24, "temperature": 0, "mode": "verified"}


@pytest.fixture(scope="module")
def trained(trained_model_dir):
    return yue.load(trained_model_dir)


@pytest.fixture(scope="module")
def client(trained):
    with TestClient(create_app(trained), raise_server_exceptions=False) as c:
        _wait_ready(c)
        yield c


def _alone(engine, prompt, **kw) -> str:
    return engine.generate(prompt, mode="ar", max_new_tokens=kw.get("max_tokens", 24)).text


@pytest.mark.parametrize("size", [1, 4])
def test_concurrent_answers_equal_lone_answers(trained, size):
    """16 streamed and non-streamed requests at once: each answer is what the request gets alone."""
    with LiveServer(trained, ServeConfig(max_batch_size=size)) as srv:

        def ask(i: int) -> str:
            body = {"prompt": PROMPTS[i % len(PROMPTS)]} | GREEDY
            if i % 2:
                events = parse_sse(
                    httpx.post(srv.url + "/v1/completions", json=body | {"stream": True}, timeout=60).text
                )
                return "".join(
                    e["choices"][0]["text"] for e in events if isinstance(e, dict) and e["choices"]
                )
            return httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(16)))
        metrics = httpx.get(srv.url + "/metrics").text
    assert answers == [_alone(trained, PROMPTS[i % len(PROMPTS)]) for i in range(16)]
    assert metric(metrics, "yue_batch_size_count") > 0
    if size > 1:  # the steps really were shared
        assert metric(metrics, "yue_batch_size_sum") > metric(metrics, "yue_batch_size_count")


def test_n_choices_and_a_list_of_prompts_come_back_prompt_major(client, trained):
    body = {"prompt": PROMPTS[:2], "n": 2} | GREEDY
    r = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    expect = [_alone(trained, p) for p in PROMPTS[:2] for _ in range(2)]
    assert [c["text"] for c in r["choices"]] == expect
    prompt_tokens = sum(trained.count_tokens(p) for p in PROMPTS[:2])  # each prompt counted once
    assert r["usage"]["prompt_tokens"] == prompt_tokens


def test_seeded_choices_differ_and_repeat(client):
    body = {"prompt": PROMPTS[0], "n": 3, "max_tokens": 16, "temperature": 1.0, "seed": 5, "mode": "ar"}
    first = [c["text"] for c in client.post("/v1/completions", json=body).json()["choices"]]
    again = [c["text"] for c in client.post("/v1/completions", json=body).json()["choices"]]
    assert first == again and len(set(first)) > 1


def test_streamed_choices_carry_their_index_and_equal_the_whole_answer(client):
    body = {"prompt": PROMPTS[:2], "n": 2, "stream_options": {"include_usage": True}} | GREEDY
    whole = client.post("/v1/completions", json=body).json()
    events = parse_sse(client.post("/v1/completions", json=body | {"stream": True}).text)
    assert events[-1] == "[DONE]"
    texts = ["", "", "", ""]
    finishes = [None] * 4
    for e in events[:-1]:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
            finishes[c["index"]] = c["finish_reason"] or finishes[c["index"]]
    assert texts == [c["text"] for c in whole["choices"]]
    assert finishes == [c["finish_reason"] for c in whole["choices"]]
    assert events[-2]["usage"] == whole["usage"]


def test_token_id_prompts_equal_their_text(client, trained):
    ids = [trained.encode(p) for p in PROMPTS[:2]]
    one = client.post("/v1/completions", json={"prompt": ids[0]} | GREEDY).json()
    many = client.post("/v1/completions", json={"prompt": ids} | GREEDY).json()
    assert one["choices"][0]["text"] == _alone(trained, PROMPTS[0])
    assert [c["text"] for c in many["choices"]] == [_alone(trained, p) for p in PROMPTS[:2]]
    assert one["usage"]["prompt_tokens"] == len(ids[0])


def test_penalties_and_logit_bias_reach_the_decoder(client, trained):
    """OpenAI's presence / frequency penalties and logit_bias (ids as strings): the answer is the
    library's `ar` under them, and differs from the plain one (they are not ignored)."""
    plain = _alone(trained, PROMPTS[0])
    banned = trained.encode(plain)[:3]
    extra = {"frequency_penalty": 0.8, "presence_penalty": 0.3, "logit_bias": {str(t): -100 for t in banned}}
    got = client.post("/v1/completions", json={"prompt": PROMPTS[0]} | GREEDY | extra).json()
    kw = {"frequency_penalty": 0.8, "presence_penalty": 0.3, "logit_bias": {t: -100 for t in banned}}
    want = trained.generate(PROMPTS[0], mode="ar", max_new_tokens=24, **kw).text
    assert got["choices"][0]["text"] == want != plain
    messages = [{"role": "user", "content": PROMPTS[0]}]
    chat = client.post("/v1/chat/completions", json={"messages": messages, "logit_bias": {"5": 100}} | GREEDY)
    forced = trained.generate(
        trained.chat_prompt(messages), mode="ar", max_new_tokens=24, logit_bias={5: 100}
    )
    assert forced.token_ids == [5] * 24
    assert chat.json()["choices"][0]["message"]["content"] == forced.text


def test_echo_prepends_each_prompt_streamed_or_not(client, trained):
    body = {"prompt": PROMPTS[:2], "n": 2, "echo": True} | GREEDY
    whole = client.post("/v1/completions", json=body).json()
    expected = [p + _alone(trained, p) for p in PROMPTS[:2] for _ in range(2)]
    assert [c["text"] for c in whole["choices"]] == expected
    events = parse_sse(client.post("/v1/completions", json=body | {"stream": True}).text)
    texts = ["", "", "", ""]
    for e in events[:-1]:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == expected
    ids = trained.encode(PROMPTS[1])  # token ids echo as their text
    one = client.post("/v1/completions", json={"prompt": ids, "echo": True} | GREEDY).json()
    assert one["choices"][0]["text"] == trained.tokenizer.decode(ids) + _alone(trained, PROMPTS[1])


def test_developer_messages_are_the_system_prompt(client):
    def ask(role: str) -> str:
        messages = [{"role": role, "content": "Answer in Python."}, {"role": "user", "content": PROMPTS[0]}]
        r = client.post("/v1/chat/completions", json={"messages": messages} | GREEDY)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    assert ask("developer") == ask("system")


def test_openai_fields_that_change_nothing_are_accepted(client):
    """Defaults of fields yue refuses when set, and fields it does not know, are a plain answer."""
    body = {"messages": [{"role": "user", "content": PROMPTS[0]}]} | GREEDY
    plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    extra = {
        "tools": [],
        "response_format": {"type": "text"},
        "user": "u1",
        "presence_penalty": 0,
        "logit_bias": {},
    }
    r = client.post("/v1/chat/completions", json=body | extra)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == plain
    r = client.post("/v1/completions", json={"prompt": PROMPTS[0], "suffix": "", "best_of": 1} | GREEDY)
    assert r.status_code == 200, r.text


def test_completion_logprobs_are_the_ar_paths(client, trained):
    body = {"prompt": PROMPTS[0], "logprobs": 2} | GREEDY
    r = client.post("/v1/completions", json=body).json()["choices"][0]
    lp = r["logprobs"]
    ref = trained.generate(PROMPTS[0], mode="ar", max_new_tokens=24, logprobs=2)
    assert len(lp["tokens"]) == len(ref.token_ids) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
    assert lp["token_logprobs"] == pytest.approx([e.logprob for e in ref.logprobs], abs=1e-4)
    # Greedy: each token is its position's most likely one; two alternatives (fewer if their texts coincide).
    for logprob, top in zip(lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert len(top) <= 2 and max(top.values()) == pytest.approx(logprob, abs=1e-4) and logprob <= 0
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    streamed = parse_sse(client.post("/v1/completions", json=body | {"stream": True}).text)
    got = [
        x
        for e in streamed[:-1]
        for c in e["choices"]
        if c["logprobs"]
        for x in c["logprobs"]["token_logprobs"]
    ]
    assert got == pytest.approx(lp["token_logprobs"], abs=1e-4)


def test_completion_top_logprobs_hold_the_sampled_token(client):
    # As OpenAI's legacy completions: the chosen token is always among its top_logprobs (n + 1 entries
    # where a sampled token is not in the top n). Temperature 2 (the cap) samples tokens outside the top 1 often.
    body = {
        "prompt": PROMPTS[0],
        "logprobs": 1,
        "max_tokens": 24,
        "temperature": 2.0,
        "seed": 3,
        "mode": "ar",
    }
    lp = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    entries = list(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True))
    assert entries and all(top.get(token) == pytest.approx(logprob) for token, logprob, top in entries)
    assert all(len(top) <= 2 for _, _, top in entries)
    assert any(len(top) == 2 for _, _, top in entries)  # some sampled token was outside the top 1


def test_nar_reports_null_for_tokens_it_committed_unverified(client):
    """`nar` commits slots no AR row predicted: null; its AR tokens have log-probs. (`hybrid` commits
    nothing unverified: every token it keeps was scored by an AR row.)"""
    body = {"prompt": PROMPTS[1], "logprobs": 0, "max_tokens": 30, "mode": "nar"}
    lp = client.post("/v1/completions", json=body | {"temperature": 0}).json()["choices"][0]["logprobs"]
    values = lp["token_logprobs"]
    assert any(v is None for v in values) and any(v is not None for v in values)
    assert all(v is None or (v <= 0 and math.isfinite(v)) for v in values)


def test_chat_logprobs_with_the_openai_client(trained):
    with LiveServer(trained) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
        chat = client.chat.completions.create(
            model=trained.name,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
            n=2,
            extra_body={"mode": "verified"},
        )
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content
    content = chat.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content) == chat.choices[0].message.content


def test_a_request_of_more_choices_than_free_slots_is_refused_whole(trained):
    # 3 slots (1 running + 2 waiting), 1 taken by a long generation: 3 more choices do not fit now, and
    # none of them is admitted (a request for more than 3 in all is a 400: test_serve_limits).
    async def submit():
        scheduler = Scheduler(trained, max_batch_size=1, max_queue=2)
        try:
            config = DecodeConfig(max_new_tokens=200, mode="ar", ignore_eos=True)
            first = scheduler.submit_all([(PROMPTS[0], config)])
            with pytest.raises(Overloaded):
                scheduler.submit_all([(p, config) for p in PROMPTS[:3]])
            taken = scheduler.running + scheduler.waiting
            scheduler.cancel(first[0])
            return taken
        finally:
            scheduler.close()

    assert asyncio.run(submit()) == 1


def test_bench_serve_levels_interleave_in_rounds_alternating_order():
    from yue.bench.serving import interleaved

    assert interleaved(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]
    assert interleaved([1, 2, 3], 1) == [(0, 1), (0, 2), (0, 3)]


def test_bench_serve_measures_every_level_in_rounds_and_checks_outputs(trained):
    from yue.bench.serving import ServeBenchConfig, bench_serve, report

    cfg = ServeBenchConfig(batch_sizes=(1, 4), clients=(1, 4), max_tokens=6, requests_per_client=1, rounds=2)
    result = bench_serve(trained, cfg, prompts=PROMPTS[:3])
    # Round 0 in order, round 1 reversed; at each client count the two sizes side by side.
    assert [(lv.round, lv.clients, lv.max_batch_size) for lv in result.levels] == [
        (0, 1, 1), (0, 1, 4), (0, 4, 1), (0, 4, 4), (1, 4, 4), (1, 4, 1), (1, 1, 4), (1, 1, 1),
    ]  # fmt: skip
    assert all(lv.identical == lv.requests == 8 and lv.tokens_per_s > 0 for lv in result.levels)
    # Prefill and decode apart, from the server's phase counters over each level.
    assert all(lv.prefill_tokens_per_s > 0 and lv.decode_tokens_per_s > 0 for lv in result.levels)
    # A ratio per round, of the two sizes in that round; its median and range over the rounds.
    by = {(lv.round, lv.clients, lv.max_batch_size): lv.tokens_per_s for lv in result.levels}
    ratio = result.ratios(1, 4)["4"]["tokens_per_s"]
    assert ratio["rounds"] == [round(by[r, 4, 4] / by[r, 4, 1], 3) for r in (0, 1)]
    assert ratio["range"] == [min(ratio["rounds"]), max(ratio["rounds"])]
    assert min(ratio["rounds"]) <= ratio["median"] <= max(ratio["rounds"])
    medians = {(m["max_batch_size"], m["clients"]): m for m in result.medians()}
    assert medians[4, 4]["rounds"] == 2 and medians[4, 4]["requests"] == 16
    assert medians[4, 4]["tokens_per_s"] == round((by[0, 4, 4] + by[1, 4, 4]) / 2, 1)  # median of two
    text = report(result, 1, 4)
    assert '"b4/b1"' in text.splitlines()[-1] and "| 4 | 4 | 2 | 16 |" in text
    assert "prefill tokens/s" in text
    assert set(result.ratios(1, 4)["4"]) >= {"prefill_tokens_per_s", "decode_tokens_per_s"}


def test_bench_serve_chat_turns_times_each_turn_with_and_without_the_prefix_cache(tiny_gguf):
    """`--chat-turns 2` end to end on a tiny Q4_1 GGUF (blocks: `prefix.split_exact`): two rounds of two
    new chats, each on a server with the cache and one without; every turn's answers agree between
    them, turn 2 finds its earlier turn in the cache, and the report has a row per turn and JSON last."""
    import json

    import yue
    from yue.bench.chat import bench_chat, chat_report
    from yue.bench.serving import ServeBenchConfig

    engine = yue.load(tiny_gguf.path)
    cfg = ServeBenchConfig(chat_turns=2, n_prompts=2, rounds=2, max_tokens=8, mode="ar", think_s=0.8)
    prompts = ["def add(a, b):", "class Point:", "x = 1", "import os"]
    result = bench_chat(engine, cfg, prompts=prompts, system="You are kind and brief, a sailor of the sea.")
    assert [(t.round, t.cache) for t in result.chat_turns if t.turn == 1] == [
        (0, False), (0, True), (1, False), (1, True)
    ]  # fmt: skip
    assert all(t.identical == t.requests == 2 for t in result.chat_turns)
    medians = {m["turn"]: m for m in result.chat_medians()}
    assert medians[2]["hit_tokens"] > 0 and medians[2]["rounds"] == 2
    assert all(t.hit_tokens == 0 for t in result.chat_turns if not t.cache)
    text = chat_report(result)
    assert "| 2 | 2 | 4 |" in text and json.loads(text.splitlines()[-1])["chat_medians"][1]["turn"] == 2


def test_echo_with_logprobs_scores_the_prompt_as_yue_eval_does(client, trained, trained_model_dir):
    """lm-evaluation-harness's request: echo + logprobs + max_tokens 0 returns the prompt tokens'
    log-probs (the first null), whose mean is the AR loss `yue eval` computes for the same tokens."""
    from yue.engine import load_unprepared
    from yue.train.evaluate import ar_loss

    text = PROMPTS[3] + PROMPTS[0]
    body = {"prompt": text, "echo": True, "logprobs": 2, "max_tokens": 0}
    r = client.post("/v1/completions", json=body).json()
    choice = r["choices"][0]
    lp = choice["logprobs"]
    ids = trained.encode(text)
    assert choice["text"] == text and r["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0,
                                                      "total_tokens": len(ids)}  # fmt: skip
    assert len(lp["token_logprobs"]) == len(ids) and lp["token_logprobs"][0] is None
    assert all(len(top) in (2, 3) for top in lp["top_logprobs"][1:])  # the chosen token among them
    model, _, _ = load_unprepared(trained_model_dir)

    class One:  # `ar_loss` reads packed sequences: the prompt as the only one
        data = torch.tensor([ids])

    expected = ar_loss(model, One, 1, 1)
    assert -sum(lp["token_logprobs"][1:]) / (len(ids) - 1) == pytest.approx(expected, abs=1e-4)
    # streamed, and after a generation: the same prompt entries lead
    events = parse_sse(client.post("/v1/completions", json=body | {"stream": True}).text)
    assert (
        events[-1] == "[DONE]"
        and events[0]["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"]
    )
    both = client.post("/v1/completions", json=body | {"max_tokens": 5, "temperature": 0}).json()["choices"][
        0
    ]
    assert both["logprobs"]["token_logprobs"][0] is None
    assert both["logprobs"]["token_logprobs"][1 : len(ids)] == pytest.approx(lp["token_logprobs"][1:])
    assert len(ids) < len(both["logprobs"]["tokens"]) <= len(ids) + 5 and both["text"].startswith(text)
