"""A bench record's recall fields: where each probe fact stands in a run's last request.

Kept apart from the row runner (``workflow_runs``) because it is the one part of a
record that reads the run's folders (pointers are followed on disk).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simagent.bench.workflow import Workflow
from simagent.context.ledger import ledger_recall
from simagent.context.recall import locate, request_text
from simagent.context.stats import BOUNDARY_KINDS


def recall_fields(wf: Workflow, session: Any, model: Any, events: Sequence[Any]
                  ) -> dict[str, Any]:
    """Where each probe fact stands in the last request (in view, by pointer, lost), what
    reading it back would cost, what the ledger's ``recall`` finds of those out of view,
    and whether every compaction wrote a ledger entry."""
    last = model.requests[-1] if getattr(model, "requests", None) else []
    where = [locate(p.fact, request_text(last), recall_roots(session),
                    outputs=kernel_outputs(session)) for p in wf.probes]
    kept = [w.status != "lost" for w in where]
    compactions = [e for e in events if e.kind in BOUNDARY_KINDS]

    def share(status: str) -> float:
        return round(sum(w.status == status for w in where) / len(where), 4) if where \
            else float(status == "in_view")

    return {
        "recall": round(sum(kept) / len(kept), 4) if kept else 1.0,
        "probes_lost": [p.fact for p, k in zip(wf.probes, kept, strict=True) if not k],
        "recall_in_view": share("in_view"), "recall_by_pointer": share("by_pointer"),
        "recall_lost": share("lost"),
        # of the probes out of view, the share the ledger's recall(query) finds (ledger.py)
        "ledger_recall": ledger_recall(session, [p.fact for p, w in zip(wf.probes, where,
                                                                        strict=True)
                                                 if w.status != "in_view"]),
        # every compaction should have written a ledger entry (issue 16)
        "compactions": len(compactions),
        "ledger_entries": sum(e.payload.get("ledger") is not None for e in compactions),
        "recovery_tokens": sum(w.recovery_tokens or 0 for w in where),
        "recovery_search_tokens": sum(w.search_tokens or 0 for w in where),
        "probes": [{"fact": p.fact[:120], "status": w.status, "pointer": w.pointer,
                    "recovery_tokens": w.recovery_tokens}
                   for p, w in zip(wf.probes, where, strict=True)],
    }


def recall_roots(session: Any) -> list[Path]:
    """Paths the model can follow: its session, workspace, and the simulator's source."""
    sim_dirs = session.simulator.package_dirs() if session.simulator else []
    return [session.paths.root, session.workspace, *getattr(session, "extra_roots", []),
            *sim_dirs]


def kernel_outputs(session: Any) -> Path:
    """The folder ``_out[n]`` handles read: the kernel's raw outputs (a replay's recording
    is its kernel, and serves them)."""
    return getattr(session, "kernel_outputs", None) or session.paths.outputs
