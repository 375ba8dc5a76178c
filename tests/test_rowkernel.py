"""The row-streaming float32 kernel (`yue.kernels.rowkernel`): its values, each row's bits whatever the call,
its build cache, and its fallback where it cannot be built, forced here as on a machine without a compiler.
"""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch

import yue
from yue.kernels import probe, rowkernel
from yue.kernels.decode_set import decode_layout
from yue.kernels.matmuls import StreamedLinear
from yue.model.decode_paths import exact_rows


def needs_row_kernel() -> None:
    """Skip the calling test where the row kernel cannot be built (the reason in the skip)."""
    try:
        rowkernel.library()
    except rowkernel.KernelUnavailable as e:
        pytest.skip(f"the row kernel cannot be built here: {e}")


@pytest.fixture
def fresh_build(gguf_cache):
    """The kernel built into a fresh $YUE_CACHE_DIR (`gguf_cache`), every probe forgotten before and after."""
    probe.reset()
    yield gguf_cache / "kernels"
    probe.reset()


@pytest.mark.parametrize("out, inp", [(40, 24), (96, 64), (7, 5)])
def test_the_row_kernel_is_the_linear_for_any_row_count_and_a_partial_column_block(out, inp):
    needs_row_kernel()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out, inp, generator=g)
    blocked = rowkernel.block(w)
    for rows in (1, 2, 5, 9, 10, 20):  # beyond 9 rows: further passes over the weight
        x = torch.randn(rows, inp, generator=g)
        torch.testing.assert_close(rowkernel.matmul(x, blocked, out), x @ w.t(), atol=1e-5, rtol=1e-5)
    x3 = torch.randn(2, 3, inp, generator=g)  # leading dims kept, a non-contiguous input taken
    torch.testing.assert_close(rowkernel.matmul(x3.transpose(0, 1), blocked, out), x3.transpose(0, 1) @ w.t())


def test_the_row_norm_is_torchs_rms_norm_and_each_row_the_same_bits_alone():
    needs_row_kernel()
    g = torch.Generator().manual_seed(2)
    for n in (576, 64, 37):  # a width that is not a whole number of vectors
        x, w = torch.randn(7, n, generator=g), torch.randn(n, generator=g)
        y = rowkernel.rms_norm(x, w, 1e-5)
        torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (n,), w, 1e-5))
        assert all(torch.equal(rowkernel.rms_norm(x[i], w, 1e-5), y[i]) for i in range(7))


