"""Preparing a model for fast decoding (`YueForCausalLM.prepare_for_decoding`, done by `yue.load`).

At the default model's size a decode step on a CPU is memory-bound (a small matmul costs about the same
over 1 row as over 8: the weight's streaming is the cost) and bound by per-call overhead. Four changes
follow, each measured on the 2-core CPUs with one thread, weights not in cache (the figures:
docs/results-log.md, "Figures that were in code comments"):

- Input-major weights (`input_major`): same values, storage transposed, so `F.linear` hands MKL a
  contiguous (in, out) matrix, which MKL's one-row GEMV streams faster. Embeddings stay row-major (a
  lookup gathers rows).
- Fused matmuls (`fuse_linears`, `layers.DecodeSet`): Q/K/V as one and gate/up as one per layer and
  parameter set. The separate modules' weights become views of the fused storage (no copy), so
  checkpoints, names and the training path are unchanged.
- Lower-precision drafting (`lower_linear`): the NAR set's matmuls and a copy of the LM head for slot
  rows (`draft_head`) in int8 (CPU: dynamic quantization with per-output-channel weight scales, torch's
  fbgemm/x86 kernels) or bfloat16. int8 is a quarter of the bytes and fbgemm keeps small row counts
  cheap, so a memory-bound drafting pass gets faster; `Int8Linear` calls the kernel without the stock
  module's per-call Python (17 calls a drafting pass, where per-call overhead counts). Only drafts change: the AR set and the head computing AR logits
  keep their values, so `ar` and `verified` output is the same whatever the drafting precision;
  `hybrid`/`nar` commit drafts, so theirs may shift slightly (the bench measures it).
- Kernels by row count: where yue's row kernel builds (`rowkernel`), one copy of each weight laid out
  for it (`StreamedLinear`): 1-9 rows (a
  one-row AR step, a verifying step's k + 1) through it, the weight streamed once for all rows and
  every row's bits the same whatever the row count (a verifying step's extra rows cost less than on
  oneDNN's copy, so `verified` gains most). Else (`RowAdaptiveLinear`) two or more rows through oneDNN
  on pre-packed weights and one row through MKL's GEMV (MKL re-packs the weight for every call of
  several rows, oneDNN's one-row call is slower than MKL's GEMV). A model whose float32 layers exceed 1 GiB, or one loaded with `low_memory`, keeps one
  copy (`streamed_weights`; which one, `kernels`): there memory counts more than speed.

The bfloat16 precision (`yue.load(dtype="bfloat16")`, a separate, named precision): every AR matmul
and the head hold one oneDNN-packed bfloat16 copy (`PackedLinear`; MKL has no fast bfloat16 GEMV),
half float32's bytes, so a memory-bound step is faster than in float32. Attention and the KV cache stay
float32 (torch's CPU SDPA in bfloat16 is several times slower), and
`ar` == `verified` holds by construction, not by luck at near-ties (bfloat16's rounding turns any
last-bit difference into different tokens within a few steps, measured): a packed matmul padded to 4
rows gives each row the same bits whatever the row count (`packed_matmul`), and committed rows attend
in one call padded to 4 queries and 64 keys, one-row AR steps and verifying rows alike
(`ExactAttention`).

Which of these kernels exist on the running CPU (oneDNN packing per dtype, the int8 engine) is
decided by `probe.py`, probed once per process; where one is missing the matmul stays a plain
`F.linear` (or drafting stays float), same values, so `ar`/`verified` token ids do not change.

`prepare_for_decoding` returns a `PreparedModel` (`yue.model.prepared`): the trained model and the
`DecodePaths` built here (per layer its fused sets, the stacks, heads, slot entry and norm, the router's
statistics, the layout's name and the cache's precision), which every forward it runs is handed. The
trained model is consumed: its weights were transformed in place for memory, so it cannot be saved,
trained or adapted afterwards (quantized modules do not serialize to safetensors either); save, train or
adapt a model before preparing it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import NamedTuple

import torch
from torch import nn

from yue.kernels import float_codes, probe, rowkernel, rowstack
from yue.kernels.decode_set import DecodeSet, LayerStack, kernels_named
from yue.kernels.draft_head import DraftVocabHead, draft_head  # noqa: F401  (DraftVocabHead: re-exported)
from yue.kernels.file_codes import GGMLLinear
from yue.kernels.matmuls import (
    INT8,
    StreamedLinear,
    bf16_packed,
    decode_storage,
    int4_matmul,
    int4_unavailable,
    int8_unavailable,
    lower_linear,
    row_adaptive,
    row_exact,
)
from yue.kernels.screen import ScreenedHead
from yue.model.decode_paths import DecodePaths, SlotEntryPath, exact_rows
from yue.model.mot import DRAFT_FILL, YueForCausalLM, expand_draft_logits  # noqa: F401  (re-exported)
from yue.model.prepared import PreparedModel

logger = logging.getLogger(__name__)

# Float32 AR layer weights above this many bytes are held once (`streamed_weights`).
ONE_COPY_BYTES = 2**30


def ar_layer_bytes(model) -> int:
    """Bytes of the AR set's layer matmul weights (the head not counted)."""
    return sum(
        m.weight.numel() * m.weight.element_size() if isinstance(m, nn.Linear) else 4 * m.in_features * m.out_features
        for layer in model.model.layers
        for module in layer._sets(False)[1:4:2]
        for m in module.children()
        if isinstance(m, (nn.Linear, GGMLLinear))  # a GGUF's codes for a float precision: as float32
    )


