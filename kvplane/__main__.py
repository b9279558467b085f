"""`python -m kvplane ...` is the `kvplane` command (the local cluster launches its children this way)."""

import sys

from kvplane.apps.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
