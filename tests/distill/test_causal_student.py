"""Causal student training from the causal teacher store: each loss mix trains, a pinned loss
trajectory, resume, the saved model in a text-generation pipeline, refused configurations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from causal_fixtures import (
    CAUSAL_STUDENT,
    taught_causal_recipe,
    train_causal,
    train_log,
    write_causal_recipe,
)
from hostile_helpers import assert_one_line, run_cli
from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.causal.bits_per_byte import BITS, BitsRow
from lmalgebra.distill.causal.evaluation import bits_rdt
from lmalgebra.distill.causal.student_data import CausalStoreBatches
from lmalgebra.distill.causal.student_model import build_causal_lm
from lmalgebra.distill.causal.student_tokenizer import student_tokenizer
from lmalgebra.distill.causal.training import causal_step_loss, gradient_ratio
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.storage.csv_tables import read_table
from lmalgebra.train.config import CausalTrainingSpec
from lmalgebra.train.cross_tokenizer import LOSSES, NEEDS, CausalLoss, needs_of

TRAINING = {
    "steps": 6,
    "batch_size": 4,
    "lr": 3e-3,
    "warmup_steps": 0,
    "lambda_schedule": "constant",
    "lambda_value": 0.5,
    "log_every": 1,
    "checkpoint_every": 3,
    "seed": 3,
}
# every loss of the table alone, and a mix (the pinned trajectory's)
MIXES = {
    **{name: {name: 1.0} for name in LOSSES},
    "all": {"mined_kl": 0.5, "uld": 0.5, "alm": 1.0, "sampled": 0.5},
}


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    root = tmp_path_factory.mktemp("causal-student")
    return taught_causal_recipe(root, causal_teacher_dirs, TRAINING)


@pytest.fixture(scope="module")
def trained(recipe_path: Path) -> Path:
    return train_causal(recipe_path, "student", objective_mix=MIXES["all"])


def _source(
    recipe_path: Path, mode: str = "all", needs: frozenset[str] = NEEDS
) -> tuple[CausalStoreBatches, object]:
    recipe = load_recipe(recipe_path)
    tokenizer, _ = student_tokenizer(recipe, lambda: {})
    source = CausalStoreBatches(
        recipe.output_dir,
        {k: v.teachers for k, v in recipe.languages.items()},
        {n: AutoTokenizer.from_pretrained(t.path) for n, t in recipe.teachers.items()},
        tokenizer,
        tokenizer.eos_token_id,
        recipe.student.max_position_embeddings,
        8,
        0.7,
        mode,
        0,
        needs=needs,
    )
    return source, tokenizer


def test_batches_carry_only_the_alignments_the_mix_reads(recipe_path: Path) -> None:
    """CE only builds no alignment, ALM and ULD the chunks, MinED-KL and sampled the MinED
    alignment; what is built equals the full batch's."""
    assert needs_of(["ce"]) == frozenset()
    assert needs_of(["alm", "uld"]) == {"chunks"}
    assert needs_of(["mined_kl", "sampled"]) == {"mined", "samples"}
    assert needs_of(["prefix_kl"]) == {"chunks", "prefix"}
    assert needs_of(["prefix_all_kl"]) == {"positions"}
    full = _source(recipe_path)[0].batch(3)
    chunk_keys, mined_keys = ("student_chunk", "teacher_chunk", "chunk_start"), ("mined",)
    for wanted in (frozenset(), frozenset({"chunks"}), frozenset({"mined"})):
        part = _source(recipe_path, needs=wanted)[0].batch(3)
        for key in ("input_ids", "targets", "mask", "topk_ids", "next_logprob"):
            assert torch.equal(getattr(part, key).nan_to_num(), getattr(full, key).nan_to_num())
        for name, keys in (("chunks", chunk_keys), ("mined", mined_keys)):
            for key in keys:
                got = getattr(part, key)
                assert torch.equal(got, getattr(full, key)) if name in wanted else (got == -1).all()


