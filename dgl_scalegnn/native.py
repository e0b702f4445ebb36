"""Native code: a C source built on first use and called through ctypes, each function's
signature declared once and checked against the source.

A :class:`NativeLibrary` is one C source and the C prototype of each function of it that
Python calls. ctypes passes what it is told to, so a prototype that disagrees with the
function (a parameter's type, their order, their count) would corrupt memory silently:
every prototype is compared with the function's definition in the source, parameter by
parameter, type and name, before the library is built or loaded
(:meth:`~NativeLibrary.check`), and a library whose prototypes disagree is not loaded.
The same prototypes give ctypes its argument and return types, and
:meth:`~NativeLibrary.call` takes the arguments by the names they declare, so a call
cannot pass them in another order either.

The library is built with the system C compiler (``$CC``, else ``cc``; ``-O3 -fopenmp``,
no fused multiply-adds, and ``-march=native`` where the compiler takes it: the vector
width of this CPU) into ``kernels/`` of the cache directory
(:func:`~dgl_scalegnn.cache_dir.default_cache_dir`, private to the user) keyed by the
source, the compiler and the machine, and linked against the OpenMP runtime torch has
loaded, so that its loops share torch's threads. Loading a library runs its code, so a
build is reused only if it and its manifest (``<source>_<key>.json``, the SHA-256 of
what was compiled) belong to this user, are writable by no one else, and the library's
SHA-256 is the one recorded; otherwise it is built again, with one log line saying why.
Where no compiler works, or the library does not load, :meth:`~NativeLibrary.load` says
so in one log line and gives ``None``: the callers run their fallbacks.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dgl_scalegnn.cache_dir import default_cache_dir
from dgl_scalegnn.config import ConfigError

__all__ = ["Signature", "SignatureMismatch", "NativeLibrary", "c_compiler", "compiler_version"]

_log = logging.getLogger(__name__)

# -ffp-contract=off: no fused multiply-adds, so the forward rounds as the eager kernels do
_FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
#: Tried first, dropped when the compiler refuses them (the build is cached per CPU model).
_NATIVE_FLAGS = ("-march=native",)
_LIBRARIES = ("-lm",)

#: The ctypes type of each C type a signature may use; every pointer is a ``c_void_p``.
_CTYPES = {
    "int": ctypes.c_int,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
}
#: A prototype: the return type, the name and the parameters.
_PROTOTYPE = re.compile(r"\s*(\w+)\s+(\w+)\s*\(([^)]*)\)\s*")
#: A function's definition in a source: its prototype at the start of a line, then its body.
_DEFINITION = re.compile(r"^(\w+[ \t]+(\w+)\([^)]*\))\s*\{", re.M)


@dataclass(frozen=True)
class Signature:
    """A C function's return type, name and parameters, each ``(type, name)``: the type's
    tokens spaced, without ``restrict`` (it changes nothing that is passed).

    >>> Signature.of("void f(const float *restrict x, int64_t n)")
    Signature(returns='void', name='f', parameters=(('const float *', 'x'), ('int64_t', 'n')))
    """

    returns: str
    name: str
    parameters: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, prototype: str) -> Signature:
        """The signature that ``prototype`` declares (``ValueError`` if it is none)."""
        found = _PROTOTYPE.fullmatch(prototype)
        if found is None:
            raise ValueError(f"not a C prototype: {prototype!r}")
        returns, name, listed = found.groups()
        parameters = []
        for parameter in listed.split(","):
            *kind, named = [t for t in re.findall(r"\w+|\*", parameter) if t != "restrict"]
            parameters.append((" ".join(kind), named))
        return cls(returns, name, tuple(parameters))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.parameters)

    def __str__(self) -> str:
        spaced = ", ".join(k + ("" if k.endswith("*") else " ") + n for k, n in self.parameters)
        return f"{self.returns} {self.name}({spaced})"

    def bind(self, function: ctypes._CFuncPtr) -> None:
        """Give ``function`` these argument and return types (a pointer: ``c_void_p``);
        ``ValueError`` for a type that has none here."""
        kinds = [kind for kind, _ in self.parameters if "*" not in kind]
        unknown = {self.returns, *kinds} - {*_CTYPES, "void"}
        if unknown:
            raise ValueError(f"{self}: no ctypes type for {', '.join(sorted(unknown))}")
        function.argtypes = [_CTYPES.get(kind, ctypes.c_void_p) for kind, _ in self.parameters]
        function.restype = _CTYPES.get(self.returns)


class SignatureMismatch(ValueError):
    """A declared prototype that disagrees with the function the source defines."""


class _Untrusted(Exception):
    """A build that must not be loaded; the message says why."""


def _machine_key() -> str:
    """What a build depends on beyond the source and flags: compiler, CPU, platform."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next(
            (line for line in cpuinfo.read_text().splitlines() if line.startswith("model name")),
            "",
        )
    return f"{platform.machine()}|{platform.system()}|{model}"


def c_compiler() -> str | None:
    """The C compiler that builds native code: ``$CC``, else ``cc``, on the ``PATH``."""
    return shutil.which(os.environ.get("CC", "cc"))


def compiler_version(compiler: str) -> str:
    """What ``compiler --version`` says (nothing where it fails)."""
    try:
        said = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return said.stdout if said.returncode == 0 else ""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_owner(path: Path) -> None:
    """Refuse ``path`` (not followed if a link) if someone else could have written it."""
    status, uid = path.lstat(), os.geteuid()
    if status.st_uid != uid:
        raise _Untrusted(f"{path} belongs to uid {status.st_uid}, not to you (uid {uid})")
    if status.st_mode & 0o022:
        mode = status.st_mode & 0o7777
        raise _Untrusted(f"{path} is writable by its group or others (mode {mode:04o})")


