"""``AbandonGuard``: the outermost middleware of every agent, so a turn the user abandoned
neither calls on nor records anything after it was given up (``simagent.turns`` says why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware

from simagent.turns import TurnRegistry


class AbandonGuard(AgentMiddleware):
    """Outermost middleware: an abandoned run neither calls on nor records anything."""

    def __init__(self, turns: TurnRegistry) -> None:
        super().__init__()
        self.turns = turns

    def _guarded(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        self.turns.check()
        result = handler(request)
        self.turns.check()
        return result

    async def _aguarded(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        self.turns.check()
        result = await handler(request)
        self.turns.check()
        return result

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return self._guarded(request, handler)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await self._aguarded(request, handler)

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return self._guarded(request, handler)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await self._aguarded(request, handler)
