"""Page budgets of the long reports (issue 22), compiled standalone with xelatex (article / ctexart
at 10pt, as `attntrace run NAME --format tex --standalone`), the page count read from the log's
"Output written on doc.pdf (N pages".

BUDGET is what issue 22 asks; REACHED is what the reports take now, and what this test holds
them to (a report may get shorter, never longer, without changing this table on purpose).
REACHED is within BUDGET everywhere (test_every_budget_is_met keeps it so).
"""

from __future__ import annotations

import re

import pytest

import attntrace

#: name -> pages issue 22 asks for (zh may take one more; every report is within it in both languages now)
BUDGET = {"sentence-4x6": 4, "multihead-output": 5, "gqa-4-query-2-kv": 6, "alibi-causal": 6,
          "backward-2x2": 6, "encoder-block-post-ln": 8, "llama-block-tiny": 8, "rope-yarn-long-context": 4,
          # the longest of the later examples, held to the blocks' budget (10/10 pages before the pages helper's pass)
          "mla-tiny": 8, "gemma2-block-tiny": 8}
#: (name, lang) -> pages now (measured 2026-12-01 with xelatex; before issue 22's changes: 6/8, 9/10, 12/14, 11/13, 7/7,
#: 16/20, 16/19; before the concision pass of the pages helper: 5/5, 6/7, 8/9, 8/9, 6/7, 13/14, 13/15; before the
#: said-once pass (one concat display, no one-key softmax row, one norm entry, shapes said once) and zh at
#: the English 10pt with lines spread 1.2 (ctexart's default 10.5bp and 1.3 took a page more): llama 9/10,
#: encoder 8/9, alibi 6/7, multihead 5/6, online softmax 4/5, backward 5/6 (its later gradients one entry each);
#: before a later head's repeated steps became one paragraph and a block's (latent attention's) report said its
#: products' factors, shapes and norm statistics once: gqa 6/6, encoder 8/8, llama 8/8, mla 10/10, gemma2 10/10)
REACHED = {("sentence-4x6", "en"): 4, ("sentence-4x6", "zh"): 4,
           ("multihead-output", "en"): 5, ("multihead-output", "zh"): 5,
           ("gqa-4-query-2-kv", "en"): 5, ("gqa-4-query-2-kv", "zh"): 5,
           ("alibi-causal", "en"): 6, ("alibi-causal", "zh"): 6,
           ("backward-2x2", "en"): 5, ("backward-2x2", "zh"): 5,
           ("encoder-block-post-ln", "en"): 7, ("encoder-block-post-ln", "zh"): 8,
           ("llama-block-tiny", "en"): 8, ("llama-block-tiny", "zh"): 7,
           ("mla-tiny", "en"): 8, ("mla-tiny", "zh"): 8, ("gemma2-block-tiny", "en"): 8, ("gemma2-block-tiny", "zh"): 8,
           # not in issue 22's list; held at its pages since FlashAttention-2's m(0), l(0), O(0) were written out
           ("online-softmax-4-keys", "en"): 4, ("online-softmax-4-keys", "zh"): 4,
           ("rope-yarn-long-context", "en"): 4, ("rope-yarn-long-context", "zh"): 4}
#: examples whose zh report is at most one page longer than the en one (all of them)
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


def test_every_budget_is_met():
    """Every report of issue 22's list is within its budget in both languages (the table above is
    what the compiled reports are held to)."""
    over = {k: v for k, v in REACHED.items() if k[0] in BUDGET and v > BUDGET[k[0]]}
    assert not over, over
