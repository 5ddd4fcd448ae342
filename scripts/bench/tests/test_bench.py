"""`make bench` end to end at toy size: real trainer and peer processes, then results.json and the chart.

No timing assertions: throughput on a shared CI machine proves nothing; the
structure and the chart are what a user reads.
"""

from __future__ import annotations

import json

import pytest

from scripts.bench import async_modes
from scripts.bench.tests.bench_runs import PNG_SIGNATURE, TINY, TINY_ASYNC, run_bench

VARIANTS = ("trainer_one_process", "trainer_two_workers", "peer_two_workers")


def test_an_odd_global_batch_is_refused_with_the_fix():
    result = run_bench("--global-batch-size", "3", timeout=60)
    assert result.returncode == 2
    assert "--global-batch-size must be an even number" in result.stderr


def test_too_few_steps_for_the_warm_up_is_refused_with_the_fix():
    result = run_bench("--steps", "20", "--warmup-steps", "16", timeout=60)
    assert result.returncode == 2
    assert "raise --steps or lower --warmup-steps" in result.stderr


def check_async_phase(phase: dict, stdout: str) -> None:
    """The async phase's records after one round of TINY_ASYNC (its flags' checks: test_bench_async.py)."""
    assert phase["config"]["per_worker_batch_size"] == 16 and phase["config"]["ps_tasks"] == 1
    assert phase["config"]["straggler"]["replica"] == "worker-1"
    assert "--strategy" in phase["config"]["commands"]["async"]
    assert set(phase["variants"]) == set(async_modes.VARIANTS)
    for name, variant in phase["variants"].items():
        (run,) = variant["runs"]
        assert run["processes"] == (4 if "async" in name else 2)
        assert run["examples_trained"] == 512 * 2  # the same examples in both modes
        assert run["examples_per_second"] > 0 and 0 <= run["test_accuracy"] <= 1
        assert [evaluation["epoch"] for evaluation in run["evaluations"]] == [1, 2]
        assert run["evaluations"][-1]["test_accuracy"] == pytest.approx(run["test_accuracy"], abs=1e-4)
        assert 0 < run["evaluations"][0]["seconds"] < run["evaluations"][1]["seconds"] < run["wall_seconds"]
        assert all(seconds >= 0 for seconds in [run["cpu_seconds"], run["background_cpu_share"]])
    for ratio in phase["ratios"].values():
        assert ratio["of_medians"] > 0 and len(ratio["per_round"]) == 1
    for figures in phase["accuracy_after_same_wall_time"].values():
        assert figures["seconds"]["median"] > 0
        assert any(accuracy is not None for accuracy in figures["test_accuracy"].values())
    assert "async straggler over async" in stdout and "after the same wall time" in stdout


