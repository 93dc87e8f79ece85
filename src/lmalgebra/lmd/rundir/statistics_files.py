"""A run's statistics files (``stats/SPLIT.safetensors``), written while the analysis runs.

Each split's covariance is final once the statistics pass ends, and the analysis only reads it
(every solve works on copies). Writing the three ``D x D`` files (190 MiB each at D = 4,992, each
fsynced) is mostly a wait on the disk, so a thread writes them during the fits instead of after:
the whole command is that much shorter, and what is written is the same. ``wait`` re-raises what
the thread met (a full disk names its file); ``discard`` takes the files back after a failed run.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from lmalgebra.lmd.rundir.schema import STATS_DIR
from lmalgebra.stats.moments import ModelColumns, save_moments
from lmalgebra.stats.solver import SplitMoments


def write_statistics(
    out: Path, blocks: list[ModelColumns], stats: Mapping[str, SplitMoments]
) -> list[Path]:
    """Each split around its mean: ``n``, ``shift = mean``, ``sums = 0``, ``gram = n cov``."""
    written = []
    for split, moments in stats.items():
        path = out / STATS_DIR / f"{split}.safetensors"
        centred = np.zeros_like(moments.mean)
        save_moments(path, blocks, moments.n, moments.mean, centred, moments.cov, moments.n)
        written.append(path)
    return written


class StatisticsWriter:
    """:func:`write_statistics` in a thread, started at once."""

    def __init__(
        self, out: Path, blocks: list[ModelColumns], stats: Mapping[str, SplitMoments]
    ) -> None:
        self.out = out
        self.paths = [out / STATS_DIR / f"{split}.safetensors" for split in stats]
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._write, args=(blocks, dict(stats)), name="lmalgebra-statistics"
        )
        self._thread.start()

    def _write(self, blocks: list[ModelColumns], stats: dict[str, SplitMoments]) -> None:
        try:
            write_statistics(self.out, blocks, stats)
        except BaseException as err:  # handed to the caller by wait()
            self._error = err

    def join(self) -> None:
        """Block until the thread has ended (what it met is left to ``wait``)."""
        self._thread.join()

    def wait(self) -> None:
        """Block until the files are written; raise what writing them raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def discard(self) -> None:
        """After a failed run: wait for the thread, then remove what it wrote (and ``stats/``
        when that leaves it empty), whatever the thread met."""
        self._thread.join()
        for path in self.paths:
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: something else is in it
            (self.out / STATS_DIR).rmdir()
