"""The NAR campaign: new, distinct, never-evaluated requests each round, greedy and sampled answers,
training, tau logged against tokens, and a rerun that carries on where the last one stopped."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from safetensors.torch import load_file

from recipes.yue_smol_campaign import export_chunks
from tests.test_distill import save_tiny_llama
from yue.train import topnar as tn
from yue.train.everyday import everyday_prompts
from yue.train.rounds import Rounds, RoundsConfig
from yue.train.selfinstruct import content_hash
from yue.train.topnar_run import TopNARRecipe, build_model, save_nar_folder, tokenize_chats


@pytest.fixture(scope="module")
def base_and_init(tmp_path_factory):
    """A tiny chat Llama and a top-layer NAR folder on it (the campaign's starting point)."""
    base = save_tiny_llama(tmp_path_factory.mktemp("chat-llama"), layers=3, tied=True, max_positions=256)
    (base / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}a:"
    )
    model = build_model(base, TopNARRecipe(nar_layers=1, block_size=4, draft_vocab_size=64))
    init = save_nar_folder(model, tmp_path_factory.mktemp("init") / "nar", {"base": str(base)})
    return base, init


def eval_sets(tmp_path) -> dict[str, str]:
    """Two evaluation splits; the held-out one holds a text the templates make, to show it is refused."""
    taken = everyday_prompts(3, seed=10_000)[0][0]["content"]
    out = {}
    for name, texts in {"held": [taken, "Tell me a joke."], "calib": ["Name a colour.", "Say hi."]}.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(
            "".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts)
        )
        out[name] = str(path)
    return out


CFG = RoundsConfig(
    chunk_prompts=6,
    max_new_tokens=10,
    long_new_tokens=14,
    gen_batch_size=4,
    eval_new_tokens=8,
    train=tn.TopNARConfig(
        steps=3, batch_size=2, anchors=4, lr=1e-3, warmup_steps=1, min_lr_ratio=1.0, eval_every=3
    ),
)


def test_sampled_answers_are_seeded_and_differ_from_greedy(base_and_init):
    base, init = base_and_init
    model = build_model(base, TopNARRecipe(nar_layers=1, block_size=4, draft_vocab_size=64))
    prompts = tokenize_chats(base, [[{"role": "user", "content": f"request {i}"}] for i in range(4)])
    greedy = tn.greedy_answers(model, prompts, 12, 2, progress=False)
    one = tn.greedy_answers(model, prompts, 12, 2, False, temperature=1.0, top_p=0.95, seed=5)
    two = tn.greedy_answers(model, prompts, 12, 2, False, temperature=1.0, top_p=0.95, seed=5)
    assert one.ids == two.ids and one.prompt_lens == greedy.prompt_lens
    assert one.ids != greedy.ids


def test_rounds_make_distinct_unseen_data_log_tau_and_resume(base_and_init, tmp_path):
    base, init = base_and_init
    evals = eval_sets(tmp_path)
    folder = tmp_path / "campaign"
    start = {k: v.float() for k, v in load_file(str(init / "model.safetensors")).items() if ".nar_" in k}
    other_set = tmp_path / "other.jsonl"
    other_set.write_text(json.dumps({"messages": [{"role": "user", "content": "Never train on me."}]}) + "\n")
    camp = Rounds(folder, base, init, evals, "calib", CFG, exclude=[other_set])
    assert content_hash("Never train on me.") in camp.seen
    record = camp.run_round()
    chunk = camp.chunk(0)
    # Every one-turn request is new and none is an evaluation prompt (the held-out one the templates make).
    forbidden = {content_hash(t) for t in ["Tell me a joke.", "Name a colour.", "Say hi."]}
    forbidden.add(content_hash(json.loads(open(evals["held"]).readline())["messages"][0]["content"]))
    assert not forbidden & set(chunk["hashes"]) and len(set(chunk["hashes"])) == len(chunk["hashes"])
    assert forbidden <= camp.seen
    # Greedy and sampled answers (deduplicated), follow-up turns, long requests.
    assert len(chunk["ids"]) == len({tuple(x) for x in chunk["ids"]}) > len(chunk["hashes"])
    assert {"template", "multi_turn", "long"} <= set(chunk["kinds"])
    assert record["round"] == 1 and record["tokens_seen"] > 0 and set(record["tau"]) == {"held", "calib"}
    lines = [json.loads(x) for x in (folder / "log.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines] == [0, 1] and lines[0]["tokens_seen"] == 0
    assert (folder / "last" / "model.safetensors").is_file() and (
        folder / "best" / "model.safetensors"
    ).is_file()
    # A new process carries on: the next round adds a chunk of requests not seen before.
    again = Rounds(folder, base, init, evals, "calib", CFG)
    last = {k: v.clone() for k, v in again.model.state_dict().items() if ".nar_" in k}
    for k, v in last.items():  # from last/ (stored in float16), not from the starting folder
        torch.testing.assert_close(v, camp.model.state_dict()[k].half().float(), rtol=0, atol=0)
    assert any(not torch.equal(v, start[k]) for k, v in last.items())
    second = again.run_round()
    assert second["round"] == 2 and second["chunks"] == [0, 1]
    assert second["tokens_seen"] > record["tokens_seen"]
    assert not set(again.chunk(1)["hashes"]) & set(chunk["hashes"])
    # Answers made elsewhere join as chunks once (by file name), their requests remembered.
    out = export_chunks(again, tmp_path, parts=2)
    assert sum(len(json.loads(gzip.decompress(p.read_bytes()))["ids"]) for p in out) == len(
        chunk["ids"]
    ) + len(again.chunk(1)["ids"])
    other = Rounds(tmp_path / "other", base, init, evals, "calib", CFG)
    made = other.import_sequences(out[0], per_chunk=3)
    assert len(made) >= 2 and other.import_sequences(out[0]) == []
    assert set(chunk["hashes"]) <= other.seen


def test_everyday_prompts_return_fewer_when_spent_unless_strict(monkeypatch):
    from yue.train import everyday

    monkeypatch.setattr(everyday, "CATEGORIES", {"python": (everyday.PYTHON, 1.0)})
    monkeypatch.setattr(everyday, "GIVE_UP_AFTER", 500)
    made = everyday.everyday_prompts(1000, seed=1, strict=False)
    texts = [m[0]["content"] for m in made]
    # Four task templates x 20 tasks + two word templates x 12 words: all of them, once each.
    assert len(texts) == len(set(texts)) == 4 * len(everyday.PY_TASK) + 2 * len(everyday.PY_WORD)
    with pytest.raises(ValueError, match="distinct"):
        everyday.everyday_prompts(1000, seed=1)


def test_command_line_sets_the_rounds_slot_weights():
    """--slot-decay / --kl-weight reach the rounds' training config (a lower decay weights the first
    drafts, which decide the accepted prefix); a decay outside (0, 1] is refused."""
    from recipes.yue_smol_campaign import _arguments, _config

    need = ["--dir", "d", "--base", "b.gguf", "--init", "i", "--calibration", "c"]
    cfg = _config(_arguments(need + ["--slot-decay", "0.3", "--kl-weight", "2"])).train
    assert (cfg.slot_decay, cfg.kl_weight) == (0.3, 2.0)
    w = tn.slot_weights(4, cfg.slot_decay, "cpu")
    assert w[1] > 0.7 > tn.slot_weights(4, 0.7, "cpu")[1]  # slot 2's share of the loss
    assert _config(_arguments(need)).train.slot_decay == tn.TopNARConfig.slot_decay
    with pytest.raises(ValueError, match="slot_decay"):
        _config(_arguments(need + ["--slot-decay", "0"]))
