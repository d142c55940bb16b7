"""load_lra / fetch_lra dispatch: every task has its module's load and fetch, and unknown names fail clearly."""

import inspect

import pytest

from primal_attention.data import lra


def test_every_task_has_a_loader_and_a_fetch():
    assert set(lra.TASK_MODULES) == set(lra.TASKS)
    for task in lra.TASKS:
        module = lra.TASK_MODULES[task]
        assert callable(module.load) and callable(module.fetch)
        params = inspect.signature(module.load).parameters
        assert {"split", "seq_len", "data_dir", "num_examples", "seed", "progress", "options"} <= set(params)


@pytest.mark.parametrize("call", [lambda: lra.load_lra("matching", "train"), lambda: lra.fetch_lra("cifar")])
def test_unknown_task_error(call):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(f"task must be one of {lra.TASKS}, got ")


def test_unknown_task_is_reported_before_the_split():
    with pytest.raises(ValueError, match=r"task must be one of .*got 'matching'"):
        lra.load_lra("matching", "dev")
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'val', 'test'\), got 'dev'"):
        lra.load_lra("listops", "dev")
