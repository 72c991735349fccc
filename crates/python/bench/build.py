"""The benchmark scripts measure what a user installs: a release build."""

from __future__ import annotations

import sys

from settle import _settle


def require_release() -> None:
    """Exits with status 2 and one line on stderr when the installed package
    is a debug build (the workspace's test harness installs one into the
    interpreter it is given)."""
    profile = getattr(_settle, "BUILD_PROFILE", None)
    if profile is None:
        # A build from before the module said how it was compiled.
        print("settle here does not say how it was built; measuring it as it is", file=sys.stderr)
        return
    if profile != "release":
        print(
            f"settle here is a {profile} build; "
            "run `pip install ./crates/python` for the release build these figures are of",
            file=sys.stderr,
        )
        sys.exit(2)