@pytest.mark.parametrize("mix", list(MIXES))
def test_each_loss_mix_trains_and_its_terms_fall(recipe_path: Path, mix: str) -> None:
    """Distillation alone (lambda 1; CE for the baseline): the mix's loss on a fixed batch of
    training examples falls from the initial to the trained weights."""
    # CE alone weighs no distillation term: the recipe's lambda settings are refused beside it
    kd = {"lambda_schedule": "linear"} if mix == "ce" else {"lambda_value": 1.0}
    model = train_causal(
        recipe_path, f"mix-{mix}", objective_mix=MIXES[mix], steps=8, lr=1e-2, **kd
    )
    assert [r["step"] for r in train_log(model)] == list(range(1, 9))
    source, tokenizer = _source(recipe_path)
    batch = source.batch(0)
    spec = CausalTrainingSpec(objective_mix=MIXES[mix])
    step = causal_step_loss(MIXES[mix])
    initial = build_causal_lm(load_recipe(recipe_path).student, tokenizer, TRAINING["seed"])
    trained = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        before, after = (step(m.eval(), batch, spec, 1.0) for m in (initial, trained))
    assert float(after.total) < float(before.total)
    if mix == "ce":
        assert not before.has_kd
    else:
        assert before.has_kd and float(before.kd) > 0


