"""``pooltensor check HOST:PORT``: ask a running job whether its pool's state holds together.

The job serves metrics (``pooltensor.init(metrics=...)``); its endpoint also answers /check
with Pool.check()'s report (pooltensor/pool/check.py: the directory, the allocators' books,
partitions, versions and replicas compared). Prints it; exit status 0 when everything
agrees, 1 when something differs, 2 when the job cannot be asked.
"""
import json
import sys
import urllib.error
import urllib.request


def add_parser(sub):
    """Register ``check``."""
    p = sub.add_parser(
        "check", help="verify a running job's pool: directory, versions, replicas",
        description="Ask the job serving metrics at HOST:PORT (pooltensor.init(metrics=...)) "
                    "to compare its pool's directory, allocators, partitions, versions and "
                    "replicas; print the differences. Exit 0: all agree, 1: differences, "
                    "2: the job could not be asked.")
    p.add_argument("address", metavar="HOST:PORT", help="the job's metrics endpoint")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for the report (default 60)")
    p.set_defaults(run=run)
    return p


def ask(address, timeout=60.0):
    """The job's report (a dict); OSError/ValueError saying why it could not be read."""
    url = address if "://" in address else f"http://{address}/check"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        try:
            why = json.loads(e.read().decode()).get("error", e.reason)
        except ValueError:
            why = e.reason
        raise OSError(f"{url}: {why}") from None
    except urllib.error.URLError as e:
        raise OSError(f"cannot read {url}: {e.reason}") from None


def run(args):
    try:
        rep = ask(args.address, args.timeout)
    except (OSError, ValueError) as e:
        print(f"pooltensor check: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rep))
    else:
        c = rep.get("checked", {})
        print(f"checked {c.get('arrays', 0)} arrays, {c.get('slabs', 0)} slabs, "
              f"{c.get('replica_slabs', 0)} replica copies, {c.get('cached_versions', 0)} "
              f"cached versions")
        for d in rep.get("differences", []):
            print(f"  differs: {d}")
        print("ok" if rep.get("ok") else f"{len(rep.get('differences', []))} difference(s)")
    return 0 if rep.get("ok") else 1
