"""The data every layer shares: Trace, Step, Operand (immutable) and the error types."""
