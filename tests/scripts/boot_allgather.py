"""Bootstrap, allgather the rank through the store, and print one JSON line per rank.

``--out DIR`` writes DIR/<rank>.json instead. ``--fake-hosts N`` pretends rank r runs on host r % N (through POOLTENSOR_HOST).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from collectives.rendezvous import allgather, barrier, bootstrap  # noqa: E402

if "--fake-hosts" in sys.argv:
    n = int(sys.argv[sys.argv.index("--fake-hosts") + 1])
    env_rank = next(os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "POOLTENSOR_RANK")
                    if v in os.environ)
    os.environ["POOLTENSOR_HOST"] = f"host{int(env_rank) % n}"

b = bootstrap(timeout=20)
ranks = [int(v) for v in allgather(b.store, "ranks", b.rank, b.size, str(b.rank).encode())]
barrier(b.store, "done", b.rank, b.size)
layout = b.layout()
server = getattr(b.store, "server", None)
row = json.dumps({
    "rank": b.rank, "size": b.size, "how": b.how, "ranks": ranks, "mpi": b.mpi_comm is not None,
    "local_rank": layout.local_rank, "local_size": layout.local_size,
    "bind": server.host if server else None,
})
if "--out" in sys.argv:  # mpiexec may splice the output lines of ranks: use one file each
    with open(os.path.join(sys.argv[sys.argv.index("--out") + 1], f"{b.rank}.json"), "w") as f:
        f.write(row)
else:
    print(row, flush=True)
b.close()
