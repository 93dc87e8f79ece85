"""``lmalgebra experimental select``: which teachers of a recipe complement each other, per
language.

For every language, each candidate teacher (the teachers the recipe lists for it) embeds spans of
the language's held-out examples through the LMD pipeline (its embedding cache and statistics),
and is scored on the same examples by masked-token accuracy (:mod:`.teacher_quality`). Every set of
``size`` candidates is then scored by :mod:`lmalgebra.stats.complementarity` (complementarity times
normalised quality, with bootstrap intervals). The overall ranking scores a set of teachers for the
whole student: the mean over languages of the score of the set's members that cover the language
(0 when none does). Nothing here reads or writes the teacher store.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError, counted, either
from lmalgebra.core.fingerprint import sha256_texts
from lmalgebra.core.recipe_files import validate
from lmalgebra.distill.examples import Example, language_examples
from lmalgebra.distill.masked.teachers import open_masked_teacher
from lmalgebra.distill.recipe import MaskedRecipe, MergeRecipe, masked_only, parse_recipe
from lmalgebra.distill.teachers import Teacher
from lmalgebra.evaluate.lmd_coverage import refuse_unusable_cache
from lmalgebra.experimental.selection.selection_spec import SelectionSpec
from lmalgebra.experimental.selection.teacher_quality import TeacherQuality, held_out_quality
from lmalgebra.lmd.run.pipeline import RunInputs, RunResult, run_decomposition
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.lmd.settings.spans import TooLittleTextError
from lmalgebra.stats.bootstrap import percentile_interval
from lmalgebra.stats.complementarity import SetSamples, SetScore, ranked, set_samples
from lmalgebra.stats.solver import Decomposer, SingularBasisError

log = logging.getLogger(__name__)
SOURCE = "experimental select"


@dataclass
class LanguageSelection:
    """One language: its candidates' qualities and group R^2, and every set ranked."""

    language: str
    qualities: list[TeacherQuality]
    group_r2: dict[str, float]  # test R^2 of each candidate on all the others
    ranking: list[SetScore]
    samples: dict[int, SetSamples]  # set size -> scores of every set of that size
    spans: dict[str, int]


@dataclass
class Selection:
    """What ``experimental select`` found: per-language rankings, the overall ranking, timings."""

    size: int
    languages: dict[str, LanguageSelection]
    overall: list[SetScore]
    timings: dict[str, float]
    identity: dict[str, Any] = field(default_factory=dict)  # selection_identity
    cache_dir: Path | None = None  # the cache its decompositions wrote (SelectionSpec.cache_dir)

    @property
    def recommended(self) -> dict[str, list[str]]:
        """Language -> the best-scoring set of its candidates."""
        return {lang: list(found.ranking[0].members) for lang, found in self.languages.items()}

    def recipe(self, recipe: MergeRecipe) -> MergeRecipe:
        """``recipe`` with each selected language's teachers replaced by its recommended set."""
        data = recipe.model_dump(mode="json")
        for lang, members in self.recommended.items():
            data["languages"][lang]["teachers"] = members
        used = {t for spec in data["languages"].values() for t in spec["teachers"]}
        data["teachers"] = {n: t for n, t in data["teachers"].items() if n in used}
        return parse_recipe(data, "recommended recipe")


def select_teachers(
    recipe: MergeRecipe,
    spec: SelectionSpec,
    before_scoring: Callable[[dict[str, Any]], None] | None = None,
) -> Selection:
    """Rank the recipe's teacher sets of ``spec.size`` per language and overall.

    Every language's held-out examples are read and every candidate opened (its fingerprint
    taken) first; ``before_scoring`` is then given the selection's identity
    (:func:`selection_identity`), e.g. to claim an output directory before the work."""
    recipe = masked_only(
        recipe,
        "experimental select ranks masked-LM teachers (by masked-token accuracy); "
        "this recipe has objective causal",
    )
    languages = _languages(recipe, spec)
    refuse_unusable_cache(spec.cache_dir)  # before the accuracies, not after
    held = {lang: _held_out(recipe, lang, spec.max_texts) for lang in languages}
    opened: dict[str, Teacher] = {}
    for lang in languages:
        for name in sorted(recipe.languages[lang].teachers):
            if name not in opened:
                ref = recipe.teachers[name].ref(name)
                opened[name] = open_masked_teacher(ref, example_length=recipe.example_length)
    identity = selection_identity(recipe, spec, held, opened)
    if before_scoring is not None:
        before_scoring(identity)
    found: dict[str, LanguageSelection] = {}
    timings = {"quality": 0.0, "lmd": 0.0}
    for lang in languages:
        found[lang] = _language(recipe, spec, lang, held[lang], opened, timings)
    clock = time.perf_counter()
    overall = _overall(found, spec)
    timings["overall"] = time.perf_counter() - clock
    return Selection(spec.size, found, overall, timings, identity, spec.cache_dir)


