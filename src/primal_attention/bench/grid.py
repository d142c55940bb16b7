"""The benchmark grid: which levels, lengths, dtypes, modes and methods, and the budgets.

Presets:

* :data:`QUICK` — ``primal bench --quick``: the training step (the level of the targets), fp32 eager,
  N 256–4096, primal, its reference path, SDPA and N×N softmax and linear attention, 3 repeats;
  under 3 minutes on a 2-core CPU (the grid stops itself, marked, at 140 s).
* :data:`FULL` — ``primal bench``: layer, training step and inference, N 256–65 536, fp32 and
  bf16, eager and torch.compile (compile for primal and SDPA softmax only), 5 repeats. Methods
  stop gracefully at the time or memory budget and are marked.
* :data:`GPU` — ``scripts/gpu_bench.sh``: the FULL levels on one CUDA device, sized to finish in
  under 5 minutes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from primal_attention.bench.methods import METHODS

ALL_METHODS = tuple(METHODS)
POW2_256_TO_64K = tuple(256 * 2**k for k in range(9))  # 256 … 65 536


@dataclass(frozen=True)
class GridConfig:
    """Everything that defines one benchmark run."""

    levels: tuple[str, ...] = ("layer", "train", "infer")
    seq_lens: tuple[int, ...] = POW2_256_TO_64K
    batch: int = 8
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    modes: tuple[str, ...] = ("eager", "compile")
    methods: tuple[str, ...] = ALL_METHODS
    compile_methods: tuple[str, ...] = ("primal", "softmax")
    device: str = "cpu"
    warmup: int = 1
    repeats: int = 5
    time_budget_s: float = 20.0  # per call; a method stops at the first N whose call (or forecast) exceeds it
    memory_budget_gb: float | None = None  # per call; None: half the memory available at start
    measure_memory: bool = True
    threads: int | None = None
    max_total_s: float | None = None  # stop the grid (gracefully, marked) after this long
    #: lengths at which a method stopped by the time budget still gets one isolated peak-memory
    #: measurement (one call, no op counting), so the memory targets at N 4096 can be evaluated.
    memory_only_lengths: tuple[int, ...] = (4096,)
    memory_only_timeout_s: float = 150.0
    #: CPU: keep freed memory mapped in the timing process (primal_attention.allocator), for every
    #: method alike; the isolated memory measurements run in their own processes and are unaffected.
    retain_freed_memory: bool = True
    #: lengths at which the isolated memory call also counts FLOPs and bytes (None: every length).
    count_ops_lengths: tuple[int, ...] | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def methods_for(self, mode: str) -> tuple[str, ...]:
        if mode == "compile":
            return tuple(m for m in self.methods if m in self.compile_methods)
        return self.methods


FULL = GridConfig()
QUICK = GridConfig(
    levels=("train",),
    seq_lens=(256, 512, 1024, 2048, 4096),
    dtypes=("fp32",),
    modes=("eager",),
    methods=("primal", "primal_reference", "softmax", "softmax_materialized", "linear"),
    repeats=3,
    time_budget_s=6.0,
    max_total_s=140.0,
    count_ops_lengths=(4096,),
)
GPU = GridConfig(
    device="cuda",
    seq_lens=(256, 1024, 4096, 16384, 65536),
    dtypes=("fp32", "bf16"),
    modes=("eager",),
    repeats=5,
    time_budget_s=2.0,
    max_total_s=270.0,
)
PRESETS = {"full": FULL, "quick": QUICK, "gpu": GPU}


def with_overrides(base: GridConfig, **overrides: object) -> GridConfig:
    """``base`` with the non-None overrides applied."""
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
