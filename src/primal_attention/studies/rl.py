"""Regenerate docs/results/rl.md: DT vs Primal.+DT on D4RL-style datasets collected here.

D4RL's files cannot be downloaded here; ``primal data collect-rl ENV`` collects the same kind of
datasets with SAC in the real MuJoCo environments. This script runs every (dataset, model, seed)
whose dataset is collected and whose metrics are not stored yet (``docs/results/rl_runs/<config>/
seed_<k>.json``; interrupted runs continue from ``runs/results_rl``), on the CPU schedule below,
then writes the page with the collection cards.

Several workers may share the grid (claim files in ``runs/results_rl/claims``; delete that folder to
re-claim after a crash).

    .venv/bin/python scripts/results_rl.py                 # every collected dataset x 2 models x 3 seeds
    .venv/bin/python scripts/results_rl.py --envs hopper --datasets medium,medium-replay
    .venv/bin/python scripts/results_rl.py --table-only    # rewrite the page from stored runs
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict

from primal_attention.studies import sweeps as tuned
from primal_attention.studies.comparison import at_grid_edge, outcome

from primal_attention.data.cache import cache_dir
from primal_attention.data.rl import DATASETS, D4RL_SCORES
from primal_attention.train.experiments import claim, run_stored, stored
from primal_attention.train.stats import value_cell
from primal_attention.studies.paths import ROOT

RUNS = ROOT / "docs" / "results" / "rl_runs"
WORK = ROOT / "runs" / "results_rl"
PAGE = ROOT / "docs" / "results" / "rl.md"
MODELS = {"dt": "DT", "primal+": "Primal.+DT"}
#: the CPU schedule: what differs from the paper's settings in configs/rl/*.yaml.
CPU_SCHEDULE = ["model.dim=128", "model.ffn_dim=512", "train.batch_size=32", "train.steps=1000",
                "optim.warmup_steps=100", "train.eval_every=500", f"data.options.eval_episodes={tuned.RL_FIRST_ROUND_EPISODES}", "train.threads=1",
                "train.progress=false"]


def cards() -> dict[str, dict]:
    out = {}
    for env in D4RL_SCORES:
        path = cache_dir("rl") / f"{env}-seed0-card.json"
        if path.is_file():
            out[env] = json.loads(path.read_text())
    return out


BEHAVIOUR = ROOT / "docs" / "results" / "baselines" / "rl_behaviour.json"


def write_behaviour_baseline(cs: dict[str, dict]) -> None:
    """The trivial baseline of offline RL: the behaviour policy, i.e. the D4RL-normalised mean return of
    each dataset's own episodes (from the collection cards), and its mean over the datasets the
    comparison uses; kept in docs/results/baselines for the summary page."""
    scores = {f"{env}-{name}": card["datasets"][name]["score_mean"] for env, card in cs.items()
              for name in DATASETS if name in card["datasets"]}
    if len(scores) != len(D4RL_SCORES) * len(DATASETS):
        return
    BEHAVIOUR.parent.mkdir(parents=True, exist_ok=True)
    BEHAVIOUR.write_text(json.dumps({"source": "collection cards (primal data collect-rl, seed 0)", "per_dataset": scores,
                                     "baselines": {"behaviour": {"what": "the datasets' own episodes (mean D4RL-normalised "
                                                                         "return), averaged over the 9 datasets",
                                                                 "test_score": [statistics.mean(scores.values())]}}},
                                    indent=2) + "\n")


def collect_command(card: dict) -> str:
    """The ``primal data collect-rl`` command that made a card's datasets: the options that differ from the
    defaults (the card's own record of its settings)."""
    from primal_attention.data.rl_collect import CollectConfig

    defaults = asdict(CollectConfig(env=card["env"]))
    flags = [f"--{key.replace('_', '-')} {f'{value:g}' if isinstance(value, float) else value}"
             for key, value in card.get("config", {}).items()
             if key not in ("env", "threads", "rollout_envs") and key in defaults and value != defaults[key]]
    return " ".join(["primal data collect-rl", card["env"], *flags])


#: the bold headers of an environment's earlier collections, oldest first, each with the runs that used it: a
#: record moves here when the data are collected again and differ (SAC need not retrace a collection).
PRIOR = [("{env}, earlier collection", "the data of the previous runs"),
         ("{env}, first tuned round's collection", "the data of the first tuned round")]
#: kept for the older name of the first header
EARLIER = PRIOR[0][0]


def kept_card_sections() -> dict[str, str]:
    """The page's own record of each environment's collection (its "**env** ..." paragraph and table), and of
    the earlier collections kept beside it (PRIOR's headers), keyed by the bold header."""
    old = PAGE.read_text() if PAGE.is_file() else ""
    text = old.split("## Collected datasets\n", 1)[1] if "## Collected datasets\n" in old else ""
    headers = set(D4RL_SCORES) | {h.format(env=env) for env in D4RL_SCORES for h, _ in PRIOR}
    out: dict[str, str] = {}
    for block in text.split("\n**"):
        block = block.strip().removeprefix("**")
        header = block.split("**", 1)[0]
        if header in headers:
            out[header] = f"**{block}".strip()
    return out


def _table(section: str) -> list[str]:
    return [line for line in section.splitlines() if line.startswith("| ")]


def card_sections(env: str, card: dict | None, kept: dict[str, str]) -> list[str]:
    """An environment's collection record(s) on the page, newest first: the card in this machine's cache (else
    the page's own record), then the earlier collections' records (PRIOR). Where the card's data differ from
    the page's record (SAC need not retrace a collection), that record moves to the first PRIOR header not yet
    used: the runs named there used it."""
    priors = [kept[h] for h in (p.format(env=env) for p, _ in reversed(PRIOR)) if h in kept]
    if card is None:
        return [kept[env], *priors] if env in kept else priors
    med = card["medium_policy"]
    lines = [f"**{env}** ({card['gymnasium_env']}, seed {card['seed']}; `{collect_command(card)}`): "
             f"SAC {card['sac']['steps']} steps "
             f"({card['sac']['cpu_seconds'] / 60:.0f} CPU min); medium policy at {med['steps']} steps (eval return "
             f"{med['return']:.0f}, target {med['target']:.0f}{'' if med['reached'] else ', not reached'}); "
             f"\"expert\" at {card['expert_policy']['steps']} steps (eval return {card['expert_policy']['return']:.0f}; "
             f"D4RL's expert reference {card['d4rl_reference_returns']['expert']:.0f}).", "",
             "| dataset | transitions | episodes | return mean ± std | min | max | normalised score |", "|---|---|---|---|---|---|---|"]
    for name, d in card["datasets"].items():
        lines.append(f"| {name} | {d['transitions']} | {d['episodes']} | {d['return_mean']:.0f} ± {d['return_std']:.0f} | "
                     f"{d['return_min']:.0f} | {d['return_max']:.0f} | {d['score_mean']:.1f} |")
    current = "\n".join(lines)
    free = [(h.format(env=env), used_by) for h, used_by in PRIOR if h.format(env=env) not in kept]
    if env in kept and _table(kept[env]) != _table(current):
        if not free:
            raise ValueError(f"rl.md keeps {len(PRIOR)} earlier collections of {env}; name the runs of another "
                             "in studies.rl.PRIOR")
        header, used_by = free[0]
        body = kept[env].removeprefix(f"**{env}**")
        return [current, f"**{header}** ({used_by}; this machine collected {env} again, "
                         f"and SAC did not retrace it){body}", *priors]
    return [current, *priors]


def collected(env: str, dataset: str) -> bool:
    return (cache_dir("rl") / f"{env}-{dataset}-seed0.npz").is_file()


def average_rows() -> list[str]:
    """Per model, the normalised score averaged over every dataset with runs (the paper's summary
    figure): per seed the mean over the datasets that seed finished on all of them, then mean ± std
    over those seeds."""
    rows = []
    for key, label in MODELS.items():
        per_dataset = {f"{env}-{ds}": {r["seed"]: r for r in stored(RUNS / f"{env}-{ds}_{key}")}
                       for env in D4RL_SCORES for ds in DATASETS}
        per_dataset = {k: v for k, v in per_dataset.items() if v}
        if not per_dataset:
            continue
        seeds = sorted(set.intersection(*(set(v) for v in per_dataset.values())))
        if not seeds:
            continue
        cells = [value_cell([statistics.mean(v[s][field] for v in per_dataset.values()) for s in seeds], 1)
                 for field in ("test_score", "best_test_score", "final_test_score")]
        rows.append(f"| **average over {len(per_dataset)} datasets** | {label} | {len(seeds)} | " + " | ".join(cells) + " | – |")
    return rows


def tuned_lines() -> list[str]:
    """Each dataset's tuned comparison (per-model lr swept, selected on validation rollouts) that has begun,
    the average over the datasets once all are done, and what is not rerun yet."""
    lines = ["## Tuned comparison: per-model learning rate (validation rollouts select)", "",
             "Each dataset: `scripts/sweep_comparisons.py --only rl/<env>-<dataset>` (the CPU schedule above, each dataset collected first; "
             "the trivial baselines: the behaviour policy, the dataset's own episodes, read from the card of the data "
             "these runs used; and a linear policy, ridge regression of actions on states with the ridge chosen on "
             "the validation rollouts, scored once on the test rollouts). A dataset collected again need not retrace the collection behind the earlier runs "
             "below (SAC did not retrace it for hopper here), so compare a tuned row with an earlier one only "
             "through each one's behaviour baseline.", ""]
    for d in tuned.RL_DATASETS:
        if tuned.progress(f"rl/{d}") != "not started":
            lines += [f"### {d}", "", *tuned.section(f"rl/{d}"), "", *fallen_lines(f"rl/{d}")]
    average = tuned.rl_average()
    if average:
        lines += [f"**Average over the {len(tuned.RL_DATASETS)} datasets** (per final seed, then mean ± std): "
                  + "; ".join(f"{label} {value_cell(v, 1)}" for label, v in average.items()) + ".", ""]
    waiting = [f"{d}: {line}" for d in tuned.RL_DATASETS if tuned.progress(f"rl/{d}") == "not started"
               and (line := tuned.trivial_line(f"rl/{d}"))]
    if waiting:
        lines += ["Trivial baselines of the datasets collected but not compared yet (test score): "
                  + "; ".join(waiting) + ".", ""]
    spent = {env: card["sac"]["cpu_seconds"] for env, card in cards().items() if card.get("sac", {}).get("cpu_seconds")}
    if spent and any(tuned.waiting_for(f"rl/{d}") for d in tuned.RL_DATASETS):
        lines += ["Collecting an environment's three datasets (`primal data collect-rl ENV`, one thread) took "
                  + ", ".join(f"{sec / 60:.0f} CPU min for {env}" for env, sec in spent.items())
                  + " here (SAC's training; the rollouts add a few minutes).", ""]
    return lines + tuned.not_rerun_note({d: f"rl/{d}" for d in tuned.RL_DATASETS})


#: the behaviour policy's normalised score per dataset of the data the first tuned round used (a copy of
#: sweeps.COLLECTED_BEHAVIOUR taken before the second round's collection replaced it).
FIRST_ROUND_BEHAVIOUR = ROOT / "docs" / "results" / "baselines" / "rl_first_round_behaviour.json"


#: an evaluation whose validation episodes last under this many steps on average (of the 1000 allowed) is a
#: policy that falls at once: the agent tips over within a few dozen steps, scoring near a random policy's 0.
FALL_STEPS = 50


def fallen_lines(comparison: str) -> list[str]:
    """A note naming the runs of ``comparison`` (grid points and final seeds) whose policy fell at once at every
    evaluation (:data:`FALL_STEPS`), with their mean episode lengths: a degenerate policy, not a crash, and with
    few evaluations per run one that can decide a grid point. [] where none did."""
    found = []
    for entry, sweep in zip(tuned.entries(comparison), tuned.sweeps_of(comparison)):
        runs = [(f"lr {p.name.split('=', 1)[1]}", p.metrics) for p in sweep.results()]
        runs += [(f"final seed {r['seed']}", r) for r in sweep.finals()]
        for what, record in runs:
            lengths = [h["val_length"] for h in record.get("history", []) if "val_length" in h]
            if lengths and max(lengths) < FALL_STEPS:
                found.append(f"{entry.label} {what} ({', '.join(f'{n:.0f}' for n in lengths)} steps)")
    if not found:
        return []
    return [f"**Policies that fell at once** (runs whose validation episodes lasted under {FALL_STEPS} of the 1000 "
            "steps on average at every evaluation: the agent tips over and scores near a random policy's "
            "0; a degenerate policy, not a failed run, which few evaluations per run let decide a grid point): "
            + "; ".join(found) + ".", ""]


def first_round(dataset: str, model: str) -> dict | None:
    """The first tuned round of ``dataset`` for ``model`` (its store without the schedule's suffix), as the
    audit read it: the chosen rate (the one final folder), whether it is the smallest or largest rate of the
    grid's finished points (``edge``), the sweep's seed-0 run of that rate (which the first round reused as a final
    seed) and the fresh final seeds run since; None where it has none."""
    store = tuned.STORE / f"{dataset}_{model}"
    folders = sorted(p for p in (store / "final").glob("*") if p.is_dir()) if store.is_dir() else []
    if len(folders) != 1 or not (store / "points" / folders[0].name / "seed_0.json").is_file():
        return None
    read = lambda path: json.loads(path.read_text())  # noqa: E731
    sweep_run = read(store / "points" / folders[0].name / "seed_0.json")
    fresh = {int(f.stem.removeprefix("seed_")): read(f) for f in sorted(folders[0].glob("seed_*.json"))}
    rates = sorted(float(p.name.split("=", 1)[1]) for p in (store / "points").glob("optim.lr=*")
                   if (p / "seed_0.json").is_file())
    chosen = float(folders[0].name.split("=", 1)[1])
    return {"chosen": folders[0].name.split("=", 1)[1], "episodes": sweep_run.get("val_examples"),
            "edge": len(rates) > 2 and chosen in (rates[0], rates[-1]),
            "sweep_run": float(sweep_run["test_score"]), "fresh": {s: float(r["test_score"]) for s, r in fresh.items()}}


def round_comparison_lines() -> list[str]:
    """Old vs new selection on every dataset with a first tuned round: the first round's finals (the sweep's
    seed-0 run, chosen on 5 validation episodes, reused beside fresh seeds 1, 2), the same without that run,
    and the second round (every final seed fresh, 20 validation and 20 test episodes on disjoint env seeds)."""
    rows, listed = [], set()  # the table's rows and the datasets they show
    behaviour = json.loads(FIRST_ROUND_BEHAVIOUR.read_text()) if FIRST_ROUND_BEHAVIOUR.is_file() else {}
    for d in tuned.RL_DATASETS:
        new = {e.label: outcome(e) for e in tuned.entries(f"rl/{d}")}
        for key, label in MODELS.items():
            old = first_round(d, key)
            if old is None:
                continue
            fresh = [old["fresh"][s] for s in sorted(old["fresh"]) if s in (1, 2)]
            o = new.get(label)
            edge = "" if o is None or not at_grid_edge(o) else " (at the grid's edge)"
            second = ("–", "–") if o is None else (
                f"{o.chosen['optim.lr']:g}{edge}" if o.chosen else "not chosen yet",
                f"{value_cell(o.test, 1)} (n={len(o.test)})" if o.test else "–")
            first_behaviour = f"{behaviour[d]:.1f}" if d in behaviour else "–"
            first_lr = old["chosen"] + (" (at the grid's edge)" if old["edge"] else "")
            listed.add(d)
            rows.append(f"| {d} | {label} | {first_behaviour} | {first_lr} | {old['sweep_run']:.1f} | "
                        f"{value_cell([old['sweep_run'], *fresh], 1)} (n={1 + len(fresh)}) | "
                        f"{value_cell(fresh, 1)} (n={len(fresh)}) | {second[0]} | {second[1]} |")
    if not rows:
        return []
    second = tuned.collected_behaviour()
    shared = [d for d in listed if d in behaviour and d in second]
    if len(shared) == len(listed) and all(second[d] == behaviour[d] for d in shared):  # same episodes, same float
        data = ("Both rounds trained on the same collection here (the behaviour scores of their cards agree to every "
                f"digit), so the rows differ in the selection, the evaluation episodes ({tuned.RL_FIRST_ROUND_EPISODES} "
                f"against {tuned.RL_EVAL_EPISODES}) and the final seeds, not in the data.")
    else:
        differ = [d for d in shared if second[d] != behaviour[d]]
        data = ("The rounds did not all train on the same collection (their cards' behaviour scores differ)" if differ
                else "Not every dataset's second-round collection is recorded yet") + \
            ", so read each against its own behaviour baseline (the second round's: its sections above)."
    return ["## Old vs new selection", "",
            f"The first tuned round chose each model's rate on {tuned.RL_FIRST_ROUND_EPISODES} validation episodes of the "
            "sweep's seed-0 run and reused that run as a final seed beside seeds 1 and 2: the run that won the selection "
            "also counted in the result. The second round (the tuned sections above) evaluates on "
            f"{tuned.RL_EVAL_EPISODES} validation and {tuned.RL_EVAL_EPISODES} test episodes (env seeds 10000+ and 20000+, "
            "disjoint), sweeps again on that, and trains fresh final seeds 1, 2, 3. Val-selected test score "
            f"(D4RL-normalised), mean ± sample std. {data}", "",
            "| dataset | model | first round: behaviour | first round: lr | the sweep's seed-0 run | first round as reported "
            "(seeds 0, 1, 2) | without the reused run (seeds 1, 2) | second round: lr | second round (fresh seeds) |",
            "|---|---|---|---|---|---|---|---|---|", *rows, ""]


def write_page() -> None:
    lines = [
        "# Offline RL: DT vs Primal.+DT on D4RL-style MuJoCo datasets collected here",
        "",
        "Regenerate: `primal data collect-rl ENV --expert-steps 200000` per environment (the budget of the",
        "datasets below; each environment's line gives its command where its card records it), then `.venv/bin/python scripts/results_rl.py`",
        "(resumable; `--table-only` rewrites this page from `docs/results/rl_runs/`). Configs:",
        "`configs/rl/<env>-<dataset>_{dt,primal+}.yaml` (the authors' settings), run with the CPU schedule below.",
        "",
        "**Data (collected here, not D4RL's files):** SAC (stable-baselines3 defaults, 10k random steps first)",
        "in gymnasium's v5 MuJoCo environments, D4RL's recipe: the medium policy is the first one whose",
        "evaluation reaches a third of D4RL's expert reference return; `medium` = its rollouts (stochastic",
        "actions), `medium-replay` = SAC's replay buffer up to then, `medium-expert` = medium + rollouts of the",
        "policy at the end of the SAC budget (the \"expert\", which on this CPU budget is below D4RL's expert).",
        "",
        "**Model and schedule:** the paper's DT is 3 layers, D 256, H 4, K 20, 100k steps of batch 64; one such",
        "step takes about 1.5 s on one core of this machine, so the runs here use a **CPU schedule**: "
        + ", ".join(f"`{s}`" for s in tuned.RL_CPU_SCHEDULE) + f" ({tuned.RL_FIRST_ROUND_EPISODES} episodes in the "
        "first tuned round and the previous runs; AdamW, wd 1e-4, clip 0.25,",
        "ReLU, dropout 0.1, K 20 as the paper; Primal.+DT: last layer causal primal with the authors' s per",
        "dataset, η 0.05). Evaluation: rollouts in the environment conditioned on the authors' target return",
        "(hopper 3600, halfcheetah 12000, walker2d 5000), D4RL-normalised; validation rollouts (env seeds",
        "10000+) select the evaluation, TEST rollouts (env seeds 20000+) are run with those weights (holdout);",
        "the best TEST over the evaluations is shown beside it (the authors' protocol). Mean ± sample std over",
        "seeds (n = seeds finished).",
        "",
        *tuned_lines(),
        *round_comparison_lines(),
        "## Previous runs: shared lr, previous init", "",
        "One learning rate (the configs' 1e-3) for every model, and the previous Decision Transformer init "
        "(`block_init: torch`, PyTorch's defaults inside the blocks; docs/method.md §8). Kept so the change is visible.", "",
        "| dataset | model | n | test score (val-selected) | best test score (authors') | final test score | train time / run (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    missing = []
    for env in D4RL_SCORES:
        for ds in DATASETS:
            for key, label in MODELS.items():
                rs = stored(RUNS / f"{env}-{ds}_{key}")
                if len(rs) < 3:
                    missing.append(f"{env}-{ds} {label}: {3 - len(rs)} of 3 seeds")
                if not rs:
                    continue
                wall = f"{statistics.mean(r['wall_time_s'] for r in rs):.0f}"
                lines.append(f"| {env}-{ds} | {label} | {len(rs)} | {value_cell([r['test_score'] for r in rs], 1)} | "
                             f"{value_cell([r['best_test_score'] for r in rs], 1)} | {value_cell([r['final_test_score'] for r in rs], 1)} | {wall} |")
    lines += average_rows()
    lines += ["", "**Runs not done** (CPU budget): " + ("; ".join(missing) if missing else "none") + ".", "",
              "Trivial baselines of these runs: the behaviour policy of each dataset they used (the earlier collection "
              "cards below; 9-dataset mean on the summary page). A linear policy is fit only on data this machine holds, "
              "the re-collected datasets of the tuned sections above; the collections behind these runs are not kept.", "",
              "For comparison only, on D4RL's own datasets (a different, larger collection; full schedule): the paper",
              "reports an average normalised score over the 9 datasets of 72.2 for DT and 77.5 for Primal.+DT.", "",
              "## Collected datasets", ""]
    cs = cards()
    write_behaviour_baseline(cs)
    # The cards live in the data cache; for an environment whose card this machine lacks, the page keeps
    # its own record of it.
    kept = kept_card_sections()
    if not cs and not kept:
        lines.append("*(no collection card in this machine's cache)*")
    for env in D4RL_SCORES:
        for section in card_sections(env, cs.get(env), kept):
            lines += [section, ""]
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text("\n".join(lines) + "\n")
    print(f"wrote {PAGE}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", default=",".join(D4RL_SCORES))
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--table-only", action="store_true")
    args = p.parse_args()
    if not args.table_only:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for env in args.envs.split(","):
                for ds in args.datasets.split(","):
                    if not collected(env, ds):
                        continue
                    for model in args.models.split(","):
                        config = f"{env}-{ds}_{model}"
                        store = RUNS / config / f"seed_{seed}.json"
                        if store.is_file() or not claim(WORK / "claims", f"{config}-seed_{seed}"):
                            continue
                        run_stored(ROOT / "configs" / "rl" / f"{config}.yaml", store, WORK / config, seed, CPU_SCHEDULE)
                        write_page()
    write_page()


if __name__ == "__main__":
    main()
