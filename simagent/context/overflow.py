"""Recognising a provider's "your request is too long" error, whatever its wording.

Providers disagree on status codes and classes, so the message text decides; langchain's
``ContextOverflowError`` is recognised by type. Only these trigger emergency compaction:
retrying any other bad request would just fail twice.
"""

from __future__ import annotations

#: Lower-case fragments of context-overflow messages (OpenAI, Anthropic, Gemini, vLLM,
#: llama.cpp, Ollama wordings).
OVERFLOW_MARKERS = (
    "maximum context length", "context_length_exceeded", "context window",
    "too many tokens", "reduce the length of the messages", "token limit",
    "prompt is too long", "exceeds the context", "context size", "input is too long",
)


def is_context_overflow(exc: BaseException) -> bool:
    if type(exc).__name__ in ("ContextOverflowError", "ContextWindowExceededError"):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in OVERFLOW_MARKERS)
