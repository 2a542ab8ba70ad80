"""The grammar entries and user-text math share; each reader is a back end that builds values.

    expr  := term (("+" | "-") term)*
    term  := unary (("*" | "/") unary)*          no implicit multiplication: 2a, 2(a+1) refused
    unary := ("+" | "-")* power
    power := atom (("^" | "**") unary)?          right-associative, binds tighter than unary
                                                 minus: -2^2 = -4, 2^-1 = 1/2
    atom  := the back end's: numbers, names, infinity, functions, "(" expr ")"

`Parser` walks the tokens of `attntrace.inputs.tokens` by this grammar and calls its back
end, a subclass, as soon as each piece is read: `attntrace.inputs.expr` builds SymPy values
(and refuses a division by zero where it is written, before reading further), and
`attntrace.inputs.usertext` builds a tree it prints as the author wrote it. A sum and a
product are built in three calls (start, add one operand, end), so a back end may fold
them pairwise or keep them as one flat list. Failures are `TokenError`s with a position.
"""

from __future__ import annotations

from typing import Any

from attntrace.inputs.tokens import Token, TokenError


def describe(tok: Token) -> str:
    return "end of input" if tok.kind == "end" else repr(tok.value)


class Parser:
    """Recursive descent over `toks`; a subclass defines `atom` and may override the builders."""

    #: Token kinds that start an atom: one right after a factor is a missing operator.
    ATOM_STARTS: tuple[str, ...] = ("num", "name", "func", "inf", "(")

    def __init__(self, toks: list[Token], max_depth: int) -> None:
        self.toks = toks
        self.i = 0
        self.depth = 0
        self.max_depth = max_depth

    # -- helpers
    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self) -> Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, kind: str, what: str) -> Token:
        tok = self.peek()
        if tok.kind != kind:
            raise TokenError(f"expected {what}, found {describe(tok)}", tok.pos)
        return self.take()

    def enter(self, pos: int) -> None:
        """One level deeper (parentheses, a function's argument, an exponent)."""
        self.depth += 1
        if self.depth > self.max_depth:
            raise TokenError(f"nested too deeply (at most {self.max_depth} levels)", pos)

    def leave(self) -> None:
        self.depth -= 1

    # -- grammar
    def expr(self) -> Any:
        acc = self.sum_start(self.term())
        while self.peek().kind in ("+", "-"):
            op = self.take()
            acc = self.sum_add(acc, op, self.term())
        return self.sum_end(acc)

    def term(self) -> Any:
        acc = self.product_start(self.unary())
        while True:
            tok = self.peek()
            if tok.kind in ("*", "/"):
                self.take()
                acc = self.product_add(acc, tok, self.unary())
            elif tok.kind in self.ATOM_STARTS:
                raise TokenError(f"missing operator before {describe(tok)}", tok.pos,
                                 "implicit multiplication is not allowed; write a*b")
            else:
                return self.product_end(acc)

    def unary(self) -> Any:
        negative, pos = False, self.peek().pos
        while self.peek().kind in ("+", "-"):
            negative ^= self.take().kind == "-"
        operand = self.power()
        return self.negate(operand, pos) if negative else operand

    def power(self) -> Any:
        base = self.atom()
        tok = self.peek()
        if tok.kind != "^":
            return base
        self.take()
        self.enter(tok.pos)
        exponent = self.unary()
        self.leave()
        return self.raise_to(base, exponent, tok.pos)

    # -- the back end
    def atom(self) -> Any:
        raise NotImplementedError

    def sum_start(self, first: Any) -> Any:
        return first

    def sum_add(self, acc: Any, op: Token, right: Any) -> Any:
        raise NotImplementedError

    def sum_end(self, acc: Any) -> Any:
        return acc

    def product_start(self, first: Any) -> Any:
        return first

    def product_add(self, acc: Any, op: Token, right: Any) -> Any:
        raise NotImplementedError

    def product_end(self, acc: Any) -> Any:
        return acc

    def negate(self, x: Any, pos: int) -> Any:
        raise NotImplementedError

    def raise_to(self, base: Any, exponent: Any, pos: int) -> Any:
        raise NotImplementedError
