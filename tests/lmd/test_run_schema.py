"""The run-directory schema: every table written and read back through one writer and one reader,
the bytes it writes, and bad cells named by file, line and column."""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.splits import SPLITS
from lmalgebra.distill.masked.scores import SCORES, Score
from lmalgebra.distill.run.rdt import rdt_text
from lmalgebra.lmd.rundir.schema import (
    ATTRIBUTION,
    FITS,
    GROUP,
    LAYER_MAP,
    TABLES,
    AttributionShareRow,
    FitRow,
    group_rows,
    pairwise_text,
    read_pairwise,
    write_pairwise,
)
from lmalgebra.storage.csv_tables import Table, read_table, table_text, write_table

ALL_TABLES = [*TABLES.values(), GROUP, SCORES]
FLOATS = [0.1234567890123456, -3.5e-300, math.nan, 1.0, -0.0]


def _example_rows(table: Table[Any], count: int = 5) -> list[Any]:
    """Rows of ``table`` exercising every column type: text that needs quoting, floats at full
    precision and NaN, integers and (where allowed) empty integers, booleans."""
    hints = typing.get_type_hints(table.row)
    rows = []
    for i in range(count):
        values: dict[str, Any] = {}
        for f in fields(table.row):
            hint = hints[f.name]
            if hint is str:
                values[f.name] = [f"{f.name}-{i}", 'a,"b"', "x y", "é", "0"][i % 5]
            elif hint is float:
                values[f.name] = FLOATS[i % len(FLOATS)]
            elif hint is int:
                values[f.name] = i - 1
            elif hint is bool:
                values[f.name] = i % 2 == 0
            else:  # int | None
                values[f.name] = None if i % 2 else i
        rows.append(table.row(**values))
    return rows


def _same(a: Any, b: Any) -> bool:
    left, right = asdict(a), asdict(b)
    return left.keys() == right.keys() and all(
        (isinstance(v, float) and math.isnan(v) and math.isnan(right[k])) or v == right[k]
        for k, v in left.items()
    )


@pytest.mark.parametrize("table", ALL_TABLES, ids=lambda t: t.file)
def test_every_table_round_trips(table: Table[Any], tmp_path: Path) -> None:
    rows = _example_rows(table)
    path = write_table(tmp_path, table, rows)
    assert path == tmp_path / table.file
    assert path.read_text(encoding="utf-8").splitlines()[0] == ",".join(table.columns)
    back = read_table(tmp_path, table)
    assert back is not None and len(back) == len(rows)
    for written, read in zip(rows, back, strict=True):
        assert type(read) is table.row
        if table.decimals is None:
            assert _same(written, read), (written, read)
        else:  # fixed decimals: equal to their rounding
            for k, v in asdict(written).items():
                got = getattr(read, k)
                if isinstance(v, float) and not math.isnan(v):
                    assert got == pytest.approx(v, abs=10.0**-table.decimals)
                elif isinstance(v, float):
                    assert math.isnan(got)
                else:
                    assert got == v


def test_absent_table_reads_as_none(tmp_path: Path) -> None:
    assert read_table(tmp_path, FITS) is None
    assert read_pairwise(tmp_path) is None


def test_cells_are_written_as_before() -> None:
    """Floats at full precision (``repr``), NaN and None as empty cells, header first."""
    rows = [
        AttributionShareRow("t", "greedy", "a", 1, "validation", 0.1 + 0.2),
        AttributionShareRow("t", "shapley", "b", None, "validation", math.nan),
    ]
    assert table_text(ATTRIBUTION, rows) == (
        "target,method,model,step,split,value\n"
        "t,greedy,a,1,validation,0.30000000000000004\n"
        "t,shapley,b,,validation,\n"
    )
    fit = {"kind": "group", "target": "a", "basis": "b+c", "split": "train", "r2": np.float64(0.5)}
    typed = FitRow("group", "a", "b+c", "train", 0.5)
    expected = "kind,target,basis,split,r2,ci_low,ci_high,adjusted_r2\ngroup,a,b+c,train,0.5,,,\n"
    # a mapping row (with or without the empty interval cells) writes the same bytes
    assert table_text(FITS, [fit]) == table_text(FITS, [typed]) == expected
    assert table_text(FITS, [fit | {"ci_low": "", "ci_high": ""}]) == expected


