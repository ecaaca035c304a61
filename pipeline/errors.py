"""The one base of moetune's own errors.

Every error an engineer can act on is a `MoetuneError` subclass, raised with one line that names
the file or key at fault and what to do; the CLI prints it as that line and exits 2. Anything
else is a bug and keeps its traceback.
"""
from __future__ import annotations


class MoetuneError(Exception):
    """An error an engineer can fix: one line, names what is wrong and what is allowed."""