@functools.cache
def warn_fallbacks(choice: probe.KernelChoice) -> None:
    """One WARNING per process (per kernel choice: a forcing is another) naming each fallback taken,
    `KernelChoice.losses`: a fallback can make decoding several times slower, and the CLI shows
    warnings on stderr (Python's last-resort handler) where INFO stays hidden."""
    if lost := choice.losses():
        logger.warning("kernel fallback, decoding runs slower: %s", "; ".join(lost))


def streamed_weights(model) -> bool:
    """Whether a float32 model's AR layers keep one copy of each weight, not two (MKL's input-major one
    and oneDNN's packed one, `RowAdaptiveLinear`): where they exceed `ONE_COPY_BYTES` (1 GiB, ~270M
    parameters), for a model whose second copy would cost more memory than its speed is worth. Which
    copy is `probe.choice().float32_one_copy`, timed on this CPU: the packed one where its one row
    is about level with MKL's GEMV (`PackedLinear`, as in bfloat16), else the input-major one. A
    smaller model holds one copy when loaded with `low_memory` (`prepare_for_decoding`).

    The second copy buys one-row speed: the packed kernel over one row (padded to 4) is slower than
    MKL's GEMV in the model, though level out of it; for a model below the bound the speed is worth
    the memory (SmolLM2's `yue bench` figures, one and two copies: docs/results-log.md, "Figures that
    were in code comments"). Its bfloat16 and int4 precisions hold one copy already. A small model
    keeps both copies for the same reason, more so: its step is per-call overhead, where MKL's one-row
    call is much cheaper than the packed one. Where the one copy is the packed one the head keeps both: its input-major
    copy is the embedding table too (`input_major`), so only the packed copy is extra.
    """
    return ar_layer_bytes(model) > ONE_COPY_BYTES


DRAFTING_DTYPES = {"int8": INT8, "bfloat16": torch.bfloat16, "float32": None}


def dtype_name(dtype: torch.dtype | None) -> str:
    """A drafting dtype's name, as `resolve_drafting_dtype` reads it (None: "float32", as loaded)."""
    return next(k for k, v in DRAFTING_DTYPES.items() if v == dtype)


