"""Copy only the tables moetune's analysis reads out of an nsys SQLite export, then VACUUM.

    python benchmarks/slim_trace.py IN.sqlite OUT.sqlite
"""
import sqlite3
import sys

KEEP = ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
        "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUDA_GPU_MEMORY_USAGE_EVENTS",
        "NVTX_EVENTS", "TARGET_INFO_GPU", "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT",
        "ThreadNames", "ProcessStreams")


def slim(src: str, dst: str) -> None:
    con = sqlite3.connect(dst)
    con.execute("ATTACH DATABASE ? AS src", (src,))
    names = [r[0] for r in con.execute("SELECT name, sql FROM src.sqlite_master WHERE type='table'")]
    for name in names:
        if name in KEEP or name.startswith("ENUM_"):
            sql = con.execute("SELECT sql FROM src.sqlite_master WHERE name=?", (name,)).fetchone()[0]
            con.execute(sql)
            con.execute(f'INSERT INTO main."{name}" SELECT * FROM src."{name}"')
    con.commit()
    con.execute("DETACH DATABASE src")
    con.execute("VACUUM")
    con.close()


if __name__ == "__main__":
    slim(sys.argv[1], sys.argv[2])
