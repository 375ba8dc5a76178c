"""The head's int8 screen (`yue.kernels.screen`): its kernels, the argmax it keeps bit for bit (near-ties and
exact ties included), when the decode loop asks for it, and the model's tokens with and without it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_precision import row_stream_model
from tests.test_rowkernel import fresh_build, needs_row_kernel  # noqa: F401
from yue.config import DecodeConfig, YueConfig
from yue.decode.loop import decode
from yue.decode.modes import get_policy
from yue.kernels import rowkernel
from yue.kernels.matmuls import StreamedLinear
from yue.kernels.screen import ScreenedHead
from yue.model.masks import decode_mask
from yue.model.router import softmax_stats


def _head(w: torch.Tensor, input_major: bool = True) -> ScreenedHead:
    """A screened row-kernel head over w (V, D), its weight held input-major as a tied head's is (or
    row-major)."""
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w.clone()
    return ScreenedHead(StreamedLinear(linear), w.t().contiguous().t() if input_major else w.clone())


def test_the_int8_matmul_is_the_codes_matmul():
    needs_row_kernel()
    g = torch.Generator().manual_seed(0)
    for out, inp in ((40, 24), (7, 5), (300, 64)):  # partial column blocks
        codes = torch.randint(-127, 128, (out, inp), generator=g, dtype=torch.int8)
        for rows in range(1, 14):  # 1-2 rows by blocks, 3+ by pairs of vectors, past a pass (6 or 9)
            x = torch.randn(rows, inp, generator=g)
            torch.testing.assert_close(
                rowkernel.matmul(x, rowkernel.block(codes), out), x @ codes.float().t(), atol=1e-3, rtol=1e-5
            )


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rows=st.sampled_from([1, 2, 4, 9, 12]),
    gap=st.sampled_from([0.0, 1e-7, 1e-4]),
    input_major=st.booleans(),
)
def test_the_screened_argmax_is_the_full_heads_through_near_ties(seed, rows, gap, input_major):
    check_screen(seed, rows, gap, input_major)


def check_screen(seed: int, rows: int, gap: float, input_major: bool) -> None:
    """Tokens planted at the row's best logit plus or minus `gap` (relative; 0: exact copies, a tie the
    first index wins): the screen's argmax is the full float32 head's, and every logit it keeps has the
    full head's bits."""
    needs_row_kernel()
    g = torch.Generator().manual_seed(seed)
    V, D = 700, 64
    w = torch.randn(V, D, generator=g) * 0.05
    x = torch.randn(rows, D, generator=g) * 3
    best = int((x[0] @ w.t()).argmax())
    for j, sign in ((11, 1), (300, -1), (699, 1)):  # near copies of the best token, before and after it
        w[j] = w[best] * (1 + sign * gap)
    head = _head(w, input_major)
    full = head(x)
    screened = head.top1(x)
    assert torch.equal(screened.argmax(-1), full.argmax(-1))
    kept = torch.isfinite(screened)
    if rows <= rowkernel.MAX_ROWS:  # the full head's own kernel; more rows run torch's GEMM
        assert torch.equal(screened[kept], full[kept])
    assert kept.sum(-1).min() >= 1 and kept.sum() < rows * V / 4  # it screened most tokens out
    if gap == 0.0:
        assert bool(kept[0, 11]) and bool(kept[0, 699])  # exact ties all kept: the first wins


