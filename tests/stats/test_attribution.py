"""Greedy, drop-one and Shapley attribution vs brute force on raw data, and the Shapley axioms."""

from __future__ import annotations

import csv
import itertools
import math

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from lmalgebra.core.errors import UserInputError
from lmalgebra.lmd.rundir.schema import ATTRIBUTION, attribution_rows
from lmalgebra.stats.attribution import SubsetValue, attribute, shapley_exact, shapley_sampled
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.solver import Decomposer, Fit, SplitMoments
from lmalgebra.storage.csv_tables import write_table

# "a2" is an exact copy of "a"; "noise" is independent of everything; "t" mostly follows "b".
NAMES = ["t", "a", "b", "a2", "noise"]
DIMS = [3, 3, 4, 3, 2]
BASIS = ["a", "b", "a2", "noise"]
ALPHA = 0.05


def make_data(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(n, 3)), rng.normal(size=(n, 4))
    t = a @ rng.normal(size=(3, 3)) + 2 * b @ rng.normal(size=(4, 3)) + rng.normal(size=(n, 3))
    return np.hstack([t, a, b, a, rng.normal(size=(n, 2))])


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    full = make_data(900, seed=0)
    return {"train": full[:600], "validation": full[600:]}


@pytest.fixture(scope="module")
def solver(data: dict[str, np.ndarray]) -> Decomposer:
    blocks = layout(NAMES, DIMS)
    splits = {}
    for split, z in data.items():
        m = SecondMoments(blocks)
        m.update(z)
        splits[split] = SplitMoments.of(m)
    return Decomposer(blocks, splits, ALPHA, "absolute")


def columns(names: list[str]) -> np.ndarray:
    blocks = {b.name: b for b in layout(NAMES, DIMS)}
    return np.concatenate([np.arange(blocks[n].start, blocks[n].stop) for n in names])


def raw_value(data: dict[str, np.ndarray], subset: list[str]) -> float:
    """v(S) with scikit-learn on raw rows: ridge on train, pooled R^2 on validation."""
    if not subset:
        return 0.0
    train, held = data["train"], data["validation"]
    model = Ridge(alpha=ALPHA * len(train)).fit(train[:, columns(subset)], train[:, columns(["t"])])
    prediction = model.predict(held[:, columns(subset)])
    return float(r2_score(held[:, columns(["t"])], prediction, multioutput="variance_weighted"))


def test_exact_shapley_equals_permutation_average_on_raw_data(
    data: dict[str, np.ndarray], solver: Decomposer
) -> None:
    ours = shapley_exact(SubsetValue(solver, "t"), BASIS)
    totals = dict.fromkeys(BASIS, 0.0)
    orders = list(itertools.permutations(BASIS))
    for order in orders:
        for k, name in enumerate(order):
            before = sorted(order[:k], key=NAMES.index)
            after = sorted(order[: k + 1], key=NAMES.index)
            totals[name] += raw_value(data, after) - raw_value(data, before)
    for name in BASIS:
        assert ours[name] == pytest.approx(totals[name] / len(orders), abs=1e-9)


def test_shapley_axioms_and_one_fit_per_subset(
    solver: Decomposer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, ...]] = []
    fit = solver.fit

    def counted(target: str, basis: list[str]) -> Fit:
        calls.append(tuple(basis))
        return fit(target, basis)

    monkeypatch.setattr(solver, "fit", counted)
    value = SubsetValue(solver, "t")
    phi = shapley_exact(value, BASIS)
    assert len(calls) == len(set(calls)) == 2 ** len(BASIS) - 1 == value.fits
    assert sum(phi.values()) == pytest.approx(value(frozenset(BASIS)), abs=1e-12)  # efficiency
    assert phi["a"] == pytest.approx(phi["a2"], abs=1e-10)  # symmetry
    assert abs(phi["noise"]) < 0.005  # null player
    assert phi["b"] > phi["a"] > 0.02  # a and its copy share its credit


def test_sampled_shapley_converges_to_exact(solver: Decomposer) -> None:
    value = SubsetValue(solver, "t")
    exact = shapley_exact(value, BASIS)
    sampled = shapley_sampled(value, BASIS, permutations=300, seed=1)
    total = value(frozenset(BASIS))
    assert sum(v for v, _ in sampled.values()) == pytest.approx(total, abs=1e-12)
    for name, (estimate, error) in sampled.items():
        assert abs(estimate - exact[name]) <= 4 * error + 1e-12
    assert max(e for _, e in sampled.values()) > 0  # the orders really differ
    assert shapley_sampled(value, BASIS, 300, seed=1) == sampled  # seeded


def test_attribute_rows_greedy_drop_one_and_both_shapley_paths(solver: Decomposer) -> None:
    rows = attribute(solver, "t", split="validation")
    greedy = [r for r in rows if r.method == "greedy"]
    assert [r.step for r in greedy] == [1, 2, 3, 4]
    assert greedy[0].model == "b"  # the informative model comes first
    assert greedy[1].model in {"a", "a2"}
    full = SubsetValue(solver, "t")(frozenset(BASIS))
    assert greedy[-1].value == pytest.approx(full, abs=1e-12)
    drops = {r.model: r.value for r in rows if r.method == "drop_one"}
    without_b = SubsetValue(solver, "t")(frozenset(["a", "a2", "noise"]))
    assert drops["b"] == pytest.approx(full - without_b, abs=1e-12)
    assert abs(drops["a"]) < 0.01  # its copy stands in for it
    exact = {r.model: r for r in rows if r.method == "shapley"}
    assert all(r.stderr is None and r.step is None for r in exact.values())
    sampled = attribute(solver, "t", exact_max=2, permutations=200, seed=3)
    for r in (r for r in sampled if r.method == "shapley"):
        assert r.stderr is not None
        assert abs(r.value - exact[r.model].value) <= 4 * r.stderr + 1e-12
    default_basis = {r.model for r in attribute(solver, "a", split="train") if r.method == "greedy"}
    assert default_basis == {"t", "b", "a2", "noise"}


def test_csv_is_tidy(solver: Decomposer, tmp_path: pytest.TempPathFactory) -> None:
    rows = attribute(solver, "t", basis=["b", "noise"])
    path = write_table(tmp_path, ATTRIBUTION, attribution_rows(rows))  # type: ignore[arg-type]
    assert path.name == "attribution.csv"
    with path.open(encoding="utf-8") as handle:
        read = list(csv.DictReader(handle))
    assert list(read[0]) == ["target", "method", "model", "step", "split", "value"]
    assert len(read) == len(rows) == 6
    for line, row in zip(read, rows, strict=True):
        assert line["step"] == ("" if row.step is None else str(row.step))
        assert float(line["value"]) == row.value and line["split"] == "validation"


def test_bad_requests_name_the_culprit(solver: Decomposer) -> None:
    with pytest.raises(UserInputError, match="split 'dev' is not among"):
        attribute(solver, "t", split="dev")
    with pytest.raises(UserInputError, match="'zz' is not among the models"):
        attribute(solver, "t", basis=["a", "zz"])
    with pytest.raises(UserInputError, match="contains the target 't'"):
        attribute(solver, "t", basis=["a", "t"])
    with pytest.raises(UserInputError, match="names a model twice"):
        attribute(solver, "t", basis=["a", "a"])
    with pytest.raises(UserInputError, match="no basis models"):
        attribute(solver, "t", basis=[])
    with pytest.raises(UserInputError, match="at least 2 permutations"):
        attribute(solver, "t", exact_max=1, permutations=1)
    assert not math.isnan(SubsetValue(solver, "t")(frozenset({"a"})))
