"""``local:`` models: a GGUF file served by llama.cpp's OpenAI-compatible server, which
simagent starts and supervises itself (``pip install 'simagent[local]'``).

``gguf_file`` checks a model file before anything starts, ``packaged`` assembles a model
shipped in package parts, ``server`` supervises the server process (``serve`` is what
runs inside it), and ``kind`` registers the ``local:`` prefix with :mod:`simagent.models`.
"""
