"""``lmalgebra report`` pages opened in headless Chromium: no console or page error, every figure
decoded, every expected section heading present, no network request.

Needs Debian's ``chromium`` at /usr/bin/chromium (``apt-get install -y chromium``; ``make install``
does it as root) and the ``playwright`` Python package (the ``test`` extra; its own browser
download is not used). Set LMALGEBRA_SKIP_BROWSER=1 to skip these tests on a machine without them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lmalgebra.cli import main
from report_fixtures import build_run

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# heading -> the run file whose presence makes the section appear (None: always)
SECTIONS: dict[str, str | None] = {
    "Run": None,
    "Pairwise R² (clustered)": "pairwise_r2_test.csv",
    "Group R²": "group_r2.csv",
    "Similarity: LMD, CKA and CCA": "similarity.csv",
    "Sweeps": "sweeps",
    "Layer maps": "sweeps/layer_map.csv",
    "Alpha curve": "alpha_curve.csv",
    "Attribution": "attribution.csv",
    "Configuration": "config.yaml",
}
SWEEPS = {
    "Span length T": "sweeps/length.csv",
    "Layer": "sweeps/layer.csv",
    "Training spans": "sweeps/train_size.csv",
    "Language": "sweeps/language.csv",
}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if os.environ.get("LMALGEBRA_SKIP_BROWSER") == "1":
        pytest.skip("LMALGEBRA_SKIP_BROWSER=1")
    if not CHROMIUM.is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium (`apt-get install -y chromium` as "
            "root, or `make install` as root), or set LMALGEBRA_SKIP_BROWSER=1 to skip",
            pytrace=False,
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the playwright package is missing: pip install -e '.[test]' (no `playwright "
            "install` needed), or set LMALGEBRA_SKIP_BROWSER=1 to skip",
            pytrace=False,
        )
    with sync_playwright() as engine:
        launched = engine.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield launched
        launched.close()


@dataclass
class Visit:
    """What a page did while loading: problems, requests, and what it shows."""

    url: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    headings: list[str] = field(default_factory=list)
    subheadings: list[str] = field(default_factory=list)
    image_widths: list[int] = field(default_factory=list)
    clipped: list[str] = field(default_factory=list)


# every heading and table header whose text is wider than its box, or that reaches past the
# page's right edge: a cut title
CLIPPED = """els => els.filter(e => e.scrollWidth > e.clientWidth + 1
    || e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
  .map(e => e.tagName + ': ' + e.textContent.slice(0, 80))"""


def visit(browser: Any, page_path: Path) -> Visit:
    seen = Visit(page_path.resolve().as_uri())
    context = browser.new_context()
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and seen.errors.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: seen.errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: seen.errors.append(f"request failed: {r.url}"))

    def route(request_route: Any) -> None:  # every request passes here; only the page may load
        url = request_route.request.url
        seen.requests.append(url)
        if url == seen.url:
            request_route.continue_()
        else:
            request_route.abort()

    context.route("**/*", route)
    page.goto(seen.url, wait_until="load")
    seen.headings = page.eval_on_selector_all("h2", "hs => hs.map(h => h.textContent)")
    seen.subheadings = page.eval_on_selector_all("h3", "hs => hs.map(h => h.textContent)")
    seen.image_widths = page.eval_on_selector_all(
        "img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)"
    )
    seen.clipped = page.eval_on_selector_all("h1, h2, h3, th", CLIPPED)
    context.close()
    return seen


def report(run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    """``lmalgebra report RUN``, as a user runs it; the path it prints."""
    monkeypatch.setattr(sys, "argv", ["lmalgebra", "report", str(run)])
    capsys.readouterr()
    main()
    printed = Path(capsys.readouterr().out.strip())
    assert printed == run / "report.html"
    return printed


def check(seen: Visit, run: Path) -> None:
    assert not seen.errors, seen.errors
    assert not seen.clipped, seen.clipped
    assert seen.requests == [seen.url], f"requests besides the page itself: {seen.requests}"
    figures = sorted((run / "plots").glob("*.png"))
    assert len(seen.image_widths) == len(figures) > 0
    assert all(width > 0 for width in seen.image_widths), seen.image_widths
    expected = [h for h, name in SECTIONS.items() if name is None or (run / name).exists()]
    assert seen.headings == expected
    assert seen.subheadings == [h for h, name in SWEEPS.items() if (run / name).exists()]


def test_every_contract_file_renders(
    browser: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = build_run(tmp_path / "run")
    seen = visit(browser, report(run, monkeypatch, capsys))
    check(seen, run)
    assert seen.headings == list(SECTIONS)
    assert len(seen.image_widths) == 10


def test_long_names_leave_no_title_cut(
    browser: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # no space or hyphen: nothing where a browser would break the line by itself
    names = {
        "a1": "organisation_with_a_long_name_encoder_a1_base_multilingual_cased_finetuned",
        "b1": "another_lab_b1_model_name_that_is_also_very_long_v2",
    }
    run = build_run(tmp_path / ("a_run_directory_named_at_length_" * 4 + "end"), names=names)
    seen = visit(browser, report(run, monkeypatch, capsys))
    check(seen, run)  # among the checks: no heading or table header clipped
    assert seen.headings == list(SECTIONS)


def test_a_real_decomposition_renders(
    browser: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
) -> None:
    run = tmp_path / "run"
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        sys,
        "argv",
        [
            *("lmalgebra", "decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"),
            *("--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"),
            *("--out", str(run), "--no-progress"),
        ],
    )
    main()
    assert (run / "summary.json").is_file()
    check(visit(browser, report(run, monkeypatch, capsys)), run)