def selection_identity(
    recipe: MaskedRecipe,
    spec: SelectionSpec,
    held: dict[str, list[Example]],
    teachers: dict[str, Teacher],
) -> dict[str, Any]:
    """What makes a selection this one, one key per thing a message can name: the recipe (the
    recommended recipe is made from it), the settings (less progress and the cache's place),
    each language's held-out examples (ids and texts) and each candidate's fingerprint
    (weights, tokenizer, config)."""
    identity: dict[str, Any] = {
        "recipe": recipe.model_dump(mode="json"),
        "settings": spec.model_dump(mode="json", exclude={"progress", "cache_dir"}),
    }
    for lang, examples in held.items():
        identity[f"held-out text of {lang}"] = sha256_texts(f"{e.id}\t{e.text}" for e in examples)
    for name in sorted(teachers):
        identity[f"teacher {name}"] = teachers[name].hashes
    return identity


def _languages(recipe: MaskedRecipe, spec: SelectionSpec) -> list[str]:
    chosen = list(spec.languages) if spec.languages else list(recipe.languages)
    unknown = [lang for lang in chosen if lang not in recipe.languages]
    if unknown:
        raise UserInputError(
            f"language {unknown[0]!r} is not in the recipe ({', '.join(recipe.languages)})"
        )
    if spec.size < 1:
        raise UserInputError(f"size must be at least 1, got {spec.size}")
    most = max(len(recipe.languages[lang].teachers) for lang in chosen)
    if spec.size > most:
        given = either("--languages", "languages=")
        which = f"{given}, {', '.join(chosen)}," if spec.languages else "the recipe"
        raise UserInputError(
            f"size {spec.size} is larger than the candidates: no language of {which} lists "
            f"more than {counted(most, 'teacher')}"
        )
    return chosen


def _held_out(recipe: MaskedRecipe, lang: str, limit: int | None) -> list[Example]:
    held = [e for e in language_examples(recipe, lang) if e.heldout]
    if not held:
        raise UserInputError(
            f"language {lang!r} has no held-out example to compare its teachers on "
            f"(heldout_fraction {recipe.heldout_fraction}); raise heldout_fraction"
        )
    return held[:limit] if limit else held


def _language(
    recipe: MaskedRecipe,
    spec: SelectionSpec,
    lang: str,
    held: list[Example],
    opened: dict[str, Teacher],
    timings: dict[str, float],
) -> LanguageSelection:
    candidates = sorted(recipe.languages[lang].teachers)
    clock = time.perf_counter()
    qualities = []
    for name in candidates:
        ref = recipe.teachers[name].ref(name)
        qualities.append(
            held_out_quality(
                lang,
                opened[name],
                ref,
                held,
                recipe.masking,
                recipe.example_length,
                spec.batch_size,
            )
        )
    timings["quality"] += time.perf_counter() - clock
    accuracy = {q.teacher: q.accuracy for q in qualities}
    if len(candidates) > 1 and not any(a > 0 for a in accuracy.values()):
        log.warning(  # normalised_quality gives each 1.0: the ranking had looked meaningful
            "%s: no candidate predicts a masked held-out token (accuracy 0 for each): quality "
            "says nothing, so sets rank by complementarity alone (ties in name order)",
            lang,
        )
    samples: dict[int, SetSamples] = {}
    group_r2: dict[str, float] = {}
    spans: dict[str, int] = {}
    clock = time.perf_counter()
    if spec.size == 1 or len(candidates) == 1:  # sets of one: nothing is fitted
        samples[1] = set_samples(None, candidates, 1, accuracy)
    if len(candidates) > 1:
        try:
            result = _embed(recipe, spec, lang, candidates, [e.text for e in held])
            _set_scores(result, spec, candidates, accuracy, samples)
        except TooLittleTextError as err:
            if spec.size > 1:
                raise
            log.warning("%s; sets of one rank by quality alone: group_r2 left blank", err)
        except SingularBasisError as err:  # its remedies are decompose's flags
            raise UserInputError(
                f"language {lang!r}: {err.what}; use a larger alpha than {spec.alpha}"
            ) from None
        else:
            group_r2 = {fit.target: fit.r2["test"] for fit in result.group}
            spans = dict(result.spans)
    timings["lmd"] += time.perf_counter() - clock
    top = min(spec.size, len(candidates))
    ranking = ranked(samples[top], spec.level)
    return LanguageSelection(lang, qualities, group_r2, ranking, samples, spans)


