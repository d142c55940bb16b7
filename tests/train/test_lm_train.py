"""The lm family end to end through the CLI on a tiny folder of text files: primal train / eval / generate,
the LM metrics, the saved tokenizer, and one-line errors for bad LM configs."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_trainer import cli

from primal_attention.data.lm import BPETokenizer, LMData
from primal_attention.train.families import get_family
from primal_attention.train.tasks import LANGUAGE_MODEL

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "lm" / "corpora_primal+.yaml"
WORDS = "the and of to in that shall unto lord thou thy king love night death heaven earth sea fire".split()


def _text(seed: int, lines: int) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))).capitalize() + "."
                     for _ in range(lines))


@pytest.fixture
def text_dir(tmp_path) -> Path:
    folder = tmp_path / "text"
    folder.mkdir()
    for name, seed, lines in (("train.txt", 0, 600), ("valid.txt", 1, 60), ("test.txt", 2, 60)):
        (folder / name).write_text(_text(seed, lines))
    return folder


def tiny(text_dir: Path, *extra: str) -> list[str]:
    out = []
    for s in ["data.name=text_files", f"data.data_dir={text_dir}", "data.seq_len=16", "data.options.vocab_size=300",
              "model.layers=2", "model.dim=32", "model.num_heads=2", "model.ffn_dim=64", "model.dropout=0",
              "model.attention_options.primal.rank=4", "train.steps=40", "train.eval_every=20",
              "train.batch_size=8", "optim.warmup_steps=5", "optim.lr=0.003", "train.progress=false", *extra]:
        out += ["--set", s]
    return out


@pytest.fixture
def env(tmp_path) -> dict:
    return {"PRIMAL_ATTENTION_CACHE": str(tmp_path / "cache")}


def test_train_eval_generate_on_text_files(tmp_path, text_dir, env) -> None:
    out = tmp_path / "run"
    proc = cli("train", str(CONFIG), "--out", str(out), *tiny(text_dir), env=env)
    assert proc.returncode == 0, proc.stderr
    run = out / "seed_0"
    m = json.loads((run / "metrics.json").read_text())
    assert m["protocol"] == "holdout"
    assert math.isclose(m["test_ppl"], math.exp(m["test_loss"]), rel_tol=1e-9)
    assert m["test_ppl"] < 300  # the uniform model's perplexity is the vocabulary size
    assert m["best_val_loss"] <= m["final_val_loss"] and m["best_test_ppl"] <= m["test_ppl"] + 1e-9
    assert 0 < m["test_bpb"] < 8
    assert set(m["ksvd_j_final"]) == {"decoder.blocks.1.attn"}  # primal+: only the last block
    assert BPETokenizer.load(run / "tokenizer.json").vocab_size == 300

    ev = cli("eval", str(out), env=env)
    assert ev.returncode == 0, ev.stderr
    test = json.loads(ev.stdout)["seed_0"]["test"]
    assert math.isclose(test["ppl"], m["test_ppl"], rel_tol=1e-6)

    gen = ["generate", str(run), "--prompt", "The king", "--max-new-tokens", "12"]
    a = cli(*gen, "--temperature", "0.8", "--top-k", "20", "--seed", "3", env=env)
    b = cli(*gen, "--temperature", "0.8", "--top-k", "20", "--seed", "3", env=env)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.startswith("The king") and len(a.stdout) > len("The king")
    greedy = cli(*gen, "--temperature", "0", "--num-samples", "2", env=env)
    assert greedy.returncode == 0, greedy.stderr
    parts = greedy.stdout.split("=== sample 1 ===\n")
    assert len(parts) == 2 and parts[0] == "=== sample 0 ===\n" + parts[1]  # greedy samples agree
    for flag, value in (("--top-k", "0"), ("--temperature", "nan"), ("--temperature", "-1")):
        bad = cli(*gen, flag, value, env=env)
        assert bad.returncode == 2 and flag in bad.stderr and "Traceback" not in bad.stderr

    over = cli(*gen[:4], "--max-new-tokens", "40", env=env)  # 16 positions of context
    assert over.returncode == 2 and "Traceback" not in over.stderr and "exceeds the model's context" in over.stderr
    missing = cli("generate", str(tmp_path / "nope"), "--prompt", "x", env=env)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


@pytest.mark.parametrize(("extra", "message"), [
    (["data.seq_len=null"], "must be a positive integer for data.family lm"),
    (["data.options.vocab_size=100"], "vocab_size"),
    (["data.options.colour=1"], "unknown for data.family lm"),
    (["data.name=wikipedia"], "LM dataset must be one of"),
    (["data.data_dir=null"], "needs data.data_dir"),
    (["data.max_examples=10"], "max_examples does not apply"),
    (["train.ksvd_weighting=twice"], "ksvd_weighting"),
])
def test_bad_lm_configs_are_one_line_errors(tmp_path, text_dir, env, extra, message) -> None:
    proc = cli("train", str(CONFIG), "--out", str(tmp_path / "x"), *tiny(text_dir, *extra), env=env)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_missing_text_files_are_named(tmp_path, text_dir, env) -> None:
    (text_dir / "valid.txt").unlink()
    proc = cli("train", str(CONFIG), "--out", str(tmp_path / "x"), *tiny(text_dir), env=env)
    assert proc.returncode == 2 and "no val text in" in proc.stderr and "valid.txt" in proc.stderr
    assert "Traceback" not in proc.stderr


class _Uniform(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return torch.zeros(*x.shape, self.vocab) + self.w


def test_evaluate_a_uniform_model_gives_log_vocab_and_bits_from_the_bytes(text_dir, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))
    tok = BPETokenizer.train([(text_dir / "train.txt").read_text()], 300)
    data = LMData.from_texts([(text_dir / "valid.txt").read_text()], tok, 16)
    assert get_family("lm").task is LANGUAGE_MODEL
    got = LANGUAGE_MODEL.evaluate(_Uniform(tok.vocab_size), data, 7, torch.device("cpu"))
    targets = len(data) * 16
    assert math.isclose(got["loss"], math.log(tok.vocab_size), rel_tol=1e-6)
    assert math.isclose(got["ppl"], tok.vocab_size, rel_tol=1e-5)
    expected_bpb = targets * math.log(tok.vocab_size) / (math.log(2) * data.target_bytes())
    assert math.isclose(got["bpb"], expected_bpb, rel_tol=1e-6)


def test_summed_weighting_divides_eta_by_the_target_tokens(tmp_path, text_dir, env) -> None:
    """One step with η·T under "summed" (T = 8 × 16 target tokens) moves the weights exactly as η under "mean"."""
    losses = {}
    for weighting, eta in (("summed", 0.5 * 128), ("mean", 0.5)):
        out = tmp_path / weighting
        proc = cli("train", str(CONFIG), "--out", str(out), *tiny(text_dir, "train.steps=3", "train.eval_every=3",
                   f"train.eta={eta}", f"train.ksvd_weighting={weighting}", "optim.warmup_steps=0"),
                   env=env)
        assert proc.returncode == 0, proc.stderr
        losses[weighting] = json.loads((out / "seed_0" / "metrics.json").read_text())["test_loss"]
    assert losses["summed"] == losses["mean"]


def test_data_fetch_lm_reports_sizes_and_held_out_works(tmp_path, env) -> None:
    """`primal data fetch lm` on corpora already in the cache (a tiny stand-in written there)."""
    folder = Path(env["PRIMAL_ATTENTION_CACHE"]) / "lm"
    folder.mkdir(parents=True)
    corpora = {"plays": {f"play{i:02d}": _text(i, 40 + 7 * i) for i in range(40)}}
    (folder / "corpora-v1.json").write_text(json.dumps({"version": 1, "corpora": corpora}))
    proc = cli("data", "fetch", "lm", "--vocab-size", "300", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    sizes = {line.split()[0]: int(line.split()[-4]) for line in lines if "tokens (BPE 300)" in line}
    assert set(sizes) == {"train", "val", "test"} and sizes["train"] > sizes["val"] > 0 and sizes["test"] > 0
    held = [line for line in lines if line.strip().startswith("plays ")]
    assert len(held) == 2 and all("play" in line.split(":")[1] for line in held)


@pytest.mark.parametrize("model", ["transformer", "primal+"])
def test_the_wikitext103_configs_train_on_a_folder_of_wiki_files(tmp_path, text_dir, env, model) -> None:
    for split, name in (("train", "wiki.train.tokens"), ("valid", "wiki.valid.tokens"), ("test", "wiki.test.tokens")):
        (text_dir / f"{split}.txt").rename(text_dir / name)
    config = CONFIG.parent / f"wikitext103_{model}.yaml"
    small = ["--set", f"data.data_dir={text_dir}"]
    for s in ("data.seq_len=16", "data.options.vocab_size=300", "model.layers=2", "model.dim=32", "model.ffn_dim=64",
              "model.attention_options.primal.rank=4", "train.steps=4", "train.eval_every=2", "train.batch_size=4",
              "optim.warmup_steps=2", "train.progress=false"):
        small += ["--set", s]
    proc = cli("train", str(config), "--out", str(tmp_path / "w"), *small, env=env)
    assert proc.returncode == 0, proc.stderr
    m = json.loads((tmp_path / "w" / "seed_0" / "metrics.json").read_text())
    assert math.isfinite(m["test_ppl"]) and bool(m["ksvd_j_final"]) == (model == "primal+")
    missing = cli("train", str(config), "--out", str(tmp_path / "x"), env=env)
    assert missing.returncode == 2 and "needs data.data_dir" in missing.stderr


def test_an_empty_split_file_is_named_with_its_split(tmp_path, text_dir, monkeypatch) -> None:
    from primal_attention.data.base import DataError
    from primal_attention.data.lm import load_lm_files

    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))
    (text_dir / "valid.txt").write_text("\n")
    with pytest.raises(DataError) as caught:
        load_lm_files(text_dir, "val", vocab_size=300, block_len=16, progress=False)
    assert "valid.txt: the val text is empty" in str(caught.value)
    (text_dir / "valid.txt").write_text("The king.")  # a few tokens: too short for one block of 16
    with pytest.raises(DataError) as caught:
        load_lm_files(text_dir, "val", vocab_size=300, block_len=16, progress=False)
    assert "LMData val (" in str(caught.value) and "valid.txt): " in str(caught.value)


def test_generate_input_errors_are_one_line(tmp_path, text_dir, monkeypatch, capsys) -> None:
    from primal_attention.cli import main
    from primal_attention.train.load import load_config
    from primal_attention.train.trainer import run_seeds

    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))
    sets = [a for a in tiny(text_dir, "train.steps=2", "train.eval_every=2") if a != "--set"]
    run_seeds(load_config(CONFIG, sets), tmp_path / "out", [0])
    run = tmp_path / "out" / "seed_0"

    def generate(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(["generate", *argv])
        except SystemExit as stop:  # argparse
            code = stop.code
        out, err = capsys.readouterr()
        return code, out, err

    code, _, err = generate(str(tmp_path / "out"))
    assert code == 2 and "is the --out folder of primal train; generate from one of its seed folders (seed_0)" in err
    code, _, err = generate(str(run), "--prompt", "The k\udcffing")  # how Python passes a byte that is not UTF-8
    assert code == 2 and "--prompt must be UTF-8 text; it holds a byte that is not UTF-8 at character 5" in err
    code, _, err = generate(str(run), "--seed", str(2**64))
    assert code == 2 and "expected an integer in [0, 2**64), got 18446744073709551616" in err
    code, tiny_t, err = generate(str(run), "--prompt", "The king", "--max-new-tokens", "6", "--temperature", "1e-45")
    assert code == 0, err  # the logits divided by 1e-45 no longer overflow to NaN: greedy in the limit
    assert tiny_t == generate(str(run), "--prompt", "The king", "--max-new-tokens", "6", "--temperature", "0")[1]


@pytest.mark.parametrize("architecture,config", [("gpt2", []), ("llama", ["model.hf.config.rms_norm_eps=1e-6"])])
def test_an_hf_architecture_trains_resumes_evaluates_and_generates(tmp_path, text_dir, env, architecture, config) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "run"
    hf = ["model.kind=primalformer", f"model.hf.architecture={architecture}", *config]
    proc = cli("train", str(CONFIG), "--out", str(out), *tiny(text_dir, "train.steps=20", "train.eval_every=10", *hf),
               env=env)
    assert proc.returncode == 0, proc.stderr
    run = out / "seed_0"
    m = json.loads((run / "metrics.json").read_text())
    assert m["test_ppl"] < 300 and m["steps"] == 20
    assert set(m["ksvd_j_final"]) == {f"model.{p}.{i}.{a}.primal" for i in (0, 1)
                                      for p, a in [{"gpt2": ("transformer.h", "attn"),
                                                    "llama": ("model.layers", "self_attn")}[architecture]]}
    # resume: more steps continue from the last checkpoint
    more = cli("train", str(CONFIG), "--out", str(out), "--resume",
               *tiny(text_dir, "train.steps=30", "train.eval_every=10", *hf), env=env)
    assert more.returncode == 0, more.stderr
    assert json.loads((run / "metrics.json").read_text())["steps"] == 30
    ev = cli("eval", str(out), env=env)
    assert ev.returncode == 0, ev.stderr
    gen = cli("generate", str(run), "--prompt", "The king", "--max-new-tokens", "6", "--temperature", "0", env=env)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("The king") and len(gen.stdout) > len("The king")


def test_hf_model_configs_are_one_line_errors(tmp_path, text_dir, env) -> None:
    pytest.importorskip("transformers")
    for sets, message in ((["model.hf.architecture=bert"], "model.hf.architecture must be one of gpt2, llama, qwen2"),
                          (["model.hf.architecture=gpt2", "model.hf.config.n_layer=3"], "come from model.layers"),
                          (["model.hf.architecture=gpt2", "model.hf.config.resid_pdrp=0"],
                           "model.hf.config: resid_pdrp is not a field of GPT2Config"),
                          (["model.hf.architecture=gpt2", "model.attention=[primal,softmax]"],
                           "a per-layer model.attention list does not apply")):
        proc = cli("train", str(CONFIG), "--out", str(tmp_path / "bad"), *tiny(text_dir, *sets), env=env)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_an_hf_architecture_trains_under_ddp(tmp_path, text_dir, env) -> None:
    """torchrun with 2 gloo processes trains the HF model with its KSVD term (Λ moves) and writes one run."""
    pytest.importorskip("transformers")
    args = tiny(text_dir, "train.steps=6", "train.eval_every=3", "model.kind=primal+", "model.hf.architecture=gpt2",
                "train.eta=0.2", "train.ksvd_reduction=sample")
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "primal_attention.cli", "train", str(CONFIG), "--out", str(tmp_path / "two"), *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env, "OMP_NUM_THREADS": "1"})
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    run = tmp_path / "two" / "seed_0"
    m = json.loads((run / "metrics.json").read_text())
    assert set(m["ksvd_j_final"]) == {"model.transformer.h.1.attn.primal"} and m["steps"] == 6
    ckpts = sorted((run / "checkpoints").glob("ckpt-*"))
    assert len(ckpts) >= 2, ckpts
    name = "model.transformer.h.1.attn.primal.lam"
    assert not torch.equal(load_file(str(ckpts[0] / "model.safetensors"))[name],
                           load_file(str(ckpts[-1] / "model.safetensors"))[name])  # Λ trains: only KSVD moves it


def test_ddp_without_the_ksvd_term_trains(tmp_path, text_dir, env) -> None:
    """η = 0: Λ (only in the KSVD term) gets no gradient, which DDP is told of instead of failing at step 2."""
    args = tiny(text_dir, "train.steps=3", "train.eval_every=3", "model.kind=primal+", "train.eta=0")
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "primal_attention.cli", "train", str(CONFIG), "--out", str(tmp_path / "two"), *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env, "OMP_NUM_THREADS": "1"})
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "seed_0" / "metrics.json").read_text())["steps"] == 3
