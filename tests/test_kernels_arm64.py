"""The native kernels bit for bit across instruction sets and machines, through the C harness
native/tests/kernels_check.c (native/ alone, no Python in the loop).

Natively, the harness runs every op x dtype x length (0, 1, odd, unaligned, aliased, block and
vector-width neighbourhoods, NaN/inf/-0.0/subnormals for floats, wrapping integers), copy and
strided gather/scatter through every variant this CPU runs (scalar, avx2, avx512 where the CPU
has them) against scalar, and fails on any differing bit. Cross-compiled for aarch64 with
aarch64-linux-gnu-gcc and run under qemu-aarch64, it does the same for neon and scalar there;
its digest per case must then equal the x86-64 one, which is what a collective on a mixed
x86/arm cluster needs (every rank computes the same bits). The cross test is skipped when the
cross compiler or qemu is missing (.ci/run installs them where apt-get exists).
"""
import os
import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"
HARNESS = NATIVE / "tests" / "kernels_check.c"
KERNELS = sorted((NATIVE / "src" / "kernels").glob("kernels*.c"))
# as setup.py builds them
FLAGS = ["-std=gnu11", "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden",
         f"-I{NATIVE / 'include'}", f"-I{NATIVE / 'src'}"]
CROSS = "aarch64-linux-gnu-gcc"


def _build(cc, out, extra=()):
    """Compile the kernels at setup.py's flags and the harness, in parallel; link to out."""
    jobs = [(src, out.parent / f"{out.name}-{src.stem}.o", "-O3") for src in KERNELS]
    jobs.append((HARNESS, out.parent / f"{out.name}-harness.o", "-O1"))

    def compile_one(job):
        src, obj, opt = job
        return subprocess.run([cc, *FLAGS, opt, *extra, "-c", str(src), "-o", str(obj)],
                              capture_output=True, text=True, timeout=240)

    with ThreadPoolExecutor(2) as pool:
        for res in pool.map(compile_one, jobs):
            assert res.returncode == 0, res.stderr
    res = subprocess.run([cc, *extra, *[str(j[1]) for j in jobs], "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return out


def _run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    lines = res.stdout.splitlines()
    assert lines and lines[-1].startswith("# summary"), res.stderr[-2000:]
    return res.returncode, lines, res.stderr


def _cases(lines):
    """{case: (digest, nan-digest)} in order, from the harness's lines."""
    out = {}
    for line in lines:
        if line.startswith("#"):
            continue
        name, digest, nan_digest = line.rsplit(" ", 2)
        assert name not in out, f"case twice: {name}"
        out[name] = (digest, nan_digest)
    return out


@pytest.fixture(scope="module")
def native_run(tmp_path_factory):
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)),
              None)
    if cc is None:
        pytest.skip("no C compiler here")
    extra = ["-DPT_X86=1"] if platform.machine() in ("x86_64", "AMD64") else []
    exe = _build(cc, tmp_path_factory.mktemp("kernels_check") / "native", extra)
    return _run([str(exe), "--quick"])


@pytest.mark.timeout(600)
def test_every_variant_equals_scalar_bitwise(native_run):
    """Every variant this CPU runs, and the dispatched entry points, against scalar: the same
    bytes for every case, NaNs included; copy, gather and scatter against plain loops."""
    rc, lines, err = native_run
    summary = lines[-1]
    assert rc == 0 and " mismatches=0 nan-payload-only=0" in summary, \
        summary + "\n" + "\n".join(err.splitlines()[:30])
    cases = _cases(lines)
    assert len(cases) > 20000
    for kind in ("reduce ", "reduce_all ", "copy ", "copy_stream ", "gather ", "scatter "):
        assert any(name.startswith(kind) for name in cases), kind
    if platform.machine() == "x86_64":
        assert "variants=scalar," in summary


@pytest.mark.timeout(600)
def test_aarch64_under_qemu_equals_x86_64(native_run, tmp_path):
    """Built for aarch64 (neon and scalar variants) and run under qemu-aarch64: no variant
    differs from scalar there, and every case's digest equals this machine's, bit for bit."""
    if platform.machine() != "x86_64":
        pytest.skip(f"compares aarch64 with x86-64; this machine is {platform.machine()}")
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if not shutil.which(CROSS) or not qemu:
        pytest.skip(f"no {CROSS} / qemu-aarch64 here (apt-get install gcc-aarch64-linux-gnu "
                    "qemu-user)")
    exe = _build(CROSS, tmp_path / "aarch64", ["-static"])
    rc, lines, err = _run([qemu, str(exe), "--quick"])
    summary = lines[-1]
    assert "isa=neon" in summary and "variants=scalar,neon,dispatch" in summary, summary
    assert rc == 0 and " mismatches=0 nan-payload-only=0" in summary, \
        summary + "\n" + "\n".join(err.splitlines()[:30])
    ours, theirs = _cases(native_run[1]), _cases(lines)
    assert list(theirs) == list(ours), "the two machines ran different cases"
    differ = [f"  {name}: x86-64 {ours[name][0]}, aarch64 {theirs[name][0]}"
              + (" (NaN bits only)" if ours[name][1] == theirs[name][1] else "")
              for name in ours if ours[name] != theirs[name]]
    assert not differ, f"{len(differ)} of {len(ours)} cases differ:\n" + "\n".join(differ[:30])
