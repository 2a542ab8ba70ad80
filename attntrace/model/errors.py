"""Exception hierarchy.

`AttntraceError` is the root. `BadInput` means the user's spec, answer or text is wrong:
the CLI prints its one-line message and exits 2. `Unsupported` means the input is valid
but attntrace does not do that (yet). Keeping the two apart lets callers decide whether
to blame the input or the tool (the split latexify_py uses).
"""


class AttntraceError(Exception):
    """Root of every error attntrace raises on purpose."""


class BadInput(AttntraceError, ValueError):
    """The input (spec, answer file, expression, option) is malformed; message is one line."""


class Unsupported(AttntraceError):
    """The input is well formed but asks for something attntrace cannot do."""
