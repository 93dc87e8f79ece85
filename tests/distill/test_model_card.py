"""The students' model cards say how each was made: a gold-only or CE-only student is no
distilled one, and one language or one teacher is not "multilingual" nor "several"."""

from __future__ import annotations

from lmalgebra.distill.run.model_card import causal_student_card, student_card

TRAINING = {"lambda_schedule": "linear", "steps": 4, "batch_size": 2, "lr": 0.001, "seed": 0}


def _summary(card: str) -> str:
    return card.split("\n\n")[2]  # after the metadata block and the title


def test_a_masked_students_card_says_whether_it_was_distilled() -> None:
    one = {"languages": {"en": {"teachers": ["t-en"]}}, "student": {"hidden_size": 8}}
    gold = student_card("sm1", one, {**TRAINING, "gold_only": True}, {"en": 1.0}, 10)
    assert "gold labels alone" in _summary(gold) and "distilled" not in _summary(gold)
    assert "multilingual" not in _summary(gold) and "several" not in gold
    assert "- **objective**: gold-only (MLM on gold labels)\n" in gold  # no lambda it never used
    both = {"en": {"teachers": ["t-en", "head"]}, "fr": {"teachers": ["t-fr"]}}
    distilled = student_card(
        "sm3", {**one, "languages": both}, {**TRAINING, "gold_only": False}, {"en": 0.5}, 10
    )
    assert "multilingual BERT masked LM distilled" in _summary(distilled)
    assert "teacher masked LMs head, t-en, t-fr" in _summary(distilled)
    assert "- **objective**: distilled (KD + MLM), lambda linear\n" in distilled


def test_a_causal_students_card_says_whether_it_was_distilled() -> None:
    def card(mix: dict[str, float]) -> str:
        return causal_student_card(
            "s", {"en": ["a"]}, {"init": None}, {**TRAINING, "gold_only": False}, mix, {}, "x"
        )

    ce = card({"ce": 1.0})
    assert "its text alone" in _summary(ce) and "distilled" not in _summary(ce)
    assert "- **losses**: ce 1\n" in ce
    alm = card({"ce": 1.0, "alm": 1.0})
    assert "distilled by lmalgebra" in _summary(alm) and "ce 1, alm 1; lambda linear" in alm
