"""Seeding the student's token embeddings from its teachers (``student.init_embeddings``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoTokenizer

from hostile_helpers import assert_one_line
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import validate
from lmalgebra.distill import pipeline
from lmalgebra.distill.masked.student_model import build_masked_lm
from lmalgebra.distill.pipeline import train_student
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.distill.student import MaskedStudentSpec
from lmalgebra.distill.teachers import load_lm
from lmalgebra.distill.vocab.union import UnionVocab, build_union
from lmalgebra.experimental.seeding import (
    TeacherTable,
    apply_seeding,
    mapped_reference,
    no_context_prior,
    pca_map,
    ridge_map,
    seed_from_teachers,
    seed_rows,
    teacher_tables,
)
from lmalgebra.sources.models import ModelRef
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe

STD = 0.02


@pytest.fixture(scope="module")
def tokenizers(teacher_dirs: dict[str, Path]) -> dict[str, object]:
    return {name: AutoTokenizer.from_pretrained(path) for name, path in teacher_dirs.items()}


@pytest.fixture(scope="module")
def vocab(tokenizers: dict[str, object]) -> UnionVocab:
    return build_union(tokenizers)


def synthetic_tables(
    vocab: UnionVocab, tokenizers: dict[str, object], widths: dict[str, int], seed: int = 0
) -> dict[str, TeacherTable]:
    """Teachers whose embeddings share a latent per student token (so that maps are meaningful),
    of the given widths, with random priors."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(len(vocab.tokens), 6))
    tables = {}
    for name, width in widths.items():
        ids = vocab.maps[name]
        mix = rng.normal(size=(6, width))
        embeddings = latent[ids] @ mix + 0.1 * rng.normal(size=(ids.size, width))
        prior = rng.random(ids.size)
        tables[name] = TeacherTable(embeddings, prior / prior.sum(), tokenizers[name])
    return tables


def teachers_of(vocab: UnionVocab) -> list[dict[str, list[int]]]:
    """Per student id, the teacher ids mapping to it, per teacher that has it (plain loops)."""
    found: list[dict[str, list[int]]] = [{} for _ in vocab.tokens]
    for name, mapping in vocab.maps.items():
        for teacher_id, student_id in enumerate(mapping.tolist()):
            found[student_id].setdefault(name, []).append(teacher_id)
    return found


def test_tokens_take_their_teachers_mapped_embeddings_averaged(vocab, tokenizers) -> None:
    tables = synthetic_tables(vocab, tokenizers, {"wp": 12, "sp": 9})
    seeding = seed_rows(tables, vocab, width=10, init_std=STD)
    assert seeding.report["reference"] == "wp"  # the widest teacher
    assert seeding.report["from_teachers"] == len(vocab.tokens) - 1  # all but [PAD]
    assert np.isnan(seeding.rows[0]).all() and np.isnan(seeding.bias[0])
    both = 0
    for student_id, having in enumerate(teachers_of(vocab)):
        if student_id == 0:
            continue
        per_teacher = [
            seeding.maps[name](tables[name].embeddings[ids]).mean(axis=0)
            for name, ids in having.items()
        ]
        expected = seeding.scale * np.mean(per_teacher, axis=0)
        np.testing.assert_allclose(seeding.rows[student_id], expected, rtol=1e-10, atol=1e-14)
        both += len(having) == 2
    assert both > 50  # many tokens are shared, so averaging is exercised
    rms = np.sqrt(np.mean(seeding.rows[1:] ** 2))
    assert rms == pytest.approx(STD, rel=1e-12)


