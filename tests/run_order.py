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
# in collection order. A new file that takes more than ~4 s belongs here. The check files' figures come
# from a run on a machine loaded about ten times over, scaled to the quiet run's 582 s in all; the
# other files keep the larger of that and their figure before (a file that waits on a child process or
# a server slows less under load than one that computes)
SECONDS = {
    "test_check_position_tables.py": 25, "test_check_row_filters.py": 12, "test_check_scale_bound.py": 12,
    "test_check_mask_builders.py": 10, "test_check_not_lm.py": 60, "test_check_own_demo.py": 25,
    "test_check_mask_methods.py": 12, "test_check_config_words.py": 24, "test_check_callable_args.py": 31,
    "test_check.py": 61, "test_check_no_place.py": 5, "test_check_loop_interface.py": 12,
    "test_check_learner_forms.py": 20, "test_check_other_routes.py": 35, "test_check_free_properties.py": 15,
    "test_check_unquoted_fails.py": 26, "test_check_quick_gelu.py": 6, "test_check_mask_by_use.py": 6,
    "test_check_query_first_mask.py": 5, "test_check_loop_settings.py": 18, "test_check_batched_beam.py": 8,
    "test_check_beam_settings.py": 18, "test_check_loop_neutral.py": 17, "test_check_unigram.py": 13,
    "test_check_model_arguments.py": 15, "test_check_text_stream.py": 15, "test_check_query_masks.py": 10,
    "test_check_kto_step.py": 10, "test_check_step_settings.py": 27, "test_check_rl_losses.py": 20,
    "test_check_reordered_rope.py": 7, "test_check_own_calls.py": 5, "test_check_neutral_settings.py": 6,
    "test_check_moe_state.py": 12, "test_check_model_scalars.py": 5, "test_hf_families.py": 24,
    "test_check_by_use.py": 12, "test_course.py": 22, "test_check_configured.py": 21, "test_gguf.py": 20,
    "test_check_robust.py": 17, "test_site.py": 15, "test_check_public_styles.py": 14, "test_finetune.py": 13,
    "test_check_raised_forms.py": 6, "test_check_localize.py": 12, "test_docs.py": 12,
    "test_check_unusual_forms.py": 35, "test_check_config_by_use.py": 10, "test_check_setup_method.py": 16,
    "test_check_styles.py": 11, "test_hf_export.py": 11, "test_serve_fuzz.py": 11,
    "test_check_family_scales.py": 10, "test_check_hf_variants.py": 10, "test_check_layouts.py": 10,
    "test_check_unbatched_families.py": 10, "test_experiments.py": 10, "test_speculative.py": 10,
    "test_viz.py": 10, "test_behaviour.py": 9, "test_check_lossy_cache.py": 20,
    "test_check_arrangements.py": 14, "test_check_speculative.py": 10, "test_check_reward_pair.py": 10,
    "test_check_heads_loop.py": 8, "test_check_unbuilt_classifier.py": 5, "test_decoding.py": 9,
    "test_explain.py": 9, "test_check_components.py": 8, "test_distributed.py": 8, "test_lm_training.py": 8,
    "test_serve_apis.py": 8, "test_serve_structured.py": 8, "test_check_caches_routers.py": 7,
    "test_check_quoted_lines.py": 7, "test_check_windowed.py": 7, "test_import_memory.py": 7,
    "test_playground_browser.py": 7, "test_post_sft.py": 7, "test_beam_vectorized.py": 6,
    "test_benchmark_baseline.py": 6, "test_check_family_masks.py": 6, "test_check_gemma.py": 6,
    "test_check_llm_calls.py": 6, "test_check_model.py": 6, "test_crash.py": 6, "test_engine.py": 6,
    "test_hf_import.py": 6, "test_new_user.py": 6, "test_post_dpo.py": 6, "test_serve.py": 6,
    "test_training.py": 6, "test_check_hand_written.py": 5, "test_check_local_windows.py": 5,
    "test_check_marian.py": 5, "test_explorer_browser.py": 5, "test_check_diverse_beam.py": 5,
    "test_shards.py": 5, "test_check_bpe.py": 4, "test_check_departing_lines.py": 4,
    "test_check_hidden.py": 4, "test_check_quoted.py": 4, "test_check_sampling.py": 4,
    "test_check_shape.py": 4, "test_course_llm.py": 4, "test_lesson_shape.py": 4, "test_llama2c.py": 4,
    "test_post_grpo.py": 4, "test_properties.py": 4, "test_serve_soak.py": 4, "test_static_step.py": 4,
    "test_check_conventions.py": 3, "test_fused_step.py": 3, "test_zh_terms.py": 3,
    "test_check_filter_loops.py": 20, "test_check_penalty_loops.py": 15, "test_check_cache_use.py": 25,
    "test_check_sequence_blocks.py": 10, "test_check_averaged_logps.py": 8, "test_check_by_behaviour.py": 12,
    "test_check_functional.py": 2, "test_vnni_kernels.py": 2, "test_c_kernels.py": 1,
    "test_check_built_by_what.py": 1, "test_check_classifier.py": 1, "test_check_minbpe.py": 1,
    "test_time_limit.py": 3, "test_check_fork_imports.py": 8, "test_check_prefix_tuning.py": 8,
    "test_check_gnmt_beam_zh.py": 9, "test_check_command_r.py": 10, "test_check_rope_schedules.py": 8,
    "test_check_gated_shared_expert.py": 8, "test_check_moe_departs.py": 5, "test_check_head_lines.py": 4,
    "test_check_t5v11.py": 10, "test_check_wsd_forms.py": 10, "test_check_dpo_step.py": 8,
    "test_check_memory_decoder.py": 6, "test_check_fairseq_step.py": 8, "test_check_sft_packing.py": 5,
    "test_check_word_bpe.py": 9, "test_check_global_window.py": 7, "test_check_rope_positions.py": 7,
    "test_check_torch_masks.py": 16, "test_check_ffn_widths.py": 13, "test_check_wrapped_cache.py": 5,
    "test_check_guarded_lines.py": 5, "test_check_helper_lines.py": 3, "test_check_revealing_inputs.py": 15,
    "test_check_sampler_forms.py": 10, "test_check_loop_premise.py": 4, "test_check_partial_forms.py": 33,
    "test_check_parent_state.py": 34, "test_check_capacity_moe.py": 10, "test_check_post_norm_rows.py": 10,
    "test_check_lm_beam.py": 12, "test_check_cached_left_padding.py": 6, "test_check_stacked_gains.py": 16,
    "test_check_prompt_forms.py": 8, "test_check_learned_terms.py": 12, "test_check_sandbox.py": 20,
    "test_check_seeded_steps.py": 4, "test_check_parent_inputs.py": 12, "test_check_built_lines.py": 8,
}


def pytest_collection_modifyitems(session, config, items) -> None:
    """Sort the files by SECONDS, longest first (a stable sort: a file's tests stay together, in order)."""
    items.sort(key=lambda item: -SECONDS.get(item.path.name, 0))
