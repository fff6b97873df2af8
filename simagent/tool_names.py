"""The names of simagent's own tools: the one home for them.

Labels, exclusions, gating, the ledger's pointers and the REPL watchdog read these, from
the context layers up to the front ends, so they live below all of them.
"""

RUN_PYTHON = "run_python"
RESET_KERNEL = "reset_kernel"
REMEMBER = "remember"
VIEW_FIGURE = "view_figure"
RECORD_ATTEMPT = "record_attempt"
RECALL = "recall"
#: deepagents' own tools that front ends draw apart: a subagent run, the todo list.
TASK = "task"
WRITE_TODOS = "write_todos"

#: Tools whose results arrive already capped by the tool (``run_python``'s text names its
#: raw output and ``_out[n]``): the context layer's per-tool cap leaves them as they are.
SELF_CAPPING = frozenset({RUN_PYTHON})
