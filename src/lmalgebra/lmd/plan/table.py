"""A run's plan made from its configuration and its models' sizes (read without loading any
weights), checked before any embedding, and laid out as rows (``decompose --dry-run``,
``lmalgebra.api.decompose.decompose_plan``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.core.memory import available_bytes
from lmalgebra.core.precision import launch_count
from lmalgebra.lmd.plan.estimate import GIB, OVERHEAD, Plan, Speeds, check_plan, plan_run
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.sources.kinds import bound_sources
from lmalgebra.sources.model_files import ModelShape
from lmalgebra.sources.model_source import ModelSource
from lmalgebra.stats.nulls import random_copy

log = logging.getLogger(__name__)

# the studies as a refusal reached from the command line and from Python names them
STUDY_LAYERS = 'study={"layers": True}'
STUDY_NULLS = 'study={"nulls": True}'


def memory_for(config: DecomposeConfig) -> float:
    """Bytes the run may use: ``scale.memory_gib``, else what is available now, shared by the
    processes a launcher started on this machine (``LOCAL_WORLD_SIZE``)."""
    if config.scale.memory_gib is not None:
        return config.scale.memory_gib * GIB
    local = max(1, launch_count("LOCAL_WORLD_SIZE", 1))
    return available_bytes() / local


def model_shapes(
    config: DecomposeConfig, given: Mapping[str, ModelSource] | None = None, dry: bool = False
) -> list[ModelShape]:
    """Every model's sizes, read without loading any weights (and those of the random-initialised
    copies a ``nulls`` study adds), each model's architecture checked (remembered in the cache's
    ``hashes/``, which a ``dry`` run only reads) and, by a ``dry`` run, its tokenizer loaded
    as the run would load it (the run loads it where it cuts or embeds spans)."""
    bytes_per_weight = 2 if config.weights_dtype == "bfloat16" else 4
    memo = config.cache_dir / "hashes"
    sources = list(bound_sources(config.models, given or {}).values())
    refuse_idle_studies(config, sources)
    shapes = []
    for source in sources:  # refused here, by the dry run too, before any embedding
        source.check_architecture(memo_dir=memo, remember=not dry)
        source.check_planned_layer(config.layer)
        shapes.append(source.shape(bytes_per_weight))
        if dry:  # the run loads it when it cuts or embeds spans (a cached run: never)
            source.check_planned_tokenizer()
    if config.study.nulls:
        pairs = zip(shapes, sources, strict=True)
        shapes += [
            replace(shape, name=random_copy(shape.name)) for shape, s in pairs if s.pretrained
        ]
    return shapes


def refuse_idle_studies(config: DecomposeConfig, sources: list[ModelSource]) -> None:
    """Refuse, before any embedding (by the dry run too), a study that these models leave with
    nothing to do: a layer map of a model given as its span embeddings (no layers), a layer
    sweep where every model is one, random-initialised copies where fewer than two models named
    by reference have trained weights to replace (``random:``, ONNX, vectors, Python objects)."""
    study = config.study
    by_name = {s.name: s for s in sources}
    for name in study.layer_map or []:
        if by_name[name].fixed_spans:
            given = either(f"--study.layer_map {name}", f"study={{'layer_map': [..., {name!r}]}}")
            raise UserInputError(f"{given}: {_no_layers(by_name[name])}")
    if study.layers and all(s.fixed_spans for s in sources):
        raise UserInputError(
            f"{either('--study.layers', STUDY_LAYERS)} sweeps the models' hidden layers, and "
            f"every model here is given as its span embeddings ({_no_layers(sources[0])}); "
            "leave it out"
        )
    copied = [s.name for s in sources if s.pretrained]
    if study.nulls and len(copied) < 2:  # each is fitted on the others' copies
        which = f"only {copied[0]!r} is one" if copied else "no model here is one"
        raise UserInputError(
            f"{either('--study.nulls', STUDY_NULLS)} would add nothing: it fits each model "
            "named by reference that has "
            "trained weights on the random-initialised copies of the others, and "
            f"{which} (random:, ONNX graphs, embeddings given as they are and models given as "
            "Python objects have no copy); leave it out"
        )


def _no_layers(source: ModelSource) -> str:
    """Why ``source`` has no layers, as its ``depth`` says it."""
    try:
        source.depth()
    except UserInputError as err:
        return str(err)
    return f"model {source.name!r} has no layers"


def plan_for(
    config: DecomposeConfig, given: Mapping[str, ModelSource] | None = None, dry: bool = False
) -> tuple[Plan, list[ModelShape]]:
    """The plan of ``config`` on this machine, and the models' shapes it was made from
    (``dry``: for a dry run, which writes nothing to the cache)."""
    shapes = model_shapes(config, given, dry)
    return plan_run(config, shapes, memory_for(config)), shapes


def checked_plan(
    config: DecomposeConfig, given: Mapping[str, ModelSource] | None = None
) -> Plan | None:
    """The run's plan, refused (``UserInputError``, one line) when its method does not fit;
    None when a model's width cannot be read without loading it (the run goes ahead)."""
    plan, shapes = plan_for(config, given)
    unknown = [s.name for s in shapes if s.width <= 0]
    if unknown:
        log.info("no memory plan: the width of %s is not in its configuration", unknown[0])
        return None
    check_plan(plan, config.scale.probes)
    return plan


def plan_rows(plan: Plan, shapes: list[ModelShape], speeds: Speeds | None) -> list[dict[str, Any]]:
    """One row per phase, then one ``total`` row per method: ``method``, ``precision``,
    ``components``, ``phase``, ``model`` (the embedding rows), ``peak_gib`` (with the
    interpreter's overhead), ``seconds`` (NaN without ``speeds``; a total counts the method's
    phases, not the embedding), ``disk_gib`` (embedding cache per model; spilled statistics),
    ``fits`` and ``chosen`` (total rows)."""
    rows = []
    for phase in plan.phases:
        rows.append(
            {
                "method": phase.method,
                "precision": phase.precision,
                "components": phase.components,
                "phase": phase.phase,
                "model": phase.model,
                "peak_gib": (OVERHEAD + phase.peak) / GIB,
                "seconds": phase.seconds(speeds),
                "disk_gib": phase.disk / GIB,
                "fits": None,
                "chosen": None,
            }
        )
    for method in plan.methods():
        own = [p for p in plan.phases if (p.method, p.precision, p.components) == method]
        spilled = method[0] == "exact" and plan.spilled.get(method[1], False)
        rows.append(
            {
                "method": method[0],
                "precision": method[1],
                "components": method[2],
                "phase": "total" + (" (covariances spilled to disk)" if spilled else ""),
                "model": "",
                "peak_gib": plan.peak(method) / GIB,
                "seconds": sum(p.seconds(speeds) for p in own),
                "disk_gib": max(p.disk for p in own) / GIB,
                "fits": plan.fits(method),
                "chosen": method == plan.chosen,
            }
        )
    return rows


def model_rows(plan: Plan, shapes: list[ModelShape]) -> list[dict[str, Any]]:
    """Per model: ``model``, ``kind``, ``width``, ``parameters`` (layer weights), and
    ``cache_gib``, the embedding cache its spans fill (float32; 0 for vectors given as files
    or arrays, read as they are, and for models given as Python objects, never cached)."""
    rows = plan.layout.rows
    return [
        {
            "model": s.name,
            "kind": s.kind,
            "width": s.width,
            "parameters": s.parameters,
            "cache_gib": 4.0 * rows * s.width / GIB if s.cached else 0.0,
        }
        for s in shapes
    ]