def test_a_row_that_is_not_finite_gets_the_full_logits():
    needs_row_kernel()
    w = torch.randn(100, 32)
    x = torch.randn(2, 32)
    x[1, 3] = torch.nan
    head = _head(w)
    torch.testing.assert_close(head.top1(x), head(x), equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("flags, lanes", [([], 8), (["-DYUE_LANES=16"], 16)])
def test_the_int8_kernels_portable_builds(flags, lanes, fresh_build, monkeypatch):  # noqa: F811
    """The plain flag set (no -march: the widening without intrinsics) computes the same screen with
    8-float vectors and with 16 (AVX512's layout and 9 rows a pass, run here whatever this CPU has)."""
    monkeypatch.setattr(rowkernel, "FLAG_SETS", (flags,))
    needs_row_kernel()
    assert rowkernel.library().rows_lanes() == lanes
    test_the_int8_matmul_is_the_codes_matmul()
    for rows in (1, 4, 9):
        check_screen(3, rows, 1e-7, True)


@pytest.mark.parametrize(
    "mode, kw, expected",
    [
        ("ar", {}, True),
        ("nar", {}, True),
        ("verified", {"router_threshold": 1.0}, True),
        ("verified", {"router_threshold": 0.5}, True),  # the router's anchor row: computed whole when asked
        ("hybrid", {}, False),  # its tolerance reads p_AR
        ("ar", {"temperature": 0.7}, False),
        ("ar", {"repetition_penalty": 1.2}, False),
        ("ar", {"trace": True}, False),  # it records the AR entropy
    ],
)
def test_the_loop_asks_for_the_argmax_only_where_nothing_else_reads_the_logits(mode, kw, expected):
    config = YueConfig(block_size=4)
    cfg = DecodeConfig(mode=mode, **kw).resolved(config)
    assert get_policy(mode).argmax_only(cfg, config) == expected


@pytest.mark.parametrize("seed", [0, 1])
def test_a_float32_model_writes_the_same_tokens_screened_or_not(seed, monkeypatch):
    """A random float32 model on the row kernel: greedy `ar` and `verified` through the screen write
    what the full head gives (log-probs asked, which need it), and the screen really ran."""
    model = row_stream_model(seed, monkeypatch)
    head = model.paths.ar_head
    assert isinstance(head, ScreenedHead) and isinstance(head.head, StreamedLinear)
    calls = []
    top1 = head.top1_entropy
    monkeypatch.setattr(head, "top1_entropy", lambda x, entropy: calls.append(x.shape) or top1(x, entropy))
    prompt = torch.randint(4, 96, (9,), generator=torch.Generator().manual_seed(seed)).tolist()

    def run(mode: str, threshold: float = 1.0, **kw) -> list[int]:
        cfg = DecodeConfig(mode=mode, max_new_tokens=24, ignore_eos=True, router_threshold=threshold, **kw)
        return [t for em in decode(model, [prompt], cfg.resolved(model.config)) for t in em.tokens[0]]

    full = run("ar", logprobs=0)
    assert not calls  # log-probs read the whole distribution
    assert run("ar") == full and calls
    assert run("verified") == full
    assert any(shape[-2] > 1 for shape in calls)  # verifying steps of several rows were screened
    calls.clear()
    assert run("verified", threshold=0.5) == full and calls  # the router asked, the steps screened


def test_a_screened_steps_whole_ar_logits_are_the_unscreened_steps(monkeypatch):
    """A screened greedy step's rows through the whole head are, bit for bit, what the same step gives
    unscreened."""
    model = row_stream_model(0, monkeypatch)
    ids = torch.randint(4, 96, (1, 7), generator=torch.Generator().manual_seed(0))

    def step(top1: bool):
        cache = model.new_cache(1, 32)
        with torch.inference_mode():
            model.step(ids[:, :4], torch.arange(4), 4, decode_mask(0, 4, 0), cache, 1)
            cache.advance(4)
            return model.step(ids[:, 4:], torch.arange(4, 7), 3, decode_mask(4, 3, 0), cache, 2, top1=top1)

    screened, whole = step(True), step(False)
    assert screened.screened and not whole.screened
    assert not torch.equal(screened.ar_logits, whole.ar_logits)  # -inf off the candidates
    with torch.inference_mode():  # the step's last 2 of 3 committed rows carry AR logits
        again = model.paths.ar_head(screened.hidden[:, 1:]).float()
    assert torch.equal(again, whole.ar_logits)
    assert screened.ar_entropy is None and whole.ar_entropy is None  # not asked


def test_a_screened_steps_entropy_is_its_whole_logits_within_the_screen(monkeypatch):
    """Asked (`ar_entropy`, a request whose router is asked), a screened step brings each AR row's entropy
    over its logits as screened: its logits are the same, and the entropy is the whole logits' within
    the screen's error, not torch's -inf-riddled NaN."""
    model = row_stream_model(1, monkeypatch)
    ids = torch.randint(4, 96, (1, 7), generator=torch.Generator().manual_seed(1))

    def step(top1: bool, ar_entropy: bool):
        cache = model.new_cache(1, 32)
        with torch.inference_mode():
            model.step(ids[:, :4], torch.arange(4), 4, decode_mask(0, 4, 0), cache, 1)
            cache.advance(4)
            mask = decode_mask(4, 3, 0)
            return model.step(
                ids[:, 4:], torch.arange(4, 7), 3, mask, cache, 3, top1=top1, ar_entropy=ar_entropy
            )

    asked, plain, whole = step(True, True), step(True, False), step(False, True)
    assert torch.equal(asked.ar_logits, plain.ar_logits) and whole.ar_entropy is None  # unscreened: none
    reference = softmax_stats(whole.ar_logits)[1]  # (1, 3)
    assert asked.ar_entropy.shape == (1, 3) and bool(torch.isfinite(asked.ar_entropy).all())
    torch.testing.assert_close(asked.ar_entropy, reference, atol=2e-3, rtol=2e-3)
