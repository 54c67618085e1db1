"""``--megatron-args`` / ``--nemo-config`` on the commands and ``[import]`` in scenarios:
the job's model and plan under any option given explicitly, the import's notes in the
result, a result that re-runs bit for bit, and refusals as one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import trainsim
from conftest import run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "importers"

#: A small GPT job as a launch line (8 GPUs x 2 nodes) with flags of every kind.
JOB = """# a small job
torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py \\
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \\
  --num-layers 8 --hidden-size 1024 --num-attention-heads 16 --swiglu \\
  --normalization RMSNorm --group-query-attention --num-query-groups 4 \\
  --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 \\
  --global-batch-size 32 --bf16 --use-distributed-optimizer --overlap-grad-reduce \\
  --recompute-granularity selective --lr 3e-4 --save /ckpt --seed 7 --log-interval 1
"""


def _job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.args"
    path.write_text(JOB)
    return path


def test_simulate_from_a_file_of_arguments_and_rerun_bit_for_bit(capsys, tmp_path):
    args = ("simulate", "--megatron-args", f"@{_job_file(tmp_path)}", "--gpus", "16",
            "--fidelity", "analytic", "--format", "json")
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    result = json.loads(out)
    notes = result["inputs"]["import"]
    assert notes["source"] == "Megatron-LM arguments"
    assert {"--lr", "--save", "--seed", "--log-interval"} <= set(notes["ignored"])
    assert result["inputs"]["plan"]["tp"] == 2 and result["inputs"]["plan"]["zero"] == 1
    assert notes["model"]["num_kv_heads"] == 4 and notes["model"]["mlp"] == "swiglu"
    # the result records the arguments themselves, not the file that may change
    recorded = result["scenario"]["import"]["megatron_args"]
    assert "@" not in recorded and "--num-query-groups 4" in recorded
    assert "model" not in result["scenario"]
    (tmp_path / "job.args").write_text("--garbage")
    saved = tmp_path / "result.json"
    saved.write_text(out)
    code, again, err = run_cli(capsys, "simulate", "--scenario", str(saved), "--format", "json")
    assert code == 0, err
    assert again == out
    # the Python API is the same function
    api = trainsim.simulate(megatron_args=JOB.replace("\\\n", " ").split("\n", 1)[1],
                            gpus=16, fidelity="analytic").to_dict()
    assert api["step_time_s"] == result["step_time_s"]
    assert api["inputs"]["plan"] == result["inputs"]["plan"]


def test_options_given_explicitly_win_over_the_job(capsys, tmp_path):
    code, out, err = run_cli(capsys, "simulate", "--megatron-args", f"@{_job_file(tmp_path)}",
                             "--tp", "4", "--recompute", "full", "--model", "llama3-8b",
                             "--fidelity", "analytic", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    plan = result["inputs"]["plan"]
    assert (plan["tp"], plan["recompute"], plan["pp"]) == (4, "full", 2)
    assert result["scenario"]["model"] == "llama3-8b"
    assert any("given explicitly" in note for note in result["inputs"]["import"]["assumed"])


def test_a_refused_flag_is_one_line_and_exit_code_2(capsys, tmp_path):
    code, out, err = run_cli(capsys, "simulate", "--megatron-args",
                             f"@{_job_file(tmp_path)} --use-sharp", "--fidelity", "analytic")
    assert code == 2 and out == ""
    assert err.startswith("error: --use-sharp: True is refused: SHARP") and \
        err.count("\n") == 1, err
    code, _, err = run_cli(capsys, "simulate", "--megatron-args", "--tp 8", "--nemo-config",
                           "x.yaml")
    assert code == 2 and "not both" in err and err.count("\n") == 1


def test_failures_from_a_nemo_launcher_config(capsys):
    code, out, err = run_cli(capsys, "failures", "--nemo-config",
                             str(FIXTURES / "nemo1_gpt3_175b.yaml"), "--days", "1",
                             "--seeds", "2", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["scenario"]["gpus"] == 1024  # trainer.num_nodes x devices
    assert result["scenario"]["import"]["nemo_config_sha256"]
    assert "model.optim.lr" in result["import"]["ignored"]


def test_scenario_file_with_an_import_relative_to_itself(capsys, tmp_path):
    folder = tmp_path / "jobs"
    folder.mkdir()
    _job_file(folder)
    (folder / "step.toml").write_text('fidelity = "analytic"\n[import]\n'
                                      'megatron_args = "@job.args --tensor-model-parallel-size 4"'
                                      '\n[plan]\npp = 1\n')
    code, out, err = run_cli(capsys, "simulate", "--scenario", str(folder / "step.toml"),
                             "--format", "json")
    assert code == 0, err
    plan = json.loads(out)["inputs"]["plan"]
    assert (plan["tp"], plan["pp"], plan["dp"]) == (4, 1, 4)  # [plan] wins over the import


def test_a_changed_nemo_config_is_an_error_on_rerun(capsys, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text((FIXTURES / "nemo1_gpt3_175b.yaml").read_text())
    code, out, err = run_cli(capsys, "simulate", "--nemo-config", str(config), "--fidelity",
                             "analytic", "--format", "json")
    assert code == 0, err
    saved = tmp_path / "result.json"
    saved.write_text(out)
    config.write_text(config.read_text().replace("global_batch_size: 2048",
                                                 "global_batch_size: 1024"))
    code, _, err = run_cli(capsys, "simulate", "--scenario", str(saved))
    assert code == 2 and "nemo_config_sha256" in err and err.count("\n") == 1


def test_replay_program_from_imported_arguments(tmp_path):
    from trainsim.cli.options import scenario_from_options
    from trainsim.cli.validate import _program

    source = scenario_from_options(scenario=None, megatron_args=f"@{_job_file(tmp_path)}")
    program = _program(None, None, source)
    assert program.world_size == 16


def test_plan_searches_the_layout_of_an_imported_job(capsys, tmp_path):
    code, out, err = run_cli(capsys, "plan", "--megatron-args", f"@{_job_file(tmp_path)}",
                             "--tp", "1,2", "--pp", "1", "--zero", "1", "--recompute", "none",
                             "--top", "1", "--workers", "1", "--format", "json")
    assert code == 0, err
    best = json.loads(out)[0]
    assert best["scenario"]["gpus"] == 16 and "model" not in best["scenario"]
    assert best["scenario"]["plan"]["global_batch"] == 32  # the job's, not the default
    assert best["command"].startswith("trainsim simulate --megatron-args ")
    assert "@" not in best["scenario"]["import"]["megatron_args"]
