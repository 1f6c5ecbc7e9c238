"""Build collectives._native from native/ with only a C compiler (libc and pthreads)."""
import glob
import os
import platform
import sys

from setuptools import Extension, setup

# The platform profile (native/src/platform/): $POOLTENSOR_NATIVE=linux or posix; linux on
# Linux, posix (what macOS has) elsewhere.
profile = os.environ.get("POOLTENSOR_NATIVE") or ("linux" if sys.platform.startswith("linux")
                                                   else "posix")
if profile not in ("linux", "posix"):
    raise SystemExit(f"POOLTENSOR_NATIVE must be linux or posix, not {profile!r}")
others = {f"native/src/platform/{p}.c" for p in ("linux", "posix") if p != profile}
# native/src is in rooms (core, platform, transport/*, team, kernels): every .c under it, but
# one profile.
sources = [s for s in sorted(glob.glob("native/src/**/*.c", recursive=True))
           if s.replace(os.sep, "/") not in others]
sources += sorted(glob.glob("native/binding/*.c"))
flags = ["-std=gnu11", "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]
flags.append(f"-DPT_PLATFORM_{profile.upper()}=1")
if platform.machine() in ("x86_64", "AMD64"):
    flags.append("-DPT_X86=1")

setup(
    ext_modules=[
        Extension(
            "collectives._native",
            sources=sources,
            include_dirs=["native/include", "native/src"],  # "pt.h"; "core/internal.h", ...
            extra_compile_args=flags,
            libraries=["pthread"] + (["dl"] if sys.platform.startswith("linux") else []),
        )
    ]
)
