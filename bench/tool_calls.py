#!/usr/bin/env python3
"""Tool-call validity: N chat requests with tool_choice "required" over five function schemas of
different shapes (nested objects, enums, arrays, integers, a mix), sent with the official openai
client to a `tandem serve` this script starts. Reports the share of calls whose arguments are
valid instances of the called function's schema (the grammar's promise: 100%), and, as a measure
of the model rather than of the grammar, the share that called the function the prompt asked for.

Validation: a checker written here for the keywords the schemas use (type, properties, required,
additionalProperties, enum, items, minItems, maxItems), and the `jsonschema` package as well when
it can be imported (a second, independent validator).

  .venv/bin/python bench/tool_calls.py [--model PATH] [--n 100]
"""

import argparse
import concurrent.futures
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

S = lambda: {"type": "string"}  # noqa: E731
I = lambda: {"type": "integer"}  # noqa: E731

FUNCTIONS = [
    ("create_event", "Put an event in the calendar", {
        "type": "object", "additionalProperties": False, "required": ["title", "when", "place"],
        "properties": {
            "title": S(),
            "when": {"type": "object", "additionalProperties": False, "required": ["date", "time"],
                     "properties": {"date": S(), "time": S()}},
            "place": {"type": "object", "additionalProperties": False, "required": ["city"],
                      "properties": {"city": S(), "room": S()}}}}),
    ("set_thermostat", "Set a room's heating or cooling", {
        "type": "object", "additionalProperties": False, "required": ["room", "mode", "fan"],
        "properties": {"room": {"enum": ["kitchen", "bedroom", "office", "living room"]},
                       "mode": {"enum": ["heat", "cool", "off"]},
                       "fan": {"enum": ["low", "medium", "high", "auto"]}}}),
    ("add_to_cart", "Add products to the shopping cart", {
        "type": "object", "additionalProperties": False, "required": ["items"],
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {
            "type": "object", "additionalProperties": False, "required": ["product", "quantity"],
            "properties": {"product": S(), "quantity": I()}}}}}),
    ("set_timer", "Start a countdown timer", {
        "type": "object", "additionalProperties": False, "required": ["hours", "minutes", "seconds"],
        "properties": {"hours": I(), "minutes": I(), "seconds": I(), "label": S()}}),
    ("book_flight", "Book a flight", {
        "type": "object", "additionalProperties": False, "required": ["origin", "destination", "passengers", "cabin"],
        "properties": {"origin": S(), "destination": S(), "passengers": I(),
                       "cabin": {"enum": ["economy", "business", "first"]},
                       "stops": {"type": "array", "items": S(), "maxItems": 2},
                       "flexible": {"type": "boolean"}}}),
]

PROMPTS = {
    "create_event": ["Schedule a team lunch on May 3 at noon in Berlin.", "Add a dentist appointment for "
                     "tomorrow at 9:30 in Oslo, room 4.", "Put the book club on Friday at 7pm in Lyon.",
                     "Create an event: product launch, June 1st, 10:00, San Francisco."],
    "set_thermostat": ["Make the bedroom warmer, fan on low.", "Cool down the office with the fan on high.",
                       "Turn the kitchen heating off.", "Heat the living room, fan on auto."],
    "add_to_cart": ["Add two apples and a loaf of bread to my cart.", "I need 3 notebooks and 10 pencils.",
                    "Put one pair of running shoes in the cart.", "Add 6 eggs, 1 milk and 2 butter."],
    "set_timer": ["Set a timer for 1 hour and 30 minutes.", "Timer for 45 seconds please.",
                  "Count down 2 hours, label it laundry.", "Start a 10 minute tea timer."],
    "book_flight": ["Book a flight from Paris to Tokyo for two people in business.",
                    "One economy seat from Boston to Denver, with a stop in Chicago.",
                    "Fly me and my wife first class from Rome to New York, dates flexible.",
                    "I need 4 economy tickets from Madrid to Lisbon."],
}


