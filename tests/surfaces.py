"""One bad input, two surfaces (issue #46): the message a Python caller gets names Python parameters and no flag;
the one the command line prints names flags, exits 2 and shows no traceback. Shared by the tests/test_messages_*.py
files."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import twotower as tt
from twotower.cli import app

runner = CliRunner()


def python_message(call) -> str:
    """The message ``call()`` raises (whitespace squeezed); fails if it spells a command-line flag."""
    with pytest.raises((tt.TwoTowerError, ValueError)) as info:
        call()
    text = " ".join(str(info.value).split())
    assert "--" not in text, text  # no command-line flag in a message a Python caller gets
    return text


def cli_message(*argv) -> str:
    """What ``twotower ARGV`` prints (whitespace squeezed); fails unless it exits 2 without a traceback."""
    res = runner.invoke(app, [str(a) for a in argv])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    return " ".join(res.output.split())
