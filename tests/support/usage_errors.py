"""Checking that a command line refuses a bad value the argparse way: exit status 2 and the reason on stderr."""

from __future__ import annotations

from typing import Callable

import pytest


def assert_usage_error(main: Callable[[list[str]], object], argv: list[str], reason: str,
                       capsys: pytest.CaptureFixture[str]) -> None:
    """``main(argv)`` exits with status 2 (argparse's usage error) and its stderr contains ``reason``."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert reason in capsys.readouterr().err
