"""A teacher's target at every student position (``distill.vocab.position_targets``) against a
reference written from the definition: at chunk starts the prefix-mapped top-k, inside a teacher
token the top-k conditioned on the bytes already read, found by scanning every vocabulary."""

from __future__ import annotations

import math

import numpy as np
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from lmalgebra.distill.vocab.byte_alignment import (
    chunk_start_alignment,
    chunks,
    encode_with_offsets,
)
from lmalgebra.distill.vocab.mined_map import mined_map
from lmalgebra.distill.vocab.position_targets import PositionTargets, vocabulary_surfaces
from lmalgebra.distill.vocab.prefix_map import prefix_map
from tiny import build_tokenizer_kinds, sentences

K = 12


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PreTrainedTokenizerFast]:
    paths = build_tokenizer_kinds(tmp_path_factory.mktemp("kinds"))
    return {kind: AutoTokenizer.from_pretrained(path) for kind, path in paths.items()}


def _record(teacher: PreTrainedTokenizerFast, text: str, with_actual: bool, seed: int):
    """The teacher's tokens of ``text`` and a made-up top-K per row: its own token (where
    ``with_actual``), tokens sharing the row's first byte, random ones; log-probabilities of a
    distribution with a tail, one entry impossible."""
    rng = np.random.default_rng(seed)
    tokens = encode_with_offsets(teacher, text)
    surfaces = vocabulary_surfaces(teacher, "t")
    data = text.encode()
    ids, values = [], []
    for token, (a, _) in zip(tokens.ids, tokens.offsets, strict=True):
        first = data[a : a + 1]
        alike = [i for i, s in enumerate(surfaces) if s and s[:1] == first and i != token]
        chosen = [int(token)] if with_actual else []
        chosen += list(rng.permutation(alike)[: K // 2 - len(chosen)])
        rest = [int(i) for i in rng.permutation(len(surfaces)) if i not in chosen]
        ids.append((chosen + rest)[:K])
        p = rng.dirichlet(np.ones(K + 1))[:K]
        logp = np.log(np.sort(p)[::-1])
        logp[-1] = -np.inf
        values.append(logp)
    return tokens, np.array(ids, dtype=np.int64), np.array(values, dtype=np.float32)


def _naive(data, t_tok, topk, logp, s_tok, starts, prefix, t_surf, s_surf):
    """Position by position, from the definition: a dict student id -> probability, or None."""
    out = []
    for s, (p, _) in enumerate(s_tok.offsets):
        if starts[s] >= 0:
            t = int(starts[s])
            target: dict[int, float] = {}
            for v, lp in zip(topk[t], logp[t], strict=True):
                target[int(prefix[v])] = target.get(int(prefix[v]), 0.0) + math.exp(lp)
            out.append(target)
            continue
        inside = [t for t, (a, b) in enumerate(t_tok.offsets) if a < p < b]
        if not inside:
            out.append(None)
            continue
        t = inside[0]
        a, b = (int(x) for x in t_tok.offsets[t])
        if t_surf[t_tok.ids[t]] != data[a:b]:
            out.append(None)
            continue
        read = data[a : int(p)]
        kept: dict[int, float] = {}
        for v, lp in zip(topk[t], logp[t], strict=True):
            surface = t_surf[v]
            if surface is None or not surface.startswith(read) or len(surface) <= len(read):
                continue
            if not math.isfinite(lp):
                continue
            rest = surface[len(read) :]
            found = [(len(u), -i) for i, u in enumerate(s_surf) if u and rest.startswith(u)]
            if found:
                best = -max(found)[1]
                kept[best] = kept.get(best, 0.0) + math.exp(lp)
        total = sum(kept.values())
        out.append({u: q / total for u, q in kept.items()} if kept else None)
    return out


@pytest.mark.parametrize("pair", [("sp", "bl"), ("bl", "sp"), ("wp", "bl"), ("sp", "wp")])
@pytest.mark.parametrize("with_actual", [True, False])
def test_each_position_target_equals_the_reference(kinds, pair, with_actual) -> None:
    teacher, student = kinds[pair[0]], kinds[pair[1]]
    text = " ".join(sentences(6, seed=11))
    data = text.encode()
    t_tok, topk, logp = _record(teacher, text, with_actual, seed=len(pair[0]) + with_actual)
    s_tok = encode_with_offsets(student, text)
    starts = chunk_start_alignment(chunks(t_tok.offsets, s_tok.offsets), len(s_tok.ids))
    prefix = prefix_map(teacher, student, mined_map(teacher, student).student_ids)
    t_surf, s_surf = vocabulary_surfaces(teacher, "t"), vocabulary_surfaces(student, "s")
    targets = PositionTargets(t_surf, s_surf, prefix)
    ids, values = targets.of_example(
        data, t_tok.ids, t_tok.offsets, topk, logp, s_tok.offsets, starts
    )
    expected = _naive(data, t_tok, topk, logp, s_tok, starts, prefix, t_surf, s_surf)
    inside = 0
    for s, want in enumerate(expected):
        if want is None:
            assert (ids[s] == -1).all() and np.isnan(values[s]).all()
            continue
        got: dict[int, float] = {}
        for u, lp in zip(ids[s], values[s], strict=True):
            got[int(u)] = got.get(int(u), 0.0) + math.exp(float(lp))
        assert got.keys() == want.keys()
        for u, q in want.items():
            assert got[u] == pytest.approx(q, rel=1e-5, abs=1e-7)
        inside += int(starts[s] < 0)
    if pair[0] != "bl":  # byte-level BPE cuts no coarser than the others: no position inside
        assert inside > 0


def test_a_target_at_every_position_whose_teacher_token_is_in_its_head(kinds) -> None:
    """With the teacher's own token in each row's top-k, every student position inside a teacher
    token that spells its bytes has a target: many more positions than the chunk starts."""
    teacher, student = kinds["sp"], kinds["bl"]
    text = " ".join(sentences(6, seed=12))
    t_tok, topk, logp = _record(teacher, text, True, seed=5)
    s_tok = encode_with_offsets(student, text)
    starts = chunk_start_alignment(chunks(t_tok.offsets, s_tok.offsets), len(s_tok.ids))
    prefix = prefix_map(teacher, student, mined_map(teacher, student).student_ids)
    t_surf = vocabulary_surfaces(teacher, "t")
    targets = PositionTargets(t_surf, vocabulary_surfaces(student, "s"), prefix)
    ids, _ = targets.of_example(
        text.encode(), t_tok.ids, t_tok.offsets, topk, logp, s_tok.offsets, starts
    )
    data = text.encode()
    pairs = enumerate(zip(t_tok.ids, t_tok.offsets, strict=True))
    spelt = {t for t, (i, (a, b)) in pairs if t_surf[i] == data[a:b]}
    for s, (p, _) in enumerate(s_tok.offsets):
        inside = [t for t, (a, b) in enumerate(t_tok.offsets) if a < p < b]
        if starts[s] >= 0 or (inside and inside[0] in spelt):
            assert ids[s, 0] >= 0, s
    assert (ids[:, 0] >= 0).mean() > 0.9 > (starts >= 0).mean()
