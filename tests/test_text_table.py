"""The one table helper shared by the CLI and the benchmarks."""

from __future__ import annotations

import pytest

from agentrl_envs.text.table import format_table


def test_plain_table_pads_columns_and_strips_trailing_spaces() -> None:
    text = format_table(["split", "n", "success"], [["train", 3, "100.0%"], ["heldout", 12, "0.0%"]])
    assert text == "\n".join(
        [
            "split    n   success",
            "-------  --  -------",
            "train    3   100.0%",
            "heldout  12  0.0%",
        ]
    )


def test_boxed_table_with_title_footer_and_right_aligned_numbers() -> None:
    text = format_table(
        ["path", "ms"], [["sqlite3", "0.5"], ["env", "12.25"]], align="lr", title="1. SQL", footer=["note"], boxed=True
    )
    assert text.splitlines() == [
        "1. SQL",
        "-------  -----",
        "path        ms",
        "-------  -----",
        "sqlite3    0.5",
        "env      12.25",
        "-------  -----",
        "  note",
    ]


def test_no_rows_and_multiline_cells() -> None:
    assert format_table(["a", "bb"], []) == "a  bb\n-  --"
    assert format_table(["a"], [["x\ny"]]).splitlines()[-1] == "x y"


@pytest.mark.parametrize(
    ("rows", "align", "match"),
    [([["1", "2", "3"]], None, "row 0 has 3 cells, the header 2"), ([], "lx", "align='lx'"), ([], "l", "align='l'")],
)
def test_bad_shapes_are_clear_errors(rows: list[list[str]], align: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        format_table(["a", "b"], rows, align=align)
