"""Where the ``fleetrun`` binary is: the one installed with this package, else on PATH."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Iterator, Optional

from ._errors import FleetrunError

__all__ = ["fleetrun_binary"]


def _installed() -> Iterator[Path]:
    """The wheel's ``fleetrun`` as pip recorded it, then the scripts folders of this
    interpreter's install schemes (a virtualenv's ``bin/``, ``--user``'s)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            for file in distribution("fleetrun").files or ():
                if file.name == "fleetrun" and file.parent.name in ("bin", "Scripts"):
                    yield Path(str(file.locate())).resolve()
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover - Python < 3.8
        pass
    yield Path(sysconfig.get_path("scripts")) / "fleetrun"
    try:
        yield Path(sysconfig.get_path("scripts", f"{os.name}_user")) / "fleetrun"
    except KeyError:  # pragma: no cover - no user scheme
        pass
    yield Path(sys.prefix) / "bin" / "fleetrun"


def fleetrun_binary(explicit: Optional[str] = None) -> str:
    """The ``fleetrun`` executable to run: ``explicit`` when given, else the one installed
    with this package (its runner and worker are beside it), else the first on ``PATH``.

    Raises :class:`FleetrunError` when there is none.
    """
    if explicit:
        return explicit
    for candidate in _installed():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("fleetrun")
    if on_path:
        return on_path
    raise FleetrunError(
        "the fleetrun binary was not found beside this package nor on PATH: "
        "pip install the fleetrun wheel for this platform, or build it (cargo build --release)"
    )
