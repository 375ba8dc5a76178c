"""The NAR set's int8 layers on yue's row kernel (`matmuls.RowInt8Linear`), each layer of a drafting
pass one row-kernel call (`DecodeSet.whole_layer`), against the same layers through torch's calls."""

from __future__ import annotations

import pytest
import torch

from tests.test_rowkernel import needs_row_kernel
from tests.test_topnar import top_model
from yue.config import DecodeConfig
from yue.decode.loop import decode
from yue.kernels import prepare_for_decoding, probe, rowkernel
from yue.kernels.matmuls import Int8Linear, RowInt8Linear
from yue.kernels.prepare import DRAFT_FILL, DraftVocabHead, expand_draft_logits
from yue.model.masks import decode_mask
from yue.model.router import softmax_stats


def nar_sets(model) -> list:
    return [sets[1] for sets in model.paths.layers if len(sets) > 1]


def test_row_int8_linear_is_the_linear_within_its_codes_error():
    """Codes per output row (scale = max |w| / 127): each output within half a code step per input of the
    float result, for 1-20 rows (beyond one pass of the kernel) and a partial column block."""
    needs_row_kernel()
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(72, 45, bias=False)
    linear.weight.data = torch.randn(45, 72, generator=g)
    q = RowInt8Linear(linear)
    scale = linear.weight.abs().amax(1) / 127
    for rows in (1, 2, 5, 9, 20):
        x = torch.randn(rows, 72, generator=g)
        bound = x.abs().sum(1, keepdim=True) * scale / 2 + 1e-4
        assert bool(((q(x) - linear(x)).abs() <= bound).all())
    assert q.state_dict() == {}  # the codes are held in tuples: nothing to save or move