def _set_scores(
    result: RunResult,
    spec: SelectionSpec,
    candidates: list[str],
    accuracy: dict[str, float],
    samples: dict[int, SetSamples],
) -> None:
    """Into ``samples``: the scores of the language's sets it lacks, from its LMD run."""
    solver = Decomposer(result.blocks, result.stats, result.alpha, "relative")
    for size in range(1, min(spec.size, len(candidates)) + 1):
        if size not in samples:
            blocked = result.blocked["test"]
            samples[size] = set_samples(
                solver, candidates, size, accuracy, blocked, "test", spec.bootstrap, spec.seed
            )


def _embed(
    recipe: MaskedRecipe, spec: SelectionSpec, lang: str, names: list[str], texts: list[str]
) -> RunResult:
    """The LMD run of the candidates on the language's held-out text (block statistics kept)."""
    models = []
    for name in names:
        teacher = recipe.teachers[name]
        models.append(
            {
                "name": name,
                "path": teacher.path,
                "revision": teacher.revision,
                "trust_remote_code": teacher.trust_remote_code,
            }
        )
    data = {
        "models": models,
        "corpus": recipe.languages[lang].corpus.model_dump(mode="json"),
        "spans": spec.spans.model_dump(),
        "alpha": spec.alpha,
        "study": {"bootstrap": max(spec.bootstrap, 1), "level": spec.level, "seed": spec.seed},
        "cache_dir": str(spec.cache_dir),
        "progress": spec.progress,
        "batch_size": spec.batch_size,
    }
    config = validate(DecomposeConfig, data, SOURCE)
    try:
        inputs = RunInputs(docs=texts, keep_blocks=True, log_warnings=False)
        result = run_decomposition(config, inputs)
    except TooLittleTextError as err:  # named by its class: a teacher's name may hold "span"
        cap = "" if spec.max_texts is None else f"--max_texts {spec.max_texts} (max_texts), "
        raise TooLittleTextError(
            f"language {lang!r}: its {len(texts)} held-out examples are too little text to "
            f"compare teachers ({err}); raise {cap}heldout_fraction or "
            f"languages.{lang}.max_examples, or lower spans.length"
        ) from err
    for warning in result.warnings:  # logged once, by language, in this command's flags
        if warning.startswith("--study.bootstrap"):
            if not spec.bootstrap:  # the run's one replicate keeps its blocks: no interval drawn
                continue
            # in this call's words, flag and keyword: --bootstrap 40 (bootstrap=40)
            warning = re.sub(r'study=\{"bootstrap": (\d+)\}', r"bootstrap=\1", warning)
            warning = warning.replace("--study.bootstrap", "--bootstrap")
        else:  # the remedies of the others are decompose's flags (-T, --study.alpha_select)
            warning = warning.split("; use ")[0]
        log.warning("%s: %s", lang, warning)
    return result


def _overall(found: dict[str, LanguageSelection], spec: SelectionSpec) -> list[SetScore]:
    """Sets of ``size`` teachers from every language's candidates, scored for the whole student:
    the mean over languages of the language's score of the members that cover it."""
    every = sorted({q.teacher for f in found.values() for q in f.qualities})
    sets = list(combinations(every, min(spec.size, len(every))))
    point = np.zeros(len(sets))
    columns: dict[int, list[np.ndarray | float]] = {s: [] for s in range(len(sets))}
    for f in found.values():
        mine = {q.teacher for q in f.qualities}
        where = {m: (k, s) for k, got in f.samples.items() for s, m in enumerate(got.sets)}
        for s, members in enumerate(sets):
            covering = tuple(m for m in members if m in mine)
            if covering:
                got, index = f.samples[where[covering][0]], where[covering][1]
                point[s] += got.score[index] / len(found)
                fixed = not got.replicates.shape[0] or len(covering) == 1
                columns[s].append(
                    float(got.score[index])
                    if fixed
                    else got.replicates[:, index] * got.quality[index]
                )
    low, high = _overall_intervals(columns, len(found), spec.level)
    nan = float("nan")  # complementarity and quality are per language
    rows = [
        SetScore(members, nan, nan, nan, nan, float(point[s]), low[s], high[s], {})
        for s, members in enumerate(sets)
    ]
    return sorted(rows, key=lambda r: (-round(r.score, 12), r.members))


def _overall_intervals(
    columns: dict[int, list[np.ndarray | float]], languages: int, level: float
) -> tuple[list[float], list[float]]:
    """Percentile intervals of the overall scores from the languages' replicates (a language
    whose score does not vary, a lone teacher's, adds its constant to every replicate)."""
    width = max(
        (len(c) for cs in columns.values() for c in cs if isinstance(c, np.ndarray)), default=0
    )
    if not width:
        nan = [float("nan")] * len(columns)
        return nan, nan
    sample = np.zeros((width, len(columns)))
    for s, parts in columns.items():
        for part in parts:
            sample[:, s] += np.asarray(part) / languages
    low, high = percentile_interval(sample, level)
    return low.tolist(), high.tolist()
