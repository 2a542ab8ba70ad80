"""The `attntrace` command: run, check, examples, exercise.

Bad input ends with one line on standard error and exit status 2, never a traceback.
`check` exits 0 when every given step is right and 1 when something is wrong.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

from attntrace.model.errors import AttntraceError, BadInput

RUN_FORMATS = ("text", "md", "tex", "json", "html")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit status 2."""

    def error(self, message: str) -> None:  # noqa: D102
        raise BadInput(message)


def _add_render_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lang", choices=("en", "zh"), default="en", help="language of the prose (math is identical)")
    p.add_argument("--precision", type=int, default=None, help="decimal places shown (default 4, trailing zeros trimmed)")
    p.add_argument("--standalone", action="store_true", help="LaTeX: a complete document instead of a fragment to \\input")
    p.add_argument("--template-dir", type=Path, default=None, help="folder whose templates override the built-in ones")
    p.add_argument("--math-delimiters", choices=("dollars", "brackets"), default="dollars", help="Markdown: $$..$$ or \\[..\\]")
    p.add_argument("--max-size", type=int, default=None, help="rows/columns shown before eliding with dots (default 8)")
    p.add_argument("--figures", type=Path, default=None, help="write attention heatmaps into this folder and reference them")
    p.add_argument("--width", default=None,
                   help="page width the equations must fit: 345pt (LaTeX default), 760px (Markdown default), 12cm, 100ch (text), "
                        "or a target: article, beamer, mkdocs, sphinx, jupyter, github")
    p.add_argument("--rows", default=None, help="rows expanded entry by entry: 1,3 or all (default: row 1; softmax: rows 1-4)")
    p.add_argument("--fragment", action="store_true", help="HTML: a <div> to paste into a page instead of a whole page")
    p.add_argument("-o", "--output", type=Path, default=None, help="write to FILE instead of standard output")


