"""benchmarks/device/keep_arch.py: only the kept architecture's GPU code survives in a fat binary."""
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "device"))
from keep_arch import keep_arch  # noqa: E402


def _entry(arch: int, payload: bytes) -> bytes:
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, 2, 0x101, 64, len(payload))  # kind 2: an ELF cubin
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def _fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_other_architectures_are_zeroed_and_the_rest_untouched():
    """keep_arch zeroes the fatbin entries of other GPU architectures in place and leaves the kept one,
    the headers and the host code as they were."""
    sm90, sm100, sm80 = b"\x90" * 100, b"\xa0" * 300, b"\x80" * 50
    host = b"host code \xba\x55 not a header"
    blob = bytearray(host + _fatbin(_entry(90, sm90), _entry(100, sm100)) + host + _fatbin(_entry(80, sm80)))
    before = bytes(blob)
    seen = keep_arch(blob, 90)
    assert seen == {90: 100, 100: 300, 80: 50}
    assert len(blob) == len(before)
    assert sm90 in blob and sm100 not in blob and sm80 not in blob
    assert blob.startswith(host) and host in blob[len(host):]
    # headers stay, so the runtime still reads every entry
    assert blob.count(struct.pack("<I", 0xBA55ED50)) == 2
    assert bytes(blob).replace(b"\0", b"") == before.replace(sm100, b"").replace(sm80, b"").replace(b"\0", b"")
