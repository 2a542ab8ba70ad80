"""The four modes (numeric, exact, symbolic, shape) behind one interface, and exact forms."""
