"""`kwal` refuses a count that is not a positive integer, naming the argument and the value."""

from __future__ import annotations

import pytest

from ops.cli import build_parser


@pytest.mark.parametrize(("value", "why"), [("0", "0 is not at least 1"), ("many", "'many' is not an integer")])
def test_bench_commit_refuses_a_bad_in_flight_count(
    value: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "commit", "--big-inflight", value])
    assert f"argument --big-inflight: {why}" in capsys.readouterr().err


def test_bench_commit_takes_an_in_flight_count() -> None:
    args = build_parser().parse_args(["bench", "commit", "--big-inflight", "4"])
    assert args.big_inflight == 4
    assert build_parser().parse_args(["bench", "commit"]).big_inflight == 16
