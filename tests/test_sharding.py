"""`ShardedObjective` in one process (a gloo group of 1; the 2-process runs are in
`test_distributed.py`): the stage's model is released while the sharded copy trains, whole again with
the copy's current weights in `whole()` and after `close()`, and a whole value pushed into the shards
is what the copy then computes with."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tests.test_topnar import top_model
from yue.train.sharding import ShardedObjective, stack_layers


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_model_is_whole_exactly_when_asked_and_trains_through_the_shards(one_process_group):
    model = top_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sharding = ShardedObjective(model, "cpu", world=1)
    # 1. Every layer of the stack is its own unit; the copy holds shards, the model nothing.
    assert len(stack_layers(sharding.net)) == len(model.model.layers)
    assert all(isinstance(s, DTensor) for _, s in sharding.pairs)
    assert all(p.numel() == 0 for p in model.parameters())
    # 2. Whole on demand, with the values it started with; released again after.
    with sharding.whole():
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k]), k
    assert all(p.numel() == 0 for p in model.parameters())
    # 3. A change to the copy's shards (a NAR query projection) shows in the whole model.
    names = [n for n, _ in model.named_parameters()]
    i = next(i for i, n in enumerate(names) if "nar_self_attn.q_proj" in n)
    original, shard = sharding.pairs[i]
    with torch.no_grad():
        shard.to_local().add_(1.0)
    with sharding.whole():
        assert torch.equal(original, before[names[i]] + 1.0)
        # 4. A whole value loaded into the model (a checkpoint) goes into the shards.
        with torch.no_grad():
            original.zero_()
        sharding.push()
    assert torch.equal(shard.full_tensor(), torch.zeros_like(before[names[i]]))
    # 5. After close the model is an ordinary module holding the copy's weights.
    sharding.close()
    assert not any(isinstance(p, DTensor) for p in model.parameters())
    after = model.state_dict()
    assert torch.equal(after[names[i]], torch.zeros_like(before[names[i]]))
    assert all(torch.equal(after[k], v) for k, v in before.items() if k != names[i])
