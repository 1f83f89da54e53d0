"""Drives a running `trit serve` with the official `openai` Python client and checks what a
client sees: chat (plain, streamed with usage), completions, models, a tool-call round trip
and a forced call (`tool_choice="required"`), structured outputs (a pydantic model and a
discriminated union of two through the client's `parse`, an OpenAPI-style `allOf`, validated by the
`jsonschema` package), and the error cases as the client raises them. Prints OK and exits 0
when everything holds.

    python tools/openai_client_check.py BASE_URL API_KEY
"""

import datetime
import json
import re
import sys
import typing

import jsonschema
import openai
import pydantic

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")


models = client.models.list()
model = models.data[0].id
check(models.data[0].object == "model", "model object")

messages = [{"role": "user", "content": "What is the capital of France?"}]
chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
reply = chat.choices[0].message
check(chat.object == "chat.completion", "chat object")
check(reply.role == "assistant" and reply.content, "assistant content")
check(chat.choices[0].finish_reason in ("stop", "length"), "finish reason")
check(chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens, "usage")

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=8, temperature=0, stream=True,
    stream_options={"include_usage": True},
)
chunks = list(stream)
check(chunks[0].choices[0].delta.role == "assistant", "role delta first")
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(text == reply.content, f"streamed {text!r} != {reply.content!r}")
finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check(finishes == [chat.choices[0].finish_reason], "one finish reason")
check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens,
      "usage chunk")

# n: several choices, each the reply of a lone request with the seed + index.
several = client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                         temperature=1.0, seed=5, n=3)
check([c.index for c in several.choices] == [0, 1, 2], "choice indexes")
for c in several.choices:
    alone = client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                           temperature=1.0, seed=5 + c.index)
    check(alone.choices[0].message.content == c.message.content, f"choice {c.index}")

completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6,
                                       temperature=0, logprobs=2)
check(completion.object == "text_completion", "completion object")
check("".join(completion.choices[0].logprobs.tokens) == completion.choices[0].text, "logprob tokens")

# echo, as lm-evaluation-harness scores a continuation: two prompts of token ids, one token
# generated after each; the prompts' log-probabilities come first (the very first is None).
ids = [[504, 3575, 282, 4649, 314], [504, 3575, 282]]
scored = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0,
                                   logprobs=1, echo=True)
check([c.index for c in scored.choices] == [0, 1], "one choice per prompt")
for c, p in zip(scored.choices, ids):
    lp = c.logprobs
    check(lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(p) + 1, "echo logprobs")
    check(all(isinstance(x, float) for x in lp.token_logprobs[1:]), "prompt token logprobs")
    check(lp.top_logprobs[0] is None and len(lp.top_logprobs[-1]) == 1, "top logprobs")

# Tool-call round trip: tools offered, then the call and its result sent back as history.
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
first = client.chat.completions.create(model=model, messages=[
    {"role": "user", "content": "Weather in Paris?"}], tools=tools, max_tokens=8, temperature=0)
check(first.choices[0].finish_reason in ("stop", "length", "tool_calls"), "tool finish reason")
history = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
]
second = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=8,
                                        temperature=0)
check(second.choices[0].message.content is not None or second.choices[0].message.tool_calls,
      "reply after the tool result")
# A forced call (tool_choice "required"): one call whose arguments fit the parameters.
bounded = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                   "required": ["city"], "additionalProperties": False}}}]
forced = client.chat.completions.create(model=model, messages=[
    {"role": "user", "content": "Weather in Paris?"}], tools=bounded, tool_choice="required",
    max_tokens=80, temperature=0)
check(forced.choices[0].finish_reason == "tool_calls", f"forced call: {forced}")
call = forced.choices[0].message.tool_calls[0]
check(call.function.name == "get_weather", "forced call's name")
jsonschema.validate(json.loads(call.function.arguments), bounded[0]["function"]["parameters"])

# Structured outputs: the client's own strict schema from a pydantic model, enforced.
class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=24)
    country: str = pydantic.Field(max_length=24)
    code: str = pydantic.Field(pattern=r"^[A-Z]{2}$")
    founded: datetime.date
    population: int
    capital: bool


describe = [{"role": "user", "content": "Describe Paris as JSON."}]
parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
parsed = parse(model=model, messages=describe, max_tokens=200, temperature=0, response_format=City)
city = parsed.choices[0].message.parsed
check(isinstance(city, City), f"parsed into the model: {parsed.choices[0].message.content!r}")
check(parsed.choices[0].finish_reason == "stop", "the document ended")
jsonschema.validate(json.loads(parsed.choices[0].message.content), City.model_json_schema(),
                    format_checker=jsonschema.FormatChecker())

