"""The official `openai` Python package against a running `strata serve` (tests/it/server.rs starts it).

Usage: openai_client.py BASE_URL API_KEY. Exits 0 when every check passes, printing how many; an assertion
or an unexpected exception fails it.
"""
import sys

import openai

base_url, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    assert cond, what
    checks += 1


models = client.models.list()
ids = [m.id for m in models.data]
check(ids and ids[0] == "SmolLM2-135M-Instruct.Q4_1", f"models: {ids}")
model = ids[0]

messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name two planets."}]
whole = client.chat.completions.create(model=model, messages=messages, temperature=0, seed=3, max_tokens=20)
text = whole.choices[0].message.content
check(isinstance(text, str) and text, "a chat reply")
check(whole.choices[0].finish_reason in ("stop", "length"), whole.choices[0].finish_reason)
check(whole.usage.prompt_tokens > 0 and whole.usage.completion_tokens > 0, whole.usage)
check(whole.usage.prompt_tokens_details.cached_tokens == 0, whole.usage)

stream = client.chat.completions.create(model=model, messages=messages, temperature=0, seed=3, max_tokens=20,
                                        stream=True, stream_options={"include_usage": True})
parts, usage = [], None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
check("".join(parts) == text, f"streamed {''.join(parts)!r} != {text!r}")
check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens, usage)
check(usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1, usage)

# Sampled with a seed: the same twice, streamed or not.
a = client.chat.completions.create(model=model, messages=messages, temperature=0.9, seed=11, max_tokens=12)
b = client.chat.completions.create(model=model, messages=messages, temperature=0.9, seed=11, max_tokens=12, stream=True)
check("".join(c.choices[0].delta.content or "" for c in b if c.choices) == a.choices[0].message.content, "seeded")

two = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=8, n=2)
check([c.index for c in two.choices] == [0, 1], "n=2")
check(two.choices[0].message.content == two.choices[1].message.content, "greedy choices agree")

lp = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=5, logprobs=True,
                                    top_logprobs=2)
content = lp.choices[0].logprobs.content
check(len(content) == 5 and all(len(t.top_logprobs) == 2 for t in content), "logprobs")
check(all(t.logprob <= 0 and t.top_logprobs[0].token == t.token for t in content), "greedy logprobs")
check("".join(t.token for t in content) == lp.choices[0].message.content, "logprob tokens spell the reply")

comp = client.completions.create(model=model, prompt="The sky is", max_tokens=8, temperature=0, logprobs=1)
check(comp.choices[0].text and len(comp.choices[0].logprobs.tokens) == 8, "completion")
streamed = "".join(c.choices[0].text for c in
                   client.completions.create(model=model, prompt="The sky is", max_tokens=8, temperature=0,
                                             stream=True) if c.choices)
check(streamed == comp.choices[0].text, "streamed completion")

# Structured output: the client's own parse() with a pydantic model (a strict json_schema), sampled with ten
# seeds: every reply parses into the model. (Its strings and list are bounded: unbounded, a 135M model at
# temperature 0.8 repeats itself inside a list until max_tokens in about half the seeds; the output is then
# cut, finish_reason "length".)
from typing import Annotated, List, Literal

import pydantic


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=40)
    country: str = pydantic.Field(max_length=40)
    population_millions: float
    landmarks: List[Annotated[str, pydantic.Field(max_length=60)]] = pydantic.Field(max_length=3)
    continent: Literal["Europe", "Asia", "Africa", "America", "Oceania"]


city_messages = [{"role": "user", "content": "Describe a large city as JSON."}]
valid = 0
for seed in range(10):
    parsed = client.chat.completions.parse(model=model, messages=city_messages, response_format=City, temperature=0.8,
                                           seed=seed, max_tokens=400)
    choice = parsed.choices[0]
    if choice.finish_reason == "stop" and isinstance(choice.message.parsed, City):
        valid += 1
check(valid == 10, f"json_schema strict: {valid}/10 replies parse into the model")
obj = client.chat.completions.create(model=model, messages=city_messages, response_format={"type": "json_object"},
                                     temperature=0, max_tokens=300)
import json as _json
check(isinstance(_json.loads(obj.choices[0].message.content), dict), "json_object gives an object")

# Tool calls. tool_choice "required", sampled with ten seeds: every reply is calls, each to an offered function
# with arguments valid under its schema.
tools = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]


def valid_call(call):
    args = _json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        return (set(args) == {"city", "unit"} and isinstance(args["city"], str) and len(args["city"]) <= 40
                and args["unit"] in ("celsius", "fahrenheit"))
    if call.function.name == "add":
        return set(args) == {"a", "b"} and all(isinstance(args[k], int) for k in "ab")
    return False


ask = [{"role": "user", "content": "What is the weather in Paris?"}]
good = 0
for seed in range(10):
    r = client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required",
                                       temperature=0.8, seed=seed, max_tokens=200, parallel_tool_calls=False)
    c = r.choices[0]
    calls = c.message.tool_calls or []
    if c.finish_reason == "tool_calls" and len(calls) == 1 and valid_call(calls[0]) and calls[0].id:
        good += 1