def quantized_rows_reference(x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """What `rows_matmul_i8dot` computes, in torch: each row of x quantized to int8 (scale max |x| / 127,
    rounded half to even), the integer dot products with the codes (exact in float64), times the row's
    scale. The same float32 operations in the same order, so the same bits."""
    amax = x.abs().amax(1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    xq = torch.round(x * inv[:, None]).clamp(-127, 127)
    sums = xq.double() @ codes.double().t()
    return sums.float() * (amax / 127)[:, None]


@pytest.mark.parametrize("out, inp", [(45, 72), (8, 4), (960, 576)])
def test_the_integer_dot_matmul_is_exact_integer_arithmetic_on_rows_quantized(out, inp):
    """`rows_matmul_i8dot` (a drafting set's int8 matmul): for 1-20 rows (beyond one pass), a partial
    column block and a zero row, bit for bit the quantized rows' exact integer products times their
    scales; so every build (AVX2's or the plain loop) computes the same bits."""
    needs_row_kernel()
    g = torch.Generator().manual_seed(out)
    codes = torch.randint(-127, 128, (out, inp), generator=g, dtype=torch.int8)
    blocked = rowkernel.dot_block(codes)
    assert rowkernel.layout(blocked) == "i8dot" and rowkernel.inputs(blocked) == inp
    for rows in (1, 2, 4, 9, 10, 20):
        x = torch.randn(rows, inp, generator=g) * torch.logspace(-3, 3, rows)[:, None]
        x[rows // 2] = 0.0
        assert torch.equal(rowkernel.matmul(x, blocked, out), quantized_rows_reference(x, codes)), rows


def test_row_int8_linear_needs_inputs_in_quads():
    """`dot_block` takes inputs 4 at a time: a Linear of another width stays on torch's int8 engine."""
    assert RowInt8Linear.fits(torch.nn.Linear(8, 3)) and not RowInt8Linear.fits(torch.nn.Linear(6, 3))
    assert not RowInt8Linear.fits(torch.nn.Linear(8, 3).to(torch.bfloat16))


@pytest.mark.parametrize("batch", [1, 2])
def test_a_drafting_pass_through_one_call_int8_layers_computes_what_their_torch_path_does(batch):
    """A top-layer NAR set prepared for int8 drafting: its layers are `RowInt8Linear`s run as one
    row-kernel call each; the same layers through torch's calls (`blocked` off) give the same slot logits
    and cache rows within float32 rounding, over a left-padded batch."""
    needs_row_kernel()
    assert probe.choice().ok("rows-f32"), probe.describe()
    model = prepare_for_decoding(top_model(nar_layers=2), torch.qint8)
    sets = nar_sets(model)
    assert all(s.blocked is not None and s.blocked[0].dtype == torch.int8 for s in sets)
    assert all(isinstance(m, RowInt8Linear) for s in sets for m in (s.qkv, s.gate_up, *s.shared[1::2]))
    blocked = [s.blocked for s in sets]
    stacks = model.paths.stacks
    assert (
        stacks[True].weights.first == model.trained.model.nar_start and len(stacks[True].weights.layers) == 2
    )
    n, K, mask_id = 12, model.config.block_size, model.config.mask_token_id
    prompt = torch.randint(4, 96, (batch, n), generator=torch.Generator().manual_seed(batch))

    def run(one_call: bool, stacked: bool = True):
        for s, b in zip(sets, blocked, strict=True):
            s.blocked = b if one_call else None
        model.paths.stacks = stacks if one_call and stacked else {}
        cache = model.new_cache(batch, 40)
        cache.set_padding([0, 3][:batch])
        with torch.inference_mode():
            mask = decode_mask(0, n, 0, cache.key_valid)
            out = model.step(prompt, cache.positions(torch.arange(n), padded=True), n, mask, cache, 1)
            cache.advance(n)
            slots = torch.full((batch, K), mask_id)
            slots[:, 0] = 5
            mask = decode_mask(n, 0, K, cache.key_valid)
            draft = model.step(slots, cache.positions(torch.arange(K)), 0, mask, cache, 0, out.entry[:, -1:])
        return draft.slot_logits, cache

    (fast, fast_cache), (slow, slow_cache) = run(True), run(False)
    torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-4)
    for i, layer in enumerate(model.trained.model.layers):
        if layer.has_nar:  # the slots' K/V rows, written by the one call and by torch's path
            for a, b in zip(fast_cache.layer(i), slow_cache.layer(i), strict=True):
                torch.testing.assert_close(a[:, :, : n + K], b[:, :, : n + K], atol=1e-4, rtol=1e-4)
    # The NAR stack in one call (`rowkernel.stack`) is its layers' one calls in turn: the same bits.
    per_layer, per_layer_cache = run(True, stacked=False)
    assert torch.equal(fast, per_layer)
    assert torch.equal(fast_cache.k, per_layer_cache.k) and torch.equal(fast_cache.v, per_layer_cache.v)


def test_fused_drafts_after_committed_rows_read_their_own_mask_rows():
    """A full NAR stack with fused drafting: a step's slots follow its committed rows (mask rows from
    row0 = n_committed), through one-call int8 layers as through torch's; and `verified` stays `ar`."""
    needs_row_kernel()
    model = prepare_for_decoding(top_model(nar_layers=4, draft_vocab=None, seed=3), torch.qint8)
    sets = nar_sets(model)
    assert len(sets) == 4 and all(s.blocked is not None for s in sets)
    blocked = [s.blocked for s in sets]
    K, mask_id = model.config.block_size, model.config.mask_token_id
    prompt = torch.randint(4, 96, (1, 10), generator=torch.Generator().manual_seed(7))

    def slot_logits(one_call: bool) -> torch.Tensor:
        for s, b in zip(sets, blocked, strict=True):
            s.blocked = b if one_call else None
        cache = model.new_cache(1, 40)
        tokens = torch.cat([prompt, torch.full((1, K), mask_id)], dim=1)
        n = prompt.shape[1]
        with torch.inference_mode():
            # The committed rows at start 0 are a prefill (torch's path); a second step starts later.
            model.step(prompt[:, :4], torch.arange(4), 4, decode_mask(0, 4, 0, cache.key_valid), cache, 1)
            cache.advance(4)
            mask = decode_mask(4, n - 4, K, cache.key_valid)
            return model.step(tokens[:, 4:], torch.arange(4, n + K), n - 4, mask, cache, 1).slot_logits

    torch.testing.assert_close(slot_logits(True), slot_logits(False), atol=1e-4, rtol=1e-4)
    for s, b in zip(sets, blocked, strict=True):
        s.blocked = b
    runs = {}
    for mode, drafting in (("ar", "separate"), ("verified", "fused")):
        cfg = DecodeConfig(mode=mode, drafting=drafting, max_new_tokens=20, ignore_eos=True)
        cfg = cfg.resolved(model.config)
        runs[mode] = [t for em in decode(model, [prompt[0].tolist()], cfg) for t in em.tokens[0]]
    assert runs["verified"] == runs["ar"]


def test_without_the_row_kernel_int8_drafting_stays_on_torchs_engine():
    """`YUE_KERNELS=no-rows-f32` (or no compiler): the NAR set's int8 matmuls are torch's dynamic ones,
    layer by layer, and drafting still runs."""
    with probe.forced("rows-f32"):
        model = prepare_for_decoding(top_model(nar_layers=2), torch.qint8)
    sets = nar_sets(model)
    assert all(s.blocked is None and isinstance(s.qkv, Int8Linear) for s in sets)
    assert model.paths.stacks == {}  # no layer in one call, no stack
    cfg = DecodeConfig(mode="verified", max_new_tokens=12, ignore_eos=True).resolved(model.config)
    assert len([t for em in decode(model, [[5, 6, 7, 8]], cfg) for t in em.tokens[0]]) == 12


def test_draft_logits_spread_over_the_vocabulary():
    sub = torch.randn(2, 3, 4)
    ids = torch.tensor([7, 1, 4, 9])
    full = expand_draft_logits(sub, ids, 10)
    assert torch.equal(full[..., ids], sub)
    outside = torch.ones(10, dtype=torch.bool)
    outside[ids] = False
    assert bool((full[..., outside] < -1e8).all())


def test_the_row_kernels_spread_is_torchs():
    """`rowkernel.spread` (a prepared draft head's, `DraftVocabHead` with `row_kernel`) gives
    `expand_draft_logits`'s tensor."""
    needs_row_kernel()
    g = torch.Generator().manual_seed(0)
    sub = torch.randn(2, 3, 50, generator=g)
    ids = torch.randperm(300, generator=g)[:50]
    assert torch.equal(rowkernel.spread(sub, ids, 300, DRAFT_FILL), expand_draft_logits(sub, ids, 300))
    head = DraftVocabHead(torch.nn.Identity(), ids, 300, row_kernel=True)
    assert torch.equal(head(sub), expand_draft_logits(sub, ids, 300))


def test_a_prepared_slot_entry_runs_int8_near_its_float_form():
    """Prepared for int8 drafting on the row kernel, a top-layer NAR set's slot entry holds W's two halves
    as `RowInt8Linear`s and its norm on the row kernel; its slot states stay within int8 rounding of the
    float form's; the final norm of a drafting pass's rows is the row kernel's, which equals torch's."""
    needs_row_kernel()
    model = top_model(nar_layers=2)
    entry = model.model.slot_entry
    g = torch.Generator().manual_seed(1)
    anchor, emb = torch.randn(2, 1, 64, generator=g), torch.randn(2, 4, 64, generator=g)
    with torch.inference_mode():
        ref = entry(anchor, emb)
        paths = prepare_for_decoding(model, torch.qint8).paths
        halves = (paths.slot_entry.from_anchor, paths.slot_entry.from_token)
        assert all(isinstance(m, RowInt8Linear) for m in halves) and paths.slot_entry.norm is not None
        lowered = entry(anchor, emb, paths.slot_entry)
        h = torch.randn(1, 4, 64, generator=g)
        torch.testing.assert_close(paths.slot_norm(h), model.model.norm(h), atol=1e-6, rtol=1e-5)
    assert entry.proj.weight.shape == (64, 128)  # the float weight stays, as saved
    torch.testing.assert_close(lowered, ref, atol=0.05 * ref.abs().max().item(), rtol=0)
    assert not torch.equal(lowered, ref)


def test_the_row_kernels_softmax_stats_are_the_routers():
    """`rowkernel.softmax_stats` (a prepared model's router statistics, `DecodePaths.softmax_stats`) gives each row's largest
    probability and entropy as `router.softmax_stats` does, within float32 rounding; rows with -inf or a
    reduced vocabulary's fill weigh those logits 0 (torch's entropy is NaN at -inf: 0 * -inf)."""
    needs_row_kernel()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 1001, generator=g) * 4
    x[1, 2, 7:900] = DRAFT_FILL
    top, ent = rowkernel.softmax_stats(x)
    ref_top, ref_ent = softmax_stats(x)
    torch.testing.assert_close(top, ref_top, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    x[0, 0, :500] = float("-inf")
    top, ent = rowkernel.softmax_stats(x)
    ref_top, ref_ent = softmax_stats(x[0, 0, 500:])
    torch.testing.assert_close(top[0, 0], ref_top, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ent[0, 0], ref_ent, atol=1e-5, rtol=1e-5)
    model = prepare_for_decoding(top_model(nar_layers=2), torch.qint8)
    assert model.paths.softmax_stats is rowkernel.softmax_stats
