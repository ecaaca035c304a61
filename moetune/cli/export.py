"""`moetune export STUDY [--trial N] [--format megatron|bridge|diff] [--out FILE]`: the study's best
kept configuration (the one its report names best), or trial N, as something an engineer pastes:
a clean Megatron argument list without moetune's measuring flags, Megatron-Bridge recipe overrides,
or a flag-by-flag diff against the baseline with the decision and evidence of each change
(report/export.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from moetune.analysis.usage import Parser
from moetune.cli.common import exit_code, positive_int
from moetune.errors import MoetuneError
from moetune.experiment.schema import check_name
from moetune.report import export
from moetune.store import Store


def main(argv: list[str], db: str | None = None) -> int:
    return exit_code(lambda a: _main(a, db), argv)


def _main(argv: list[str], db: str | None) -> int:
    p = Parser(prog="moetune export", description=__doc__.split("\n\n")[0])
    p.add_argument("study", help="the study's name (`moetune status` lists them)")
    p.add_argument("--trial", type=positive_int, metavar="N",
                   help="the trial's number in the study (default: the best kept configuration)")
    p.add_argument("--format", default="megatron", choices=export.FORMATS,
                   help="megatron: Megatron-LM arguments, one a line; bridge: Megatron-Bridge overrides; "
                        "diff: against the baseline, flag by flag (default megatron)")
    p.add_argument("--out", metavar="FILE", help="write it to FILE (default: print it)")
    a = p.parse_args(argv)
    try:
        check_name(a.study, "study")
        text = export.render(export.choose(Store(db, read_only=True), a.study, a.trial), a.format)
        if a.out:
            _write(Path(a.out), text)
    except MoetuneError as e:
        print(f"moetune export: {e}", file=sys.stderr)
        return 2
    if a.out:
        print(f"{a.format}: {a.out}")
    else:
        sys.stdout.write(text)
    return 0


class OutError(MoetuneError):
    """--out names a file that cannot be written."""


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise OutError(f"--out {path}: cannot be written ({e.strerror or e}); give another file") from None
