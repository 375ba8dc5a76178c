"""yue's kernels: the decode path of a trained model (`yue.model`), built for the running device.

- `probe`: which kernels run on this CPU (oneDNN packing, the int8 engine, yue's row kernel), probed
  once per process, each with a forced fallback.
- `rowkernel` (+ `rowkernel.c`): yue's C row kernel, compiled for this CPU on first use.
- `ggml` (+ `ggml/*.c`, built into the row kernel): matmuls and row lookups that read a GGUF's blocks
  in place, with `FORMATS`, the registry of the block formats they take.
- `matmuls`: the decode-time matmul modules on those kernels (row-exact, packed, lowered, int4).
- `screen`: the LM head's integer screen for greedy steps.
- `decode_set`: a layer's decode-time paths (fused matmuls, row-exact attention, a stack of layers as
  one call).
- `ggml` (+ `ggml/*.c`): matmuls on a GGUF's ggml block formats, read in place; `file_codes`: the
  modules holding a GGUF's own codes and their loader (the `file` precision).
- `prepare_codes`: `prepare_for_decoding` for a model in a GGUF's own codes, else `prepare`'s.
- `prepare`: `prepare_for_decoding`, which builds all of these into the `DecodePaths` of the
  `PreparedModel` it returns (`yue.model.prepared`), consuming the trained model.

`yue.model` imports nothing from here: the trained modules are handed their decode paths as arguments,
through the small interface `yue.model.decode_paths` names.
"""

from yue.kernels.prepare_codes import prepare_for_decoding

__all__ = ["prepare_for_decoding"]
