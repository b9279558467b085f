"""Chat templates (kvplane.chat): rendering as the Hugging Face convention defines it."""

from __future__ import annotations

import json

import pytest

from kvplane.chat import ChatTemplate, ChatTemplateError, load_chat_template

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_render_fills_messages_special_tokens_and_the_generation_prompt():
    template = ChatTemplate(TEMPLATE, "<s>", "</s>")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert template.render(messages) == "<s><|system|>be brief</s>\n<|user|>hi</s>\n<|assistant|>"
    assert template.render(messages, add_generation_prompt=False) == "<s><|system|>be brief</s>\n<|user|>hi</s>\n"


def test_template_refusals_and_errors_are_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="refused the conversation: unknown role tool"):
        ChatTemplate(TEMPLATE).render([{"role": "tool", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        ChatTemplate("{% for %}").render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="messages is empty"):
        ChatTemplate(TEMPLATE).render([])


def test_the_sandbox_refuses_unsafe_attribute_access():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([{"role": "user", "content": "x"}])


def test_load_from_a_checkpoint_directory(tmp_path):
    assert load_chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    assert load_chat_template(tmp_path) is None  # special tokens but no template
    (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    assert load_chat_template(tmp_path) == ChatTemplate(TEMPLATE, "<s>", "</s>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default", "template": "T"}]}))
    assert load_chat_template(tmp_path).source == "T"
