"""Step kinds: each kind is one unit (id, inputs, computation, formula, template, mistakes)."""
