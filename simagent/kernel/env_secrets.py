"""Learn the secrets in the kernel's own environment, so redaction knows them too.

Redaction matches the values of secret-named environment variables
(:mod:`simagent.trace.redact`), but it reads simagent's environment: a kernel simagent
attached to (``--kernel``) has one of its own, and a cell can set one in simagent's
own kernel (``os.environ["X_TOKEN"] = ...``). So the kernel is asked for its
secret-named variables (the same name rule and shortest length as redaction's) with a
``user_expressions`` entry: when simagent starts or attaches to it (one silent request,
:meth:`simagent.kernel.lifecycle.KernelBase._ready`), with every state probe, and after
a cell whose code could change the environment (:func:`may_set_env`: it says ``env``, as
``os.environ``, ``%env``, ``load_dotenv`` and ``putenv`` do), riding on the cell's own
execute request. Not after every cell: evaluating the entry costs the kernel ~0.2 ms,
measurable on a ~8 ms round trip (``simagent bench kernel``). The values come back in the
execute reply, which nothing writes down; each is registered with
:func:`simagent.trace.redact.register`, so a later print of it is redacted in outputs,
the trace and the checkpoints. A value the cell that set it also printed is printed
before it is known: that one output is not caught; nor, until the next state probe, is a
variable set by code the cell calls without saying ``env``.

Bounded: at most :data:`MAX_SECRETS` values of at most :data:`MAX_SECRET_CHARS`
characters each per reply.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from simagent.trace.redact import MIN_SECRET_LEN, SECRET_NAME_PATTERN, register

#: The ``user_expressions`` key of the environment read.
EXPRESSION_KEY = "simagent_env_secrets"
#: Most values one reply carries (an environment has a handful of keys).
MAX_SECRETS = 64
#: Longest value taken (a certificate in a variable is not matched in printed text).
MAX_SECRET_CHARS = 4096

#: Evaluated in the kernel (any Python kernel: standard library only, nothing left in its
#: namespace): ``[[NAME, value], ...]`` as JSON.
EXPRESSION = (
    "__import__('json').dumps([[k, v] for k, v in list(__import__('os').environ.items()) "
    f"if {MIN_SECRET_LEN} <= len(v) <= {MAX_SECRET_CHARS} "
    f"and __import__('re').search({SECRET_NAME_PATTERN!r}, k, {int(re.IGNORECASE)})]"
    f"[:{MAX_SECRETS}])")


#: Code that could change the kernel's environment says this (any case).
_ENV_HINT = re.compile("env", re.IGNORECASE)


def may_set_env(code: str) -> bool:
    """Whether a cell's code could change its kernel's environment (a cheap, generous
    test: a false yes costs ~0.2 ms)."""
    return bool(_ENV_HINT.search(code))


def expressions(code: str) -> dict[str, str]:
    """The ``user_expressions`` a cell's execute request carries: the environment read
    when the cell could change it, else none."""
    return {EXPRESSION_KEY: EXPRESSION} if may_set_env(code) else {}


def parse(reply: dict[str, Any]) -> dict[str, str]:
    """``{value: NAME}`` from an execute reply that carried :data:`EXPRESSION` ({} when
    it did not, or the kernel could not evaluate it)."""
    found = (reply.get("user_expressions") or {}).get(EXPRESSION_KEY) or {}
    if found.get("status") != "ok":
        return {}
    try:
        pairs = json.loads(ast.literal_eval((found.get("data") or {})["text/plain"]))
    except (KeyError, ValueError, SyntaxError, TypeError):
        return {}
    out: dict[str, str] = {}
    for pair in pairs[:MAX_SECRETS] if isinstance(pairs, list) else []:
        if (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(x, str) for x in pair)):
            out.setdefault(pair[1], pair[0])
    return out


def learn(reply: dict[str, Any]) -> int:
    """Register the secrets ``reply`` carries; how many it carried."""
    found = parse(reply)
    if found:
        register(found)
    return len(found)
