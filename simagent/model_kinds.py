"""Every ``--model`` kind simagent offers, registered by importing its module.

:mod:`simagent.models` knows only the provider kinds and ``openai-compatible:``; each
other kind lives with what it needs (``scripted:`` in the agent layer, ``replay:`` in the
bench, ``local:`` in :mod:`simagent.local_model`) and registers itself on import, the way
``llm`` plugins register models. It sits in the top layer, beside the CLI, since it
reaches every layer a kind lives in: the CLI imports it at start, so every command (the
TUI, ``simagent run``, the bench, ``doctor``) resolves any kind, and the layers below
never import the bench for it. Code that embeds a front end without the CLI (the tests)
imports it first. Each kind module imports only the standard library at load, so this
stays fast for ``--help``.
"""

from __future__ import annotations

from simagent.agent import scripted_kind
from simagent.bench import replay_kind
from simagent.local_model import kind as local_kind

KIND_MODULES = (scripted_kind, replay_kind, local_kind)
