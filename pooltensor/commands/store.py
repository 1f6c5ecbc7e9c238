"""``pooltensor store ls|load|drop``: the tensor stores kept on memory servers, from a shell.

    pooltensor store ls   --connect h1:7000,h2:7000 [--secret-file F] [--json]
    pooltensor store load NAME FILE.safetensors [FILE ...] --connect ... [--publish]
    pooltensor store drop NAME --connect ...

A store on servers outlives the command that loaded it (pooltensor.store), so a model can be
loaded once by an operator and opened by every job later. --connect defaults to
$POOLTENSOR_CONNECT; the secret to --secret-file, $POOLTENSOR_SECRET_FILE, then the default."""
import json
import sys


def add_parser(sub):
    """Register ``store`` and its three subcommands."""
    p = sub.add_parser("store", help="list, load or drop the tensor stores on memory servers",
                       description="The tensor stores (pooltensor.store) kept on memory "
                                   "servers: list them, load safetensors files as one, drop "
                                   "one.")
    ss = p.add_subparsers(dest="store_command", metavar="{ls,load,drop}", required=True)
    ls = ss.add_parser("ls", help="every store: version, tensors, bytes")
    ls.add_argument("--json", action="store_true", help="print one JSON object instead")
    ld = ss.add_parser("load", help="load safetensors files as store NAME")
    ld.add_argument("name")
    ld.add_argument("files", nargs="+")
    ld.add_argument("--publish", action="store_true",
                    help="make a new version if NAME exists (readers of the old keep it)")
    dr = ss.add_parser("drop", help="remove store NAME (freed once its readers close it)")
    dr.add_argument("name")
    for q in (ls, ld, dr):
        q.add_argument("--connect", metavar="H:P,...", help="the memory servers (default "
                                                           "$POOLTENSOR_CONNECT)")
        q.add_argument("--secret-file", metavar="F", help="the servers' secret")
    p.set_defaults(run=run)
    return p


def run(args):
    from collectives.errors import PooltensorError
    from .. import store
    from ..pool import runtime
    from ..pool.client import connect_from_env
    connect = args.connect or connect_from_env()
    if not connect:
        print("pooltensor store: name the memory servers: --connect H:P,... or "
              "$POOLTENSOR_CONNECT", file=sys.stderr)
        return 2
    try:
        runtime.init(connect=connect, secret_file=args.secret_file, memory=1 << 20)
    except (ValueError, OSError, PooltensorError) as e:
        print(f"pooltensor store: {e}", file=sys.stderr)
        return 1
    try:
        if args.store_command == "ls":
            stores = store.list()
            if args.json:
                print(json.dumps(stores, indent=1, sort_keys=True))
            else:
                for name, s in sorted(stores.items()):
                    print(f"{name}  version {s['version']}  {s['tensors']} tensors  "
                          f"{s['bytes']} bytes")
        elif args.store_command == "load":
            how = store.publish if args.publish else store.load_safetensors
            s = how(args.name, args.files) if args.publish else how(args.files, args.name)
            print(f"{s.name}  version {s.version}  {len(s)} tensors  {s.nbytes} bytes")
            s.close()
        else:
            store.drop(args.name)
            print(f"dropped {args.name}")
        return 0
    except KeyError as e:
        print(f"pooltensor store: {e.args[0]}", file=sys.stderr)
        return 1
    except (ValueError, OSError, PooltensorError) as e:
        print(f"pooltensor store: {e}", file=sys.stderr)
        return 1
    finally:
        runtime.finalize()
