"""`--server URL` (or $YUE_SERVER): `yue generate`, `yue chat` and `yue eval` as clients of a running
`yue serve`.

Design decisions:
- The standard library only (urllib, json): a client call imports no torch, no HTTP package, so it
  answers in the time the server takes (Ollama's CLI works the same way against `ollama serve`).
- The same request as in-process: the CLI's `DecodeConfig` becomes the OpenAI request's fields
  (`request_fields`), and an instruct model (the model card's `instruct`) is sent its chat messages,
  where `yue generate` would template the prompt itself; the answer is streamed (SSE) either way.
- Settings the HTTP API does not carry (the server's load options, the drafting internals) are refused
  with their option's name, rather than silently not applied.
- A server that cannot be reached, or that refuses the request, is a one-line error (exit code 2).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, fields

from yue.settings import DecodeConfig, LoadConfig

SERVER_ENV = "YUE_SERVER"
API_KEY_ENV = "YUE_API_KEY"  # the key `yue serve --api-key` (or its $YUE_API_KEY) requires
SERVER_HELP = (
    "Send the request to a running `yue serve` at this URL (e.g. http://127.0.0.1:8000) instead of "
    f"loading the model here: no torch to import. Also ${SERVER_ENV}."
)
# DecodeConfig's fields an OpenAI request carries: field -> the request's name for it.
_REQUEST_NAMES = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "mode": "mode",
    "router_threshold": "router_threshold",
    "stop": "stop",
    "logit_bias": "logit_bias",
}
TIMEOUT_S = 600.0  # one request, first byte to last: a long answer on a slow CPU


def request_fields(config: DecodeConfig) -> dict:
    """The request's sampling fields for `config` (a setting at None is left to the server's default,
    the model's own, as in-process)."""
    body = {}
    for field, name in _REQUEST_NAMES.items():
        value = getattr(config, field)
        if value is None:
            continue
        if field == "stop":
            value = list(value)
        elif field == "logit_bias":
            value = {str(token): bias for token, bias in value}
        body[name] = value
    return body


def check_local_settings(load: LoadConfig, config: DecodeConfig) -> None:
    """A ValueError naming the first option given that a server request cannot carry: the load options
    are the server's own (`yue serve --threads ...`), the drafting internals are not in the HTTP API."""
    for settings, default, where in (
        (load, LoadConfig(), "the server's own: give it to `yue serve`"),
        (config, DecodeConfig(), "not in the HTTP API: leave out one of them"),
    ):
        for f in fields(default):
            if f.name in ("model", *_REQUEST_NAMES):
                continue
            if getattr(settings, f.name) != getattr(default, f.name):
                raise ValueError(f"--{f.name.replace('_', '-')} with --server: it is {where}")


@dataclass(frozen=True)
class Server:
    """A running `yue serve`: its address and the model it serves (`connect`)."""

    url: str
    model: str
    instruct: bool
    default_mode: str | None = None
    api_key: str | None = None

    @classmethod
    def connect(cls, url: str, model: str | None = None) -> Server:
        """The server at `url`, checked by asking for its model card; `model`, if given, must be the
        model it serves (a name or path as `--model` takes it: compared by name)."""
        url = url.rstrip("/")
        if "://" not in url:
            url = "http://" + url
        probe = cls(url, model="", instruct=False, api_key=os.environ.get(API_KEY_ENV) or None)
        card = probe._json("GET", "/v1/models")["data"][0]
        if model is not None and card["id"] not in (model, os.path.basename(model.rstrip("/"))):
            raise ValueError(f"--model {model}: the server at {url} serves {card['id']}")
        return cls(url, card["id"], bool(card.get("instruct")), card.get("default_mode"), probe.api_key)

    def completion(self, prompt: str, config: DecodeConfig) -> Iterator[str]:
        """/v1/completions, streamed: the text deltas of `prompt`'s continuation."""
        body = {"model": self.model, "prompt": prompt, **request_fields(config)}
        return self._deltas("/v1/completions", body, lambda choice: choice.get("text", ""))

    def chat(self, messages: list[dict], config: DecodeConfig) -> Iterator[str]:
        """/v1/chat/completions, streamed: the reply's text deltas."""
        body = {"model": self.model, "messages": messages, **request_fields(config)}
        return self._deltas("/v1/chat/completions", body, lambda c: c.get("delta", {}).get("content") or "")

    def evaluate(self, fields: dict) -> dict:
        """/eval: `yue eval`'s numbers (`EvalConfig`'s fields) for the served model, as in-process."""
        return self._json("POST", "/eval", fields)

    def _deltas(self, path: str, body: dict, text_of) -> Iterator[str]:
        with self._open("POST", path, {**body, "stream": True}) as response:
            for line in response:
                if not line.startswith(b"data: "):
                    continue
                data = line[len(b"data: ") :].strip()
                if data == b"[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise ValueError(f"the server at {self.url} failed: {event['error'].get('message')}")
                for choice in event.get("choices", []):
                    if text := text_of(choice):
                        yield text

    def _json(self, method: str, path: str, body: dict | None = None) -> dict:
        with self._open(method, path, body) as response:
            return json.loads(response.read())

    def _open(self, method: str, path: str, body: dict | None):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            return urllib.request.urlopen(request, timeout=TIMEOUT_S)
        except urllib.error.HTTPError as e:
            raise ValueError(
                f"the server at {self.url} refused the request ({e.code}): {_message(e)}"
            ) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ValueError(
                f"no yue server answers at {self.url} ({reason}): start one with `yue serve`, or leave out --server"
            ) from None


def _message(error: urllib.error.HTTPError) -> str:
    """An API error's own message (`{"error": {"message": ...}}`), else the HTTP reason."""
    try:
        return json.loads(error.read())["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return str(error.reason)
