"""Multi-node launchers of the training formats: torchrun with a c10d rendezvous, DeepSpeed's runner with a
hostfile, and a Slurm batch script (``launch.sbatch``) that starts ``launch.sh`` on every node.

torchrun (torch/distributed/run.py): ``--nnodes N --nproc-per-node G --node-rank R --rdzv-backend c10d
--rdzv-endpoint HOST:PORT --rdzv-id ID``; every node runs the same line, the rendezvous on the first node's host
assigns the ranks. The batch script exports MASTER_ADDR (the job's first host) and runs one task per node with
``srun``, each with NODE_RANK = SLURM_NODEID. DeepSpeed (deepspeed/launcher/runner.py): the runner on the first node
reads a hostfile (``host slots=G``) and starts the other nodes itself (``--launcher slurm``: through srun).
"""

from __future__ import annotations

RDZV_PORT = 29500  # torchrun's default --master-port (torch/distributed/run.py); DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT
SBATCH = "launch.sbatch"
HOSTFILE = "hostfile"


def torchrun_launcher(nodes: int, per_node: int) -> list[str]:
    """torchrun for ``nodes`` x ``per_node`` ranks; more than one node: a c10d rendezvous on $MASTER_ADDR."""
    launcher = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node)]
    if nodes > 1:
        launcher += ["--node-rank", "$NODE_RANK", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                     f"$MASTER_ADDR:{RDZV_PORT}", "--rdzv-id", "$JOB_ID"]
    return launcher


def deepspeed_launcher(nodes: int, per_node: int) -> list[str]:
    """DeepSpeed's runner; more than one node: a hostfile and srun (``--launcher slurm``)."""
    launcher = ["deepspeed", "--num_nodes", str(nodes), "--num_gpus", str(per_node)]
    if nodes > 1:
        launcher += ["--hostfile", HOSTFILE, "--launcher", "slurm", "--master_addr", "$MASTER_ADDR",
                     "--master_port", str(RDZV_PORT)]
    return launcher


def sbatch_script(name: str, nodes: int, per_node: int, runner: str) -> str:
    """A Slurm batch script for ``launch.sh``: torchrun formats run it once per node through srun (NODE_RANK =
    SLURM_NODEID); DeepSpeed's runner runs once and starts the nodes of the hostfile itself."""
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={per_node}",
        "#SBATCH --exclusive",
        "set -euo pipefail",
        'cd "${SLURM_SUBMIT_DIR:-.}"',
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',  # reads all: no SIGPIPE
        "export MASTER_ADDR",
        'export JOB_ID="${SLURM_JOB_ID:-madmax}"',
    ]
    if runner == "deepspeed":
        lines += [f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/$/ slots={per_node}/" > {HOSTFILE}',
                  "bash ./launch.sh"]
    else:
        lines += ["srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'NODE_RANK=$SLURM_NODEID bash ./launch.sh'"]
    return "\n".join(lines) + "\n"
