"""Our declarations of the verbs ABI against rdma-core's own headers.

The verbs transport is built without rdma-core (native/src/transport/verbs/verbs_abi.h holds
our own declarations of what it uses), so a wrong field offset or constant would pass every
test against the simulated provider and crash on hardware. tests/verbs/abi_check.c includes
both <infiniband/verbs.h> and ours and compares the size of every struct, the offset and size
of every field and the value of every constant we declare. Needs libibverbs-dev (.ci/run
installs it where apt-get exists); skipped with the reason elsewhere.
"""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ABI = ROOT / "native" / "src" / "transport" / "verbs" / "verbs_abi.h"
CHECK = ROOT / "tests" / "verbs" / "abi_check.c"
HEADER = Path("/usr/include/infiniband/verbs.h")
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = pytest.mark.skipif(
    not HEADER.exists() or not CC,
    reason="rdma-core's headers (libibverbs-dev) or a C compiler are not installed here")


def _run(tmp_path, src_dir):
    exe = tmp_path / "abi_check"
    res = subprocess.run([CC, "-std=gnu11", "-Wall", f"-I{src_dir}", f"-I{ROOT / 'native' / 'include'}",
                          str(CHECK), "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)


def test_every_declaration_matches_rdma_core(tmp_path):
    res = _run(tmp_path, ROOT / "native" / "src")
    bad = [line for line in res.stdout.splitlines() if line.startswith("BAD")]
    assert res.returncode == 0 and not bad, "\n".join(bad)
    total = int(re.search(r"(\d+) checks, 0 differ", res.stdout).group(1))
    assert total > 400          # every struct, field and constant, not a handful


@pytest.mark.parametrize("old,new,what", [
    ("    uint32_t lkey;\n    uint32_t rkey;", "    uint64_t lkey;\n    uint32_t rkey;",
     "ibv_mr.rkey"),
    ("PT_IBV_WR_RDMA_READ = 4", "PT_IBV_WR_RDMA_READ = 3", "IBV_WR_RDMA_READ"),
    ("    pt_ibv_poll_cq_fn poll_cq;\n", "    void *extra;\n    pt_ibv_poll_cq_fn poll_cq;\n",
     "ibv_context_ops.poll_cq"),
])
def test_a_planted_mistake_is_found(tmp_path, old, new, what):
    """The check fails on a wrong declaration (so its passing means something)."""
    text = ABI.read_text()
    assert old in text
    planted = tmp_path / "src" / "transport" / "verbs"
    planted.mkdir(parents=True)
    (planted / "verbs_abi.h").write_text(text.replace(old, new, 1))
    res = _run(tmp_path, tmp_path / "src")
    assert res.returncode == 1
    assert any(line.startswith("BAD") and what in line for line in res.stdout.splitlines()), \
        res.stdout[-2000:]
