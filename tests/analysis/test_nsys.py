"""moetune/analysis/nsys.py, where Nsight Systems' tools are: $MOETUNE_NSYS wins over PATH, no nsys at all
is one line naming the fix, the version is the installed nsys's own line, and `has_recipes` tells
an nsys that runs `nsys recipe` (2023.x and later) from one that does not, judged by what the
binary answers (the installed nsys, and two stand-in scripts that answer as each kind does)."""
import re
import shutil
import stat

import pytest

from moetune.analysis import TraceError
from moetune.analysis import nsys


def stand_in(path, text, code=0):
    """A stand-in nsys (a shell script): prints `text` and exits with `code`, whatever it is asked."""
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}\nEOF\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_moetune_nsys_wins_over_path_and_none_is_one_line(tmp_path, monkeypatch):
    """The variable is read when asked (set after import, it counts); without it or PATH's, the
    error names scripts/nsys-up and MOETUNE_NSYS."""
    fake = stand_in(tmp_path / "nsys", "x")
    monkeypatch.setenv("MOETUNE_NSYS", fake)
    assert nsys.nsys_binary() == fake
    monkeypatch.delenv("MOETUNE_NSYS")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(TraceError, match="nsys not found.*MOETUNE_NSYS") as e:
        nsys.nsys_binary()
    assert len(str(e.value).splitlines()) == 1


def test_recipes_are_told_by_what_the_binary_answers(tmp_path):
    """An nsys that lists recipes has them; one that says 'unknown command' or fails has not."""
    new = stand_in(tmp_path / "nsys2025", "usage: nsys recipe [<args>] <recipe name>\n  cuda_gpu_kern_sum")
    old = stand_in(tmp_path / "nsys2022", "Unknown command: recipe", 1)
    assert nsys.has_recipes(new) is True
    assert nsys.has_recipes(old) is False
    assert nsys.has_recipes(str(tmp_path / "no-such-nsys")) is False


@pytest.mark.skipif(not shutil.which("nsys"), reason="no nsys installed")
def test_the_installed_nsys_has_recipes_exactly_from_2023_on():
    """The installed nsys (Debian's 2022.4 in CI): its version line is read, and it runs recipes
    exactly when its release year is 2023 or later."""
    binary = shutil.which("nsys")
    line = nsys.version(binary)
    year = int(re.search(r"version (\d{4})\.", line).group(1))
    assert nsys.has_recipes(binary) is (year >= 2023)
