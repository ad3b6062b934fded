"""setuptools' build steps for jitckpt: installing it also builds its native parts (``native_build.py``).

- ``build_py`` runs make in ``emulator/``, ``interpose/`` and ``proxy_server/``
  and, for a wheel, copies their outputs into the package
  (``jitckpt/native/_build/``), so that a non-editable install works like a
  checkout; ``jitckpt.native`` looks there first, then in the source tree.
  If they cannot be built the build fails with the reason, unless
  ``JITCKPT_BUILD_NATIVE=0`` asks for a pure-Python jitckpt.
- ``bdist_wheel`` tags a wheel that carries them for this platform
  (``py3-none-linux_x86_64``: they link no Python, but they are machine code);
  a pure-Python one stays ``py3-none-any``.

Which headers the build uses, and how an isolated ``pip wheel .`` gets them,
is ``native_build.py``'s business (it is also the build backend).
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

import native_build


class BuildPyWithNative(build_py):
    """build_py that also builds the native parts and ships them (runs for wheels and editable installs)."""

    def run(self) -> None:
        try:
            info = native_build.build_native()
        except native_build.NativeBuildError as exc:
            raise SystemExit(str(exc)) from None
        super().run()
        if not self.editable_mode:  # an editable install finds them in the source tree
            try:
                native_build.copy_native(Path(self.build_lib), info)
            except native_build.NativeBuildError as exc:
                raise SystemExit(str(exc)) from None


class NativeDistribution(Distribution):
    """A distribution that carries machine code when the native parts are built: installed into platlib."""

    def has_ext_modules(self) -> bool:
        try:
            return native_build.native_wanted()
        except native_build.NativeBuildError as exc:
            raise SystemExit(f"jitckpt: {exc}") from None


class PlatformWheel(bdist_wheel):
    """A wheel with the native parts is for one platform, not one Python: ``py3-none-<platform>``."""

    def get_tag(self) -> tuple[str, str, str]:
        python, abi, platform = super().get_tag()
        return (python, abi, platform) if self.root_is_pure else ("py3", "none", platform)


setup(distclass=NativeDistribution, cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": PlatformWheel})
