"""The four-expert per-layer router (issue 47, an experiment): trains, every expert learns, the sticky
term keeps positions on the expert they took at the layer below, and a model decodes with it."""

from __future__ import annotations

import json

import torch

import yue
from tests.test_train import tiny_train_config
from yue.config import YueConfig
from yue.model.experts import N_EXPERTS
from yue.model.mot import YueForCausalLM
from yue.train.loop import train
from yue.train.losses import joint_loss, sample_anchors


def four_expert_model(stick: float = 0.0, seed: int = 0) -> YueForCausalLM:
    config = YueConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        block_size=4,
        layer_routing="four-expert",
        expert_stick=stick,
    )
    torch.manual_seed(seed)
    return YueForCausalLM(config)


def test_every_expert_and_gate_receives_gradient_in_one_training_step():
    model = four_expert_model().train()
    x = torch.randint(4, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    anchors = sample_anchors(2, 24, 3, 4, torch.Generator().manual_seed(0))
    joint_loss(model, x, anchors, 4).total.backward()
    for i, layer in enumerate(model.model.layers):
        for name, module in (("ar", layer.mlp), ("nar", layer.nar_mlp)):
            assert module.down_proj.weight.grad.abs().sum() > 0, (i, name)
        experts = layer.experts
        for p in (
            experts.gate.weight,
            experts.type_bias,
            experts.fallback_gate_up.weight,
            experts.fallback_down.weight,
        ):
            assert p.grad is not None and p.grad.abs().sum() > 0, i


def test_inference_routes_each_position_to_two_experts():
    model = four_expert_model().eval()
    x = torch.randn(1, 5, 32)
    layer = model.model.layers[0]
    w = layer.experts.weights(x, False, None)  # (1, 5, 4)
    assert ((w > 0).sum(-1) == 2).all()
    assert torch.allclose(w.sum(-1), torch.ones(1, 5))


def agreement(model: YueForCausalLM, x: torch.Tensor) -> float:
    """Share of positions whose first choice at layer l equals the one at layer l - 1."""
    with torch.no_grad():
        model(x)
    committed = [c for nar, c in model.model.last_route.choices if not nar]
    same = [(a == b).float().mean() for a, b in zip(committed, committed[1:], strict=False)]
    return float(torch.stack(same).mean())


def test_sticky_term_keeps_positions_on_the_expert_taken_below():
    x = torch.randint(4, 64, (2, 32), generator=torch.Generator().manual_seed(2))
    loose, sticky = four_expert_model(0.0).eval(), four_expert_model(0.0).eval()
    for m in (loose, sticky):  # a gate with opinions: random weights, no type bias
        torch.manual_seed(5)
        for layer in m.model.layers:
            torch.nn.init.normal_(layer.experts.gate.weight, std=0.5)
            layer.experts.type_bias.data.zero_()
    for layer in sticky.model.layers:
        layer.experts.stick = 50.0
    base, stuck = agreement(loose, x), agreement(sticky, x)
    assert base < 0.9  # the loose router moves between experts
    assert stuck == 1.0  # a large sticky term holds every position on its first expert


def test_four_expert_run_trains_logs_usage_and_generates(tmp_path):
    cfg = tiny_train_config(tmp_path, steps=4, layer_routing="four-expert", expert_stick=0.5)
    final = train(cfg)
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    usage = [r for r in records if r["kind"] == "train"][-1]
    shares = [usage[f"c_{n}"] for n in ("ar", "nar", "fused", "fallback")]
    assert abs(sum(shares) - 1.0) < 0.01 and len(shares) == N_EXPERTS
    engine = yue.load(str(final))  # decoded as trained (no fused decode paths)
    out = engine.generate("def f", mode="verified", max_new_tokens=8)
    ref = engine.generate("def f", mode="ar", max_new_tokens=8)
    assert out.token_ids == ref.token_ids
