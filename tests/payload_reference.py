"""An independent token reference for the requests simagent counts (issue 27).

The request is serialized by langchain-openai's own request builder
(``ChatOpenAI._get_request_payload``, what goes over the wire) and counted with tiktoken's
own ``get_encoding`` (its registry and hash check; the encoding file is the one simagent
ships, placed in tiktoken's download cache so nothing is fetched), by the OpenAI
cookbook's rule: 3 tokens per message plus its role, content, name (+1) and the result's
call id; 3 per tool call plus its id, name and arguments (the wire sends all three); 3 to
prime the reply; each tool's JSON schema. Nothing of
simagent's serializer or counter is used."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Sequence
from functools import cache
from typing import Any

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


@cache
def reference_encoding() -> Any:
    import tempfile

    import tiktoken

    from simagent.context.tokens import ENCODINGS_DIR

    folder = tempfile.mkdtemp(prefix="tiktoken-ref-")
    data = gzip.decompress((ENCODINGS_DIR / "o200k_base.tiktoken.gz").read_bytes())
    with open(os.path.join(folder, hashlib.sha1(O200K_URL.encode()).hexdigest()), "wb") as fh:
        fh.write(data)
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = folder
    try:
        return tiktoken.get_encoding("o200k_base")  # checks tiktoken's own sha256
    finally:
        if before is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = before


def _tokens(text: Any) -> int:
    if not isinstance(text, str) or not text:
        return 0
    return len(reference_encoding().encode(text, disallowed_special=()))


def openai_payload(messages: Sequence[Any], tools: Sequence[Any]) -> dict[str, Any]:
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="gpt-4o", api_key="sk-reference-only")
    return llm._get_request_payload(list(messages),
                                    tools=[convert_to_openai_tool(t) for t in tools])


def payload_tokens(messages: Sequence[Any], tools: Sequence[Any]) -> int:
    payload = openai_payload(messages, tools)
    total = 3
    for msg in payload["messages"]:
        total += 3 + _tokens(msg.get("role"))
        content = msg.get("content")
        total += (sum(_tokens(p.get("text")) for p in content if isinstance(p, dict))
                  if isinstance(content, list) else _tokens(content))
        if "name" in msg:
            total += 1 + _tokens(msg["name"])
        total += _tokens(msg.get("tool_call_id"))
        for call in msg.get("tool_calls") or []:
            total += 3 + _tokens(call.get("id")) + _tokens(call["function"]["name"]) + \
                _tokens(call["function"]["arguments"])
    return total + sum(_tokens(json.dumps(t, ensure_ascii=False))
                       for t in payload.get("tools") or [])
