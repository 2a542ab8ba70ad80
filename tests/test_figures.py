"""Heatmaps of the attention weights: files, labels, formats, refusals, and report links."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import attntrace
from attntrace import BadInput
from attntrace.rendering.figures import write_heatmaps
from attntrace.rendering.renderer import render
from mathcheck import in_ci


@pytest.fixture(autouse=True)
def _matplotlib():
    """matplotlib is the optional extra attntrace[figures]: skip without it, but fail under CI=true."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        if in_ci():
            pytest.fail("matplotlib missing under CI (pip install 'attntrace[figures]')", pytrace=False)
        pytest.skip("matplotlib is not installed (pip install 'attntrace[figures]')")


def test_one_heatmap_with_token_labels_in_every_format(tmp_path):
    trace = attntrace.run("sentence-4x6")
    figs = write_heatmaps(trace, tmp_path / "figs", formats=("svg", "png", "pdf"))
    assert len(figs) == 1 and figs[0]["head"] is None
    paths = figs[0]["paths"]
    assert figs[0]["path"] == paths["svg"] and paths["svg"].name == "sentence-4x6-weights.svg"
    for fmt, magic in (("svg", b"<?xml"), ("png", b"\x89PNG"), ("pdf", b"%PDF")):
        assert paths[fmt].read_bytes()[:5].startswith(magic[:4])
    svg = paths["svg"].read_text(encoding="utf-8")
    for token in ("the", "cat", "sat", "down", "0.42"):
        assert f">{token}<" in svg


def test_same_trace_same_svg(tmp_path):
    trace = attntrace.run("causal-mask")
    a = write_heatmaps(trace, tmp_path / "a")[0]["path"].read_bytes()
    b = write_heatmaps(trace, tmp_path / "b")[0]["path"].read_bytes()
    assert a == b


def test_one_heatmap_per_head(tmp_path):
    figs = write_heatmaps(attntrace.run("multihead-output"), tmp_path)
    assert [f["head"] for f in figs] == [1, 2]
    assert [f["path"].name for f in figs] == ["multihead-output-weights-head1.svg", "multihead-output-weights-head2.svg"]


def test_cross_attention_labels_queries_and_keys(tmp_path):
    svg = write_heatmaps(attntrace.run("cross-attention"), tmp_path)[0]["path"].read_text(encoding="utf-8")
    for token in ("I", "love", "ich", "liebe", "dich"):
        assert f">{token}<" in svg


def test_exact_mode_plots_approximations(tmp_path):
    figs = write_heatmaps(attntrace.run("causal-mask", mode="exact"), tmp_path, formats=("png",))
    assert figs[0]["path"].stat().st_size > 1000


@pytest.mark.parametrize("name", ["symbolic-weights-times-values", "eight-heads-shapes", "concat-two-heads"])
def test_nothing_to_plot_is_bad_input(name, tmp_path):
    with pytest.raises(BadInput, match="no numbers to plot"):
        write_heatmaps(attntrace.run(name), tmp_path)


def test_unknown_format_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="unknown figure format"):
        write_heatmaps(attntrace.run("causal-mask"), tmp_path, formats=("gif",))


def test_without_matplotlib_a_clear_bad_input(tmp_path, monkeypatch):
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(BadInput, match=r"attntrace\[figures\]"):
        write_heatmaps(attntrace.run("causal-mask"), tmp_path)


def test_import_attntrace_does_not_import_matplotlib():
    code = "import sys, attntrace, attntrace.rendering.figures, attntrace.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_report_links_resolve_from_the_output_folder(tmp_path, lang):
    out_dir = tmp_path / "site" / "notes"
    out_dir.mkdir(parents=True)
    output = out_dir / "report.md"
    text = render(attntrace.run("multihead-output"), format="md", lang=lang, figures=tmp_path / "figs", output_path=output)
    output.write_text(text, encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(<?([^)>]+)>?\)", text)
    assert len(links) == 2
    for link in links:
        assert not Path(link).is_absolute()
        assert (out_dir / link).resolve().is_file(), link


def test_cli_run_with_figures(tmp_path, capsys):
    from attntrace import cli

    output = tmp_path / "out" / "sentence.md"
    output.parent.mkdir()
    assert cli.main(["run", "sentence-4x6", "--format", "md", "--figures", str(tmp_path / "img"), "-o", str(output)]) == 0
    text = output.read_text(encoding="utf-8")
    (link,) = re.findall(r"!\[[^\]]*\]\(<?([^)>]+)>?\)", text)
    assert (output.parent / link).resolve().is_file()


def test_standalone_latex_with_figures_compiles(tmp_path, xelatex):
    """LaTeX reports get PDF heatmaps (\\includegraphics cannot read SVG) and still compile."""
    out = tmp_path / "notes" / "report.tex"
    out.parent.mkdir()
    tex = render(attntrace.run("multihead-output"), format="tex", standalone=True, figures=tmp_path / "notes" / "fig", output_path=out)
    refs = re.findall(r"\\includegraphics(?:\[[^]]*\])?\{([^}]*)\}", tex)
    assert len(refs) == 2 and all(r.endswith(".pdf") and (out.parent / r).is_file() for r in refs), refs
    src = tex.replace("{fig/", "{" + str(out.parent / "fig") + "/")  # the compile runs in its own folder
    ok, log, _ = xelatex(src)
    assert ok, log
