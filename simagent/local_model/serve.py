"""``python -m simagent.local_model.serve``: llama.cpp's OpenAI-compatible server as
simagent's child process.

It is ``llama_cpp.server``'s own app, with two additions:
- it exits when simagent does, however simagent ends (even SIGKILL): simagent holds the
  write end of this process's stdin, and end-of-file there means it is gone;
- ``GET /props`` reports what the server really loaded (``n_ctx`` after llama.cpp's
  rounding, the trained window, the chat format), the way llama.cpp's own server does,
  so the window simagent budgets against comes from the server.
Prompt caching is on (a RAM cache keyed by the prompt's prefix: the system prompt and
tool schemas are evaluated once), and the chat template is the model's own unless
``--chat-format`` names another.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

#: The prompt cache's size in bytes (llama-cpp-python's own default is 2 GiB).
CACHE_BYTES = 1 << 30


def _exit_with_parent() -> None:
    def watch() -> None:
        try:
            while os.read(0, 4096):  # unbuffered: no lock held at interpreter shutdown
                pass
        finally:
            os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


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
                          cache_size=CACHE_BYTES, verbose=True)
    server = ServerSettings(host="127.0.0.1", port=args.port, interrupt_requests=False)
    app = server_app.create_app(server_settings=server, model_settings=[model])
    llama = server_app._llama_proxy(None)  # the one model, loaded by create_app
    props = {"model": args.alias, "n_ctx": llama.n_ctx(), "n_ctx_train": llama._model.n_ctx_train(),
             "chat_format": llama.chat_format, "cache": True}

    @app.get("/props")
    async def get_props() -> dict:
        return props

    print(f"simagent: serving {args.model} as {args.alias} with n_ctx={props['n_ctx']}",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    sys.exit(1)  # uvicorn returns when it could not bind (the port was taken)


if __name__ == "__main__":
    main()
