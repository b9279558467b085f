"""Test-harness import shim for `sgl_kernel`, SGLang's CUDA kernel package (tests only).

Why: SGLang imports `sgl_kernel` at start-up, and the installed wheel loads CUDA libraries at
import, which fails on a machine without a GPU. On the CPU path the tests run (`--device cpu`,
`--attention-backend torch_native`, `--disable-cuda-graph`, SGLANG_USE_CPU_ENGINE=1) none of
its kernels is ever called; only the import has to succeed.

What: this package stands in for `sgl_kernel` and every submodule of it (`sgl_kernel.x.y`). Any
attribute is a stub; calling a stub raises RuntimeError naming it and appends the name to the
file named by KVPLANE_SHIM_CALLS (the engine tests read that file and fail if it is not empty,
so a call that SGLang catches and swallows still fails the test). Stubs are also classes'
stand-ins (subclassing, isinstance checks) and have a `__version__` so version checks pass.

Put this folder first on PYTHONPATH of the SGLang server only (tests/engines/servers.py does).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

__version__ = "0.0.0+kvplane-test-shim"
SHIM = True


def _record(name: str) -> None:
    path = os.environ.get("KVPLANE_SHIM_CALLS")
    if path:
        with open(path, "a") as f:
            f.write(name + "\n")


class _Stub:
    """A shimmed function or class: importable, never callable."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args, **kwargs):
        _record(self._name)
        raise RuntimeError(f"{self._name} is a kvplane test shim of SGLang's CUDA kernels and must never be called on the CPU path")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._name}.{attr}")

    def __mro_entries__(self, bases):
        return (type(self._name.rpartition(".")[2], (), {}),)

    def __repr__(self) -> str:
        return f"<kvplane shim {self._name}>"


def _module_getattr(module_name: str):
    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{module_name}.{attr}")

    return __getattr__


class _ShimFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every `sgl_kernel.*` submodule as an empty shim module."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module) -> None:
        pass


sys.meta_path.insert(0, _ShimFinder())
__getattr__ = _module_getattr(__name__)
