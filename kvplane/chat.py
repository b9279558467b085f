"""Chat templates: a conversation rendered into one prompt string, as the model expects it.

Rule (the Hugging Face convention every serving stack follows): the model's tokenizer files carry
a Jinja template (`chat_template` in tokenizer_config.json, or a chat_template.jinja file beside
it). It is rendered in a sandbox with `messages` (a list of {"role", "content"}),
`add_generation_prompt` (True: the text ends with the assistant's turn opened), the tokenizer's
`bos_token` / `eos_token`, and a `raise_exception(message)` helper that templates call to refuse
a conversation (e.g. roles that do not alternate). The rendered text is tokenized without adding
special tokens: the template writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROLES_HINT = "system, user, assistant or tool"


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered: no template, a template error, or the template refused it."""


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    source: str
    bos_token: str = ""
    eos_token: str = ""

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not messages:
            raise ChatTemplateError("messages is empty: send at least one message")

        def raise_exception(message: str) -> None:
            raise ChatTemplateError(f"the model's chat template refused the conversation: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            template = env.from_string(self.source)
            return template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the model's chat template failed: {e}") from None


def _token_text(value: object) -> str:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, Mapping):
        return str(value.get("content", ""))
    return str(value) if value else ""


def load_chat_template(model_dir: str | Path) -> ChatTemplate | None:
    """The chat template shipped with a checkpoint directory, or None when it has none."""
    directory = Path(model_dir)
    config_path = directory / "tokenizer_config.json"
    config: dict = {}
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        source = named.get("default")
    jinja_file = directory / "chat_template.jinja"
    if not source and jinja_file.is_file():
        source = jinja_file.read_text(encoding="utf-8")
    if not source:
        return None
    return ChatTemplate(str(source), _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))
