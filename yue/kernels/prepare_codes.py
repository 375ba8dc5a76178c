"""Preparing a model whose AR set holds a GGUF's own codes (`model.ggml_modules`, the `file` precision)
for decoding: what `prepare.prepare_for_decoding` does for float weights, with nothing to convert.

Each layer's AR set becomes a `DecodeSet` over its file-code matmuls: Q/K/V and gate/up each one matmul
where the loader laid a format's rows side by side (`ggml_modules.fused`), row-exact (the kernels'
contract: a row's bits do not depend on the step's row count), attending on yue's row kernel where it
builds. The head is the file's (`GGMLLinear`); a NAR set, where the model has one, is prepared as in
float32 (`prepare.decode_set`).
"""

from __future__ import annotations

import torch
from torch import nn

from yue.kernels import prepare, probe, rowkernel
from yue.kernels.decode_set import DecodeSet, kernels_named
from yue.kernels.file_codes import GGMLEmbedding, GGMLLinear, fused
from yue.model.decode_paths import DecodePaths
from yue.model.prepared import PreparedModel


def ggml_unavailable() -> str:
    """Why the file precision's kernels do not run here ("" where they do): yue's row kernel must build."""
    try:
        rowkernel.library()
    except rowkernel.KernelUnavailable as e:
        return str(e)
    return ""


def holds_file_codes(model) -> bool:
    """Whether a model's AR set is in a GGUF's own codes (`gguf_load.install_file_codes`)."""
    return isinstance(model.lm_head, GGMLLinear) or isinstance(model.model.embed_tokens, GGMLEmbedding)


def file_codes_set(layer, row_ops: bool) -> DecodeSet:
    """A layer's AR set on its file-code matmuls (`DecodeSet`, exact rows)."""
    _, proj, _, mlp = layer._sets(False)
    biases = [proj.q_proj.bias, proj.k_proj.bias, proj.v_proj.bias]
    qkv_bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])  # (H + 2 Hkv) Dh
    qkv = fused([proj.q_proj, proj.k_proj, proj.v_proj])
    gate_up = fused([mlp.gate_proj, mlp.up_proj])
    attention = "kernel" if row_ops and rowkernel.attention_fits(layer.head_dim) else "per-row"
    return DecodeSet(
        layer, False, qkv, proj.o_proj, gate_up, mlp.down_proj, exact=True, attention=attention,
        row_norm=row_ops, qkv_bias=qkv_bias,
    )  # fmt: skip


def draft_head(model, row_ops: bool) -> nn.Module | None:
    """The head for slot rows: the file's head rows over `model.draft_vocab` (a copy of those rows, in the
    file's format), or None where the file's head itself serves (no drafting vocabulary)."""
    if model.draft_vocab is None:
        return None
    vocab = model.draft_vocab.long()
    head = model.lm_head
    rows = GGMLLinear(head.codes[vocab].contiguous(), head.ggml_type, head.in_features)
    return prepare.DraftVocabHead(rows, vocab, model.config.vocab_size, row_ops)


def prepare_for_decoding(
    model, drafting_dtype: torch.dtype | None = None, int4: bool = False, low_memory: bool = False
) -> PreparedModel:
    """A `PreparedModel` of `model` (consumed): `prepare_file_codes` for a model in a GGUF's own codes,
    else `prepare.prepare_for_decoding` (its arguments and errors)."""
    if not isinstance(model, PreparedModel) and holds_file_codes(model):
        if model.consumed:
            raise ValueError("the model is already prepared for decoding (prepare_for_decoding consumes it)")
        if int4:
            raise ValueError(
                "the int4 precision converts float32 weights; this model holds a GGUF's own codes"
            )
        model.consumed = True
        return prepare_file_codes(model, drafting_dtype)
    return prepare.prepare_for_decoding(model, drafting_dtype, int4, low_memory)


def prepare_file_codes(model, drafting_dtype: torch.dtype | None) -> PreparedModel:
    """`prepare.prepare_for_decoding` for a model in the file's codes (CPU only)."""
    if model.device.type != "cpu":
        raise ValueError("the file precision runs on the CPU; load in float32 or bfloat16 for a GPU")
    row_ops = probe.choice().ok("rows-f32")
    layers = []
    for layer in model.model.layers:
        sets = [file_codes_set(layer, row_ops)]
        if layer.has_nar:
            sets.append(prepare.decode_set(layer, True, drafting_dtype, False, False, None, row_ops))
        layers.append(tuple(sets))
    paths = DecodePaths(layers)
    # A step's run of layers as one row-kernel call where every layer is one (`DecodeSet.one_layer`).
    paths.stacks = prepare.kernel_stacks(model.model.layers, paths.layers)
    prepare.prepare_slots(model, paths, drafting_dtype, row_ops)
    paths.cache_dtype = torch.float32
    paths.draft_head = draft_head(model, row_ops)
    prepared = PreparedModel(model, paths)
    paths.layout = "file codes," + kernels_named(prepared)
    return prepared
