"""Chat templates render exactly as transformers' apply_chat_template renders them.

The templates below are written for this test (not copied from any checkpoint), each using the
Jinja features of a family's real template (checked against the published templates of Llama 3.x,
Qwen2/2.5, Mistral, Gemma, Phi-3 and SmolLM2/3): whitespace control, trim_blocks/lstrip_blocks,
`is defined` defaults, strftime_now, list slicing and reversal, `namespace` updated inside loops,
`{% break %}`, `tojson` (with indent), `trim`, string methods, `raise_exception`, role checks with
`loop.index0`, bos_token/eos_token, tools and tool calls, `{% generation %}`, `dict(...)`.
Each is saved with a transformers tokenizer (save_pretrained), loaded back by handformer from
that directory, and compared: the text, and the token ids.
"""

from __future__ import annotations

import json

import pytest
import transformers
from tokenizers import AddedToken

from handformer.data.tokenizer import Tokenizer
from handformer.generation.chat_template import ChatTemplate, load_chat_template

LLAMA3_LIKE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "1 Jan 2025" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_text = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_text = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\nDate: " + date_string + "\\n" }}
{%- if tools is not none %}
    {{- "You can call these functions:\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_text + "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.tool_calls is defined and message.tool_calls %}
        {%- if message.tool_calls | length != 1 %}
            {{- raise_exception("one tool call per message, please") }}
        {%- endif %}
        {%- set call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN2_LIKE = """{%- if messages[0].role == 'system' %}
    {%- set system = messages[0].content %}
{%- else %}
    {%- set system = 'Be helpful.' %}
{%- endif %}
{{- '<|im_start|>system\\n' + system }}
{%- if tools %}
    {{- "\\n\\nTools:" }}
    {%- for tool in tools %}
        {{- "\\n" + tool | tojson }}
    {%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant' }}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<call>' + tool_call.name + ' ' + tool_call.arguments | tojson + '</call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<result>' + message.content + '</result>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

MISTRAL_LIKE = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("roles must alternate user, assistant, user, ... after the system message") }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"] | trim + eos_token }}
    {%- else %}
        {{- raise_exception("unknown role " + message["role"]) }}
    {%- endif %}
{%- endfor %}
"""

GEMMA_LIKE = """{{ bos_token }}
{% if messages[0]['role'] == 'system' %}
{{ raise_exception('no system role here') }}
{% endif %}
{% for message in messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('user and assistant must take turns') }}
    {% endif %}
    {% if message['role'] == 'assistant' %}
        {% set role = 'model' %}
    {% else %}
        {% set role = message['role'] %}
    {% endif %}
{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}
{% endfor %}
{% if add_generation_prompt %}
{{ '<start_of_turn>model\\n' }}
{% endif %}
"""

PHI3_LIKE = """{% for message in messages %}
    {% if message['role'] == 'system' %}
        {{- '<|system|>\\n' + message['content'] + '<|end|>\\n' -}}
    {% elif message['role'] == 'user' %}
        {{- '<|user|>\\n' + message['content'] + '<|end|>\\n' -}}
    {% elif message['role'] == 'assistant' %}
        {{- '<|assistant|>\\n' + message['content'] + '<|end|>\\n' -}}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|assistant|>\\n' }}
{% else %}
{{ eos_token }}
{% endif %}
"""

SMOLLM_LIKE = """{%- set ns = namespace(last_user=-1) %}
{%- for m in messages[::-1] %}
    {%- if m.role == 'user' %}
        {%- set ns.last_user = messages | length - 1 - loop.index0 %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if loop.first and messages[0]['role'] != 'system' %}
        {{- '<|im_start|>system\\nYou are a small, kind assistant.<|im_end|>\\n' }}
    {%- endif %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'assistant' %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
        {{- content + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- else %}
        {%- set meta = dict(turn=loop.index0, last=(loop.index0 == ns.last_user)) %}
        {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- if meta.last and content.startswith('/') %}
            {{- ' [command ' + meta.turn | string + ']' }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# name -> (template, bos_token, eos_token, does it take a system message and tools)
TEMPLATES = {
    "llama3": (LLAMA3_LIKE, "<|begin_of_text|>", "<|eot_id|>", True),
    "qwen2": (QWEN2_LIKE, None, "<|im_end|>", True),
    "mistral": (MISTRAL_LIKE, "<s>", "</s>", True),
    "gemma": (GEMMA_LIKE, "<bos>", "<eos>", False),
    "phi3": (PHI3_LIKE, "<s>", "<|endoftext|>", True),
    "smollm2": (SMOLLM_LIKE, None, "<|im_end|>", True),
}
SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>",
            "<|im_end|>", "[INST]", "[/INST]", "<s>", "</s>", "<bos>", "<eos>", "<start_of_turn>",
            "<end_of_turn>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, «now»",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CONVERSATIONS = {
    "one_user": [{"role": "user", "content": "  Hello there!  "}],
    "system_and_turns": [
        {"role": "system", "content": "You answer briefly. "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": " Four. "},
        {"role": "user", "content": "And 日本語 with \"quotes\"?"}],
    "turns_no_system": [
        {"role": "user", "content": "/help me"},
        {"role": "assistant", "content": "<think>they want help</think>\nSure."},
        {"role": "user", "content": "/thanks"},
        {"role": "assistant", "content": "You're welcome.", "tool_calls": None}],
}
TOOL_CONVERSATION = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "22°C"},
    {"role": "tool", "content": "sunny"},
    {"role": "user", "content": "Thanks"}]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    tok = Tokenizer.train_bpe(["Hello there, what is the weather in Paris? Four. Thanks!"] * 5, 300)
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(path)
    return path


def _pair(name, tokenizer_file, tmp_path):
    """transformers' tokenizer with the template, saved and loaded back by handformer."""
    template, bos, eos, _ = TEMPLATES[name]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), bos_token=bos,
                                              eos_token=eos, chat_template=template)
    hf.save_pretrained(tmp_path)
    ours = load_chat_template(tmp_path)
    assert ours is not None and ours.source == template
    return hf, ours, Tokenizer.load(tmp_path / "tokenizer.json")


