"""Q4_K weights on yue's row kernel: held as the float32 values they load as against as their 4-bit codes
(`rowkernel.q4_block`, the same bits), in Gemma 3 270M's layer shapes (18 layers of Q/K/V 1536x640, O
640x1024, gate/up 4096x640, down 640x2048; 100M weights), each layer its own copy so that the weights
stream from memory as a model's do. One thread, random valid Q4_K blocks (a development script, not
part of the package).

    python docs/recipes/q4k_codes_bench.py

Prints the packing time and, for 1, 4 and 9 rows (a one-row step, verifying steps), the min of 5 passes
over the 18 layers' matmuls on each form, and their ratio.
"""

import sys
import time
from pathlib import Path

import gguf
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import quant_reference  # noqa: E402
from yue.kernels import rowkernel  # noqa: E402

SHAPES = [(1536, 640), (640, 1024), (4096, 640), (640, 2048)]  # (out, in) of one Gemma 3 270M layer
LAYERS = 18


def q4_k_weight(out: int, inp: int, rng: np.random.Generator) -> torch.Tensor:
    """Random valid Q4_K blocks dequantized; inputs cut to `inp` from whole 256-wide super-blocks."""
    qtype, width = gguf.GGMLQuantizationType.Q4_K, -(-inp // 256) * 256
    data = quant_reference.random_blocks((out, width), qtype, rng)
    return torch.from_numpy(quant_reference.dequantize(data, qtype, (out, width)))[:, :inp].contiguous()


def best_ms(layers: list[list[torch.Tensor]], rows: int) -> float:
    xs = [torch.randn(rows, inp) for _, inp in SHAPES]
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for layer in layers:
            for (out, _), w, x in zip(SHAPES, layer, xs, strict=True):
                rowkernel.matmul(x, w, out)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    weights = [q4_k_weight(out, inp, rng) for out, inp in SHAPES]
    start = time.perf_counter()
    codes = [rowkernel.q4_block(w) for w in weights]
    print(
        f"packing one layer's {sum(w.numel() for w in weights) / 1e6:.1f}M weights: "
        f"{(time.perf_counter() - start) * 1e3:.0f} ms"
    )
    assert all(c is not None for c in codes)
    floats = [[rowkernel.block(w) for w in weights] for _ in range(LAYERS)]
    coded = [[c.clone() for c in codes] for _ in range(LAYERS)]
    for rows in (1, 4, 9):
        f, q = best_ms(floats, rows), best_ms(coded, rows)
        print(f"{rows} rows: float32 {f:.1f} ms, Q4_K codes {q:.1f} ms: {f / q:.2f}x")


if __name__ == "__main__":
    main()
