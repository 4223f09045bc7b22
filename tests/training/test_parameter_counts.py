"""No function in training/ takes more than 10 parameters (``self`` / ``cls`` not counted): a
command's many flags are a dataclass's fields (``training.commands.configured``), and a method's
loop takes its ``Hyper``, ``Runtime`` and ``Checkpoints`` rather than their fields one by one."""

from __future__ import annotations

import ast
from pathlib import Path

TRAINING = Path(__file__).resolve().parents[2] / "training"
LIMIT = 10


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def test_no_function_in_training_takes_more_than_ten_parameters() -> None:
    over = []
    for path in sorted(TRAINING.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and parameter_count(node) > LIMIT:
                over.append(f"{path.relative_to(TRAINING.parent)}:{node.lineno} {node.name} ({parameter_count(node)})")
    assert over == []


def test_the_count_sees_every_kind_of_parameter() -> None:
    fn = ast.parse("def f(self, a, /, b, *c, d, **e): pass").body[0]
    assert isinstance(fn, ast.FunctionDef) and parameter_count(fn) == 5