def resolve_drafting_dtype(name: str | torch.dtype | None, device: torch.device | str) -> torch.dtype | None:
    """A drafting precision -> dtype for `prepare_for_decoding` (None = as loaded).

    name: "auto" (int8 on a CPU where an int8 engine works, `probe.int8_engine`, else as loaded),
    "int8", "bfloat16", "float32", or a dtype (torch.qint8, torch.bfloat16) / None as is.
    Raises:
        ValueError: an unknown name, or "int8" on a CPU where no int8 engine works.
    """
    if not isinstance(name, str):
        return name
    on_cpu = torch.device(device).type == "cpu"
    if name == "auto":
        return INT8 if on_cpu and probe.int8_engine() is not None else None
    if name not in DRAFTING_DTYPES:
        raise ValueError(f"drafting dtype must be one of auto, int8, bfloat16, float32; got {name!r}")
    if name == "int8" and on_cpu and probe.int8_engine() is None:
        raise ValueError(int8_unavailable())
    return DRAFTING_DTYPES[name]


# A model's precision by name -> the dtype `load` converts it to (None: as saved). "int4" loads as
# saved and holds its AR layers in 4 bits (`int4_matmul`, `prepare_for_decoding(int4=True)`); "file"
# holds a GGUF's own codes and "auto" picks it for a lone GGUF (`engine.file_or_named_precision`).
PRECISIONS = {"auto": None, "file": None, "float32": None, "bfloat16": torch.bfloat16, "int4": None}


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """A model precision -> the dtype `load` converts to: "float32" / "int4" / None (as saved) or
    "bfloat16"; a torch dtype passes as it is.

    Raises:
        ValueError: an unknown name.
    """
    if not isinstance(name, str):
        return name
    if name not in PRECISIONS:
        raise ValueError(f"dtype must be one of {', '.join(PRECISIONS)}; got {name!r}")
    return PRECISIONS[name]


def input_major(model: nn.Module, leave: frozenset[int] = frozenset()) -> nn.Module:
    """Store every float32 nn.Linear weight input-major, in place: same (out, in) shape and values, but
    the storage is the transpose, (in, out) row-major (other dtypes stay row-major: `decode_storage`).

    `F.linear(x, W)` multiplies by W.t(); with this layout W.t() is contiguous and MKL's small-row GEMM
    streams it faster (one thread, weights not in cache). Embeddings stay row-major: a lookup gathers
    rows, which input-major storage scatters over the whole table. Where a head is tied to a large
    embedding (over `SHARED_TABLE` floats), the embedding becomes a view of the head's input-major copy
    instead of keeping a second table: SmolLM2's 49,152 x 576 table is 113 MB, and its strided lookup
    is a negligible share of a step. A small model keeps both (its lookup's share of a short step
    would be felt, the copy's bytes would not). Figures: docs/results-log.md, "Figures that were in
    code comments".

    leave: ids of modules to leave as they are: those `fuse_linears` copies into decode storage next
    (`fused_parts`), whose input-major copy here would be a copy made only to be copied again.
    """
    seen: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module) not in leave:
            w = module.weight
            if id(w) not in seen:
                seen[id(w)] = nn.Parameter(decode_storage(w.detach()), requires_grad=False)
            module.weight = seen[id(w)]
            release_freed_memory()  # the replaced weight's pages, before the next copy adds to the peak
    for module in model.modules():
        if isinstance(module, nn.Embedding) and id(module.weight) in seen:  # tied to a head
            if module.weight.numel() > SHARED_TABLE:
                module.weight = seen[id(module.weight)]
    return model


def fused_parts(model) -> frozenset[int]:
    """Ids of the nn.Linear modules `decode_set` fuses (`fuse_linears`): each layer's Q/K/V and
    gate/up, of its AR set and, where it holds one, its NAR set."""
    parts = set()
    for layer in model.model.layers:
        for nar in (False, True)[: 1 + layer.has_nar]:
            _, proj, _, mlp = layer._sets(nar)
            parts |= {id(m) for m in (proj.q_proj, proj.k_proj, proj.v_proj, mlp.gate_proj, mlp.up_proj)}
    return frozenset(parts)


