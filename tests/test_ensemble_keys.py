"""Cache keys of ensembles: what identifies a case function and a case, so that a
cached result is never reused for code or data that changed (workspace modules
included), and what the runner does so workers run the code the key was computed from.
Pure: no cluster, no kernel (a few subprocesses for hash seeds and pickles)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from simagent.kernel_api.case_runner import STAMP, run_case
from simagent.kernel_api.cases import case_key, same_case
from simagent.kernel_api.identity import Uncacheable, function_key, identify


def scaled(x):
    return {"y": 2.0 * x}


def _make(src: str, env: dict | None = None):
    ns: dict = dict(env or {})
    exec(compile(src, "<cell>", "exec"), ns)
    return ns["f"]


# two lambdas on one source line: getsource() returns the same line for both
PLUS, TIMES = (lambda x: x + 1), (lambda x: x * 2)


def test_function_key_hashes_code_not_source_lines():
    assert function_key(PLUS) != function_key(TIMES)


def _keys_differ(src_a: str, src_b: str, env: dict | None = None) -> bool:
    return function_key(_make(src_a, env)) != function_key(_make(src_b, env))


def test_function_key_sees_into_callables_and_opaque_values():
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    # instances of kernel classes whose __call__ was edited; and their state
    call = "class C:\n    def __init__(self, k):\n        self.k = k\n" \
           "    def __call__(self, x):\n        return {}\nf = C({})\n"
    assert _keys_differ(call.format("x + self.k", 1), call.format("x - self.k", 1))
    assert _keys_differ(call.format("x + self.k", 1), call.format("x + self.k", 2))
    bound = "class C:\n    def __init__(self, k):\n        self.k = k\n" \
            "    def run(self, x):\n        return x + self.k\nf = C({}).run\n"
    assert _keys_differ(bound.format(1), bound.format(2))
    # decorated and wrapped functions: the wrapped code counts
    lru = "import functools\n@functools.lru_cache\ndef f(x):\n    return {}\n"
    assert _keys_differ(lru.format("x + 1"), lru.format("x - 1"))
    vec = "import numpy as np\nf = np.vectorize(lambda x: {})\n"
    assert _keys_differ(vec.format("x + 1"), vec.format("x - 1"))
    # globals the key used to name by their type only
    use = "def f(x):\n    return G\n"
    import types

    pairs = [(types.SimpleNamespace(a=1), types.SimpleNamespace(a=2)),
             (pd.DataFrame({"a": range(100)}), pd.DataFrame({"a": range(1, 101)})),
             (np.sin, np.cos)]
    big = np.zeros((65 << 20) // 8)
    big2 = big.copy()
    big2[-1] = 1.0
    pairs.append((big, big2))
    for a, b in pairs:
        assert function_key(_make(use, {"G": a})) != function_key(_make(use, {"G": b})), a


def test_case_keys_hash_content_not_repr():
    pd = pytest.importorskip("pandas")
    fk = function_key(scaled)
    a = pd.DataFrame({"v": range(200)})
    b = a.copy()
    b.loc[100, "v"] = -1  # the repr shows only the first and last rows
    assert repr(a) == repr(b)
    assert case_key(fk, {"df": a}) != case_key(fk, {"df": b})
    assert case_key(fk, {"df": a}) == case_key(fk, {"df": a.copy()})
    # mixed and tuple keys: hashed, not a TypeError; and distinguished
    assert case_key(fk, {"m": {1: "x", "b": 2}}) != case_key(fk, {"m": {1: "x", "b": 3}})
    assert case_key(fk, {"m": {(1, 2): 3}}) != case_key(fk, {"m": {(1, 2): 4}})
    assert case_key(fk, {"m": {1: "a"}}) != case_key(fk, {"m": {"1": "a"}})
    assert case_key(fk, {"s": {"b", "a"}}) == case_key(fk, {"s": {"a", "b"}})
    with pytest.raises(Uncacheable):
        import threading

        case_key(fk, {"lock": threading.Lock()})


def test_stored_case_must_equal_the_requested_one():
    np = pytest.importorskip("numpy")
    assert same_case({"a": float("nan"), "b": [1, (2, 3)]}, {"a": float("nan"), "b": [1, (2, 3)]})
    assert same_case({"n": np.int64(3), "v": np.arange(3)}, {"n": 3, "v": np.arange(3)})
    assert not same_case({"v": np.arange(3)}, {"v": np.arange(1, 4)})
    assert not same_case({"a": 1}, {"a": 2}) and not same_case({"a": 1}, {"b": 1})
    assert not same_case(None, {"a": 1})


def test_function_key_is_the_same_under_another_hash_seed(tmp_path):
    mod = tmp_path / "seeded.py"
    mod.write_text("NAMES = {'alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta'}\n"
                   "def f(x):\n    return x in NAMES\n")
    probe = ("import sys\nsys.path.insert(0, sys.argv[1])\nimport seeded\n"
             "from simagent.kernel_api.identity import function_key\n"
             "print(function_key(seeded.f))\n")
    keys = {subprocess.run([sys.executable, "-c", probe, str(tmp_path)], check=True, text=True,
                           capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed},
                           timeout=120).stdout.strip() for seed in ("1", "2", "3")}
    assert len(keys) == 1


def test_function_key_survives_self_referencing_globals():
    loop: list = [1]
    loop.append(loop)
    nest: dict = {"a": 1}
    nest["self"] = nest
    f = _make("def f(x):\n    return L, D\n", {"L": loop, "D": nest})
    assert function_key(f) == function_key(f)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Writes ``name.py`` into a folder on sys.path; forgets the modules afterwards."""
    import importlib

    import cloudpickle

    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(name: str, source: str):
        (tmp_path / f"{name}.py").write_text(source)
        importlib.invalidate_caches()
        names.append(name)
        return tmp_path / f"{name}.py"

    yield write
    for name in names:
        mod = sys.modules.pop(name, None)
        if mod is not None and name in cloudpickle.list_registry_pickle_by_value():
            cloudpickle.unregister_pickle_by_value(mod)


