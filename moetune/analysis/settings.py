"""Every environment variable the analysis reads, named once with its default and what it sets.

Each is read when asked, never at import, so a variable set after moetune is imported still
counts. Unset or empty means the default. A variable with a fixed set of values is checked when
read: anything else is a SettingError naming the variable and what it takes. The pipeline keeps
its own in moetune/settings.py, in the same form."""
from __future__ import annotations

import os
from dataclasses import dataclass

from moetune.analysis.errors import SettingError


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None
    doc: str
    allowed: tuple[str, ...] = ()  # empty: any value

    def read(self) -> str | None:
        """The value now: the environment's, else the default; checked against `allowed`."""
        value = os.environ.get(self.name) or self.default
        if self.allowed and value not in self.allowed:
            raise SettingError(f"{self.name}={value!r}: allowed values are "
                               f"{', '.join(self.allowed)} (or leave it unset)")
        return value

    def value(self) -> str:
        """read() of a setting that has a default: a string, never None."""
        value = self.read()
        if value is None:
            raise SettingError(f"{self.name} is not set and has no default")
        return value


def table(*settings: Setting) -> dict[str, Setting]:
    """Settings by name."""
    return {s.name: s for s in settings}


SETTINGS = table(
    Setting("MOETUNE_NSYS", None, "the nsys moetune runs; unset: the `nsys` on PATH"),
    Setting("MOETUNE_QDSTRM_IMPORTER", None, "QdstrmImporter, which turns a raw .qdstrm into a "
            ".nsys-rep; unset: the host tools beside that nsys"),
    Setting("MOETUNE_TRACE_READER", "connectorx", "the reader of a trace's integer columns: "
            "connectorx where installed, or sqlite3 (slower, same figures)", ("connectorx", "sqlite3")),
    Setting("MOETUNE_CACHE", None, "where decompressed traces are kept; unset: ~/.cache/moetune, "
            "else the temp folder"),
)


def nsys() -> str | None:
    return SETTINGS["MOETUNE_NSYS"].read()


def qdstrm_importer() -> str | None:
    return SETTINGS["MOETUNE_QDSTRM_IMPORTER"].read()


def trace_reader() -> str:
    return SETTINGS["MOETUNE_TRACE_READER"].value()


def cache() -> str | None:
    return SETTINGS["MOETUNE_CACHE"].read()
