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
