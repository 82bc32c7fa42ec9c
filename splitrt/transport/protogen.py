"""Regenerate the gRPC stubs from ``proto/splitrt.proto`` and ``proto/grpc_predict_v2.proto`` (the Open
Inference Protocol v2 that ``transport.v2`` speaks): ``python -m splitrt.transport.protogen``.

Writes ``splitrt/transport/splitrt_pb2.py``, ``splitrt_pb2_grpc.py`` (grpcio-tools) and ``splitrt_pb2.pyi``,
``splitrt_pb2_grpc.pyi`` (mypy-protobuf). The proto is compiled as ``splitrt/transport/splitrt.proto``
so the generated grpc module imports ``from splitrt.transport import splitrt_pb2``. Needs the ``test``
extra.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

from splitrt.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto" / "splitrt.proto"
PROTOS = (PROTO, ROOT / "proto" / "grpc_predict_v2.proto")
PACKAGE_DIR = Path(__file__).resolve().parent
SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi")
GENERATED = tuple(f"{p.stem}{suffix}" for p in PROTOS for suffix in SUFFIXES)

# The generator's own version, stamped into the code it writes: a new grpcio-tools release changes these
# lines and nothing else, so the staleness check ignores them (the code under them is what must match).
_VERSION_STAMPS = (
    re.compile(r"^# Protobuf Python Version: .*$", re.MULTILINE),
    re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.MULTILINE),
    re.compile(
        r"(ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,)\s*\d+,\s*\d+,\s*\d+,\s*'[^']*',"
    ),
)


def without_version_stamps(text: str) -> str:
    """``text`` of a generated stub with the generator's version stamps blanked (see ``_VERSION_STAMPS``)."""
    for pattern in _VERSION_STAMPS:
        text = pattern.sub(lambda m: m.group(1) if m.groups() else "", text)
    return text


def _plugin(name: str) -> str:
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(
            f"protoc plugin {name!r} not found next to {sys.executable} or on PATH "
            "(install the 'test' extra: mypy-protobuf)"
        )
    return found


def generate(out_dir: Path, protos: tuple[Path, ...] = PROTOS) -> list[Path]:
    """Compile ``protos`` into ``out_dir``; returns the generated files (names in ``GENERATED``)."""
    return [path for proto in protos for path in _generate_one(out_dir, proto)]


def _generate_one(out_dir: Path, proto: Path) -> list[Path]:
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        msg = "grpcio-tools is needed to regenerate the stubs (install the 'test' extra)"
        raise ConfigError(msg) from exc
    import importlib.resources

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src" / "splitrt" / "transport"
        src.mkdir(parents=True)
        shutil.copyfile(proto, src / proto.name)
        gen = Path(tmp) / "gen"
        gen.mkdir()
        well_known = str(importlib.resources.files("grpc_tools") / "_proto")
        args = [
            "grpc_tools.protoc",
            f"-I{Path(tmp) / 'src'}",
            f"-I{well_known}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={gen}",
            f"--grpc_python_out={gen}",
            f"--mypy_out={gen}",
            f"--mypy_grpc_out={gen}",
            f"splitrt/transport/{proto.name}",
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise ConfigError(f"protoc failed on {proto} with exit code {rc} (expected 0)")
        written = []
        for name in (f"{proto.stem}{suffix}" for suffix in SUFFIXES):
            target = out_dir / name
            shutil.copyfile(gen / "splitrt" / "transport" / name, target)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR, help="output directory (default: the package)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
