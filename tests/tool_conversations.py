"""Seeded tool-calling conversations, as a reader hands them to the chat formats.

``tool_conversations(seed, n)`` makes ``(messages, tools)`` pairs in the normalised OpenAI form
(data/ROWS.md, "Tool calls"): tools ``{type: function, function: {name, description,
parameters}}``; answers with ``tool_calls`` ``[{id?, type: function, function: {name,
arguments}}]``; ``tool`` results. They vary what breaks masks: several calls in one answer, several
results in a row, reasoning, empty content, content beside calls, unicode, quotes, newlines and
numbers in arguments, nested arguments, arguments as objects or (``strings``) as JSON strings,
several steps, a second user turn. ``max_calls=1`` keeps one call per answer (Llama 3 raises on
more).
"""

from __future__ import annotations

import json
import random

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation — returns the top hits",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "filters": {"type": "object"},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert an amount between currencies",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number"},
                    "from": {"type": "string"},
                    "to": {"type": "string"},
                    "exact": {"type": "boolean"},
                },
            },
        },
    },
]
CITIES = ["Paris", "東京", "São Paulo", "Zürich", "New York", "Αθήνα", "Kraków 🙂"]
QUERIES = [
    "how to install",
    'say "hello" twice',
    "line one\nline two",
    "tabs\tand spaces  ",
    "naïve café",
    "path C:\\temp",
    "emoji 🚀 launch",
]
WORDS = ["sure", "let me check", "one moment", "Looking that up.", "ok", "こんにちは", "x"]


def _arguments(rng: random.Random, name: str) -> dict:
    if name == "get_weather":
        out = {"city": rng.choice(CITIES)}
        if rng.random() < 0.5:
            out["unit"] = rng.choice(["celsius", "fahrenheit"])
        if rng.random() < 0.5:
            out["days"] = rng.randint(0, 14)
        return out
    if name == "search_docs":
        out = {"query": rng.choice(QUERIES)}
        if rng.random() < 0.5:
            out["limit"] = rng.choice([1, 5, 10, 100])
        if rng.random() < 0.3:
            out["filters"] = {"lang": rng.choice(["en", "fr"]), "tags": ["a", "b"], "min": 0.5}
        return out
    out = {"amount": rng.choice([1, 2.5, 1e-3, 1234567, -3.75, 0])}
    out["from"], out["to"] = rng.sample(["EUR", "USD", "JPY", "CHF"], 2)
    if rng.random() < 0.5:
        out["exact"] = rng.random() < 0.5
    if rng.random() < 0.2:
        out["note"] = None
    return out


def _result(rng: random.Random, name: str) -> str:
    if rng.random() < 0.2:
        return rng.choice(["no results", "error: timeout", "", "結果なし"])
    value = {"ok": True, "value": rng.randint(-40, 40), "tool": name}
    return json.dumps(value, ensure_ascii=rng.random() < 0.5)


def _call_id(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(9))


def tool_conversation(
    rng: random.Random, max_calls: int = 3, strings: bool = False, ids: bool = True
) -> tuple[list[dict], list[dict]]:
    """One conversation and its tools."""
    tools = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    messages = []
    if rng.random() < 0.4:
        messages.append(
            {"role": "system", "content": rng.choice(["Be brief.", "You are an agent."])}
        )
    messages.append({"role": "user", "content": rng.choice(["Help me.", "What is up in Paris?"])})
    for _ in range(rng.randint(1, 3)):
        calls = []
        for _ in range(rng.randint(1, max_calls)):
            name = rng.choice(tools)["function"]["name"]
            arguments = _arguments(rng, name)
            call = {
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": json.dumps(arguments, ensure_ascii=False)
                    if strings
                    else arguments,
                },
            }
            if ids:
                call = {"id": _call_id(rng), **call}
            calls.append(call)
        answer = {"role": "assistant", "content": rng.choice(["", "", *WORDS]), "tool_calls": calls}
        if rng.random() < 0.4:
            answer["reasoning_content"] = rng.choice(["I should call a tool.", "Need data.\n"])
        messages.append(answer)
        for call in calls:
            result = {"role": "tool", "content": _result(rng, call["function"]["name"])}
            if ids:
                result["tool_call_id"] = call["id"]
            if rng.random() < 0.5:
                result["name"] = call["function"]["name"]
            messages.append(result)
    final = {"role": "assistant", "content": rng.choice(["Done: it is 18°C.", "All set.", "ok"])}
    if rng.random() < 0.4:
        final["reasoning_content"] = "The results are in."
    messages.append(final)
    if rng.random() < 0.2:
        messages += [{"role": "user", "content": "thanks"}, {"role": "assistant", "content": "Bye"}]
    return messages, tools


def tool_conversations(seed: int, n: int, **options) -> list[tuple[list[dict], list[dict]]]:
    rng = random.Random(seed)
    return [tool_conversation(rng, **options) for _ in range(n)]
