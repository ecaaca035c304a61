"""`import checkout` first makes `moetune` this checkout's code, installed or not: the folders
moetune/ and analysis/ are moetune and moetune.analysis (as a wheel installs them)."""
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "moetune" not in sys.modules:
    _pkg = types.ModuleType("moetune")
    _pkg.__path__ = [str(ROOT)]  # moetune.X is ROOT/X
    sys.modules["moetune"] = _pkg
