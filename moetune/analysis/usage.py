"""The argument parser of every `moetune` command: a usage error is one line on stderr and exit 2,
naming the nearest flag to a mistyped one, not argparse's whole usage block."""
from __future__ import annotations

import argparse
import difflib
import re
import sys


class Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors one line (subparsers are built of the same class)."""

    subcommands: dict[str, argparse.ArgumentParser] = {}
    """A command's parser by name, where the command has subcommands (moetune's own)."""

    def error(self, message: str):
        print(f"{self.prog}: {message}{self._nearest(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)

    def _nearest(self, message: str) -> str:
        """`; did you mean --limit?` for each unrecognized flag close to one of this parser's."""
        m = re.match(r"unrecognized arguments: (.*)", message)
        if not m:
            return ""
        flags = [s for s in self._option_string_actions if s.startswith("--")]
        near = [f"{w}: did you mean {close[0]}?" for w in m.group(1).split() if w.startswith("-")
                for close in [difflib.get_close_matches(w.split("=", 1)[0], flags, n=1, cutoff=0.6)] if close]
        return f" ({'; '.join(near)})" if near else ""
