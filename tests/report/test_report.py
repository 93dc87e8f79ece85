"""``lmalgebra.report``: clustering against scipy, every figure as a valid PNG, the HTML page."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from lmalgebra.cli import main
from lmalgebra.core.errors import UserInputError
from lmalgebra.lmd.figures.run_figures import write_plots
from lmalgebra.lmd.rundir.schema import NULLS
from lmalgebra.report.lmd_page import write_report
from lmalgebra.stats.clustering import average_linkage, cluster_order, leaf_order, r2_distance
from lmalgebra.storage.csv_tables import read_table
from report_fixtures import MODELS, build_run, pairwise_matrix, write_core

PNG = b"\x89PNG\r\n\x1a\n"
FIGURES = {
    "pairwise_r2_test_clustered",
    "group_r2",
    "similarity",
    "alpha_curve",
    "attribution",
    "length",
    "layer",
    "layer_map",
    "train_size",
    "language",
}


class Drawn(NamedTuple):
    """A synthetic run's report drawn once: the run, the page's text, and every figure saved
    meanwhile by file stem, as (figure, PNG path)."""

    run: Path
    page: str
    figures: dict[str, tuple[Any, Path]]


def draw_report(run: Path) -> Drawn:
    """``write_report`` of ``run`` (which draws every figure into ``run/plots``), keeping each
    figure object as it is saved."""
    from lmalgebra.figures import canvas

    figures: dict[str, tuple[Any, Path]] = {}
    save = canvas.save

    def keep(fig: Any, path: Path, dpi: int = canvas.DPI) -> Path:
        figures[path.stem] = (fig, save(fig, path, dpi))
        return path

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(canvas, "save", keep)
        page = write_report(run).read_text(encoding="utf-8")
    return Drawn(run, page, figures)


# Drawing a run's ten figures takes seconds (text layout): each run below is drawn once for the
# module, and the tests read what it drew.
@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Drawn:
    """The default synthetic run: every value of R^2 at or above 0, intervals and nulls."""
    return draw_report(build_run(tmp_path_factory.mktemp("report") / "run"))


@pytest.fixture(scope="module")
def negative_run(tmp_path_factory: pytest.TempPathFactory) -> Drawn:
    """Models of the two families explain each other worse than their mean (R^2 below 0)."""
    return draw_report(build_run(tmp_path_factory.mktemp("report") / "neg", across=-0.3))


# --- clustering ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(25))
def test_average_linkage_matches_scipy(seed: int) -> None:
    from scipy.cluster.hierarchy import leaves_list, linkage
    from scipy.spatial.distance import pdist, squareform

    rng = np.random.default_rng(seed)
    points = rng.normal(size=(int(rng.integers(2, 14)), 3))
    condensed = pdist(points)
    ours = average_linkage(squareform(condensed))
    reference = linkage(condensed, method="average")
    np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=1e-12)
    assert leaf_order(ours) == leaves_list(reference).tolist()


def test_r2_distance_is_symmetric_bounded_and_zero_on_the_diagonal() -> None:
    r2 = np.array([[np.nan, 0.9, -0.3], [0.7, np.nan, np.nan], [0.1, 0.2, np.nan]])
    distance = r2_distance(r2)
    np.testing.assert_allclose(distance, distance.T)
    np.testing.assert_allclose(np.diag(distance), 0.0)
    assert distance[0, 1] == pytest.approx(1 - 0.8)
    assert distance[1, 2] == pytest.approx(1 - 0.1)  # NaN counts as 0, 0.2 from the other side
    assert distance[0, 2] == pytest.approx(1 - 0.05)  # negative R^2 clipped to 0


def test_cluster_order_puts_each_family_together() -> None:
    order = [MODELS[i] for i in cluster_order(pairwise_matrix("test"))]
    assert order != MODELS  # the listed order interleaves the families
    assert {frozenset(order[:2]), frozenset(order[2:])} == {
        frozenset({"a1", "a2"}),
        frozenset({"b1", "b2"}),
    }


def test_cluster_order_recovers_three_shuffled_blocks() -> None:
    rng = np.random.default_rng(3)
    family = np.repeat([0, 1, 2], 3)
    r2 = np.where(family[:, None] == family[None, :], 0.85, 0.1) + rng.uniform(0, 0.05, (9, 9))
    np.fill_diagonal(r2, np.nan)
    shuffle = rng.permutation(9)
    order = cluster_order(r2[np.ix_(shuffle, shuffle)])
    blocks = family[shuffle][order]
    assert all(len(set(blocks[i : i + 3])) == 1 for i in (0, 3, 6)), blocks


# --- figures ------------------------------------------------------------------------------


def test_every_contract_table_gets_a_valid_png(full_run: Drawn) -> None:
    import matplotlib.image

    run, written = full_run.run, sorted((full_run.run / "plots").iterdir())
    assert {p.stem for p in written} == FIGURES
    assert {path for _, path in full_run.figures.values()} == set(written)
    for path in written:
        assert path.parent == run / "plots"
        assert path.read_bytes()[:8] == PNG, path
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100, path
        assert pixels[..., :3].std() > 0.05, f"{path} is blank"


def test_only_existing_nonempty_tables_get_figures(tmp_path: Path) -> None:
    write_core(tmp_path)
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "length.csv").write_text("setting,kind,target,basis,split,r2\n")
    written = write_plots(tmp_path, out_dir=tmp_path / "figs")
    assert sorted(p.name for p in written) == ["group_r2.png", "pairwise_r2_test_clustered.png"]
    assert all(p.parent == tmp_path / "figs" for p in written)


def test_a_crowded_sweep_shows_the_group_fits_alone() -> None:
    from dataclasses import replace

    from lmalgebra.lmd.figures.run_figures import MAX_SERIES, _focus
    from lmalgebra.lmd.rundir.schema import SweepRow

    models = [f"m{i}" for i in range(4)]  # 12 pairwise series + 4 group series
    rows = [SweepRow("8", "pairwise", t, b, "test", 0.5) for t in models for b in models if t != b]
    group = [replace(rows[0], kind="group", target=t, basis="rest") for t in models]
    assert len(rows) > MAX_SERIES
    assert _focus(rows + group) == (group, " (group fits)")
    assert _focus(rows) == (rows, "")  # no group fits: nothing to fall back on
    assert _focus(rows[:3] + group) == (rows[:3] + group, "")


def test_bad_tables_name_file_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "nulls.csv").write_text("kind,target,split,r2\nrandom_group,a,test,0.1\n")
    with pytest.raises(UserInputError, match=r"nulls\.csv: missing column\(s\) basis"):
        read_table(tmp_path, NULLS)
    (tmp_path / "nulls.csv").write_text("kind,target,basis,split,r2\nrandom_group,a,x,test,high\n")
    with pytest.raises(UserInputError, match=r"nulls\.csv, line 2: column 'r2'.*'high'"):
        read_table(tmp_path, NULLS)


# --- HTML ---------------------------------------------------------------------------------


def test_report_is_self_contained_and_escapes_the_config(full_run: Drawn) -> None:
    text = full_run.page
    images = re.findall(r'<img [^>]*src="([^"]*)"', text)
    assert len(images) == len(FIGURES)
    assert all(src.startswith("data:image/png;base64,") for src in images)
    assert not re.search(r'(src|href)="(?!data:|#)', text)  # nothing to fetch
    assert "<script" not in text
    assert "&lt;script&gt;alert(&#x27;not run&#x27;)&lt;/script&gt; &amp; friends" in text
    assert "<td>0.830</td>" in text  # a1's test group R^2, 3 decimals
    assert "<td>0.8300" not in text


def test_sections_follow_the_files_present(tmp_path: Path) -> None:
    write_core(tmp_path)
    text = write_report(tmp_path).read_text(encoding="utf-8")
    headings = re.findall(r"<h2>(.*?)</h2>", text)
    assert headings == ["Run", "Pairwise R² (clustered)", "Group R²", "Configuration"]
    assert (tmp_path / "report.html").is_file()


def test_the_report_shows_the_fit_the_run_was_asked_for(tmp_path: Path) -> None:
    """A run with ``target`` and ``basis`` records its single fit in ``summary.json``; the
    report had shown every other result but that one."""
    write_core(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    target, *basis = MODELS[:3]
    r2 = {"train": 0.9, "validation": 0.5, "test": 0.25}
    summary["single_fit"] = {"target": target, "basis": basis, "r2": r2}
    (tmp_path / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    text = write_report(tmp_path).read_text(encoding="utf-8")
    assert f"{target} from {' + '.join(basis)} (R²)" in text
    assert "train 0.900, validation 0.500, test 0.250" in text


def test_report_refuses_a_directory_without_summary(tmp_path: Path) -> None:
    write_core(tmp_path)
    (tmp_path / "summary.json").unlink()
    with pytest.raises(UserInputError, match=rf"{re.escape(str(tmp_path))} .*no summary\.json"):
        write_report(tmp_path)
    assert not (tmp_path / "report.html").exists()


def _cli(monkeypatch: pytest.MonkeyPatch, *args: str) -> int | str | None:
    monkeypatch.setattr(sys, "argv", ["lmalgebra", "report", *args])
    try:
        main()
    except SystemExit as stop:
        return stop.code
    return 0


def test_cli_prints_the_path_and_exits_2_on_an_incomplete_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_core(tmp_path / "run")
    out = tmp_path / "elsewhere" / "page.html"
    assert _cli(monkeypatch, str(tmp_path / "run"), "--out", str(out)) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_text(encoding="utf-8").startswith("<!doctype html>")
    (tmp_path / "run" / "summary.json").unlink()
    assert _cli(monkeypatch, str(tmp_path / "run")) == 2
    assert "no summary.json" in capsys.readouterr().err


# --- reading the numbers: negative R^2, intervals, long names -----------------------------

LONG_NAMES = {
    "a1": "organisation-with-a-long-name/encoder-a1-base-multilingual-cased-finetuned",
    "b1": "another-lab/b1-model-name-that-is-also-very-long-v2",
}


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[Any, Path]]:
    """Every figure saved while the test runs, by file stem: (figure, PNG path)."""
    from lmalgebra.figures import canvas

    figures: dict[str, tuple[Any, Path]] = {}
    save = canvas.save

    def keep(fig: Any, path: Path, dpi: int = canvas.DPI) -> Path:
        figures[path.stem] = (fig, save(fig, path, dpi))
        return path

    monkeypatch.setattr(canvas, "save", keep)
    return figures


def _images(fig: Any) -> list[Any]:
    return [image for ax in fig.axes for image in ax.get_images()]


def test_negative_r2_is_explained_where_it_is_shown(negative_run: Drawn, full_run: Drawn) -> None:
    text = negative_run.page
    pairwise = text.split('id="pairwise"')[1].split("</section>")[0]
    assert "8 values are below 0: a1 from b1 (-0.31)" in pairwise
    assert "worse than their mean" in pairwise and "--study.alpha_select gcv" in pairwise
    similarity = text.split('id="similarity"')[1].split("</section>")[0]
    assert "worse than their mean" in similarity
    assert "below 0" not in full_run.page  # no negative value: nothing to explain


def test_heatmaps_show_values_below_zero(negative_run: Drawn, full_run: Drawn) -> None:
    for stem in ("pairwise_r2_test_clustered", "similarity"):
        fig, _ = negative_run.figures[stem]
        images = _images(fig)
        assert images and all(image.norm.vmin <= -0.3 for image in images), stem
        image = images[0]
        colours = {tuple(image.cmap(image.norm(v))) for v in (-0.3, -0.1, 0.0, 0.5)}
        assert len(colours) == 4, f"{stem}: values at or below 0 share a colour"
        labels = [ax.get_ylabel() for ax in fig.axes if ax not in {i.axes for i in images}]
        assert any("below 0" in label for label in labels), labels  # the colour bar says so
    image = _images(full_run.figures["pairwise_r2_test_clustered"][0])[0]
    assert image.norm.vmin == 0.0  # nothing below 0: the scale starts at 0, as before


def test_run_root_heatmap_shows_values_below_zero(tmp_path: Path, drawn: dict[str, Any]) -> None:
    from lmalgebra.lmd.figures.heatmaps import pairwise_heatmap

    r2 = pairwise_matrix("test", across=-0.5)
    pairwise_heatmap(r2, MODELS, tmp_path / "pairwise_r2_test.png")
    (image,) = _images(drawn["pairwise_r2_test"][0])
    assert image.norm.vmin <= np.nanmin(r2) < 0
    assert image.cmap(image.norm(np.nanmin(r2))) != image.cmap(image.norm(0.0))


def _error_bars(fig: Any) -> int:
    from matplotlib.container import ErrorbarContainer

    return sum(isinstance(c, ErrorbarContainer) for ax in fig.axes for c in ax.containers)


def test_no_error_bars_or_interval_columns_without_intervals(
    tmp_path: Path, full_run: Drawn
) -> None:
    bare = draw_report(build_run(tmp_path / "bare", intervals=False, draws=1))
    text = bare.page
    fig, _ = bare.figures["group_r2"]
    assert _error_bars(fig) == 0
    assert "whiskers" not in " ".join(t.get_text() for t in fig.legends[0].get_texts())
    group = text.split('id="group"')[1].split("</section>")[0]
    assert "interval" not in group and "bootstrap" not in group
    assert "<th>null random_group (test)</th>" in group  # computed columns stay
    # the intervals and both nulls' spreads
    assert _error_bars(full_run.figures["group_r2"][0]) == 3


def test_titles_and_labels_are_inside_every_png(tmp_path: Path, drawn: dict[str, Any]) -> None:
    """With long model names, everything drawn (titles, axis and tick labels, legends, colour
    bars) fits in the saved image: nothing is cut at its edge."""
    import matplotlib.image

    from lmalgebra.figures import canvas

    write_plots(build_run(tmp_path / "run", across=-0.2, names=LONG_NAMES))
    assert set(drawn) == FIGURES
    for stem, (fig, path) in drawn.items():
        drawn_box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches, every visible artist
        height, width = matplotlib.image.imread(path).shape[:2]
        assert drawn_box.width * canvas.DPI <= width + 2, f"{stem}: cut at the sides"
        assert drawn_box.height * canvas.DPI <= height + 2, f"{stem}: cut at the top or bottom"
        renderer = fig.canvas.get_renderer()
        titles = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
        for i, box in enumerate(titles):  # a long panel title would run into its neighbour's
            assert not any(box.overlaps(other) for other in titles[i + 1 :]), stem


DOLLAR_NAMES = {"a1": "a$_$1", "b1": "price $x$", "fr": "f$^$r"}


def test_names_with_dollar_signs_are_drawn_as_written(
    tmp_path: Path, drawn: dict[str, Any]
) -> None:
    """Matplotlib reads the text between two dollar signs as mathematics: a model (or language)
    named ``a$_$1`` stopped every figure naming it with a parse error, and ``price $x$`` was
    drawn as an italic x. Every name is drawn as written."""
    from matplotlib.cbook import is_math_text
    from matplotlib.text import Text

    write_plots(build_run(tmp_path / "run", names=DOLLAR_NAMES))
    assert set(drawn) == FIGURES
    texts = {t.get_text() for fig, _ in drawn.values() for t in fig.findobj(Text)}
    named = {t: t.replace("\\$", "$") for t in texts if "\\$" in t}  # as matplotlib shows it
    assert set(DOLLAR_NAMES.values()) <= set(named.values())
    assert not [t for t in named if is_math_text(t)]


def test_a_report_into_another_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report A --out B/report.html`` where B is another finished run would replace B's own
    report (or add a file a decomposition does not write): refused in one line naming B, B
    unchanged; so is a report anywhere inside another kind of lmalgebra output (a merge run, a
    tagging evaluation, a model lmalgebra wrote), at any depth. Inside its own run it goes."""
    write_core(tmp_path / "a")
    write_core(tmp_path / "b")
    assert _cli(monkeypatch, str(tmp_path / "b")) == 0
    others = {
        tmp_path / "b": "a decomposition run",
        tmp_path / "merge": "a merge run",
        tmp_path / "pos": "a tagging evaluation",
        tmp_path / "model": "a model directory written by lmalgebra",
    }
    markers = (
        ("recipe.yaml", "examples/xx/manifest.json"),
        ("pos_results.csv", "pos_config.json"),
        ("lmalgebra.json", "config.json"),
    )
    for names, home in zip(markers, list(others)[1:], strict=True):
        for name in names:
            (home / name).parent.mkdir(parents=True, exist_ok=True)
            (home / name).write_text("the output's own\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for home, kind in others.items():
        for name in ("report.html", "other.html", "sub/deeper/report.html"):
            code = _cli(monkeypatch, str(tmp_path / "a"), "--out", str(home / name))
            err = capsys.readouterr().err
            assert code == 2 and f"inside {home}, which holds {kind}" in err, err
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before
    assert _cli(monkeypatch, str(tmp_path / "a"), "--out", str(tmp_path / "a" / "x.html")) == 0
    assert (
        _cli(monkeypatch, str(tmp_path / "a"), "--out", str(tmp_path / "a" / "s" / "x.html")) == 0
    )


def test_a_bootstrap_interval_that_misses_its_estimate_is_drawn(tmp_path: Path) -> None:
    """A percentile interval need not hold its estimate (few spans, a skewed R^2): ``report``
    of such a run (``--study.bootstrap`` on 20 training spans) had ended in matplotlib's
    ``ValueError: 'yerr' must not contain negative values``."""
    from lmalgebra.lmd.figures.run_figures import group_r2_bars
    from lmalgebra.lmd.rundir.schema import FitRow

    fits = [
        FitRow("group", "a", "b", "test", -2.3, ci_low=-8.7, ci_high=-1.9),
        FitRow("group", "b", "a", "test", -1.8, ci_low=-1.7, ci_high=-0.9),  # above it
    ]
    assert group_r2_bars(fits, [], tmp_path / "group_r2.png").stat().st_size > 0
