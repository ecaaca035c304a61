"""`moetune export`: a study's tuned configuration out, as something an engineer pastes: a clean
Megatron argument list, Megatron-Bridge recipe overrides, or a flag-by-flag diff against the
baseline (report/megatron_export.py and report/bridge.py build them); the study report writes all
three beside itself (`write_exports`)."""
from __future__ import annotations

from pathlib import Path

from moetune.errors import MoetuneError
from moetune.report.bridge import bridge_text
from moetune.report.megatron_export import Chosen, ExportError, choose, diff_text, megatron_text
from moetune.store import Store

FORMATS = ("megatron", "bridge", "diff")
__all__ = ["EXPORT_FILES", "FORMATS", "Chosen", "ExportError", "choose", "render", "write_exports"]


def render(c: Chosen, fmt: str) -> str:
    """The export of the chosen trial in one of FORMATS."""
    if fmt == "megatron":
        return megatron_text(c)
    if fmt == "bridge":
        return bridge_text(c)
    if fmt == "diff":
        return diff_text(c)
    raise ExportError(f"--format {fmt}: give one of {', '.join(FORMATS)}")


EXPORT_FILES = (("megatron", "megatron.sh"), ("bridge", "bridge.txt"), ("diff", "diff.md"))


def write_exports(store: Store, study_name: str, folder: Path) -> list[Path]:
    """The best kept configuration in every format, as `folder`/megatron.sh, bridge.txt and diff.md
    (the study report's export); none where the study has no judged trial yet, or its stored
    experiment no longer loads (the report itself still stands)."""
    try:
        c = choose(store, study_name)
    except MoetuneError:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for fmt, name in EXPORT_FILES:
        path = folder / name
        path.write_text(render(c, fmt))
        out.append(path)
    return out
