"""Write configs/uea/*.yaml: the ten datasets of the paper's Table 1 × {Transformer, PrimalFormer,
Primal.+Trans.} with the authors' settings (docs/method.md §5), plus the real stand-ins we can run here.

Run from the repository root: ``.venv/bin/python scripts/make_uea_configs.py``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

# dataset: (PrimalFormer s, η, m), (Primal.+Trans. s, η, m)
SETTINGS = {
    "EthanolConcentration": ((30, 0.1, 10), (40, 0.2, 10)),
    "FaceDetection": ((20, 0.1, 5), (40, 0.2, 5)),
    "Handwriting": ((30, 0.2, 5), (20, 0.5, 5)),
    "Heartbeat": ((30, 0.5, 10), (40, 0.5, 10)),
    "JapaneseVowels": ((40, 0.5, 5), (30, 0.2, 5)),
    "PEMS-SF": ((40, 0.1, 5), (40, 0.0, 5)),
    "SelfRegulationSCP1": ((30, 0.5, 10), (30, 0.2, 10)),
    "SelfRegulationSCP2": ((20, 0.0, 10), (20, 0.2, 10)),
    "SpokenArabicDigits": ((20, 0.1, 5), (30, 0.2, 5)),
    "UWaveGestureLibrary": ((20, 0.0, 10), (40, 0.1, 10)),
}
# Real data available on this machine, run with the settings of the paper dataset they stand in for.
STAND_INS = {
    "BasicMotions": ("uea", "BasicMotions", "JapaneseVowels"),
    "FSDD": ("fsdd", "FSDD", "SpokenArabicDigits"),
}


def experiment(name: str, family: str, dataset: str, kind: str, rank: int | None, eta: float, multi: int | None,
               epochs: int, optimizer: str, note: str) -> dict:
    model = {
        "kind": kind, "layers": 2, "dim": 512, "num_heads": 8, "ffn_dim": 2048, "dropout": 0.1,
        "norm_first": False, "positional": "learned", "pooling": "flatten",
        # the authors scale the projected input by sqrt(D) and drop softmax probabilities at 0.1
        "input_scale": True,
        "attention_options": {"softmax": {"dropout": 0.1},
                              **({"primal": {"rank": rank, "rank_multi": multi}} if rank else {})},
    }
    return {
        "name": name,
        "data": {"family": family, "name": dataset},
        "model": model,
        "optim": {"name": optimizer, "lr": 1.0e-3, "schedule": "constant", "clip_norm": 4.0},
        "train": {"epochs": epochs, "batch_size": 16, "eta": eta, "ksvd_reduction": "sample", "protocol": "authors"},
        "_note": note,
    }


def main() -> None:
    out = Path("configs/uea")
    out.mkdir(parents=True, exist_ok=True)
    rows = [(d, "uea", d, d) for d in SETTINGS] + [(k, fam, name, paper) for k, (fam, name, paper) in STAND_INS.items()]
    for label, family, dataset, paper in rows:
        pf, pt = SETTINGS[paper]
        epochs = 400 if paper == "PEMS-SF" else 100
        stand_in = "" if label == paper else f"; stand-in run with the settings of {paper}"
        for kind, tag, (s, eta, m), optimizer in (
            ("transformer", "transformer", (None, 0.0, None), "radam"),
            ("primalformer", "primalformer", pf, "adam" if paper == "SpokenArabicDigits" else "radam"),
            ("primal+", "primal+", pt, "radam"),
        ):
            note = f"Paper Table 1, {kind} on {label}, authors' settings (docs/method.md §5){stand_in}."
            cfg = experiment(f"{label}_{tag}", family, dataset, kind, s, eta, m, epochs, optimizer, note)
            text = f"# {cfg.pop('_note')}\n" + yaml.safe_dump(cfg, sort_keys=False)
            (out / f"{label}_{tag}.yaml").write_text(text)


if __name__ == "__main__":
    main()