def test_a_reloaded_workspace_module_changes_the_key(user_module):
    import importlib

    user_module("umod", "def g(x):\n    return x + 1\n")
    import umod

    via_global = _make("def f(x):\n    return umod.g(x)\n", {"umod": umod})
    via_name = _make("def f(x):\n    return g(x)\n", {"g": umod.g})
    first = identify(via_global)
    assert first.by_value == {"umod"} and first.fresh == {}
    k_global, k_name = first.key, function_key(via_name)
    user_module("umod", "def g(x):\n    return x + 100\n")
    # edited, not reloaded: the kernel (and the workers, by value) still run the old code
    assert function_key(via_global) == k_global
    importlib.reload(umod)
    assert function_key(via_global) != k_global
    assert function_key(_make("def f(x):\n    return g(x)\n", {"g": umod.g})) != k_name


def test_a_module_imported_inside_the_function_is_keyed_by_its_file(user_module):
    user_module("uinner", "import uhelper\ndef g(x):\n    return uhelper.h(x)\n")
    helper = user_module("uhelper", "def h(x):\n    return x + 1\n")
    f = _make("def f(x):\n    import uinner\n    return uinner.g(x)\n")
    ident = identify(f)
    assert set(ident.fresh) == {"uinner", "uhelper"} and "uinner" not in sys.modules
    helper.write_text("def h(x):\n    return x + 2\n")  # a module the import imports
    assert function_key(f) != ident.key


def test_a_module_that_cannot_be_pickled_by_value_is_imported(user_module):
    from simagent.kernel_api.ship import prepare

    user_module("ulocked", "import threading\nLOCK = threading.Lock()\n"
                           "def g(x):\n    return x\n")
    import ulocked

    ident, blob = prepare(_make("def f(x):\n    return ulocked.g(x)\n", {"ulocked": ulocked}))
    assert ident.key is not None and ident.by_value == set() and "ulocked" in ident.fresh
    assert b"ulocked" in blob  # by reference: the worker imports it (and re-imports it)


def test_prepare_ships_workspace_modules_by_value(user_module):
    import cloudpickle

    from simagent.kernel_api.ship import prepare

    user_module("ushipped", "def g(x):\n    return x * 3\n")
    import ushipped

    _ident, blob = prepare(_make("def f(x):\n    return ushipped.g(x)\n",
                                 {"ushipped": ushipped}))
    assert "ushipped" in cloudpickle.list_registry_pickle_by_value()
    probe = ("import pickle, sys\nsys.modules['ushipped'] = None  # not importable there\n"
             "print(pickle.loads(sys.stdin.buffer.read())(x=2))\n")
    out = subprocess.run([sys.executable, "-c", probe], input=blob, capture_output=True,
                         check=True, timeout=120)
    assert out.stdout.decode().strip() == "6"


def test_run_case_reimports_a_user_module_that_changed(user_module):
    import hashlib

    path = user_module("ufresh", "VALUE = 1\n")
    import ufresh  # a long-lived worker imported version 1

    def digest():
        return hashlib.sha256(path.read_bytes()).hexdigest()

    probe = _make("def f():\n    import ufresh\n    return ufresh.VALUE\n")
    rec = run_case(probe, {}, 0, {"ufresh": digest()})
    assert rec["result"] == 1 and getattr(sys.modules["ufresh"], STAMP) == digest()
    user_module("ufresh", "VALUE = 22\n")
    assert ufresh.VALUE == 1
    rec = run_case(probe, {}, 0, {"ufresh": digest()})
    assert rec["result"] == 22 and "uncacheable" not in rec
    # a file edited while the case ran: the result is not cached
    editing = _make("def f():\n    import ufresh\n    open(P, 'w').write('VALUE = 3\\n')\n"
                    "    return ufresh.VALUE\n", {"P": str(path)})
    rec = run_case(editing, {}, 0, {"ufresh": "0" * 64})
    assert rec["status"] == "ok" and "ufresh changed on disk" in rec["uncacheable"]
