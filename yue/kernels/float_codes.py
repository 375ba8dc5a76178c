"""The float32 and int4 precisions of a GGUF's AR set, built from the file's blocks (yue-smol's default
load): the row kernel's records straight from the file's codes, with no float32 copy of the layers.

Design decisions:
- The loader (`install_float_codes`, handed to `yue.model.hf.assemble` by `yue.load`) installs the layers'
  matrices as the file's codes, as the `file` precision does (`file_codes.install_layer_codes`: Q and K
  rows a Llama's converter permuted are put back as they are read). The token table, and a head of the
  file's own, are dequantized to float32 (`dequantized`: yue's C dequantizer, gguf.quants' values): the
  embedding reads it, and so do the head's integer screen and its drafting rows, as before.
- Preparing (`prepare.decode_set` calls `decode_set` here) makes each of a layer's matmuls (Q/K/V and
  gate/up fused) the row kernel's records built from the blocks where the format allows
  (`rowkernel.block_records`: a Q4_1 matrix's 4-bit records for float32; the int4 precision's records
  from the same codes), byte for byte what dequantizing to float32 and packing gave (a test compares).
  Any other matmul is dequantized and prepared as before, on the same values.
- Where the plan's float32 kernel is not the row kernel's, or the int4 precision's row kernel does not
  run here, or the model decodes as trained, every matrix is dequantized first (`materialize`) and
  preparing runs as for any float32 model: the same values, so the same outputs, everywhere.
"""

from __future__ import annotations

import torch
from torch import nn

from yue.kernels import ggml, probe, rowkernel
from yue.kernels.decode_set import DecodeSet
from yue.kernels.file_codes import GGMLLinear, install_layer_codes
from yue.kernels.matmuls import (
    RowInt4Linear,
    StreamedLinear,
    decode_storage,
    int4_matmul,
    row_adaptive,
    row_exact,
)
from yue.model import gguf_load
from yue.model.gguf_file import GGUFFile

Q4_1 = 3  # the ggml type whose records `rowkernel.block_records` builds for the layers
PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def install_float_codes(model: nn.Module, g: GGUFFile, config, state: dict[str, torch.Tensor]) -> None:
    """Give a meta-device yue model its AR layers in the file's codes and its token table (and head) as
    float32 values in `state`; the head module keeps where its values came from (`ggml_source`: the
    file's rows and ggml type), so its records are built from the blocks too (`matmuls.StreamedLinear`).
    The memory check is the float32 precision's, as the dequantizing load's was."""
    gguf_load.check_memory(g, config, "float32", model.config.max_position_embeddings)
    install_layer_codes(model, g, config, state)
    state["model.embed_tokens.weight"] = table = dequantized(g, "token_embd.weight")
    head = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    state["lm_head.weight"] = table if head == "token_embd.weight" else dequantized(g, head)
    info = g.tensors[head]
    model.lm_head.ggml_source = (g.mapped(head).view(info.shape[0], -1), info.ggml_type)


def tie_head(model: nn.Module) -> None:
    """After loading: a tied head is the embedding's own parameter again (as the dequantizing load ties it),
    not a second parameter over the same values."""
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight


def dequantized(g: GGUFFile, name: str) -> torch.Tensor:
    """Tensor `name` (a matrix) as float32 (rows, in): `gguf.quants.dequantize`'s values, by yue's C
    dequantizer where it takes the format (`ggml.get_rows`), else by gguf.quants."""
    info = g.tensors[name]
    if not ggml.supported(info.ggml_type):
        return torch.from_numpy(g.dequantized(name))
    return ggml.get_rows(
        g.mapped(name).view(info.shape[0], -1), info.ggml_type, info.shape[1], torch.arange(info.shape[0])
    )


def values(m: GGMLLinear) -> torch.Tensor:
    """A file-code matmul's weight as float32 (out, in), its file's values."""
    if not ggml.supported(m.ggml_type):
        from gguf import GGMLQuantizationType, quants

        flat = quants.dequantize(m.codes.numpy(), GGMLQuantizationType(m.ggml_type))
        return torch.from_numpy(flat.reshape(m.out_features, m.in_features).copy())
    return ggml.get_rows(m.codes, m.ggml_type, m.in_features, torch.arange(m.out_features))


