"""The ``pooltensor`` command (also ``python -m pooltensor``).

    pooltensor serve --memory 8GiB [--listen 127.0.0.1:7000] [--secret-file F]
                     [--data-port P] [--allow-code] [--metrics HOST:PORT]
    pooltensor doctor [--listen HOST:PORT | --peer HOST:PORT [--quick]]
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
    s.add_argument("--metrics", metavar="HOST:PORT",
                   help="also serve Prometheus metrics at http://HOST:PORT/metrics (':PORT': "
                        "every interface)")
    from .commands import bench, info, stats, store
    for command in (info, stats, bench, store):
        command.add_parser(sub)
    d = sub.add_parser(
        "doctor", help="what this machine offers pooltensor (RDMA devices, ports, GIDs), and "
                       "what to do about what is wrong",
        description="Check this machine: the verbs library, RDMA devices, ports and their "
                    "state, GIDs and their types, MTU, device caps, the profile verbs would "
                    "use, and a plain message for each known failure (no RDMA in the kernel, "
                    "RDMA not enabled on macOS, no IPv4 address on a Thunderbolt port, "
                    "Thunderbolt Bridge still present, port down). Exit status 1 when a "
                    "device is present but unusable.")
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
        return run()
    if args.command == "serve":
        from .pool.serve import parse_bytes, serve
        try:
            memory = parse_bytes(args.memory)
        except ValueError as e:
            p.error(f"--memory: {e}")
        if not 0 <= args.data_port <= 65535:
            p.error(f"--data-port must be 0..65535, not {args.data_port}")
        from collectives.errors import PooltensorError
        try:
            from .ops.members import handle
            return serve(memory, args.listen, args.secret_file, args.data_port, handle,
                         args.allow_code, metrics=args.metrics)
        except (ValueError, OSError, PooltensorError) as e:    # bad --listen, port taken, ...
            print(f"pooltensor serve: {e}", file=sys.stderr)
            return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
