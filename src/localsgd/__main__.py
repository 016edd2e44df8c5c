"""``python -m localsgd`` and the ``localsgd`` command (pyproject's console script).

``localsgd train`` is the library's (`localsgd.training.cli`); every other command is the
reproduction's (notebooks, figures, report, benchmarks). Both need the ``[paper]`` extra --
the training loop's records are a pandas table, its progress bars tqdm's; on the base install
(the library alone) the command says so in one line."""

import sys

# what `pip install localsgd` leaves out and `localsgd[paper]` adds (pyproject.toml)
PAPER_ONLY = {"pandas", "matplotlib", "seaborn", "papermill", "nbformat", "nbclient",
              "ipykernel", "jupyterlab", "ipywidgets", "tqdm"}


def main() -> int:
    try:
        if sys.argv[1:2] == ["train"]:  # the library's front door, not the reproduction's
            from localsgd.training.cli import main as train

            return train(sys.argv[2:])
        from localsgd.paper.cli import main as cli

        return cli()
    except ModuleNotFoundError as err:
        if err.name not in PAPER_ONLY:
            raise
        print(f"error: the localsgd command needs {err.name}, which the base install leaves "
              "out: pip install 'localsgd[paper]' (the make targets install it)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
