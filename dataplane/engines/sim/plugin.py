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


def add_hardware_arguments(group: argparse._ArgumentGroup) -> None:
    """The --sim-* flags: what is simulated (`kvplane sim` and `kvplane plan` use them too)."""
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
        "--sim-payload-bytes", str(config.payload_bytes), "--block-size", str(config.block_size),
        "--max-tokens-limit", str(config.max_tokens_limit), "--seed", str(config.seed), "--speedup", repr(config.speedup),
    ]  # fmt: skip
