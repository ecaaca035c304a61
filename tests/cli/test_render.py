"""`moetune render` (moetune/cli/render.py), through the real command: it writes what a trial of
a production experiment would submit — whole nodes, all their memory, several CPUs per rank bound
to their NUMA node, every variable named for pyxis, no submitit wckey — with no store; the export
job takes the trial job's id; bad input is one line and exit 2."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from moetune.job import render, scheduler
from moetune.experiment.schema import load_experiment

REPO = Path(__file__).resolve().parents[2]


def moetune(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moetune.cli.main", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env={**os.environ, "PATH": os.environ["PATH"]})


def test_render_qwen3_235b_asks_for_whole_nodes_cpus_and_container_env(tmp_path):
    """The issue's acceptance line: --exclusive, --mem=0, several CPUs per rank with binding,
    --container-env, no --wckey=submitit; and no store was opened or made."""
    out = tmp_path / "job"
    r = moetune("render", "qwen3_235b", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    sbatch = (out / "job.sbatch").read_text()
    sh = (out / "job.sh").read_text()
    for line in ("#SBATCH --exclusive", "#SBATCH --mem=0", "#SBATCH --nodes=32", "#SBATCH --ntasks-per-node=8"):
        assert line in sbatch
    cpus = int(next(ln for ln in sbatch.splitlines() if "--cpus-per-task=" in ln).split("=")[1])
    assert cpus >= 4, sbatch
    assert "wckey" not in sbatch
    assert "numactl --cpunodebind=" in sh
    env_line = next(ln for ln in sh.splitlines() if "--container-env=" in ln)
    names = env_line.split("--container-env=")[1].split()[0].split(",")
    for name in ("TORCH_NCCL_AVOID_RECORD_STREAMS", "TORCH_NCCL_HIGH_PRIORITY", "NCCL_NVLS_ENABLE",
                 "PYTORCH_CUDA_ALLOC_CONF", "MASTER_ADDR", "MASTER_PORT"):
        assert name in names
    # every variable the batch shell exports is one of the names passed into the container
    exported = {ln.split()[1].split("=")[0] for ln in sh.splitlines() if ln.startswith("export ")
                and "=" in ln and not ln.startswith("export MASTER")}
    assert exported <= set(names), exported - set(names)
    assert not (tmp_path / ".moetune").exists()
    for name in ("job.sbatch", "job.sh", "export.sh", "spec.json", "command.txt"):
        assert (out / name).exists()
    for script in ("job.sh", "export.sh"):
        assert subprocess.run(["bash", "-n", str(out / script)]).returncode == 0


def test_submitit_sbatch_carries_the_same_resources_and_no_wckey(tmp_path, slurm):
    """What moetune really submits is submitit's sbatch: it must ask for the same resources, and
    submitit's default --wckey=submitit (refused where wckeys are enforced) must not be in it."""
    exp = load_experiment("qwen3_235b")
    spec = render.job_spec(name="t", folder=tmp_path, config={}, argv=[], cluster=exp.cluster,
                           launcher="srun")
    text = _sbatch_text(tmp_path, spec)
    assert "--wckey" not in text
    for line in ("#SBATCH --exclusive", "#SBATCH --mem=0", f"#SBATCH --cpus-per-task={spec.cpus_per_task}"):
        assert line in text
    named = render.job_spec(name="t", folder=tmp_path, config={}, argv=[], launcher="srun",
                            cluster=exp.cluster.model_copy(update={"wckey": "moe-perf"}))
    assert "#SBATCH --wckey=moe-perf" in _sbatch_text(tmp_path, named)
    assert "#SBATCH --wckey=moe-perf" in render.render_job(named)["job.sbatch"]


def _sbatch_text(folder: Path, spec: render.JobSpec) -> str:
    """submitit's own sbatch text for this job (no sbatch is run; the Slurm of scripts/slurm-up
    puts sbatch on PATH, which submitit's Slurm executor asks for)."""
    return scheduler.make_executor("slurm", folder, spec)._make_submission_file_text("cmd", "uid")


def test_render_with_fixes_and_one_gpu(tmp_path):
    """--fix applies a rule's change (the environment follows it); --one-gpu writes the layout's
    rank 0 alone under the fake process group."""
    out = tmp_path / "a"
    r = moetune("render", "qwen3_30b_a3b", "--fix", "ep_a2a_overlap", "--out", str(out))
    assert r.returncode == 0, r.stderr
    sh = (out / "job.sh").read_text()
    assert "--overlap-moe-expert-parallel-comm" in sh and "export CUDA_DEVICE_MAX_CONNECTIONS=32" in sh
    one = tmp_path / "b"
    r = moetune("render", "qwen3_30b_a3b", "--one-gpu", "--out", str(one))
    assert r.returncode == 0, r.stderr
    sh = (one / "job.sh").read_text()
    assert "--fake-process-group" in sh and "WORLD_SIZE=16" in sh
    assert not (one / "export.sh").exists()


