#!/usr/bin/env node
// Parse TeX spans with real KaTeX, all in one process.
//
// stdin : JSON array of {"tex": string, "display": bool}
// stdout: JSON array, same order, of {"ok": bool, "error": string|null, "warnings": [string]}
//
// Each span goes through katex.renderToString(tex, {throwOnError: true, displayMode}).
// Strict-mode findings (KaTeX's default strict level is "warn") are collected as warnings,
// not errors: they do not make a span fail.
//
// katex is resolved from the repository's node_modules (two levels up), or from the
// folder named by the KATEX_NODE_MODULES environment variable.
"use strict";

const path = require("path");
const fs = require("fs");

function loadKatex() {
  const roots = [];
  if (process.env.KATEX_NODE_MODULES) roots.push(path.dirname(process.env.KATEX_NODE_MODULES));
  roots.push(path.resolve(__dirname, "..", ".."));
  for (const root of roots) {
    try {
      return require(require.resolve("katex", { paths: [root] }));
    } catch (e) {
      // try the next root
    }
  }
  process.stderr.write(
    "katex_check: cannot find the katex package under " + roots.join(", ") +
      " (run: bash scripts/install-test-deps.sh)\n"
  );
  process.exit(3);
}

const katex = loadKatex();
const spans = JSON.parse(fs.readFileSync(0, "utf8"));
if (!Array.isArray(spans)) {
  process.stderr.write("katex_check: stdin must be a JSON array\n");
  process.exit(2);
}

const results = spans.map((span) => {
  const warnings = [];
  try {
    katex.renderToString(String(span.tex), {
      throwOnError: true,
      displayMode: Boolean(span.display),
      strict: (errorCode, errorMsg) => {
        warnings.push(errorCode + ": " + errorMsg);
        return "ignore";
      },
    });
    return { ok: true, error: null, warnings };
  } catch (e) {
    return { ok: false, error: e && e.message ? e.message : String(e), warnings };
  }
});

process.stdout.write(JSON.stringify({ version: katex.version, results }));
