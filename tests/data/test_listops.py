"""ListOps generator, evaluator and tokenisation (LRA's rules)."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primal_attention.data.lra import listops_gen as listops


@pytest.mark.parametrize(
    "expr, value",
    [
        ("7", 7),
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[MIN 3 [MAX 1 8 ] 5 ]", 3),
        ("[SM 5 6 7 ]", 8),  # 18 mod 10
        ("[SM 9 9 [SM 9 9 ] ]", 6),  # (9 + 9 + 8) mod 10
        ("[MED 1 9 5 ]", 5),
        ("[MED 1 9 ]", 5),  # even count: mean of the middle pair
        ("[MED 2 3 ]", 2),  # int(np.median([2, 3])) = int(2.5) = 2
        ("[MED 4 1 8 2 ]", 3),  # middle pair 2, 4
        ("[MED 3 4 4 3 ]", 3),  # 3.5 -> 3
        ("[MAX [MED 0 1 ] [SM 3 4 ] [MIN 9 [MAX 0 0 ] ] ]", 7),
        ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # LRA's TSV form with parentheses
    ],
)
def test_evaluate_hand_made(expr, value):
    assert listops.evaluate(expr) == value
    assert listops.evaluate(listops.tokenize(expr)) == value


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=2, max_size=10), st.sampled_from(["[MED", "[MIN", "[MAX", "[SM"]))
def test_evaluate_matches_lra_numpy_semantics(args, op):
    expected = {"[MED": int(np.median(args)), "[MIN": min(args), "[MAX": max(args), "[SM": sum(args) % 10}[op]
    assert listops.evaluate([op, *map(str, args), "]"]) == expected


@pytest.mark.parametrize("bad", ["", "[MAX 1 2", "[MAX 1 2 ] ]", "[MAX 1 2 ] 3", "[MAX ]", "[FOO 1 2 ]", "12"])
def test_evaluate_rejects_malformed(bad):
    with pytest.raises(ValueError):
        listops.evaluate(bad)


def test_depth():
    assert listops.depth("7") == 0
    assert listops.depth("[MAX 1 2 ]") == 1
    assert listops.depth("[MAX 1 [MIN 2 [SM 3 4 ] ] [MED 5 6 ] ]") == 3


def _args_per_operator(tokens):
    counts, stack = [], []
    for t in tokens:
        if t in listops.OPERATORS:
            stack.append(0)
        elif t == listops.END:
            counts.append(stack.pop())
            if stack:
                stack[-1] += 1
        elif stack:
            stack[-1] += 1
    return counts


def test_generated_expressions_follow_the_bounds():
    exprs, values = listops.generate_listops(300, seed=3, min_length=20, max_length=120, max_depth=5, max_args=4)
    lengths = np.array([len(e) for e in exprs])
    assert lengths.min() > 20 and lengths.max() < 120  # strictly, as LRA
    assert max(listops.depth(e) for e in exprs) <= 4  # root at depth 1: operators nest max_depth - 1 deep
    args = [a for e in exprs for a in _args_per_operator(e)]
    assert min(args) >= 2 and max(args) <= 4
    assert set(Counter(args)) == {2, 3, 4}
    assert [listops.evaluate(e) for e in exprs] == values.tolist()
    assert len({tuple(e) for e in exprs}) == len(exprs)  # distinct, as LRA's set


def test_lra_defaults_give_long_deep_expressions():
    exprs, _ = listops.generate_listops(20, seed=0)
    assert all(500 < len(e) < 2000 for e in exprs)
    assert all(listops.depth(e) <= 9 for e in exprs)
    assert max(listops.depth(e) for e in exprs) == 9


def test_operator_and_argument_draws_are_uniform():
    exprs, _ = listops.generate_listops(400, seed=5, min_length=30, max_length=300)
    ops = Counter(t for e in exprs for t in e if t in listops.OPERATORS)
    total = sum(ops.values())
    assert set(ops) == set(listops.OPERATORS)
    assert all(abs(c / total - 0.25) < 0.03 for c in ops.values())
    args = Counter(a for e in exprs for a in _args_per_operator(e))
    share = np.array([args[k] for k in range(2, 11)]) / sum(args.values())
    assert np.all(np.abs(share - 1 / 9) < 0.03)


def test_generation_is_deterministic_by_seed():
    a, va = listops.generate_listops(30, seed=11, min_length=10, max_length=80)
    b, vb = listops.generate_listops(30, seed=11, min_length=10, max_length=80)
    c, _ = listops.generate_listops(30, seed=12, min_length=10, max_length=80)
    assert a == b and np.array_equal(va, vb)
    assert a != c
    d, _ = listops.generate_listops(10, seed=11, min_length=10, max_length=80)
    assert d == a[:10]  # a prefix of the same stream


def test_label_balance_is_sane():
    _, values = listops.generate_listops(600, seed=2, min_length=20, max_length=150)
    share = np.bincount(values, minlength=10) / values.size
    assert share.min() > 0.03 and share.max() < 0.3


def test_invalid_generation_parameters():
    with pytest.raises(ValueError):
        next(listops.iter_expressions(min_length=100, max_length=50))
    with pytest.raises(ValueError):
        next(listops.iter_expressions(max_args=1))


def test_encode_brackets_and_alnum():
    exprs = [listops.tokenize("[MAX 2 9 [MIN 4 7 ] 0 ]"), ["7"]]
    v = listops.VOCABS["brackets"]
    x, mask = listops.encode(exprs, 12)
    assert x.dtype == np.int64 and x.shape == (2, 12) and mask.dtype == bool
    assert x[0, :9].tolist() == [v["[MAX"], v["2"], v["9"], v["[MIN"], v["4"], v["7"], v["]"], v["0"], v["]"]]
    assert mask[0].sum() == 9 and mask[1].sum() == 1 and (x[~mask] == 0).all()
    for vocab in listops.VOCABS.values():  # 0 is padding, the other ids are 1..V-1
        assert vocab["<pad>"] == 0 and sorted(vocab.values()) == list(range(len(vocab)))
    xa, ma = listops.encode(exprs, 12, "alnum")
    va = listops.VOCABS["alnum"]
    assert xa[0, :7].tolist() == [va["MAX"], va["2"], va["9"], va["MIN"], va["4"], va["7"], va["0"]]
    assert ma[0].sum() == 7
    xt, mt = listops.encode(exprs, 4)  # truncation, as LRA's [:max_length]
    assert mt[0].all() and xt[0].tolist() == x[0, :4].tolist()
    with pytest.raises(ValueError):
        listops.encode([["[FOO"]], 4)
    with pytest.raises(ValueError):
        listops.encode(exprs, 4, "words")
