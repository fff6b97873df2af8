"""The llama.cpp server simagent starts keeps its memory bounded over many requests
(issue 41).

Measured before the fix, on this test's model and requests: the server grew 1.4 GiB a
request (0.17 GiB loaded, 13.7 GiB after 8), because llama-cpp-python's server keeps every
token's logits (``logits_all``) and its RAM prompt cache copies them into each entry
outside its byte limit; the packaged 0.5B model went 0.69 → 4.38 GiB in 6 replies and a
long session met the OOM killer. The model here is the tiny random GGUF with its
vocabulary padded to Qwen2.5's 151,936 tokens: the logits scale with the vocabulary, not
the weights, so the test shows the growth in seconds where a real model takes minutes.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import psutil
import pytest
from tiny_gguf import write_tiny_gguf

from simagent.local_model.llama_server import start_server
from simagent.local_model.serve import CACHE_BYTES, memory_bound

pytest.importorskip("llama_cpp", reason="needs the local extra: pip install 'simagent[local]'")

QWEN_VOCAB = 151_936
N_CTX = 4096
N_BATCH = 512  # llama-cpp-python's default: the logits rows the server keeps
REQUESTS = 30


def ask(url: str, text: str) -> dict:
    body = {"model": "m", "messages": [{"role": "system", "content": "Be terse."},
                                       {"role": "user", "content": text}],
            "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request(f"{url}/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def peak_rss(pid: int) -> int:
    """The process's peak resident memory in bytes (``VmHWM``): what sampling after each
    request misses, a copy made and dropped inside one."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.mark.slow
def test_thirty_requests_keep_the_server_within_model_kv_cache_and_logits(tmp_path: Path
                                                                          ) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf", vocab=QWEN_VOCAB)
    server = start_server(model, alias="m", n_ctx=N_CTX, log_path=tmp_path / "server.log",
                          threads=1)
    try:
        process = psutil.Process(server.pid)
        loaded = process.memory_info().rss
        # what the server may hold beyond the loaded model: the KV cache for n_ctx,
        # llama.cpp's compute buffer and the prompt cache's limit (serve.memory_bound)
        logits = N_BATCH * QWEN_VOCAB * 4
        bound = memory_bound(loaded, (tmp_path / "server.log").read_text())
        assert bound > 1.10 * (loaded + CACHE_BYTES)  # the log named llama.cpp's buffers
        seen: list[int] = []
        for i in range(REQUESTS):  # each prompt new (about 3.6k tokens): a cache entry each
            text = "".join(f"line {j} of request {i}: a quick brown fox. " for j in range(60))
            reply = ask(server.url, text)
            assert reply["usage"]["prompt_tokens"] > 3000
            seen.append(process.memory_info().rss)
        rows = ", ".join(f"{rss / 2**30:.2f}" for rss in seen)
        # the peak between samples too (each prompt-cache save, inside a request)
        peak = peak_rss(server.pid)
        assert peak < bound, (f"server peaked at {peak / 2**30:.2f} GiB (VmHWM), over its "
                              f"bound {bound / 2**30:.2f} GiB (GiB a request: {rows})")
        print(f"loaded {loaded / 2**30:.3f} GiB, peak {peak / 2**30:.3f} GiB, bound "
              f"{bound / 2**30:.3f} GiB, GiB a request: {rows}")
        assert max(seen) < bound, (f"server RSS peaked at {max(seen) / 2**30:.2f} GiB, over "
                                   f"its bound {bound / 2**30:.2f} GiB (GiB a request: {rows})")
        # and it levels off: the last ten requests together add less than a quarter of
        # one batch of logits, what each cache entry's copy added before the fix
        assert seen[-1] - seen[-11] < logits / 4, f"still growing (GiB a request: {rows})"
    finally:
        server.stop()


@pytest.mark.slow
def test_a_prompt_cache_save_copies_one_row_of_logits_and_restores_as_before(
        tmp_path: Path) -> None:
    """``serve.one_row_logits``: the state a save hands the cache holds one row of logits,
    not n_batch, and the model's own logits stay whole; a restored state answers as the
    model did before and fills one row, not all of them."""
    import llama_cpp

    from simagent.local_model.serve import one_row_logits

    model = write_tiny_gguf(tmp_path / "tiny.gguf", vocab=QWEN_VOCAB)
    llama = llama_cpp.Llama(str(model), n_ctx=1024, n_threads=1, verbose=False)
    ask = dict(prompt="line 1 of a quick brown fox. " * 20, max_tokens=4, temperature=0)
    first = llama(**ask)["choices"][0]["text"]
    rows = llama.scores.shape[0]
    assert rows == N_BATCH
    one_row_logits(llama)
    state = llama.save_state()
    assert state.scores.shape == (1, QWEN_VOCAB)
    assert llama.scores.shape == (rows, QWEN_VOCAB)  # the model's own are left whole
    llama.reset()
    llama.scores[:] = -1.0  # a load writes the rows it restores, here one
    llama.load_state(state)
    assert (llama.scores[1:] == -1.0).all() and llama.scores.shape == (rows, QWEN_VOCAB)
    assert llama(**ask)["choices"][0]["text"] == first


def test_the_bound_counts_the_buffers_of_the_servers_last_start() -> None:
    log = ("--- simagent: python -m simagent.local_model.serve ...\n"
           "llama_kv_cache:        CPU KV buffer size =    96.00 MiB\n"
           "sched_reserve:        CPU compute buffer size =   302.00 MiB\n"
           "--- simagent: restarting: python -m simagent.local_model.serve ...\n"
           "llama_kv_cache:        CPU KV buffer size =    48.00 MiB\n"
           "llama_context:        CPU  output buffer size =     0.58 MiB\n"
           "sched_reserve:        CPU compute buffer size =   150.00 MiB\n")
    mib = 2**20
    assert memory_bound(100 * mib, log, cache_bytes=1024 * mib) == int(1.1 * 1322 * mib)
    assert memory_bound(100 * mib, "", cache_bytes=0) == int(1.1 * 100 * mib)
