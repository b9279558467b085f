"""Build of the one compiled module, kvplane._native (the routing path's kernels; everything else
is in pyproject.toml). Optional: where it cannot be compiled (no C compiler, not CPython) the
install goes on and kvplane runs the pure Python twins (kvplane/native.py says which is in use)."""

import platform

from setuptools import Extension, setup

ext_modules = []
if platform.python_implementation() == "CPython":  # it reads CPython's int layout
    ext_modules.append(Extension("kvplane._native", ["kvplane/_native.c"], extra_compile_args=["-O2"], optional=True))

setup(ext_modules=ext_modules)
