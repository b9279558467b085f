"""Packaging beside pyproject.toml: the package list.

The import namespace is `kvplane` alone. The two planes keep their folders at the repository's top
level (the layout of the design card) and install as `kvplane.controlplane` and `kvplane.dataplane`."""

from setuptools import find_packages, setup

PLANES = {"kvplane.controlplane": "controlplane", "kvplane.dataplane": "dataplane"}

packages = find_packages(include=["kvplane", "kvplane.*"])
for package, folder in PLANES.items():
    packages += [package, *(f"{package}.{sub}" for sub in find_packages(where=folder))]

setup(packages=packages, package_dir=PLANES)
