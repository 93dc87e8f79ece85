"""Files of precomputed span embeddings a user could hand over: each is read as what it is, or
refused in one line naming the model and the file, never a traceback and never another file's
verdict (its width, a damaged page, the case of its digest)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import save_file

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import order_digest, span_sha256
from lmalgebra.sources.precomputed import file_shape, load_precomputed

TEXTS = {
    "train": [f"train span {i}" for i in range(6)],
    "validation": ["validation span"],
    "test": ["test span"],
}
ROWS = [t for split in ("train", "validation", "test") for t in TEXTS[split]]


def _npy(path: Path, vectors: np.ndarray) -> Path:
    np.save(path, vectors)
    path.with_name(path.name + ".spans.sha256").write_text(order_digest(TEXTS) + "\n")
    return path


def _safetensors(path: Path, vectors: np.ndarray, digest: str | None = None) -> Path:
    save_file(
        {"embeddings": vectors}, str(path), metadata={"spans_sha256": digest or order_digest(TEXTS)}
    )
    return path


def _parquet(path: Path, vectors: np.ndarray) -> Path:
    embedding = pa.array([list(row) for row in vectors], type=pa.list_(pa.float32()))
    ids = [span_sha256(t) for t in ROWS][: len(vectors)]
    pq.write_table(pa.table({"embedding": embedding, "span_sha256": ids}), path)
    return path


@pytest.mark.parametrize("suffix", [".npy", ".safetensors", ".parquet"])
def test_embeddings_of_width_zero_are_refused_naming_the_file(suffix: str, tmp_path: Path) -> None:
    """A file of ``(spans, 0)`` had passed every check and crashed the fit's statistics
    (``zero-size array to reduction operation maximum``), by the dry run too."""
    write = {".npy": _npy, ".safetensors": _safetensors, ".parquet": _parquet}[suffix]
    path = write(tmp_path / f"empty{suffix}", np.zeros((8, 0), np.float32))
    for read in (lambda: file_shape("v", path), lambda: load_precomputed("v", path, TEXTS)):
        with pytest.raises(UserInputError, match=r"model 'v': .* holds embeddings of width 0"):
            read()


@pytest.mark.parametrize("suffix", [".npy", ".safetensors", ".parquet"])
def test_a_file_of_no_rows_is_refused_as_empty(suffix: str, tmp_path: Path) -> None:
    """A Parquet file of no rows had been refused as "embeddings of width 0" (it has no width
    to read): every format names it as holding no rows."""
    write = {".npy": _npy, ".safetensors": _safetensors, ".parquet": _parquet}[suffix]
    path = write(tmp_path / f"none{suffix}", np.zeros((0, 4), np.float32))
    for read in (lambda: file_shape("v", path), lambda: load_precomputed("v", path, TEXTS)):
        with pytest.raises(UserInputError, match=r"model 'v': .* holds no rows; expected one"):
            read()


def test_a_parquet_file_damaged_past_its_footer_is_one_line(tmp_path: Path) -> None:
    """Its schema is read from the footer; a damaged data page had escaped as pyarrow's
    ``OSError`` (exit 1, a traceback), whose message spans lines and holds the page's bytes."""
    path = _parquet(tmp_path / "v.parquet", np.ones((8, 4), np.float32))
    data = bytearray(path.read_bytes())
    for i in range(4, 68):  # the first page header, right after the magic bytes
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    for read in (lambda: file_shape("v", path), lambda: load_precomputed("v", path, TEXTS)):
        with pytest.raises(UserInputError) as err:
            read()
        message = str(err.value)
        assert message.startswith(f"model 'v': cannot read {path} as Parquet: "), message
        assert "\n" not in message and message.isprintable(), repr(message)


