"""The head's integer screen (`yue.kernels.screen`): the argmax it keeps bit for bit (near ties within its
own rounding, exact ties, huge, tiny and zero rows), in every forced build, a bound made too tight
failing those checks, when the decode loop asks for it, and the model's tokens with and without it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_int4 import BUILDS, cpu_has
from tests.test_precision import X86, row_stream_model
from tests.test_rowkernel import fresh_build, needs_row_kernel  # noqa: F401
from yue.config import DecodeConfig, YueConfig
from yue.decode.loop import decode
from yue.decode.modes import get_policy
from yue.kernels import probe, rowkernel
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


def adversarial_case(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A head and rows where the screen's own error decides the order of near-tied tokens: (w (V, D), x
    (rows, D)), D not a whole number of groups of 32.

    The head is a GGUF Q8_0 table (codes * d per group of 32, d a float16 value, a code of 127 in every
    group), so the screen's codes are exact and only the rows' 16-bit rounding and float32 rounding are
    left in the bound; its tokens are one base token with +-1 on a few codes of the channels where the
    rows are small, so their logits differ by about the rows' rounding. Token 7 is copied to 150 and
    299: exact ties, which the first index wins. Rows: one outlier channel (as a hidden state's) over
    small values, at norms 1, 1e-30 and 1e30; a zero row; a row with no outlier."""
    g = torch.Generator().manual_seed(seed)
    V, D, G = 300, 80, 3
    base = torch.randint(-127, 128, (D,), generator=g)
    base[::32] = 127  # each group's largest |code|: the screen's d is the file's
    flips = torch.randint(-1, 2, (V, D), generator=g) * (torch.rand(V, D, generator=g) < 0.2)
    flips[:, ::32] = 0
    codes = (base + flips).clamp(-127, 127)
    d = (torch.rand(G, generator=g) * 0.01 + 1e-3).half().float().repeat_interleave(32)[:D]
    w = codes * d
    w[150] = w[299] = w[7]
    rows = torch.rand(12, D, generator=g) * 0.06 - 0.03
    rows[:9, 0] = torch.randn(9, generator=g).sign() * 1000  # the outlier: max |x| sets the rounding step
    scales = torch.tensor([1.0] * 7 + [1e-30, 1e30, 1.0, 1.0, 1.0])
    x = rows * scales[:, None]
    x[10] = 0.0
    x[11] = (w[7] - base * d) * 50  # along token 7's own code changes: the tied tokens lead
    return w, x


def screened_choice(head: ScreenedHead, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The screen's logits for x, the full head's (its row kernel's bits: a pass of at most MAX_ROWS rows
    at a time), and which logits the screen kept."""
    screened = head.top1(x)
    full = torch.cat([head(x[i : i + rowkernel.MAX_ROWS]) for i in range(0, x.shape[0], rowkernel.MAX_ROWS)])
    return screened, full, torch.isfinite(screened)


def assert_screen_exact(head: ScreenedHead, x: torch.Tensor) -> torch.Tensor:
    """The screen's argmax is the full head's on every row and every kept logit has its bits; returns
    the kept mask."""
    screened, full, kept = screened_choice(head, x)
    assert torch.equal(screened.argmax(-1), full.argmax(-1))
    assert torch.equal(screened[kept], full[kept])
    return kept


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_screened_argmax_is_the_full_heads_on_adversarial_rows(seed):
    """Near ties within the rows' own rounding, exact ties, huge, tiny and zero rows, a partial group:
    the argmax is the full head's and the first of tied tokens wins."""
    needs_row_kernel()
    w, x = adversarial_case(seed)
    head = _head(w)
    kept = assert_screen_exact(head, x)
    assert bool(kept[11, 7]) and int(head.top1(x)[11].argmax()) == 7  # the tie's first index
    assert kept[:7].sum(-1).max() > 1  # near ties the screen could not separate were kept and decided
    assert bool(kept[10].all())  # a zero row: every logit ties at 0, all kept, the first wins
    assert kept[9].sum() < 300  # a row without an outlier is screened sharply


@pytest.mark.parametrize("term", ["radius", "codes"])
def test_a_bound_too_tight_loses_the_argmax(term):
    """The adversarial rows need the bound: without any radius on the Q8_0 head (where only the rows' and
    float32's rounding are left to cover), or without the codes' error term (slack) on a head whose near
    tied tokens are not on the code grid, some row's screened argmax is not the full head's. So the
    exactness tests above can fail."""
    needs_row_kernel()
    misses = 0
    for seed in range(3):
        w, x = adversarial_case(seed)
        if term == "codes":  # tokens a hair apart, off the code grid: e_j > 0 and the codes blur them
            g = torch.Generator().manual_seed(seed)
            w = w[:1] + torch.randn(w.shape, generator=g) * 1e-4
            x = torch.randn(x.shape, generator=g)
        head = _head(w)
        assert_screen_exact(head, x)  # the true bound holds
        head.slack = (torch.zeros_like(head.slack[0]),)
        if term == "radius":
            head.wnorm = (torch.zeros_like(head.wnorm[0]),)
        screened, full, _ = screened_choice(head, x)
        misses += int((screened.argmax(-1) != full.argmax(-1)).sum())
    assert misses > 0


@pytest.mark.parametrize("build", [b for b in BUILDS if b != "native"] + ["plain"])
def test_every_build_screens_alike_and_exactly(build, fresh_build, monkeypatch):  # noqa: F811
    """Each forced build (AVX512 without VNNI, AVX2, AVX-VNNI, the plain loops of a machine without
    vector intrinsics, at 8 and 16 lanes) keeps the native build's candidates, logit for logit (the
    integer sums are the same in every build), on the adversarial rows and over near ties of 1-12 rows
    (9 a pass)."""
    if build != "plain" and not X86:
        pytest.skip("x86 vector paths")
    needs = {"avx512-no-vnni": "avx512bw", "avx2-vnni": "avx_vnni"}.get(build)
    if needs and not cpu_has(needs):
        pytest.skip(f"this CPU has no {needs}")
    needs_row_kernel()
    cases = [adversarial_case(seed) for seed in (0, 1)]
    g = torch.Generator().manual_seed(5)
    w = torch.randn(700, 64, generator=g) * 0.05
    cases.append((w, torch.randn(12, 64, generator=g) * 3))
    native = [screened_choice(_head(w), x)[0] for w, x in cases]
    for flags in [BUILDS.get(build, [])] + ([["-DYUE_LANES=16"]] if build == "plain" else []):
        monkeypatch.setattr(rowkernel, "FLAG_SETS", (flags,))
        probe.reset()
        for (w, x), want in zip(cases, native, strict=True):
            head = _head(w)
            assert_screen_exact(head, x)
            assert torch.equal(head.top1(x), want), (build, flags)


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
    model = row_stream_model(seed)
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


def test_a_screened_steps_whole_ar_logits_are_the_unscreened_steps():
    """A screened greedy step's rows through the whole head are, bit for bit, what the same step gives
    unscreened."""
    model = row_stream_model(0)
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


def test_a_screened_steps_entropy_is_its_whole_logits_within_the_screen():
    """Asked (`ar_entropy`, a request whose router is asked), a screened step brings each AR row's entropy
    over its logits as screened: its logits are the same, and the entropy is the whole logits' within
    the screen's error, not torch's -inf-riddled NaN."""
    model = row_stream_model(1)
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
