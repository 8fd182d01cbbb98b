"""Expressions put together by precedence (kadj.expr_text): generated expressions, a
name replaced by another generated expression, evaluate exactly as the value of the
inner expression put in a variable."""
import ast
import math
import random

from kadj.expr_text import add, combine, substitute

ENV = {"a": 1e16, "b": -1e16, "c": 1.5, "d": 3.0, "xs": [0.5, -2.0, 7.0],
       "abs": abs, "max": max, "math": math}
_BIN = [ast.Add, ast.Sub, ast.Mult, ast.Pow, ast.Mod]
_CMP = [ast.Lt, ast.GtE, ast.Eq]


def gen(rng, depth):
    if depth == 0 or rng.random() < 0.2:
        return (ast.Name(rng.choice("abcd")) if rng.random() < 0.8
                else ast.Constant(rng.choice([2.0, 0.5, 3])))
    k = rng.randrange(10)
    sub = lambda: gen(rng, depth - 1)  # noqa: E731
    if k < 4:
        op = rng.choice(_BIN)()
        if isinstance(op, ast.Pow):
            return ast.BinOp(sub(), op, ast.Constant(rng.choice([2, 3])))
        return ast.BinOp(sub(), op, sub())
    if k == 4:
        return ast.UnaryOp(rng.choice([ast.USub, ast.UAdd, ast.Not])(), sub())
    if k == 5:
        return ast.Compare(sub(), [rng.choice(_CMP)()], [sub()])
    if k == 6:
        return ast.BoolOp(rng.choice([ast.And, ast.Or])(), [sub(), sub()])
    if k == 7:
        return ast.IfExp(sub(), sub(), sub())
    if k == 8:
        return ast.Call(ast.Name(rng.choice(["abs", "max"])), [sub(), sub()][:1 + (rng.random() < .5)], [])
    return ast.Subscript(ast.Name("xs"), ast.BinOp(ast.Call(ast.Name("int"), [ast.Call(
        ast.Name("abs"), [sub()], [])], []), ast.Mod(), ast.Constant(3)))


def with_t(rng, tree):
    """``tree`` with one of its leaves (a name or constant) made ``t``."""
    leaves = [(p, f, i) for p in ast.walk(tree) for f, v in ast.iter_fields(p)
              for i, c in enumerate(v if isinstance(v, list) else [v])
              if isinstance(c, (ast.Name, ast.Constant)) and not (
                  isinstance(p, ast.Call) and f == "func") and not (
                  isinstance(p, ast.Subscript) and f == "value") and not (
                  isinstance(p, ast.BinOp) and isinstance(p.op, (ast.Pow, ast.Mod)) and
                  f == "right")]
    if not leaves:
        return None
    p, f, i = rng.choice(leaves)
    if isinstance(getattr(p, f), list):
        getattr(p, f)[i] = ast.Name("t")
    else:
        setattr(p, f, ast.Name("t"))
    return ast.fix_missing_locations(tree)


def value(text, **extra):
    try:
        return ("ok", repr(eval(text, dict(ENV, __builtins__={"int": int}), extra)))
    except (OverflowError, ZeroDivisionError, ValueError, TypeError, SyntaxError) as e:
        return ("raises", type(e).__name__)


def test_generated_expressions_evaluate_as_before():
    rng = random.Random(7)
    checked = differs_without_parens = 0
    for _ in range(3000):
        outer = with_t(rng, gen(rng, 3))
        if outer is None:
            continue
        outer_text, inner_text = ast.unparse(outer), ast.unparse(gen(rng, 3))
        inner = value(inner_text)
        if inner[0] != "ok":
            continue
        expected = value(outer_text, t=eval(inner_text, dict(ENV, __builtins__={"int": int})))
        if expected[0] != "ok":
            continue
        put = substitute(outer_text, "t", inner_text)
        assert put is not None, (outer_text, inner_text)
        assert value(put) == expected, (outer_text, inner_text, put)
        checked += 1
        naive = outer_text.replace("t", inner_text, 1) if outer_text.count("t") == 1 else None
        if naive is not None and value(naive) != expected:
            differs_without_parens += 1
    assert checked > 1500
    assert differs_without_parens > 50   # the parentheses matter in these cases


