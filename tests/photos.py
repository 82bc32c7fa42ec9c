"""63 real photographs for accuracy figures, fetched once from Debian packages (``apt-get download``) and
matplotlib's sample data, cached; nothing is redistributed. Each is saved as PNG, its longer side scaled
to at most ``MAX_SIDE`` (the models crop and resize: ``splitrt.profile.samples``).

Sources and licences (each package's ``/usr/share/doc/<package>/copyright``):

- python3-skimage 0.19.3-8, ``skimage/data``: 14 photographs, public domain or CC0 as scikit-image states
  (``splitrt/data/samples/README.md`` lists nine of them);
- opencv-doc 4.6.0+dfsg-12, OpenCV's ``samples/data``: 23 photographs (BSD-3-Clause / Apache-2.0);
- mate-backgrounds 1.26.0-1, ``nature/``: 12 photographs (GPL-2+, authors in that package's AUTHORS);
- plasma-workspace-wallpapers 4:5.27.5-2: 13 photographs (GPL-2+, KDE Visual Design Group);
- matplotlib's ``grace_hopper.jpg`` (from the installed matplotlib, a test dependency).

Distinct scenes only: a stereo pair's second view, near-duplicates, paintings, renders, logos, text and
drawings are left out. ``fetch()`` raises ``PhotosUnavailable`` where ``apt-get``/``dpkg-deb`` are
missing or the pinned versions cannot be had; tests skip on it, ``bench/bench_accuracy.py`` stops on it.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

MAX_SIDE = 640
PACKAGES = {
    "python3-skimage": "0.19.3-8",
    "opencv-doc": "4.6.0+dfsg-12",
    "mate-backgrounds": "1.26.0-1",
    "plasma-workspace-wallpapers": "4:5.27.5-2",
}
_SK = "./usr/lib/python3/dist-packages/skimage/data/"
_CV = "./usr/share/doc/opencv-doc/examples/data/"
_MATE = "./usr/share/backgrounds/mate/nature/"
_KDE = "./usr/share/wallpapers/{}/contents/images/{}"
MEMBERS: dict[str, list[str]] = {
    "python3-skimage": [
        _SK + f
        for f in [
            "astronaut.png",
            "chelsea.png",
            "coffee.png",
            "rocket.jpg",
            "hubble_deep_field.jpg",
            "retina.jpg",
            "motorcycle_left.png",
            "ihc.png",
            "camera.png",
            "coins.png",
            "moon.png",
            "brick.png",
            "grass.png",
            "gravel.png",
        ]
    ],
    "opencv-doc": [
        _CV + f
        for f in [
            "aero1.jpg",
            "aloeL.jpg",
            "apple.jpg",
            "baboon.jpg",
            "basketball1.png",
            "board.jpg",
            "box.png",
            "box_in_scene.png",
            "building.jpg",
            "butterfly.jpg",
            "chicky_512.png",
            "ela_original.jpg",
            "fruits.jpg",
            "graf1.png",
            "home.jpg",
            "leuvenA.jpg",
            "licenseplate_motion.jpg",
            "messi5.jpg",
            "orange.jpg",
            "rubberwhale1.png",
            "smarties.png",
            "squirrel_cls.jpg",
            "stuff.jpg",
        ]
    ],
    "mate-backgrounds": [
        _MATE + f
        for f in [
            "Aqua.jpg",
            "Blinds.jpg",
            "Dune.jpg",
            "FreshFlower.jpg",
            "Garden.jpg",
            "GreenMeadow.jpg",
            "LadyBird.jpg",
            "RainDrops.jpg",
            "Storm.jpg",
            "TwoWings.jpg",
            "Wood.jpg",
            "YellowFlower.jpg",
        ]
    ],
    "plasma-workspace-wallpapers": [
        _KDE.format(d, "640x480.jpg")
        for d in (
            [
                "BytheWater",
                "ColdRipple",
                "DarkestHour",
                "EveningGlow",
                "FallenLeaf",
                "Grey",
                "Kite",
                "OneStandsOut",
                "Path",
                "summer_1am",
            ]
        )
    ]
    + [_KDE.format("ColorfulCups", "2560x1600.jpg"), _KDE.format("MilkyWay", "1080x1920.png")]
    + [_KDE.format("Volna", "5120x2880.jpg")],
}
COUNT = sum(len(v) for v in MEMBERS.values()) + 1  # + grace_hopper


class PhotosUnavailable(RuntimeError):
    pass


def cache_dir() -> Path:
    # Not $SPLITRT_CACHE: the test suite points that at a fresh temporary directory every run.
    env = os.environ.get("SPLITRT_PHOTOS_CACHE")
    base = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "splitrt" / "photos"
    return Path(env) if env else base


def _save(data: bytes, out: Path) -> None:
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # our own pinned files (Volna is 5120 x 2880)
    with Image.open(io.BytesIO(data)) as im:
        rgb = im.convert("RGB")
    rgb.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
    tmp = out.with_suffix(".tmp")
    rgb.save(tmp, format="PNG")
    tmp.replace(out)


def _deb(package: str, version: str, where: Path) -> Path:
    found = sorted(where.glob(f"{package}_*.deb"))
    if found:
        return found[0]
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise PhotosUnavailable("apt-get and dpkg-deb are needed to fetch the photographs")
    proc = subprocess.run(
        ["apt-get", "download", "-q", f"{package}={version}"], cwd=where, capture_output=True, text=True, timeout=900
    )
    found = sorted(where.glob(f"{package}_*.deb"))
    if proc.returncode != 0 or not found:
        raise PhotosUnavailable(f"apt-get download {package}={version} failed: {proc.stderr.strip()[-300:]}")
    return found[0]


def _name(member: str) -> str:
    p = Path(member)
    return p.parents[2].name if "/wallpapers/" in member else p.stem  # a Plasma wallpaper: its folder


def fetch() -> list[Path]:
    """The photographs' PNG files, in a stable order (``COUNT`` of them)."""
    out_dir = cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for package, members in MEMBERS.items():
        outs = [out_dir / f"{package}__{_name(m)}.png" for m in members]
        files.extend(outs)
        if all(o.exists() for o in outs):
            continue
        debs = out_dir / "debs"
        debs.mkdir(exist_ok=True)
        deb = _deb(package, PACKAGES[package], debs)
        tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True, timeout=600)
        with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
            for m, o in zip(members, outs, strict=True):
                f = t.extractfile(m)
                if f is None:
                    raise PhotosUnavailable(f"{deb.name}: no file {m}")
                _save(f.read(), o)
        shutil.rmtree(debs)
    hopper = out_dir / "matplotlib__grace_hopper.png"
    if not hopper.exists():
        import matplotlib.cbook

        with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
            _save(f.read(), hopper)
    files.append(hopper)
    return files


def folder() -> Path:
    """A folder holding exactly the fetched photographs (what ``splitrt profile --samples`` takes)."""
    fetch()
    return cache_dir()
