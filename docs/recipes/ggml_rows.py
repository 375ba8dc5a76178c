"""What extra rows cost the GGUF-block matmuls (`yue.kernels.ggml`), at one thread: a 2048 x 8192 Q4_K and
Q6_K matrix (random codes, finite float16 scales; larger than the caches), 1 / 2 / 4 / 8 rows, and the
one-row call's weight stream in GB/s (a development script, not part of the package).

    python docs/recipes/ggml_rows.py [out] [in] [repeats]

Interleaved repeats (each row count timed once a round), medians reported; one warm-up call each
first. The last line is one JSON document.
"""

import json
import statistics
import sys
import time

import numpy as np
import torch

from yue.kernels import ggml

ROWS = (1, 2, 4, 8)
TYPES = {"Q4_K": 12, "Q6_K": 14}


def random_matrix(ggml_type: int, out: int, inp: int, rng: np.random.Generator) -> torch.Tensor:
    """`out` rows of random blocks of a K-quant, with finite float16 d (and dmin) so every value is finite."""
    fmt = ggml.FORMATS[ggml_type]
    n = out * inp // fmt.block_elems
    raw = rng.integers(0, 256, (n, fmt.block_bytes), dtype=np.uint8)
    scales = (rng.random((n, 2)) * 1e-2 + 1e-3).astype(np.float16).view(np.uint8)
    if fmt.name == "Q6_K":
        raw[:, 208:210] = scales[:, :2]  # d is the block's last two bytes
    else:
        raw[:, 0:4] = scales  # d, dmin lead the block
    return torch.from_numpy(raw.reshape(-1))


def main(out: int = 2048, inp: int = 8192, repeats: int = 30) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    report = {"out": out, "in": inp, "threads": 1}
    for name, t in TYPES.items():
        w = random_matrix(t, out, inp, rng)
        xs = {r: torch.randn(r, inp) for r in ROWS}
        for r in ROWS:
            ggml.matmul(xs[r], w, t, out)  # warm-up
        times = {r: [] for r in ROWS}
        for _ in range(repeats):
            for r in ROWS:
                start = time.perf_counter()
                ggml.matmul(xs[r], w, t, out)
                times[r].append(time.perf_counter() - start)
        med = {r: statistics.median(v) for r, v in times.items()}
        gbs = w.numel() / med[1] / 1e9
        ratios = {r: med[r] / med[1] for r in ROWS}
        print(
            f"{name}: one row {med[1] * 1e3:.3f} ms ({gbs:.1f} GB/s of weight); rows/1-row: "
            + ", ".join(f"{r}: {ratios[r]:.2f}x" for r in ROWS[1:])
        )
        report[name] = {
            "ms": {r: round(med[r] * 1e3, 4) for r in ROWS},
            "one_row_gb_s": round(gbs, 2),
            "ratios": {r: round(ratios[r], 3) for r in ROWS},
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
