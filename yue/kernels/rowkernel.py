"""yue's row kernels (`rowkernel.c`), compiled for this CPU on first use and cached: a float32 matmul over
a few rows that streams the weight once, the kernel of a float32 model's 1-9-row steps, a one-row AR
step and a verifying step's k + 1 alike (`matmuls.StreamedLinear`), so each row gets the same bits
whatever the step's row count and float32 `verified` == `ar` by construction; and, row-exact the same
way, RMSNorm, the exact layers' attention (`decode_set.ExactAttention`), a whole float32
decode layer in one call and a step's run of such layers in one call (`rowstack.stack`); and the
matmuls on a GGUF's blocks as the file stores them (`ggml.py`, `ggml/*.c`, #included by the C file).

Why each of these exists (the layer and the stack in one call, 4-bit and 8-bit codes, the NAR set's int8
layers, the int4 precision, a kernel of our own): docs/design.md §10; the figures, with their machines,
in docs/results-log.md ("Figures that were in code comments").

Design decisions:
- Built with the C compiler torch's own extensions would use (`$CC`, else `cc`), `-O3 -march=native`
  (and 512-bit vectors on x86-64, which GCC otherwise avoids), OpenMP where the compiler has it: one
  small C file, quick to build, no torch headers. The shared object is cached under
  `$YUE_CACHE_DIR/kernels`, keyed by the source, the compiler's version, the flags and this CPU's
  feature flags, so a machine with another CPU builds its own; a cached file that does not load is
  rebuilt, not trusted.
- Every failure (no compiler, a flag the compiler refuses, a library that does not load) is a reason
  string for `kernels`, whose probe then turns the kernel off and keeps oneDNN or `F.linear`; nothing
  here raises on a CPU or compiler we have not met. `YUE_KERNELS=no-rows-f32` forces the fallback.
- Called through ctypes (a few microseconds a call; 32 calls a float32 step with each layer one call),
  which releases the GIL.
- C with GCC/Clang vector extensions (one native vector of floats, `LANES`), not intrinsics, so one
  source serves AVX512, AVX2, SSE and NEON; a row's bits depend on the build (its vector width), never
  on the call. The tests force the plain build (8-float vectors) beside the native one.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from yue.registry import cache_root

SOURCE = Path(__file__).with_name("rowkernel.c")
# The GGUF block formats' sources (`ggml.py`), #included by SOURCE: part of the build's key.
GGML_SOURCES = Path(__file__).with_name("ggml")
# Rows per pass (`MAX_R` in the source). A second pass costs more than torch's batched GEMM over the
# column blocks (`blocked_gemm`; measured on SmolLM2: docs/results-log.md).
MAX_ROWS = 9
# Flag sets tried in order until one builds: the fast one, then without OpenMP, then plain.
_NATIVE = ["-march=native"] + (
    ["-mprefer-vector-width=512"] if platform.machine() in ("x86_64", "AMD64") else []
)
FLAG_SETS = ([*_NATIVE, "-fopenmp"], _NATIVE, [])
BASE_FLAGS = ["-O3", "-shared", "-fPIC"]


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here; the message says why (for `probe.describe()`)."""


def _compiler() -> str:
    cc = os.environ.get("CC", "cc").split()[0]
    path = shutil.which(cc)
    if path is None:
        raise KernelUnavailable(f"no C compiler ({cc!r} not on PATH; set CC)")
    return path


