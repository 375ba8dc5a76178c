"""A GGUF's AR set in the file's own codes (the `file` precision), and the modules that hold them: a matmul (`GGMLLinear`), several side by side
(`GGMLParts`) and an embedding table (`GGMLEmbedding`), in the ggml block format the file stores, run by
yue's kernels for that format (`yue.kernels.ggml`, which knows the formats; these modules know none).

Design decisions:
- `codes` is a uint8 tensor (out, row bytes): the file's rows as stored, either a view of the file's
  mapping (read in place) or memory the loader filled (rows a Llama's converter permuted, put back; parts
  read side by side so that Q/K/V or gate/up are one matmul). No float copy of a quantized weight exists.
- The loader (`install_file_codes`, handed to `yue.model.hf.assemble` by `yue.load`) reads a matrix in
  place from the file's mapping (O and down, the token table and a tied head), or into one buffer per
  run of Q/K/V or gate/up parts in one format, side by side. A Llama's Q and K rows, which llama.cpp's
  converter permuted for its interleaved RoPE, are put back in Hugging Face's rotate-half order as they
  are read (`gguf_names.unpermute_index`).
- Inference only: the codes are not parameters (no gradient, nothing to save), so a model holding them
  decodes but does not train; the training commands load float32 (`yue.load(dtype="float32")`).
- Each output row's bits depend on its input row only (the kernels' contract), so a verifying step's
  rows get the bits a one-row step would: `verified` == `ar` in the file's precision.
"""

from __future__ import annotations

import torch
from torch import nn

from yue.kernels import ggml
from yue.model import gguf_names as names
from yue.model.gguf_file import GGUFFile


