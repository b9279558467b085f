"""Packaging beside pyproject.toml: the package list, and the one compiled module.

The import namespace is `kvplane` alone. The two planes keep their folders at the repository's top
level (the layout of the design card) and install as `kvplane.controlplane` and `kvplane.dataplane`.

kvplane._native holds the routing path's kernels. It is optional: where it cannot be compiled (no C
compiler, not CPython) the install goes on and kvplane runs the pure Python twins (kvplane/native.py
says which is in use)."""

import platform

from setuptools import Extension, find_packages, setup

PLANES = {"kvplane.controlplane": "controlplane", "kvplane.dataplane": "dataplane"}

packages = find_packages(include=["kvplane", "kvplane.*"])
for package, folder in PLANES.items():
    packages += [package, *(f"{package}.{sub}" for sub in find_packages(where=folder))]

ext_modules = []
if platform.python_implementation() == "CPython":  # it reads CPython's int layout
    ext_modules.append(Extension("kvplane._native", ["kvplane/_native.c"], extra_compile_args=["-O2"], optional=True))

setup(packages=packages, package_dir=PLANES, ext_modules=ext_modules)
