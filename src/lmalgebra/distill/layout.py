"""The MergeDistill run directory, declared once, and the model directories made here.

A run directory (the recipe's ``output_dir``)::

    recipe.yaml                          the recipe as validated (every stage writes it first)
    .hashes/                             memoised hashes of the teachers' weight files
    teacher_text/<lang>/shard-*          causal: text a teacher wrote (teacher_text) (prepare)
    examples/<lang>/shard-*              id, text, heldout                        (prepare)
    masked/<lang>/<teacher>/shard-*      masked: each teacher's masked copies      (prepare)
    topk/<lang>/<teacher>/shard-*        masked: top-k log-probabilities, loss     (teach)
    vocab/                               masked: union vocabulary, id maps, report (vocab)
    tokens/<lang>/<teacher>/shard-*      causal: each teacher's tokens, offsets    (prepare)
    logprobs/<lang>/<teacher>/shard-*    causal: next-token log-probabilities      (teach)
    <student>/checkpoints/step-*         a student's training checkpoints          (train)
    <student>/model/                     the student, a Hugging Face directory     (train)
    evaluation/                          scores, rdt.csv, evaluation.md, the record (evaluate)
    selection/                           teacher sets ranked by ``experimental select``

Every shard set (``storage.shard_set``) is checksummed and resumable. A model directory (a
student's ``model/``, a teacher made by ``lmalgebra pretrain``) is complete when it holds
``lmalgebra.json``, which ``write_model_directory`` writes last, with the sha256 of every file
it wrote (``model_damage`` checks them: a student is read only when they match).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import RESTART, UserInputError, merge_stage
from lmalgebra.core.fingerprint import sealed, sha256_file
from lmalgebra.core.settings import PLAIN_NAME, PLAIN_NAME_RULE
from lmalgebra.core.text_files import absent, not_a_directory, not_a_file, read_json_object
from lmalgebra.distributed import is_main
from lmalgebra.sources.model_files import CHECK_KEY, FILES_KEY, MARKER, SAVING, model_damage
from lmalgebra.storage.atomic import (
    as_created,
    refuse_special,
    remove_file,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)
from lmalgebra.storage.disk_space import naming_file
from lmalgebra.storage.manifest_parts import MANIFEST
from lmalgebra.storage.output_paths import holds_kind, not_a

# how a merge trains a student beside one it would replace, as a refusal offers it
ANOTHER_STUDENT = merge_stage("train", "OTHER")

RECIPE = "recipe.yaml"
HASHES = ".hashes"
EXAMPLES = "examples"
MASKED = "masked"
TOPK = "topk"
VOCAB = "vocab"
TOKENS = "tokens"
LOGPROBS = "logprobs"
TEACHER_TEXT = "teacher_text"
SHARD_SETS = (
    TEACHER_TEXT,
    EXAMPLES,
    MASKED,
    TOPK,
    TOKENS,
    LOGPROBS,
)  # the parts that are shard sets
MODEL = "model"
CHECKPOINTS = "checkpoints"
EVALUATION = "evaluation"
EVALUATION_MD = "evaluation.md"  # in evaluation/: the evaluation as markdown
RDT_FILE = "rdt.csv"  # in evaluation/: a row per student, RDT per language, then the average
SELECTION = "selection"
CANDIDATE = "lambda-"  # in a student's directory: a run of one of its lambda_candidates
BEST = "best"  # in a training run's directory: its best validation weights (train.validation)
CARD = "README.md"  # in a model directory: its model card (evaluations add to it)
# what a stage writes before any output (the recipe's copy, memoised teacher hashes): a stage that
# fails before producing anything in a run directory it created takes these back with it
RUN_SCRATCH = (RECIPE, f"{HASHES}/*")
# the names of what the stages write at the top of a run: no student may take one
RESERVED = (
    RECIPE,
    TEACHER_TEXT,
    EXAMPLES,
    MASKED,
    TOPK,
    VOCAB,
    TOKENS,
    LOGPROBS,
    EVALUATION,
    SELECTION,
)
# the names a run's tables give a row or column over the languages: no language may take one
SUMMARY_LANGUAGES = {
    "average": "the column of rdt.csv (and of the scores) that averages the languages",
    "overall": "the rows of experimental select's sets.csv for the whole student",
}


def check_language_name(code: str) -> str:
    """``code`` if it is one plain directory name that no table of the run gives its row or
    column over the languages (``SUMMARY_LANGUAGES``); UserInputError naming it otherwise: a
    language ``average`` had its RDT replaced by the average in rdt.csv, with nothing said."""
    check_plain_name(code, "language")
    if code in SUMMARY_LANGUAGES:
        raise UserInputError(
            f"language {code!r} is the name of {SUMMARY_LANGUAGES[code]}: its figures would be "
            "taken for those; name the language otherwise"
        )
    return code


def is_candidate_run(name: str) -> bool:
    """Whether ``name`` is one that a run of a ``lambda_candidates`` KD weight trains in
    (``RunLayout.candidate``: ``lambda-0.8``), not a user's copy of one (``lambda-0.8.bak``),
    which no command reads, checks or removes (``--restart`` had removed its files)."""
    value = name.removeprefix(CANDIDATE)
    try:
        weight = float(value)
    except ValueError:
        return False
    return name.startswith(CANDIDATE) and 0 <= weight <= 1 and f"{weight:g}" == value


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory ``root``."""

    root: Path

    @property
    def recipe(self) -> Path:
        return self.root / RECIPE

    @property
    def hashes(self) -> Path:
        return self.root / HASHES

    def examples(self, lang: str) -> Path:
        return self.root / EXAMPLES / lang

    def teacher_text(self, lang: str) -> Path:
        """The text a teacher wrote for ``lang`` (a causal recipe's ``teacher_text``)."""
        return self.root / TEACHER_TEXT / lang

    def store(self, part: str, lang: str, teacher: str) -> Path:
        """A (language, teacher) shard set of ``part``: masked, topk, tokens or logprobs."""
        return self.root / part / lang / teacher

    @property
    def vocab(self) -> Path:
        return self.root / VOCAB

    def student(self, name: str) -> Path:
        """Student ``name``'s directory (a plain name inside the run: ``check_student_name``)."""
        return self.root / check_student_name(name)

    def model(self, name: str) -> Path:
        return self.student(name) / MODEL

    def candidate(self, name: str, value: float) -> Path:
        """Where student ``name``'s run at KD weight ``value`` of ``lambda_candidates`` trains."""
        return self.student(name) / f"{CANDIDATE}{value:g}"

    def training_runs(self) -> list[Path]:
        """Every directory a student of the run trains in: each student's own, and each of its
        ``lambda_candidates`` runs."""
        found = {p.parent for p in self.root.glob(f"*/{CHECKPOINTS}")}
        found |= {p for p in self.root.glob(f"*/{CANDIDATE}*") if is_candidate_run(p.name)}
        found |= {p.parent for p in self.root.glob(f"*/{BEST}")}
        return sorted(p for p in found if p.is_dir())

    def student_runs(self, name: str) -> list[Path]:
        """Every directory student ``name`` has trained in (``training_runs``, of it alone; its
        own directory too where it holds a training log alone: ``keep_checkpoints`` 0)."""
        own = self.student(name)
        found = {r for r in self.training_runs() if own in (r, r.parent)}
        found |= {own} if (own / "train_log.jsonl").is_file() else set()
        return sorted(found)

    def checkpoints(self) -> list[Path]:
        """Every checkpoint of every student of the run (its candidates' runs' too)."""
        from lmalgebra.train.checkpoint import checkpoint_dirs

        return sorted(c for run in self.training_runs() for c in checkpoint_dirs(run / CHECKPOINTS))

    @property
    def evaluation(self) -> Path:
        return self.root / EVALUATION

    @property
    def selection(self) -> Path:
        return self.root / SELECTION

    def saved_students(self) -> dict[str, Path]:
        """Student name -> model directory, for every complete student of the run."""
        found = sorted(self.root.glob(f"*/{MODEL}/{MARKER}"))
        return {p.parent.parent.name: p.parent for p in found}

    def pairs(self, part: str) -> list[tuple[str, str]]:
        """The (language, teacher) shard sets of ``part`` found on disk, sorted."""
        found = (self.root / part).glob(f"*/*/{MANIFEST}")
        return sorted((p.parent.parent.name, p.parent.name) for p in found)

    def languages(self) -> list[str]:
        """The languages whose examples were written, sorted."""
        return sorted(p.parent.name for p in (self.root / EXAMPLES).glob(f"*/{MANIFEST}"))

    def require_recipe(self) -> Path:
        """The recipe's copy; refused, naming the directory, when it is not a run directory."""
        if self.root.exists() and not self.root.is_dir():
            raise UserInputError(f"run directory {self.root} {not_a_directory(self.root)}")
        if self.root.is_symlink() and not self.root.exists():
            raise UserInputError(f"run directory {self.root} {absent(self.root)}")
        if not self.root.exists():  # a mistyped path had been called a run not yet prepared
            raise UserInputError(
                f"run directory {self.root} does not exist: check the path, or run "
                f"{merge_stage('prepare')} first"
            )
        if not self.recipe.is_file() and (self.recipe.exists() or self.recipe.is_symlink()):
            raise UserInputError(  # a FIFO, a directory, a link to nothing: not "no recipe.yaml"
                f"{self.recipe} {not_a_file(self.recipe)}: it is the run's copy of its recipe, "
                "which the commands given the run directory read; remove it, then run "
                f"{merge_stage('prepare')} again"
            )
        if not self.recipe.is_file():
            raise UserInputError(
                f"{self.root} is not a merge run directory (no {RECIPE}"
                f"{not_a(self.root, 'a merge run')}): run {merge_stage('prepare')} first"
            )
        # a user's recipe.yaml, read as the run's copy (a run stopped before its examples has
        # its copy, headed as one)
        if not holds_kind(self.root, "a merge run") and made_in(self.recipe) is None:
            raise UserInputError(
                f"{self.root} is not a merge run directory: its {RECIPE} is no run's copy (no "
                "examples/ beside it, nor the line a run heads its copy with"
                f"{not_a(self.root, 'a merge run')}); give the run's output_dir, or run "
                f"{merge_stage('prepare')} first"
            )
        return self.recipe


