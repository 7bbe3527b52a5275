"""The wheel of `pip install ./python`: the package, and inside it the library it loads
(libckptdb.so) and the save's native walk (ckptdb/_native.*.so) when it was built.

Where they come from, first found: $CKPTDB_BUILD_DIR (a CMake build of this tree), the tree's
build/ (what `make` built), each brought up to date first (cmake --build of the two targets),
else a Release build made now with CMake into build-python/ (the library and the walk only;
scripts/install-deps.sh installs what it needs). pip must build in place (pip 21.3 and later
do), so that the tree is the directory above this file. The metadata is in pyproject.toml.
"""

import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _make(build: str) -> None:
    """The library and the walk brought up to date in a CMake build directory (nothing to do
    when they are): a wheel never packages a library older than its sources."""
    targets = ["ckptdb"]
    probe = subprocess.run(["cmake", "--build", build, "--target", "help"], capture_output=True,
                           text=True, check=False)
    if "ckptdb_native" in probe.stdout:
        targets.append("ckptdb_native")
    subprocess.check_call(["cmake", "--build", build, "-j2", "--target", *targets])


def _build_dir() -> str:
    for candidate in (os.environ.get("CKPTDB_BUILD_DIR"), os.path.join(ROOT, "build")):
        if candidate and os.path.exists(os.path.join(candidate, "libckptdb.so")):
            if os.path.exists(os.path.join(candidate, "CMakeCache.txt")):
                _make(candidate)
            return candidate
    if not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
        raise RuntimeError(f"no libckptdb.so to package and no ckptdb tree at {ROOT} to build one "
                           "(set CKPTDB_BUILD_DIR to a build of it)")
    out = os.path.join(ROOT, "build-python")
    subprocess.check_call(["cmake", "-S", ROOT, "-B", out, "-DCMAKE_BUILD_TYPE=Release",
                           "-DCKPTDB_WITH_CUDA=OFF", "-DCKPTDB_BUILD_FUZZERS=OFF"])
    _make(out)
    return out


class BuildWithLibrary(build_py):
    """build_py, then the library and the native walk copied into the built package."""

    def run(self):
        super().run()
        source = _build_dir()
        package = os.path.join(self.build_lib, "ckptdb")
        # The real file, not the symlink chain of a versioned soname.
        shutil.copyfile(os.path.realpath(os.path.join(source, "libckptdb.so")),
                        os.path.join(package, "libckptdb.so"))
        for walk in glob.glob(os.path.join(source, "_native.*.so")):
            shutil.copyfile(walk, os.path.join(package, os.path.basename(walk)))


class BinaryDistribution(Distribution):
    """The wheel holds a shared library: tagged for this platform, not as pure Python."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
