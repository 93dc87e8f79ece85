"""``pretrain``: teachers made here, from Python: a masked or causal LM from scratch, or a
masked-LM head fitted on a frozen encoder, each described by its spec (the keys of
``lmalgebra pretrain masked|causal|head-only``)."""

from __future__ import annotations

from pathlib import Path

from lmalgebra.api.runtime import library_entry, refuse_keep_and_restart
from lmalgebra.core.errors import UserInputError, UserTypeError
from lmalgebra.core.settings import revalidated
from lmalgebra.distill.pretrain.specs import CausalPretrainSpec, HeadOnlySpec, MaskedPretrainSpec

__all__ = ["CausalPretrainSpec", "HeadOnlySpec", "MaskedPretrainSpec", "TeacherSpec", "pretrain"]
TeacherSpec = MaskedPretrainSpec | CausalPretrainSpec | HeadOnlySpec


@library_entry
def pretrain(
    spec: TeacherSpec, progress: bool = False, restart: bool = False, *, keep_saved: bool = False
) -> Path:
    """Make the teacher ``spec`` describes in ``spec.out``; its model directory. Training cut
    short resumes from its last checkpoint (``restart``: from step 0). ``keep_saved``: a teacher
    already saved in ``spec.out`` is kept as it is (otherwise resumed: to more steps, say)."""
    from lmalgebra.distill.layout import is_complete
    from lmalgebra.distill.pretrain.causal import pretrain_causal
    from lmalgebra.distill.pretrain.head_only import pretrain_head
    from lmalgebra.distill.pretrain.masked import pretrain_masked

    if not isinstance(spec, MaskedPretrainSpec | CausalPretrainSpec | HeadOnlySpec):
        # a mapping of a spec's keys passes the entry's check (pydantic would make it the spec)
        raise UserTypeError(f"pretrain(): spec must be TeacherSpec, got {type(spec).__name__}")
    spec = revalidated(spec, "pretrain(): spec")  # a copy pydantic did not check
    refuse_keep_and_restart("pretrain()", keep_saved, restart)
    if keep_saved and is_complete(spec.out) and not restart:
        _refuse_other_saved(spec)
        return spec.out
    if isinstance(spec, MaskedPretrainSpec):
        return pretrain_masked(spec, progress, restart)
    if isinstance(spec, CausalPretrainSpec):
        return pretrain_causal(spec, progress, restart)
    return pretrain_head(spec, progress, restart)


# the kind each spec's teacher records in its ``lmalgebra.json``
KINDS = {
    MaskedPretrainSpec: "pretrained-teacher",
    CausalPretrainSpec: "pretrained-causal-teacher",
    HeadOnlySpec: "head-only-teacher",
}


def _refuse_other_saved(spec: TeacherSpec) -> None:
    """Refuse to keep a saved teacher made from other inputs than ``spec``'s (its training
    aside): one of other sizes, tokenizer or text had been returned as this spec's, unsaid;
    and, as making one refuses them, a model of another kind (a teacher of another kind, a
    merge run's student) and an ``out`` inside another output."""
    from lmalgebra.distill.examples import training_examples
    from lmalgebra.distill.layout import read_marker
    from lmalgebra.distill.pretrain.teacher_directory import refuse_other_kind_saved
    from lmalgebra.storage.lockfile import refuse_nested
    from lmalgebra.train.run_fingerprint import differences

    refuse_nested(spec.out, "pretrain")
    refuse_other_kind_saved(spec.out, KINDS[type(spec)])

    recorded = read_marker(spec.out).get("made_from")
    if recorded is None:  # a teacher of an older release: kept as it is
        return
    _, texts = training_examples(spec.corpus, spec.language, spec.heldout_fraction)
    changed = differences(recorded, spec.made_from(texts))
    if changed:
        raise UserInputError(
            f"pretrain(): keep_saved: {spec.out} holds a teacher made from other inputs "
            f"({'; '.join(changed[:3])}), kept only for the spec it was made from; give "
            "another out, or remove it"
        )
