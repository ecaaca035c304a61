"""Zero the GPU code of every architecture but one in a shared library's CUDA fat binaries.

`python benchmarks/device/keep_arch.py IN.so OUT.so 90` keeps the sm_90 images (H100, H200) and
overwrites the others with zeros, headers left as they are, so the CUDA runtime still reads every
fat binary and picks the sm_90 image; the zeros then compress to almost nothing. This is how the
registry's Transformer Engine core (343 MB library, 276 MB wheel, too big for one device call)
travels as 27 MB (benchmarks/device/te_bundle.sh).

Fat binary layout (as NVIDIA's fatbinary headers and public decoders describe it): a 16-byte
header (magic 0xBA55ED50, version 1, header size 16, size of the entries that follow), then
entries, each a header (kind, header size, payload size, ..., architecture at byte 28) and its
payload.
"""
import struct
import sys

MAGIC = struct.pack("<I", 0xBA55ED50)


def keep_arch(data: bytearray, keep: int) -> dict[int, int]:
    """Zero, in place, every entry payload whose architecture is not `keep`.
    Returns payload bytes seen per architecture."""
    seen: dict[int, int] = {}
    pos = 0
    while (i := data.find(MAGIC, pos)) >= 0:
        version, header, size = struct.unpack_from("<HHQ", data, i + 4)
        if version != 1 or header != 16:
            pos = i + 4
            continue
        e, end = i + header, i + header + size
        while e < end:
            _kind, _, eheader, payload = struct.unpack_from("<HHIQ", data, e)
            arch = struct.unpack_from("<I", data, e + 28)[0]
            seen[arch] = seen.get(arch, 0) + payload
            if arch != keep:
                data[e + eheader:e + eheader + payload] = bytes(payload)
            e += eheader + payload
        pos = end
    return seen


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: keep_arch.py IN.so OUT.so ARCH (e.g. 90)")
    src, dst, arch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = bytearray(open(src, "rb").read())
    seen = keep_arch(data, arch)
    if arch not in seen:
        sys.exit(f"keep_arch: {src} has no sm_{arch} code (has {sorted(seen)}); nothing written")
    open(dst, "wb").write(data)
    print(f"{src}: kept sm_{arch} ({seen[arch] / 1e6:.1f} MB), zeroed "
          + ", ".join(f"sm_{a} {b / 1e6:.1f} MB" for a, b in sorted(seen.items()) if a != arch))
