"""The console scripts. ``--version`` answers here, before the command line's parser
and servegate's modules are imported (a probe of the installed version costs ~50 ms,
not the ~150 ms of building every sub-command)."""

from __future__ import annotations

import sys


def _version_only() -> bool:
    return sys.argv[1:] in (["--version"], ["-V"])


def main() -> int:
    if _version_only():
        from servegate.about import version_line

        print(version_line())
        return 0
    from servegate.cli import main as cli_main

    return cli_main()


def release_main() -> int:
    if _version_only():
        from servegate.about import version_line

        print(version_line())
        return 0
    from servegate.cli import release_main as cli_release_main

    return cli_release_main()