#: The commands, in the order `attntrace --help` lists them.
COMMANDS = ("run", "check", "examples", "exercise")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With `command` (the command the arguments name), only that
    command's options are declared: the others are listed, with their help, but not filled in
    (argparse spends ~0.1 ms on each of their 60 options, at every start)."""
    parser = _Parser(prog="attntrace", description="Transformer attention, traced step by step.")
    from attntrace.version import __version__

    parser.add_argument("--version", action="version", version=f"attntrace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    full = command not in COMMANDS

    run = sub.add_parser("run", help="trace a spec (a TOML/JSON file or a built-in example's name)")
    if full or command == "run":
        _add_run_options(run)
    check = sub.add_parser("check", help="check a hand calculation against the trace")
    if full or command == "check":
        _add_check_options(check)
    sub.add_parser("examples", help="list the built-in examples")
    ex = sub.add_parser("exercise", help="generate an exercise: worksheet and answer key")
    if full or command == "exercise":
        _add_exercise_options(ex)
    return parser


def _add_run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("spec")
    run.add_argument("--mode", choices=("numeric", "exact", "symbolic", "shape"), default=None)
    run.add_argument("--format", choices=RUN_FORMATS, default="text")
    run.add_argument("--expand", choices=("named", "full"), default=None, help="symbolic: name each step's entries (default) or expand fully")
    run.add_argument("--backward", action="store_true",
                     help="add the backward pass: the spec's backward table, else the loss sum of squares of the output")
    run.add_argument("--keep", default=None, help="record only these steps (ids or keys, comma-separated), e.g. weights,output")
    _add_render_options(run)


def _add_check_options(check: argparse.ArgumentParser) -> None:
    check.add_argument("spec")
    check.add_argument("answer", nargs="+", help="answer file; several files or a folder of .toml/.json answers grade a class")
    check.add_argument("--mode", choices=("numeric", "exact"), default=None)
    check.add_argument("--format", choices=("text", "md", "tex", "json", "csv", "html"), default="text",
                       help="csv and json of a class: the summary only (csv: one row per student)")
    check.add_argument("--summary-only", action="store_true", help="a class: the summary without each student's report")
    check.add_argument("--weights", default=None, help="a class: step weights of the score, e.g. weights=2,Q=0 (default 1 each)")
    check.add_argument("--decimals", type=int, default=None,
                       help="every entry must be right to N decimals (default: each number to the decimals it is written with)")
    check.add_argument("--atol", type=float, default=None, help="right when |yours - true| <= atol + rtol |true|")
    check.add_argument("--rtol", type=float, default=None)
    check.add_argument("--jobs", type=int, default=None,
                       help="a class: grade in this many processes (default: the number of cores)")
    _add_render_options(check)


def _add_exercise_options(ex: argparse.ArgumentParser) -> None:
    ex.add_argument("--n", type=int, default=2, help="sequence length")
    ex.add_argument("--d", type=int, default=4, help="model width; each head gets d_k = d / heads columns (d_k = 1 or 4 keeps sqrt(d_k) whole)")
    ex.add_argument("--heads", type=int, default=1)
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--format", choices=("md", "tex", "moodle", "qti", "numbas"), default="md",
                    help="worksheet (md, tex), or a quiz: moodle (Moodle XML), qti (QTI 1.2 zip for Canvas, needs -o), "
                         "numbas (a Numbas .exam with error carried forward)")
    ex.add_argument("--variants", type=int, default=1, help="moodle/qti/numbas: this many seeded variants (seed, seed + 1, ...)")
    ex.add_argument("--key", action="store_true", help="print the answer key instead of the worksheet")
    ex.add_argument("--spec-out", type=Path, default=None, help="also write the problem's spec (TOML) here")
    ex.add_argument("--answer-out", type=Path, default=None, help="also write the answer key as an answer file (TOML) here")
    _add_render_options(ex)


def _render_options(args) -> dict:
    opts = {"lang": args.lang, "standalone": args.standalone, "template_dir": args.template_dir,
            "math_delimiters": args.math_delimiters, "figures": args.figures}
    if args.precision is not None:
        opts["precision"] = args.precision
    if args.max_size is not None:
        opts["max_size"] = args.max_size
    if args.output is not None:
        opts["output_path"] = args.output
    if args.width is not None:
        opts["width"] = args.width
    if args.rows is not None:
        opts["rows"] = args.rows
    if getattr(args, "fragment", False):
        if getattr(args, "format", None) != "html":
            raise BadInput("--fragment needs --format html")
        opts["fragment"] = True
    return opts


def _write_stream(stream, text: str, is_json: bool = False) -> None:
    """Write to a terminal or pipe whose encoding may lack some characters: those become '?'
    (\\u escapes on standard error and in JSON, which stays valid JSON) instead of a
    UnicodeEncodeError."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        if is_json:  # characters the encoding lacks occur only inside strings: \\u escapes
            text = "".join(c if _encodable(c, encoding) else json.dumps(c)[1:-1] for c in text)
        else:
            errors = "backslashreplace" if stream is sys.stderr else "replace"
            text = text.encode(encoding, errors).decode(encoding, "replace")
        stream.write(text)


def _encodable(c: str, encoding: str) -> bool:
    try:
        c.encode(encoding)
        return True
    except (UnicodeEncodeError, LookupError):
        return False


def _json(data) -> str:
    """JSON for standard output or a file: the characters json leaves raw that must not reach
    a terminal (DEL, C1 controls, bidi formatting, lone surrogates) written as \\u escapes."""
    from attntrace.inputs.safetext import json_safe

    return json_safe(json.dumps(data, ensure_ascii=False, indent=1))


def _emit(text: str, output: Path | None, is_json: bool = False) -> None:
    """Write a report: no control or bidi character and no lone surrogate ever reaches the
    output (the escapers have cleaned user text; this is the last line of defence; JSON has
    them as \\u escapes already, see `_json`)."""
    from attntrace.inputs.safetext import clean_output

    text = clean_output(text)
    if not text.endswith("\n"):
        text += "\n"
    if output is None:
        _write_stream(sys.stdout, text, is_json)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"cannot write {str(output)!r}: {exc.strerror or type(exc).__name__}") from None


