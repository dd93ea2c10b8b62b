"""`ratchet bench --help` is the command's help; after a suite's name, `--help` is the
suite's own (its options), not the command's."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ratchet.cli import main


def test_bench_help_alone_is_the_commands():
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0
    assert "bench [OPTIONS] [ARGS]" in result.output and "ARGS: suites" in result.output


def test_help_after_a_suite_is_the_suites_options():
    result = CliRunner().invoke(main, ["bench", "api", "--help"])
    assert result.exit_code == 0
    assert "usage: ratchet bench api" in result.output
    assert "--turns" in result.output and "--reads" in result.output
    result = CliRunner().invoke(main, ["bench", "processor", "-h"])
    assert result.exit_code == 0
    assert "usage: ratchet bench processor" in result.output and "--latency-turns" in result.output


def test_a_suite_without_options_says_so():
    """Its --help is a help (exit 0, an operator's review, session 38: it was a usage
    error); any other option is a usage error."""
    result = CliRunner().invoke(main, ["bench", "store", "--help"])
    assert result.exit_code == 0 and "usage: ratchet bench store" in result.output
    assert "takes no options" in result.output
    result = CliRunner().invoke(main, ["bench", "store", "--turns", "5"])
    assert result.exit_code == 2 and "bench store takes no options" in result.output


def test_bench_help_lists_the_suites():
    result = CliRunner().invoke(main, ["bench", "--help"])
    for suite in ("validation", "store", "api", "processor", "memory"):
        assert f"\n  {suite} " in result.output


def test_a_bad_setting_is_a_usage_error_before_any_suite_runs():
    result = CliRunner().invoke(main, ["bench", "memory"], env={"RATCHET_PARTITIONS": "abc"})
    assert result.exit_code == 2 and "RATCHET_PARTITIONS" in result.output
    assert "== bench" not in result.output  # nothing ran


def test_an_unknown_suite_is_named_as_one():
    """A misspelt suite was called an option ("options ['procesor'] need exactly one
    suite first"), before or after a suite (an operator's review, session 46). No suite
    takes a positional argument, so a word that is no suite and no option is a typo."""
    for args in (["procesor"], ["store", "procesor"], ["store", "api", "procesor", "--x"]):
        result = CliRunner().invoke(main, ["bench", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "unknown suite 'procesor'" in result.output, (args, result.output)
        assert "processor" in result.output and "== bench" not in result.output


@pytest.mark.parametrize("suite", ["validation", "api", "processor", "memory", "store"])
@pytest.mark.parametrize("options,code", [(["--nope"], 2), (["--turns", "0"], 2),
                                          (["--help"], 0)])
def test_a_suites_options_are_parsed_before_its_header(suite, options, code):
    """`bench validation --nope` printed `== bench validation: ...` before argparse's
    usage error (session 46's review, noted; session 48): a usage error, or a suite's
    help, comes first and alone. `store` takes no options: the same."""
    result = CliRunner().invoke(main, ["bench", suite, *options])
    assert result.exit_code == code, result.output
    assert "== bench" not in result.output, result.output
    assert "usage: ratchet bench " + suite in result.output, result.output


def test_memorys_own_bound_is_a_usage_error_before_its_header():
    result = CliRunner().invoke(main, ["bench", "memory", "--mib", "10"])
    assert result.exit_code == 2 and "at most 9" in result.output, result.output
    assert "== bench" not in result.output, result.output
