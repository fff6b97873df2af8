"""The kernel layer: a supervised Jupyter kernel with terminal-emulated, bounded capture.

Knows nothing of agents. Import cost matters (``simagent --help`` must stay fast), so
the supervisor, which imports jupyter_client, loads on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simagent.kernel.capture import OutputEvent
    from simagent.kernel.port import KernelPort, KernelStartError, KernelStatus
    from simagent.kernel.result import Display, ErrorInfo, ExecResult
    from simagent.kernel.supervisor import Kernel

__all__ = ["HUMAN_MIME", "Display", "ErrorInfo", "ExecResult", "Kernel", "KernelPort",
           "KernelStartError", "KernelStatus", "OutputEvent"]

#: The human-only channel: a ``display_data`` carrying this mime type (a JSON object with
#: ``text``) is a notice for the person at the screen, e.g. a dashboard link. Capture keeps
#: it out of the model-facing text and the raw output file and emits it as an
#: ``OutputEvent`` of kind ``"human"``. Kernel code publishes it with
#: ``simagent.kernel_api.notify_human``.
HUMAN_MIME = "application/vnd.simagent.human+json"

_HOMES = {
    "Kernel": "simagent.kernel.supervisor",
    "KernelStartError": "simagent.kernel.port",
    "KernelPort": "simagent.kernel.port",
    "KernelStatus": "simagent.kernel.port",
    "ExecResult": "simagent.kernel.result",
    "ErrorInfo": "simagent.kernel.result",
    "Display": "simagent.kernel.result",
    "OutputEvent": "simagent.kernel.capture",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(name)