class _Stream:
    """A report written piece by piece (a class graded answer by answer), to standard output
    or to a file (opened at the first piece, so a bad spec leaves no file), each piece
    cleaned as `_emit` cleans a whole report; it ends with a newline."""

    def __init__(self, output: Path | None):
        self.output, self.file, self.last = output, None, "\n"

    def __enter__(self) -> "_Stream":
        return self

    def write(self, text: str, is_json: bool = False) -> None:
        from attntrace.inputs.safetext import clean_output, json_safe

        if not text:
            return
        text = clean_output(json_safe(text) if is_json else text)
        self.last = text[-1:]
        if self.output is None:
            _write_stream(sys.stdout, text, is_json)
            return
        try:
            if self.file is None:
                self.file = open(self.output, "w", encoding="utf-8")
            self.file.write(text)
        except OSError as exc:
            raise BadInput(f"cannot write {str(self.output)!r}: {exc.strerror or type(exc).__name__}") from None

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if exc is None and self.last != "\n":
                self.write("\n")
        finally:
            if self.file is not None:
                self.file.close()


def cmd_run(args) -> int:
    from attntrace.tracer import trace_spec

    trace = trace_spec(args.spec, mode=args.mode, expand=args.expand, backward=True if args.backward else None, keep=args.keep)
    if args.format == "json":
        text = _json(trace.to_dict())
    else:
        from attntrace.rendering.formats import render

        text = render(trace, format=args.format, **_render_options(args))
    _emit(text, args.output, args.format == "json")
    return 0


