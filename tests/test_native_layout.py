"""The rooms of native/src (DESIGN.md, "native/"), read from the #include lines.

Each room has one concern and the includes between rooms run one way; a transport is reached
only through its ops table (core/transport.h), so another transport can be added, or one
replaced, without touching the core or its neighbours. These checks keep that true:

- no source lies directly in native/src: everything is in a room;
- a transport (native/src/transport/<name>/) includes no other transport's headers;
- nothing in native/src/core includes a file from transport/: the core sees transports only
  through core/transport.h, which declares their tables (core/transport.c lists them);
- no .c or .h in native/ reaches 32 KB (a reader should hold a file in their head).
"""
import re
from pathlib import Path

NATIVE = Path(__file__).resolve().parent.parent / "native"
SRC = NATIVE / "src"
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def sources(root):
    return sorted(p for p in root.rglob("*") if p.suffix in (".c", ".h"))


def includes(path):
    """The files that path includes, found as the compiler finds them: next to it, then in
    native/src and native/include (setup.py's include dirs)."""
    for name in INCLUDE.findall(path.read_text()):
        for base in (path.parent, SRC, NATIVE / "include"):
            if (base / name).is_file():
                yield (base / name).resolve()
                break
        else:
            raise AssertionError(f"{path}: #include \"{name}\" not found")


def transport_of(path):
    parts = path.relative_to(SRC).parts
    return parts[1] if parts[0] == "transport" and len(parts) > 2 else None


def test_every_source_is_in_a_room():
    assert [p.name for p in SRC.iterdir() if p.suffix in (".c", ".h")] == []


def test_transports_include_no_other_transport():
    files = sources(SRC / "transport")
    assert {transport_of(p) for p in files} >= {"shm", "tcp"}
    bad = [(str(p.relative_to(SRC)), str(i.relative_to(SRC))) for p in files
           for i in includes(p)
           if SRC in i.parents and transport_of(i) not in (None, transport_of(p))]
    assert bad == []


def test_core_sees_transports_only_through_the_ops_table():
    files = sources(SRC / "core")
    assert SRC / "core" / "transport.h" in files
    bad = [(str(p.relative_to(SRC)), str(i.relative_to(SRC))) for p in files
           for i in includes(p) if SRC / "transport" in i.parents]
    assert bad == []


def test_no_file_reaches_32_kb():
    sizes = {str(p.relative_to(NATIVE)): p.stat().st_size for p in sources(NATIVE)}
    assert len(sizes) > 20
    assert {name: n for name, n in sizes.items() if n >= 32 * 1024} == {}