def check_plain_name(name: str, what: str, where: str = "inside the run") -> str:
    """``name`` if it is one plain directory name (no ``/``, ``..`` or hidden name); else one
    ``UserInputError`` naming ``what`` it is (and ``where`` the rule comes from). A run keeps a
    student, and a language's and a teacher's shard sets, in directories of their names: any
    other name would put them outside the run, or two sets in one directory."""
    if not PLAIN_NAME.fullmatch(name):
        raise UserInputError(
            f"{what} {name!r} must be one plain directory name {where} ({PLAIN_NAME_RULE})"
        )
    return name


def check_student_name(name: str) -> str:
    """``name`` if it is one plain directory name inside the run (no ``/``, ``..`` or hidden
    name) that no stage writes (``RESERVED``); UserInputError naming it otherwise, so a student
    is never written outside the run nor into its store or evaluation."""
    check_plain_name(name, "student name")
    if name in RESERVED:
        raise UserInputError(
            f"student name {name!r} is the name of the run's own {name} "
            f"(the run's names: {', '.join(RESERVED)}): name the student otherwise"
        )
    return name


def is_complete(directory: Path) -> bool:
    """Whether the model directory holds its marker (written last by ``write_model_directory``)."""
    return (directory / MARKER).is_file()


def write_model_directory(
    target: Path,
    model: Any,
    tokenizer: Any,
    metadata: dict[str, Any],
    card: str | None = None,
    files: Iterable[tuple[str, bytes]] = (),
) -> Path:
    """``target`` as a Hugging Face model directory: ``save_pretrained`` of model and tokenizer,
    ``files`` (name, content), the model ``card``, then ``lmalgebra.json`` (``metadata``), which
    marks it complete; an older marker is removed first, so a directory cut short is never taken
    for complete. The same model written again (every file as its intact marker records it: a
    second ``merge train`` of a trained student) keeps its card, and the evaluation that
    ``merge evaluate`` wrote into it, which it had replaced with "not evaluated yet").
    Under several processes the main rank alone writes it (every rank holds the same model)."""
    if not is_main():
        return target
    refuse_special_entries(target)
    kept = _intact_files(target)
    shared = _shared_files(target)
    with naming_file(target):
        target.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(target / SAVING, b"")  # before the marker goes: a model saved here, always
    remove_file(target / MARKER)
    for path in shared:  # save_pretrained writes in place: through a hard link, into the other
        path.unlink()
    before = _stamps(target)  # what is there already: a file left as it was is not this write's
    _without_call_settings(tokenizer)
    with naming_file(target):
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
    for name, content in files:
        write_bytes_atomic(target / name, content)
    # hidden files are not the model's: the lock of a directory written in place (pretrain's
    # --out), which its holder removes, and temporaries of atomic writes; nor is a file this
    # write left as it found it (a user's note beside the model, kept by --restart)
    after = _stamps(target)
    written = sorted(
        target / name
        for name, stamp in after.items()
        if name not in (MARKER, CARD) and not name.startswith(".") and before.get(name) != stamp
    )
    as_created(written)  # save_pretrained's safetensors file is 0600 whatever the umask
    sums = {p.name: sha256_file(p) for p in written}
    if card is not None and not (sums == kept and (target / CARD).is_file()):
        write_text_atomic(target / CARD, card)
    write_json_atomic(target / MARKER, sealed({**metadata, FILES_KEY: sums}, CHECK_KEY))
    remove_file(target / SAVING)
    return target


