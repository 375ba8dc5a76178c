"""The llama.cpp peer: llama-cpp-python on the same GGUF file, greedy, fed the same prompt ids.

Design decisions:
- `llamacpp-greedy` is the tool a CPU user would otherwise pick (docs/design.md §6). It runs the GGUF the
  model's AR set comes from, with llama.cpp's own kernels at the file's precision (Q4_1 for yue-smol),
  not float32: its exact match and NLL against our `ar` are reported like any entry's, and the
  settings say what it computed with.
- It is fed the exact ids every other entry decodes from (`Prompt.ids`, chat template applied once)
  through `Llama.generate`, greedy (temperature 0: llama.cpp's greedy sampler; repeat penalty 1 is a
  no-op), and stops at our model's EOS ids or `max_new_tokens`, as the other entries do.
- Every call starts from an empty context (`Llama.reset()`): `generate` would otherwise reuse the KV
  cache of a previous call with the same prompt prefix, and TTFT would time a cache hit.
- Forwards are counted as llama.cpp evaluates them: one per generated token, the prefill included
  (the forward whose token is EOS counts, EOS itself does not), as the transformers peers count.
- It runs only where the model has a GGUF source and `llama_cpp` imports; otherwise `unavailable`
  gives the one-line reason the report prints instead.
- llama.cpp's extra CPU buffer types (AMX tiles, repacked weights) are probed before the peer loads
  (`extra_buffers_work`): llama-cpp-python 0.3.36 built on a Xeon with AMX segfaults on yue-smol's
  Q4_1 file for any batch of 2+ tokens (a prompt), taking the bench process with it. The probe runs
  one 2-token decode in a child process; where it dies, the peer loads with
  `use_extra_bufts = False` (slower, but it runs; docs/results-log.md) and the report's settings say so.
  `YUE_LLAMACPP_EXTRA_BUFFERS=0/1` skips the probe and forces either.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from yue.bench.runners import Prompt, Sample, Sampling

NAME = "llamacpp-greedy"
INSTALL = "pip install '.[llamacpp]' in yue's repository, or pip install 'llama-cpp-python>=0.3.30' (it builds from source: ~9 min on 2 cores)"
EXTRA_BUFFERS_ENV = "YUE_LLAMACPP_EXTRA_BUFFERS"
# The probe's child: load the file with llama.cpp's defaults and decode a 2-token batch (argv: path).
PROBE = (
    "import sys, llama_cpp; "
    "m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=16, n_threads=1, n_gpu_layers=0, verbose=False); "
    "m.eval([0, 0])"
)


def gguf_source(model: str | None) -> tuple[Path | None, str]:
    """The GGUF file a model's AR set comes from, or (None, why there is none).

    A `.gguf` file is its own source; a model folder names its source in `ar_source.json`
    (`registry.ar_source`: a file in an installed package, or a path).
    """
    from yue.registry import ar_source, resolve

    try:
        path = resolve(model)
        if path.is_file():  # resolve returns a folder or a .gguf file
            return path, ""
        source = ar_source(path)
    except ValueError as e:  # CheckpointError, ModelNotInstalledError: one line naming the fix
        return None, str(e)
    if source is None or source[0].is_dir():
        return None, f"model {path.name} has no GGUF source (its AR set is stored in a folder)"
    return source[0], ""


def unavailable(model: str | None) -> str | None:
    """Why the llama.cpp peer cannot run for this model (one line), or None when it can."""
    path, why = gguf_source(model)
    if path is None:
        return why
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed: {INSTALL}"
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # a broken build fails at import (missing shared library, CPU features)
        return f"llama_cpp does not import ({type(e).__name__}: {e})"
    return None


def extra_buffers_work(path: str | Path) -> bool:
    """Whether llama.cpp survives a multi-token batch on the GGUF at `path` with its extra CPU buffer
    types on (its default), tried in a child process, since where they fail it segfaults (module
    docstring). `YUE_LLAMACPP_EXTRA_BUFFERS` ("0" or "1") answers instead of the probe."""
    forced = os.environ.get(EXTRA_BUFFERS_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    return _child_survives(str(path))


@functools.cache  # once per file and process: the bench's load and its memory spec ask alike
def _child_survives(path: str) -> bool:
    try:
        child = subprocess.run([sys.executable, "-c", PROBE, path], capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:  # a hung child counts as a failed one
        return False
    return child.returncode == 0


@contextmanager
def _extra_buffers_off():
    """`Llama.__init__` takes its model parameters from `llama_model_default_params()` and has no
    argument for `use_extra_bufts`: while a Llama is built here, the defaults come with it off."""
    import llama_cpp.llama_cpp as lib

    defaults = lib.llama_model_default_params

    def without_extra_buffers():
        params = defaults()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = without_extra_buffers
    try:
        yield
    finally:
        lib.llama_model_default_params = defaults


def load(
    path: str | Path, n_ctx: int, threads: int, extra_buffers: bool | None = None, logits_all: bool = False
):
    """A `llama_cpp.Llama` on the GGUF at `path`: CPU, `threads` for decode and prefill, quiet; its
    extra CPU buffer types on or off as `extra_buffers` says (None: where they do not crash here,
    `extra_buffers_work`); `logits_all`: every evaluated row's logits kept (`Llama.scores`), as a
    teacher-forced measurement reads them. The Llama carries `yue_extra_buffers` (bool) for the report."""
    from llama_cpp import Llama

    extra = extra_buffers_work(path) if extra_buffers is None else extra_buffers
    with nullcontext() if extra else _extra_buffers_off():
        llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=min(512, n_ctx),
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=0,
            logits_all=logits_all,
            verbose=False,
        )
    llm.yue_extra_buffers = extra
    return llm


def precision(llm, path: str | Path) -> str:
    """What llama.cpp computes with, for the report: the file and its weight type."""
    ftype = llm.metadata.get("general.file_type")
    try:
        import gguf

        kind = gguf.LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_")
    except (ImportError, TypeError, ValueError):
        kind = f"file type {ftype}"
    import llama_cpp

    off = "" if getattr(llm, "yue_extra_buffers", True) else "; extra CPU buffer types off: they crash here"
    return f"{Path(path).name} ({kind} weights, llama.cpp kernels{off}; llama-cpp-python {llama_cpp.__version__})"


class LlamaCppRunner:
    """Runs the llama.cpp peer at batch 1 from the prompt's ids, greedy or sampled as `sampling` says
    (`runners.Sampling`), timed like the other runners."""

    def __init__(
        self, llm, tokenizer, eos_ids: set[int], max_new_tokens: int, sampling: Sampling = Sampling()
    ) -> None:
        self.llm, self.tok, self.eos, self.max_new = llm, tokenizer, eos_ids, max_new_tokens
        self.sampling = sampling

    def generate(self, ids: list[int], seed: int = 0) -> tuple[list[int], float | None, int]:
        """Tokens from `ids` (EOS excluded), seconds to the first one, forwards evaluated. Greedy at
        temperature 0 (llama.cpp's greedy sampler); else top-k off (0), typical and min-p off, the
        nucleus, the temperature, then a draw seeded with `seed`."""
        self.llm.reset()  # an empty context: no prefix reuse from the previous call
        self.llm.set_seed(seed)  # read when generate builds its sampler
        s = self.sampling
        t0, ttft, tokens, forwards = time.perf_counter(), None, [], 0
        top_k = 1 if s.greedy else 0
        for tok in self.llm.generate(
            ids, top_k=top_k, top_p=s.top_p, min_p=0.0, typical_p=1.0, temp=s.temperature, repeat_penalty=1.0
        ):
            forwards += 1
            if ttft is None:
                ttft = time.perf_counter() - t0
            if tok in self.eos:
                break
            tokens.append(tok)
            if len(tokens) >= self.max_new:
                break
        return tokens, ttft, forwards

    def __call__(self, batch: list[tuple[int, Prompt]]) -> Sample:
        assert len(batch) == 1, "peers run at batch 1"
        (i, p), t0 = batch[0], time.perf_counter()
        tokens, ttft, forwards = self.generate(p.ids, self.sampling.seed + i)
        wall = time.perf_counter() - t0
        return Sample([(i, tokens, self.tok.decode(tokens))], wall, ttft, forwards, [])
