"""`@record` and the formula nodes behave as the frozen dataclasses they replace (issue 26:
start-up). The oracle is a real `@dataclass(frozen=True)` of the same fields: construction,
defaults and factories, __post_init__, equality, hash, repr, frozenness, dataclasses.replace,
and the TypeError of a wrong call (its kind: the wording may differ)."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field

import pytest

from attntrace.model import formula as F
from attntrace.model.record import record


def _declare(decorator):
    @decorator
    class Row:
        """A row."""

        name: str
        head: int | None
        shape: tuple = (1, 1)
        details: dict = field(default_factory=dict)

        def __post_init__(self):
            object.__setattr__(self, "details", dict(self.details, seen=True))
    return Row


Real, Ours = _declare(dataclass(frozen=True)), _declare(record)


@pytest.mark.parametrize("args, kwargs", [(("Q", 1), {}), (("Q", None, (2, 3)), {}), (("Q",), {"head": 2, "details": {"a": 1}}),
                                          ((), {"name": "K", "head": 1, "shape": (4, 4)})])
def test_a_record_is_built_as_the_dataclass_is(args, kwargs):
    real, ours = Real(*args, **kwargs), Ours(*args, **kwargs)
    assert repr(ours) == repr(real)  # both classes are _declare.<locals>.Row
    assert dataclasses.asdict(ours) == dataclasses.asdict(real)
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(real)]
    assert ours == Ours(*args, **kwargs) and ours != Ours("other", 9)
    assert dataclasses.replace(ours, head=7).head == 7 and dataclasses.replace(ours) == ours
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.name = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        del ours.name


def test_a_record_hashes_as_the_dataclass_does():
    @record
    class A:
        """a"""
        x: int
        y: tuple = ()

    @dataclass(frozen=True)
    class B:
        """b"""
        x: int
        y: tuple = ()
    assert hash(A(1, (2,))) == hash(B(1, (2,))) and A(1) != B(1)


@pytest.mark.parametrize("args, kwargs", [((), {}), (("Q", 1, (1, 1), {}, 5), {}), (("Q", 1), {"nope": 1}), (("Q",), {"name": "K"})])
def test_a_wrong_call_is_a_type_error_for_both(args, kwargs):
    for cls in (Real, Ours):
        with pytest.raises(TypeError):
            cls(*args, **kwargs)


def test_formula_nodes_are_values():
    a = F.Rel((F.sym("S"), F.Juxt((F.Sym("Q", "i"), F.Transpose(F.sym("K"))))))
    b = F.Rel((F.sym("S"), F.Juxt((F.Sym("Q", sub="i"), F.Transpose(F.Sym("K"))))))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert F.Sym("a") != F.Word("a") and F.Space() == F.Space() and hash(F.Space()) == hash(())
    assert hash(F.Frac(F.sym("a"), F.sym("b"))) == hash((F.sym("a"), F.sym("b"), False, False, False))
    assert repr(F.Neg(F.Num(2))) == "Neg(of=Num(value=2))"
    assert F.Sym("Q", "i").replace(sub=None) == F.sym("Q")
    assert F.Func("exp", (F.sym("t"),)).field_values() == ("exp", (F.sym("t"),), False, False, ())
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.sides = ()
    for bad in (lambda: F.Sym(), lambda: F.Sym("a", nope=1), lambda: F.Sym("a", name="b"), lambda: F.Num(1, 2)):
        with pytest.raises(TypeError):
            bad()


def test_a_record_built_often_gets_its_own_constructor_that_behaves_the_same():
    from attntrace.model import record as R

    Often = _declare(record)
    for i in range(R.COMPILE_AFTER + 1):
        Often(f"s{i}", i)
    assert "_record_compiled" in Often.__dict__
    for args, kwargs in [(("Q", 1), {}), (("Q",), {"head": 2, "details": {"a": 1}}), ((), {"name": "K", "head": 1, "shape": (4, 4)})]:
        assert dataclasses.asdict(Often(*args, **kwargs)) == dataclasses.asdict(Real(*args, **kwargs))
    assert Often("Q", 1).details is not Often("Q", 1).details  # a fresh default from the factory each time
    for args, kwargs in [((), {}), (("Q", 1, (1, 1), {}, 5), {}), (("Q", 1), {"nope": 1}), (("Q",), {"name": "K"})]:
        with pytest.raises(TypeError):
            Often(*args, **kwargs)
