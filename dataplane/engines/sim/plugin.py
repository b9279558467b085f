"""The sim engine's entry in the engine registry: its flags, its config, its factory.

Imports nothing heavy (no torch, ever: the sim engine runs without it). It shares --block-size,
--max-tokens-limit and --seed with the engines listed before it; its own flags start with --sim-,
except --speedup.
"""

from __future__ import annotations

import argparse

from kvplane import hardware
from kvplane.dataplane.engines.base import EngineAdapter
from kvplane.dataplane.engines.sim.config import SimConfig
from kvplane.hardware import RooflineConfig

NAME = "sim"
SUMMARY = (
    "a simulated GPU: the real paged KV cache and scheduler, a roofline or profiled step time, no forward pass (no torch); "
    "it also reads --block-size, --max-tokens-limit and --seed"
)
CONFIG_TYPE = SimConfig


def add_arguments(group: argparse._ArgumentGroup) -> None:
    add_hardware_arguments(group)
    group.add_argument("--speedup", type=float, default=SimConfig().speedup,
                       help="sim engine: simulated seconds per wall second; 2 = twice as fast as real time, below 1 slower (default %(default)s)")  # fmt: skip


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return hardware_config_from_args(args, speedup=args.speedup)


def host_sizes(text: str) -> list[float]:
    """GiB sizes, comma-separated, each >= 0 (0: no host tier)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(not 0 <= v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"expected GiB sizes >= 0, comma-separated, got {text!r}")
    return values


def add_hardware_arguments(group: argparse._ArgumentGroup, *, host_size_list: bool = False) -> None:
    """The --sim-* flags: what is simulated (`kvplane sim` and `kvplane plan` use them too, with
    `host_size_list`: --host-gib takes several sizes, one run per size)."""
    c, r = SimConfig(), RooflineConfig()
    group.add_argument("--sim-gpu", default=c.gpu, help=f"simulated GPU: {', '.join(hardware.names('gpus'))} (default %(default)s)")
    group.add_argument(
        "--sim-model",
        default=c.model,
        help=f"simulated model and served model name: {', '.join(hardware.names('models'))} (default %(default)s)",
    )
    group.add_argument("--sim-tp", type=int, default=c.tp, help="tensor parallelism: GPUs per simulated worker (default %(default)s)")
    group.add_argument("--sim-link", default=c.link, help=f"link KV crosses: {', '.join(hardware.names('links'))} (default %(default)s)")
    group.add_argument("--sim-profile", default=c.profile, metavar="FILE",
                       help="step times from a `kvplane profile WORKER --json` file instead of the roofline")  # fmt: skip
    group.add_argument("--sim-mfu", type=float, default=r.mfu, help="roofline: share of peak FLOP/s prefill reaches (default %(default)s)")
    group.add_argument("--sim-hbm-efficiency", type=float, default=r.hbm_efficiency,
                       help="roofline: share of HBM bandwidth decode reaches (default %(default)s)")  # fmt: skip
    group.add_argument("--sim-step-overhead-ms", type=float, default=r.step_overhead_s * 1000,
                       help="roofline: fixed milliseconds per step (default %(default)s)")  # fmt: skip
    group.add_argument("--sim-num-blocks", type=int, default=c.num_blocks,
                       help="KV blocks; 0 = what fits: GPU memory x 0.9 minus the weights, over the block's bytes (default %(default)s)")  # fmt: skip
    group.add_argument("--sim-max-num-seqs", type=int, default=c.max_num_seqs, help="largest decode batch (default %(default)s)")
    group.add_argument("--sim-max-batched-tokens", type=int, default=c.max_num_batched_tokens,
                       help="tokens per step; longer prompts prefill in chunks (default %(default)s)")  # fmt: skip
    group.add_argument("--sim-payload-bytes", type=int, default=c.payload_bytes,
                       help="bytes stored and moved per KV block; transfers report the model's real block size (default %(default)s)")  # fmt: skip
    if host_size_list:
        group.add_argument("--host-gib", "--sim-host-gib", dest="sim_host_gib", type=host_sizes, default=[c.host_gib], metavar="GIB,GIB",
                           help="host memory for KV per worker, GiB; several sizes: one run each (default 0: no host tier)")  # fmt: skip
    else:
        group.add_argument("--sim-host-gib", type=float, default=c.host_gib, metavar="GIB",
                           help="host memory for KV per worker, GiB: write-through from the device, LRU (default 0: none)")  # fmt: skip
    disk_flags = ("--disk-gib", "--sim-disk-gib") if host_size_list else ("--sim-disk-gib",)  # `kvplane sim` and `plan`: short names
    group.add_argument(*disk_flags, dest="sim_disk_gib", type=float, default=c.disk_gib, metavar="GIB",
                       help="local NVMe for KV per worker, GiB: what the host tier evicts, LRU; needs a host tier (default 0: none)")  # fmt: skip
    group.add_argument("--sim-host-gb-per-s", type=float, default=c.host_gb_per_s,
                       help="host <-> device copy rate per GPU, GB/s (default %(default)s: PCIe Gen5 x16, achievable)")  # fmt: skip
    group.add_argument("--sim-disk-gb-per-s", type=float, default=c.disk_gb_per_s,
                       help="disk read/write rate per worker, GB/s (default %(default)s: one NVMe Gen4 drive)")  # fmt: skip


def hardware_config_from_args(args: argparse.Namespace, **overrides: object) -> SimConfig:
    """The SimConfig of the --sim-* flags and the shared --block-size, --max-tokens-limit, --seed."""
    roofline = RooflineConfig(mfu=args.sim_mfu, hbm_efficiency=args.sim_hbm_efficiency, step_overhead_s=args.sim_step_overhead_ms / 1000)
    return SimConfig(
        gpu=args.sim_gpu,
        model=args.sim_model,
        tp=args.sim_tp,
        link=args.sim_link,
        profile=args.sim_profile,
        roofline=roofline,
        block_size=args.block_size,
        num_blocks=args.sim_num_blocks,
        max_num_seqs=args.sim_max_num_seqs,
        max_num_batched_tokens=args.sim_max_batched_tokens,
        max_tokens_limit=args.max_tokens_limit,
        payload_bytes=args.sim_payload_bytes,
        host_gib=args.sim_host_gib[0] if isinstance(args.sim_host_gib, list) else args.sim_host_gib,
        disk_gib=args.sim_disk_gib,
        host_gb_per_s=args.sim_host_gb_per_s,
        disk_gb_per_s=args.sim_disk_gb_per_s,
        seed=args.seed,
        **overrides,
    ).validate()


def create(config: SimConfig) -> EngineAdapter:
    from kvplane.dataplane.engines.sim.adapter import SimAdapter  # noqa: PLC0415 (the engine only when chosen)

    return SimAdapter(config)


def agent_args(config: SimConfig) -> list[str]:
    """`kvplane agent` arguments that build `config` again (config_from_args' inverse)."""
    r = config.roofline
    return [
        "--engine", NAME, "--sim-gpu", config.gpu, "--sim-model", config.model, "--sim-tp", str(config.tp),
        "--sim-link", config.link, *(["--sim-profile", config.profile] if config.profile else []),
        "--sim-mfu", repr(r.mfu), "--sim-hbm-efficiency", repr(r.hbm_efficiency),
        "--sim-step-overhead-ms", repr(r.step_overhead_s * 1000), "--sim-num-blocks", str(config.num_blocks),
        "--sim-max-num-seqs", str(config.max_num_seqs), "--sim-max-batched-tokens", str(config.max_num_batched_tokens),
        "--sim-payload-bytes", str(config.payload_bytes), "--sim-host-gib", repr(config.host_gib),
        "--sim-disk-gib", repr(config.disk_gib), "--sim-host-gb-per-s", repr(config.host_gb_per_s),
        "--sim-disk-gb-per-s", repr(config.disk_gb_per_s), "--block-size", str(config.block_size),
        "--max-tokens-limit", str(config.max_tokens_limit), "--seed", str(config.seed), "--speedup", repr(config.speedup),
    ]  # fmt: skip