def holds_layer_codes(model) -> bool:
    """Whether a model's AR layers hold a GGUF's codes for a float precision (`install_float_codes`)."""
    return any(isinstance(m, GGMLLinear) for m in model.model.layers[0].modules())


def direct(int4: bool, rows: str | None) -> bool:
    """Whether preparing builds the layers' kernels from the file's codes (`decode_set`): the int4
    precision where its row kernel runs, float32 where the plan's kernel is the row kernel's one copy
    (`rows` "row-stream", `prepare.KernelPlan`)."""
    return probe.choice().ok("rows-int4") if int4 else rows == "row-stream"


def materialize(model) -> None:
    """Every AR layer's file-code matmul as an nn.Linear of its float32 values (contiguous, its bias kept):
    the model the dequantizing load gave."""
    for layer in model.model.layers:
        _, proj, _, mlp = layer._sets(False)
        for owner in (proj, mlp):
            for name, child in list(owner.named_children()):
                if isinstance(child, GGMLLinear):
                    linear = nn.Linear(child.in_features, child.out_features, bias=False, device="meta")
                    linear.weight = nn.Parameter(values(child), requires_grad=False)
                    linear.bias = child.bias
                    setattr(owner, name, linear)


def matmul(parts: list[GGMLLinear], int4: bool, rows: str | None) -> nn.Module:
    """`parts` side by side (outputs concatenated) as the decode kernel `prepare.decode_set` gives their
    dequantized values, its records built from the blocks where they are Q4_1."""
    out, inp = sum(p.out_features for p in parts), parts[0].in_features
    if all(p.ggml_type == Q4_1 for p in parts) and (int4 or probe.choice().ok("rows-q4")):
        codes = parts[0].codes if len(parts) == 1 else torch.cat([p.codes for p in parts])
        records = rowkernel.block_records(codes, Q4_1, inp)
        if records is not None and int4 and inp % 32 == 0:
            return RowInt4Linear.of_records(
                rowkernel.q4dot_records(*rowkernel.q4_unpacked(records, out)), out
            )
        if records is not None and not int4:
            return StreamedLinear.of_records(records, out)
    linear = nn.Linear(inp, out, bias=False, device="meta")
    linear.weight = nn.Parameter(decode_storage(torch.cat([values(p) for p in parts])), requires_grad=False)
    return int4_matmul(linear) if int4 else row_adaptive(linear, False, rows)


def decode_set(layer, int4: bool, rows: str | None, row_ops: bool) -> DecodeSet:
    """A layer's AR set, in a GGUF's codes, for the decode path (`prepare.decode_set`'s, for `direct`
    plans): Q/K/V and gate/up fused, each matmul `matmul`'s; the codes released after."""
    _, proj, _, mlp = layer._sets(False)
    biases = [proj.q_proj.bias, proj.k_proj.bias, proj.v_proj.bias]
    qkv_bias = None if biases[0] is None else torch.cat(biases).detach()  # (H + 2 Hkv) Dh
    groups = [
        [proj.q_proj, proj.k_proj, proj.v_proj],
        [proj.o_proj],
        [mlp.gate_proj, mlp.up_proj],
        [mlp.down_proj],
    ]
    matmuls = [matmul(parts, int4, rows) for parts in groups]
    attention = "kernel" if row_ops and rowkernel.attention_fits(layer.head_dim) else "padded"
    if int4 and attention != "kernel":
        attention = "per-row"  # as `prepare.decode_set`'s int4 (its reason there)
    exact = all(row_exact(m) for m in matmuls)
    for p in [p for parts in groups for p in parts] if exact else []:  # the decode path holds its own
        p.codes = p.codes.new_empty(0, p.codes.shape[1])  # records: the file's rows are not kept
    return DecodeSet(
        layer, False, *matmuls, exact=exact, attention=attention, row_norm=row_ops, qkv_bias=qkv_bias
    )


def forget_sources(model) -> None:
    """Drop the head's `ggml_source` once prepared (it holds the file's mapping open)."""
    if hasattr(model.lm_head, "ggml_source"):
        del model.lm_head.ggml_source