check(good == 10, f"tool_choice required: {good}/10 schema-valid calls")
named = client.chat.completions.create(model=model, messages=ask, tools=tools, temperature=0, max_tokens=200,
                                       tool_choice={"type": "function", "function": {"name": "add"}})
call = named.choices[0].message.tool_calls[0]
check(call.function.name == "add" and valid_call(call), f"a named function: {call}")
# Streamed: the deltas the client accumulates give the same call as the whole reply.
whole_call = client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required",
                                            temperature=0, max_tokens=200, parallel_tool_calls=False)
parts = {}
finish = None
for chunk in client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required",
                                            temperature=0, max_tokens=200, parallel_tool_calls=False, stream=True):
    for ch in chunk.choices:
        for d in ch.delta.tool_calls or []:
            p = parts.setdefault(d.index, {"name": "", "arguments": ""})
            p["name"] += (d.function.name or "") if d.function else ""
            p["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = ch.finish_reason or finish
w = whole_call.choices[0].message.tool_calls[0].function
check(finish == "tool_calls" and parts == {0: {"name": w.name, "arguments": w.arguments}}, f"streamed call {parts}")
# The result goes back through the template, and the reply is text.
follow = client.chat.completions.create(model=model, temperature=0, max_tokens=30, tools=tools, messages=ask + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": w.name, "arguments": w.arguments}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}])
check(follow.choices[0].message.content and not follow.choices[0].message.tool_calls, "a reply after the result")

# The Responses API: text whole and streamed (the same greedy text), a required function call, a JSON schema.
resp = client.responses.create(model=model, input=[{"role": "system", "content": "You are brief."},
                                                   {"role": "user", "content": "Name two planets."}],
                               max_output_tokens=20, temperature=0)
check(resp.id.startswith("resp_") and resp.output[0].id.startswith("msg_") and resp.output_text, "a response")
check(resp.output_text == text, f"the Responses text is the chat text: {resp.output_text!r} vs {text!r}")
events, streamed_text = [], ""
for e in client.responses.create(model=model, input=[{"role": "system", "content": "You are brief."},
                                                     {"role": "user", "content": "Name two planets."}],
                                 max_output_tokens=20, temperature=0, stream=True):
    events.append(e.type)
    if e.type == "response.output_text.delta":
        streamed_text += e.delta
check(events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete"), events)
check(streamed_text == resp.output_text, f"streamed response {streamed_text!r}")
flat_tools = [dict(type="function", **t["function"]) for t in tools]
fc = client.responses.create(model=model, input="What is the weather in Paris?", tools=flat_tools,
                             tool_choice="required", parallel_tool_calls=False, max_output_tokens=200)
calls = [o for o in fc.output if o.type == "function_call"]
check(len(calls) == 1 and calls[0].call_id and valid_call(calls[0] if hasattr(calls[0], "function") else
      type("C", (), {"function": calls[0]})()), f"a Responses function call: {fc.output}")
js = client.responses.create(model=model, input="Describe a large city as JSON.", max_output_tokens=400,
                             text={"format": {"type": "json_schema", "name": "city", "strict": True,
                                              "schema": City.model_json_schema()}})
check(isinstance(City.model_validate_json(js.output_text), City), "a Responses json_schema reply")

# Embeddings: one unit vector per input, in order (the client asks for base64 and decodes it); the same text
# gives the same vector, as float or base64, alone or beside others.
texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Quarterly revenue rose by 4%."]
emb = client.embeddings.create(model=model, input=texts)
vecs = [d.embedding for d in emb.data]
check([d.index for d in emb.data] == [0, 1, 2] and len({len(v) for v in vecs}) == 1 and len(vecs[0]) > 100,
      f"embeddings: one vector per input ({[len(v) for v in vecs]})")
check(all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vecs), "embeddings are normalized")
check(emb.usage.prompt_tokens > 3 and emb.usage.total_tokens == emb.usage.prompt_tokens, emb.usage)
alone = client.embeddings.create(model=model, input=texts[2], encoding_format="float").data[0].embedding
check(alone == vecs[2], "an input's vector does not depend on the inputs beside it, nor on its encoding")
dot = lambda a, b: sum(x * y for x, y in zip(a, b))
check(dot(vecs[0], vecs[1]) > dot(vecs[0], vecs[2]), "related texts are nearer than unrelated ones")
try:
    client.embeddings.create(model=model, input=[])
    check(False, "an empty input list was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.param == "input", e)

# Errors arrive as the client's own exception types.
try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    check(False, "a wrong key was accepted")
except openai.AuthenticationError as e:
    check(e.status_code == 401, e)
# A client configured with another model name is answered by the one model served, which the reply names.
other = client.chat.completions.create(model="gpt-3.5-turbo", messages=messages, max_tokens=2)
check(other.model == model, f"another model name: the reply names {other.model}")
try:
    client.chat.completions.create(model=model, messages=messages, temperature=-1)
    check(False, "a negative temperature was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.param == "temperature", e)
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "word " * 3000}])
    check(False, "a prompt over the context was accepted")
except openai.BadRequestError as e:
    check(e.code == "context_length_exceeded", e)

print(f"openai client {openai.__version__}: {checks} checks passed")
