"""pandas refused in a build's processes, which never use it.

pyarrow imports pandas, where it can, at its first conversions between Arrow, numpy and Python:
0.2 to 0.5 s of CPU (holding the GIL) and tens of MB in each process. ``refuse`` keeps pandas
findable (a spec, so that probes such as transformers' ``find_spec`` at its import go on as they
would; one that asks for its version reads the installed metadata), and makes importing it an
ImportError, which pyarrow takes as pandas being absent.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys


class _Refused(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds pandas and its modules, and refuses to load them."""

    def find_spec(self, name, path, target=None):
        if name == "pandas" or name.startswith("pandas."):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        raise ImportError(f"{spec.name}: a build's processes do not use pandas", name=spec.name)

    def exec_module(self, module):
        raise ImportError(f"{module.__name__}: a build's processes do not use pandas")


def refuse() -> None:
    """Refuse pandas in this process from now on (again: nothing), unless it is imported."""
    if "pandas" not in sys.modules and not any(isinstance(f, _Refused) for f in sys.meta_path):
        sys.meta_path.insert(0, _Refused())