def refuse_special_entries(target: Path) -> None:
    """Refuse a link or a special file (a FIFO, a socket, a device) directly in the model
    directory ``target``, before anything is written: ``save_pretrained`` writes its files
    (``config.json``, the tokenizer's) in place, and opening a FIFO there to write had waited
    for a reader forever, and a link had been written through (``storage.atomic.refuse_special``).
    Hidden files (the lock, temporaries of atomic writes) are not the model's."""
    if not target.is_dir() or target.is_symlink():
        return
    for entry in sorted(target.iterdir()):
        if not entry.name.startswith("."):
            refuse_special(entry, "file of model directory")


def _intact_files(directory: Path) -> dict[str, Any] | None:
    """The sha256 of each file of the complete model directory, as its marker records them,
    when they all match (None: no such model, or a damaged one)."""
    if not is_complete(directory) or model_damage(directory) is not None:
        return None
    sums = read_marker(directory).get(FILES_KEY)
    return sums if isinstance(sums, dict) else None


def _shared_files(directory: Path) -> list[Path]:
    """The model's own files (those its marker records) that have other names: a directory
    copied with hard links (``cp -al``, ``rsync --link-dest``), whose model written again here
    had been written into the other copy's files too."""
    try:
        recorded = read_marker(directory).get(FILES_KEY) if is_complete(directory) else None
    except UserInputError:  # a damaged marker: the model is written anew all the same
        recorded = None
    names = recorded if isinstance(recorded, dict) else {}
    paths = [directory / name for name in names if isinstance(name, str)]
    return [p for p in paths if p.is_file() and not p.is_symlink() and p.stat().st_nlink > 1]