# Tied tables larger than this many floats are shared by the embedding and the input-major head.
SHARED_TABLE = 8 * 2**20


def fuse_linears(parts: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear in `decode_storage` computing `parts` side by side (outputs concatenated, in order);
    each part's weight becomes a view of the fused storage, so no weight is held twice."""
    out = sum(p.out_features for p in parts)
    fused = nn.Linear(parts[0].in_features, out, bias=False, device="meta")  # no random init: replaced
    weights = [p.weight.detach() for p in parts]  # (out_i, in) each, in any storage
    if all(w.dtype == torch.float32 for w in weights):
        # decode_storage's input-major layout: the (in, out) concatenation of each part's transpose, seen
        # as (out, in) (contiguous transposes first: torch's cat of transposed views is several times slower)
        w = torch.cat([w.t().contiguous() for w in weights], dim=1).t()
    else:
        w = decode_storage(torch.cat(weights, dim=0).to(weights[0].dtype))  # (out, in)
    fused.weight = nn.Parameter(w, requires_grad=False)
    start = 0
    for p in parts:
        p.weight = nn.Parameter(fused.weight[start : start + p.out_features], requires_grad=False)
        start += p.out_features
    return fused


def prepare_for_decoding(
    model: YueForCausalLM,
    drafting_dtype: torch.dtype | None = None,
    int4: bool = False,
    low_memory: bool = False,
) -> PreparedModel:
    """A `PreparedModel` of `model` for fast decoding: its decode paths built here, its weights
    transformed in place, so `model` is consumed (it cannot be run alone, saved, trained or adapted
    afterwards; see the module docstring). The AR set's values are untouched (`int4`, a precision of its
    own, aside), so `ar` and `verified` output stays what it was.

    - Every matmul weight input-major (`input_major`).
    - Per layer and parameter set, Q/K/V and gate/up fused into one matmul each (`DecodeSet`).
    - Float matmuls of the decode path (the AR set's, the LM head's for AR rows as `DecodePaths.ar_head`)
      on the kernel `kernels` found working for their dtype (`row_adaptive`): float32 one copy for the
      row kernel (`StreamedLinear`), else two, MKL's and oneDNN's (`RowAdaptiveLinear`); the packed
      copy alone for bfloat16 and a large float32 model's layers (`PackedLinear`, `streamed_weights`).
      Layers whose matmuls are all row-exact (bfloat16's packed copy, the row
      kernel, int4) attend in the exact form too (`decode_paths.exact_rows`) and release their float
      weights (`release_unpacked`).
    - A float32 row-kernel head (`StreamedLinear`) gets an integer screen (`screen.ScreenedHead`): greedy
      steps choose the full float32 head's token at a quarter of its bytes (28 MB more for SmolLM2).
    - With `drafting_dtype`, the NAR set's matmuls and a copy of the LM head for slot rows
      (`DecodePaths.draft_head`) lowered to it; the AR set and its head are untouched, so `ar` and
      `verified` output is the same whatever the drafting precision.
    - With `int4` (the int4 precision, a float32 model on the CPU): the AR layers' matmuls in 4 bits
      (`int4_matmul`): on the row kernel with int8 activations (`RowInt4Linear`; the head for AR rows
      float32 there, `StreamedLinear`, screened), else torch's int4pack on bfloat16 activations
      (`Int4Linear`; the head in bfloat16, `bf16_packed`), all row-exact.
    - With `low_memory`, a float32 model's AR matmuls hold one copy whatever their size, as a large
      model's do (`streamed_weights`): the row kernel's layers already do, and their head keeps only
      its input-major copy (the embedding table); else `probe.choice().float32_one_copy`, the
      packed copy (where its one row is timed level with MKL's GEMV; the head then keeps its
      input-major copy too) or the input-major weight alone (elsewhere; verifying rows then cost more,
      and the step costs steer drafting by them).

    Raises:
        ValueError: `int4` where the model is not float32 on the CPU, or the kernel does not run here;
            a model already prepared.
    """
    if isinstance(model, PreparedModel) or model.consumed:
        raise ValueError("the model is already prepared for decoding (prepare_for_decoding consumes it)")
    check_preparable(model, int4)
    model.consumed = True
    plan, as_trained = kernel_plan(model, low_memory), decodes_as_trained(model)
    if float_codes.holds_layer_codes(model) and (as_trained or not float_codes.direct(int4, plan.rows)):
        float_codes.materialize(model)  # a GGUF's codes where the layers' kernels are not built from them
    if as_trained:
        return PreparedModel(model, DecodePaths.as_trained(len(model.model.layers)))
    prepared = PreparedModel(model, decode_paths(model, drafting_dtype, int4, plan))
    float_codes.forget_sources(model)
    prepared.paths.layout = kernels_named(prepared)
    release_freed_memory()
    return prepared


class KernelPlan(NamedTuple):
    """Which kernels a model's float matmuls and row-wise work take (`kernel_plan`).

    one_copy: the AR matmuls hold one copy of each weight (`low_memory`, `streamed_weights`).
    rows: the float32 row count kernel probed on this CPU (`probe.KernelChoice.float32_rows`), or None
        (not a float32 model on the CPU: no CPU kernel probed for a GPU's model).
    streamed: the row kernel's one copy (`StreamedLinear`); one_copy then leaves the head its
        input-major copy alone, the embedding table.
    row_ops: the rest of a float32 step's row-wise work on yue's row kernel too, where it builds: the
        norms (`DecodeSet.rms_norm`) and the row-exact layers' attention (`ExactAttention`'s kernel
        form, float32 and int4, whose caches hold float32). Both made `ar` faster with the outputs
        unchanged, measured in one process (docs/results-log.md, "Figures that were in code comments").
    """

    one_copy: bool
    rows: str | None
    streamed: bool
    row_ops: bool


def kernel_plan(model, low_memory: bool) -> KernelPlan:
    """The kernels `prepare_for_decoding` builds for `model` on this machine (`KernelPlan`)."""
    one_copy = low_memory or streamed_weights(model)
    on_cpu_float32 = model.dtype == torch.float32 and model.device.type == "cpu"
    rows = probe.choice().float32_rows if on_cpu_float32 else None
    streamed = rows == "row-stream"
    row_ops = on_cpu_float32 and probe.choice().ok("rows-f32")
    if one_copy and on_cpu_float32 and (streamed or probe.packed_rows(torch.float32)):
        log_one_copy(streamed)
    return KernelPlan(one_copy, rows, streamed, row_ops)


def decode_paths(model, drafting_dtype: torch.dtype | None, int4: bool, plan: KernelPlan) -> DecodePaths:
    """The `DecodePaths` `prepare_for_decoding` builds on `plan`'s kernels: weights input-major, each
    layer's decode sets, the kernel stacks, the slots' parts and the heads (its `layout` named after)."""
    input_major(model, leave=fused_parts(model))
    release_freed_memory()
    paths = DecodePaths(
        [
            layer_paths(
                layer, drafting_dtype, int4, plan.one_copy and not plan.streamed, plan.rows, plan.row_ops
            )
            for layer in model.model.layers
        ]
    )
    one_call = all(sets[0].one_layer is not None for sets in paths.layers)
    logger.info(
        "%s layers: %s", model.config.family, "one row-kernel call each" if one_call else "several calls each"
    )
    paths.stacks = kernel_stacks(model.model.layers, paths.layers)
    prepare_slots(model, paths, drafting_dtype, plan.row_ops)
    head = ar_head(model, int4, plan.one_copy, plan.streamed, plan.rows, plan.row_ops)
    paths.ar_head = head if head is not model.lm_head else None
    if exact_rows(paths.layers[0]):
        # bfloat16 on a CPU attends in float32: torch's CPU SDPA in bfloat16 is several times slower
        # than in float32 at a decode step's shapes, 30 calls a step (docs/results-log.md).
        paths.cache_dtype = torch.float32
    paths.draft_head = draft_head(model, drafting_dtype, plan.row_ops)
    return paths


def layer_paths(layer, drafting_dtype, int4: bool, one_copy: bool, rows: str | None, row_ops: bool) -> tuple:
    """A layer's decode paths (`DecodePaths.layers`): its AR set's and (where it holds one) its NAR set's
    `decode_set`; a row-exact layer's float copies released (`release_unpacked`)."""
    sets = tuple(
        decode_set(layer, nar, drafting_dtype, int4, one_copy, rows, row_ops)
        for nar in (False, True)[: 1 + layer.has_nar]
    )
    if exact_rows(sets):
        release_unpacked(layer)
    release_freed_memory()  # per layer, so the freed copies do not pile up into the peak
    return sets


def decodes_as_trained(model) -> bool:
    """Whether the model decodes as trained, unprepared: the four-expert experiment (`model/experts.py`),
    whose fused paths would run each position type's own MLP, not the routed mix."""
    if model.config.layer_routing == "type":
        return False
    logger.info("layer routing %r: decoding on the model as trained", model.config.layer_routing)
    return True


def log_one_copy(streamed: bool) -> None:
    """Log which single copy a float32 model's weights keep (`streamed_weights`, `low_memory`)."""
    logger.info(
        "one copy of each float32 weight: %s",
        "the row kernel's; the head the input-major embedding table"
        if streamed
        else f"{probe.choice().float32_one_copy} (oneDNN's packed one row timed at "
        f"{probe.one_row_packed_ratio():.2f}x MKL's GEMV here)",
    )


def prepare_slots(model, paths: DecodePaths, drafting_dtype: torch.dtype | None, row_ops: bool) -> None:
    """The drafting pass's own parts, into `paths` (`prepare_for_decoding`): the slot entry lowered to
    `drafting_dtype` (if any), and the final norm (slots' and committed rows') and the router's softmax
    statistics on yue's row kernel where `row_ops`."""
    entry = model.model.slot_entry
    if entry is not None and drafting_dtype is not None:
        norm = (
            functools.partial(rowkernel.rms_norm, weight=entry.norm.weight, eps=entry.norm.eps)
            if row_ops
            else None
        )
        lower = functools.partial(lower_linear, dtype=drafting_dtype, row_kernel=row_ops)
        paths.slot_entry = SlotEntryPath(*slot_entry_halves(entry, lower), norm)
    if row_ops:
        # Gemma's (1 + w) folded into a float32 copy (`rowstack.applied_norm`); committed rows too: Gemma's
        # norm module is several torch calls a step.
        norm = model.model.norm
        weight = rowstack.applied_norm(norm)
        paths.slot_norm = paths.final_norm = functools.partial(
            rowkernel.rms_norm, weight=weight, eps=norm.eps
        )
        paths.softmax_stats = rowkernel.softmax_stats


def slot_entry_halves(entry, lower) -> tuple[nn.Module, nn.Module]:
    """The slot entry's W (D, 2D) as its anchor and token halves (D -> D each), as `lower` makes them (int8
    drafting: `matmuls.RowInt8Linear`). Why: in float32 these two matmuls are a sizeable, memory-bound
    share of a drafting pass (caches cold between decode steps); int8 reads a quarter of the bytes
    (docs/results-log.md)."""
    d = entry.norm.weight.shape[0]
    halves = []
    for half in (entry.proj.weight[:, :d], entry.proj.weight[:, d:]):
        linear = nn.Linear(d, d, bias=False, device=half.device, dtype=half.dtype)
        linear.weight = nn.Parameter(half.detach().clone(), requires_grad=False)
        halves.append(lower(linear))
    return halves[0], halves[1]


def check_preparable(model, int4: bool) -> None:
    """Raise where the int4 precision cannot run for `model`; on the CPU, log the kernels found and warn
    where bfloat16 has no packed kernel (`prepare_for_decoding`).

    Raises:
        ValueError: `int4` where the model is not float32 on the CPU, or the kernel does not run here.
    """
    if int4:
        why = int4_unavailable(model.device) or ("a float32 model" if model.dtype != torch.float32 else "")
        if why:
            raise ValueError(f"the int4 precision needs {why}")
    if model.device.type == "cpu":
        logger.info("kernels: %s", probe.describe())
        warn_fallbacks(probe.choice())
        if model.dtype == torch.bfloat16 and not probe.packed_rows(torch.bfloat16):
            logger.warning(
                "bfloat16 on this CPU runs through plain F.linear (%s): slower than float32 here, and its "
                "rows' bits depend on a step's row count, so `verified` may part from `ar` where two tokens "
                "are near-tied; float32 or int4 run faster, and exactly (docs/results-log.md)",
                next(p.why for p in probe.choice().probes if p.name == "onednn-bf16"),
            )
    elif model.dtype != torch.float32:
        # A GPU's library picks its matmul kernels by shape, so a verifying step's rows need not have the
        # bits of one-row steps (seen on an H200: docs/results-log.md, "CUDA").
        logger.warning(
            "%s on %s: a row's bits may depend on a step's row count, so `verified` may part from `ar` "
            "where two tokens are near-tied; float32 keeps them exact",
            str(model.dtype).removeprefix("torch."),
            model.device.type,
        )


def decode_set(
    layer,
    nar: bool,
    drafting_dtype: torch.dtype | None,
    int4: bool,
    one_copy: bool,
    rows: str | None,
    row_ops: bool,
) -> DecodeSet:
    """A layer's parameter set (`nar`) for the decode path (`prepare_for_decoding`): Q/K/V and gate/up
    fused, the NAR set lowered to `drafting_dtype` (if any), the AR set's matmuls in 4 bits with `int4`,
    else on `row_adaptive`'s kernel (`one_copy`, `rows`); attention on the row kernel where `row_ops`."""
    _, proj, _, mlp = layer._sets(nar)
    if isinstance(proj.q_proj, GGMLLinear):  # a GGUF's codes for a float precision (`float_codes`)
        return float_codes.decode_set(layer, int4, rows, row_ops)
    biases = [proj.q_proj.bias, proj.k_proj.bias, proj.v_proj.bias]
    qkv_bias = None if biases[0] is None else torch.cat(biases).detach()  # (H + 2 Hkv) Dh
    qkv = fuse_linears([proj.q_proj, proj.k_proj, proj.v_proj])
    gate_up = fuse_linears([mlp.gate_proj, mlp.up_proj])
    if nar and drafting_dtype is not None:
        # int8 on the row kernel where its norms and attention run too: the layer is one call.
        lower = functools.partial(lower_linear, dtype=drafting_dtype, row_kernel=row_ops)
        qkv, gate_up = lower(qkv), lower(gate_up)
        # The separate NAR modules are lowered too: no float copy of the NAR set stays alive.
        for module in (proj, mlp):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Linear) and child.bias is None:  # biased ones stay float
                    setattr(module, name, lower(child))
    matmuls = [
        int4_matmul(m) if int4 and not nar else row_adaptive(m, one_copy, rows)
        for m in (qkv, proj.o_proj, gate_up, mlp.down_proj)
    ]
    exact = not nar and all(row_exact(m) for m in matmuls)
    attention = "kernel" if row_ops and rowkernel.attention_fits(layer.head_dim) else "padded"
    if int4 and attention != "kernel":
        # int4 attends one query per call: its one-row step is the cheapest, so a padded call's extra
        # work costs `ar` more than it saves `verified`; bfloat16's nearly free verifying rows (AMX)
        # verify many, where one padded call pays. Both chosen by a one-process A/B
        # (docs/results-log.md, "Figures that were in code comments").
        attention = "per-row"
    return DecodeSet(
        layer, nar, *matmuls, exact=exact, attention=attention, row_norm=row_ops, qkv_bias=qkv_bias
    )


