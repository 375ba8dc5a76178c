"""Peak resident memory of one mode, measured in a process of its own.

Design decisions:
- A fresh interpreter per mode (`python -m yue.bench.memory SPEC_JSON`), so one mode's allocations
  never inflate another's peak: `ru_maxrss` only ever grows within a process.
- Every process imports the same modules (torch, transformers, yue) before loading anything, then
  resets the kernel's peak mark (VmHWM, via /proc/self/clear_refs) so that transient import-time
  allocations do not hide the run's own peak. It reports the RSS after the imports (`base_rss_mb`)
  beside the peak of load + generate (`peak_rss_mb`): at small model sizes the imports dominate, and
  the difference shows what the model, its cache and its activations cost. Without /proc the peak
  falls back to `ru_maxrss` (since process start).
- The process loads only what its mode needs: the yue model for ours, the AR set's transformers folder
  for the Hugging Face peers (`runners.load_peers`), the GGUF file for llama.cpp. It generates once for the given prompt and
  prints one JSON line.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class MemorySpec:
    """What one measuring process runs.

    Attributes:
        mode: a bench mode name ("hf-greedy", "hf-prompt-lookup", "llamacpp-greedy", "ar", "verified",
            "hybrid", "nar").
        model: the yue model name or path (ours); llama: the AR set's transformers folder (hf peers:
            `runners.load_peers`, an exported LlamaForCausalLM or the family's own folder).
        prompt: the prompt text (ours); prompt_ids: the same prompt's ids (peers).
        router_threshold: for ours; None = the model's default.
        gguf: the GGUF file (llamacpp-greedy); llamacpp_extra_buffers: the bench's verdict on llama.cpp's
            extra CPU buffer types for it (`llamacpp.extra_buffers_work`), so the child does not probe again.
        dtype: ours and the hf peers' precision ("float32", "bfloat16").
        low_memory: ours hold each float32 layer weight once (`yue.load`).
    """

    mode: str
    model: str | None
    llama: str | None
    prompt: str
    prompt_ids: list[int]
    max_new_tokens: int
    threads: int
    router_threshold: float | None = None
    gguf: str | None = None
    llamacpp_extra_buffers: bool | None = None
    dtype: str = "float32"
    low_memory: bool = False


def _status_kb(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0); False if unavailable."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_kb("VmHWM") is not None
    except OSError:
        return False


def _peak_mb(since_reset: bool) -> float:
    """Peak RSS in MiB: VmHWM since the last reset, else ru_maxrss since the process started."""
    if since_reset:
        return _status_kb("VmHWM") / 1024
    # Linux reports ru_maxrss in KiB (macOS in bytes).
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def measure_here(spec: MemorySpec) -> dict[str, float]:
    """Load and generate for `spec` in THIS process; return base and peak RSS in MiB."""
    import torch
    from transformers import AutoModelForCausalLM

    import yue
    from yue.kernels.prepare import resolve_dtype

    torch.set_num_threads(spec.threads)
    # Imports allocate and free transient memory; reset the peak mark so it measures the run only
    # (the imported modules' resident pages still count: they are the run's floor).
    reset = _reset_peak()
    base = _peak_mb(reset)
    if spec.mode == "llamacpp-greedy":
        from yue.bench import llamacpp

        n_ctx = len(spec.prompt_ids) + spec.max_new_tokens + 1
        llm = llamacpp.load(spec.gguf, n_ctx, spec.threads, spec.llamacpp_extra_buffers)
        llamacpp.LlamaCppRunner(llm, None, {llm.token_eos()}, spec.max_new_tokens).generate(spec.prompt_ids)
    elif spec.mode.startswith("hf-"):
        llama = AutoModelForCausalLM.from_pretrained(
            spec.llama, dtype=resolve_dtype(spec.dtype) or torch.float32
        ).eval()
        gen = llama.generation_config
        kw = {"prompt_lookup_num_tokens": 10} if spec.mode == "hf-prompt-lookup" else {}
        ids = torch.tensor([spec.prompt_ids])
        llama.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=spec.max_new_tokens,
            do_sample=False,
            eos_token_id=gen.eos_token_id,
            pad_token_id=gen.pad_token_id,
            **kw,
        )
    else:
        engine = yue.load(spec.model, dtype=spec.dtype, low_memory=spec.low_memory)
        engine.generate(
            spec.prompt,
            mode=spec.mode,
            router_threshold=spec.router_threshold,
            max_new_tokens=spec.max_new_tokens,
        )
    return {"base_rss_mb": base, "peak_rss_mb": _peak_mb(reset)}


def measure(spec: MemorySpec, timeout_s: float = 600.0) -> dict[str, float]:
    """Run `measure_here(spec)` in a fresh interpreter and return its result.

    Raises:
        RuntimeError: the child failed (its stderr tail is in the message).
    """
    proc = subprocess.run(
        [sys.executable, "-m", "yue.bench.memory", json.dumps(asdict(spec))],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"memory probe for {spec.mode} failed: {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


if __name__ == "__main__":
    print(json.dumps(measure_here(MemorySpec(**json.loads(sys.argv[1])))))