# A discriminated union of two models (`oneOf` of two objects, which the first byte cannot
# tell apart): the reply is one of them.
class Cat(pydantic.BaseModel):
    kind: typing.Literal["cat"]
    name: str = pydantic.Field(max_length=16)
    lives: int = pydantic.Field(ge=0, le=9)


class Dog(pydantic.BaseModel):
    kind: typing.Literal["dog"]
    name: str = pydantic.Field(max_length=16)


class Pet(pydantic.BaseModel):
    pet: typing.Union[Cat, Dog] = pydantic.Field(discriminator="kind")


ask = [{"role": "user", "content": "Describe a pet as JSON."}]
for seed in (0, 1, 2):
    pet = parse(model=model, messages=ask, max_tokens=120, temperature=1.0, seed=seed,
                response_format=Pet)
    check(pet.choices[0].finish_reason == "stop", f"the union document ended: {pet}")
    check(isinstance(pet.choices[0].message.parsed, Pet), "parsed into the union model")
    jsonschema.validate(json.loads(pet.choices[0].message.content), Pet.model_json_schema())
# OpenAPI-style composition (a raw json_schema, not pydantic's): `allOf` of a referenced base
# model, a member that adds, narrows and closes, and one that narrows an enum; the reply must
# satisfy every member.
composed = {
    "$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}},
                       "required": ["id"]}},
    "allOf": [
        {"$ref": "#/$defs/base"},
        {"properties": {"id": {"maximum": 99}, "name": {"type": "string", "maxLength": 12},
                        "tag": {"enum": ["a", "b", "c"]}},
         "required": ["name", "tag"], "additionalProperties": False},
        {"properties": {"tag": {"enum": ["b", "c", "d"]}}},
    ],
}
for seed in (0, 1):
    item = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Describe an item as JSON."}],
        max_tokens=120, temperature=1.0, seed=seed,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "item", "schema": composed}})
    check(item.choices[0].finish_reason == "stop", f"the allOf document ended: {item}")
    jsonschema.validate(json.loads(item.choices[0].message.content), composed)
any_object = client.chat.completions.create(model=model, messages=describe, max_tokens=200,
                                            temperature=0, response_format={"type": "json_object"})
if any_object.choices[0].finish_reason == "stop":
    check(isinstance(json.loads(any_object.choices[0].message.content), dict), "json_object")

# Embeddings: the client asks for base64 by default and decodes it; floats on request.
texts = ["The capital of France is Paris.", "Ternary weights take three values."]
emb = client.embeddings.create(model=model, input=texts)
check([d.index for d in emb.data] == [0, 1], "embedding indices")
vecs = [d.embedding for d in emb.data]
check(all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vecs), "unit vectors")
plain = client.embeddings.create(model=model, input=texts, encoding_format="float")
check(all(max(abs(a - b) for a, b in zip(v, w)) < 1e-6
          for v, w in zip(vecs, [d.embedding for d in plain.data])), "base64 = float")
check(emb.usage.prompt_tokens == emb.usage.total_tokens > 0, f"usage {emb.usage}")
check(sum(a * b for a, b in zip(*vecs)) < 0.99, "different texts, different vectors")

# The Responses API: whole, streamed as events, and through the client's stream helper (which
# rebuilds the response from the events).
resp = client.responses.create(model=model, instructions="Be brief.",
                               input="What is the capital of France?", max_output_tokens=8,
                               temperature=0)
check(resp.object == "response" and resp.status in ("completed", "incomplete"), f"{resp}")
check(len(resp.output_text) > 0, "response output_text")
check(resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0, f"usage {resp.usage}")
# Stored responses: continued with previous_response_id, read back and deleted by id.
follow = client.responses.create(model=model, instructions="Be brief.", input="And of Germany?",
                                 previous_response_id=resp.id, max_output_tokens=8,
                                 temperature=0)
check(follow.previous_response_id == resp.id, f"{follow}")
check(follow.usage.input_tokens > resp.usage.input_tokens + resp.usage.output_tokens,
      "the stored conversation is part of the prompt")
got = client.responses.retrieve(follow.id)
check(got.id == follow.id and got.output_text == follow.output_text, f"{got}")
items = client.responses.input_items.list(follow.id)
check(len(items.data) == 1 and items.data[0].content[0].text == "And of Germany?",
      f"input items {items}")
client.responses.delete(follow.id)


def gone(read, what):
    """`read()` must fail with the API's 404 (a deleted object)."""
    try:
        read()
        check(False, f"a deleted {what} must be gone")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"deleted {what} status")