def ar_head(model, int4: bool, one_copy: bool, streamed: bool, rows: str | None, row_ops: bool) -> nn.Module:
    """The head for AR rows (`prepare_for_decoding`): `model.lm_head` itself or its decode-path form."""
    # One copy of the head only where it is the input-major one, which the embedding table shares
    # (`input_major`); a packed copy would be a second (`streamed_weights`).
    head_once = one_copy and (streamed or probe.choice().float32_one_copy == "F.linear")
    if int4 and probe.choice().ok("rows-int4"):
        head = StreamedLinear(model.lm_head)  # the float32 logits of the int4 rows, screened below
    elif int4:
        head = bf16_packed(model.lm_head)
    elif head_once and streamed:  # not `row_adaptive`'s one copy, which may be a packed one (timed)
        head = model.lm_head
    else:
        head = row_adaptive(model.lm_head, head_once, rows)
    if isinstance(head, StreamedLinear) and row_ops:
        # Greedy steps choose at a quarter of the head's bytes, the same token (`screen.py`).
        source = getattr(model.lm_head, "ggml_source", None)  # a GGUF's Q8_0 table: codes from its blocks
        head = ScreenedHead(head, model.lm_head.weight, source[0] if source and source[1] == 8 else None)
    return head


def kernel_stacks(layers, sets: list) -> dict:
    """Per parameter set (False: AR, True: NAR), its layers' one-call weights as one stack
    (`rowstack.StackWeights` in a `LayerStack`, which `MoTModel._stacked` calls) where every layer holding
    the set is one row-kernel call (`DecodeSet.one_layer`) and they share their sizes and kind; no entry
    elsewhere. sets: each layer's decode sets (`DecodePaths.layers`).

    Why: with each layer one call, per-call overhead dominated what was left of a step (module calls,
    views, ctypes a layer; measured: docs/results-log.md)."""
    stacks = {}
    if any(s is None for s in sets):
        return stacks
    for nar in (False, True):
        held = [i for i, layer in enumerate(layers) if not nar or layer.has_nar]
        ones = [sets[i][nar].one_layer for i in held]
        if held and all(one is not None for one in ones):
            stack = rowstack.StackWeights.of([one.layers[0] for one in ones], first=len(layers) - len(held))
            if stack is not None:
                stacks[nar] = LayerStack(stack, nar)
    return stacks


def release_unpacked(layer) -> None:
    """Drop the AR set's (out, in) weights of a layer whose decode path holds them packed
    (`PackedLinear`): one copy in memory instead of two. The layer's uncached AR forward (scoring)
    then runs through its decode path; training it needs a model as loaded (a prepared one cannot be
    saved or trained anyway)."""
    _, proj, _, mlp = layer._sets(False)
    for module in (proj, mlp):
        for child in module.children():
            if isinstance(child, nn.Linear):
                child.weight = nn.Parameter(child.weight.new_empty(0), requires_grad=False)


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing).

    Preparing frees as much as it allocates (every float weight is replaced by its input-major copy),
    mostly in blocks below glibc's mmap threshold, which stay in the heap, counted as resident, until
    trimmed (measured on SmolLM2: docs/results-log.md).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, looked up once (`find_library` runs `ldconfig`, a subprocess, and preparing
    trims once per layer); None without glibc, whose allocator returns memory its own way."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
