"""`import checkout` first makes `moetune` this checkout's package, installed or not: its folder
moetune/ goes first on the path."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
