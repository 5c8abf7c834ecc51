#!/usr/bin/env python3
"""Writes tests/data/chat/refs.json: real chat templates, conversations, and
what llama.cpp's llama_chat_apply_template (through llama-cpp-python) and the
template itself (rendered with jinja2 the way transformers does) make of them.

    /tmp/venvtest/v/bin/python scripts/gen_chat_refs.py
    (or llama-cpp-python's interpreter with jinja2 on its PYTHONPATH)

Needs llama-cpp-python and jinja2; gguf too, for the optional template read
out of a model file (the shared phi-3 vocabulary).

Each template is the model's own tokenizer_config.json chat_template, copied
from its public release (the source is given with it). "llama_cpp" is the
reference tandem::ChatTemplate::apply must equal byte for byte. "jinja" is the
real template's output with bos_token = "" (the tokenizer adds BOS) or null
when the template refuses the conversation; "jinja_equal" says whether llama.cpp
and the template agree, and the test also checks ChatTemplate against it where
they do.
"""

import ctypes
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "chat", "refs.json")
PHI3_VOCAB = "/work/shared/models/vocab/ggml-vocab-phi-3.gguf"

# google/gemma-3-*-it tokenizer_config.json (text-only parts are what matter here).
GEMMA3 = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# meta-llama/Llama-2-7b-chat-hf tokenizer_config.json.
LLAMA2 = r"""{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"""

# meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json.
LLAMA3 = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"""

# teknium/OpenHermes-2.5-Mistral-7B tokenizer_config.json.
CHATML = r"""{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""

# mistralai/Mistral-7B-Instruct-v0.3 tokenizer_config.json (tool calling included).
MISTRAL_V3 = '{%- if messages[0]["role"] == "system" %}\n    {%- set system_message = messages[0]["content"] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}\n\n{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n{%- set ns = namespace() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}\n        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}\n            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}\n        {%- endif %}\n        {%- set ns.index = ns.index + 1 %}\n    {%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message["role"] == "user" %}\n        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- "[AVAILABLE_TOOLS] [" }}\n            {%- for tool in tools %}\n                {%- set tool = tool.function %}\n                {{- \'{"type": "function", "function": {\' }}\n                {%- for key, val in tool.items() if key != "return" %}\n                    {%- if val is string %}\n                        {{- \'"\' + key + \'": "\' + val + \'"\' }}\n                    {%- else %}\n                        {{- \'"\' + key + \'": \' + val|tojson }}\n                    {%- endif %}\n                    {%- if not loop.last %}\n                        {{- ", " }}\n                    {%- endif %}\n                {%- endfor %}\n                {{- "}}" }}\n                {%- if not loop.last %}\n                    {{- ", " }}\n                {%- else %}\n                    {{- "]" }}\n                {%- endif %}\n            {%- endfor %}\n            {{- "[/AVAILABLE_TOOLS]" }}\n            {%- endif %}\n        {%- if loop.last and system_message is defined %}\n            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}\n        {%- else %}\n            {{- "[INST] " + message["content"] + "[/INST]" }}\n        {%- endif %}\n    {%- elif message.tool_calls is defined and message.tool_calls is not none %}\n        {{- "[TOOL_CALLS] [" }}\n        {%- for tool_call in message.tool_calls %}\n            {%- set out = tool_call.function|tojson %}\n            {{- out[:-1] }}\n            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n            {%- endif %}\n            {{- \', "id": "\' + tool_call.id + \'"}\' }}\n            {%- if not loop.last %}\n                {{- ", " }}\n            {%- else %}\n                {{- "]" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n    {%- elif message["role"] == "assistant" %}\n        {{- " " + message["content"]|trim + eos_token}}\n    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}\n        {%- if message.content is defined and message.content.content is defined %}\n            {%- set content = message.content.content %}\n        {%- else %}\n            {%- set content = message.content %}\n        {%- endif %}\n        {{- \'[TOOL_RESULTS] {"content": \' + content|string + ", " }}\n        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n        {%- endif %}\n        {{- \'"call_id": "\' + message.tool_call_id + \'"}[/TOOL_RESULTS]\' }}\n    {%- else %}\n        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}\n    {%- endif %}\n{%- endfor %}\n'

# mistralai/Mistral-7B-Instruct-v0.2 tokenizer_config.json as first published
# (no system prompt); llama.cpp renders it with its plain "llama2" format.
MISTRAL_V02_OLD = r"""{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"""

# mistralai/Mistral-7B-Instruct-v0.2 tokenizer_config.json as revised by
# Mistral (their "v1" format, system prompt allowed).
MISTRAL_V1 = "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n"

# openai/gpt-oss-120b chat_template.jinja (harmony), kept beside the references
# because of its size. llama.cpp renders its own fixed harmony subset, not this
# template (no system preamble, no channels), so "jinja_equal" is false there.
with open(os.path.join(ROOT, "tests", "data", "chat", "gpt-oss.jinja"), encoding="utf-8") as _f:
    GPT_OSS = _f.read()

TEMPLATES = [
    # name, source, template, expected family, expected variant, eos_token for jinja
    ("gemma3", "google/gemma-3-4b-it tokenizer_config.json", GEMMA3, "gemma", "gemma", "<eos>"),
    ("llama2", "meta-llama/Llama-2-7b-chat-hf tokenizer_config.json", LLAMA2, "llama2", "llama2-sys-strip", "</s>"),
    ("llama3", "meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json", LLAMA3, "llama3", "llama3", "<|end_of_text|>"),
    ("chatml", "teknium/OpenHermes-2.5-Mistral-7B tokenizer_config.json", CHATML, "chatml", "chatml", "<|im_end|>"),
    ("mistral_v3", "mistralai/Mistral-7B-Instruct-v0.3 tokenizer_config.json", MISTRAL_V3, "mistral", "mistral-v3", "</s>"),
    ("mistral_v1", "mistralai/Mistral-7B-Instruct-v0.2 tokenizer_config.json (revised)", MISTRAL_V1, "mistral", "mistral-v1", "</s>"),
    ("gpt_oss", "openai/gpt-oss-120b chat_template.jinja (tests/data/chat/gpt-oss.jinja)", GPT_OSS, "gpt-oss", "gpt-oss", "<|return|>"),
    ("mistral_v02_old", "mistralai/Mistral-7B-Instruct-v0.2 tokenizer_config.json (original)", MISTRAL_V02_OLD, "llama2", "llama2", "</s>"),
]

# Names llama.cpp accepts in place of a template; rendered with the same conversations.
NAMED = ["llama2-sys", "llama2-sys-bos", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken"]

CONVERSATIONS = {
    "user_only": [("user", "Hello!")],
    "system_user": [("system", "You are a helpful assistant."), ("user", "What is the capital of France?")],
    "multi_turn": [
        ("system", "Answer briefly."),
        ("user", "Hi"),
        ("assistant", "Hello! How can I help?"),
        ("user", "Name a prime number."),
    ],
    "ends_with_assistant": [
        ("user", "2+2?"),
        ("assistant", "4"),
        ("user", "And 3+3?"),
        ("assistant", "6"),
    ],
    "whitespace": [
        ("system", "  Be terse.\n"),
        ("user", "\n  Hi there  \n"),
        ("assistant", "   I am an assistant   "),
        ("user", "Another question\t"),
    ],
    "unicode_multiline": [
        ("user", "Grüße aus Köln 🙂\nZweite Zeile"),
        ("assistant", "Hallo! 你好"),
        ("user", "Line one\n\nLine three"),
    ],
}


def llama_cpp_apply(tmpl, msgs, add_ass):
    arr = (llama_cpp.llama_chat_message * len(msgs))()
    keep = []
    for i, (role, content) in enumerate(msgs):
        rb, cb = role.encode(), content.encode()
        keep += [rb, cb]
        arr[i].role = rb
        arr[i].content = cb
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(tmpl.encode(), arr, len(msgs), add_ass, buf, len(buf))
    if n < 0:
        raise RuntimeError("llama.cpp did not recognise the template")
    assert n < len(buf)
    return buf.raw[:n].decode()


def jinja_apply(tmpl, msgs, add_ass, eos):
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    # A fixed date keeps the harmony template's system preamble reproducible.
    env.globals["strftime_now"] = lambda fmt: "2026-12-07"
    try:
        return env.from_string(tmpl).render(
            messages=[{"role": r, "content": c} for r, c in msgs],
            bos_token="", eos_token=eos, add_generation_prompt=add_ass)
    except jinja2.exceptions.TemplateError:
        return None


def cases_for(tmpl, eos):
    out = []
    for conv_name, msgs in CONVERSATIONS.items():
        for add in (True, False):
            ref = llama_cpp_apply(tmpl, msgs, add)
            case = {
                "conversation": conv_name,
                "add_generation_prompt": add,
                "llama_cpp": ref,
            }
            if eos is not None:
                jin = jinja_apply(tmpl, msgs, add, eos)
                case["jinja"] = jin
                case["jinja_equal"] = jin == ref
            out.append(case)
    return out


def phi3_template():
    try:
        import gguf
    except ImportError:
        return None
    if not os.path.exists(PHI3_VOCAB):
        return None
    f = gguf.GGUFReader(PHI3_VOCAB).fields.get("tokenizer.chat_template")
    return None if f is None else bytes(f.parts[f.data[0]]).decode()


def main():
    doc = {
        "generator": "scripts/gen_chat_refs.py",
        "llama_cpp_python": llama_cpp.__version__,
        "jinja2": jinja2.__version__,
        "conversations": {k: [{"role": r, "content": c} for r, c in v] for k, v in CONVERSATIONS.items()},
        "templates": [],
        "named": [],
        "unsupported": [],
    }
    for name, source, tmpl, family, variant, eos in TEMPLATES:
        doc["templates"].append({
            "name": name, "source": source, "template": tmpl,
            "family": family, "variant": variant,
            "cases": cases_for(tmpl, eos),
        })
    for name in NAMED:
        doc["named"].append({"name": name, "cases": cases_for(name, None)})

    # Real templates of formats Tandem does not render: detect must refuse them.
    phi3 = phi3_template()
    if phi3 is not None:
        doc["unsupported"].append({"name": "phi3", "source": PHI3_VOCAB, "template": phi3})
    doc["unsupported"].append({
        "name": "zephyr", "source": "TinyLlama/TinyLlama-1.1B-Chat-v1.0 tokenizer_config.json (zephyr format)",
        "template": "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}",
    })

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n = sum(len(t["cases"]) for t in doc["templates"] + doc["named"])
    print(f"wrote {OUT}: {len(doc['templates'])} templates, {len(doc['named'])} names, {n} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
