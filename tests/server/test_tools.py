"""Tool calling in /v1/chat/completions through the official openai client, on Gemma 3 270M:
the call loop, every tool_choice, streamed deltas, parallel calls, and the 400s."""

import json

import openai
import pytest

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