def _recorded_library(manifest: Path) -> Path:
    """The library that ``manifest`` records, once both are checked (module docstring).

    Raises
    ------
    _Untrusted
        If either is someone else's or writable by others, the manifest is unreadable,
        or the library's SHA-256 is not the one recorded.
    """
    try:
        _check_owner(manifest)
        record = json.loads(manifest.read_text())
        library = manifest.with_name(record["library"])
        _check_owner(library)
        digest = _sha256(library)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise _Untrusted(f"{manifest} is unreadable or names no library ({error})") from None
    if digest != record["sha256"]:
        raise _Untrusted(f"the SHA-256 of {library} is not the one {manifest.name} records")
    return library


class NativeLibrary:
    """One C source, built and loaded on first use (module docstring), and the functions
    of it that Python calls.

    Parameters
    ----------
    source : Path
        The C source.
    prototypes : sequence of str
        The C prototype of each function Python calls, as its definition in ``source``
        reads (``restrict`` may be left out; ``ValueError`` if one is no prototype).
    what : str
        What the library is, in its log lines (``"native CPU kernels"``).
    fallback : str
        What runs where it does not load, in its log line (``"running eager kernels"``).
    """

    def __init__(self, source: Path, prototypes: Sequence[str], what: str, fallback: str):
        self.source, self.what, self.fallback = source, what, fallback
        self.signatures = {s.name: s for s in map(Signature.of, prototypes)}
        self._library: ctypes.CDLL | None = None
        self.failure: str | None = None

    def check(self) -> None:
        """Compare each declared prototype with its function's definition in the source.

        Raises
        ------
        SignatureMismatch
            Naming the function, its prototype and its definition (or that there is none).
        """
        found = _DEFINITION.findall(self.source.read_text())
        defined = {name: Signature.of(prototype) for prototype, name in found}
        for name, declared in self.signatures.items():
            if defined.get(name) != declared:
                raise SignatureMismatch(
                    f"{name} is declared {declared} but {self.source.name} defines "
                    f"{defined.get(name, 'no such function')}: make the prototype the definition's"
                )

    def _build_key(self, compiler: str) -> str:
        """What the build depends on: source, compiler and its version, flags, machine."""
        version = compiler_version(compiler)
        flags = " ".join(_FLAGS + _NATIVE_FLAGS)
        return hashlib.sha256(
            "\n".join((self.source.read_text(), compiler, version, flags, _machine_key())).encode()
        ).hexdigest()[:16]

    def _build(self, compiler: str) -> Path:
        """The library, compiled once per (source, compiler, flags, machine) and reused
        after the checks of the module docstring; atomic on disk, so concurrent ranks may
        build at the same time."""
        stem = f"{self.source.stem}_{self._build_key(compiler)}"
        directory = default_cache_dir("kernels")
        manifest = directory / f"{stem}.json"
        if manifest.exists():
            try:
                return _recorded_library(manifest)
            except _Untrusted as problem:
                _log.warning("building the %s again: %s", self.what, problem)
        with tempfile.TemporaryDirectory(dir=directory) as scratch:
            built = Path(scratch) / f"{self.source.stem}.so"
            for flags in (_FLAGS + _NATIVE_FLAGS, _FLAGS):
                result = subprocess.run(
                    [compiler, *flags, str(self.source), "-o", str(built), *_LIBRARIES],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if result.returncode == 0:
                    break
            if result.returncode != 0:
                raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:500]}")
            digest = _sha256(built)
            # named by its content: a concurrent build never replaces the file another loads
            target = directory / f"{stem}_{digest[:16]}.so"
            record = Path(scratch) / "manifest.json"
            record.write_text(json.dumps({"library": target.name, "sha256": digest}) + "\n")
            # whatever the umask: a group-writable build would be refused at its next load
            os.chmod(built, 0o700)
            os.chmod(record, 0o600)
            os.replace(built, target)
            os.replace(record, manifest)
        return target

    def load(self) -> ctypes.CDLL | None:
        """The library, checked and built on the first call; ``None`` (and one log line,
        :attr:`failure` saying why) where it cannot be."""
        if self._library is not None or self.failure is not None:
            return self._library
        try:
            self.check()
            compiler = c_compiler()
            if compiler is None:
                raise RuntimeError(f"no C compiler ({os.environ.get('CC', 'cc')!r} not found)")
            library = ctypes.CDLL(str(self._build(compiler)), use_errno=True)
            for name, signature in self.signatures.items():
                signature.bind(getattr(library, name))
            self._library = library
        # AttributeError: a function is missing; ValueError: its prototype is not the
        # definition's; ConfigError: the cache directory is not private
        except (OSError, RuntimeError, AttributeError, ValueError, ConfigError) as error:
            self.failure = str(error)
            _log.warning("%s unavailable, %s: %s", self.what, self.fallback, error)
        return self._library

    def call(self, name: str, **arguments: object) -> object:
        """Function ``name`` of the loaded library on ``arguments``, given by the names
        its prototype declares.

        Raises
        ------
        TypeError
            An argument the prototype does not declare, or one it declares missing.
        """
        library = self.load()
        assert library is not None, f"{self.source.name} did not load: call it where it does"
        signature = self.signatures[name]
        if arguments.keys() != set(signature.names):
            raise TypeError(
                f"{name} takes {', '.join(signature.names)}; given {', '.join(arguments)}"
            )
        return getattr(library, name)(*(arguments[n] for n in signature.names))
