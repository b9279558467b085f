"""Paged KV bookkeeping shared by kvplane's in-process engines (no torch, no clock of its own).

- block_manager.BlockManager: ref-counted blocks, the prefix cache keyed by chained block hashes,
  LRU eviction, KV events, and the block-level steps of KV import/export;
- scheduler.Scheduler: continuous batching with reserve-at-admission and chunked prefill, and
  scheduler.step_features, the shape of one planned step.

The reference engine (torch forward pass) and the sim engine (a timing model instead) both run
these same classes, so the cache dynamics a router sees are the same whichever computes the KV.
"""
