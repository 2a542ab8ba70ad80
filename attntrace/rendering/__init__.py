"""Trace -> Markdown, LaTeX or text: view model, page layout, math printing, figures, JSON."""
