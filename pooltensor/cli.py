"""The ``pooltensor`` command (also ``python -m pooltensor``).

    pooltensor serve --memory 8GiB [--listen 127.0.0.1:7000] [--secret-file F]
                     [--data-port P] [--allow-code] [--metrics HOST:PORT]
    pooltensor doctor [--json] [--endpoint HOST:PORT ...] [--server HOST:PORT ...]
    pooltensor doctor --listen HOST:PORT | --peer HOST:PORT [--quick]
    pooltensor info [--json]
    pooltensor stats HOST:PORT [--json] [--watch [--interval S] [--count N]] [--plot PATH]
    pooltensor bench [NAME ...] [--quick] [--out DIR] [--list] [--json]
    pooltensor store ls|load|drop [NAME] [FILE ...] [--connect H:P,...] [--secret-file F]

This module only wires the parsers: serve and doctor are here, the others live in
pooltensor/commands/ (one module each, registering itself with add_parser).

Unknown options and malformed values are errors (status 2), reported in one line.
"""
import argparse
import sys


def _parser():
    p = argparse.ArgumentParser(
        prog="pooltensor", description="pooltensor: pooled memory for numpy and JAX arrays.",
        epilog="pooltensor COMMAND --help tells more of each.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    s = sub.add_parser(
        "serve", help="contribute memory to the pools of processes that connect here",
        description="Contribute memory until stopped (SIGTERM or Ctrl-C: clean exit). Scripts "
                    "use it with pooltensor.init(connect=['HOST:PORT', ...]).")
    s.add_argument("--memory", required=True, metavar="SIZE",
                   help="bytes to contribute, e.g. 8GiB, 512MiB (K/M/G/T: powers of 1024; "
                        "KB/MB/GB: of 1000)")
    s.add_argument("--listen", default="127.0.0.1:7000", metavar="HOST:PORT",
                   help="address of the control port (default 127.0.0.1:7000, this machine "
                        "only; 0.0.0.0:7000 for every interface)")
    s.add_argument("--secret-file", metavar="F",
                   help="file holding the shared secret (default $POOLTENSOR_SECRET_FILE, else "
                        "~/.config/pooltensor/secret, made with mode 0600 if missing)")
    s.add_argument("--data-port", type=int, default=0, metavar="P",
                   help="port of the native data path (default: any free port; the clients "
                        "learn it on the control port)")
    s.add_argument("--allow-code", action="store_true",
                   help="also run code that authenticated clients send (pooltensor.map_blocks "
                        "functions); without it the server computes only numpy's operations "
                        "on the slabs it holds")
    s.add_argument("--partition", action="append", default=[], metavar="NAME=RESERVE:LIMIT",
                   help="declare a partition (repeatable), e.g. prod=64GiB:128GiB: RESERVE is "
                        "held for it, LIMIT caps it (omitted: no cap); clients name theirs "
                        "with pooltensor.init(partition=NAME)")
    s.add_argument("--lease", metavar="SIZE", default="128MiB",
                   help="clients that do not choose lend their grant in leases of SIZE "
                        "(default 128MiB): only what they lend counts against --memory and is "
                        "served to them, and what they stop using comes back; 0: clients "
                        "are given their whole grant up front")
    s.add_argument("--metrics", metavar="HOST:PORT",
                   help="also serve Prometheus metrics at http://HOST:PORT/metrics (':PORT': "
                        "every interface)")
    from .commands import bench, check, info, stats, store
    for command in (info, stats, bench, check, store):
        command.add_parser(sub)
    d = sub.add_parser(
        "doctor", help="check this machine and what it reaches (huge pages, secret file, "
                       "ports, transports per peer, RDMA), with the fix for each failure",
        description="Check this machine, a line each ([pass], [info], [warn], [fail]; the fix "
                    "under each warn and fail): shared-memory huge pages, the secret file and "
                    "its mode, the ports of the jobs and servers named with --endpoint and "
                    "--server, the transport each peer pair of a running job uses, then "
                    "verbs: the library, RDMA devices, ports and their state, GIDs and their "
                    "types, MTU, device caps and the profile verbs would use. Exit status 1 "
                    "when a check fails.")
    d.add_argument("--json", action="store_true", help="print one JSON object: status and the "
                   "findings (check, level, text, fix)")
    d.add_argument("--endpoint", action="append", default=[], metavar="HOST:PORT",
                   help="a running job's or server's metrics endpoint: reach it and the ports "
                        "its member listens on, and show the transport to each peer (repeat "
                        "for every rank: rank r of SPMD serves on PORT + its local rank)")
    d.add_argument("--server", action="append", default=[], metavar="HOST:PORT",
                   help="a memory server's control port: reach it, and its data port when "
                        "this machine holds the secret (repeatable)")
    d.add_argument("--timeout", type=float, default=3.0, metavar="S",
                   help="seconds to wait for each connection (default 3)")
    d.add_argument("--listen", metavar="HOST:PORT",
                   help="pair self-test, passive end: wait at HOST:PORT for `pooltensor doctor "
                        "--peer HOST:PORT` on another machine")
    d.add_argument("--peer", metavar="HOST:PORT",
                   help="pair self-test, measuring end: join the --listen end at HOST:PORT "
                        "over verbs; latency P50/P99 and bandwidth 4 KiB .. 64 MiB")
    d.add_argument("--quick", action="store_true", help="pair self-test: up to 1 MiB, briefly")
    return p


def main(argv=None):
    """Entry point of the ``pooltensor`` command; returns the exit status."""
    p = _parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        p.print_help(sys.stderr)
        return 2
    if hasattr(args, "run"):
        return args.run(args)
    if args.command == "doctor":
        from .doctor import pair, run
        if args.listen and args.peer:
            p.error("doctor: --listen or --peer, not both")
        if args.listen or args.peer:
            return pair("listen" if args.listen else "peer", args.listen or args.peer,
                        args.quick)
        if not args.timeout > 0:
            p.error(f"doctor: --timeout must be a positive number of seconds, not "
                    f"{args.timeout:g}")
        return run(opts={"endpoints": args.endpoint, "servers": args.server,
                         "timeout": args.timeout}, as_json=args.json)
    if args.command == "serve":
        from .pool.serve import parse_bytes, serve
        try:
            memory = parse_bytes(args.memory)
        except ValueError as e:
            p.error(f"--memory: {e}")
        if not 0 <= args.data_port <= 65535:
            p.error(f"--data-port must be 0..65535, not {args.data_port}")
        from .pool.partitions import parse_spec
        try:
            parts = [parse_spec(x) for x in args.partition]
        except (TypeError, ValueError) as e:
            p.error(f"--partition: {e}")
        try:
            lease = None if args.lease.strip() == "0" else parse_bytes(args.lease)
        except ValueError as e:
            p.error(f"--lease: {e}")
        from collectives.errors import PooltensorError
        try:
            from .ops.members import handle
            return serve(memory, args.listen, args.secret_file, args.data_port, handle,
                         args.allow_code, metrics=args.metrics, partitions=parts,
                         lease=lease)
        except (ValueError, OSError, PooltensorError) as e:    # bad --listen, port taken, ...
            print(f"pooltensor serve: {e}", file=sys.stderr)
            return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
