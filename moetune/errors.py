"""The one base of moetune's own errors, as the pipeline names it.

`MoetuneError` is defined with the analysis (moetune/analysis/errors.py), the layer every other imports,
so a `TraceError` is one too; every pipeline error derives from it. The CLI prints any of them as
its one line and exits 2; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

from moetune.analysis.errors import MoetuneError, SettingError, TraceError

__all__ = ["MoetuneError", "SettingError", "TraceError"]