@pytest.mark.slow
def test_a_tiny_bench_writes_results_with_the_async_phase_and_a_png_chart(tmp_path):
    # One round (the rounds' order is run_rounds' loop): every phase but the links' and the serving's, which their
    # own files run (test_bench_links.py alone makes network namespaces).
    result = run_bench(
        "--repeats",
        "1",
        *TINY,
        *TINY_ASYNC,
        "--workers",
        "2",
        "--no-links",
        "--no-serving",
        "--output-dir",
        str(tmp_path),
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    results = json.loads((tmp_path / "results.json").read_text())
    assert results["config"]["global_batch_size"] == 16
    assert results["config"]["per_worker_batch_size_two_workers"] == 8
    assert results["machine"]["logical_cpus"] >= 1 and results["machine"]["cpu_model"]
    assert results["versions"]["keras"] and results["versions"]["tf-keras"]
    for name in VARIANTS:
        variant = results["variants"][name]
        assert [run["round"] for run in variant["runs"]] == [0]
        for run in variant["runs"]:
            assert run["workers"] == variant["workers"]
            assert run["global_batch_size"] == 16
            assert len(run["peak_rss_bytes"]) == variant["workers"]
            assert all(rss > 0 for rss in run["peak_rss_bytes"])
            assert run["examples_per_second"] > 0 and run["time_to_first_step_seconds"] > 0
        summary = variant["summary"]["examples_per_second"]
        assert summary["min"] <= summary["median"] <= summary["max"]
        assert len(summary["values"]) == 1
    for ratio in ("two_workers_over_one_process", "trainer_over_peer"):
        assert results["ratios"][ratio]["of_medians"] > 0
        assert len(results["ratios"][ratio]["per_round"]) == 1
    inputs = results["input"]
    assert [run["round"] for run in inputs["runs"]["input_pipeline"]] == [0]
    assert all(run["shard_files"] == "its own 4 of 8 files" for run in inputs["runs"]["input_pipeline"])
    assert all(run["workers"] == 2 for run in inputs["runs"]["trainer_on_files"])
    assert inputs["input_pipeline_examples_per_second"]["median"] > 0
    assert inputs["step_examples_per_second_per_worker"]["median"] > 0
    assert inputs["input_over_step"]["of_medians"] > 0 and len(inputs["input_over_step"]["per_round"]) == 1
    assert "input/step" in result.stdout
    assert {target["key"] for target in results["targets"]} == {
        "two_workers_over_one_process",
        "time_to_first_step_seconds",
        "first_step_after_group_formed_seconds",
        "exit_seconds",
        "peak_rss_bytes",
        "input_over_step",
    }
    assert all(isinstance(target["met"], bool) for target in results["targets"])
    for name in ("trainer_one_process", "trainer_two_workers"):
        for run in results["variants"][name]["runs"]:
            in_time_order = sorted(run["startup_seconds"], key=run["startup_seconds"].get)
            assert in_time_order == [
                "tensorflow_imported",
                "group_formed",
                "model_restored",
                "input_ready",
                "first_step",
            ]
            assert run["exit_seconds"] >= 0
    costs = results["step_costs"]
    assert costs["ms_per_step"]["collective_ops_in_the_step_function"] >= 1
    assert all(costs["ms_per_step"][part] > 0 for part in ("compute_alone", "allreduce_model", "trainer"))
    assert set(costs["breakdown_ms"]) == {"compute", "allreduce_transfer", "wait_and_handoffs", "input"}
    efficiency = costs["scaling_model"]["efficiency_by_workers"]
    assert list(efficiency) == ["2", "4", "8", "16", "64"]
    assert all(0 < e <= 1 for e in efficiency.values()) and efficiency["2"] >= efficiency["64"]
    assert "two workers' step, ms" in result.stdout and "predicted efficiency" in result.stdout
    assert [row["workers"] for row in results["sweep"]] == [1, 2]
    assert "links" not in results and "serving" not in results
    assert results["sweep"][0]["scaling_efficiency"] == pytest.approx(1.0)

    check_async_phase(results["async"], result.stdout)

    chart = (tmp_path / "bench.png").read_bytes()
    assert chart.startswith(PNG_SIGNATURE) and len(chart) > 10_000
    assert not list(tmp_path.glob("*.tmp"))


def test_trainer_flags_go_after_the_double_dash_and_the_trainers_parser_checks_them():
    result = run_bench("--repeats", "1", "--", "--steps-per-loop", "-3", timeout=60)
    assert result.returncode == 2
    assert "trainer flags after --" in result.stderr and "steps-per-loop" in result.stderr


def test_the_input_figure_reads_one_workers_own_files_and_decodes_them(tmp_path):
    # In this process, at toy size: the same shard and pipeline the trainer feeds worker 0 of 2.
    from scripts.bench import input_pipeline
    from trainer.data import records

    records.write_split(str(tmp_path), "train", 256, 4, seed=1, encoding="png")
    figure = input_pipeline.measure(
        str(tmp_path / "train-*"), workers=2, batch=16, steps=12, warmup_steps=2, image_shape="28x28x1"
    )
    assert figure["shard_files"] == "its own 2 of 4 files"
    assert figure["steps"] == 10 and figure["examples_per_second"] > 0