def _cpu_flags() -> str:
    """This CPU's feature flags (Linux), else the platform's description: part of the build's key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _sources() -> str:
    """The text the library is built from: SOURCE and the files it includes, in a fixed order."""
    included = sorted(GGML_SOURCES.glob("*.[ch]"))
    return "\n".join(f"{p.name}\n{p.read_text()}" for p in [SOURCE, *included])


def _build(cc: str, flags: list[str], target: Path) -> str:
    """Compile the source into `target` (atomically); "" on success, else why not (the compiler's first
    complaint, or a cache folder that cannot be written)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
    except OSError as e:
        return f"cannot write the kernel cache: {e}"
    try:
        run = subprocess.run(
            [cc, *BASE_FLAGS, *flags, str(SOURCE), "-o", tmp, "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if run.returncode != 0:
            return (run.stderr.strip().splitlines() or ["failed"])[0][:160]
        os.replace(tmp, target)
        return ""
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cc}: {e}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.rows_matmul.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
    lib.rows_matmul.argtypes += [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    lib.rows_matmul.restype = None
    matmuls = (lib.rows_matmul_i8dot, lib.rows_matmul_q4, lib.rows_matmul_q8, lib.rows_matmul_q6)
    matmuls += (lib.rows_matmul_q4dot, lib.rows_matmul_q4dot16)
    for codes in matmuls:
        codes.argtypes, codes.restype = lib.rows_matmul.argtypes, None
    lib.rows_block.restype = lib.rows_lanes.restype = lib.rows_code_group.restype = ctypes.c_int
    lib.rows_dot_block.restype = ctypes.c_int
    lib.rows_q4_bytes.restype = lib.rows_q8_bytes.restype = ctypes.c_int
    lib.rows_q4dot_bytes.restype = lib.rows_q4dot16_bytes.restype = ctypes.c_int
    lib.rows_screen_bytes.restype = lib.rows_q6_bytes.restype = lib.rows_q6_group.restype = ctypes.c_int
    for pack in (lib.rows_q4_pack, lib.rows_q8_pack, lib.rows_q6_pack):
        pack.argtypes = [ctypes.c_void_p, *[ctypes.c_long] * 4, ctypes.c_void_p, ctypes.c_int]
        pack.restype = ctypes.c_int
    c_long, ptr = ctypes.c_long, ctypes.c_void_p
    for pack in (lib.rows_q4_pack_q4_1, lib.rows_q8_pack_q8_0):
        pack.argtypes, pack.restype = [ptr, c_long, c_long, ptr, ctypes.c_int], ctypes.c_int
    lib.rows_rms_norm.argtypes = [ptr, c_long, c_long, ptr, ctypes.c_float, ptr]
    lib.rows_rms_norm.restype = None
    lib.rows_spread.argtypes = [ptr, c_long, c_long, ptr, c_long, ctypes.c_float, ptr]
    lib.rows_spread.restype = None
    lib.rows_softmax_stats.argtypes = [ptr, c_long, c_long, ptr, ptr]
    lib.rows_softmax_stats.restype = None
    lib.rows_screen.argtypes = [ptr, c_long, c_long, *[ptr] * 4, c_long, c_long, ptr, c_long, ptr]
    lib.rows_screen.argtypes += [ctypes.c_int]
    lib.rows_screen.restype = ctypes.c_int
    lib.rows_attention.argtypes = [ptr, c_long, c_long, c_long, ptr, ptr, c_long, c_long, ptr, c_long]
    lib.rows_attention.argtypes += [c_long, ptr, *[ctypes.c_int] * 5, c_long, ctypes.c_float, ctypes.c_int]
    lib.rows_attention.restype = None
    lib.rows_stack.argtypes = [ptr, ctypes.c_int, ctypes.c_int, c_long, ctypes.c_int, ptr, ctypes.c_float]
    lib.rows_stack.argtypes += [c_long, ctypes.c_int, ptr, ptr, ptr, c_long, c_long, c_long]
    lib.rows_stack.argtypes += [*[ctypes.c_int] * 3, c_long, ctypes.c_float, ctypes.c_int]
    lib.rows_stack.restype = None
    lib.rows_layer_ptrs.restype = ctypes.c_int
    lib.ggml_matmul.argtypes = [ctypes.c_int, ptr, c_long, c_long, ptr, ptr, c_long, ctypes.c_int]
    lib.ggml_matmul.restype = None
    lib.ggml_get_rows.argtypes = [ctypes.c_int, ptr, c_long, ptr, c_long, ptr]
    lib.ggml_get_rows.restype = None
    lib.ggml_supported.argtypes = [ctypes.c_int]
    lib.ggml_supported.restype = lib.rows_layer_ggml_base.restype = ctypes.c_int
    return lib


@functools.cache
def library() -> ctypes.CDLL:
    """The compiled kernel, built on first use (cached per process and on disk).

    Raises:
        KernelUnavailable: no compiler, no flag set that builds, or a library that does not load.
    """
    cc = _compiler()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"{cc} --version failed: {e}") from e
    complaints = []
    for flags in FLAG_SETS:
        key = hashlib.sha256(
            "\n".join([_sources(), version, " ".join(flags), platform.machine(), _cpu_flags()]).encode()
        ).hexdigest()[:20]
        path = cache_root() / "kernels" / f"rowkernel-{key}.so"
        for attempt in range(2):  # a cached file that does not load is rebuilt once
            if attempt or not path.exists():
                why = _build(cc, flags, path)
                if why:
                    complaints.append(f"{' '.join(flags) or 'plain'}: {why}")
                    break
            try:
                return _load(path)
            except OSError as e:
                complaints.append(f"loading {path.name}: {e}")
                path.unlink(missing_ok=True)
    raise KernelUnavailable("; ".join(complaints) or "no build")


def block(w: torch.Tensor) -> torch.Tensor:
    """An (out, in) float32 weight in the kernel's layout: (ceil(out / BLK), in, BLK), zero-padded."""
    blk = library().rows_block()
    out, inp = w.shape
    padded = torch.zeros(-(-out // blk) * blk, inp, dtype=w.dtype)
    padded[:out] = w
    return padded.view(-1, blk, inp).transpose(1, 2).contiguous()


def dot_block(codes: torch.Tensor) -> torch.Tensor:
    """(out, in) int8 codes (-127..127, in a multiple of 4) in `rows_matmul_i8dot`'s layout: (ceil(out /
    DOT_BLK), in / 4, DOT_BLK, 4), zero-padded; each output's 4 codes of a quad of inputs side by side."""
    blk = library().rows_dot_block()
    out, inp = codes.shape
    assert codes.dtype == torch.int8 and inp % 4 == 0, (codes.dtype, inp)
    padded = torch.zeros(-(-out // blk) * blk, inp, dtype=torch.int8)
    padded[:out] = codes
    return padded.view(-1, blk, inp // 4, 4).transpose(1, 2).contiguous()


def q4_block(w: torch.Tensor) -> torch.Tensor | None:
    """An (out, in) float32 weight (any strides) in `rows_matmul_q4`'s layout (uint8, (ceil(out / BLK),
    in / 32, 768) bytes), or None where 4-bit codes cannot give back its every value exactly
    (`rows_q4_pack`).

    A weight qualifies where each group of 32 inputs of an output is code * d + m (one float32
    rounding), codes 0..15, in one of three forms: codes spanning the group (0 at its minimum, 15 at its
    maximum), d a float16 value: a GGUF's Q4_1 weights dequantized to float32 (`gguf.py`, as llama.cpp's
    reference dequantizer computes them); (code - 8) * d with the group's value of largest magnitude at
    code 0 (m = -8 d): a GGUF's Q4_0 weights; or d and m of up to 17 significant bits and codes that
    need not reach either end: a GGUF's Q4_K weights (`q4k_group` in the C file finds them; the README
    gives the cost). Every value is checked, so a weight that is not such (a trained one, another
    quantization) is refused, never approximated; most are refused at their first group.
    """
    lib = library()
    return _codes(w, lib.rows_q4_pack, lib.rows_q4_bytes(), lib.rows_code_group())


def q8_block(w: torch.Tensor) -> torch.Tensor | None:
    """An (out, in) float32 weight (any strides) in `rows_matmul_q8`'s layout (uint8, (ceil(out / BLK),
    in / 32, 1152) bytes), or None where 8-bit codes cannot give back its every value exactly
    (`rows_q8_pack`): a GGUF's Q8_0 weights dequantized (code * d per group of 32 inputs, codes
    -127..127, d a float16 value; SmolLM2's tied head). Checked and refused as `q4_block`'s."""
    lib = library()
    return _codes(w, lib.rows_q8_pack, lib.rows_q8_bytes(), lib.rows_code_group())


def q6_block(w: torch.Tensor) -> torch.Tensor | None:
    """An (out, in) float32 weight (any strides) in `rows_matmul_q6`'s layout (uint8, (ceil(out / BLK),
    in / 16, 640) bytes), or None where 8-bit codes with a float32 scale per 16 inputs cannot give back
    its every value exactly (`rows_q6_pack`): a GGUF's Q6_K weights dequantized ((d * sc) * q, d * sc
    exact in float32). Checked and refused as `q4_block`'s."""
    lib = library()
    return _codes(w, lib.rows_q6_pack, lib.rows_q6_bytes(), lib.rows_q6_group())


# The C packers that build a layout's records straight from a GGUF's blocks, by ggml type (Q4_1: `q4_block`'s,
# Q8_0: `q8_block`'s).
BLOCK_PACKERS = {3: ("rows_q4_pack_q4_1", "rows_q4_bytes"), 8: ("rows_q8_pack_q8_0", "rows_q8_bytes")}


def block_records(rows: torch.Tensor, ggml_type: int, in_features: int) -> torch.Tensor | None:
    """A GGUF matrix's rows as the file stores them (uint8 (out, row bytes), `ggml_type` 3 (Q4_1) or 8
    (Q8_0)) in `q4_block`'s or `q8_block`'s layout: byte for byte what those give for the matrix's
    dequantized values, built from the blocks with no float32 copy (`rows_q4_pack_q4_1`,
    `rows_q8_pack_q8_0`). None where that layout refuses the values (as `q4_block` would)."""
    lib = library()
    pack, record = BLOCK_PACKERS[ggml_type]
    rows = rows.contiguous()
    out = rows.shape[0]
    group = lib.rows_code_group()
    assert rows.dtype == torch.uint8 and in_features % group == 0, (rows.dtype, in_features)
    packed = torch.zeros(-(-out // lib.rows_block()), in_features // group, getattr(lib, record)(), dtype=torch.uint8)
    refused = getattr(lib, pack)(rows.data_ptr(), out, in_features, packed.data_ptr(), torch.get_num_threads())
    return None if refused else packed


def file_codes(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The 4-bit codes (out, in / 32, 32) float, scales d and minimums m (out, in / 32, 1) that give an
    (out, in) float32 weight's every value back as code * d + m: a GGUF's Q4_1, Q4_0 or Q4_K weights, in
    the forms `q4_block` finds, unpacked from its record. None where it finds none."""
    packed = q4_block(w)
    return None if packed is None else q4_unpacked(packed, w.shape[0])


def q4_unpacked(packed: torch.Tensor, out: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`q4_block`'s records of an (out, in) weight back as its codes (out, in / 32, 32) float, d and m
    (out, in / 32, 1)."""
    lib = library()
    blk, lanes = lib.rows_block(), lib.rows_lanes()
    B, G, _ = packed.shape
    scales = packed[..., : 2 * blk * 4].contiguous().view(torch.float32).view(B, G, 2, blk)
    d, m = (scales[:, :, k].permute(0, 2, 1).reshape(B * blk, G, 1)[:out] for k in (0, 1))
    # Output j's code of an input: in byte (j // 2 lanes) lanes + j % lanes of the input's blk / 2,
    # the high nibble for the second vector of a pair (`rows_q4_pack`).
    j = torch.arange(blk)
    byte, shift = (j // (2 * lanes)) * lanes + j % lanes, (j % (2 * lanes)) // lanes * 4
    nibbles = packed[..., 2 * blk * 4 :].view(B, G, Q4_INPUTS, blk // 2)[..., byte] >> shift & 15
    codes = nibbles.permute(0, 3, 1, 2).reshape(B * blk, G, Q4_INPUTS)[:out].float()
    return codes, d, m


Q4_INPUTS = 32  # inputs per group of 4-bit codes (the GGUF's blocks; `rows_code_group`)


def q4_groups(w: torch.Tensor, float16_scale: bool = False) -> tuple[torch.Tensor, ...]:
    """(out, in) float weight (in a multiple of 32) -> 4-bit codes per group of 32 inputs, asymmetric
    round-to-nearest: codes (out, in / 32, 32) float in 0..15, scale d and minimum m (out, in / 32, 1),
    each value ~ code * d + m, m the group's minimum and d (max - m) / 15. With `float16_scale`, a
    weight whose every value 4-bit codes give back (a GGUF's Q4_1, Q4_0 or Q4_K weights dequantized:
    `file_codes`) gets the file's own codes, d and m."""
    if float16_scale and w.dtype == torch.float32 and w.device.type == "cpu":
        found = file_codes(w)
        if found is not None:
            return found
    out, inp = w.shape
    groups = w.detach().float().reshape(out, inp // 32, 32)
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    d = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    return ((groups - lo) / d).round().clamp(0, 15), d, lo


def q4dot_block(w: torch.Tensor) -> torch.Tensor:
    """An (out, in) float32 weight (in a multiple of 32) as the int4 precision's 4-bit codes in
    `rows_matmul_q4dot`'s layout: uint8 (ceil(out / DOT_BLK), in / 32, record), per column block and
    group of 32 inputs a record of d (DOT_BLK scales), m (DOT_BLK scales) and the codes' nibbles (chunk
    c's byte 4 j + k: output j's code of input 8 c + k low, of 8 c + 4 + k high), zero-padded. The
    scales are float16 (160-byte records, "q4dot16": a Q4_1 or Q4_0 file's d and m are) where every d
    and m is a float16 value, else float32 (192 bytes, "q4dot"): the same values, so the same bits; a
    one-row step streams the records, and the smaller ones are the file's own size.

    Each group of an output is code * d + m, codes 0..15 (asymmetric round-to-nearest: m the group's
    minimum, d (max - m) / 15). A GGUF's Q4_1, Q4_0 or Q4_K weights dequantized give back the file's
    codes, d and m exactly (`file_codes`), so the int4 precision's weights are the file's; any other
    float weight is quantized (the precision's loss, with the activations' rounding)."""
    out, inp = w.shape
    assert w.dtype == torch.float32 and inp % 32 == 0, (w.dtype, inp)
    return q4dot_records(*q4_groups(w, float16_scale=True))


def q4dot_records(codes: torch.Tensor, d: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """`q4dot_block`'s records of a weight given as its 4-bit codes (out, in / 32, 32), d and m (out, in /
    32, 1) float32 (`q4_groups`' or `q4_unpacked`'s)."""
    lib = library()
    out, G, _ = codes.shape
    blk = lib.rows_dot_block()
    B = -(-out // blk)
    pad = B * blk - out
    codes = F.pad(codes.to(torch.uint8), (0, 0, 0, 0, 0, pad)).view(B, blk, G, 4, 2, 4)
    nibbles = codes.permute(0, 2, 3, 4, 1, 5)  # (B, G, chunk, low/high, output, k)
    packed = (nibbles[:, :, :, 0] | nibbles[:, :, :, 1] << 4).reshape(B, G, 32 * 4)
    dm = torch.stack([F.pad(t[..., 0], (0, 0, 0, pad)).view(B, blk, G) for t in (d, lo)], 1)  # (B, 2, blk, G)
    half = dm.half()
    if torch.equal(half.float(), dm):  # every scale a float16 value (NaN refuses: NaN != NaN)
        dm = half
    scales = dm.permute(0, 3, 1, 2).contiguous().view(torch.uint8).reshape(B, G, 2 * blk * dm.element_size())
    record = torch.cat([scales, packed], -1).contiguous()
    assert record.shape[-1] == (lib.rows_q4dot16_bytes() if dm is half else lib.rows_q4dot_bytes())
    return record


def _codes(w: torch.Tensor, pack, record: int, group: int) -> torch.Tensor | None:
    """`q4_block` / `q8_block` / `q6_block`: the C packer `pack`'s layout (`record` bytes a group of
    `group` inputs of a column block), or None where it refuses the weight."""
    lib = library()
    out, inp = w.shape
    if w.dtype != torch.float32 or w.device.type != "cpu" or inp % group:
        return None
    packed = torch.zeros(-(-out // lib.rows_block()), inp // group, record, dtype=torch.uint8)
    refused = pack(w.data_ptr(), out, inp, *w.stride(), packed.data_ptr(), torch.get_num_threads())
    return None if refused else packed


def layout(blocked: torch.Tensor) -> str:
    """A kernel layout's kind: "float32" (`block` of float32), "i8dot" (`dot_block`'s 4-d int8 codes:
    `matmuls.RowInt8Linear`'s), "q4" (`q4_block`), "q8"
    (`q8_block`), "q6" (`q6_block`), "q4dot" or "q4dot16" (`q4dot_block`: the int4 precision's, float32
    or float16 scales); the last five uint8 records, told apart by their record's bytes (768, 1152, 640,
    192, 160); "ggml:T", a GGUF matrix of ggml type T as the file stores it (`file_codes.kernel_codes`:
    its rows tagged with `ggml_type` and `ggml_in`)."""
    if getattr(blocked, "ggml_type", None) is not None:
        return f"ggml:{blocked.ggml_type}"
    if blocked.dtype != torch.uint8:
        return "float32" if blocked.dtype == torch.float32 else "i8dot"
    return _record_kinds()[blocked.shape[-1]]


@functools.cache
def _record_kinds() -> dict[int, str]:
    lib = library()
    kinds = {lib.rows_q4_bytes(): "q4", lib.rows_q8_bytes(): "q8", lib.rows_q4dot_bytes(): "q4dot"}
    return kinds | {lib.rows_q6_bytes(): "q6", lib.rows_q4dot16_bytes(): "q4dot16"}


def inputs(blocked: torch.Tensor) -> int:
    """A weight's input count from its kernel layout (`block`, `dot_block`, or the records of `q4_block`,
    `q8_block` and `q4dot_block`: groups of 32 inputs; `q6_block`'s: of 16)."""
    if getattr(blocked, "ggml_type", None) is not None:
        return blocked.ggml_in
    if blocked.dtype == torch.uint8:
        lib = library()
        return blocked.shape[1] * (lib.rows_q6_group() if layout(blocked) == "q6" else lib.rows_code_group())
    return blocked.shape[1] * (4 if blocked.dim() == 4 else 1)


# The C matmul by layout: float32 weights, int8 codes on quantized rows (the caller scales), 4-bit and
# 8-bit codes.
MATMULS = {
    "float32": "rows_matmul",
    "i8dot": "rows_matmul_i8dot",
    "q4": "rows_matmul_q4",
    "q8": "rows_matmul_q8",
    "q6": "rows_matmul_q6",
    "q4dot": "rows_matmul_q4dot",
    "q4dot16": "rows_matmul_q4dot16",
}
# `rows_layer`'s weight kinds by layout (its LAYER_F32, LAYER_Q4, LAYER_I8, LAYER_Q4DOT, LAYER_Q8, LAYER_Q6,
# LAYER_Q4DOT16), one a matmul (`rowstack.LayerWeights`); a GGUF matrix read in place is kind
# `ggml.layer_kind(its ggml type)` (rows_layer_ggml_base() + the type: ggml_matmul).
LAYER_KINDS = {"float32": 0, "q4": 1, "i8dot": 2, "q4dot": 3, "q8": 4, "q6": 5, "q4dot16": 6}
# A GGUF matrix of ggml type T read in place: kind LAYER_GGML_BASE + T (`rows_layer_ggml_base` in the C).
LAYER_GGML_BASE = 100
# Every ggml type id: which of them have kernels is `ggml.FORMATS`' (and the C dispatch's) to say.
GGML_TYPES = range(64)
LAYER_KINDS |= {f"ggml:{t}": LAYER_GGML_BASE + t for t in GGML_TYPES}


def matmul(x: torch.Tensor, blocked: torch.Tensor, out: int) -> torch.Tensor:
    """x @ W.t() for float32 x (..., in) on the CPU, W given as `block(W)` with `out` outputs: (..., out).
    A `dot_block` of int8 codes gives x @ codes.t() on x quantized per row (`rows_matmul_i8dot`, its rows'
    scales applied; the caller applies the codes'); `q4_block(W)`
    and `q8_block(W)` give `block(W)`'s bits (`rows_matmul_q4`, `rows_matmul_q8`), any row count;
    `q4dot_block(W)` the int4 precision's product, x quantized per group of 32 (`rows_matmul_q4dot`)."""
    inp = x.shape[-1]
    flat = x.reshape(-1, inp).contiguous()
    y = torch.empty(flat.shape[0], out, dtype=torch.float32)
    fn = getattr(library(), MATMULS[layout(blocked)])
    fn(flat.data_ptr(), flat.shape[0], inp, blocked.data_ptr(), y.data_ptr(), out, torch.get_num_threads())
    return y.view(*x.shape[:-1], out)


def screen(
    x: torch.Tensor,
    codes: torch.Tensor,
    slack: torch.Tensor,
    wnorm: torch.Tensor,
    w: torch.Tensor,
    entropy: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """(R, V) float32 for float32 x (R, in): each row's logits x . w[j] where the integer screen leaves
    doubt that they are the row's largest, the bits of `matmul(x, block(w), V)`, -inf elsewhere
    (`rows_screen`; `screen.ScreenedHead` holds its arguments). None where a row is not finite.

    codes: `screen.screen_block` of the head's codes and scales; slack, wnorm: (V,) float64, the bound's radius
    per unit of the row's two norms (`screen.py`); w: the float32 head (V, in) in any strides (a tied
    head's input-major storage); entropy: (R,) float32 to fill with each row's softmax entropy over its
    logits as screened (the kept exact, the rest their screened values), or None."""
    assert x.dtype == w.dtype == torch.float32 and slack.dtype == wnorm.dtype == torch.float64
    flat = x.contiguous()
    V = w.shape[0]
    lib = library()
    assert (
        codes.shape[0] * lib.rows_dot_block() >= V and codes.shape[1] * lib.rows_code_group() >= flat.shape[1]
    )
    y = torch.empty(flat.shape[0], V, dtype=torch.float32)
    assert entropy is None or (entropy.dtype == torch.float32 and entropy.shape == flat.shape[:1])
    args = [flat, flat.shape[0], flat.shape[1], codes, slack, wnorm, w, *w.stride(), y, V, entropy]
    failed = lib.rows_screen(*_pointers(*args, torch.get_num_threads()))
    return None if failed else y


def blocked_gemm(x: torch.Tensor, blocked: torch.Tensor, out: int) -> torch.Tensor:
    """`matmul` for more rows than one pass takes (a batch, a prefill): torch's batched GEMM over the
    column blocks, (blocks, rows, BLK), laid back to (..., out). Level with oneDNN's packed GEMM at these
    row counts and faster than MKL's GEMM up to a few tens of rows (SmolLM2's figures:
    docs/results-log.md)."""
    flat = x.reshape(-1, x.shape[-1])
    y = torch.matmul(flat, blocked).permute(1, 0, 2).reshape(flat.shape[0], -1)[:, :out]
    return y.reshape(*x.shape[:-1], out)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`layers.rms_norm` for float32 x (..., n) on the CPU, each row on its own (`rows_rms_norm`)."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(flat)
    library().rows_rms_norm(
        flat.data_ptr(), flat.shape[0], flat.shape[1], weight.data_ptr(), eps, y.data_ptr()
    )
    return y.view(x.shape)


def spread(sub: torch.Tensor, ids: torch.Tensor, vocab_size: int, fill: float) -> torch.Tensor:
    """`prepare.expand_draft_logits` for float32 sub (..., Vd) on the CPU, ids (Vd,) int64 distinct
    (`rows_spread`): (..., vocab_size), `fill` outside ids."""
    flat = sub.reshape(-1, sub.shape[-1]).contiguous()
    out = torch.empty(flat.shape[0], vocab_size, dtype=torch.float32)
    ids = ids.contiguous()
    assert ids.dtype == torch.int64 and ids.shape == flat.shape[-1:]
    library().rows_spread(
        flat.data_ptr(), flat.shape[0], flat.shape[1], ids.data_ptr(), vocab_size, fill, out.data_ptr()
    )
    return out.view(*sub.shape[:-1], vocab_size)


def softmax_stats(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`router.softmax_stats` for float32 logits (..., V) on the CPU (`rows_softmax_stats`): each row's
    largest softmax probability and its entropy in nats, both (...)."""
    flat = logits.reshape(-1, logits.shape[-1]).float().contiguous()
    top, ent = torch.empty(2, flat.shape[0], dtype=torch.float32)
    library().rows_softmax_stats(
        flat.data_ptr(), flat.shape[0], flat.shape[1], top.data_ptr(), ent.data_ptr()
    )
    return top.view(logits.shape[:-1]), ent.view(logits.shape[:-1])


def attention_fits(head_dim: int) -> bool:
    """Whether `attention` takes heads of this size (a multiple of the build's vector width, <= 256)."""
    return head_dim <= 256 and head_dim % library().rows_lanes() == 0


def _pointers(*args) -> list:
    """ctypes arguments: each tensor as its data pointer, everything else as it is."""
    return [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]


def _mask(visible: torch.Tensor | None) -> tuple:
    """A (1|B, T, S) uint8 mask as the C side takes it: (pointer or None, batch stride, row stride);
    batch stride 0 for one mask shared by the batch."""
    if visible is None:
        return None, 0, 0
    assert visible.dtype == torch.uint8 and visible.stride(-1) == 1
    return visible, visible.stride(0) if visible.shape[0] > 1 else 0, visible.stride(1)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    start: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of T float32 queries q (B, H, T, Dh) at cache indices [start, start + T) over the cache
    buffers k, v (B, Hkv, capacity, Dh), each query on its own (`rows_attention`): `visible` (1|B, T,
    start + T) uint8, 1 = may attend, or None (query t sees keys up to its own, start + t); softmax scale
    `scale` (None: Dh ** -0.5). Returns (B, H, T, Dh), a view of (B, T, H, Dh) storage (what the output
    projection reads)."""
    B, H, T, Dh = q.shape
    assert q.dtype == k.dtype == v.dtype == torch.float32 and attention_fits(Dh)
    assert q.stride(-1) == 1 and k.stride() == v.stride() and k.stride(-1) == 1 and k.stride(-2) == Dh
    o = torch.empty(B, T, H, Dh, dtype=torch.float32)
    args = [q, *q.stride()[:3], k, v, *k.stride()[:2], *_mask(visible), o, B, H, k.shape[1], T, Dh, start]
    scale = Dh**-0.5 if scale is None else scale
    library().rows_attention(*_pointers(*args, scale, torch.get_num_threads()))
    return o.transpose(1, 2)
