"""The `rewrite` console script's entry point, kept free of imports of its own: Ctrl-C while
the CLI's modules load (rich, onnx, the op table: the first few tenths of a second) ends the
command with the one line any other interrupt gives, not a traceback of the import under way.
"""

import os
import signal
import sys


def main() -> None:
    """Import the CLI and run it (`rewrite.cli.run`); an interrupt during the import ends the
    process as an interrupted run does: "error: interrupted", then by SIGINT itself."""
    try:
        from rewrite import cli
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(130) from None  # (where a SIGINT does not end the process)
    cli.run()