def test_parentheses_only_where_needed():
    assert substitute("u[t]", "t", "i - 1") == "u[i - 1]"
    assert substitute("t - c", "t", "a - 2.0 * b") == "a - 2.0 * b - c"
    assert substitute("a - t", "t", "b - c") == "a - (b - c)"
    assert substitute("a + t", "t", "b + c") == "a + (b + c)"   # float rounding
    assert substitute("t * c", "t", "a + b") == "(a + b) * c"
    assert substitute("t ** 2", "t", "-a") == "(-a) ** 2"
    assert substitute("t ** 2", "t", "a ** b") == "(a ** b) ** 2"
    assert substitute("t[0]", "t", "u.shape") == "u.shape[0]"
    assert substitute("t < c", "t", "a < b") == "(a < b) < c"
    assert substitute("-t", "t", "-a") == "- -a"
    assert substitute("t.real", "t", "1") == "(1).real"
    assert substitute("f(t, b)", "t", "a, c") == "f((a, c), b)"
    assert substitute("t", "t", "a if c else b") == "a if c else b"
    assert substitute("t * t", "t", "a") is None       # read twice
    assert substitute("tt + 1", "t", "a") is None      # not read
    assert combine("a - b", "+", "c + d") == "a - b + (c + d)"


def test_a_cast_of_the_same_cast_is_that_cast():
    assert substitute("np.float32(t)", "t", "np.float32(a * b)") == "np.float32(a * b)"
    assert substitute("x + np.float32(t)", "t", "np.float32(a)") == "x + np.float32(a)"
    assert substitute("np.complex64(t)", "t", "np.complex64(z)") == "np.complex64(z)"
    # not the same cast, or not one call of it: both kept
    assert substitute("np.float32(t)", "t", "np.complex64(z)") == "np.float32(np.complex64(z))"
    assert substitute("np.float32(t)", "t", "np.float32(a) * b") == \
        "np.float32(np.float32(a) * b)"
    assert substitute("np.float64(t)", "t", "np.float64(a)") == "np.float64(np.float64(a))"
    assert substitute("np.float32(t, 1)", "t", "np.float32(a)") == \
        "np.float32(np.float32(a), 1)"


def test_adding_a_negated_term_subtracts_it():
    assert add("a", "-b") == "a - b"
    assert add("a", "-b * c") == "a - b * c"
    assert add("a", "-(b * c)") == "a - b * c"
    assert add("a", "-(x * y) / z") == "a - x * y / z"
    assert add("a + b", "-c / d * e") == "a + b - c / d * e"
    assert add("a", "-b ** 2 * c") == "a - b ** 2 * c"       # -(b ** 2) * c
    assert add("a", "-(b + c)") == "a - (b + c)"
    # no leading minus the rule takes away: added as written
    assert add("a", "-(b + c) * d") == "a + -(b + c) * d"
    assert add("a", "b * -c") == "a + b * -c"
    assert add("a", "-b + c") == "a + (-b + c)"
    assert add("a", "b +") is None


def test_subtracting_instead_of_adding_the_negation_is_the_same_number():
    rng = random.Random(3)
    special = [0.0, -0.0, 1e-310, -1e-310, 1e308, -1e308, math.inf, -math.inf, 1.5, -2.25]
    texts = ["-b", "-b * c", "-(b * c)", "-b / c * d", "-(b * c) / d", "-b ** 2 * c"]
    for _ in range(2000):
        env = {v: rng.choice(special) if rng.random() < 0.3 else rng.uniform(-1e3, 1e3)
               for v in "abcd"}
        for t in texts:
            try:
                want = eval(f"a + ({t})", {}, env)
                got = eval(add("a", t), {}, env)
            except (ZeroDivisionError, OverflowError):
                continue
            if math.isnan(want):        # (a NaN's sign bit is not a number's)
                assert math.isnan(got), (t, env)
            else:
                assert got == want and math.copysign(1.0, got) == \
                    math.copysign(1.0, want), (t, env)
