"""The direct allreduce's native one-exchange path over tcp (_native.Channel,
native/src/channel/direct.c) against the channel's Python path and numpy: bitwise the same
results for every op and dtype at odd sizes, each way a native call can hand the rest back to
Python taken and right (a late peer: `sent`; a slot not free yet: `unsent`), a mismatch found
by both ranks. Real ranks under the launcher, and across two network namespaces."""
import pytest

from conftest import check_ranks
from netns import netns  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.timeout(240)

TCP = {"POOLTENSOR_TRANSPORT": "tcp", "POOLTENSOR_TIMEOUT": "20"}


@pytest.mark.parametrize("n,slots,slow", [(2, None, True), (3, "1", False)],
                         ids=["2 ranks, one late", "3 ranks, one slot"])
def test_native_direct_allreduce_is_the_python_path(n, slots, slow):
    env = dict(TCP)
    if slots:
        env["POOLTENSOR_CHANNEL_SLOTS"] = slots
    p = check_ranks("launch", n, "coll_native.py", *(["slow"] if slow else []), env=env,
                    timeout=220)
    lines = [ln for ln in p.stdout.splitlines() if "native ok" in ln]
    assert len(lines) == n, p.stdout[-3000:]
    if slots == "1":
        # one slot: some call found its peer's slot not free yet and went the Python way
        assert any("'unsent': 0}" not in ln for ln in lines), lines


def test_native_direct_allreduce_across_namespaces(netns):
    from test_netns import check_ns_ranks
    outs = check_ns_ranks([0, 1], "coll_native.py", "slow", timeout=220)
    assert all("native ok" in o for o in outs), outs
