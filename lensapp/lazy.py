"""A package's names imported from its modules on first use (PEP 562), so importing the package loads nothing.

`lensapp serve` reads its settings and request fields and answers its first page before torch is loaded, and
the command line's parser reads `FitConfig` without it: `service/` and `fitting/` hand on their names this way.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable


def lazy_names(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """The module `__getattr__` of `package`: `name` imported from its module `.{where[name]}` on first use and
    kept on the package, so the next use is a plain attribute."""
    def attribute(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{where[name]}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    return attribute
