"""Every ``--model`` kind simagent offers, registered by importing its module.

:mod:`simagent.models` knows only the provider kinds and ``openai-compatible:``; each
other kind lives with what it needs (``scripted:`` in the agent layer, ``replay:`` in the
bench, ``local:`` in :mod:`simagent.local_model`) and registers itself on import, the way
``llm`` plugins register models. The places that resolve a user's ``--model`` (the CLI,
the TUI, ``simagent run``, the bench, ``doctor``) import this module first. Each kind
module imports only the standard library at load, so this stays fast for ``--help``.
"""

from __future__ import annotations

from simagent.agent import scripted_kind
from simagent.bench import replay_kind
from simagent.local_model import kind as local_kind

KIND_MODULES = (scripted_kind, replay_kind, local_kind)