def test_a_token_two_teachers_share_gets_their_average(vocab, tokenizers) -> None:
    tables = synthetic_tables(vocab, tokenizers, {"wp": 8, "sp": 8})
    seeding = seed_rows(tables, vocab, width=8, init_std=STD)
    river = vocab.tokens.index("river")
    wp = tokenizers["wp"].convert_tokens_to_ids("river")
    sp = tokenizers["sp"].convert_tokens_to_ids("▁river")
    assert vocab.maps["wp"][wp] == river and vocab.maps["sp"][sp] == river
    mapped_wp = seeding.maps["wp"](tables["wp"].embeddings[[wp]])[0]
    mapped_sp = seeding.maps["sp"](tables["sp"].embeddings[[sp]])[0]
    expected = seeding.scale * (mapped_wp + mapped_sp) / 2
    np.testing.assert_allclose(seeding.rows[river], expected, rtol=1e-10)
    # the output bias is the log of the teachers' equal-weight mixture prior
    prior = (tables["wp"].prior[wp] + tables["sp"].prior[sp]) / 2
    assert seeding.bias[river] == pytest.approx(np.log(prior), rel=1e-12)


def test_reference_map_is_pca_and_a_narrower_reference_is_zero_padded() -> None:
    rng = np.random.default_rng(1)
    data = rng.normal(size=(200, 5)) @ rng.normal(size=(5, 5)) + 3.0
    wide = pca_map(data, 3)
    _, values, axes = np.linalg.svd(data - data.mean(axis=0), full_matrices=False)
    np.testing.assert_allclose(np.abs(wide.weight), np.abs(axes[:3]), atol=1e-10)
    projected = wide(data)
    np.testing.assert_allclose(projected.mean(axis=0), 0, atol=1e-10)
    np.testing.assert_allclose(projected.std(axis=0) * np.sqrt(200), values[:3], rtol=1e-10)
    narrow = pca_map(data, 8)  # the teacher is narrower than the student: pad
    np.testing.assert_array_equal(narrow.weight[5:], 0)
    np.testing.assert_allclose(narrow.weight[:5] @ narrow.weight[:5].T, np.eye(5), atol=1e-10)


def test_ridge_map_matches_lstsq() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 6)) * [1, 2, 3, 4, 5, 6] + 1.5
    y = x @ rng.normal(size=(6, 3)) + rng.normal(size=(40, 3)) + 2.0
    # no penalty: ordinary least squares with an intercept column
    exact = ridge_map(x, y, alpha=0.0)
    design = np.hstack([x, np.ones((40, 1))])
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)
    np.testing.assert_allclose(exact.weight, solution[:6].T, rtol=1e-8)
    np.testing.assert_allclose(exact.bias, solution[6], rtol=1e-8)
    # relative ridge: penalty alpha * mean feature variance, as extra rows of a centred system
    alpha = 0.3
    ridge = ridge_map(x, y, alpha=alpha)
    lam = alpha * x.var(axis=0).mean()
    xc, yc = x - x.mean(axis=0), y - y.mean(axis=0)
    augmented = np.vstack([xc, np.sqrt(40 * lam) * np.eye(6)])
    solution, *_ = np.linalg.lstsq(augmented, np.vstack([yc, np.zeros((6, 3))]), rcond=None)
    np.testing.assert_allclose(ridge.weight, solution.T, rtol=1e-8)
    np.testing.assert_allclose(ridge.bias, y.mean(axis=0) - x.mean(axis=0) @ solution, rtol=1e-8)


def test_a_token_no_teacher_has_is_the_mean_of_its_pieces(vocab, tokenizers) -> None:
    extended = dataclasses.replace(vocab, tokens=[*vocab.tokens, "riverstone", "##ΩΩ"])
    tables = synthetic_tables(extended, tokenizers, {"wp": 8, "sp": 8})
    width = TINY_STUDENT["hidden_size"]
    seeding = seed_rows(tables, extended, width=width, init_std=STD)
    assert seeding.report["from_pieces"] == 1 and seeding.report["random"] == 2  # and [PAD]
    pieces: set[int] = set()
    for name, tokenizer in tokenizers.items():
        ids = tokenizer("riverstone", add_special_tokens=False)["input_ids"]
        pieces |= {int(vocab.maps[name][i]) for i in ids}
    pieces = {i for i in pieces if i >= 5 and vocab.tokens[i].strip("#")}
    assert len(pieces) >= 2 and vocab.tokens.index("river") in pieces
    chosen = sorted(pieces)
    new = len(vocab.tokens)
    np.testing.assert_allclose(seeding.rows[new], seeding.rows[chosen].mean(axis=0), rtol=1e-12)
    assert seeding.bias[new] == pytest.approx(seeding.bias[chosen].mean(), rel=1e-12)
    # nothing overlaps "ΩΩ" (both teachers cut it to unknown pieces): the row stays random
    assert np.isnan(seeding.rows[new + 1]).all() and np.isnan(seeding.bias[new + 1])
    model = build_masked_lm(MaskedStudentSpec(**TINY_STUDENT), len(extended.tokens), seed=3)
    before = model.get_input_embeddings().weight.detach().clone()
    apply_seeding(model, seeding, pad_id=0)
    after = model.get_input_embeddings().weight.detach()
    assert torch.equal(after[new + 1], before[new + 1]) and torch.equal(after[0], before[0])
    np.testing.assert_allclose(after[new].numpy(), seeding.rows[new], rtol=1e-6)


