"""Template "oci": a trial's OCI bundle for Slurm's own `srun --container` (runc).

Slurm 22.05 runs `BUNDLE/config.json` on `BUNDLE/rootfs` (a real folder, not a link) and has no
per-job mounts, so each trial gets a bundle of its own in its folder: an empty root whose
top-level folders are the image's (`cluster.container_bundle`, built by scripts/oci-bundle)
mounted read-only, its links recreated, and the job's mounts added: the trial folder (written),
the workdir and the workload folder (as pyxis's `--container-mounts` of template "container"),
then `cluster.container_mounts` ("SRC:DST[:ro|rw]", pyxis's form). Nothing else of the host
shows inside. The job's environment reaches the container only through `srun --export=NAMES`:
that list is JobSpec.container_env, the same names template "container" passes to pyxis.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import MoetuneError


class OciError(MoetuneError):
    """The trial's OCI bundle cannot be made from these values (one line)."""


@dataclass(frozen=True)
class Bundle:
    config: str  # config.json, one line
    dirs: tuple[str, ...]  # empty folders of the root, relative
    links: tuple[tuple[str, str], ...]  # (name, target) links of the root


def _bind(src: str, dst: str, mode: str = "rw") -> dict:
    return {"destination": dst, "type": "bind", "source": src, "options": ["rbind", mode]}


def job_mounts(spec) -> list[dict]:
    mounts = [_bind(spec.folder, spec.folder), _bind(spec.workdir, spec.workdir, "ro"),
              _bind(spec.workload_dir, spec.workload_dir, "ro")]
    for m in spec.container_mounts:
        parts = str(m).split(":")
        if len(parts) not in (2, 3) or not all(parts[:2]) or parts[2:] not in ([], ["ro"], ["rw"]):
            raise OciError(f"cluster.container_mounts {m!r}: use SRC:DST or SRC:DST:ro")
        mounts.append(_bind(parts[0], parts[1], (parts[2:] or ["rw"])[0]))
    return mounts


def bundle(spec) -> Bundle:
    """The trial's bundle from the image's (read on the machine that renders the job)."""
    base = Path(spec.container_bundle or "")
    try:
        config = json.loads((base / "config.json").read_text())
        entries = sorted(os.scandir(base / "rootfs"), key=lambda e: e.name)
    except (OSError, ValueError) as err:
        raise OciError(f"cluster.container_bundle {str(base)!r}: not an OCI bundle "
                       f"(config.json + rootfs/; scripts/oci-bundle makes one): {err}") from None
    if re.search(r"\s", spec.folder):  # srun --multi-prog's lines split at blanks
        raise OciError(f"template 'oci': the trial folder {spec.folder!r} holds a blank")
    dirs, links, image = [], [], []
    for e in entries:
        if e.is_symlink():
            links.append((e.name, os.readlink(e.path)))
        else:
            dirs.append(e.name)
            if any(os.scandir(e.path)):
                image.append(_bind(e.path, "/" + e.name, "ro"))
    config["root"] = {"path": "rootfs", "readonly": True}
    config["process"]["cwd"] = spec.workdir
    # parents before what is mounted inside them (/etc before /etc/hosts, /tmp before a trial
    # folder under /tmp); the sort keeps the order among equals
    mounts = config.get("mounts", []) + image + job_mounts(spec)
    config["mounts"] = sorted(mounts, key=lambda m: len(Path(m["destination"]).parts))
    return Bundle(json.dumps(config, separators=(",", ":")), tuple(dirs), tuple(links))
