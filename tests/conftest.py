"""Shared fixtures: tiny tokenizers and models built on the spot (no downloads, CPU, seconds)."""

from __future__ import annotations

import random

import pytest
import torch

from yue.config import YueConfig
from yue.kernels import probe
from yue.model import YueForCausalLM
from yue.tokenizer import YueTokenizer

torch.set_num_threads(1)  # tiny models: threads only add contention on a 2-core CI machine

SAMPLE_TEXT = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "你好，世界！ 中文文本也可以。 emoji 🎉 ok\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(main())\n",
]


def pattern_corpus(n: int = 200, seed: int = 0) -> list[str]:
    """Regular but not trivial code-like text: a tiny model learns it in seconds, so drafts are
    sometimes right and sometimes wrong, which is what exercises accept/reject paths."""
    rng = random.Random(seed)
    names = ["alpha", "beta", "gamma", "delta", "omega"]
    out = []
    for _ in range(n):
        a, b = rng.sample(names, 2)
        k = rng.randint(0, 9)
        out.append(f"def {a}_{k}(x):\n    return {b}(x) + {k}\n\n")
    return out


@pytest.fixture(scope="session")
def tokenizer() -> YueTokenizer:
    return YueTokenizer.train(SAMPLE_TEXT * 20 + pattern_corpus(), vocab_size=320)


def tiny_config(tokenizer: YueTokenizer, **kw) -> YueConfig:
    base = dict(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        block_size=4,
        max_position_embeddings=256,
    )
    base.update(kw)
    return YueConfig(**base)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> str:
    """A randomly initialised tiny model folder (weights + tokenizer)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny")
    YueForCausalLM(tiny_config(tokenizer)).save_pretrained(path)
    tokenizer.save(path)
    return str(path)


@pytest.fixture(scope="session")
def trained_model_dir(tmp_path_factory, tokenizer) -> str:
    """A tiny model trained ~2 s on `pattern_corpus` (K=8): its drafts are accepted often but not
    always, so verified decoding really takes both the accept and the reject branches."""
    from yue.train.losses import joint_loss, sample_anchors

    torch.manual_seed(0)
    model = YueForCausalLM(tiny_config(tokenizer, block_size=8))
    ids = []
    for text in pattern_corpus(400, seed=1):
        ids += [tokenizer.eos_id] + tokenizer.encode(text)
    data = torch.tensor(ids)
    T, B = 48, 16
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        starts = torch.randint(0, len(data) - T, (B,), generator=g)
        x = torch.stack([data[s : s + T] for s in starts])
        loss = joint_loss(model, x, sample_anchors(B, T, 4, 8, g), 8, generator=g).total
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("trained")
    model.save_pretrained(path)
    tokenizer.save(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    """`tiny_model_dir` loaded as an Engine; shared (an Engine keeps no per-request state)."""
    import yue

    return yue.load(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """A tiny random Llama GGUF (Q4_1, GQA, tied, ChatML tokenizer and template): `gguf_utils.TinyGGUF`."""
    from tests.gguf_utils import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def gguf_cache(tmp_path, monkeypatch):
    """GGUF conversions go to a fresh cache under tmp_path ($YUE_CACHE_DIR), never the user's."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("YUE_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def cpu_capability():
    """Set the CPU capability torch reports ("AVX512", "AVX2", "DEFAULT"), the kernel choice re-probed
    for it; both restored afterwards. Models prepared meanwhile keep the choices made for it."""
    with pytest.MonkeyPatch.context() as patch:

        def set_to(cpu: str) -> None:
            patch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: cpu)
            probe.reset()

        yield set_to
    probe.reset()
