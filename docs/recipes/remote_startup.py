"""Issue 61's client target: `yue generate --server URL "Say hi." -n 8` against a running `yue serve`
takes no longer than llama-cpp-python's load + 8 tokens on the same GGUF, and prints the same text as
in-process.

Starts `yue serve` once (a subprocess on 127.0.0.1, loaded before any timing; each side is run once
untimed), then per repeat times, as fresh processes, from start to exit:
- `yue generate --server URL PROMPT -n N` (the client: the standard library only, no torch);
- llama-cpp-python loading the model's GGUF (yue-smol's `ar_source` file, the same weights) and
  writing N greedy tokens of PROMPT (`Llama(...)(PROMPT, max_tokens=N, temperature=0)`).
The order alternates per repeat. It also runs `yue generate PROMPT -n N` in-process once and checks the
client printed the same text. Prints one JSON object (medians, min-max, the texts).

    python docs/recipes/remote_startup.py [--model yue-smol] [--repeats 3] [-n 8] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

# The peer's child. llama.cpp's extra CPU buffer types are turned off as yue's bench does where they
# crash (yue/bench/llamacpp.py's docstring); the child imports nothing of yue, so it pays no torch.
LLAMA_CPP = """
import sys
import llama_cpp.llama_cpp as lib
from llama_cpp import Llama
defaults = lib.llama_model_default_params
def without_extra_buffers():
    params = defaults()
    params.use_extra_bufts = False
    return params
lib.llama_model_default_params = without_extra_buffers
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=int(sys.argv[4]), verbose=False)
out = llm(sys.argv[2], max_tokens=int(sys.argv[3]), temperature=0.0)
print(out["choices"][0]["text"])
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wall(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    """Seconds from the process's start to its exit, and its stdout."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return time.perf_counter() - t0, done.stdout


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    """Until `/health` answers 200 (the model is loaded), or the server exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"yue serve exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"yue serve did not become ready in {timeout_s:.0f} s")


def gguf_of(model: str) -> str:
    """The GGUF file the model's AR set comes from (its `ar_source`)."""
    from yue.registry import ar_source, resolve

    source = ar_source(resolve(model))
    if source is None or source[0].suffix != ".gguf":
        raise SystemExit(f"{model} does not load its AR set from a GGUF file")
    return str(source[0])


def summary(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3), "runs": [round(x, 3) for x in xs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="yue-smol")
    ap.add_argument("--prompt", default="Say hi.")
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    yue_cmd = [sys.executable, "-m", "yue"]
    gguf = gguf_of(args.model)
    url = f"http://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        yue_cmd + ["serve", "--model", args.model, "--port", url.rsplit(":", 1)[1],
                   "--threads", str(args.threads)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, server)
        client = yue_cmd + ["generate", "--server", url, args.prompt, "-n", str(args.n)]
        peer = [sys.executable, "-c", LLAMA_CPP, gguf, args.prompt, str(args.n), str(args.threads)]
        wall(client)  # untimed: the server's first request warms its caches,
        wall(peer)  # and the peer's first run the page cache of its library and file
        times: dict[str, list[float]] = {"yue --server": [], "llama-cpp-python load + n": []}
        for i in range(args.repeats):
            order = [("yue --server", client), ("llama-cpp-python load + n", peer)]
            for name, cmd in order if i % 2 == 0 else order[::-1]:
                seconds, out = wall(cmd)
                times[name].append(seconds)
                if name == "yue --server":
                    remote_text = out
        local_text = wall(yue_cmd + ["generate", args.prompt, "-n", str(args.n),
                                     "--threads", str(args.threads)])[1]
    finally:
        server.terminate()
        server.wait(timeout=60)
    yue_s = statistics.median(times["yue --server"])
    peer_s = statistics.median(times["llama-cpp-python load + n"])
    result = {
        "what": f"`yue generate --server URL {args.prompt!r} -n {args.n}` (a fresh process, start to exit) "
                "against llama-cpp-python's load + n tokens of the same prompt on the same GGUF "
                "(a fresh process), alternating per repeat",
        "model": args.model, "gguf": os.path.basename(gguf), "threads": args.threads,
        "repeats": args.repeats, "seconds": {k: summary(v) for k, v in times.items()},
        "ratio_yue_over_llama_cpp": round(yue_s / peer_s, 3),
        "same_text_as_in_process": remote_text == local_text,
        "text": {"server": remote_text, "in_process": local_text},
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
