"""Tool calling in /v1/chat/completions through the official openai client, on Gemma 3 270M:
the call loop, every tool_choice, streamed deltas, parallel calls, and the 400s; and "auto" on the
families whose calls open with a control token (Mistral's [TOOL_CALLS], Llama 3's <|python_tag|>),
on random-weight models with those vocabularies and chat templates."""

import json

import openai
import pytest

from harness import STORIES, Server, run_cli

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "required": ["city", "unit"], "additionalProperties": False,
                   "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "required": ["utc_offset"],
                   "properties": {"utc_offset": {"type": "integer"}}}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def check_call(call, names=("get_weather", "get_time")):
    """The call is well formed and its arguments fit its function's schema."""
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and isinstance(args["city"], str)
        assert args["unit"] in ("celsius", "fahrenheit")
    else:
        assert set(args) == {"utc_offset"} and isinstance(args["utc_offset"], int)
    return args


def create(c, **kw):
    kw.setdefault("max_tokens", 40)
    kw.setdefault("temperature", 0)
    return c.chat.completions.create(model="gemma-test", **kw)


def weather_call(call_id, city):
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}}]}


# Two earlier rounds of call and result: with them in the history, the model writes Gemma's call
# marker on its own, which is what "auto" waits for.
TWO_ROUNDS = [{"role": "user", "content": "What is the weather in Oslo?"}, weather_call("c1", "Oslo"),
              {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 3}'},
              {"role": "user", "content": "What is the weather in Rome?"}, weather_call("c2", "Rome"),
              {"role": "tool", "tool_call_id": "c2", "content": '{"temperature": 20}'}] + ASK


def test_tool_loop_call_result_answer(gemma):
    c = gemma.client()
    r = create(c, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None and len(ch.message.tool_calls) == 1
    call = ch.message.tool_calls[0]
    check_call(call)
    # The call and its result go back into the history; the model answers in text.
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'}]
    r2 = create(c, messages=history, tools=TOOLS, tool_choice="none", max_tokens=16)
    assert r2.choices[0].message.tool_calls is None
    assert r2.choices[0].finish_reason in ("stop", "length") and r2.choices[0].message.content
    # Both were rendered into the prompt: the call's arguments and the result's text are tokens there.
    bare = create(c, messages=ASK, tool_choice="none", max_tokens=1)
    assert r2.usage.prompt_tokens > bare.usage.prompt_tokens + 30


def test_streamed_deltas_reassemble_the_call(gemma):
    c = gemma.client()
    cases = [(ASK, "required"), (ASK, {"type": "function", "function": {"name": "get_time"}}), (TWO_ROUNDS, "auto")]
    for msgs, choice in cases:
        whole = create(c, messages=msgs, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
        want = whole.choices[0].message.tool_calls
        assert want and whole.choices[0].finish_reason == "tool_calls"
        chunks = list(create(c, messages=msgs, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                             stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        calls = {}
        for ch in chunks:
            for d in ch.choices[0].delta.tool_calls or []:
                if d.index not in calls:
                    # The first delta of a call: its index, id, type and name, and empty arguments.
                    assert d.id and d.type == "function" and d.function.name and d.function.arguments == ""
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                else:
                    assert d.id is None and d.function.name is None and d.function.arguments
                    calls[d.index]["arguments"] += d.function.arguments
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert [(x["name"], x["arguments"]) for x in (calls[i] for i in sorted(calls))] == \
            [(w.function.name, w.function.arguments) for w in want]
        assert all(x["id"].startswith("call_") for x in calls.values())


def test_every_tool_choice(gemma):
    c = gemma.client()
    # none: plain text, no calls.
    r = create(c, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    # named: exactly that function.
    r = create(c, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
               parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert len(calls) == 1 and calls[0].function.name == "get_time"
    check_call(calls[0], names=("get_time",))
    # required: one of them.
    r = create(c, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1
    check_call(r.choices[0].message.tool_calls[0])
    # auto (the default with tools): text where the model writes no marker...
    r = create(c, messages=ASK, tools=TOOLS, max_tokens=12)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    # ... and a call where it does, after two rounds of calls in the history.
    r = create(c, messages=TWO_ROUNDS, tools=TOOLS, tool_choice="auto", parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    assert check_call(r.choices[0].message.tool_calls[0])["city"] == "Paris"


def test_parallel_calls(gemma):
    c = gemma.client()
    # Greedy, this model makes a second call after the first; each is whole and fits its schema.
    r = create(c, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60)
    calls = r.choices[0].message.tool_calls
    assert len(calls) >= 2
    for call in calls[:-1] if r.choices[0].finish_reason == "length" else calls:
        check_call(call)
    assert len({call.id for call in calls}) == len(calls)
    # parallel_tool_calls false: one call, and the answer ends there.
    r = create(c, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60, parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1
    assert r.usage.completion_tokens < 60


@pytest.mark.parametrize("body,param,words", [
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}}}}]},
     "tools[1].function.parameters", "minimum"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[1].function.parameters", "object"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "function"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name", "letters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_wind"}}}, "tool_choice",
     "get_wind"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"messages": ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "3"}]}, "messages[1].tool_call_id",
     "call_x"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_time", "arguments": "{not json"}}]}]}, "messages[1].tool_calls[0].function.arguments", "JSON"),
])
def test_bad_tool_requests_are_400s_naming_the_field(gemma, body, param, words):
    c = gemma.client()
    kw = {"messages": ASK, "max_tokens": 4, **body}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="gemma-test", **kw)
    err = e.value.body
    assert err["param"] == param, err
    assert param in err["message"] or param.startswith("tool_choice"), err
    assert words in err["message"], err