def _stamps(directory: Path) -> dict[str, tuple[int, int, int, int]]:
    """Each regular file directly in ``directory`` by name: inode, size, modification and change
    times (a file written again has another change time, which the kernel sets on every write:
    its modification time can come out the same, on a file system of coarse times or a clock
    set back, and a file written again in place had been taken for one left as it was)."""
    if not directory.is_dir():
        return {}
    found = {}
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            found[path.name] = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    return found


def _without_call_settings(tokenizer: Any) -> None:
    """Clear the truncation and padding a fast tokenizer's backend keeps from its last call
    (training encodes with ``truncation=True``), which ``save_pretrained`` would write into
    ``tokenizer.json``: the saved tokenizer is the same whether or not this run encoded
    anything (a run resumed after its last step encodes nothing). Each call of a Hugging Face
    tokenizer sets both again."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_truncation()
        backend.no_padding()


def read_marker(directory: Path) -> dict[str, Any]:
    """What made the complete model directory (its ``lmalgebra.json``); UserInputError naming
    the file when it cannot be read."""
    return read_json_object(directory / MARKER, "model directory marker")


def saved_training(directory: Path, key: str = "training") -> Any:
    """The training settings the complete model directory records (``key``: another entry of
    its record, ``made_from``, say; None: none, or no such model; a record that cannot be read
    is named where the model is read)."""
    if not is_complete(directory):
        return None
    try:
        return read_marker(directory).get(key)
    except (UserInputError, AttributeError):
        return None


def saved_steps(directory: Path) -> int:
    """The training steps the complete model directory records (0: none, or no such model)."""
    if not is_complete(directory):
        return 0
    try:
        steps = read_marker(directory).get("training", {}).get("steps", 0)
    except (UserInputError, AttributeError):
        return 0
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else 0


def trusted_model(directory: Path, missing: str) -> Path:
    """``directory``, a complete and undamaged model directory; UserInputError ``missing`` when
    it is not complete, naming the damaged file when it is damaged."""
    if not is_complete(directory):
        raise UserInputError(missing)
    damage = model_damage(directory)
    if damage is not None:
        raise UserInputError(f"{damage}: train it again with {RESTART}, or remove {directory}")
    return directory


# the first line of a run's copy of its recipe: the directory its relative paths were read from
# (commands given the run read them from the current directory, and refuse one found only there)
MADE_IN = "# made in (relative paths below name files from there: run its commands there): "
_MADE_IN_BEFORE = "# relative paths below are read from the directory the run was made in: "


def made_in(copy: Path) -> Path | None:
    """The directory named by the ``made in`` line among the leading comments of ``copy`` (a
    run's copy's first line, a selection's ``recommended.yaml``'s second); none: a file without
    one (a copy from before the line was written, the user's own recipe kept as the copy)."""
    with copy.open("rb") as handle:
        for raw in handle:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            prefix = next((p for p in (MADE_IN, _MADE_IN_BEFORE) if line.startswith(p)), None)
            if prefix is not None:
                with contextlib.suppress(ValueError):
                    return Path(json.loads(line.removeprefix(prefix)))
                return None
            if not line.startswith("#"):
                return None
    return None