def test_a_mapping_with_an_unknown_column_is_refused() -> None:
    with pytest.raises(ValueError, match=r"fits\.csv: a row has column\(s\) \['r_2'\]"):
        table_text(FITS, [{"kind": "group", "r_2": 0.5}])


def test_group_table_has_six_decimals_and_a_mean_row(tmp_path: Path) -> None:
    r2 = [
        {"train": 0.9, "validation": 0.8, "test": 0.7},
        {"train": 0.5, "validation": math.nan, "test": 0.2},
    ]
    write_table(tmp_path, GROUP, group_rows(["a", "b"], r2))
    assert (tmp_path / "group_r2.csv").read_text(encoding="utf-8") == (
        "target,train,validation,test\n"
        "a,0.900000,0.800000,0.700000\n"
        "b,0.500000,,0.200000\n"
        "mean,0.700000,,0.450000\n"
    )
    back = read_table(tmp_path, GROUP)
    assert back is not None and [r.target for r in back] == ["a", "b", "mean"]
    assert tuple(f.name for f in fields(GROUP.row))[1:] == SPLITS


def test_pairwise_matrix_round_trips(tmp_path: Path) -> None:
    names = ["a", "b,c", "d"]
    matrix = np.array([[np.nan, 0.1234564, -0.5], [0.25, np.nan, 1.0], [0.0, 0.75, np.nan]])
    assert pairwise_text(names, matrix).splitlines()[:2] == [
        'target \\ basis,a,"b,c",d',
        "a,,0.123456,-0.500000",
    ]
    write_pairwise(tmp_path, "validation", names, matrix)
    back = read_pairwise(tmp_path, "validation")
    assert back is not None
    assert back[0] == names
    np.testing.assert_allclose(back[1], matrix, atol=1e-6)
    assert np.isnan(np.diag(back[1])).all()


def test_bad_cells_name_file_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "sweeps").mkdir()
    path = tmp_path / "sweeps" / "layer_map.csv"
    path.write_text("model_a,layer_a,model_b,layer_b,split,r2\na,1,b,2.5,test,0.1\n")
    with pytest.raises(
        UserInputError, match=r"layer_map\.csv, line 2: column 'layer_b' is not an integer: '2.5'"
    ):
        read_table(tmp_path, LAYER_MAP)
    path.write_text("model_a,layer_a,model_b,layer_b,split,r2\na,,b,2,test,0.1\n")
    with pytest.raises(UserInputError, match=r"line 2: column 'layer_a' is empty"):
        read_table(tmp_path, LAYER_MAP)
    (tmp_path / "pairwise_r2_test.csv").write_text("target \\ basis,a,b\na,,x\nb,0.1,\n")
    with pytest.raises(UserInputError, match=r"pairwise_r2_test\.csv, line 2: column 'b' .*'x'"):
        read_pairwise(tmp_path)


def test_evaluation_tables_are_declared_once(tmp_path: Path) -> None:
    score = Score("en", "t", "s", 3, 10, 0.5, 1.25, math.exp(1.25), 0.75, math.nan, 0.625)
    apart = Score("fr", "t", "s", 3, 10, 0.5, 1.25, 1.0, 0.75, 0.5, comparable=False)
    write_table(tmp_path, SCORES, [score, apart])
    text = (tmp_path / "scores.csv").read_text(encoding="utf-8")
    assert text.splitlines() == [
        "language,teacher,model,examples,masked_tokens,accuracy,loss,perplexity,"
        "top1_agreement,topk_overlap,top1_training_masking,comparable",
        f"en,t,s,3,10,0.5,1.25,{math.exp(1.25)!r},0.75,nan,0.625,True",
        "fr,t,s,3,10,0.5,1.25,1.0,0.75,0.5,nan,False",
    ]
    back = read_table(tmp_path, SCORES)
    assert back is not None and _same(back[0], score) and _same(back[1], apart)
    (tmp_path / "scores.csv").write_text(text.replace(",False", ",maybe"), encoding="utf-8")
    with pytest.raises(UserInputError, match=r"scores\.csv, line 3: column 'comparable'.*'maybe'"):
        read_table(tmp_path, SCORES)
    deviations = {"sm3": {"en": 12.3456, "fr": math.nan, "average": -1.0}}
    assert rdt_text(deviations) == "student,en,fr,average\nsm3,12.346,,-1.000\n"
