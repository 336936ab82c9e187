"""An agent turn whose tools come from an MCP server.

Run it with ``python examples/mcp_turn.py`` (needs ``pip install 'fanout[mcp]'``).

It starts ``mcp_inventory_server.py`` (beside it) as an MCP server over
stdio, registers the server's tools in a fanout ``Registry`` in one call,
and answers one assistant message under a 3-second deadline with a 1-second
idle timeout: every ``tool_use`` id is answered, progress is shown as it
arrives, the hung call is stopped as idle, and the server is told to cancel
it (and says so).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

import fanout
import fanout.mcp

SERVER = Path(__file__).with_name("mcp_inventory_server.py")

ASSISTANT_MESSAGE = {
    "role": "assistant",
    "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "stock", "input": {"sku": "A-113"}},
        {"type": "tool_use", "id": "toolu_2", "name": "reindex", "input": {"batches": 3}},
        {"type": "tool_use", "id": "toolu_3", "name": "supplier_eta", "input": {"sku": "A-113"}},
    ],
}


class ShowProgress:
    """An instrument: print each progress report as it arrives."""

    def on_event(self, event: fanout.Event) -> None:
        if event.kind is fanout.EventKind.PROGRESS:
            print(f"  progress {event.tool}: {event.detail['message']}")


async def main() -> None:
    registry = fanout.Registry()
    async with fanout.mcp.open_stdio(sys.executable, str(SERVER)) as server:
        specs = await fanout.mcp.register_tools(registry, server, idle_timeout=1.0)
        print("tools:", ", ".join(f"{spec.name} ({spec.kind.value})" for spec in specs))
        runner = fanout.Runner(
            registry,
            scopes=[server.limits(max_concurrency=4)],
            turn_timeout=3,
            instruments=[ShowProgress()],
        )
        turn = await runner.run_turn(fanout.calls_from_anthropic(ASSISTANT_MESSAGE))
        for block in fanout.anthropic_tool_results(turn)["content"]:
            print(block["tool_use_id"], block["is_error"], block["content"])
        sent = [str(request_id) for request_id in server.cancels_sent]
        heard = await server.call("cancellations", {})
        assert isinstance(heard, str)
        same = json.loads(heard) == sent
        print(f"cancel notices sent: {len(sent)}; the server heard those ids: {same}")


if __name__ == "__main__":
    trio.run(main)
