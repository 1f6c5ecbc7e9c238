"""Build collectives._native from native/ with only a C compiler (libc and pthreads)."""
import glob
import platform

from setuptools import Extension, setup

# native/src is in rooms (core, platform, transport/*, team, kernels): every .c under it.
sources = sorted(glob.glob("native/src/**/*.c", recursive=True))
sources += sorted(glob.glob("native/binding/*.c"))
# While the files move into their rooms, their old flat includes still resolve through these.
ROOMS = ["native/src/core", "native/src/platform", "native/src/transport/tcp", "native/src/team",
         "native/src/kernels"]
flags = ["-std=gnu11", "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]
if platform.machine() in ("x86_64", "AMD64"):
    flags.append("-DPT_X86=1")

setup(
    ext_modules=[
        Extension(
            "collectives._native",
            sources=sources,
            include_dirs=["native/include", "native/src"] + ROOMS,
            extra_compile_args=flags,
            libraries=["pthread"],
        )
    ]
)
