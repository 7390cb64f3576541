"""``python -m partex.explorer [--port 5006] [--address 127.0.0.1] [--show]``: serve the explorer."""

import argparse
import sys

from . import serve


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m partex.explorer", description="Serve the partex explorer.")
    ap.add_argument("--port", type=int, default=5006)
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--show", action="store_true", help="open it in a browser")
    args = ap.parse_args(argv)
    return serve(port=args.port, address=args.address, show=args.show)


if __name__ == "__main__":
    sys.exit(main())
