"""The vocabulary: the op table, the guard and builder registry, value types and the term graph.

The bottom layer: it imports nothing of the project's (see docs/architecture.md)."""
