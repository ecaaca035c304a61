"""The one base of moetune's own errors, and the analysis's own kinds.

It lives here, in the lowest layer, so that the analysis and the pipeline share it without the
analysis importing the pipeline (moetune/errors.py re-exports it). Every error an engineer can
act on is a `MoetuneError`, raised with one line that names the file, key or variable at fault and
what is allowed; the CLI prints that line and exits 2. Anything else is a bug and keeps its
traceback.
"""


class MoetuneError(Exception):
    """An error an engineer can fix: one line, names what is wrong and what is allowed."""


class TraceError(MoetuneError):
    """A trace or log that can't be analysed. The message names the file and what is wrong."""


class SettingError(MoetuneError):
    """An environment variable moetune reads holds a value it does not take; names both."""
