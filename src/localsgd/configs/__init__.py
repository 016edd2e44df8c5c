"""Training configurations shipped with the package (YAML files of ``TrainConfig`` fields).

``resolve("run")`` finds the shipped ``run.yaml``; anything that looks like a path (it holds a
path separator or ends in ``.yaml``/``.yml``) is taken as a path. Every file here is loaded into
``TrainConfig.from_dict`` by the tests, and the documentation's commands use these names.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUFFIXES = (".yaml", ".yml")


def shipped() -> dict[str, Path]:
    """{name: path} of every shipped config, sorted by name."""
    return {p.stem: p for p in sorted(HERE.glob("*.yaml"))}


def resolve(name_or_path: str | os.PathLike) -> Path:
    """The YAML file meant by ``name_or_path``: a shipped config's name (``"run"``) or a path.

    A bare name (no path separator, no ``.yaml``/``.yml`` suffix) must be a shipped config; an
    unknown one is a ``FileNotFoundError`` listing the shipped names. A path must exist.
    """
    text = os.fspath(name_or_path)
    seps = {os.sep, "/"} | ({os.altsep} if os.altsep else set())
    if not any(s in text for s in seps) and not text.endswith(SUFFIXES):
        found = shipped()
        if text in found:
            return found[text]
        raise FileNotFoundError(f"no shipped config named {text!r}; shipped configs: "
                                f"{', '.join(found)} (or give a path to a YAML file)")
    path = Path(text).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"config file {text!r} not found; shipped configs (by name, "
                                f"without .yaml): {', '.join(shipped())}")
    return path


def load(name_or_path: str | os.PathLike) -> dict:
    """The mapping of TrainConfig fields in the resolved file."""
    import yaml

    path = resolve(name_or_path)
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:  # one line: where, and what the parser saw
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ValueError(f"config {path}: not valid YAML{at}: {problem}") from None
    if not isinstance(values, dict):
        raise ValueError(f"config {path}: expected a mapping of TrainConfig fields "  # noqa: TRY004
                         f"(name: value lines), got {type(values).__name__}")
    return values
