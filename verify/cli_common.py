"""What the command-line modules (`rewrite.cli`, `verify.cli`) share: reading the rules named
on the command line, with a rules error printed rather than raised.

Imports of the project's heavier modules stay inside the function, as in the CLI modules, so
that `rewrite --help` does not load the engine (see docs/architecture.md).
"""

from __future__ import annotations

from rich.console import Console


def load_rules(paths, err: Console):
    """RuleSet from `paths` (rule files or directories; the shipped library when None or
    empty). On a rules error prints it to `err` (located, several lines) and returns None; on a
    path that does not exist or cannot be read prints one `error:` line and returns None."""
    from dsl import RulesError
    from frontends.onnx.api import OptionError
    from frontends.onnx.api import load_rules as read_rules

    try:
        return read_rules(paths or None)
    except RulesError as e:
        err.print(str(e), markup=False)
        return None
    except OptionError as e:
        err.print(f"error: {e}", markup=False)
        return None
    except (OSError, UnicodeDecodeError) as e:
        err.print(f"error: {getattr(e, 'filename', None) or paths}: cannot read: {e}", markup=False)
        return None
