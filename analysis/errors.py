"""The one error type of the analysis: a trace or log we can't read, said in one line."""


class TraceError(Exception):
    """A trace or log that can't be analysed. The message names the file and what is wrong."""
