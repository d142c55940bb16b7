"""ListOps (Nangia & Bowman 2018) as generated for the Long Range Arena.

An expression is a tree of list operators over the digits 0–9, written in prefix form with brackets::

    [MAX 2 9 [MIN 4 7 ] 0 ]          -> 9

Operators: ``[MAX``, ``[MIN``, ``[MED`` (median, ``int(np.median(args))`` as in LRA, so the median of
an even count is the mean of the two middle values rounded down) and ``[SM`` (sum modulo 10). Each
operator takes 2–``max_args`` arguments. The label is the value of the expression (10 classes).

The generator makes LRA's draws (``lra_benchmarks/data/listops.py``) in LRA's order, with Python's
``random.Random``: at depth < ``max_depth`` a node is an operator with probability 0.25 (else a
uniform digit); an operator first draws its argument count (uniform 2–``max_args``), then its
arguments, then which operator it is (uniform). It stops drawing a tree once the tree is too long to
keep, which does not change the distribution of the kept expressions. The root has
depth 1, so operators nest at most ``max_depth - 1`` deep. Expressions whose token count (operators,
digits and ``]``; LRA's file format adds parentheses that carry no information and are not counted) is
**strictly** between ``min_length`` and ``max_length`` are kept; duplicates are dropped, as LRA does with
a set. LRA's defaults: depth 10, 10 arguments, lengths 500–2000.

Two tokenisations are offered. ``"brackets"`` (default) keeps every token: ``[MAX``, ``[MIN``, ``[MED``,
``[SM``, ``]`` and the digits. ``"alnum"`` is what LRA's own input pipeline feeds the model: its
``tfds`` tokenizer keeps alphanumeric runs only, so brackets vanish (``MAX 2 9 MIN 4 7 0``) and
the expression is no longer uniquely parseable; code built on that pipeline inherits this.
Token id 0 is padding in both.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = [
    "OPERATORS",
    "END",
    "VOCABS",
    "tokenize",
    "evaluate",
    "depth",
    "generate_expression",
    "iter_expressions",
    "generate_listops",
    "encode",
]

MIN, MAX, MED, SUM_MOD = "[MIN", "[MAX", "[MED", "[SM"
OPERATORS = (MIN, MAX, MED, SUM_MOD)  # LRA's order, which the operator draw indexes into
END = "]"
_DIGITS = tuple(str(d) for d in range(10))
_OPERATOR_P = 0.25  # LRA's VALUE_P: a node is an operator when random() <= 0.25

VOCABS: dict[str, dict[str, int]] = {
    "brackets": {"<pad>": 0, **{d: i + 1 for i, d in enumerate(_DIGITS)},
                 **{op: 11 + i for i, op in enumerate(OPERATORS)}, END: 15},
    "alnum": {"<pad>": 0, **{d: i + 1 for i, d in enumerate(_DIGITS)},
              **{op[1:]: 11 + i for i, op in enumerate(OPERATORS)}},
}
"""Token → id for each tokenisation; id 0 is padding."""


def tokenize(source: str) -> list[str]:
    """Split an expression string into tokens, dropping LRA's parentheses.

    ``"( ( [MAX 2 ) 9 ) ]"`` (LRA's TSV form) and ``"[MAX 2 9 ]"`` both give ``["[MAX", "2", "9", "]"]``.
    """
    return [t for t in source.split() if t not in ("(", ")")]


def _median(args: list[int]) -> int:
    s = sorted(args)
    n = len(s)
    # int(np.median(s)) for non-negative integers: the lower-rounded mean of the middle pair.
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


def _apply(op: str, args: list[int]) -> int:
    if not args:
        raise ValueError(f"operator {op} has no arguments")
    if op == MIN:
        return min(args)
    if op == MAX:
        return max(args)
    if op == MED:
        return _median(args)
    return sum(args) % 10


def evaluate(expression: str | Sequence[str]) -> int:
    """Value of a ListOps expression (a string or a token sequence, brackets tokenisation).

    Raises:
        ValueError: unknown token, unbalanced brackets, an operator without arguments, or tokens left
            after a complete expression.
    """
    tokens = tokenize(expression) if isinstance(expression, str) else list(expression)
    if not tokens:
        raise ValueError("empty ListOps expression")
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for pos, tok in enumerate(tokens):
        if result is not None:
            raise ValueError(f"token {tok!r} at position {pos} after a complete expression")
        if tok in OPERATORS:
            stack.append((tok, []))
        elif tok == END:
            if not stack:
                raise ValueError(f"unmatched {END!r} at position {pos}")
            op, args = stack.pop()
            value = _apply(op, args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        elif tok in _DIGITS:
            if stack:
                stack[-1][1].append(int(tok))
            else:
                result = int(tok)
        else:
            raise ValueError(f"unknown ListOps token {tok!r} at position {pos}")
    if stack:
        raise ValueError(f"{len(stack)} operator(s) not closed by {END!r}")
    assert result is not None
    return result


def depth(expression: str | Sequence[str]) -> int:
    """Deepest operator nesting (``"7"`` → 0, ``"[MAX 1 2 ]"`` → 1)."""
    tokens = tokenize(expression) if isinstance(expression, str) else expression
    level = best = 0
    for tok in tokens:
        if tok in OPERATORS:
            level += 1
            best = max(best, level)
        elif tok == END:
            level -= 1
    return best


class _TooLong(Exception):
    pass


def generate_expression(rng: random.Random, *, max_depth: int = 10, max_args: int = 10,
                        limit: int | None = None) -> list[str] | None:
    """One random expression as a token list, with the draws of LRA's ``generate_tree(1, ...)``: same
    order, same probabilities (each uniform choice is taken as ``int(random() * n)``).

    With ``limit``, drawing stops (and None is returned) once the expression has ``limit`` tokens: such
    an expression would be rejected anyway, and stopping early does not change the distribution of
    the expressions that are kept.
    """
    out: list[str] = []
    rand = rng.random
    n_choices = max_args - 1

    def node(level: int) -> None:
        if limit is not None and len(out) >= limit:
            raise _TooLong
        if level >= max_depth or rand() > _OPERATOR_P:
            out.append(_DIGITS[int(rand() * 10)])
            return
        n_args = 2 + int(rand() * n_choices)
        slot = len(out)
        out.append("")
        for _ in range(n_args):
            node(level + 1)
        out[slot] = OPERATORS[int(rand() * 4)]
        out.append(END)

    try:
        node(1)
    except _TooLong:
        return None
    return out if limit is None or len(out) < limit else None


def iter_expressions(seed: int = 0, *, min_length: int = 500, max_length: int = 2000, max_depth: int = 10,
                     max_args: int = 10) -> Iterator[list[str]]:
    """Endless stream of distinct expressions with ``min_length < len < max_length``, deterministic by seed."""
    if not 0 <= min_length < max_length - 1:
        raise ValueError(f"need 0 <= min_length < max_length - 1, got min_length={min_length}, "
                         f"max_length={max_length}")
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"need max_depth >= 1 and max_args >= 2, got {max_depth}, {max_args}")
    rng = random.Random(seed)
    seen: set[bytes] = set()  # 16-byte digests: full token tuples would take ~1 GB at LRA's 100k
    while True:
        expr = generate_expression(rng, max_depth=max_depth, max_args=max_args, limit=max_length)
        if expr is not None and len(expr) > min_length:
            key = hashlib.blake2b(" ".join(expr).encode(), digest_size=16).digest()
            if key not in seen:
                seen.add(key)
                yield expr


def generate_listops(num_examples: int, *, seed: int = 0, min_length: int = 500, max_length: int = 2000,
                     max_depth: int = 10, max_args: int = 10, progress: bool = False
                     ) -> tuple[list[list[str]], np.ndarray]:
    """The first ``num_examples`` expressions of :func:`iter_expressions` and their values.

    Returns:
        ``(expressions, values)``: token lists and an ``(num_examples,)`` int64 array of labels 0–9.
    """
    stream = iter_expressions(seed, min_length=min_length, max_length=max_length, max_depth=max_depth,
                              max_args=max_args)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(disable=None, total=num_examples, desc="ListOps", unit="expr")
    expressions = []
    for _ in range(num_examples):
        expressions.append(next(stream))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    values = np.array([evaluate(e) for e in expressions], dtype=np.int64)
    return expressions, values


def encode(expressions: Sequence[Sequence[str]], seq_len: int, tokenization: str = "brackets"
           ) -> tuple[np.ndarray, np.ndarray]:
    """Token ids ``(M, seq_len)`` int64 and mask ``(M, seq_len)`` bool; longer expressions are truncated
    (as LRA does), shorter ones padded with 0.

    ``expressions`` are brackets-tokenised; ``tokenization="alnum"`` drops ``]`` and the ``[`` prefixes.
    """
    if tokenization not in VOCABS:
        raise ValueError(f"tokenization must be one of {sorted(VOCABS)}, got {tokenization!r}")
    vocab = VOCABS["brackets"]
    m = len(expressions)
    x = np.zeros((m, seq_len), dtype=np.int64)
    mask = np.zeros((m, seq_len), dtype=bool)
    for i, expr in enumerate(expressions):
        try:
            ids = [vocab[t] for t in expr]
        except KeyError as exc:
            raise ValueError(f"expression {i}: unknown ListOps token {exc.args[0]!r}") from None
        if tokenization == "alnum":
            ids = [t for t in ids if t != vocab[END]]
        ids = ids[:seq_len]
        x[i, : len(ids)] = ids
        mask[i, : len(ids)] = True
    return x, mask