def check(value, schema, path="$"):
    """Errors of `value` against `schema` (the keywords FUNCTIONS use); [] when valid."""
    errs = []
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} not in enum")
    t = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    if t == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            errs.append(f"{path}: not an integer")
    elif t in types and (not isinstance(value, types[t]) or (t != "boolean" and isinstance(value, bool))):
        errs.append(f"{path}: not a {t}")
    elif t == "object":
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            if k not in value:
                errs.append(f"{path}: missing {k}")
        for k, v in value.items():
            if k in props:
                errs += check(v, props[k], f"{path}.{k}")
            elif schema.get("additionalProperties") is False:
                errs.append(f"{path}: unexpected {k}")
    elif t == "array":
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", 1 << 30):
            errs.append(f"{path}: {len(value)} items")
        for i, v in enumerate(value):
            errs += check(v, schema.get("items", {}), f"{path}[{i}]")
    return errs


def start_server(cli, model, threads):
    log = tempfile.NamedTemporaryFile(prefix="tandem-bench-tools-", suffix=".log", delete=False)
    proc = subprocess.Popen([cli, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-t", str(threads),
                             "--ctx-size", "2048"], stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", Path(log.name).read_text(errors="replace"))
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            sys.exit(f"server exited:\n{Path(log.name).read_text()}")
        time.sleep(0.1)
    proc.kill()
    sys.exit("server did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path.home() / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--cli", default=os.environ.get("TANDEM_CLI", "build/tandem"))
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    a = ap.parse_args()
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": p}}
             for n, d, p in FUNCTIONS]
    schemas = {n: p for n, _, p in FUNCTIONS}
    proc, port = start_server(a.cli, a.model, a.threads)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=300)
    model_id = c.models.list().data[0].id
    valid = intended = calls_total = 0
    failures = []

    def one(i):
        name = FUNCTIONS[i % len(FUNCTIONS)][0]
        prompt = PROMPTS[name][(i // len(FUNCTIONS)) % len(PROMPTS[name])]
        r = c.chat.completions.create(model=model_id, messages=[{"role": "user", "content": prompt}], tools=tools,
                                      tool_choice="required", parallel_tool_calls=False, max_tokens=a.max_tokens,
                                      temperature=a.temperature, seed=i)
        return i, name, prompt, r

    t0 = time.monotonic()
    try:
        # Concurrent requests share engine steps (continuous batching); each is seeded, so the
        # answers do not depend on the concurrency.
        with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
            results = sorted(pool.map(one, range(a.n)), key=lambda x: x[0])
        for i, name, prompt, r in results:
            ch = r.choices[0]
            calls = ch.message.tool_calls or []
            ok = ch.finish_reason == "tool_calls" and len(calls) == 1
            errs = [] if ok else [f"finish_reason {ch.finish_reason}, {len(calls)} calls"]
            for call in calls:
                calls_total += 1
                try:
                    args = json.loads(call.function.arguments)
                except json.JSONDecodeError as e:
                    errs.append(f"arguments do not parse: {e}")
                    continue
                if call.function.name not in schemas:
                    errs.append(f"unknown function {call.function.name}")
                    continue
                errs += check(args, schemas[call.function.name])
                if jsonschema is not None:
                    try:
                        jsonschema.validate(args, schemas[call.function.name])
                    except jsonschema.ValidationError as e:
                        errs.append(f"jsonschema: {e.message}")
                intended += call.function.name == name
            if errs:
                failures.append((i, prompt, [x.function.model_dump() for x in calls], errs))
            else:
                valid += 1
    finally:
        proc.terminate()
        proc.wait()
    dt = time.monotonic() - t0
    print(f"requests: {a.n}, tool_choice required, 5 schemas, temperature {a.temperature}, max_tokens "
          f"{a.max_tokens}, concurrency {a.concurrency}, model {Path(a.model).name}")
    print(f"validators: built-in checker{' + jsonschema ' + importlib.metadata.version('jsonschema') if jsonschema else ''}")
    print(f"valid arguments of the called function's schema: {valid}/{a.n} = {100.0 * valid / a.n:.1f}%")
    print(f"called the function the prompt asked for: {intended}/{a.n} = {100.0 * intended / a.n:.1f}%")
    print(f"wall time: {dt:.1f} s")
    for f in failures[:10]:
        print("FAIL", f)
    return 0 if valid == a.n else 1


if __name__ == "__main__":
    sys.exit(main())