def test_bad_input_is_one_line(tmp_path):
    """An unknown experiment, a misspelt --fix (with a suggestion), a --gpus that splits a node and one
    the table refuses each exit 2 with one line, no traceback."""
    for args, fragment in ((("nosuchmodel",), "no such experiment"),
                           (("qwen3_235b", "--fix", "ep_a2a_overlapp"), "did you mean ep_a2a_overlap"),
                           (("qwen3_235b", "--gpus", "12"), "--gpus 12"),
                           (("qwen3_235b", "--gpus", "3"), "refuses")):
        r = moetune("render", *args, "--out", str(tmp_path / "x"))
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in r.stderr, (args, r.stderr)


def test_export_sh_passes_the_trial_job_id(tmp_path):
    """export.sh runs sbatch with the trial job's id in the dependency and in the post-processing
    command; an `sbatch` stand-in on PATH prints its argv (the real one would queue a job)."""
    out = tmp_path / "job"
    assert moetune("render", "qwen3_235b", "--out", str(out)).returncode == 0
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "sbatch").write_text("#!/bin/bash\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n")
    (bin_ / "sbatch").chmod(0o755)
    r = subprocess.run(["bash", str(out / "export.sh"), "4242"], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    argv = r.stdout.splitlines()
    assert "--dependency=afterany:4242" in argv
    wrap = shlex.split(argv[argv.index("--wrap") + 1])
    assert wrap[-2:] == ["--for-job", "4242"]
    assert subprocess.run(["bash", str(out / "export.sh")], capture_output=True).returncode == 2


def test_extra_args_reach_the_command_quoted_and_predict_notes_them(tmp_path, capsys, no_store):
    """An experiment's extra_args end the trial's Megatron command, each one shell word (a value
    with a space stays one); predict prices the model without them and says so."""
    import yaml

    from moetune.cli.main import main
    raw = yaml.safe_load((REPO / "experiments" / "mixtral_8x7b.yaml").read_text())
    raw["extra_args"] = ["--moe-aux-loss-coeff", "0.01", "--wandb-exp-name", "a b"]
    path = tmp_path / "mx.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["render", str(path), "--out", str(tmp_path / "job")]) == 0
    command = shlex.split((tmp_path / "job" / "command.txt").read_text())
    assert command[-4:] == ["--moe-aux-loss-coeff", "0.01", "--wandb-exp-name", "a b"]
    capsys.readouterr()
    assert main(["predict", str(path)]) == 0
    plain = capsys.readouterr().out
    assert "note: extra_args not priced: --moe-aux-loss-coeff 0.01" in plain
    assert main(["predict", "mixtral_8x7b"]) == 0
    assert "extra_args" not in capsys.readouterr().out


def _former_qwen3_235b(tmp_path: Path) -> Path:
    """experiments/qwen3_235b.yaml with its former baseline, TP2 PP2 EP32 without recompute, which
    does not fit an H100 by the estimate (86.6 of 79.18 GB)."""
    import yaml
    data = yaml.safe_load((REPO / "experiments" / "qwen3_235b.yaml").read_text())
    for key in ("vpp", "account_for_embedding", "account_for_loss", "recompute_granularity", "recompute_modules"):
        data["baseline"].pop(key)
    data["baseline"]["pp"] = 2
    path = tmp_path / "former.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_baseline_that_does_not_fit_is_said_before_it_is_written(tmp_path, capsys):
    """render writes what it was asked for, but first says in one line that the baseline does not
    fit by the estimate and which of the plan's layouts do; the shipped baseline fits, and is not
    warned about."""
    from moetune.cli.main import main
    assert main(["render", str(_former_qwen3_235b(tmp_path)), "--out", str(tmp_path / "a")]) == 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("moetune render: warning: ") and "the baseline TP2 PP2 EP32" in line
    assert "does not fit by the estimate (86.6 of 79.18 GB" in line
    assert "fitting layouts (moetune plan qwen3_235b): TP" in line
    assert (tmp_path / "a" / "job.sbatch").exists()
    assert main(["render", "qwen3_235b", "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err == ""