def _ids(encoded):
    return list(encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_templates_render_as_transformers(name, tokenizer_file, tmp_path):
    hf, ours, tok = _pair(name, tokenizer_file, tmp_path)
    cases = [(c, g) for c in CONVERSATIONS.values() for g in (True, False)]
    if TEMPLATES[name][3]:
        cases.append((TOOL_CONVERSATION if name in ("llama3", "qwen2") else CONVERSATIONS["system_and_turns"], True))
    rendered = 0
    for messages, gen in cases:
        try:
            expected = hf.apply_chat_template(messages, tools=TOOLS if messages is TOOL_CONVERSATION else None,
                                              tokenize=False, add_generation_prompt=gen, date_string="3 Mar 2026")
        except Exception as err:  # this family's template refuses this conversation: so must ours
            with pytest.raises(ValueError, match=str(err.message if hasattr(err, "message") else err)[:20]):
                ours.render(messages, add_generation_prompt=gen, date_string="3 Mar 2026")
            continue
        got = ours.render(messages, add_generation_prompt=gen, tools=TOOLS if messages is TOOL_CONVERSATION else None,
                          date_string="3 Mar 2026")
        assert got == expected
        ids = _ids(hf.apply_chat_template(messages, tools=TOOLS if messages is TOOL_CONVERSATION else None,
                                          tokenize=True, add_generation_prompt=gen, date_string="3 Mar 2026"))
        assert tok.encode_with_special_tokens(got) == ids
        rendered += 1
    assert rendered >= 4
    # strftime_now: today's date, as transformers renders it
    if name == "llama3":
        for _ in range(2):  # a second try if the two renders straddled midnight
            got = ours.render(CONVERSATIONS["one_user"])
            expected = hf.apply_chat_template(CONVERSATIONS["one_user"], tokenize=False,
                                              add_generation_prompt=True)
            if got == expected:
                break
        assert got == expected


def test_template_sources_and_priority(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ bos_token }}A{{ messages | length }}", "bos_token": {"content": "<s>"}}))
    assert load_chat_template(tmp_path).render([{"role": "user", "content": "x"}]) == "<s>A1"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert load_chat_template(tmp_path).render([]) == "D"
    (tmp_path / "chat_template.jinja").write_text("J{{ eos_token }}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "C", "eos_token": "</s>"}))
    assert load_chat_template(tmp_path).render([]) == "J</s>"  # the .jinja file wins, as in transformers
    assert load_chat_template(tmp_path / "nowhere") is None


@pytest.mark.parametrize("source, message", [
    ("{% for m in messages %}{{ m.content }}", r"not a valid Jinja template: line 1: .*endfor"),
    ("{{ raise_exception('roles must alternate') }}", "failed to render: roles must alternate"),
    ("{{ messages.__class__.__mro__ }}", "sandbox forbids"),
    ("{% set ns = namespace(_x=1) %}", "sandbox forbids.*'_x'"),
    ("{{ messages.append(1) }}", "sandbox forbids"),
    ("{{ messages[0].content.upper() + 1 }}", "failed to render"),
    ("{{ messages[5]['content'] | trim }}", "failed to render"),
])
def test_bad_templates_are_clear_errors_where_transformers_fails_too(source, message, tokenizer_file):
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), chat_template=source)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(Exception):  # noqa: B017 (transformers raises jinja2's own error types)
        hf.apply_chat_template(messages, tokenize=False)
    with pytest.raises(ValueError, match=message):
        ChatTemplate(source, origin="test template").render(messages)


def test_bad_template_files_name_the_file(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": 3}')
    with pytest.raises(ValueError, match="tokenizer_config.json's chat_template must be a string"):
        load_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": [{"name": "x", "template": "T"}]}')
    with pytest.raises(ValueError, match="none named 'default'"):
        load_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer_config.json is not valid JSON"):
        load_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "chat_template.jinja").write_text("{% if %}")
    with pytest.raises(ValueError, match="chat_template.jinja is not a valid Jinja template: line 1"):
        load_chat_template(tmp_path)
    with pytest.raises(ValueError, match="message 0 must be a dict"):
        ChatTemplate("x").render(["hello"])
