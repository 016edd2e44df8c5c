"""Alias of `localsgd.runner`, kept so ``python -m localsgd.ddp`` (the runner's old launch
command) keeps working. The engine lives in `localsgd.engines.ddp`."""

import sys

from localsgd.runner import main

if __name__ == "__main__":
    sys.exit(main())
