"""Conversions between protocol messages and kvplane's typed values, in one place."""

from __future__ import annotations

from kvplane.types import DisaggMode, KVLayout, Role, Tier
from kvplane.v1 import common_pb2

_ROLE_TO_PB = {Role.PREFILL: common_pb2.ROLE_PREFILL, Role.DECODE: common_pb2.ROLE_DECODE, Role.BOTH: common_pb2.ROLE_BOTH}
_PB_TO_ROLE = {v: k for k, v in _ROLE_TO_PB.items()}
_TIER_TO_PB = {Tier.DEVICE: common_pb2.TIER_DEVICE, Tier.HOST: common_pb2.TIER_HOST, Tier.DISK: common_pb2.TIER_DISK}
_PB_TO_TIER = {v: k for k, v in _TIER_TO_PB.items()}
_DISAGG_TO_PB = {
    DisaggMode.AUTO: common_pb2.DISAGG_MODE_AUTO,
    DisaggMode.ALWAYS: common_pb2.DISAGG_MODE_ALWAYS,
    DisaggMode.NEVER: common_pb2.DISAGG_MODE_NEVER,
}
_PB_TO_DISAGG = {v: k for k, v in _DISAGG_TO_PB.items()}
STATE_NAMES = {
    common_pb2.WORKER_STATE_UNSPECIFIED: "unknown",
    common_pb2.WORKER_STATE_ACTIVE: "active",
    common_pb2.WORKER_STATE_DRAINING: "draining",
}


def role_to_pb(role: Role) -> int:
    return _ROLE_TO_PB[role]


def role_from_pb(value: int) -> Role:
    try:
        return _PB_TO_ROLE[value]
    except KeyError:
        raise ValueError(f"unknown or unset worker role {value}; expected prefill, decode or both") from None


def tier_to_pb(tier: Tier) -> int:
    return _TIER_TO_PB[tier]


def tier_from_pb(value: int) -> Tier:
    # An unset tier means the device tier: the only tier engines had before tiers existed.
    return _PB_TO_TIER.get(value, Tier.DEVICE)


def disagg_to_pb(mode: DisaggMode) -> int:
    return _DISAGG_TO_PB[mode]


def disagg_from_pb(value: int) -> DisaggMode:
    try:
        return _PB_TO_DISAGG[value]
    except KeyError:
        raise ValueError(f"unknown disagg mode {value}; expected auto, always or never") from None


def layout_to_pb(layout: KVLayout) -> common_pb2.KVLayout:
    return common_pb2.KVLayout(
        model=layout.model,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=layout.dtype,
        block_size=layout.block_size,
    )


def layout_from_pb(msg: common_pb2.KVLayout) -> KVLayout:
    return KVLayout(
        model=msg.model,
        num_layers=msg.num_layers,
        num_kv_heads=msg.num_kv_heads,
        head_dim=msg.head_dim,
        dtype=msg.dtype,
        block_size=msg.block_size,
    )
