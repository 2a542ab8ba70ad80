"""Page budgets of the long reports (issue 22), compiled standalone with xelatex (article / ctexart
at 10pt, as `attntrace run NAME --format tex --standalone`), the page count read from the log's
"Output written on doc.pdf (N pages".

BUDGET is what issue 22 asks; REACHED is what the reports take now, and what this test holds
them to (a report may get shorter, never longer, without changing this table on purpose).
Where REACHED is above BUDGET the budget is not met yet: the difference is the work left.
"""

from __future__ import annotations

import re

import pytest

import attntrace

#: name -> pages issue 22 asks for (zh may take one more)
BUDGET = {"sentence-4x6": 4, "multihead-output": 5, "gqa-4-query-2-kv": 6, "alibi-causal": 6,
          "backward-2x2": 6, "encoder-block-post-ln": 8, "llama-block-tiny": 8}
#: (name, lang) -> pages now (measured 2026-12-01; before issue 22's changes: 6/8, 9/10, 12/14, 11/13, 7/7, 16/20, 16/19)
REACHED = {("sentence-4x6", "en"): 5, ("sentence-4x6", "zh"): 5,
           ("multihead-output", "en"): 6, ("multihead-output", "zh"): 7,
           ("gqa-4-query-2-kv", "en"): 8, ("gqa-4-query-2-kv", "zh"): 9,
           ("alibi-causal", "en"): 8, ("alibi-causal", "zh"): 9,
           ("backward-2x2", "en"): 6, ("backward-2x2", "zh"): 7,
           ("encoder-block-post-ln", "en"): 13, ("encoder-block-post-ln", "zh"): 14,
           ("llama-block-tiny", "en"): 13, ("llama-block-tiny", "zh"): 15,
           # not in issue 22's list; held at its pages before FlashAttention-2's m(0), l(0), O(0) were written out
           ("online-softmax-4-keys", "en"): 5, ("online-softmax-4-keys", "zh"): 5}
#: examples whose zh report is at most one page longer than the en one (all but llama-block-tiny)
ZH_WITHIN_ONE = [n for n in BUDGET if REACHED[(n, "zh")] <= REACHED[(n, "en")] + 1]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    import mathcheck

    mathcheck.require_tool("xelatex")
    workdir = tmp_path_factory.mktemp("budgets")
    counted: dict[tuple[str, str], int] = {}

    def count(name: str, lang: str) -> int:
        if (name, lang) not in counted:
            tex = attntrace.render(attntrace.run(name), format="tex", lang=lang, standalone=True)
            ok, log_tail, pdf = mathcheck.compile_latex(tex, workdir=workdir)
            assert ok, (name, lang, log_tail)
            log = pdf.with_suffix(".log").read_text(encoding="utf-8", errors="replace")
            counted[(name, lang)] = int(re.search(r"Output written on \S+ \((\d+) pages?", log).group(1))
        return counted[(name, lang)]

    return count


@pytest.mark.parametrize("name,lang", sorted(REACHED))
def test_report_stays_within_its_pages(name, lang, pages):
    assert pages(name, lang) <= REACHED[(name, lang)], f"{name} {lang}: {pages(name, lang)} pages (budget {BUDGET.get(name)})"


@pytest.mark.parametrize("name", ZH_WITHIN_ONE)
def test_chinese_at_most_one_page_more(name, pages):
    assert pages(name, "zh") <= pages(name, "en") + 1
