"""The official `anthropic` Python package against a running `strata serve` (tests/it/server.rs starts it):
Anthropic's Messages API, text, streaming, tools and their results, token counting.

Usage: anthropic_client.py BASE_URL API_KEY. Exits 0 when every check passes, printing how many.
"""
import json
import sys

import anthropic

base_url, key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    assert cond, what
    checks += 1


ask = [{"role": "user", "content": "Name two planets."}]
msg = client.messages.create(model="any", max_tokens=20, system="You are brief.", messages=ask, extra_body={"temperature": 0})
check(msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_"), msg)
check(msg.content[0].type == "text" and msg.content[0].text, msg.content)
check(msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens > 0, msg)

# Streamed: the text the helper gathers is the whole reply's, and the final message says why it stopped.
with client.messages.stream(model="any", max_tokens=20, system="You are brief.", messages=ask,
                            extra_body={"temperature": 0}) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
check(text == msg.content[0].text, f"streamed {text!r} != {msg.content[0].text!r}")
check(final.stop_reason == msg.stop_reason and final.usage.output_tokens == msg.usage.output_tokens, final)

# Tools: tool_choice any gives a tool_use block valid under its schema, whole and streamed.
tools = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                             "unit": {"enum": ["celsius", "fahrenheit"]}},
                           "required": ["city", "unit"]}}]
weather = [{"role": "user", "content": "What is the weather in Paris?"}]
m = client.messages.create(model="any", max_tokens=200, messages=weather, tools=tools,
                           tool_choice={"type": "any", "disable_parallel_tool_use": True})
uses = [b for b in m.content if b.type == "tool_use"]
check(m.stop_reason == "tool_use" and len(uses) == 1, m)
check(uses[0].name == "get_weather" and set(uses[0].input) == {"city", "unit"}
      and uses[0].input["unit"] in ("celsius", "fahrenheit"), uses[0])
with client.messages.stream(model="any", max_tokens=200, messages=weather, tools=tools, extra_body={"temperature": 0},
                            tool_choice={"type": "tool", "name": "get_weather"}) as stream:
    final = stream.get_final_message()
uses = [b for b in final.content if b.type == "tool_use"]
check(final.stop_reason == "tool_use" and len(uses) >= 1 and uses[0].input.get("city"), final)
# The result goes back as a tool_result block.
follow = client.messages.create(model="any", max_tokens=30, tools=tools, extra_body={"temperature": 0}, messages=weather + [
    {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                                       "input": uses[0].input}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                  "content": "18 degrees and sunny"}]}])
check(follow.content[0].type == "text", follow)

count = client.messages.count_tokens(model="any", system="You are brief.", messages=ask)
check(count.input_tokens == msg.usage.input_tokens, f"count_tokens {count.input_tokens} vs {msg.usage.input_tokens}")

try:
    client.messages.create(model="any", max_tokens=10, messages=[])
    check(False, "an empty conversation was accepted")
except anthropic.BadRequestError as e:
    check(e.status_code == 400, e)

print(f"anthropic client {anthropic.__version__}: {checks} checks passed")
