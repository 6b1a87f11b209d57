"""The order the test files are handed to the two xdist workers: the costliest first.

`--dist loadfile` keeps each file whole on one worker and hands out the files in collection order
(`--no-loadscope-reorder` in pyproject.toml: xdist's own order is by number of tests, which put
files of one or two slow tests, such as the import-memory test or the browser tests, last, and one
worker idled while the other finished them). With the long files first and the short ones last,
whichever worker is free takes the next file, and the two end within a few seconds of each other.
Inside a file the order is unchanged, so its module fixtures are built once."""

from __future__ import annotations

# serial seconds of a file (setup, call and teardown of its tests, `--durations=0`) on the project's
# 2-core machine, measured in a default run; a file not named here counts as 0 and runs after these,
# in collection order. A new file that takes more than ~4 s belongs here.
SECONDS = {
    "test_check.py": 66, "test_check_robust.py": 37, "test_hf_families.py": 28, "test_explorer_browser.py": 25,
    "test_gguf.py": 40, "test_docs.py": 20, "test_playground_browser.py": 20, "test_course.py": 18,
    "test_check_bpe.py": 17, "test_import_memory.py": 8, "test_finetune.py": 16, "test_experiments.py": 15,
    "test_site.py": 14, "test_static_step.py": 14,
    "test_serve_fuzz.py": 13, "test_serve_structured.py": 13, "test_post_sft.py": 12,
    "test_decoding.py": 6, "test_benchmark_baseline.py": 10, "test_lm_training.py": 8, "test_explain.py": 8,
    "test_hf_export.py": 8, "test_distributed.py": 7, "test_hf_import.py": 7, "test_post_distributed.py": 7,
    "test_training.py": 7, "test_speculative.py": 6, "test_crash.py": 6, "test_serve.py": 6,
    "test_check_styles.py": 5, "test_viz.py": 5, "test_check_sampling.py": 5, "test_check_model.py": 5,
    "test_serve_apis.py": 5, "test_serve_soak.py": 4, "test_beam_vectorized.py": 4, "test_lesson_shape.py": 4,
    "test_shards.py": 4, "test_engine.py": 4, "test_references_required.py": 3, "test_int8_c.py": 1,
}


def pytest_collection_modifyitems(session, config, items) -> None:
    """Sort the files by SECONDS, longest first (a stable sort: a file's tests stay together, in order)."""
    items.sort(key=lambda item: -SECONDS.get(item.path.name, 0))
