"""The benchmark scripts measure what a user installs: a release build."""

from __future__ import annotations

import sys

from settle import _settle


def require_release() -> None:
    """Exits with status 2 and one line on stderr when the installed package
    is a debug build (the workspace's test harness installs one into the
    interpreter it is given)."""
    if _settle.BUILD_PROFILE != "release":
        print(
            f"settle here is a {_settle.BUILD_PROFILE} build; "
            "run `pip install ./crates/python` for the release build these figures are of",
            file=sys.stderr,
        )
        sys.exit(2)
