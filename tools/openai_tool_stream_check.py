"""Accumulates streamed chat chunks (one JSON object per line on stdin, as `trit serve` sends
them) with the official `openai` client's own stream state — the code behind
`client.chat.completions.stream(...)` — and prints what a client ends up with as one JSON line:
the final message's content and tool calls, the finish reason, and the streaming events the
client raised for the tool-call arguments.

    python tools/openai_tool_stream_check.py < chunks.jsonl
"""

import json
import sys

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

state = ChatCompletionStreamState()
events = []
for line in sys.stdin:
    if line.strip():
        chunk = ChatCompletionChunk.model_validate(json.loads(line))
        events.extend(e.type for e in state.handle_chunk(chunk))
final = state.get_final_completion()
choice = final.choices[0]
calls = [
    {"id": c.id, "type": c.type, "name": c.function.name, "arguments": c.function.arguments}
    for c in (choice.message.tool_calls or [])
]
print(json.dumps({
    "content": choice.message.content,
    "tool_calls": calls,
    "finish_reason": choice.finish_reason,
    "argument_deltas": events.count("tool_calls.function.arguments.delta"),
    "arguments_done": events.count("tool_calls.function.arguments.done"),
}))
