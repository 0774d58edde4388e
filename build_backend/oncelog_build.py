"""The build backend of oncelog: setuptools' own (setuptools.build_meta), with build/ made first.

Every build step of setuptools writes an oncelog.egg-info directory, by default at the top
of the source tree, where it outlives the build: `import oncelog` run from the repository
would then read its stale metadata. pyproject.toml's [tool.distutils.egg_info] moves it
under build/ (ignored by git, removed by `make clean`), but setuptools requires that
directory to exist already, and in a fresh clone it does not. Each hook below makes it,
then runs setuptools' hook of the same name. MANIFEST.in puts this file in the sdist.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from typing import Any

from setuptools import build_meta as _setuptools

BUILD_DIR = "build"  # [tool.distutils.egg_info] egg_base in pyproject.toml


def _with_build_dir(hook: Callable[..., Any], *, fresh: bool = False) -> Callable[..., Any]:
    @functools.wraps(hook)
    def run(*args: Any, **kwargs: Any) -> Any:
        if fresh:
            # setuptools copies into build/lib.* and build/bdist.* and packs what is there: a
            # file an earlier build left (a module since deleted) would ship in this wheel.
            for name in os.listdir(BUILD_DIR) if os.path.isdir(BUILD_DIR) else ():
                if name.startswith(("lib", "bdist.")):
                    shutil.rmtree(os.path.join(BUILD_DIR, name))
        os.makedirs(BUILD_DIR, exist_ok=True)  # the frontend runs every hook in the source tree
        return hook(*args, **kwargs)

    return run


get_requires_for_build_sdist = _with_build_dir(_setuptools.get_requires_for_build_sdist)
get_requires_for_build_wheel = _with_build_dir(_setuptools.get_requires_for_build_wheel)
get_requires_for_build_editable = _with_build_dir(_setuptools.get_requires_for_build_editable)
prepare_metadata_for_build_wheel = _with_build_dir(_setuptools.prepare_metadata_for_build_wheel)
prepare_metadata_for_build_editable = _with_build_dir(_setuptools.prepare_metadata_for_build_editable)
build_sdist = _with_build_dir(_setuptools.build_sdist)
build_wheel = _with_build_dir(_setuptools.build_wheel, fresh=True)
build_editable = _with_build_dir(_setuptools.build_editable)
