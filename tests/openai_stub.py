"""The OpenAI-compatible test server, re-exported from the package (``simagent.bench``).

It moved into the package so the product's provider-fault bench can drive the same wire
faults as the tests; existing tests keep importing ``openai_stub`` from here.
"""

from simagent.bench.openai_stub import (  # noqa: F401
    CHAT_PATH,
    ERROR_TYPES,
    FAULTS,
    MESSAGE_FRAMING,
    NAME_FRAMING,
    REPLY_PRIMING,
    TOOL_FRAMING,
    TOOLS_FRAMING,
    OpenAIStub,
    RecordedRequest,
    Reply,
    count_completion_tokens,
    count_prompt_tokens,
    error_reply,
    fault_reply,
)