def test_a_safetensors_digest_in_capitals_is_the_same_digest(tmp_path: Path) -> None:
    """The digest beside a ``.npy`` and a Parquet file's ids are read in either case; the
    safetensors metadata's had been refused as "made for other spans"."""
    vectors = np.arange(32, dtype=np.float32).reshape(8, 4)
    path = _safetensors(tmp_path / "v.safetensors", vectors, order_digest(TEXTS).upper())
    rows = load_precomputed("v", path, TEXTS).splits
    read = np.vstack([np.vstack(list(rows[s].chunks())) for s in ("train", "validation", "test")])
    np.testing.assert_array_equal(read, vectors)


def test_two_digests_beside_a_file_must_agree_and_a_damaged_one_is_named_so(
    tmp_path: Path,
) -> None:
    """A ``.npy`` with both sidecars, ``.spans.sha256`` of its spans and ``.spans.json`` of
    others, was read by the first alone (the other never looked at); a ``.spans.json`` that is
    no JSON was named as having no digest string."""
    path = _npy(tmp_path / "v.npy", np.arange(32, dtype=np.float32).reshape(8, 4))
    json_form = path.with_name("v.npy.spans.json")
    json_form.write_text('{"spans_sha256": "' + "0" * 64 + '"}\n')
    with pytest.raises(UserInputError, match=r"^model 'v': .*v\.npy\.spans\.sha256 and .* give"):
        load_precomputed("v", path, TEXTS)
    json_form.write_text('{"spans_sha256": "' + order_digest(TEXTS) + '"}\n')
    assert load_precomputed("v", path, TEXTS).splits  # the same digest twice: read
    path.with_name("v.npy.spans.sha256").unlink()
    json_form.write_text("{bad\n")
    with pytest.raises(UserInputError, match=r"^model 'v': .*v\.npy\.spans\.json is not readable"):
        load_precomputed("v", path, TEXTS)


def test_a_parquet_file_of_ids_and_texts_has_both_checked(tmp_path: Path) -> None:
    """A Parquet file with both ``span_sha256`` (the run's spans) and ``text`` (other spans, or
    the same in another order) was read by its ids alone, its texts never compared."""
    vectors = np.arange(32, dtype=np.float32).reshape(8, 4)
    path = _parquet(tmp_path / "v.parquet", vectors)
    table = pq.read_table(path)
    for texts, said in ((ROWS, None), ([*ROWS[1:], ROWS[0]], "another order")):
        pq.write_table(table.append_column("text", pa.array(texts)), path)
        if said is None:
            assert load_precomputed("v", path, TEXTS).splits
            continue
        with pytest.raises(UserInputError, match=rf"^model 'v': .* span text differs\); .*{said}"):
            load_precomputed("v", path, TEXTS)


def test_a_float64_file_whose_variation_float32_loses_is_named_so(tmp_path: Path) -> None:
    """A float64 file of ``1e8 + x``: read in float32 blocks, its variation was lost before any
    check, and it was refused as "does not vary ... (every embedding is the same)", or, lost in
    a held-out split alone, warned of as "every test span has the same embedding"; each split
    is named as varying but not in float32, with the remedy, as an array handed to
    ``decompose`` is. The same rows centred are read."""
    texts = {split: [f"{split} span {i}" for i in range(4)] for split in TEXTS}
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(12, 4))
    for name, rows, split in (
        ("far", vectors + 1e8, "training"),
        ("held", np.vstack([vectors[:8], vectors[8:] + 1e8]), "test"),
        ("centred", vectors, None),
    ):
        path = tmp_path / f"{name}.safetensors"
        save_file({"embeddings": rows}, str(path), metadata={"spans_sha256": order_digest(texts)})
        if split is None:
            splits = load_precomputed("v", path, texts).splits
            read = np.vstack([np.vstack(list(splits[s].chunks())) for s in texts])
            np.testing.assert_array_equal(read, rows.astype(np.float32))
            continue
        said = rf"^model 'v': the {split} embeddings in {path} vary \(by up to .*\) but not in"
        with pytest.raises(UserInputError, match=said):
            load_precomputed("v", path, texts)
