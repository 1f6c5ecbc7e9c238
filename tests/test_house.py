"""The house keeps its shape: rooms import one way, layers only downwards, files stay small, and
every public name says what it is for.

Why a test: the package was once one flat folder where ten modules imported each other in a
circle, and a lazy import inside a function is all it takes to start one again. The imports are
read from the source (ast), function-level ones included, so nothing has to be imported here.

A room is a sub-package (``pooltensor/pool/``, ``collectives/algorithms/``...) or a module at a
layer's top level (``collectives/world.py``). Rooms may not import each other in a circle;
pooltensor's rooms are also held to the declared order below, and a layer never imports a layer
above it (native < collectives < pooltensor).
"""
import ast
import inspect
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYERS = ["native", "collectives", "pooltensor"]          # lowest first
# pooltensor's rooms, lowest first: each imports only rooms before it in this list.
POOLTENSOR_ORDER = ["pooltensor.errors", "pooltensor.cache", "pooltensor.pool",
                    "pooltensor.array", "pooltensor.ops", "pooltensor.dask", "pooltensor"]
MAX_BYTES = 32 * 1024
SOURCE_DIRS = ["native", "collectives", "pooltensor", "bench", "examples", "tests"]


def _module_name(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    for layer in ("collectives", "pooltensor"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            yield _module_name(path), path


def _imports(name, path):
    """Every module `name` imports (absolute names), at any depth of the code."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:       # from pkg import submodule, or a name of pkg
                yield f"{mod}.{a.name}", node.lineno


def _known(mod, names):
    while mod and mod not in names:
        mod = mod.rpartition(".")[0]
    return mod or None


def room_of(module):
    """The room of a module: its layer's sub-package, or itself at a layer's top level."""
    parts = module.split(".")
    if parts[0] not in LAYERS:
        return None
    if len(parts) == 1:
        return parts[0]
    top = ROOT / parts[0] / parts[1]
    if top.is_dir():
        return ".".join(parts[:2])
    return module if module != parts[0] + ".__main__" else parts[0]


def edges():
    """(from room, to room, file, line) for every import between two rooms of ours."""
    mods = dict(_modules())
    names = set(mods)
    out = []
    for name, path in mods.items():
        for target, line in _imports(name, path):
            if target is None or target.split(".")[0] not in LAYERS:
                continue
            if target.startswith("collectives._native"):
                target_room = "native"
            else:
                t = _known(target, names)
                if t is None:
                    continue
                target_room = room_of(t)
            here = room_of(name)
            if target_room != here:
                out.append((here, target_room, path.relative_to(ROOT), line))
    return out


def test_no_import_goes_up_a_layer():
    bad = [e for e in edges()
           if LAYERS.index(e[0].split(".")[0]) < LAYERS.index(e[1].split(".")[0])]
    assert not bad, "imports from a layer into one above it:\n" + "\n".join(
        f"  {f}:{n}: {a} -> {b}" for a, b, f, n in bad)


def test_pooltensor_rooms_import_downwards():
    bad = []
    for a, b, f, n in edges():
        if a.startswith("pooltensor") and b.startswith("pooltensor"):
            ra, rb = (room if room in POOLTENSOR_ORDER else "pooltensor" for room in (a, b))
            if ra != rb and POOLTENSOR_ORDER.index(ra) < POOLTENSOR_ORDER.index(rb):
                bad.append(f"  {f}:{n}: {a} -> {b}")
    assert not bad, ("imports against the order " + " < ".join(POOLTENSOR_ORDER) + ":\n"
                     + "\n".join(bad))


def find_cycles(edge_list):
    """The circles in a graph given as (from, to, file, line) rows, each with where it is."""
    graph, where = {}, {}
    for a, b, f, n in edge_list:
        graph.setdefault(a, set()).add(b)
        where.setdefault((a, b), f"{f}:{n}")
    state, stack, cycles = {}, [], []

    def visit(r):
        state[r] = 1
        stack.append(r)
        for s in sorted(graph.get(r, ())):
            if state.get(s) == 1:
                loop = stack[stack.index(s):] + [s]
                cycles.append(" -> ".join(loop) + "  (" + ", ".join(
                    where[(x, y)] for x, y in zip(loop, loop[1:])) + ")")
            elif s not in state:
                visit(s)
        stack.pop()
        state[r] = 2

    for r in sorted(graph):
        if r not in state:
            visit(r)
    return cycles


def test_no_import_cycle_between_rooms():
    cycles = find_cycles(edges())
    assert not cycles, "rooms that import each other in a circle:\n  " + "\n  ".join(cycles)


def test_no_import_cycle_between_modules_of_pooltensor():
    """Inside a room too: the modules of pooltensor import each other in no circle (a
    sub-package's own ``__init__``, which names what the room offers, aside)."""
    mods = dict(_modules())
    rows = []
    for name, path in mods.items():
        if not name.startswith("pooltensor"):
            continue
        for target, line in _imports(name, path):
            t = _known(target, set(mods)) if target else None
            if t and t != name and not (name + ".").startswith(t + "."):
                rows.append((name, t, path.relative_to(ROOT), line))
    cycles = find_cycles(rows)
    assert not cycles, "modules that import each other in a circle:\n  " + "\n  ".join(cycles)


def test_the_checker_sees_a_circle(tmp_path):
    """The cycle check is only worth something if it fails on a circle: one made up here."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from .b import g\n")
    assert ("pkg.b.g", 2) in list(_imports("pkg.a", a))      # a lazy import counts
    rows = [("x", "y", "x.py", 1), ("y", "z", "y.py", 2), ("z", "x", "z.py", 3), ("x", "w", "", 0)]
    assert find_cycles(rows) == ["x -> y -> z -> x  (x.py:1, y.py:2, z.py:3)"]
    assert find_cycles(rows[:2]) == []


def _sources():
    for d in SOURCE_DIRS:
        for path in sorted((ROOT / d).rglob("*")):
            if path.suffix in (".py", ".c", ".h") and ".venv" not in path.parts \
                    and "build" not in path.parts:
                yield path


def test_no_source_file_over_32_kb():
    big = [f"  {p.relative_to(ROOT)}: {p.stat().st_size} bytes" for p in _sources()
           if p.stat().st_size > MAX_BYTES]
    assert not big, f"split these files (limit {MAX_BYTES} bytes):\n" + "\n".join(big)


def _public(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    for n in names:
        obj = getattr(module, n)
        if inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
            continue                    # dtypes, constants and sub-modules carry no docstring
        yield f"{module.__name__}.{n}", obj
        if inspect.isclass(obj) and obj.__module__.split(".")[0] in LAYERS:
            for m, v in vars(obj).items():
                if m.startswith("_") or not (callable(v) or isinstance(v, property)):
                    continue
                yield f"{module.__name__}.{n}.{m}", v


@pytest.mark.parametrize("package", ["pooltensor", "collectives"])
def test_every_public_name_has_a_docstring(package):
    module = __import__(package)
    missing = sorted(name for name, obj in _public(module)
                     if not (inspect.getdoc(obj) or "").strip())
    assert not missing, "public names without a docstring:\n  " + "\n  ".join(missing)