gone(lambda: client.responses.retrieve(follow.id), "response")
# Conversations: created with an item, continued by responses sent in it, listed, deleted.
conv = client.conversations.create(items=[{"type": "message", "role": "user",
                                           "content": "My name is Ada."}],
                                   metadata={"topic": "names"})
check(conv.id.startswith("conv_") and conv.metadata == {"topic": "names"}, f"{conv}")
turn = client.responses.create(model=model, input="What is my name?", conversation=conv.id,
                               max_output_tokens=8, temperature=0)
check(turn.conversation is not None and turn.conversation.id == conv.id, f"{turn}")
listed = client.conversations.items.list(conv.id, order="asc")
check([i.type for i in listed.data] == ["message"] * 3, f"conversation items {listed}")
check(listed.data[0].content[0].text == "My name is Ada."
      and listed.data[2].role == "assistant", f"conversation items {listed}")
added = client.conversations.items.create(conv.id, items=[{"type": "message", "role": "user",
                                                           "content": "Noted."}])
got = client.conversations.items.retrieve(added.data[0].id, conversation_id=conv.id)
check(got.content[0].text == "Noted.", f"{got}")
client.conversations.delete(conv.id)
gone(lambda: client.conversations.retrieve(conv.id), "conversation")
events = list(client.responses.create(model=model, input="Once upon a time",
                                      max_output_tokens=8, temperature=0, stream=True))
deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
check(events[-1].type in ("response.completed", "response.incomplete"), events[-1].type)
check(events[-1].response.output_text == deltas and deltas, "streamed text adds up")
# The helper wants `response.completed` (a reply cut by max_output_tokens ends with
# `response.incomplete`, as OpenAI's does): a JSON schema makes the reply end by itself.
num = {"type": "json_schema", "name": "num", "strict": True, "schema": {
    "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
    "additionalProperties": False}}
plain = client.responses.create(model=model, input="A number:", max_output_tokens=40,
                                temperature=0, text={"format": num})
with client.responses.stream(model=model, input="A number:", max_output_tokens=40,
                             temperature=0, text={"format": num}) as stream:
    kinds = [event.type for event in stream]
    final = stream.get_final_response()
check(final.status == "completed" and final.output_text == plain.output_text,
      "the client's stream helper rebuilds the reply")
check(isinstance(json.loads(final.output_text)["n"], int), final.output_text)
check(kinds[0] == "response.created" and kinds[-1] == "response.completed", f"{kinds}")

# A forced function tool on the Responses API: a function_call item, whole and through the
# stream helper (which checks the call's item ids and argument deltas as it rebuilds it).
weather = {"type": "function", "name": "get_weather", "description": "Weather now",
           "strict": True, "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
forced_fn = {"type": "function", "name": "get_weather"}
fc = client.responses.create(model=model, input="Weather in Paris?", tools=[weather],
                             tool_choice=forced_fn, max_output_tokens=120, temperature=0)
calls = [o for o in fc.output if o.type == "function_call"]
check(len(calls) == 1 and calls[0].name == "get_weather", f"{fc.output}")
check(json.loads(calls[0].arguments)["unit"] in ("c", "f"), calls[0].arguments)
with client.responses.stream(model=model, input="Weather in Paris?", tools=[weather],
                             tool_choice=forced_fn, max_output_tokens=120,
                             temperature=0) as stream:
    for _ in stream:
        pass
    final = stream.get_final_response()
streamed_calls = [o for o in final.output if o.type == "function_call"]
check(len(streamed_calls) == 1
      and json.loads(streamed_calls[0].arguments) == json.loads(calls[0].arguments),
      f"{final.output}")

# Errors, as the client raises them.
try:
    client.chat.completions.create(model=model, messages=[
        {"role": "user", "content": "word " * 5000}], max_tokens=4)
    check(False, "context overflow must fail")
except openai.BadRequestError as e:
    check(e.status_code == 400, "overflow status")
    check(e.body["type"] == "exceed_context_size_error", f"overflow type {e.body}")
    check(re.search(r"request \((\d+) tokens\)", e.body["message"]), "llama.cpp wording")
    check(e.body["n_ctx"] > 0 and e.body["n_prompt_tokens"] > e.body["n_ctx"], "counts")
try:
    client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
    check(False, "unknown model must fail")
except openai.NotFoundError as e:
    check(e.status_code == 404, "unknown model status")
try:
    client.chat.completions.create(model=model, messages=messages, max_tokens=4, response_format={
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": 2}}})
    check(False, "a schema with `minProperties` must be refused")
except openai.BadRequestError as e:
    check("minProperties" in e.body["message"], f"names the keyword: {e.body}")

try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    check(False, "a wrong key must fail")
except openai.AuthenticationError as e:
    check(e.status_code == 401, "auth status")

print("OK")
