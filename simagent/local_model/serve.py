"""``python -m simagent.local_model.serve``: llama.cpp's OpenAI-compatible server as
simagent's child process.

It is ``llama_cpp.server``'s own app, with these additions:
- it exits when simagent does, however simagent ends (even SIGKILL): simagent holds the
  write end of this process's stdin, and end-of-file there means it is gone;
- ``GET /props`` reports what the server really loaded (``n_ctx`` after llama.cpp's
  rounding, the trained window, the chat format), the way llama.cpp's own server does,
  so the window simagent budgets against comes from the server;
- ``POST /simagent/stop`` stops the reply being computed within one step of llama.cpp's
  graph (:func:`stoppable`): a cancelled turn's request no longer runs on, for seconds
  of prompt evaluation, while the next one waits behind it;
- a streamed chat reply ends with a usage chunk (OpenAI's ``stream_options:
  {"include_usage": true}`` shape: no choices, ``usage``), counted by the server
  (:func:`count_usage`). llama-cpp-python ignores ``stream_options`` and streams no usage,
  so simagent recorded its own estimate: 1 output token for a tool call the server took
  23-48 tokens to write (issue 41).
Prompt caching is on (a RAM cache keyed by the prompt's prefix: the system prompt and
tool schemas are evaluated once), and the chat template is the model's own unless
``--chat-format`` names another. The server's memory stays within :func:`memory_bound`:
the cache counts all an entry holds and makes room before a save, and no array of logits
is made resident (:func:`bounded_ram_cache`, :func:`saves_within_limit`,
:func:`one_row_logits`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading

#: Where a client stops the reply being computed (:func:`stoppable`).
STOP_PATH = "/simagent/stop"

#: The prompt cache's size in bytes (llama-cpp-python's own default is 2 GiB).
CACHE_BYTES = 1 << 30

#: Keep the logits of every evaluated token? llama-cpp-python's server says yes by default
#: (for logprobs, which simagent never asks for); then ``Llama`` holds an n_ctx x n_vocab
#: float32 array (4,096 x 151,936: 2.3 GiB) and every prompt-cache entry copies it outside
#: the cache's byte limit: the server grew 1.4 GiB a request, to the OOM killer (issue 41;
#: tests/test_local_memory.py). With False it holds one batch's rows.
LOGITS_ALL = False


#: What the server may hold beyond the loaded model, as a share over the parts it names.
MEMORY_MARGIN = 0.10
#: The line simagent writes to the server's log before each start (``llama_server``).
LOG_START = "--- simagent: "
_BUFFER = re.compile(r"\b(KV|compute) buffer size\s*=\s*([\d.]+) MiB")


def memory_bound(loaded_rss: int, log_text: str, cache_bytes: int = CACHE_BYTES) -> int:
    """The most resident memory the server should reach, in bytes: the model as loaded
    (its RSS once it answers), the KV cache for ``n_ctx`` and llama.cpp's compute buffer
    (both as its log reports them), and the prompt cache's limit, plus
    :data:`MEMORY_MARGIN`. Nothing else may grow with the requests: the logits rows are
    never written (:func:`one_row_logits`) and a save fits within the cache's limit
    (:func:`saves_within_limit`)."""
    buffers = {kind: 0.0 for kind in ("KV", "compute")}
    last_start = log_text.rfind(LOG_START)  # a restart appends to the same log
    for kind, mib in _BUFFER.findall(log_text[max(last_start, 0):]):
        buffers[kind] += float(mib)
    held = loaded_rss + (buffers["KV"] + buffers["compute"]) * 2**20 + cache_bytes
    return int((1 + MEMORY_MARGIN) * held)


def _exit_with_parent() -> None:
    def watch() -> None:
        try:
            while os.read(0, 4096):  # unbuffered: no lock held at interpreter shutdown
                pass
        finally:
            os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def bounded_ram_cache(capacity_bytes: int) -> object:
    """llama-cpp-python's RAM prompt cache, bounded by what it really holds.

    Each entry it saves is the context's state (counted against the limit) plus a copy of
    the logits array (``scores``: n_batch x n_vocab float32, 0.29 GiB for Qwen2.5 at the
    default batch), which the stock cache does not count: at a 680 KB state an entry, a
    1 GiB limit let it keep hundreds, and the server grew 0.29 GiB a request. With
    ``logits_all`` off those rows are never read after a restore (llama.cpp keeps the
    logits it samples from in its own context, and a restored state re-evaluates its last
    token first), so an entry keeps one zero row, which ``load_state`` broadcasts, and
    the limit counts every array an entry holds."""
    import numpy as np  # the [local] extra's dependency, as llama_cpp below
    from llama_cpp.llama_cache import LlamaRAMCache  # the [local] extra

    class BoundedRamCache(LlamaRAMCache):
        @property
        def cache_size(self) -> int:
            return sum(state.llama_state_size + state.scores.nbytes + state.input_ids.nbytes
                       for state in self.cache_state.values())

        def __setitem__(self, key, value) -> None:  # llama_cpp's signature
            value.scores = np.zeros((1, value.scores.shape[1]), dtype=value.scores.dtype)
            super().__setitem__(key, value)

        def make_room(self, nbytes: int) -> None:
            """Drop the oldest entries until ``nbytes`` more fit within the limit."""
            while self.cache_state and self.cache_size + nbytes > self.capacity_bytes:
                self.cache_state.popitem(last=False)

    return BoundedRamCache(capacity_bytes)


def saves_within_limit(llama: object, cache: object) -> None:
    """Make room in ``cache`` before each of ``llama``'s saves, not after.

    ``save_state`` holds the new state twice (a buffer of its size, then a copy of it) while
    every entry still sits in the cache, which drops its oldest only once the new one is
    in: the cache's limit plus two entries at every save, about 0.2 GiB for Qwen2.5-0.5B
    at 8k. Dropping the oldest first keeps the cache and the save together within the
    limit."""
    import llama_cpp  # the [local] extra

    save = llama.save_state

    def save_state():  # Llama.save_state's signature
        cache.make_room(2 * int(llama_cpp.llama_state_get_size(llama._ctx.ctx)))
        return save()

    llama.save_state = save_state


class UsageCount:
    """The tokens one chat request's completions took: prompt tokens evaluated against
    (the whole prompt, cached prefix included, as llama-cpp-python's unstreamed ``usage``
    counts them) and tokens generated, end-of-generation excluded (likewise)."""

    def __init__(self) -> None:
        self.prompt = self.completion = 0

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt, "completion_tokens": self.completion,
                "total_tokens": self.prompt + self.completion}


def one_row_logits(llama: object) -> None:
    """Make ``llama``'s ``save_state`` and ``load_state`` touch one row of logits, not
    n_batch rows.

    With ``logits_all`` off, llama-cpp-python allocates ``scores`` (n_batch x n_vocab
    float32, 0.29 GiB for Qwen2.5) but never writes it: sampling reads llama.cpp's own
    logits. Its state functions do touch all of it: ``save_state`` copies every row (then
    the cache keeps one, :func:`bounded_ram_cache`): a 0.29 GiB spike at every save, 172
    of them in a 20-turn TUI session whose server peaked at 3.03 GiB; ``load_state``
    broadcasts the saved row over every row, which makes the whole array resident from
    the first cache hit on. Both read and write the logits through ``scores``, so they
    are shown a one-row view while they run."""
    for name in ("save_state", "load_state"):
        setattr(llama, name, _on_one_row(llama, getattr(llama, name)))


def _on_one_row(llama: object, method):
    def on_one_row(*args, **kwargs):  # the wrapped method's signature
        full = llama.scores
        llama.scores = full[:1]
        try:
            return method(*args, **kwargs)
        finally:
            llama.scores = full

    return on_one_row


def stoppable(llama: object) -> threading.Event:
    """An event that, once set, stops ``llama``'s current decode; cleared when the next
    request starts to generate.

    A cancelled chat request is not stopped by llama-cpp-python: its server notices a
    closed connection only between streamed chunks, so a prompt being evaluated (seconds
    to minutes on a small CPU) runs to its end while the next request waits for the
    model's lock. llama.cpp checks an abort callback during every decode; when it says
    stop, ``llama_decode`` returns an error and the reply ends there, as a short reply (an
    error would reset the connection, which the client's pool then reuses); the tokens
    it had not evaluated are dropped from the KV cache by the next request's prefix
    match. The check is a Python call about 550 times a decode for Qwen2.5-0.5B: 0.015 s
    in a 64-token reply that took 33 s."""
    import llama_cpp  # the [local] extra

    stop, generate = threading.Event(), llama.generate

    @llama_cpp.ggml_abort_callback
    def abort(_data):  # ggml_abort_callback's signature
        return stop.is_set()

    def generate_until_stopped(*args, **kwargs):  # Llama.generate's signature
        stop.clear()  # requests run one at a time: a stop is for the one running
        try:
            yield from generate(*args, **kwargs)
        except RuntimeError:  # llama_decode's error: the reply ends as a short one
            if not stop.is_set():
                raise

    llama_cpp.llama_set_abort_callback(llama._ctx.ctx, abort, None)
    llama._simagent_abort = abort  # the C side holds only a pointer: keep it alive
    llama.generate = generate_until_stopped
    return stop


def count_usage(llama: object) -> UsageCount:
    """Count what ``llama`` generates from here on, in the returned (reset-able) count.

    Every completion runs ``Llama.generate`` (the prompt's tokens in, one token out per
    step), looked up on the instance, so a wrapper set there sees exactly the tokens the
    unstreamed reply's ``usage`` would count: the prompt's length and each generated
    token up to, not including, an end-of-generation one."""
    import llama_cpp  # the [local] extra

    count, generate = UsageCount(), llama.generate
    vocab = llama._model.vocab

    def counted(tokens, *args, **kwargs):  # Llama.generate's signature
        count.prompt += len(tokens)
        for token in generate(tokens, *args, **kwargs):
            if not llama_cpp.llama_vocab_is_eog(vocab, token):
                count.completion += 1
            yield token

    llama.generate = counted
    return count


def with_usage_chunk(chunks, count: UsageCount):
    """``chunks`` (a streamed chat reply), then one chunk with ``count``'s usage."""
    last: dict = {}
    for chunk in chunks:
        last = chunk
        yield chunk
    yield {"id": last.get("id", ""), "object": "chat.completion.chunk",
           "created": last.get("created", 0), "model": last.get("model", ""),
           "choices": [], "usage": count.usage()}


def stream_usage(count: UsageCount) -> None:
    """Make every streamed chat reply of this process end with its usage chunk.

    The server's streaming endpoint calls ``Llama.create_chat_completion`` through the
    class (not the instance), so the class's method is wrapped; requests run one at a
    time (the server holds the model's lock for a whole stream), so one count serves."""
    from llama_cpp import Llama  # the [local] extra

    create = Llama.create_chat_completion

    def create_chat_completion(self, *args, **kwargs):  # Llama's signature
        count.prompt = count.completion = 0
        reply = create(self, *args, **kwargs)
        return with_usage_chunk(reply, count) if kwargs.get("stream") else reply

    Llama.create_chat_completion = create_chat_completion


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="simagent.local_model.serve")
    parser.add_argument("--model", required=True)
    parser.add_argument("--alias", required=True)
    parser.add_argument("--n-ctx", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chat-format", default=None)
    args = parser.parse_args(argv)
    _exit_with_parent()

    import uvicorn  # the optional [local] extra (llama-cpp-python[server])
    from llama_cpp.server import app as server_app  # the [local] extra
    from llama_cpp.server.settings import ModelSettings, ServerSettings  # the [local] extra

    model = ModelSettings(model=args.model, model_alias=args.alias, n_ctx=args.n_ctx,
                          n_threads=args.threads, n_threads_batch=args.threads,
                          chat_format=args.chat_format, cache=True, cache_type="ram",
                          cache_size=CACHE_BYTES, logits_all=LOGITS_ALL, verbose=True)
    server = ServerSettings(host="127.0.0.1", port=args.port, interrupt_requests=False)
    app = server_app.create_app(server_settings=server, model_settings=[model])
    llama = server_app._llama_proxy(None)  # the one model, loaded by create_app
    cache = bounded_ram_cache(CACHE_BYTES)
    llama.set_cache(cache)  # instead of the stock RAM cache
    one_row_logits(llama)
    saves_within_limit(llama, cache)
    stream_usage(count_usage(llama))
    stop = stoppable(llama)
    props = {"model": args.alias, "n_ctx": llama.n_ctx(), "n_ctx_train": llama._model.n_ctx_train(),
             "chat_format": llama.chat_format, "cache": True}

    @app.get("/props")
    async def get_props() -> dict:
        return props

    @app.post(STOP_PATH)
    async def stop_reply() -> dict:
        stop.set()
        return {"stopped": True}

    print(f"simagent: serving {args.model} as {args.alias} with n_ctx={props['n_ctx']}",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    sys.exit(1)  # uvicorn returns when it could not bind (the port was taken)


if __name__ == "__main__":
    main()
