"""One guard over every `primal` subcommand: bad input gives one line on stderr, a non-zero exit, no
traceback, and leaves what was there before untouched."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from primal_attention.cli import main
from primal_attention.train.load import load_config
from primal_attention.train.trainer import run_seeds

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "uea" / "JapaneseVowels_primal+.yaml"
TINY = ["data.max_examples=40", "model.dim=16", "model.num_heads=2", "model.ffn_dim=32", "train.epochs=1",
        "train.progress=false", "model.attention_options.primal.rank=4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("guard") / "run"
    run_seeds(load_config(CONFIG, TINY), out, [0])
    return out


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def cases(run: Path, tmp: Path) -> list[tuple[list[str], str]]:
    sets = [a for s in TINY for a in ("--set", s)]
    bad_json = tmp / "bad.json"
    bad_json.write_text("{not json")
    cases_dir = tmp / "reference"
    cases_dir.mkdir()
    (cases_dir / "case.npz").write_bytes(b"not an npz")
    seed = run / "seed_0"
    listops = tmp / "listops"
    listops.mkdir()
    for split in ("train", "val", "test"):
        (listops / f"basic_{split}.tsv").write_bytes(b"Source\tTarget\n\xff\xfe bad\t1\n")
    lra = ROOT / "configs" / "lra" / "listops_primal+_cpu.yaml"
    return [
        (["selfcheck", "--heads", "3", "--dim", "16"], "must divide"),
        (["selfcheck", "--json", "/proc/no-such-dir/x.json"], "not a writable directory"),
        (["train", str(CONFIG), *sets, "--set", "train.epochs=0", "--out", str(tmp / "t")], "must be positive"),
        (["train", str(CONFIG), *sets, "--set", "optim.clip_norm=-1", "--out", str(tmp / "t")], "clip_norm"),
        (["train", str(CONFIG), *sets, "--set", "name=../../x"], "plain folder name"),
        (["train", str(CONFIG), *sets, "--set", "data.options.bogus=1", "--out", str(tmp / "t")], "bogus"),
        (["train", str(CONFIG), *sets, "--out", str(run)], "already holds a run"),
        (["train", str(CONFIG), *sets, "--seeds", "0,0", "--out", str(tmp / "t")], "repeats a seed"),
        (["train", str(tmp / "missing.yaml")], "not found"),
        (["train", str(lra), "--set", f"data.data_dir={listops}", "--out", str(tmp / "t")], "shape the generated ListOps"),
        (["train", str(lra), "--set", f"data.data_dir={listops}", "--set", "data.options={}", "--out", str(tmp / "t")],
         "is not UTF-8 text"),
        (["sweep", str(CONFIG), "--grid", "optim.lr=1e-3", "--out", str(tmp / "s"), "--seeds", "0"], "sweep seed"),
        (["sweep", str(CONFIG), "--grid", "train.seed=0,1", "--out", str(tmp / "s")], "cannot be swept"),
        (["baselines", str(CONFIG), "--seeds", "-1"], "--seeds"),
        (["data", "collect-rl", "ant"], "unknown environment"),
        (["data", "fetch", "no-such-dataset"], "no-such-dataset"),
        (["eval", str(tmp / "no-run")], "no-run"),
        (["generate", str(seed), "--prompt", "x"], "not a language model"),
        (["spectrum", str(seed), "--out", "/proc/no-such-dir"], "error"),
        (["convert", str(seed), "--out", str(seed), "--overwrite"], "is the run being converted"),
        (["convert", str(seed), "--out", str(run), "--overwrite"], "not a conversion"),
        (["bench", "--batch", "0"], "positive integer"),
        (["bench", "--from-json", str(bad_json)], "JSONDecodeError"),
        (["selfcheck", "--reference-dir", str(cases_dir), "--seq-len", "64", "--repeats", "1"], "case.npz"),
    ]


def test_every_subcommand_refuses_bad_input_in_one_line(run, tmp_path, capsys) -> None:
    before = fingerprint(run)
    seen = set()
    for argv, expected in cases(run, tmp_path):
        seen.add(argv[0])
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own errors: usage line + one error line
            code = exit_.code
        err = capsys.readouterr().err
        assert code not in (0, None), argv
        assert "Traceback" not in err, (argv, err)
        lines = [line for line in err.strip().splitlines() if not line.startswith("usage:") and not line.startswith(" ")]
        assert len(lines) == 1, (argv, err)
        assert expected in lines[0], (argv, lines[0])
    import primal_attention.cli as cli

    commands = set(cli.build_parser()._subparsers._group_actions[0].choices)
    assert commands <= seen, f"subcommands without a bad-input case: {sorted(commands - seen)}"
    assert fingerprint(run) == before  # the run someone had is exactly as it was
