"""`python -m silkattn bench` options that choose cases (the timing itself runs in bench/ and CI's set-up)."""
import pytest

from silkattn.__main__ import main


def test_bench_match_that_selects_nothing_is_an_error():
    with pytest.raises(SystemExit, match="matches no case"):
        main(["bench", "--match", "no such case"])
