"""``python -m partex.explorer [--port 5006] [--address 127.0.0.1] [--show] ...``: serve the
explorer, as ``partex serve`` does (the same options)."""

import sys

from partex.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
