"""simagent's kernel-side helpers (``_out``, figure summaries), sent to a kernel as source.

simagent's own kernel installs them at start (:mod:`simagent.kernel.launcher`). Any other
kernel may run in an environment without simagent, so it gets the standard-library-only
modules' source in one silent cell: no history entry, no execution count. Two cases:

- a kernel simagent **started by name** (``[kernel] name``) is simagent's: it also gets
  the effects recorder (what cells do outside the kernel, for a replay after a restart);
- a kernel simagent **attached to** is the person's: it gets only ``_out`` and the figure
  summary formatter, both removable with ``_out.remove()``, and nothing at all in its
  namespace if it already has an ``_out`` of its own. The effects recorder is an audit
  hook, which Python cannot remove, so an attached kernel never gets it. Sending the
  helpers again (a second session attaching) re-points ``_out`` at the new session.
"""

from __future__ import annotations

from pathlib import Path

from simagent.kernel_api import effects, figures, outputs

#: The class of ``_out`` in an attached kernel (read back to confirm the install).
ATTACHED_CLASS = "AttachedOutputs"
#: A user expression naming the class of the kernel's ``_out`` (or ``None``).
OUT_CLASS_EXPR = "type(get_ipython().user_ns.get('_out')).__name__"


def _source(module: object) -> str:
    return Path(module.__file__).read_text(encoding="utf-8")  # type: ignore[attr-defined]


def named_kernel_code() -> str:
    """Installs ``_out``, figure summaries and the effects recorder (a kernel simagent
    started by name; the names it uses are deleted again)."""
    code = "import types as _simagent_t, sys as _simagent_s\n"
    for module, name, call in (
            (outputs, "simagent_outputs", "(get_ipython().user_ns, "
                                          "get_ipython().user_ns_hidden)"),
            (figures, "simagent_figures", "(get_ipython())"),  # figure data summaries
            (effects, "simagent_effects", "(get_ipython())")):  # what cells do outside
        code += (f"_simagent_m = _simagent_t.ModuleType({name!r})\n"
                 f"exec(compile({_source(module)!r}, {name!r}, 'exec'), _simagent_m.__dict__)\n"
                 f"_simagent_s.modules[{name!r}] = _simagent_m\n"
                 f"_simagent_m.install{call}\n")
    return code + "del _simagent_t, _simagent_s, _simagent_m\n"


_ATTACH = '''
import sys, types
ip = get_ipython()
def load(name, source):
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    sys.modules[name] = module
    return module
out_mod = sys.modules.get("simagent_outputs") or load("simagent_outputs", OUTPUTS)
fig_mod = sys.modules.get("simagent_figures") or load("simagent_figures", FIGURES)
theirs = ip.user_ns.get("_out")
if theirs is None or type(theirs).__name__ == CLASS:
    class AttachedOutputs(out_mod.Outputs):
        """_out[n]: simagent's executions in this kernel. _out.remove() takes simagent's
        helpers (_out and the figure summary formatter) out of the kernel again."""
        def remove(self):
            for ns in (ip.user_ns, ip.user_ns_hidden):
                if ns.get("_out") is self:
                    del ns["_out"]
            ip.display_formatter.formatters.pop(fig_mod.FIGURE_MIME, None)
            for name in ("simagent_outputs", "simagent_figures"):
                sys.modules.pop(name, None)
            return "simagent's helpers are removed from this kernel"
        def __repr__(self):
            return super().__repr__() + "; _out.remove() takes it out of this kernel"
    AttachedOutputs.__name__ = AttachedOutputs.__qualname__ = CLASS
    ip.user_ns["_out"] = ip.user_ns_hidden["_out"] = AttachedOutputs(FOLDER)
    fig_mod.install(ip)
'''


def attach_code(outputs_folder: Path) -> str:
    """Installs ``_out`` (reading ``outputs_folder``) and figure summaries in an attached
    kernel; runs in a namespace of its own, so the user's sees only ``_out``."""
    values = {"OUTPUTS": _source(outputs), "FIGURES": _source(figures),
              "FOLDER": str(outputs_folder), "CLASS": ATTACHED_CLASS}
    return (f"exec(compile({_ATTACH!r}, 'simagent_attach', 'exec'), "
            f"{{'__name__': 'simagent_attach', **{values!r}}})\n")