# Random-weight models of the families whose call marker is a control token: stories260K's
# vocabulary with the family's control tokens added and a chat template that selects it.
FAMILIES = {
    "llama3": ("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}",
               ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"], "<|python_tag|>"),
    "mistral": ("{{ '[INST]' + message['content'] + '[/INST]' }}{# [AVAILABLE_TOOLS] #}",
                ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                 "[/TOOL_RESULTS]"], "[TOOL_CALLS]"),
}


def family_model(directory, family, with_marker=True):
    """A one-layer synth model whose vocab and chat template are the family's; its marker's id."""
    import gguf
    template, added, marker = FAMILIES[family]
    if not with_marker:
        added = [t for t in added if t != marker]
    r = gguf.GGUFReader(STORIES)
    field = r.fields
    tokens = [bytes(field["tokenizer.ggml.tokens"].parts[i]).decode() for i in field["tokenizer.ggml.tokens"].data]
    scores = [float(field["tokenizer.ggml.scores"].parts[i][0]) for i in field["tokenizer.ggml.scores"].data]
    types = [int(field["tokenizer.ggml.token_type"].parts[i][0]) for i in field["tokenizer.ggml.token_type"].data]
    assert tokens[HE] == "\u2581He"
    base = len(tokens)
    tokens += added
    scores += [0.0] * len(added)
    types += [gguf.TokenType.CONTROL] * len(added)
    vocab = str(directory / f"{family}-vocab.gguf")
    w = gguf.GGUFWriter(vocab, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types([int(t) for t in types])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model = str(directory / f"{family}{'' if with_marker else '-nomarker'}.gguf")
    run_cli("synth", "-o", model, "--vocab-from", vocab, "--layers", "1", "--seed", "7")
    return model, (base + added.index(marker) if with_marker else None)


# Arguments of bounded length, which a random-weight model finishes well within max_tokens.
SET_UNIT = {"type": "function", "function": {
    "name": "set_unit", "parameters": {"type": "object", "required": ["unit"], "additionalProperties": False,
                                       "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}}}}
SHORT = [TIME, SET_UNIT]
HE = 346  # stories260K's "▁He"


def check_short_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    if call.function.name == "set_unit":
        assert args in ({"unit": "celsius"}, {"unit": "fahrenheit"})
    else:
        assert call.function.name == "get_time"
        assert set(args) == {"utc_offset"} and isinstance(args["utc_offset"], int)


@pytest.fixture(scope="module", params=["llama3", "mistral"])
def family(request, tmp_path_factory):
    path, marker_id = family_model(tmp_path_factory.mktemp("tools"), request.param)
    srv = Server(path, "--ctx-size", "1024", "--model-alias", "gemma-test")
    yield request.param, srv, marker_id
    rc = srv.stop()
    assert rc == 0, f"server exited with {rc} on SIGTERM:\n{srv.log_text()}"


def test_auto_opens_calls_at_the_control_token_marker(family):
    name, srv, marker = family
    c = srv.client()
    marker_text = FAMILIES[name][2]
    # The marker forced by a bias: a call follows, of an allowed name with arguments of its schema.
    kw = dict(messages=ASK, tools=SHORT, tool_choice="auto", parallel_tool_calls=False, max_tokens=100,
              logit_bias={str(marker): 100})
    r = create(c, **kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert len(ch.message.tool_calls) == 1 and ch.message.content is None
    check_short_call(ch.message.tool_calls[0])
    # Text, then the marker: a token biased above it, its frequency penalty (2 per use) letting the
    # marker win after some. Streamed: content deltas, then the call's deltas, adding up to the
    # whole answer; the marker's text is in neither.
    kw["logit_bias"] = {str(HE): 100, str(marker): 80}
    kw["frequency_penalty"] = 2
    r = create(c, **kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content.strip().startswith("He") and marker_text not in ch.message.content
    check_short_call(ch.message.tool_calls[0])
    chunks = list(create(c, stream=True, **kw))
    content, call = "", {"name": None, "arguments": ""}
    for chunk in chunks:
        d = chunk.choices[0].delta
        if d.content:
            assert call["name"] is None  # no content once the call began
            content += d.content
        for t in d.tool_calls or []:
            assert t.index == 0
            if t.function.name:
                assert call["name"] is None and t.id.startswith("call_") and t.function.arguments == ""
                call["name"] = t.function.name
            call["arguments"] += t.function.arguments or ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    want = ch.message.tool_calls[0].function
    assert (content, call["name"], call["arguments"]) == (ch.message.content, want.name, want.arguments)
    # The marker forbidden: content only, streamed or not, and never the marker's text.
    kw = dict(messages=ASK, tools=SHORT, tool_choice="auto", max_tokens=24, logit_bias={str(marker): -100})
    r = create(c, **kw)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason != "tool_calls"
    assert marker_text not in r.choices[0].message.content
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in create(c, stream=True, **kw))
    assert streamed == r.choices[0].message.content
    # Left to the model (greedy, random weights): whatever it writes, the marker's text is no content.
    r = create(c, messages=ASK, tools=SHORT, tool_choice="auto", max_tokens=24)
    assert marker_text not in (r.choices[0].message.content or "")
    for call in r.choices[0].message.tool_calls or []:
        check_short_call(call)


def test_auto_is_refused_where_the_vocab_lacks_the_marker(tmp_path):
    # Mistral's marker is only a control token: without it in the vocabulary, "auto" cannot work.
    path, _ = family_model(tmp_path, "mistral", with_marker=False)
    srv = Server(path, "--ctx-size", "512", "--model-alias", "gemma-test")
    try:
        c = srv.client()
        with pytest.raises(openai.BadRequestError) as e:
            create(c, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=4)
        err = e.value.body
        assert err["param"] == "tool_choice" and "[TOOL_CALLS]" in err["message"], err
        # required still works: it needs no marker.
        r = create(c, messages=ASK, tools=SHORT, tool_choice="required", parallel_tool_calls=False, max_tokens=100)
        assert r.choices[0].finish_reason == "tool_calls"
        check_short_call(r.choices[0].message.tool_calls[0])
    finally:
        assert srv.stop() == 0