class GGMLLinear(nn.Module):
    """y = x W^T for W held as ggml blocks of `ggml_type`: `codes` (out, row bytes) uint8."""

    def __init__(self, codes: torch.Tensor, ggml_type: int, in_features: int) -> None:
        super().__init__()
        assert codes.dtype == torch.uint8 and codes.dim() == 2, (codes.dtype, codes.shape)
        self.codes, self.ggml_type = kernel_codes(codes, ggml_type, in_features), ggml_type
        self.in_features, self.out_features = in_features, codes.shape[0]
        self.bias: nn.Parameter | None = None  # Qwen2's Q/K/V biases (float32, out), set by the loader

    @property
    def blocked(self) -> tuple[torch.Tensor]:
        """The codes as `rows_layer` takes a matmul's weight (`decode_set.DecodeSet`'s one call)."""
        return (self.codes,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) float -> (..., out) float32."""
        y = ggml.matmul(x.float(), self.codes, self.ggml_type, self.out_features)
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        return self.codes.numel()

    def extra_repr(self) -> str:
        name = ggml.FORMATS[self.ggml_type].name if self.ggml_type in ggml.FORMATS else self.ggml_type
        return f"in_features={self.in_features}, out_features={self.out_features}, format={name}"


class GGMLParts(nn.Module):
    """Matmuls of one input side by side, outputs concatenated (Q/K/V or gate/up whose blocks differ in
    format, as a Q4_K_M file's Q6_K V beside Q4_K Q and K)."""

    def __init__(self, parts: list[GGMLLinear]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)

    def split_blocked(self, *widths: int) -> list[torch.Tensor] | None:
        """The codes of consecutive output ranges `widths` (Q's, K's, V's rows), each within one part, as
        `rows_layer` takes three matmuls; None where a range straddles two parts."""
        bounds = [0]
        for p in self.parts:
            bounds.append(bounds[-1] + p.out_features)
        out, start = [], 0
        for width in widths:
            i = next(i for i in range(len(self.parts)) if bounds[i] <= start < bounds[i + 1])
            if start + width > bounds[i + 1]:
                return None
            part, a = self.parts[i], start - bounds[i]
            out.append(kernel_codes(part.codes[a : a + width], part.ggml_type, part.in_features))
            start += width
        return out


def kernel_codes(codes: torch.Tensor, ggml_type: int, in_features: int) -> torch.Tensor:
    """`codes` tagged with their format and input width (`ggml_type`, `ggml_in`), as yue's row kernel
    recognises a GGUF matrix (`rowkernel.layout`, `rowkernel.inputs`)."""
    codes.ggml_type, codes.ggml_in = ggml_type, in_features
    return codes


def _follows(a: GGMLLinear, b: GGMLLinear) -> bool:
    """Whether b's rows continue a's in one buffer, in a's format (so a and b are one matmul)."""
    same = a.ggml_type == b.ggml_type and a.codes.shape[1] == b.codes.shape[1]
    return same and b.codes.data_ptr() == a.codes.data_ptr() + a.codes.numel()


def fused(parts: list[GGMLLinear]) -> GGMLLinear | GGMLParts:
    """`parts` (bias-free matmuls of one input) as one matmul: each run of parts that the loader laid
    side by side in one buffer, in one format, becomes one `GGMLLinear` over the run's rows (a view, no
    copy); more than one run become `GGMLParts` (a Q4_K_M file's Q4_K Q and K, then its Q6_K V)."""
    runs = [[parts[0]]]
    for p in parts[1:]:
        if _follows(runs[-1][-1], p):
            runs[-1].append(p)
        else:
            runs.append([p])
    whole = []
    for run in runs:
        first, n = run[0], sum(p.out_features for p in run)
        codes = torch.as_strided(first.codes, (n, first.codes.shape[1]), first.codes.stride())
        whole.append(GGMLLinear(codes, first.ggml_type, first.in_features))
    return whole[0] if len(whole) == 1 else GGMLParts(whole)


class GGMLEmbedding(nn.Module):
    """A token table held as ggml blocks: rows dequantized when looked up (`ggml.get_rows`)."""

    def __init__(self, codes: torch.Tensor, ggml_type: int, embedding_dim: int) -> None:
        super().__init__()
        self.codes, self.ggml_type = codes, ggml_type
        self.num_embeddings, self.embedding_dim = codes.shape[0], embedding_dim

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (...) int -> (..., D) float32."""
        flat = tokens.reshape(-1).to(torch.long).cpu()
        rows = ggml.get_rows(self.codes, self.ggml_type, self.embedding_dim, flat)
        return rows.view(*tokens.shape, self.embedding_dim).to(tokens.device)


def _rows(g: GGUFFile, name: str) -> int:
    return g.tensors[name].nbytes // g.tensors[name].shape[0]


def _read_side_by_side(g: GGUFFile, parts: list[str], permute: dict[str, int]) -> list[GGMLLinear]:
    """Tensors `parts` (one format, one input width) read into one buffer, rows side by side, each a
    `GGMLLinear` over its slice; a part in `permute` (its head count) has its rows put back in order."""
    infos = [g.tensors[p] for p in parts]
    rows = _rows(g, parts[0])
    buffer = torch.empty(sum(i.shape[0] for i in infos), rows, dtype=torch.uint8)  # one storage: views fuse
    out, start = [], 0
    for part, info in zip(parts, infos, strict=True):
        view = buffer[start : start + info.shape[0]]
        if part in permute:  # one copy: read, then gathered into place
            order = torch.from_numpy(names.unpermute_index(info.shape[0], permute[part]))
            torch.index_select(
                torch.from_numpy(g.read(part).reshape(info.shape[0], rows)), 0, order, out=view
            )
        else:
            g.read(part, view.numpy().reshape(-1))
        out.append(GGMLLinear(view, info.ggml_type, info.shape[1]))
        start += info.shape[0]
    return out


def _in_place(g: GGUFFile, name: str) -> GGMLLinear:
    """One matrix as a `GGMLLinear` read in place from the file's mapping."""
    info = g.tensors[name]
    codes = g.mapped(name).view(info.shape[0], -1)
    return GGMLLinear(codes, info.ggml_type, info.shape[1])


def _groups(g: GGUFFile, blk: str, parts: list[str]) -> list[list[str]]:
    """`parts` of a layer grouped where neighbours share a format (each group read side by side)."""
    groups: list[list[str]] = []
    for part in parts:
        name = f"{blk}.{part}.weight"
        if groups and g.tensors[groups[-1][-1]].ggml_type == g.tensors[name].ggml_type:
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups


def file_codes_layer(g: GGUFFile, config, i: int) -> dict[str, GGMLLinear]:
    """Layer i's seven matrices as `GGMLLinear`s by their module names (`self_attn.q_proj`, ...)."""
    blk, arch = f"blk.{i}", config.model_type
    permute = {}
    if arch == "llama":  # only llama.cpp's Llama converter permutes Q and K
        permute = {
            f"{blk}.attn_q.weight": config.num_attention_heads,
            f"{blk}.attn_k.weight": config.num_key_value_heads,
        }
    modules = {}
    # Q and K rows to put back in order are read, side by side where they share a format; every other
    # matrix stays in the file's mapping (neighbours in the file, in one format, still fuse: `fused`).
    for group in _groups(g, blk, [p for p in ("attn_q", "attn_k") if f"{blk}.{p}.weight" in permute]):
        modules |= dict(zip(group, _read_side_by_side(g, group, permute), strict=True))
    for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        if f"{blk}.{part}.weight" not in modules:
            modules[f"{blk}.{part}.weight"] = _in_place(g, f"{blk}.{part}.weight")
    return {
        names.hf_name(n, arch).removeprefix(f"model.layers.{i}.").removesuffix(".weight"): m
        for n, m in modules.items()
    }


def install_file_codes(model: nn.Module, g: GGUFFile, config, state: dict[str, torch.Tensor]) -> None:
    """Give a meta-device yue model its AR set's matrices, token table and head in the file's codes; the
    matrices' biases (Qwen2's Q/K/V) are given to their modules from `state`."""
    install_layer_codes(model, g, config, state)
    table = g.tensors["token_embd.weight"]
    codes = g.mapped("token_embd.weight").view(table.shape[0], -1)
    model.model.embed_tokens = GGMLEmbedding(codes, table.ggml_type, table.shape[1])
    head = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    model.lm_head = _in_place(g, head)


def install_layer_codes(model: nn.Module, g: GGUFFile, config, state: dict[str, torch.Tensor]) -> None:
    """Give a meta-device yue model's AR layers their matrices in the file's codes (`file_codes_layer`),
    the matrices' biases (Qwen2's Q/K/V) from `state`."""
    from tqdm.auto import tqdm

    layers = model.model.layers
    bar = tqdm(range(len(layers)), desc=f"reading {g.path.name}", unit="layer", leave=False, disable=None)
    for i in bar:
        for path, module in file_codes_layer(g, config, i).items():
            bias = state.get(f"model.layers.{i}.{path}.bias")  # kept in `state`: the model's loader
            if bias is not None:  # checks every parameter has a value, then assigns this same tensor
                module.bias = nn.Parameter(bias, requires_grad=False)
            parent, _, attr = path.rpartition(".")
            setattr(layers[i].get_submodule(parent), attr, module)
