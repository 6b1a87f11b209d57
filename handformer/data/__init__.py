"""Data: the embedded default tasks, reading user files, and batching. Stands alone: no model code."""