def test_teachers_sharing_too_few_tokens_are_refused(vocab, tokenizers) -> None:
    tables = synthetic_tables(vocab, tokenizers, {"wp": 8, "sp": 8})
    apart = dataclasses.replace(
        vocab, maps={**vocab.maps, "sp": np.where(vocab.maps["sp"] >= 5, 1, vocab.maps["sp"])}
    )
    with pytest.raises(UserInputError, match=r"teacher 'sp' shares 0 tokens with .* 'wp'"):
        seed_rows(tables, apart, width=8, init_std=STD)


def test_teachers_sharing_too_few_tokens_are_refused_by_the_dry_run_too(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A teacher of a six-piece vocabulary (trained here on ``a``) beside ``wp``: the dry run,
    which builds the union vocabulary in memory, had passed what training then refused."""
    from lmalgebra.api.pretrain import pretrain
    from lmalgebra.distill.pretrain.specs import MaskedPretrainSpec

    (tmp_path / "a.txt").write_text("a\n", encoding="utf-8")
    spec = MaskedPretrainSpec(
        corpus={"paths": [str(tmp_path / "a.txt")]},
        language="xx",
        out=tmp_path / "few",
        tokenizer={"vocab_size": 40},
        model={"hidden_size": 16, "num_heads": 2, "num_layers": 1},
        training={"steps": 0},
    )
    teachers = {"wp": teacher_dirs["wp"], "sp": pretrain(spec)}
    student = {**TINY_STUDENT, "init_embeddings": "teachers"}
    path = write_recipe(tmp_path, teachers, student=student, training=TINY_TRAINING, top_k=4)
    for command in (["run", "--dry-run"], ["train", "--dry-run"]):
        code, stderr = cli(["merge", *command[:1], str(path), *command[1:]])
        assert_one_line(code, stderr, ["teacher 'sp' shares 1 tokens", "reference teacher 'wp'"])
    assert not (tmp_path / "run").exists()


def test_a_lone_teacher_of_few_tokens_is_its_own_reference() -> None:
    """A teacher is never compared with itself: one of six tokens alone is seeded from."""
    assert mapped_reference({"few": np.arange(6)}, {"few": 16}) == "few"
    with pytest.raises(UserInputError, match=r"teacher 'few' shares 1 tokens with .* 'wide'"):
        mapped_reference({"wide": np.arange(40), "few": np.arange(6)}, {"wide": 32, "few": 16})


def test_prior_is_the_teachers_prediction_without_context(teacher_dirs) -> None:
    ref = ModelRef(name="wp", path=str(teacher_dirs["wp"]))
    model = load_lm(ref, teacher_dirs["wp"], "masked")
    tokenizer = AutoTokenizer.from_pretrained(teacher_dirs["wp"])
    prior = no_context_prior(model, tokenizer, 12)
    assert prior.shape == (model.config.vocab_size,) and prior.sum() == pytest.approx(1, rel=1e-9)
    ids = [tokenizer.cls_token_id] + [tokenizer.mask_token_id] * 10 + [tokenizer.sep_token_id]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, 1:-1].double()
    np.testing.assert_allclose(prior, torch.softmax(logits, -1).mean(0).numpy(), rtol=1e-5)


# -- through the recipe ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory: pytest.TempPathFactory, teacher_dirs) -> Path:
    root = tmp_path_factory.mktemp("seeded")
    student = {**TINY_STUDENT, "init_embeddings": "teachers"}
    path = write_recipe(root, teacher_dirs, student=student, training=TINY_TRAINING)
    recipe = load_recipe(path)
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    pipeline.vocab(recipe)
    return path


def test_seeding_a_student_is_reproducible_and_uses_the_teachers(recipe_path: Path) -> None:
    recipe = load_recipe(recipe_path)
    vocab = UnionVocab.load(recipe.output_dir / "vocab")
    students = [build_masked_lm(recipe.student, len(vocab.tokens), seed=s) for s in (0, 1)]
    reports = [seed_from_teachers(model, recipe, vocab) for model in students]
    assert reports[0] == reports[1] and reports[0]["from_teachers"] == len(vocab.tokens) - 1
    first, second = (m.get_input_embeddings().weight.detach() for m in students)
    assert torch.equal(first[1:], second[1:])  # all but [PAD], which keeps each own init
    bias = [m.get_output_embeddings().bias.detach() for m in students]
    assert torch.equal(bias[0][1:], bias[1][1:])
    # the seeded rows are the teachers' own, mapped: direct from their tables
    tables = teacher_tables(recipe)
    seeding = seed_rows(tables, vocab, first.shape[1], students[0].config.initializer_range)
    np.testing.assert_allclose(first[1:].numpy(), seeding.rows[1:], rtol=1e-6, atol=1e-9)


def test_train_records_the_seeding_and_refuses_resuming_a_random_run(recipe_path: Path) -> None:
    recipe = load_recipe(recipe_path)
    target = train_student(recipe, "seeded", progress=False)
    meta = json.loads((target / "lmalgebra.json").read_text())
    assert meta["init_embeddings"]["reference"] in ("wp", "sp")
    assert meta["recipe"]["student"]["init_embeddings"] == "teachers"
    random = recipe.model_copy(
        update={"student": recipe.student.model_copy(update={"init_embeddings": "random"})}
    )
    with pytest.raises(UserInputError, match="the embedding initialisation changed"):
        train_student(random, "seeded", progress=False)


def test_an_unknown_init_value_is_refused(recipe_path: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(recipe_path.read_text())
    data["student"]["init_embeddings"] = "fasttext"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserInputError) as err:
        load_recipe(path)
    message = str(err.value)
    assert "student.init_embeddings" in message and "'fasttext'" in message
    assert "\n" not in message


def test_pretraining_from_scratch_has_no_seeding(tmp_path: Path) -> None:
    """A teacher made from scratch has no teachers to seed from: the key is not in its spec."""
    from lmalgebra.api.pretrain import MaskedPretrainSpec

    data = {
        "corpus": {"paths": [str(tmp_path / "c.txt")]},
        "language": "xx",
        "out": tmp_path / "out",
        "tokenizer": {"vocab_size": 100},
        "model": {**TINY_STUDENT, "init_embeddings": "teachers"},
    }
    with pytest.raises(UserInputError, match=r"unknown key 'model\.init_embeddings'"):
        validate(MaskedPretrainSpec, data, "spec")


def test_a_factorised_student_is_seeded_at_its_embedding_width(recipe_path: Path) -> None:
    recipe = load_recipe(recipe_path)
    factorised = recipe.student.model_copy(update={"embedding_size": 16})
    recipe = recipe.model_copy(update={"student": factorised})
    vocab = UnionVocab.load(recipe.output_dir / "vocab")
    model = build_masked_lm(recipe.student, len(vocab.tokens))
    seed_from_teachers(model, recipe, vocab)
    weight = model.get_input_embeddings().weight.detach()
    assert weight.shape == (len(vocab.tokens), 16)
    assert float(weight[1:].pow(2).mean().sqrt()) == pytest.approx(0.02, rel=1e-5)
    prior = model.get_output_embeddings().bias.detach()
    assert bool((prior[1:] < 0).all())  # log-probabilities of the teachers' mixture