def cmd_check(args) -> int:
    from attntrace.teach.classcheck import class_command, wants_class

    if wants_class(args):  # several answers, a folder, csv, --summary-only, --weights or --jobs: a class
        if args.format == "html":  # the class report's Markdown as a page (summary and each student)
            from attntrace.rendering.html import markdown_page

            opts = _render_options(args)
            fragment = opts.pop("fragment", False)
            args.format = "md"
            parts: list[str] = []
            ok = class_command(args, opts, lambda text, is_json=False: parts.append(text))
            text = "".join(parts)
            title = next((line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")), "attntrace")
            _emit(markdown_page(text, args.lang, title, fragment=fragment, template_dir=args.template_dir), args.output)
            return 0 if ok else 1
        with _Stream(args.output) as stream:
            ok = class_command(args, _render_options(args), stream.write)
        return 0 if ok else 1
    from attntrace.grading.checker import check

    report = check(args.spec, args.answer[0], mode=args.mode, atol=args.atol, rtol=args.rtol, decimals=args.decimals,
                   lang=args.lang)
    if args.format == "json":
        text = _json(report.to_dict())
    elif args.format == "html":
        from attntrace.grading.htmlreport import check_html

        opts = _render_options(args)
        text = check_html(report, args.answer[0], lang=args.lang, fragment=opts.pop("fragment", False),
                          **{k: v for k, v in opts.items() if k in ("precision", "max_size", "template_dir")})
    else:
        from attntrace.grading.checker import render_report

        text = render_report(report, format=args.format, **_render_options(args))
    _emit(text, args.output, args.format == "json")
    return 0 if report.ok else 1


def cmd_examples(args) -> int:
    from attntrace.teach.examples import list_examples

    _write_stream(sys.stdout, "".join(f"{name:28s} {summary}\n" for name, summary in list_examples()))
    return 0


def _write(path: Path, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {str(path)!r}: {exc.strerror or type(exc).__name__}") from None


def cmd_exercise(args) -> int:
    """`attntrace exercise`: print the worksheet (or with --key the answer key); write spec/answers;
    --format moodle / qti: a quiz of --variants seeded variants (see attntrace.teach.lms)."""
    from attntrace.teach.answerkey import answer_key, to_toml
    from attntrace.teach.exercise import make_exercise
    from attntrace.teach.worksheet import render_worksheet

    render_options = _render_options(args)
    if args.format in ("moodle", "qti", "numbas"):
        return _exercise_quiz(args, render_options)
    spec, trace = make_exercise(args.n, args.d, args.heads, args.seed)
    if args.spec_out is not None:
        _write(args.spec_out, "# " + spec["description"] + "\n" + to_toml(spec))
    if args.answer_out is not None:
        _write(args.answer_out, f"# answer key of: {spec['title']}\n" + to_toml(answer_key(trace)))
    options = dict(render_options)
    if args.key:
        from attntrace.rendering.formats import render

        text = render(trace, format=args.format, **options)
    else:
        text = render_worksheet(spec, trace, format=args.format, lang=options.get("lang", "en"),
                                standalone=bool(options.get("standalone")), template_dir=options.get("template_dir"),
                                math_delimiters=options.get("math_delimiters", "dollars"))
    _emit(text, options.get("output_path"))
    return 0


def _exercise_quiz(args, options: dict) -> int:
    """`attntrace exercise --format moodle|qti`: the quiz of a learning-management system."""
    from attntrace.teach import lms

    if args.key or args.spec_out is not None or args.answer_out is not None:
        raise BadInput(f"--format {args.format} writes a quiz with its answers: --key, --spec-out and --answer-out do not apply")
    variants = lms.make_variants(args.n, args.d, args.heads, args.seed, getattr(args, "variants", None) or 1)
    lang, template_dir, output = options.get("lang", "en"), options.get("template_dir"), options.get("output_path")
    if args.format == "moodle":
        _emit(lms.moodle_xml(variants, lang, template_dir), output)
        return 0
    if args.format == "numbas":
        from attntrace.teach import numbas

        _emit(numbas.exam_text(variants, lang, template_dir), output)
        return 0
    if output is None:
        raise BadInput("--format qti writes a zip package: give -o FILE.zip")
    data = lms.qti_package(variants, lang, template_dir)
    try:
        Path(output).write_bytes(data)
    except OSError as exc:
        raise BadInput(f"cannot write {str(output)!r}: {exc.strerror or type(exc).__name__}") from None
    return 0


def _error(message: str) -> None:
    """One line on standard error: newlines, control and bidi characters in the message (a
    file name, a title quoted back) shown as escapes."""
    from attntrace.inputs.safetext import one_line

    _write_stream(sys.stderr, f"attntrace: {one_line(message)}\n")


def _exit_now(code: int) -> None:
    """End a finished `run` process here, its output flushed, without the interpreter's
    teardown: clearing every module and freeing every object one by one costs a sentence
    report about 6 ms of its ~125 ms (the operating system frees the memory at once), as mypy
    ends with `hard_exit`. `run` writes its report and closes its output file before this, and
    registers no exit handler (no pool, no temporary folder), so nothing is skipped; `check`
    and `exercise` end as usual. A reader that left the pipe early: exit 1, as below."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        code = 1
    except OSError:  # a full disk or a closed standard output: let the usual exit report it
        return
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """The command line; `argv` None: the process's own arguments, as the `attntrace` script and
    `python -m attntrace` call it. Then the cyclic garbage collector stays off until exit: a
    command is one short process whose objects mostly live until exit (modules, templates,
    the trace), so collections would walk them again and again for little garbage (17M of the
    sentence report's instructions; peak memory of the block, exact and symbolic examples
    unchanged). At the end everything is frozen (`gc.freeze`), so the interpreter's collection
    at exit skips it too (35M instructions); exit handlers, file closing and flushing run as
    before, except after a finished `run`, which flushes and ends at once (`_exit_now`). A
    caller that passes `argv` (tests, scripts) keeps its own setting and gets the exit code back."""
    process = argv is None
    if process:
        gc.disable()
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        handler = {"run": cmd_run, "check": cmd_check, "examples": cmd_examples, "exercise": cmd_exercise}[args.command]
        code = handler(args)
        if process and args.command == "run":
            _exit_now(code)
        return code
    except AttntraceError as exc:
        _error(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:  # `attntrace run ... | head`: the reader left; nothing to say
        try:
            sys.stdout = open(os.devnull, "w")  # the interpreter's final flush must not fail again
        except OSError:
            pass
        return 1
    except MemoryError:
        _error("error: out of memory: the input is too large for this machine's memory limit")
        return 2
    except Exception as exc:  # noqa: BLE001 - a one-line report, not a traceback
        _error(f"internal error ({type(exc).__name__}): {exc}; please report it")
        return 3
    finally:
        if process:
            gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
