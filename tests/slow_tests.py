"""The tests `pytest -m "not slow"` leaves out: each took 0.4 s or more on
two shared cores (child interpreters, threads, compilers, hypothesis state
machines, bisections over real traces), so the rest runs in under a minute.
conftest.py marks them; tests/project/test_slow_list.py checks every entry still
names a test.  A new slow test: add it here, or mark it @pytest.mark.slow."""

# every test of these files
SLOW_FILES = {
    "tests/core/test_embedding.py",
    "tests/core/test_stateful.py",
    "tests/device/test_device_properties.py",
    "tests/device/test_sleep_model.py",
    "tests/tools/test_cli.py",
}

# these tests (every parameter of each)
SLOW_TESTS = {
    "tests/core/test_core_faults.py::test_fork_during_gil_free_batch_calls_and_check",
    "tests/core/test_thread_caches.py::test_device_caches_serve_gil_free_threads_exactly",
    "tests/core/test_thread_caches.py::test_device_caches_survive_reset_and_close_under_gil_free_callers",
    "tests/core/test_threads.py::test_batches_racing_resets_return_only_live_blocks_and_let_others_in",
    "tests/core/test_threads.py::test_check_while_other_threads_allocate_is_never_a_false_alarm",
    "tests/core/test_threads.py::test_eight_threads_fifty_thousand_ops_each_with_cross_thread_frees",
    "tests/core/test_threads.py::test_leaked_blocks_are_reported_when_a_pool_goes",
    "tests/core/test_threads.py::test_leaked_device_blocks_are_reported",
    "tests/core/test_threads.py::test_no_warning_for_a_clean_pool",
    "tests/core/test_threads.py::test_threads_allocate_with_streams_while_others_reset_walk_and_trim",
    "tests/device/test_device_faults.py::test_a_constructor_that_fails_half_way_gives_back_what_it_took",
    "tests/device/test_device_faults.py::test_a_device_in_a_reference_cycle_gives_its_memory_back",
    "tests/device/test_device_faults.py::test_a_view_keeps_its_device_memory_mapped",
    "tests/device/test_device_faults.py::test_debug_guard_bytes_on_a_paged_device_with_sleeping_blocks",
    "tests/device/test_device_faults.py::test_garbage_collection_inside_a_walk_cannot_deadlock",
    "tests/device/test_device_faults.py::test_reset_and_close_while_raw_callers_run",
    "tests/device/test_device_faults.py::test_what_a_device_gives_back_when_collected_is_out_of_the_collectors_reach",
    "tests/device/test_paged.py::test_a_closed_paged_device_never_touches_its_old_range",
    "tests/device/test_paged.py::test_paged_device_gives_pages_back_to_the_os",
    "tests/device/test_paged.py::test_paged_device_unmapped_memory_is_inaccessible",
    "tests/device/test_paged.py::test_physical_efficiency_of_the_real_traces",
    "tests/device/test_paged.py::test_placement_model_shows_the_worst_moment",
    "tests/device/test_runtime_faults.py::test_a_device_collected_without_close_destroys_its_stream_events",
    "tests/device/test_runtime_faults.py::test_a_runtime_call_that_raises_is_a_refusal",
    "tests/device/test_runtime_faults.py::test_an_acl_device_in_a_fork_child_never_calls_the_runtime",
    "tests/device/test_sleep.py::test_sleep_and_wake_count_their_own_granules_while_raw_callers_allocate",
    "tests/device/test_sleep.py::test_sleep_and_wake_keep_addresses_and_contents",
    "tests/device/test_sleep.py::test_sleep_gives_memory_back_past_the_release_threshold",
    "tests/device/test_upstream.py::TestGrowingPool",
    "tests/dropin/test_host_and_acl.py::test_a_block_with_live_views_cannot_be_freed",
    "tests/dropin/test_host_and_acl.py::test_debug_mode_reports_an_overrun_at_free",
    "tests/dropin/test_host_and_acl.py::test_dropin_default_device_from_the_environment",
    "tests/dropin/test_host_and_acl.py::test_example_media_to_inference_runs",
    "tests/pytorch/test_snapshot.py::test_rendered_by_torch_memory_viz",
    "tests/tools/test_plan.py::test_the_command_table_json_and_plot",
    "tests/tools/test_raw_cann.py::test_ascmem_packs_below_raw_calls_on_a_small_block_workload",
    "tests/tools/test_raw_cann.py::test_replay_json_has_the_raw_figure",
    "tests/tools/test_torch_caching.py::test_a_replay_and_fit_through_it",
    "tests/traces/test_trace.py::test_efficiency_on_a_real_trace_beats_best_fit_and_tlsf",
    "tests/traces/test_trace_columns.py::test_the_fast_path_reads_what_the_csv_reader_reads",
    "tests/traces/test_trace_faults.py::test_fit_resolution_must_be_positive",
    "tests/traces/test_trace_import.py::test_cli_replays_a_chrome_trace",
    "tests/traces/test_trace_import.py::test_real_profiler_trace_from_torch",
}
