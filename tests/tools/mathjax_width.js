#!/usr/bin/env node
// Typeset TeX spans with real MathJax (4.x, TeX input, SVG output) and report their widths,
// all in one process. MathJax gives an SVG's width in ex of the surrounding text: a page
// shows it at width_ex times its font's ex height in px (CHTML output scales to the same ex).
//
// stdin : JSON array of {"tex": string, "display": bool}
// stdout: JSON array, same order, of {"width_ex": number|null, "error": string|null}
//
// No noerrors/noundefined packages: a TeX error is reported (formatError throws), never typeset
// as red text. mathjax is resolved from the repository's node_modules.
"use strict";

const path = require("path");

const root = process.env.KATEX_NODE_MODULES ? path.dirname(process.env.KATEX_NODE_MODULES) : path.resolve(__dirname, "..", "..");
const MathJax = require(require.resolve("mathjax/node-main.cjs", { paths: [root] }));

let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", async () => {
  const spans = JSON.parse(input);
  const MJ = await MathJax.init({
    loader: { load: ["input/tex", "output/svg"] },
    tex: { packages: { "[-]": ["noerrors", "noundefined"] }, formatError: (jax, err) => { throw err; } },
  });
  const out = [];
  for (const s of spans) {
    try {
      const node = await MJ.tex2svgPromise(s.tex, { display: s.display });
      const html = MJ.startup.adaptor.outerHTML(node);
      const m = html.match(/<svg[^>]*\swidth="([0-9.]+)ex"/);
      out.push({ width_ex: m ? parseFloat(m[1]) : null, error: m ? null : "no width" });
    } catch (e) {
      out.push({ width_ex: null, error: String(e && e.message ? e.message : e) });
    }
  }
  process.stdout.write(JSON.stringify(out));
});
