"""Alias of `localsgd.runner`, kept so ``python -m localsgd.ddp`` (the runner's old launch
command) keeps working. The engine lives in `localsgd.engines.ddp`."""

from localsgd.runner import exit_now, main

if __name__ == "__main__":
    exit_now(main())