@pytest.mark.parametrize("head_dim, heads, kv_heads", [(64, 9, 3), (128, 4, 4), (32, 2, 1)])
@pytest.mark.parametrize("start", [0, 5, 130])
def test_the_row_attention_is_sdpa_for_masks_holes_and_gqa(head_dim, heads, kv_heads, start):
    """`rowkernel.attention` against SDPA over the same visible keys: a batch whose second row has
    holes (left padding), a lone row with no mask (each query up to its own key), 1-11 queries."""
    needs_row_kernel()
    if not rowkernel.attention_fits(head_dim):
        pytest.skip(f"{head_dim}-wide heads are not a multiple of this build's vector width")
    g = torch.Generator().manual_seed(start + head_dim)
    k, v = (torch.randn(2, kv_heads, 192, head_dim, generator=g) for _ in range(2))
    for T in (1, 4, 11):
        S = start + T
        q = torch.randn(2, heads, T, head_dim, generator=g)
        visible = torch.ones(2, T, S, dtype=torch.bool).tril(start)
        visible[1, :, : start // 2] = False
        expected = torch.nn.functional.scaled_dot_product_attention(
            q, k[:, :, :S], v[:, :, :S], visible[:, None], enable_gqa=heads != kv_heads
        )
        out = rowkernel.attention(q, k, v, visible.to(torch.uint8), start)
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(
            rowkernel.attention(q[:1], k[:1], v[:1], None, start), expected[:1], atol=2e-5, rtol=2e-5
        )


@pytest.mark.parametrize("holes", [0, 3, 7, 16, 21])
def test_a_query_behind_holes_gets_the_bits_it_gets_alone(holes):
    """What batch rows equal to their solo runs rests on (`KVCache.join` leaves holes in a row's keys,
    left padding too): a query whose visible keys sit at scattered indices, holes masked, gives the bits
    of the same query over those keys alone, contiguous from 0 with no mask."""
    needs_row_kernel()
    g = torch.Generator().manual_seed(holes)
    n, Dh = 37, 64
    if not rowkernel.attention_fits(Dh):
        pytest.skip("64-wide heads are not a multiple of this build's vector width")
    k, v = (torch.randn(1, 3, n + holes + 8, Dh, generator=g) for _ in range(2))
    seen = torch.ones(n + holes, dtype=torch.bool)
    seen[torch.randperm(n + holes, generator=g)[:holes]] = False  # holes anywhere, the last key seen
    seen[-1] = True
    idx = seen.nonzero().squeeze(1)[:n]
    q = torch.randn(1, 9, 1, Dh, generator=g)
    start = int(idx[-1])
    visible = torch.zeros(1, 1, start + 1, dtype=torch.uint8)
    visible[0, 0, idx] = 1
    alone_k, alone_v = (t[:, :, idx].contiguous() for t in (k, v))
    pad = torch.zeros(1, 3, 8, Dh)
    alone = rowkernel.attention(q, torch.cat([alone_k, pad], 2), torch.cat([alone_v, pad], 2), None, n - 1)
    assert torch.equal(rowkernel.attention(q, k, v, visible, start), alone)


@pytest.mark.parametrize("rows", [1, 2, 9, 10, 32, 33, 70])
def test_a_row_streamed_linear_is_the_linear_at_every_row_count_and_kernel(rows):
    """1-9 rows through the row kernel, more through the batched GEMM over its column blocks: each is
    the linear (a partial last block here)."""
    needs_row_kernel()
    linear = torch.nn.Linear(48, 72, bias=False)
    module = StreamedLinear(linear)
    assert not module.state_dict()  # the blocked copy is held, not registered
    x = torch.randn(rows, 48)
    expected = linear(x).detach()
    torch.testing.assert_close(module(x), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(module(x[None]), expected[None], atol=1e-5, rtol=1e-5)


def test_each_row_is_the_same_bits_whatever_the_calls_rows_place_or_threads():
    """One fmaf chain per output: a verifying row reads what the same row alone would, bit for bit."""
    needs_row_kernel()
    g = torch.Generator().manual_seed(1)
    w = torch.randn(200, 96, generator=g)
    blocked = rowkernel.block(w)
    x = torch.randn(12, 96, generator=g)
    alone = torch.cat([rowkernel.matmul(x[i : i + 1], blocked, 200) for i in range(12)])
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for rows in range(2, 13):
                assert torch.equal(rowkernel.matmul(x[:rows], blocked, 200), alone[:rows])
            assert torch.equal(
                rowkernel.matmul(x[3:7], blocked, 200), alone[3:7]
            )  # another place in the call
    finally:
        torch.set_num_threads(threads)


def test_the_build_is_cached_and_a_corrupt_cached_library_is_rebuilt(fresh_build, tmp_path, monkeypatch):
    needs_row_kernel()  # builds into the fresh cache
    (built,) = fresh_build.glob("rowkernel-*.so")
    rowkernel.library.cache_clear()
    stamp = built.stat().st_mtime_ns
    rowkernel.library()
    assert built.stat().st_mtime_ns == stamp  # reused, not rebuilt
    # A corrupt file under the same name in another cache (the loaded one stays mapped, untouched).
    other = tmp_path / "other-cache"
    corrupt = other / "kernels" / built.name
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(b"not a shared object")
    monkeypatch.setenv("YUE_CACHE_DIR", str(other))
    rowkernel.library.cache_clear()
    x, w = torch.randn(3, 8), torch.randn(16, 8)
    torch.testing.assert_close(rowkernel.matmul(x, rowkernel.block(w), 16), x @ w.t())
    assert corrupt.read_bytes()[:4] == b"\x7fELF"  # rebuilt, not trusted


def test_without_a_compiler_the_probe_says_why_and_float32_rows_fall_back(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with probe.forced() as choice:
        assert not choice.ok("rows-f32")
        assert "rows-f32 (no C compiler ('no-such-compiler-here' not on PATH; set CC))" in choice.describe()
        assert choice.float32_rows == ("onednn-packed" if choice.ok("onednn-f32") else "F.linear")
        with pytest.raises(rowkernel.KernelUnavailable, match="set CC"):
            rowkernel.library()


def test_an_unwritable_cache_is_a_reason_not_a_crash(fresh_build, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("YUE_CACHE_DIR", str(blocker))
    with probe.forced() as choice:
        assert not choice.ok("rows-f32")
        if shutil.which(os.environ.get("CC", "cc").split()[0]):  # with a compiler, the cache is the reason
            assert "cannot write the kernel cache" in choice.describe()


def test_a_compiler_refusing_the_fast_flags_builds_with_the_next_set(fresh_build, monkeypatch):
    monkeypatch.setattr(rowkernel, "FLAG_SETS", (["-fno-such-flag-for-yue"], []))
    needs_row_kernel()
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    torch.testing.assert_close(rowkernel.matmul(x, rowkernel.block(w), 16), x @ w.t())


def test_a_small_model_verifies_through_the_row_kernel(trained_model_dir):
    """Where the row kernel builds, even a tiny model's matmuls hold one copy for it, its layers are
    row-exact and release their float weights, its costs are keyed by it, and `verified` writes `ar`'s
    tokens."""
    needs_row_kernel()
    with probe.forced():
        engine = yue.load(trained_model_dir)
    model = engine.model
    qkv = model.paths.layers[0][0].qkv
    assert isinstance(qkv, StreamedLinear) and isinstance(
        model.paths.ar_head.head, StreamedLinear
    )  # screened
    for layer, sets in zip(
        model.trained.model.layers, model.paths.layers, strict=True
    ):  # one kernel for 1-9 rows
        assert exact_rows(sets) and layer.self_attn.q_proj.weight.numel() == 0
    assert decode_layout(model).startswith("StreamedLinear,")
    kw = dict(max_new_tokens=30, ignore_eos=True)
    drafted = 0
    for prompt in ("def alpha_1(x):\n", "class "):
        ar = engine.generate(prompt, mode="ar", **kw)
        ver = engine.generate(prompt, mode="verified", router_threshold=1.0, **kw)
        assert ver.token_ids == ar.token_ids
        drafted += ver.stats.drafted
    assert drafted > 0  # verifying steps of several rows really ran


def test_low_memory_with_the_row_kernel_keeps_the_layers_and_drops_the_heads_second_copy(trained_model_dir, caplog):
    """The row kernel's layers hold one copy already; `low_memory` then leaves the head its input-major
    weight alone (the embedding table), and `ar` == `verified` holds."""
    needs_row_kernel()
    caplog.set_level(logging.INFO, logger="yue.kernels.prepare")
    with probe.forced():
        engine = yue.load(trained_model_dir, low_memory=True)
    assert "one copy of each float32 weight: the row kernel's" in caplog.text
    model = engine.model
    assert isinstance(model.paths.layers[0][0].qkv, StreamedLinear)
    assert model.paths.ar_head is None  # AR rows take lm_head itself
    kw = dict(max_new_tokens=24, ignore_eos=True)
    for prompt in ("def add(a, b):", "class Stack:"):
        ar = engine.generate(prompt, mode="ar", **kw).token_ids
        assert engine.generate(prompt, mode="verified", router_threshold=1.0, **kw).token_ids == ar