def test_a_loss_added_through_the_table_alone_trains(
    recipe_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loss registered in the table (no other file touched) is accepted by the settings, gets
    the batch fields it declares and trains a student."""

    def half_alm(logits, batch, temperature, mean):
        return 0.5 * LOSSES["alm"].term(logits, batch, temperature, mean)

    toy = CausalLoss("half_alm", half_alm, frozenset({"chunks"}), tempered=True, summary="toy")
    monkeypatch.setitem(LOSSES, "half_alm", toy)
    model = train_causal(recipe_path, "toy", objective_mix={"half_alm": 1.0}, steps=3)
    assert [r["step"] for r in train_log(model)] == [1, 2, 3]
    assert all(r["kd"] > 0 for r in train_log(model))
    meta = json.loads((model / "lmalgebra.json").read_text())
    assert meta["objective_mix"] == {"half_alm": 1.0}


def test_gradient_balance_gives_the_distillation_term_the_gradient_of_ce() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen, requires_grad=True)
    ce = torch.nn.functional.cross_entropy(logits.view(-1, 11), torch.arange(10) % 11)
    kd = 7.0 * (logits**2).mean()
    scaled = kd * gradient_ratio(ce, kd, logits)
    (g_ce,) = torch.autograd.grad(ce, logits, retain_graph=True)
    (g_kd,) = torch.autograd.grad(scaled, logits)
    assert g_kd.norm().item() == pytest.approx(g_ce.norm().item(), rel=1e-5)
    constant = torch.zeros((), requires_grad=False)
    assert gradient_ratio(ce, constant, logits).item() == 1.0


def test_balanced_and_smoothed_studentstrain_causal(recipe_path: Path) -> None:
    """kd_balance gradient and label smoothing reach the step: the losses differ from the plain
    run's from the first step on, and training runs to its end."""
    plain = train_log(train_causal(recipe_path, "plain", objective_mix={"alm": 1.0}, steps=2))
    balanced = train_log(
        train_causal(
            recipe_path, "balanced", objective_mix={"alm": 1.0}, steps=2, kd_balance="gradient"
        )
    )
    smoothed = train_log(
        train_causal(
            recipe_path, "smoothed", objective_mix={"ce": 1.0}, steps=2, label_smoothing=0.1
        )
    )
    ce = train_log(train_causal(recipe_path, "ce-twin", objective_mix={"ce": 1.0}, steps=2))
    assert len(balanced) == len(smoothed) == 2
    assert balanced[0]["kd"] != plain[0]["kd"]
    assert smoothed[0]["loss"] != ce[0]["loss"]  # the same seed and batches: smoothing alone


def test_teachers_chosen_per_language(recipe_path: Path) -> None:
    """training.teachers as language -> teachers: a language not named keeps all of its own."""
    recipe = load_recipe(recipe_path)
    assert recipe.teachers_of({"xx": ["uni"]}) == {"xx": ["uni"], "yy": ["wp"]}
    assert recipe.teachers_of(["wp", "bl"]) == {"xx": ["bl"], "yy": ["wp"]}
    with pytest.raises(UserInputError, match="language 'zz'"):
        recipe.teachers_of({"zz": ["wp"]})
    with pytest.raises(UserInputError, match="leaves language 'yy' without a teacher"):
        recipe.teachers_of({"yy": ["uni"]})
    model = train_causal(recipe_path, "per-language", teachers={"xx": ["uni"]}, steps=2)
    meta = json.loads((model / "lmalgebra.json").read_text())
    assert meta["training"]["teachers"] == {"xx": ["uni"]}


def test_pinned_loss_trajectory(trained: Path) -> None:
    """Seeded mix of every loss, lambda 0.5; float kernels may differ between machines."""
    losses = [r["loss"] for r in train_log(trained)]
    pinned = [5.55631, 5.48783, 5.41227, 5.32576, 5.26222, 5.26099]
    np.testing.assert_allclose(losses, pinned, rtol=2e-3)


def test_student_loads_and_generates(trained: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(trained)
    tokenizer = AutoTokenizer.from_pretrained(trained)
    generate = pipeline("text-generation", model=model, tokenizer=tokenizer)
    out = generate("the river", max_new_tokens=5, do_sample=False)
    assert out[0]["generated_text"].startswith("the river")
    meta = json.loads((trained / "lmalgebra.json").read_text())
    assert meta["kind"] == "causal-student" and meta["objective_mix"] == MIXES["all"]
    card = (trained / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card and "# student (causal student)" in card
    assert "xx: bl, uni; yy: wp" in card and "mined_kl 0.5, uld 0.5, alm 1, sampled 0.5" in card
    assert set(meta["teacher_hashes"]) == {"bl", "uni", "wp"}


def test_parameters_move_from_their_initialisation(recipe_path: Path, trained: Path) -> None:
    recipe = load_recipe(recipe_path)
    tokenizer = AutoTokenizer.from_pretrained(trained)
    initial = build_causal_lm(recipe.student, tokenizer, seed=TRAINING["seed"]).state_dict()
    final = load_file(str(trained / "model.safetensors"))
    moved = [k for k in final if k in initial and not torch.equal(initial[k], final[k])]
    assert len(moved) > 10


def test_killed_and_resumed_run_ends_with_identical_weights(
    recipe_path: Path, trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = CausalStoreBatches.batch

    def dying(self, index):
        if index == 4:  # after the step-3 checkpoint, during step 5
            raise KeyboardInterrupt
        return real(self, index)

    monkeypatch.setattr(CausalStoreBatches, "batch", dying)
    with pytest.raises(KeyboardInterrupt):
        train_causal(recipe_path, "resumed", objective_mix=MIXES["all"])
    monkeypatch.setattr(CausalStoreBatches, "batch", real)
    resumed = train_causal(recipe_path, "resumed", objective_mix=MIXES["all"])
    a = load_file(str(trained / "model.safetensors"))
    b = load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # same CPU kernels


def test_batches_align_each_example_to_its_teacher(recipe_path: Path) -> None:
    source, tokenizer = _source(recipe_path)
    batch = source.batch(0)
    real = batch.mask
    # the student's inputs are its tokens shifted right behind the start token
    assert torch.equal(batch.input_ids[:, 1:][real[:, 1:]], batch.targets[:, :-1][real[:, 1:]])
    assert (batch.input_ids[:, 0] == tokenizer.eos_token_id).all()
    # aligned rows point at real teacher rows; chunk starts are chunk starts
    depth = (~batch.next_logprob.isnan()).sum(1)
    for key in ("mined", "chunk_start"):
        aligned = getattr(batch, key)
        assert (aligned < depth[:, None]).all() and (aligned[~real] == -1).all()
    starts = batch.chunk_start >= 0
    assert torch.equal(
        batch.student_chunk[starts],
        batch.teacher_chunk.gather(1, batch.chunk_start.clamp(min=0))[starts],
    )
    assert batch.sample_ids is not None and int(batch.sample_ids.max()) < len(tokenizer)


def test_refused_configurations(
    causal_teacher_dirs, recipe_path: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    with pytest.raises(UserInputError, match="unknown loss 'kl'"):
        CausalTrainingSpec(objective_mix={"kl": 1.0})
    with pytest.raises(UserInputError, match="ce stands alone"):
        CausalTrainingSpec(objective_mix={"ce": 1.0, "alm": 1.0})
    path = write_causal_recipe(
        tmp_path,
        causal_teacher_dirs,
        student=CAUSAL_STUDENT,
        training={**TRAINING, "objective_mix": {"sampled": 1.0}},
        causal={"example_bytes": 300},
    )
    code, err = run_cli(["merge", "train", str(path), "--no-progress"], monkeypatch, capsys)
    assert_one_line(code, err, ["sampled needs drawn tokens", "causal.samples"])
    # a setting the student ignores too (no dropout): the dry run names what train names
    both = write_causal_recipe(
        tmp_path,
        causal_teacher_dirs,
        student=CAUSAL_STUDENT,
        training={**TRAINING, "objective_mix": {"sampled": 1.0}, "dropout_masks": "torch"},
        causal={"example_bytes": 300},
    )
    for stage in (["train"], ["train", "--dry-run"], ["run", "--dry-run"]):
        code, err = run_cli(["merge", *stage, str(both), "--no-progress"], monkeypatch, capsys)
        assert_one_line(code, err, ["sampled needs drawn tokens", "causal.samples"])
    bad = write_causal_recipe(
        tmp_path, causal_teacher_dirs, training={**TRAINING, "objective_mix": {"mined": 1.0}}
    )
    code, err = run_cli(["merge", "train", str(bad), "--no-progress"], monkeypatch, capsys)
    assert_one_line(code, err, ["unknown loss 'mined'", "mined_kl"])


def test_rdt_on_bits_per_byte_is_positive_when_the_student_needs_fewer_bits() -> None:
    def row(lang: str, model: str, bits: float) -> BitsRow:
        return BitsRow(lang, model, 1, 1, 0, 1, 1, 0.0, bits, bits)

    rows = [row("xx", "a", 2.0), row("xx", "b", 4.0), row("xx", "s", 3.0), row("yy", "c", 2.0)]
    found = bits_rdt(rows, "s", {"xx": ["a", "b"], "yy": ["c"]})
    assert found["xx"] == pytest.approx(100 * ((2 - 3) / 2 + (4 - 3) / 4) / 2)  # -12.5
    assert np.isnan(found["yy"]) and found["average"] == pytest.approx(found["xx"])


def test_merge_evaluate_scores_teachers_and_student_in_bits_per_byte(
    recipe_path: Path, trained: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))  # LMD coverage embeds spans
    run_dir = load_recipe(recipe_path).output_dir
    # the student alone: the module's other tests save other students in this run
    args = ["merge", "evaluate", str(run_dir), "--students", "student"]
    code, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    rows = read_table(run_dir / "evaluation", BITS)
    assert {(r.language, r.model) for r in rows} == {
        (lang, model) for lang in ("xx", "yy") for model in ("bl", "uni", "wp", "student")
    }
    assert all(0 < r.bits_per_byte < 20 for r in rows)
    want = bits_rdt(rows, "student", {"xx": ["bl", "uni"], "yy": ["wp"]})
    rdt = (run_dir / "evaluation" / "rdt.csv").read_text().splitlines()
    assert rdt[0] == "student,xx,yy,average"
    got = [float(v) for v in rdt[1].split(",")[1:]]
    np.testing.assert_allclose(got, [want["xx"], want["yy"], want["average"]], atol=1e-3)
    report = (run_dir / "evaluation" / "evaluation.md").read_text()
    assert "Greedy continuations of student" in report and report.count("- xx: `") == 2
    assert "How much of each teacher the student carries" in report
    card = (trained / "README.md").read_text()  # the student's card: its rows and RDT
    assert "Not evaluated yet" not in card and "| yy | student |" in card
    assert f"RDT against its teachers: xx {want['xx']:.2f}%" in card


def test_best_copy_is_the_teacher_with_fewest_nats_per_byte(recipe_path: Path) -> None:
    source, _ = _source(recipe_path, "best")
    pool = source.pools[source.languages.index("xx")]
    bl, uni = pool.copies
    for item, row in enumerate(pool.row):
        per_byte = []
        for copy in (bl, uni):
            record = copy.store.record(int(row))
            nats = -np.nansum(record.next_logprob.astype(np.float64))
            per_byte.append(nats / len(record.text.encode("utf-8")))
        assert pool.source[item] == int(np.argmin(per_byte))
    assert len(pool.row) == pool.examples  # one copy per example


def test_training_teachers_distils_from_the_named_teachers_only(recipe_path: Path) -> None:
    """``training.teachers`` restricts each language's copies to the named teachers: the
    student's batches come from those records alone; a name the recipe lacks, or a subset that
    leaves a language without a teacher, is one line."""
    from lmalgebra.distill.causal.training import causal_student_data
    from lmalgebra.distill.teachers import Teacher

    recipe = load_recipe(recipe_path)
    assert recipe.teachers_of(None) == {"xx": ["bl", "uni"], "yy": ["wp"]}
    assert recipe.teachers_of(["uni", "wp"]) == {"xx": ["uni"], "yy": ["wp"]}
    spec = CausalTrainingSpec.model_validate({**TRAINING, "teachers": ["uni", "wp"]})
    teachers = {
        n: Teacher(n, Path(t.path), {}, AutoTokenizer.from_pretrained(t.path))
        for n, t in recipe.teachers.items()
    }
    source = causal_student_data(recipe, spec, {"alm": 1.0}, teachers).source
    copies = {
        lang: [c.name for c in source.pools[i].copies] for i, lang in enumerate(source.languages)
    }
    assert copies == {"xx": ["uni"], "yy": ["wp"]}
    # every teacher fingerprints as runs recorded before the setting: those still resume
    from lmalgebra.train.run_fingerprint import training_part

    assert "teachers" not in training_part(CausalTrainingSpec.model_validate(TRAINING))
    assert training_part(spec)["teachers"] == ["uni", "wp"]
    with pytest.raises(UserInputError, match="names 'nope', which is not defined"):
        recipe.teachers_of(["nope"])
    with pytest.raises(UserInputError, match="leaves language 'yy' without a teacher"):
        recipe.teachers_of(["bl"])
    with pytest.raises(UserInputError, match=r"training\.teachers is empty"):
        CausalTrainingSpec.model_validate({**TRAINING, "teachers": []})


QUARTER_ALM = CausalLoss(
    "quarter_alm",
    lambda logits, batch, temperature, mean: (
        0.25 * LOSSES["alm"].term(logits, batch, temperature, mean)
    ),
    frozenset({"chunks"}),
    tempered=True,
    summary="toy plugin",
)


def test_a_loss_from_another_package_joins_the_table_by_entry_point(
    recipe_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry point of ``lmalgebra.causal_losses`` (what another package declares in its
    metadata) is listed without being imported, imported when a run names it, and trains."""
    from importlib.metadata import EntryPoint

    from lmalgebra.core import plugins

    point = EntryPoint("quarter_alm", "test_causal_student:QUARTER_ALM", plugins.CAUSAL_LOSSES)
    declared = {**plugins.declared(plugins.CAUSAL_LOSSES), "quarter_alm": point}
    monkeypatch.setattr(plugins, "declared", lambda group: declared)
    monkeypatch.delitem(LOSSES._losses, "quarter_alm", raising=False)
    assert "quarter_alm" in list(LOSSES) and "quarter_alm" not in LOSSES._losses
    model = train_causal(recipe_path, "plugin", objective_mix={"quarter_alm": 1.0}, steps=2)
    assert LOSSES._losses.get("quarter_alm") is QUARTER_ALM
    assert all(r["kd"] > 0 for r in train_log(model))
    del LOSSES["quarter_alm"]


@pytest.mark.parametrize(
    "text",
    ["*bold* _it_ [a](b) <script>x</script>", "a `tick` and ``two``", "`edge`", "line\nbreak", ""],
)
def test_a_continuation_is_shown_as_written_in_the_evaluation_markdown(text: str) -> None:
    """A held-out prompt's ``*``, ``_``, ``<script>`` or link had been read as Markdown inside
    the bold prompt of ``evaluation.md``; each is a code span of its text now."""
    from markdown_it import MarkdownIt

    from lmalgebra.distill.causal.evaluation import _code

    html = MarkdownIt().render(_code(text))
    inner = re.fullmatch(r"<p><code>(.*)</code></p>\n", html, re.S)
    assert inner is not None, html
    shown = inner.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    assert shown.strip() == text.replace("\n", "⏎").strip()
