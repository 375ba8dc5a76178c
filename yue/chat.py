"""Chat messages -> prompt text, through a Jinja chat template stored with the tokenizer.

Design decisions:
- The template travels with the model, like Hugging Face's: a `chat_template.jinja` file in the
  model folder, or `chat_template` in its `tokenizer_config.json`; a plain built-in default otherwise.
- Templates come from model folders, so they render in Jinja's immutable sandbox, compiled by
  transformers' own template compiler (its filters, `raise_exception`, loop controls), with the
  same variables: `messages` (role/content dicts), `add_generation_prompt`, `bos_token`,
  `eos_token`. So a prompt rendered here is the text `apply_chat_template` renders (tested).
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers.utils.chat_template_utils import _compile_jinja_template

DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ m.role | capitalize }}: {{ m.content }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def find_chat_template(
    model_dir: str | Path | None, default: str | None = DEFAULT_CHAT_TEMPLATE
) -> str | None:
    """The template stored with the model in `model_dir`, else `default` (the built-in one)."""
    if model_dir is not None:
        folder = Path(model_dir)
        if (file := folder / "chat_template.jinja").is_file():
            return file.read_text(encoding="utf-8")
        if (config := folder / "tokenizer_config.json").is_file():
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(template, str) and template:
                return template
    return default


class ChatTemplate:
    """A compiled chat template."""

    def __init__(self, source: str = DEFAULT_CHAT_TEMPLATE) -> None:
        self.template = _compile_jinja_template(source)

    def render(self, messages: list[dict[str, str]], bos_token: str = "", eos_token: str = "") -> str:
        """The prompt for `messages`, ending where the assistant's reply should begin."""
        return self.template.render(
            messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
        )
