"""Build tiny Nsight Systems SQLite exports by hand, with the real tables and column names of
the 2025.3 exporter (and the older 2022.4 NVTX layout), for metric tests with known answers."""
from __future__ import annotations

import sqlite3
from pathlib import Path

PID = 0x100 << 24  # globalPid of pid 256

SCHEMA_2025 = {
    "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
    "META_DATA_EXPORT": "name TEXT, value TEXT",
    "TARGET_INFO_GPU": "id INTEGER, name TEXT, totalMemory INTEGER, busLocation TEXT",
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        'start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, '
        "contextId INTEGER, greenContextId INTEGER, streamId INTEGER NOT NULL, "
        "correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, "
        "shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, gridX INTEGER, "
        "gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER, "
        "registersPerThread INTEGER, graphNodeId INTEGER"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        'start INTEGER NOT NULL, "end" INTEGER NOT NULL, eventClass INTEGER NOT NULL, '
        "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER, "
        "callchainId INTEGER"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        'start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, '
        "contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "bytes INTEGER, copyKind INTEGER"),
    "NVTX_EVENTS": (
        'start INTEGER NOT NULL, "end" INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, '
        "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
        "textId INTEGER, domainId INTEGER"),
    "CUDA_GPU_MEMORY_USAGE_EVENTS": (
        "start INTEGER NOT NULL, globalPid INTEGER, deviceId INTEGER, contextId INTEGER, "
        "address INTEGER, pc INTEGER, bytes INTEGER, memKind INTEGER, "
        "memoryOperationType INTEGER, name TEXT, correlationId INTEGER, streamId INTEGER"),
}


class TraceBuilder:
    """Add kernels, launches, NVTX ranges and memory events; `write(path)` makes the SQLite."""

    def __init__(self, gpu_memory_gb: float = 80.0):
        self.strings: dict[str, int] = {}
        self.kernels, self.runtime, self.nvtx, self.memcpy, self.memory = [], [], [], [], []
        self.gpu_memory = int(gpu_memory_gb * 2**30)
        self.corr = 0

    def sid(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings) + 1)

    def kernel(self, name, start_us, end_us, device=0, stream=7, pid=PID, launch_us=None):
        """A kernel; `launch_us` = (start, end) of its cudaLaunchKernel call on the host."""
        self.corr += 1
        self.kernels.append((int(start_us * 1000), int(end_us * 1000), device, stream, self.corr,
                             pid, self.sid(name)))
        if launch_us is not None:
            self.call("cudaLaunchKernel_v7000", *launch_us, pid=pid, corr=self.corr)
        return self

    def call(self, name, start_us, end_us, pid=PID, corr=None):
        if corr is None:
            self.corr += 1
            corr = self.corr
        self.runtime.append((int(start_us * 1000), int(end_us * 1000), pid + 1, corr, self.sid(name)))
        return self

    def range(self, text, start_us, end_us, pid=PID, via_id=True):
        self.nvtx.append((int(start_us * 1000), int(end_us * 1000), pid + 1, text, via_id))
        return self

    def alloc(self, at_us, nbytes, free=False, device=0, pid=PID):
        self.memory.append((int(at_us * 1000), pid, device, nbytes, 1 if free else 0))
        return self

    def copy(self, start_us, end_us, device=0, stream=8, pid=PID):
        self.memcpy.append((int(start_us * 1000), int(end_us * 1000), device, stream, pid))
        return self

    def write(self, path: Path, schema: str = "2025") -> Path:
        path = Path(path)
        path.unlink(missing_ok=True)
        con = sqlite3.connect(path)
        for table, cols in SCHEMA_2025.items():
            if schema == "2022" and table == "NVTX_EVENTS":
                cols = cols.replace(", textId INTEGER, domainId INTEGER", ", domainId INTEGER")
            con.execute(f"CREATE TABLE {table} ({cols})")
        con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PROGRAM_VERSION', ?)",
                    ("2025.3.2" if schema == "2025" else "2022.4.2",))
        con.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H200', ?, '0000:01:00.0')",
                    (self.gpu_memory,))
        for s, e, dev, stream, corr, pid, name in self.kernels:
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, \"end\", deviceId, streamId, "
                        "correlationId, globalPid, demangledName, shortName) VALUES (?,?,?,?,?,?,?,?)",
                        (s, e, dev, stream, corr, pid, name, name))
        for s, e, tid, corr, name in self.runtime:
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, \"end\", eventClass, globalTid, "
                        "correlationId, nameId) VALUES (?,?,1,?,?,?)", (s, e, tid, corr, name))
        for s, e, tid, text, via_id in self.nvtx:
            if schema == "2025" and via_id:
                con.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, globalTid, textId) "
                            "VALUES (?,?,59,?,?)", (s, e, tid, self.sid(text)))
            else:
                con.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, globalTid, text) "
                            "VALUES (?,?,59,?,?)", (s, e, tid, text))
        for s, e, dev, stream, pid in self.memcpy:
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, \"end\", deviceId, streamId, "
                        "globalPid, bytes, copyKind) VALUES (?,?,?,?,?,1024,1)", (s, e, dev, stream, pid))
        for s, pid, dev, nbytes, op in self.memory:
            con.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, bytes, "
                        "memoryOperationType) VALUES (?,?,?,?,?)", (s, pid, dev, nbytes, op))
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in self.strings.items()])
        con.commit()
        con.close()
        return path


def foreign_sqlite(path: Path) -> Path:
    """An SQLite file that is no Nsight Systems export (one unrelated table)."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    return path
